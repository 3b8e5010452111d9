"""Order an interactive rebase's picks as a series file lists the patches.

A sequence editor for `git rebase -i overlay-base` in an edit tree
(`python -m torch_overlay edit`): it reorders the `pick` lines of the todo file
so that the commits come in the order of the series file ``ORDER_SERIES`` names
(a `series` in the grouped format, NOTE: [Series groups] in
torch_overlay/_overlay/series.py), matching a commit to a patch by its subject.
It is how the series was put in groups, and how a series written in another
order (a branch that added patches on top of the old, interleaved series) is
carried into the grouped one:

    ORDER_SERIES=/tmp/target-series PATCHES=patches/v2.7.1 \\
        GIT_SEQUENCE_EDITOR="python /path/to/tools/order_picks.py" \\
        git rebase -i overlay-base

``PATCHES``: the directory holding the patch files the target series names
(their subjects are read from there). A pick whose subject the target series
does not list, or a patch of the target series with no pick, is an error: the
todo file is left as it was.
"""

import os
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from torch_overlay._overlay import series


def order(todo: list[str], target: list[series.Patch]) -> list[str]:
    """The ``pick`` lines of ``todo`` in the order of ``target``."""
    picks = {}
    for line in todo:
        if line.startswith("pick "):
            subject = line.split(" ", 2)[2].rstrip("\n")
            picks[subject] = line
    wanted = [p.subject for p in target]
    unknown = sorted(set(picks) - set(wanted))
    missing = sorted(set(wanted) - set(picks))
    if unknown or missing:
        raise SystemExit(
            f"order_picks: commits the target series lacks: {unknown}; "
            f"patches of the target series with no commit: {missing}"
        )
    return [picks[subject] for subject in wanted]


def main() -> None:
    todo_path = Path(sys.argv[1])
    target_file = Path(os.environ["ORDER_SERIES"])
    patches = Path(os.environ.get("PATCHES", target_file.parent))
    names = [name for name, _ in series.parse_series(target_file.read_text())]
    target = [
        series.Patch(
            name, patches / name, series.read_subject_text((patches / name).read_text())
        )
        for name in names
    ]
    todo = todo_path.read_text().splitlines(keepends=True)
    todo_path.write_text("".join(order(todo, target)))


if __name__ == "__main__":
    main()
