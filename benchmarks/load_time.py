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
from typing import NamedTuple


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


COLD = "torch.compile, empty cache (cold)"


class Row(NamedTuple):
    """What a table's processes run: the prelude that builds ``model`` (from
    ``{model}``), the measured and priming bodies by kind, and what a measured
    process runs after its first output (a check, untimed)."""

    prelude: str
    measured: dict
    prime: dict
    epilogue: str = ""


SEED_ROW = Row(PRELUDE, MEASURED, PRIME)

# NOTE: [More rounds for the loads]
# The goals compare our loads with eager (ratios of fresh processes of the
# same round), and what a load adds to eager (0.1-0.4 s) is smaller than how
# much one configuration's process varies between rounds on a 2-core machine
# (0.3-0.7 s): three rounds do not settle a ratio near its goal. Eager and our
# two loads take 2 s a process and the compiles and upstream's loads 10-30 s,
# so eager and our loads run in --load-runs rounds and the rest in the first
# --runs of them; every ratio is still taken within a round (a configuration
# measured in fewer rounds is paired with those rounds' eager and cold compile).
LOAD_CONFIG_IDS = ("eager", "package", "aot")


def config_id(config) -> str:
    """Short name of a CONFIGS row: eager, compile, compile-warm, megacache,
    package, aot, upstream-aot, upstream-aot-warm."""
    label, interpreter, overlay, kind, prime, cache_mode = config
    prefix = "upstream-" if interpreter == "upstream" else ""
    suffix = "-warm" if cache_mode == "primed" else ""
    return prefix + kind + suffix


