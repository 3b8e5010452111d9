"""Load-time benchmark: precompiled loads against cold compile, warm caches, Mega-Cache
and upstream torch 2.13 (the seed's loader comparison).

Every figure is one FRESH process, timed from just before it is started to its
first output. Artifacts a configuration loads (warm caches, Mega-Cache bytes,
packages, aot_compile files) are made by a separate priming process first. For
each model and configuration the harness reports min and median over ``--runs``
runs, each also as a ratio to the eager floor and to the cold compile of the same
run, plus ``import torch`` time (with and without the overlay) and steady-state
per-call time (eager, freshly compiled, loaded from a package).

    make bench-load            (results in benchmarks/results/load_time.{md,json})
"""

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
OVERLAY_PY = ROOT / ".venv" / "bin" / "python"
UPSTREAM_PY = ROOT / ".venv-upstream" / "bin" / "python"

PRELUDE = """
import sys, time
sys.path.insert(0, {bench!r})
import torch
import models
model, inputs = models.MODELS[{model!r}]()
"""

FIRST_OUTPUT = """
print("FIRST_OUTPUT", time.time(), flush=True)
"""

# Measured children: process start -> first output.
MEASURED = {
    "eager": "with torch.no_grad():\n    out = model(*inputs)\n",
    "compile": (
        "compiled = torch.compile(model)\n"
        "with torch.no_grad():\n    out = compiled(*inputs)\n"
    ),
    "megacache": (
        "import torch._dynamo\n"
        "torch.compiler.load_cache_artifacts(open({artifact!r}, 'rb').read())\n"
        "compiled = torch.compile(model)\n"
        "with torch.no_grad():\n    out = compiled(*inputs)\n"
    ),
    "package": (
        "compiled = torch.compile(model, package={artifact!r})\n"
        "compiled.load_package()\n"
        "torch.compiler.set_stance('fail_on_recompile')\n"
        "with torch.no_grad():\n    out = compiled(*inputs)\n"
    ),
    "aot": (
        "torch.compiler.set_stance('fail_on_recompile')\n"
        "loaded = torch.compiler.load_compiled_function(open({artifact!r}, 'rb'))\n"
        "with torch.no_grad():\n    out = loaded(model, *inputs)\n"
    ),
}

# Priming children: make what a measured child loads.
PRIME = {
    "compile": (
        "compiled = torch.compile(model)\n"
        "with torch.no_grad():\n    compiled(*inputs)\n"
    ),
    "megacache": (
        "compiled = torch.compile(model)\n"
        "with torch.no_grad():\n    compiled(*inputs)\n"
        "data, _ = torch.compiler.save_cache_artifacts()\n"
        "open({artifact!r}, 'wb').write(data)\n"
    ),
    "package": (
        "compiled = torch.compile(model, package={artifact!r})\n"
        "with torch.no_grad():\n    compiled(*inputs)\n"
        "compiled.save_package()\n"
    ),
    "aot": (
        "with torch._dynamo.config.patch('enable_aot_compile', True), torch.no_grad():\n"
        "    fn = torch.compile(model, fullgraph=True).forward.aot_compile((inputs, {{}}))\n"
        "    fn.save_compiled_function({artifact!r})\n"
    ),
}

# (label, interpreter, overlay, measured kind, priming kind, cache: empty|primed)
CONFIGS = [
    ("eager", "overlay", False, "eager", None, "empty"),
    ("torch.compile, empty cache (cold)", "overlay", True, "compile", None, "empty"),
    ("torch.compile, warm inductor+AOT caches", "overlay", True, "compile", "compile", "primed"),
    ("Mega-Cache into an empty cache", "overlay", True, "megacache", "megacache", "empty"),
    ("package load, empty cache (ours)", "overlay", True, "package", "package", "empty"),
    ("aot_compile load, empty cache (ours)", "overlay", True, "aot", "aot", "empty"),
    ("upstream 2.13 aot load, empty cache", "upstream", False, "aot", "aot", "empty"),
    ("upstream 2.13 aot load, warm cache", "upstream", False, "aot", "aot", "primed"),
]


