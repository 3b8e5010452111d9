"""Check that two pytest runs of the suite agree, test by test.

``make test`` runs the suite on the overlay and on the patched wheel (junit XML
under build/junit/); both deliver the same patches, so every test they both ran
must have the same outcome. A test skipped by one side only (the overlay's own
machinery tests need torch_overlay) is not a disagreement. Exit 1 otherwise.
"""

import argparse
import logging
import sys
from pathlib import Path

from diff_upstream import parse_junit


log = logging.getLogger(__name__)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    first, second = parse_junit(args.first), parse_junit(args.second)
    disagreements = []
    for test_id in sorted(set(first) & set(second)):
        a, b = first[test_id]["outcome"], second[test_id]["outcome"]
        if a != b and "skip" not in (a, b):
            disagreements.append(f"{test_id}: {args.first.stem} {a}, {args.second.stem} {b}")
    compared = len(set(first) & set(second))
    if disagreements:
        print(f"{len(disagreements)} of {compared} tests disagree:")
        print("\n".join(f"  {line}" for line in disagreements))
        return 1
    print(f"{args.first.stem} and {args.second.stem} agree on all {compared} tests they both ran")
    return 0


if __name__ == "__main__":
    sys.exit(main())