def _env(overlay: bool, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env["TORCHINDUCTOR_CACHE_DIR"] = cache
    if overlay:
        env["TORCH_OVERLAY"] = "1"
        env["TORCH_OVERLAY_CACHE_DIR"] = str(ROOT / "build" / "overlay-cache")
    return env


def _child(interpreter, overlay, cache, body, model, artifact, measure=True, row=SEED_ROW) -> float:
    code = row.prelude.format(bench=str(BENCH_DIR), model=model) + body.format(artifact=artifact)
    if measure:
        code += FIRST_OUTPUT + row.epilogue
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


def measure_config(config, model, workdir: Path, primed: dict, row: Row = SEED_ROW) -> float:
    """One fresh measured process. What it loads is primed once per (config,
    model) and shared by the runs; an empty cache is a new one every run."""
    label, interpreter, overlay, kind, prime, cache_mode = config
    if (label, model) not in primed:
        prime_dir = Path(tempfile.mkdtemp(dir=workdir))
        artifact = str(prime_dir / "artifact")
        primed_cache = str(prime_dir / "primed-cache")
        if prime is not None:
            _child(interpreter, overlay, primed_cache, row.prime[prime], model, artifact, measure=False, row=row)
        primed[(label, model)] = (artifact, primed_cache)
    artifact, primed_cache = primed[(label, model)]
    cache = primed_cache if cache_mode == "primed" else tempfile.mkdtemp(dir=workdir)
    return _child(interpreter, overlay, cache, row.measured[kind], model, artifact, row=row)


# NOTE: [Phases of a load]
# A package load, one fresh process, split where the time goes: importing
# torch; importing the Dynamo runtime (torch._dynamo, its guards and the
# package loader); building the model (its parameters' initialisation, which
# eager pays too) and wrapping it with torch.compile; the loader's own phases
# from CompilePackage.load_stats (reading the files with the manifest and
# sha256 check, unpickling entries and graphs with the check that every
# kernel a graph's code loads is in the package, installing entries); then on
# the first call under fail_on_recompile the guard build (CheckFunctionManager
# in load mode), the graph hydration (kernel .so load, the wrapper module's
# compile, AOTAutograd's runtime wrappers), the model's own computation (the
# hydrated graph's run: kernels, addmm, ...) and what is left of the call
# (Dynamo's frame handling). These first-call phases are timed by wrapping
# the classes the loader calls. The model's computation is eager's first call
# too, and on a machine whose cores other jobs share it is the noisiest
# figure: two OpenMP threads wait for each other at every parallel region, so
# a 32-block forward took 0.15 s on a quiet machine and 2-3.6 s, in eager and
# loaded alike, while another job ran. It is shown apart, never left in "rest
# of the first call" (as it was until 2026-12-01, when that row read 2.5 s
# for 32 blocks). Eager runs in its own process alongside each load (same
# script shape: import torch, build the model, first call), "× eager"
# compares the two processes of one round, and "× eager without the model's
# computation" leaves both first calls' computation out: the ratio of the
# start-up work, which the load decides. Both processes also time Python's
# garbage collections (gc.callbacks), which fall inside the other rows: the
# loading process imports Dynamo (about 100k more live objects than eager),
# and each full collection walks them all; the one the first call's first
# allocation triggers was most of "rest of the first call" for 32 blocks.
GC_TIMER = r"""
import gc
gc_timed = {{"gc_s": 0.0, "gc_full_s": 0.0}}
gc_started = [0.0]


def time_collections(phase, info):
    if phase == "start":
        gc_started[0] = time.perf_counter()
        return
    took = time.perf_counter() - gc_started[0]
    gc_timed["gc_s"] += took
    if info["generation"] == 2:
        gc_timed["gc_full_s"] += took


gc.callbacks.append(time_collections)
"""

PHASES = "import sys, time, json\n" + GC_TIMER + r"""
import torch
imported_torch = time.time()
import torch._dynamo
import torch._dynamo.guards as guards_module
import torch._dynamo.package as package_module
import torch._dynamo.package_artifacts as artifacts_module
imported_dynamo = time.time()
sys.path.insert(0, {bench!r})
import models

timed = {{"guard_build_s": 0.0, "hydrate_s": 0.0, "graph_calls_s": []}}
base_manager = guards_module.CheckFunctionManager


class TimedCheckFunctionManager(base_manager):
    def __init__(self, *args, **kwargs):
        started = time.perf_counter()
        super().__init__(*args, **kwargs)
        timed["guard_build_s"] += time.perf_counter() - started


guards_module.CheckFunctionManager = TimedCheckFunctionManager
hydrate = artifacts_module._PackagedInductorGraph._hydrate


def timed_hydrate(self, full_args):
    started = time.perf_counter()
    try:
        return hydrate(self, full_args)
    finally:
        timed["hydrate_s"] += time.perf_counter() - started


artifacts_module._PackagedInductorGraph._hydrate = timed_hydrate
graph_call = artifacts_module._PackagedInductorGraph.__call__


def timed_graph_call(self, *args):
    started = time.perf_counter()
    try:
        return graph_call(self, *args)
    finally:
        timed["graph_calls_s"].append(time.perf_counter() - started)


artifacts_module._PackagedInductorGraph.__call__ = timed_graph_call
load_files = package_module.CompilePackage.load_files
stats = []


def recording_load_files(self, *args, **kwargs):
    try:
        return load_files(self, *args, **kwargs)
    finally:
        stats.append(self.load_stats)


package_module.CompilePackage.load_files = recording_load_files
model, inputs = models.MODELS[{model!r}]()
built = time.time()
compiled = torch.compile(model, package={artifact!r})
wrapped = time.time()
compiled.load_package()
loaded = time.time()
torch.compiler.set_stance("fail_on_recompile")
with torch.no_grad():
    out = compiled(*inputs)
called = time.time()
print("FIRST_OUTPUT", called, flush=True)
print("REPORT" + json.dumps({{
    "times": [imported_torch, imported_dynamo, built, wrapped, loaded, called],
    "stats": stats[-1], **timed, **gc_timed,
}}))
"""

EAGER_PHASES = "import sys, time, json\n" + GC_TIMER + r"""
import torch
imported_torch = time.time()
sys.path.insert(0, {bench!r})
import models
model, inputs = models.MODELS[{model!r}]()
built = time.time()
with torch.no_grad():
    out = model(*inputs)
called = time.time()
print("FIRST_OUTPUT", called, flush=True)
print("REPORT" + json.dumps({{"times": [imported_torch, built, called], **gc_timed}}))
"""

# NOTE: [Many packages in one process]
# COUNT functions of one module, each compiled with its own package; the
# measured process loads them all and calls each once under fail_on_recompile.
MANY_FUNCTIONS = "import torch\n" + "".join(
    f"\n\ndef f{i}(x):\n    return torch.relu(x * {i + 2}.0 + {i}.0).sin().sum(dim=-1)\n"
    for i in range(20)
)
MANY = r"""
import sys, time, json
sys.path.insert(0, {workdir!r})
import torch
import many_functions

x = torch.randn(64, 64)
compiled = [
    torch.compile(getattr(many_functions, f"f{{i}}"), package={artifact!r} + f"/f{{i}}")
    for i in range({count})
]
with torch.no_grad():
    if {save!r}:
        for fn in compiled:
            fn(x)
            fn.save_package()
    else:
        for fn in compiled:
            fn.load_package()
        torch.compiler.set_stance("fail_on_recompile")
        for fn in compiled:
            fn(x)
print("FIRST_OUTPUT", time.time(), flush=True)
"""


def _timed_child(code: str, cache: str) -> tuple[float, dict]:
    """Seconds from spawning an overlay process to its first output, and its REPORT."""
    started = time.time()
    proc = subprocess.run(
        [str(OVERLAY_PY), "-c", code], env=_env(True, cache), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed:\n{proc.stderr[-3000:]}")
    lines = proc.stdout.splitlines()
    first = next(l for l in lines if l.startswith("FIRST_OUTPUT"))
    reports = [json.loads(l[len("REPORT") :]) for l in lines if l.startswith("REPORT")]
    report = reports[-1] if reports else {}
    report["started"] = started
    return float(first.split()[1]) - started, report


def _package_phases(report: dict) -> dict[str, float]:
    """The phases of one package-loading process's REPORT (NOTE: [Phases of a load])."""
    imported_torch, imported_dynamo, built, wrapped, loaded, called = report["times"]
    stats = report["stats"]
    loader = stats["verify_s"] + stats["unpickle_s"] + stats["install_s"]
    # the graphs' runs in the first call, their hydration left out
    computation = sum(report["graph_calls_s"]) - report["hydrate_s"]
    return {
        "import torch": imported_torch - report["started"],
        "import the Dynamo runtime": imported_dynamo - imported_torch,
        "build the model (eager does too)": built - imported_dynamo,
        "torch.compile wrap": wrapped - built,
        "read files, manifest + sha256": (loaded - wrapped) - loader + stats["verify_s"],
        "unpickle entries and graphs, kernel check": stats["unpickle_s"],
        "install entries": stats["install_s"],
        "guard build (first call)": report["guard_build_s"],
        "kernel load + runtime wrappers (first call)": report["hydrate_s"],
        "the model's computation (first call)": computation,
        "rest of the first call": (called - loaded)
        - report["guard_build_s"]
        - report["hydrate_s"]
        - computation,
        "garbage collection (inside the rows above)": report["gc_s"],
        "of which full collections": report["gc_full_s"],
    }


def _eager_phases(report: dict) -> dict[str, float]:
    """The eager process's phases, same script shape as the package's."""
    imported_torch, built, called = report["times"]
    return {
        "eager: import torch": imported_torch - report["started"],
        "eager: build the model": built - imported_torch,
        "eager: first call (the model's computation)": called - built,
        "eager: garbage collection (inside its rows)": report["gc_s"],
        "eager: of which full collections": report["gc_full_s"],
    }


def phase_breakdown(model: str, workdir: Path, runs: int) -> dict:
    """Phases of a package load (NOTE: [Phases of a load]) with eager alongside,
    min and median over ``runs`` rounds of fresh processes, and the package's size."""
    prime_dir = Path(tempfile.mkdtemp(dir=workdir))
    artifact = str(prime_dir / "pkg")
    _child("overlay", True, str(prime_dir / "cache"), PRIME["package"], model, artifact, measure=False)
    per_run: dict[str, list[float]] = {}
    for run in range(runs):
        eager_code = EAGER_PHASES.format(bench=str(BENCH_DIR), model=model)
        eager, eager_report = _timed_child(eager_code, tempfile.mkdtemp(dir=workdir))
        code = PHASES.format(bench=str(BENCH_DIR), model=model, artifact=artifact)
        total, report = _timed_child(code, tempfile.mkdtemp(dir=workdir))
        stats = report["stats"]
        phases = _package_phases(report)
        eager_phases = _eager_phases(eager_report)
        forward = phases["the model's computation (first call)"]
        eager_forward = eager_phases["eager: first call (the model's computation)"]
        phases.update(
            {
                "total": total,
                **eager_phases,
                "eager": eager,
                "× eager": total / eager,
                "× eager without the model's computation": (total - forward) / (eager - eager_forward),
            }
        )
        print(
            f"{model} phases run {run}: total {total:.2f} s, eager {eager:.2f} s, "
            f"forward {forward:.2f} / {eager_forward:.2f} s",
            flush=True,
        )
        for key, value in phases.items():
            per_run.setdefault(key, []).append(value)
    size = sum(f.stat().st_size for f in Path(artifact).rglob("*") if f.is_file())
    return {
        "entries": stats["entries"],
        "kernels": stats["kernels"],
        "package_mb": size / 1e6,
        "phases_s": {key: statistics.median(values) for key, values in per_run.items()},
        "phases_min_s": {key: min(values) for key, values in per_run.items()},
    }


def many_packages(workdir: Path, runs: int, counts=(1, 20)) -> dict:
    """Fresh-process load + first call of 1 versus 20 packages (NOTE: [Many
    packages in one process]), median seconds, eager ``import torch`` alongside."""
    (workdir / "many_functions.py").write_text(MANY_FUNCTIONS)
    result = {}
    for count in counts:
        artifact = str(Path(tempfile.mkdtemp(dir=workdir)) / "pkgs")
        prime = MANY.format(workdir=str(workdir), artifact=artifact, count=count, save=True)
        _timed_child(prime, str(workdir / "many-prime-cache"))
        code = MANY.format(workdir=str(workdir), artifact=artifact, count=count, save=False)
        seconds = [_timed_child(code, tempfile.mkdtemp(dir=workdir))[0] for _ in range(runs)]
        result[str(count)] = summarize(seconds)
    eager = [
        _child("overlay", True, tempfile.mkdtemp(dir=workdir), MEASURED["eager"], "mlp", "")
        for _ in range(runs)
    ]
    result["eager_mlp"] = summarize(eager)
    return result


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


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--load-runs",
        type=int,
        default=9,
        help="rounds for eager and our two loads (NOTE: [More rounds for the "
        "loads]); at least --runs",
    )
    parser.add_argument("--models", default="mlp,transformer,convnet")
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "load_time"))
    parser.add_argument(
        "--configs",
        default="",
        help="comma-separated config ids to measure (see config_id; default: all; "
        "eager and the cold compile are always measured)",
    )
    parser.add_argument(
        "--growth-blocks",
        default="1,8,32",
        help="transformer stacks for the phase breakdown and growth table ('' skips)",
    )
    parser.add_argument(
        "--phases-only",
        action="store_true",
        help="measure only the phase breakdown (mlp and --growth-blocks), into the "
        "report --out already holds (a new one if there is none)",
    )
    parser.add_argument(
        "--steady-state-only",
        action="store_true",
        help="measure only the steady state, into the report --out already holds",
    )
    parser.add_argument(
        "--zoo",
        action="store_true",
        help="measure only the model zoo row (benchmarks/zoo_models.py), into "
        "benchmarks/results/load_time_zoo.{md,json}",
    )
    parser.add_argument(
        "--serving",
        action="store_true",
        help="measure only the serving row (NOTE: [Serving row]), into "
        "benchmarks/results/load_time_serving.{md,json}",
    )
    return parser


