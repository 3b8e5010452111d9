"""Guard-check time of loaded guard managers, and what saving guards adds to compile.

Guard check: each run is a fresh interpreter that builds the reference
CheckFunctionManager for a few example frames (save_guards=True),
loads a second one from its guards_state, and times
``guard_manager.check(f_locals)`` of both on the same inputs in the same process.
The parent reports min and median over runs of the time per check and of the
loaded/reference ratio, which should be ~1.0.

Compile cost of saving: fresh interpreters, alternating, compile a small MLP with
``torch.compile(backend="eager")`` while every CheckFunctionManager Dynamo builds
gets ``save_guards=False``, ``save_guards=True``, or ``save_guards=True`` with the
debug flag ``config.verify_serialized_guards``. Each reports the first-call
(compile) time and the time spent building guard managers, both as CPU time of the
compiling thread (time.thread_time: on a shared machine wall time also counts the
waits for a core, which swamp a few milliseconds); the parent reports min and
median and the save/no-save ratio of the median (goal: at most 1.05).

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
import guard_round_trip
import test_guard_serialization as t

cases = {{
    "tensor": (lambda x: x + 1, (torch.ones(8),)),
    "module_call": (lambda m, x: m(x).relu(), (t.Small(), torch.ones(2))),
    "globals_builtins": (t.uses_builtins, (torch.ones(2), 4)),
}}
out = {{}}
for name, (fn, args) in cases.items():
    built = t.build_check_fn_manager(fn, args)
    loaded = guard_round_trip.load_built(built)
    f_locals = built.f_locals
    assert built.ref.guard_manager.check(f_locals) and loaded.check(f_locals)
    managers = {{"reference": built.ref.guard_manager, "loaded": loaded}}
    timings = {{label: float("inf") for label in managers}}
    for _ in range(7):  # interleaved, so warm-up and noise hit both alike
        for label, mgr in managers.items():
            check = mgr.check
            t_run = timeit.timeit(lambda: check(f_locals), number={number}) / {number}
            timings[label] = min(timings[label], t_run)
    out[name] = timings
print(json.dumps(out))
"""


COMPILE_CHILD = r"""
import json, time
import torch
import torch._dynamo.convert_frame as convert_frame
from torch._dynamo import config
from torch._dynamo.guards import CheckFunctionManager

SAVE_GUARDS, VERIFY = {save_guards!r}, {verify!r}
guard_build_s = []


def timed_manager(*args, **kwargs):
    kwargs["save_guards"] = SAVE_GUARDS
    kwargs.pop("guards_serialization_mode", None)
    start = time.thread_time()
    manager = CheckFunctionManager(*args, **kwargs)
    guard_build_s.append(time.thread_time() - start)
    assert (manager.guards_state is not None) == SAVE_GUARDS
    return manager


def make_mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.LayerNorm(64),
        torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8),
    )


convert_frame.CheckFunctionManager = timed_manager
config.verify_serialized_guards = VERIFY
x = torch.randn(4, 32)
torch.compile(make_mlp(), backend="eager")(x)  # warm-up: Dynamo's lazy imports
torch._dynamo.reset()
guard_build_s.clear()
model = make_mlp()
compiled = torch.compile(model, backend="eager")
start = time.thread_time()
out = compiled(x)
compile_s = time.thread_time() - start
assert torch.allclose(out, model(x)) and guard_build_s
print(json.dumps({{"compile_s": compile_s, "guard_build_s": sum(guard_build_s)}}))
"""

COMPILE_MODES = {
    "no_save": {"save_guards": False, "verify": False},
    "save_guards": {"save_guards": True, "verify": False},
    "save_guards+verify": {"save_guards": True, "verify": True},
}


def compile_once(mode: str) -> dict:
    env = dict(os.environ, TORCH_OVERLAY="1")
    code = COMPILE_CHILD.format(**COMPILE_MODES[mode])
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compile_cost_report(runs: int) -> tuple[dict, list[str]]:
    """Compile time with and without saving guards, in alternating fresh processes."""
    samples = {mode: [] for mode in COMPILE_MODES}
    for _ in range(runs):
        for mode in COMPILE_MODES:
            samples[mode].append(compile_once(mode))
    report, lines = {}, [
        "| guards at compile | compile CPU ms (min / median) | guard build CPU ms (min / median) "
        "| compile vs no_save (min / median) |",
        "|---|---|---|---|",
    ]
    base = [s["compile_s"] * 1e3 for s in samples["no_save"]]
    for mode, runs_of_mode in samples.items():
        comp = [s["compile_s"] * 1e3 for s in runs_of_mode]
        build = [s["guard_build_s"] * 1e3 for s in runs_of_mode]
        ratio = {
            "min": min(comp) / min(base),
            "median": statistics.median(comp) / statistics.median(base),
        }
        report[mode] = {
            "compile_ms": {"min": min(comp), "median": statistics.median(comp)},
            "guard_build_ms": {"min": min(build), "median": statistics.median(build)},
            "compile_ratio": ratio,
            "runs": len(comp),
            "samples": runs_of_mode,
        }
        lines.append(
            f"| {mode} | {min(comp):.1f} / {statistics.median(comp):.1f} | "
            f"{min(build):.2f} / {statistics.median(build):.2f} | "
            f"{ratio['min']:.3f} / {ratio['median']:.3f} |"
        )
    # The guard-build delta is measured inside the compile and is far steadier than
    # the compile times themselves on a shared machine: the headline figure.
    added_ms = (
        report["save_guards"]["guard_build_ms"]["median"]
        - report["no_save"]["guard_build_ms"]["median"]
    )
    share = added_ms / statistics.median(base)
    report["save_guards_added"] = {"guard_build_ms_median": added_ms, "share_of_compile": share}
    lines += [
        "",
        f"Saving guards adds {added_ms:.2f} ms of guard build per compiled frame "
        f"(median), {share:.1%} of the median no_save compile (goal: at most 5%).",
    ]
    return report, lines


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
    parser.add_argument("--compile-runs", type=int, default=7)
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
    compile_report, compile_lines = compile_cost_report(args.compile_runs)
    report = {"guard_check": report, "compile_cost_of_saving_guards": compile_report}
    lines = ["## Guard check", "", *lines, "", "## Compile cost of saving guards",
             "", 'Small MLP, torch.compile(backend="eager"), first call; '
             "fresh process per sample, modes alternating.", "", *compile_lines]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    Path(args.out).with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