def _env(overlay: bool, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env["TORCHINDUCTOR_CACHE_DIR"] = cache
    if overlay:
        env["TORCH_OVERLAY"] = "1"
        env["TORCH_OVERLAY_CACHE_DIR"] = str(ROOT / "build" / "overlay-cache")
    return env


def _child(interpreter, overlay, cache, body, model, artifact, measure=True) -> float:
    code = PRELUDE.format(bench=str(BENCH_DIR), model=model) + body.format(artifact=artifact)
    if measure:
        code += FIRST_OUTPUT
    python = str(OVERLAY_PY if interpreter == "overlay" else UPSTREAM_PY)
    started = time.time()
    proc = subprocess.run(
        [python, "-c", code], env=_env(overlay, cache), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    if not measure:
        return 0.0
    line = next(l for l in proc.stdout.splitlines() if l.startswith("FIRST_OUTPUT"))
    return float(line.split()[1]) - started


def measure_config(config, model, workdir: Path) -> float:
    label, interpreter, overlay, kind, prime, cache_mode = config
    run_dir = Path(tempfile.mkdtemp(dir=workdir))
    artifact = str(run_dir / "artifact")
    primed_cache = str(run_dir / "primed-cache")
    if prime is not None:
        _child(interpreter, overlay, primed_cache, PRIME[prime], model, artifact, measure=False)
    cache = primed_cache if cache_mode == "primed" else str(run_dir / "empty-cache")
    return _child(interpreter, overlay, cache, MEASURED[kind], model, artifact)


def import_time(overlay: bool) -> float:
    code = "import time; t = time.time(); import torch; print(time.time() - t)"
    proc = subprocess.run(
        [str(OVERLAY_PY), "-c", code],
        env=_env(overlay, tempfile.mkdtemp()),
        capture_output=True,
        text=True,
        check=True,
    )
    return float(proc.stdout.strip().splitlines()[-1])


# NOTE: [Steady-state stances]
# torch.compiler.set_stance("fail_on_recompile") wraps Dynamo's callback anew at
# every call of a compiled function (torch 2.7.1's eval_frame does so for any
# stance but the default), which costs several µs per call whatever was compiled.
# So every figure is taken under both stances, and compiled and loaded functions
# are compared under the same one; the loading process makes its first call under
# fail_on_recompile, so a figure is never that of a recompiled function.
STEADY = r"""
import sys, timeit, json
sys.path.insert(0, {bench!r})
import torch
import models
torch.manual_seed(0)
model = models.SeedMLP().eval()
x = torch.randn(2, 64)
out = {{}}
def per_call(fn):
    fn(x)
    return min(timeit.repeat(lambda: fn(x), number=2000, repeat=5)) / 2000 * 1e6
with torch.no_grad():
    compiled = torch.compile(model, package={artifact!r})
    if {load!r}:
        compiled.load_package()
        with torch.compiler.set_stance("fail_on_recompile"):
            compiled(x)
        name = "loaded"
    else:
        compiled(x)
        compiled.save_package()
        out["eager_us"] = per_call(model)
        name = "compiled"
    out[name + "_us"] = per_call(compiled)
    with torch.compiler.set_stance("fail_on_recompile"):
        out[name + "_fail_on_recompile_us"] = per_call(compiled)
print(json.dumps(out))
"""


def steady_state(workdir: Path, runs: int) -> dict:
    """µs per call of the seed MLP (see NOTE: [Steady-state stances]), min/median
    over ``runs`` pairs of fresh processes."""
    per_run: dict[str, list[float]] = {}
    for _ in range(runs):
        artifact = str(Path(tempfile.mkdtemp(dir=workdir)) / "pkg")
        for load in (False, True):
            script = STEADY.format(bench=str(BENCH_DIR), artifact=artifact, load=load)
            proc = subprocess.run(
                [str(OVERLAY_PY), "-c", script],
                env=_env(True, str(workdir / "steady-cache")),
                capture_output=True,
                text=True,
                check=True,
            )
            for key, value in json.loads(proc.stdout.strip().splitlines()[-1]).items():
                per_run.setdefault(key, []).append(value)
    return {key: summarize(values) for key, values in per_run.items()}


def summarize(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "runs": values}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--models", default="mlp,transformer,convnet")
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "load_time"))
    parser.add_argument(
        "--steady-state-only",
        action="store_true",
        help="measure only the steady state, into the report --out already holds",
    )
    args = parser.parse_args(argv)
    out = Path(args.out)
    workdir = Path(tempfile.mkdtemp(prefix="load-time-"))
    if args.steady_state_only:
        report = json.loads(out.with_suffix(".json").read_text())
        try:
            report["steady_state_mlp_us"] = steady_state(workdir, args.runs)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return write_report(report, out)
    configs = [c for c in CONFIGS if c[1] == "overlay" or UPSTREAM_PY.exists()]
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "runs": args.runs,
        "import_torch_s": {
            "stock": summarize([import_time(False) for _ in range(args.runs)]),
            "overlay": summarize([import_time(True) for _ in range(args.runs)]),
        },
        "models": {},
    }
    try:
        for model in args.models.split(","):
            per_run: dict[str, list[float]] = {c[0]: [] for c in configs}
            for run in range(args.runs):
                for config in configs:
                    seconds = measure_config(config, model, workdir)
                    per_run[config[0]].append(seconds)
                    log.info("%s %s run %d: %.2fs", model, config[0], run, seconds)
                    print(f"{model:12s} {config[0]:42s} run {run}: {seconds:6.2f} s", flush=True)
            eager = per_run["eager"]
            cold = per_run["torch.compile, empty cache (cold)"]
            report["models"][model] = {
                label: {
                    **summarize(values),
                    # Ratios within the same run, then min/median over runs.
                    "vs_eager": summarize([v / e for v, e in zip(values, eager)]),
                    "vs_cold": summarize([v / c for v, c in zip(values, cold)]),
                }
                for label, values in per_run.items()
            }
        report["steady_state_mlp_us"] = steady_state(workdir, args.runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return write_report(report, out)


def write_report(report: dict, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(render(report))
    print(render(report))
    return 0


def render(report: dict) -> str:
    lines = [
        f"Machine: {report['machine']}; {report['runs']} fresh processes per figure; "
        "seconds from process start to first output (min / median); ratios to the "
        "eager floor and to the cold compile of the same run (median).",
        "",
    ]
    for model, rows in report["models"].items():
        lines += [
            f"### {model}",
            "",
            "| configuration | seconds (min / median) | × eager | × cold compile |",
            "|---|---|---|---|",
        ]
        for label, r in rows.items():
            lines.append(
                f"| {label} | {r['min']:.2f} / {r['median']:.2f} | "
                f"{r['vs_eager']['median']:.2f} | {r['vs_cold']['median']:.2f} |"
            )
        lines.append("")
    imp = report["import_torch_s"]
    lines.append(
        f"`import torch`: stock {imp['stock']['median']:.2f} s, with the overlay "
        f"active {imp['overlay']['median']:.2f} s (median)."
    )
    steady = report.get("steady_state_mlp_us")
    if steady:
        def us(key):
            return f"{steady[key]['min']:.1f} / {steady[key]['median']:.1f}"

        lines += [
            "",
            "Steady state, seed MLP, batch 2, no_grad, µs per call (min / median of "
            "fresh processes; compiled and loaded compared under the same stance):",
            "",
            "| stance | eager | torch.compile | loaded from a package | loaded / compiled (median) |",
            "|---|---|---|---|---|",
        ]
        for stance, suffix in (("default", ""), ("fail_on_recompile", "_fail_on_recompile")):
            ratio = steady[f"loaded{suffix}_us"]["median"] / steady[f"compiled{suffix}_us"]["median"]
            lines.append(
                f"| {stance} | {us('eager_us') if not suffix else '—'} | "
                f"{us(f'compiled{suffix}_us')} | {us(f'loaded{suffix}_us')} | {ratio:.2f} |"
            )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