def measure_model(
    model: str, configs: list, runs: int, workdir: Path, primed: dict, load_runs: int, row: Row = SEED_ROW
) -> dict:
    """Every configuration's seconds on ``model`` over ``runs`` rounds (eager and
    our loads over ``load_runs``, NOTE: [More rounds for the loads]), with its
    ratios to eager and to the cold compile of the same round."""
    per_run: dict[str, list[float]] = {c[0]: [] for c in configs}
    for run in range(load_runs):
        for config in configs:
            if run >= runs and config_id(config) not in LOAD_CONFIG_IDS:
                continue
            seconds = measure_config(config, model, workdir, primed, row)
            per_run[config[0]].append(seconds)
            log.info("%s %s run %d: %.2fs", model, config[0], run, seconds)
            print(f"{model:12s} {config[0]:42s} run {run}: {seconds:6.2f} s", flush=True)
    eager = per_run["eager"]
    cold = per_run[COLD]
    # zip pairs a configuration's rounds with the same rounds of eager and of
    # the cold compile (every configuration starts at round 0).
    return {
        label: {
            **summarize(values),
            # Ratios within the same run, then min/median over runs.
            "vs_eager": summarize([v / e for v, e in zip(values, eager)]),
            "vs_cold": summarize([v / c for v, c in zip(values, cold)]),
        }
        for label, values in per_run.items()
    }


