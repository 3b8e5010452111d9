"""Guard-check time of loaded guard managers against the reference ones.

Each run is a fresh interpreter that builds the reference CheckFunctionManager for
a few example frames (guards_serialization_mode="save"), loads a second one from
its guards_state, and times ``guard_manager.check(f_locals)`` of both on the same
inputs in the same process. The parent reports min and median over runs of the
time per check and of the loaded/reference ratio, which should be ~1.0.

    make bench-guards          (or: TORCH_OVERLAY=1 .venv/bin/python benchmarks/guard_check.py)
"""

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
from pathlib import Path


log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, timeit
sys.path.insert(0, {test_dir!r})
import torch
import test_guard_serialization as t

cases = {{
    "tensor": (lambda x: x + 1, (torch.ones(8),)),
    "module_call": (lambda m, x: m(x).relu(), (t.Small(), torch.ones(2))),
    "globals_builtins": (t.uses_builtins, (torch.ones(2), 4)),
}}
out = {{}}
for name, (fn, args) in cases.items():
    built = t.build_check_fn_manager(fn, args)
    loaded = t.load_check_fn_manager(built)
    f_locals = built.f_locals
    assert built.ref.guard_manager.check(f_locals) and loaded.guard_manager.check(f_locals)
    managers = {{"reference": built.ref.guard_manager, "loaded": loaded.guard_manager}}
    timings = {{label: float("inf") for label in managers}}
    for _ in range(7):  # interleaved, so warm-up and noise hit both alike
        for label, mgr in managers.items():
            check = mgr.check
            t_run = timeit.timeit(lambda: check(f_locals), number={number}) / {number}
            timings[label] = min(timings[label], t_run)
    out[name] = timings
print(json.dumps(out))
"""


def run_once(number: int) -> dict:
    env = dict(os.environ, TORCH_OVERLAY="1")
    code = CHILD.format(test_dir=str(ROOT / "test" / "dynamo"), number=number)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "guard_check.json"))
    args = parser.parse_args(argv)
    runs = [run_once(args.number) for _ in range(args.runs)]
    report = {}
    lines = [
        "| case | reference µs (min / median) | loaded µs (min / median) | loaded/reference (min / median) |",
        "|---|---|---|---|",
    ]
    for case in runs[0]:
        ref = [r[case]["reference"] * 1e6 for r in runs]
        loaded = [r[case]["loaded"] * 1e6 for r in runs]
        ratio = [r[case]["loaded"] / r[case]["reference"] for r in runs]
        report[case] = {
            "reference_us": {"min": min(ref), "median": statistics.median(ref)},
            "loaded_us": {"min": min(loaded), "median": statistics.median(loaded)},
            "ratio": {"min": min(ratio), "median": statistics.median(ratio)},
            "runs": len(runs),
        }
        lines.append(
            f"| {case} | {min(ref):.3f} / {statistics.median(ref):.3f} | "
            f"{min(loaded):.3f} / {statistics.median(loaded):.3f} | "
            f"{min(ratio):.3f} / {statistics.median(ratio):.3f} |"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