def measure_everything(args, report: dict, configs: list, workdir: Path) -> None:
    """The models' tables, the phase breakdown, many packages and the steady state,
    into ``report``."""
    primed: dict = {}
    for model in args.models.split(","):
        report["models"][model] = measure_model(
            model, configs, args.runs, workdir, primed, args.load_runs
        )
    report["phases"] = measure_phases(args, workdir)
    report["many_packages"] = many_packages(workdir, args.runs)
    print("many packages", json.dumps(report["many_packages"]), flush=True)
    # Per-call figures of µs vary as much between processes as the loads do
    # (NOTE: [More rounds for the loads]): they take the loads' rounds.
    report["steady_state_mlp_us"] = steady_state(workdir, args.load_runs)


def measure_phases(args, workdir: Path) -> dict:
    """The phase breakdown of the MLP and of each --growth-blocks stack."""
    phases = {
        model: phase_breakdown(model, workdir, args.runs)
        for model in ["mlp"] + [f"blocks{n}" for n in filter(None, args.growth_blocks.split(","))]
    }
    for model, model_phases in phases.items():
        print(model, json.dumps(model_phases), flush=True)
    return phases


def remeasure_phases(args, out: Path) -> int:
    """--phases-only: the phase breakdown again, into the report ``out`` holds."""
    workdir = Path(tempfile.mkdtemp(prefix="load-time-"))
    json_path = out.with_suffix(".json")
    report = json.loads(json_path.read_text()) if json_path.exists() else {}
    report.setdefault("machine", f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}")
    report.setdefault("runs", args.runs)
    report.setdefault("models", {})
    try:
        import_time(True)  # materialises the overlay for this series, not timed
        report["phases"] = measure_phases(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return write_report(report, out)


def remeasure_steady_state(out: Path, runs: int) -> int:
    """--steady-state-only: the steady state again, into the report ``out`` holds."""
    workdir = Path(tempfile.mkdtemp(prefix="load-time-"))
    report = json.loads(out.with_suffix(".json").read_text())
    try:
        report["steady_state_mlp_us"] = steady_state(workdir, runs)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return write_report(report, out)


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    args.load_runs = max(args.runs, args.load_runs)
    if args.zoo:
        return zoo_load_times(args.runs)
    if args.serving:
        return serving_load_times(args)
    out = Path(args.out)
    if args.steady_state_only:
        return remeasure_steady_state(out, args.load_runs)
    if args.phases_only:
        return remeasure_phases(args, out)
    configs = [c for c in CONFIGS if c[1] == "overlay" or UPSTREAM_PY.exists()]
    if args.configs:
        wanted = set(args.configs.split(",")) | {"eager", "compile"}
        configs = [c for c in configs if config_id(c) in wanted]
    workdir = Path(tempfile.mkdtemp(prefix="load-time-"))
    import_time(True)  # materialises the overlay for this series, not timed
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "runs": args.runs,
        "load_runs": args.load_runs,
        "import_torch_s": {
            "stock": summarize([import_time(False) for _ in range(args.runs)]),
            "overlay": summarize([import_time(True) for _ in range(args.runs)]),
        },
        "models": {},
    }
    try:
        measure_everything(args, report, configs, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return write_report(report, out)


def write_report(report: dict, out: Path) -> int:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(render(report))
    print(render(report))
    return 0


def render_model(model: str, rows: dict) -> list[str]:
    """One model's table of configurations, then how much faster our empty-cache
    loads are than upstream's (when upstream was measured)."""
    lines = [
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
    upstream_label = next((label for label in UPSTREAM_LOADS if label in rows), None)
    if upstream_label:
        upstream = rows[upstream_label]
        for label in ("package load, empty cache (ours)", "aot_compile load, empty cache (ours)"):
            if label in rows:
                lines.append(
                    f"{label.split(',')[0]}: {upstream['median'] / rows[label]['median']:.1f}× "
                    f"faster than {UPSTREAM_LOADS[upstream_label]} (medians)."
                )
        lines.append("")
    return lines


def render_phases(phases: dict) -> list[str]:
    """The phase breakdown table, one column per model (NOTE: [Phases of a load]):
    min / median seconds per cell where the report has minimums, else medians."""
    models = list(phases)
    with_min = all("phases_min_s" in phases[m] for m in models)
    lines = [
        "Phases of a package load, empty inductor cache (NOTE: [Phases of a load] in "
        f"benchmarks/load_time.py), {'min / median' if with_min else 'median'} seconds; "
        "blocksN is a stack of N transformer blocks:",
        "",
        "| phase | " + " | ".join(models) + " |",
        "|---|" + "---|" * len(models),
    ]
    for key, label in (("entries", "entries"), ("kernels", "kernel binaries"), ("package_mb", "package MB")):
        lines.append(f"| {label} | " + " | ".join(f"{phases[m][key]:.3g}" for m in models) + " |")

    def cell(model: str, phase: str) -> str:
        median = f"{phases[model]['phases_s'][phase]:.3f}"
        return f"{phases[model]['phases_min_s'][phase]:.3f} / {median}" if with_min else median

    for phase in phases[models[0]]["phases_s"]:
        lines.append(f"| {phase} | " + " | ".join(cell(m, phase) for m in models) + " |")
    lines.append("")
    return lines


def render_many_packages(many: dict) -> list[str]:
    one, twenty = many["1"]["median"], many["20"]["median"]
    return [
        f"Packages loaded in one process (20 small functions, one package each; load + first "
        f"call of each, fresh process, median): 1 package {one:.2f} s, 20 packages "
        f"{twenty:.2f} s, {(twenty - one) / 19 * 1000:.0f} ms per further package "
        f"(eager MLP process {many['eager_mlp']['median']:.2f} s).",
        "",
    ]


def render_steady_state(steady: dict) -> list[str]:
    """µs per call of the seed MLP: eager, compiled and loaded, under each stance."""

    def us(key):
        return f"{steady[key]['min']:.1f} / {steady[key]['median']:.1f}"

    lines = [
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
    return lines


def render(report: dict) -> str:
    lines = [
        f"Machine: {report['machine']}; {report['runs']} fresh processes per figure"
        + (
            f", {report['load_runs']} for eager and our loads (NOTE: [More rounds "
            "for the loads] in benchmarks/load_time.py)"
            if report.get("load_runs", report["runs"]) > report["runs"]
            else ""
        )
        + "; seconds from process start to first output (min / median); ratios to the "
        "eager floor and to the cold compile of the same run (median of per-round "
        "ratios).",
        "",
    ]
    for model, rows in report["models"].items():
        lines += render_model(model, rows)
    if report.get("phases"):
        lines += render_phases(report["phases"])
    if report.get("many_packages"):
        lines += render_many_packages(report["many_packages"])
    imp = report.get("import_torch_s")
    if imp:
        lines.append(
            f"`import torch`: stock {imp['stock']['median']:.2f} s, with the overlay "
            f"active {imp['overlay']['median']:.2f} s (median)."
        )
    if report.get("steady_state_mlp_us"):
        lines += render_steady_state(report["steady_state_mlp_us"])
    return "\n".join(lines) + "\n"


# NOTE: [Serving row]
# Spawn to the first generated token of the serving zoo's tiny Llama
# (benchmarks/serving_models.py; test/dynamo/test_package_serving.py's
# config): import torch and transformers, build the model, prefill a 9-token
# prompt into a DynamicCache, argmax. Every compile is Inductor with
# dynamic=True, as a server compiles for every prompt length. What is loaded
# was saved after a 5-token prompt and 6 greedy decode steps, so the measured
# prompt length was never seen at save. The configurations: eager (the floor),
# a cold compile, our package load with an empty inductor cache under
# fail_on_recompile, and upstream 2.13's best path. On 2.13 (2026-12-02,
# transformers 4.52.4): aot_compile of the forward fails at save with
# dynamic=True (TensorifyScalarRestartAnalysis, which aot_compile cannot
# restart) and, with the prompt marked dynamic instead, at load
# ("Missing required external references: ['___module_collections_<id>_c0']");
# caching_precompile + save_cache_artifacts() / load_cache_artifacts() loads,
# but the loaded entry fails its guards (the precompile probe
# serving_llama_decode: a recompile under fail_on_recompile), so Dynamo traces
# again and Inductor and AOTAutograd hit the caches the Mega-Cache filled.
# That is the row measured, without fail_on_recompile. Eager and our load run
# in --load-runs rounds, the rest in --runs (NOTE: [More rounds for the loads]);
# each measured process checks, after its first output, that its token is
# eager's.
SERVING_PRELUDE = """
import sys, time
sys.path.insert(0, {bench!r})
import torch
import serving_models as serving
model = serving.MODELS[{model!r}]()
prompt = serving.prompt(serving.SERVE_PROMPT)
"""

SERVING_COMPILE = "compiled = torch.compile(model, backend='inductor', dynamic=True{package})\n"
SERVING_SAVED = "serving.serve(compiled, serving.prompt(serving.SAVE_PROMPT), serving.SAVE_STEPS)\n"
SERVING_FIRST_TOKEN = "token = serving.first_token(compiled, prompt)\n"
CACHING_PRECOMPILE = "torch._dynamo.config.caching_precompile = True\n"
PACKAGE_OPTION = ", package={artifact!r}"

SERVING_ROW = Row(
    prelude=SERVING_PRELUDE,
    measured={
        "eager": "token = serving.first_token(model, prompt)\n",
        "compile": SERVING_COMPILE.format(package="") + SERVING_FIRST_TOKEN,
        "package": SERVING_COMPILE.format(package=PACKAGE_OPTION)
        + "compiled.load_package()\n"
        "torch.compiler.set_stance('fail_on_recompile')\n" + SERVING_FIRST_TOKEN,
        "precompile": CACHING_PRECOMPILE
        + "torch.compiler.load_cache_artifacts(open({artifact!r}, 'rb').read())\n"
        + SERVING_COMPILE.format(package="")
        + SERVING_FIRST_TOKEN,
    },
    prime={
        "package": SERVING_COMPILE.format(package=PACKAGE_OPTION)
        + SERVING_SAVED
        + "compiled.save_package()\n",
        "precompile": CACHING_PRECOMPILE
        + SERVING_COMPILE.format(package="")
        + SERVING_SAVED
        + "data, _ = torch.compiler.save_cache_artifacts()\n"
        "open({artifact!r}, 'wb').write(data)\n",
    },
    epilogue=(
        "assert token == serving.first_token(model, prompt), 'first token differs from eager'\n"
    ),
)
SERVING_UPSTREAM = "upstream 2.13 caching_precompile + Mega-Cache load, empty cache (recompiles)"
SERVING_CONFIGS = [
    ("eager", "overlay", False, "eager", None, "empty"),
    (COLD, "overlay", True, "compile", None, "empty"),
    ("package load, empty cache (ours)", "overlay", True, "package", "package", "empty"),
    (SERVING_UPSTREAM, "upstream", False, "precompile", "precompile", "empty"),
]
# The upstream load each table compares our loads with, and how to name it.
UPSTREAM_LOADS = {
    "upstream 2.13 aot load, empty cache": "upstream 2.13's empty-cache aot load",
    SERVING_UPSTREAM: "upstream 2.13's caching_precompile + Mega-Cache load",
}
SERVING_GOAL = 1.2


def serving_load_times(args) -> int:
    """See NOTE: [Serving row]; into benchmarks/results/load_time_serving.{md,json}."""
    configs = [c for c in SERVING_CONFIGS if c[1] == "overlay" or UPSTREAM_PY.exists()]
    workdir = Path(tempfile.mkdtemp(prefix="load-time-serving-"))
    import_time(True)  # materialises the overlay for this series, not timed
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "runs": args.runs,
        "load_runs": args.load_runs,
        "models": {},
    }
    try:
        report["models"]["llama"] = measure_model(
            "llama", configs, args.runs, workdir, {}, args.load_runs, SERVING_ROW
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out = BENCH_DIR / "results" / "load_time_serving"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    text = render_serving(report)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


def render_serving(report: dict) -> str:
    """The serving table (render_model's) under a heading saying what is timed,
    then the goal's ratio."""
    rows = report["models"]["llama"]
    lines = render(report).splitlines()
    lines[lines.index("### llama")] = (
        "### Llama, spawn to first generated token (NOTE: [Serving row] in benchmarks/load_time.py)"
    )
    ratio = rows["package load, empty cache (ours)"]["vs_eager"]
    lines += [
        f"Package load × eager's first token: {ratio['median']:.2f} median, {ratio['min']:.2f} min "
        f"of per-round ratios (goal ≤ {SERVING_GOAL})."
    ]
    return "\n".join(lines) + "\n"


# NOTE: [Zoo row]
# The models of test/dynamo/test_package_zoo.py (benchmarks/zoo_models.py, each
# with its backend: aot_eager for most, inductor for nn.TransformerEncoder),
# each timed from process start to first output in fresh processes: eager (the
# floor), a cold compile with that backend, and a load of a package saved once
# beforehand, with an empty inductor cache under fail_on_recompile.
ZOO_PRELUDE = """
import sys, time
sys.path.insert(0, {bench!r})
import torch
import zoo_models
model, inputs, backend = zoo_models.ZOO[{model!r}]()
"""

ZOO_BODIES = {
    "eager": "with torch.no_grad():\n    out = model(*inputs)\n",
    "compile": (
        "compiled = torch.compile(model, backend=backend)\n"
        "with torch.no_grad():\n    out = compiled(*inputs)\n"
    ),
    "save": (
        "compiled = torch.compile(model, backend=backend, package={artifact!r})\n"
        "with torch.no_grad():\n    compiled(*inputs)\n"
        "compiled.save_package()\n"
    ),
    "package": (
        "compiled = torch.compile(model, backend=backend, package={artifact!r})\n"
        "compiled.load_package()\n"
        "torch.compiler.set_stance('fail_on_recompile')\n"
        "with torch.no_grad():\n    out = compiled(*inputs)\n"
    ),
}
ZOO_LABELS = {
    "eager": "eager",
    "compile": "torch.compile, empty cache (cold)",
    "package": "package load, empty cache",
}


def _zoo_child(model: str, kind: str, cache: str, artifact: str) -> float:
    code = ZOO_PRELUDE.format(bench=str(BENCH_DIR), model=model)
    code += ZOO_BODIES[kind].format(artifact=artifact) + FIRST_OUTPUT
    started = time.time()
    proc = subprocess.run(
        [str(OVERLAY_PY), "-c", code], env=_env(True, cache), capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise RuntimeError(f"zoo benchmark child ({model}, {kind}) failed:\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("FIRST_OUTPUT"))
    return float(line.split()[1]) - started


def zoo_load_times(runs: int) -> int:
    """See NOTE: [Zoo row]."""
    sys.path.insert(0, str(BENCH_DIR))
    import zoo_models

    out = BENCH_DIR / "results" / "load_time_zoo"
    workdir = Path(tempfile.mkdtemp(prefix="load-time-zoo-"))
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "runs": runs,
        "models": {},
    }
    try:
        for model in zoo_models.ZOO:
            artifact = str(workdir / model / "package")
            _zoo_child(model, "save", str(workdir / model / "save-cache"), artifact)
            per_run: dict[str, list[float]] = {kind: [] for kind in ZOO_LABELS}
            for run in range(runs):
                for kind in ZOO_LABELS:
                    cache = tempfile.mkdtemp(dir=workdir)
                    seconds = _zoo_child(model, kind, cache, artifact)
                    per_run[kind].append(seconds)
                    print(f"{model:20s} {ZOO_LABELS[kind]:36s} run {run}: {seconds:6.2f} s", flush=True)
            backend = zoo_models.ZOO[model]()[2]
            report["models"][model] = {
                "backend": backend,
                **{
                    kind: {
                        **summarize(values),
                        "vs_eager": summarize([v / e for v, e in zip(values, per_run["eager"])]),
                    }
                    for kind, values in per_run.items()
                },
            }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    lines = [
        f"Machine: {report['machine']}; {runs} fresh processes per figure; seconds from "
        "process start to first output (min / median); × eager: ratio to the eager "
        "floor of the same run (median).",
        "",
        "| model | backend | eager | cold compile | package load | load × eager | cold × eager |",
        "|---|---|---|---|---|---|---|",
    ]
    for model, row in report["models"].items():

        def cell(kind: str, row: dict = row) -> str:
            return f"{row[kind]['min']:.2f} / {row[kind]['median']:.2f}"

        lines.append(
            f"| {model} | {row['backend']} | {cell('eager')} | {cell('compile')} | "
            f"{cell('package')} | {row['package']['vs_eager']['median']:.2f} | "
            f"{row['compile']['vs_eager']['median']:.2f} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
