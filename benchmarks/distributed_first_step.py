"""Spawn to the end of the first training step on 2 gloo ranks: eager, a cold
Inductor compile, an Inductor package load, and upstream torch 2.13's best path
(issue #47, item 6).

Two jobs, each on ``--world-size`` CPU ranks joined by gloo through a file store
(the models: ``benchmarks/distributed_models.py``):

* ``ddp``: four ``Linear(512, 512)`` + ReLU layers under DistributedDataParallel
  with ``bucket_cap_mb=1`` (DDPOptimizer cuts the graph in four pieces), SGD;
  the model of test/distributed/test_package_distributed.py;
* ``fsdp2``: three residual MLP blocks and a head, each block compiled on its
  own and ``fully_shard``ed, then the root (torchtitan's spelling), AdamW; the
  model of test/distributed/test_package_fsdp2_training.py.

For every job and configuration (NOTE: [First-step configurations]) each of
``--rounds`` rounds starts one fresh job, timed from just before this process
spawns the first rank to the latest moment any rank finished step 1 (forward,
backward with its collectives, optimizer step). Reports min and median seconds,
the ratio of medians to eager's and the min of the per-round ratios, and the
load average the rounds ran under, into
``benchmarks/results/distributed_first_step.{json,md}``.

    make bench-distributed-first-step
    python benchmarks/distributed_first_step.py --jobs ddp --rounds 3
"""

# NOTE: [First-step configurations]
# * eager: torch 2.7.1 of .venv, the overlay off; the floor.
# * eager, overlay on: the same with TORCH_OVERLAY=1. DDP's constructor and
#   fully_shard import torch._dynamo (DDP.__init__ asks
#   torch._dynamo.utils.get_optimize_ddp_mode()), which after a plain
#   `import torch` took 6.3 s on the loaded 2-core machine and 0.5 s after the
#   overlay's (2026-12-05), so the overlay's eager job is the floor a package
#   job is compared with too.
# * cold compile: the overlay on, torch.compile(backend="inductor", package=...),
#   each rank with an empty TORCHINDUCTOR_CACHE_DIR of its own (ranks on other
#   machines share no cache). After its timed step, untimed, rank 0 saves its
#   packages: the package load of the same round loads them.
# * package load: the overlay on, an empty TORCHINDUCTOR_CACHE_DIR per rank,
#   EVERY rank loads rank 0's packages (NOTE: [One package serves every rank
#   under DDP] in test/distributed/test_package_distributed.py, NOTE: [One
#   package serves every rank under FSDP2]) and runs the step under
#   set_stance("fail_on_recompile"); after its timing line each rank checks
#   that its loss is bitwise the cold compile's of the same rank and round.
# * upstream 2.13 Mega-Cache load: torch 2.13 of .venv-upstream (no overlay,
#   no PYTHONPATH), each rank load_cache_artifacts() of the bytes rank 0 of a
#   2.13 cold job wrote with save_cache_artifacts(), into an empty cache, then
#   torch.compile and the step. Mega-Cache is 2.13's way to carry one job's
#   compiled work to every rank of the next without changing the training
#   script: its FX graphs serve Inductor (and AOTAutograd's entries, where
#   AOTAutograd caches: not DDPOptimizer's pieces, whose fakify_first_call
#   compiles 2.13 bypasses too), while Dynamo traces again. 2.13's
#   caching_precompile adds Dynamo's entries to the same bytes; on the DDP
#   job (one round, 2026-12-05, --upstream-caching-precompile) its load
#   still traced every frame and took 64.9 s against 67.4 s for the 2.13
#   cold job, so the default row leaves it off (the flag measures it).
#   2.13's aot_compile / save_compiled_function, which saves one fullgraph
#   callable, is not measured: neither job is one such callable (DDPOptimizer
#   splits the DDP frame; the FSDP2 job is one compile per block). The 2.13
#   cold job that writes the bytes is timed too, in the first round only (it
#   is the slowest row and only primes the others).
# Every rank runs with OMP_NUM_THREADS=1 and TORCHINDUCTOR_COMPILE_THREADS=1
# (a fork for parallel compile after gloo started its threads can deadlock, as
# the tests note). Each rank prints STEP1 <time.time()> right after step 1;
# the job's figure is the latest of those minus the parent's time.time() just
# before the first spawn (interpreter start, imports, process group setup,
# model build, compile or load, and the step; not the exit). Then, untimed,
# every rank meets a barrier, reports, and leaves without tearing gloo down
# (pytorch#75097).

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OVERLAY_PY = ROOT / ".venv" / "bin" / "python"
UPSTREAM_PY = ROOT / ".venv-upstream" / "bin" / "python"
RESULTS = ROOT / "benchmarks" / "results" / "distributed_first_step"
JOBS = ("ddp", "fsdp2")
GOAL = 1.3
STEP1 = "STEP1"
RANK_REPORT = "RANK_REPORT"
JOB_TIMEOUT_S = 600
# The 2.13 jobs with torch._dynamo.config.caching_precompile (--upstream-caching-precompile).
UPSTREAM_CACHING_PRECOMPILE = False
COLLECTIVE_TIMEOUT_S = 300

EAGER = "eager"
EAGER_OVERLAY = "eager, overlay on"
COLD = "cold Inductor compile (ours)"
PACKAGE = "package load, rank 0's packages (ours)"
UPSTREAM_COLD = "upstream 2.13 cold Inductor compile"
UPSTREAM_MEGACACHE = "upstream 2.13 Mega-Cache load"
# label -> (interpreter, rank kind)
CONFIGS = {
    EAGER: ("overlay-off", "eager"),
    EAGER_OVERLAY: ("overlay", "eager-overlay"),
    COLD: ("overlay", "compile"),
    PACKAGE: ("overlay", "package"),
    UPSTREAM_COLD: ("upstream", "upstream-compile"),
    UPSTREAM_MEGACACHE: ("upstream", "upstream-megacache"),
}


# -- one rank (a fresh process; only the standard library before its timed imports) --


def _ddp_job(torch, models, compile_kwargs):
    """One step of the DDP job; the compiled holders of its packages."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = DistributedDataParallel(models.DDPNet(), bucket_cap_mb=1)
    holders = []
    if compile_kwargs is not None:
        model = torch.compile(model, **compile_kwargs("ddp_net"))
        holders.append(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step(rank):
        x = torch.randn(4, 512, generator=torch.Generator().manual_seed(rank))
        loss = model(x).square().mean()
        loss.backward()
        optimizer.step()
        return loss

    return step, holders


def _fsdp2_job(torch, models, compile_kwargs):
    """One step of the FSDP2 job (torchtitan's spelling); the compiled blocks."""
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = models.FSDP2Net()
    holders = []
    if compile_kwargs is not None:
        for i, block in enumerate(model.layers):
            model.layers[i] = torch.compile(block, fullgraph=True, **compile_kwargs(f"block{i}"))
            holders.append(model.layers[i])
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def step(rank):
        g = torch.Generator().manual_seed(rank)
        x, y = torch.randn(8, 128, generator=g), torch.randint(0, 16, (8,), generator=g)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return step, holders


def rank_main(spec: dict[str, Any]) -> None:
    import datetime

    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def phase(name):
        nonlocal mark
        now = time.perf_counter()
        phases[name] = now - mark
        mark = now

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import distributed_models

    torch.set_num_threads(1)
    phase("import torch")
    rank, kind = int(spec["rank"]), spec["kind"]
    dist.init_process_group(
        "gloo", init_method=f"file://{spec['store']}", rank=rank, world_size=int(spec["world_size"]),
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    phase("init_process_group")
    if kind == "upstream-megacache":
        torch.compiler.load_cache_artifacts(Path(spec["artifact"]).read_bytes())
        phase("load")
    if kind in ("eager", "eager-overlay"):
        compile_kwargs = None
    elif kind in ("compile", "package"):
        def compile_kwargs(name):
            return {"backend": "inductor", "package": name}
    else:
        def compile_kwargs(name):
            return {"backend": "inductor"}
    step, holders = {"ddp": _ddp_job, "fsdp2": _fsdp2_job}[spec["job"]](torch, distributed_models, compile_kwargs)
    phase("build (and wrap) the model")
    if kind == "package":
        for holder in holders:
            holder.load_package(prefix=spec["artifact"])
        phase("load")
        with torch.compiler.set_stance("fail_on_recompile"):
            loss = step(rank)
    else:
        loss = step(rank)
    print(f"{STEP1} {time.time()}", flush=True)
    phase("step 1")
    # Untimed from here on.
    from torch._dynamo.utils import counters

    report: dict[str, Any] = {
        "rank": rank,
        "loss": loss.item().hex(),
        "frames_compiled": counters["frames"]["ok"],
        "fxgraph_cache": {k: v for k, v in counters["inductor"].items() if k.startswith("fxgraph_cache")},
        "aot_autograd": dict(counters["aot_autograd"]),
        "phases": phases,
    }
    if kind == "compile" and rank == 0:
        for holder in holders:
            holder.save_package(prefix=spec["artifact"])
    if kind == "upstream-compile" and rank == 0:
        data, _ = torch.compiler.save_cache_artifacts()
        Path(spec["artifact"]).write_bytes(data)
    dist.barrier()
    print(f"{RANK_REPORT} {json.dumps(report)}", flush=True)
    sys.stdout.flush()
    os._exit(0)


# -- the parent -------------------------------------------------------------------


def rank_env(interpreter: str, cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "TORCH_OVERLAY", "TORCH_CACHING_PRECOMPILE")}
    env.update(OMP_NUM_THREADS="1", TORCHINDUCTOR_COMPILE_THREADS="1", TORCHINDUCTOR_CACHE_DIR=str(cache))
    if interpreter == "upstream" and UPSTREAM_CACHING_PRECOMPILE:
        env["TORCH_CACHING_PRECOMPILE"] = "1"
    if interpreter != "upstream":
        # 2.7.1's .venv with this tree first on the path; the overlay only where compiled.
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    if interpreter == "overlay":
        env["TORCH_OVERLAY"] = "1"
        env.setdefault("TORCH_OVERLAY_CACHE_DIR", str(ROOT / "build" / "overlay-cache"))
    return env


def run_job(job: str, label: str, artifact: Path, world_size: int, workdir: Path) -> dict[str, Any]:
    """One fresh job of ``world_size`` ranks; its seconds to the end of step 1 on
    every rank, or an error."""
    interpreter, kind = CONFIGS[label]
    python = UPSTREAM_PY if interpreter == "upstream" else OVERLAY_PY
    jobdir = Path(tempfile.mkdtemp(prefix=f"{job}-{kind}-", dir=workdir))
    load = os.getloadavg()[0]
    result: dict[str, Any] = {"load_average_1min": load, "ranks": []}
    step_times = []
    with contextlib.ExitStack() as files:
        procs = []
        start = time.time()
        for rank in range(world_size):
            spec = {"job": job, "kind": kind, "rank": rank, "world_size": world_size,
                    "store": str(jobdir / "store"), "artifact": str(artifact)}
            cache = jobdir / f"inductor-cache-rank{rank}"
            cache.mkdir()
            stderr = files.enter_context(open(jobdir / f"rank{rank}.stderr", "w"))
            procs.append(subprocess.Popen(
                [str(python), str(Path(__file__).resolve()), "--rank", json.dumps(spec)],
                env=rank_env(interpreter, cache), stdout=subprocess.PIPE, stderr=stderr, text=True,
            ))
        for rank, proc in enumerate(procs):
            try:
                out, _ = proc.communicate(timeout=max(1, JOB_TIMEOUT_S - (time.time() - start)))
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                out, _ = proc.communicate()
                result["error"] = f"rank {rank} timed out after {JOB_TIMEOUT_S}s"
            report: dict[str, Any] = {}
            for line in out.splitlines():
                if line.startswith(STEP1):
                    step_times.append(float(line.split()[1]))
                elif line.startswith(RANK_REPORT):
                    report = json.loads(line[len(RANK_REPORT):])
            if proc.returncode and "error" not in result:
                tail = (jobdir / f"rank{rank}.stderr").read_text().strip().splitlines()[-1:] or [""]
                result["error"] = f"rank {rank} exit {proc.returncode}: {tail[0][:300]}"
            result["ranks"].append(report)
    if len(step_times) == world_size and "error" not in result:
        result["seconds"] = max(step_times) - start
    shutil.rmtree(jobdir, ignore_errors=True)
    return result


def _check(label: str, result: dict[str, Any], cold: dict[str, Any] | None) -> None:
    """A package job must compile nothing and reproduce the cold job's losses."""
    if label != PACKAGE or "error" in result:
        return
    if any(r.get("frames_compiled") for r in result["ranks"]):
        result["error"] = f"Dynamo compiled frames after load_package(): {result['ranks']}"
    elif cold is None or "error" in cold:
        result["error"] = "no cold job of this round to compare with"
    elif [r["loss"] for r in result["ranks"]] != [r["loss"] for r in cold["ranks"]]:
        result["error"] = "step-1 losses differ from the cold compile's"


PHASES = ("import torch", "init_process_group", "build (and wrap) the model", "load", "step 1")


def _median_phases(phase_runs: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(p[name] for p in phase_runs if name in p)
            for name in PHASES if any(name in p for p in phase_runs)}


def summarize(job_runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    eager = job_runs.get(EAGER, [])
    for label, runs in job_runs.items():
        good = [r["seconds"] for r in runs if "seconds" in r and "error" not in r]
        row: dict[str, Any] = {"runs": [r.get("seconds") for r in runs],
                               "failures": [r["error"] for r in runs if "error" in r]}
        if good:
            row.update(min=min(good), median=statistics.median(good))
        pairs = [(r["seconds"], e["seconds"]) for r, e in zip(runs, eager)
                 if "seconds" in r and "error" not in r and "seconds" in e and "error" not in e]
        if good and pairs:
            eager_median = statistics.median(e for _, e in pairs)
            row["x_eager_medians"] = row["median"] / eager_median
            row["x_eager_min_of_rounds"] = min(s / e for s, e in pairs)
        row["phases_median_rank0"] = _median_phases(
            [r["ranks"][0]["phases"] for r in runs if r.get("ranks") and "phases" in r["ranks"][0]])
        row["caches"] = [r["ranks"][0].get("fxgraph_cache") for r in runs if r.get("ranks") and r["ranks"][0]][:1]
        rows[label] = row
    return rows


def render(report: dict[str, Any]) -> str:
    loads = report["load_average_1min"]
    lines = [
        f"Machine: {report['machine']}; torch {report['torch']} (+ overlay) and upstream {report['upstream_torch']}; "
        f"{report['world_size']} gloo CPU ranks, one OpenMP thread each; {report['rounds']} rounds of fresh jobs "
        f"(the upstream cold compile in round 1 only: it primes the Mega-Cache load; 2.13's caching_precompile "
        f"{'on' if report.get('upstream_caching_precompile') else 'off'}). Seconds from just before "
        f"the first rank's spawn to the end of step 1 (forward, backward, optimizer step) on every rank, "
        f"min / median; × eager: ratio of medians, and the min of the per-round ratios. 1-minute load average "
        f"when the jobs started: min {min(loads):.1f}, median {statistics.median(loads):.1f}, max {max(loads):.1f} "
        f"(the machine was shared). Run {report['started']} - {report['finished']} UTC.",
    ]
    for job, rows in report["jobs"].items():
        lines += ["", f"### {job}", "",
                  "| configuration | seconds (min / median) | × eager (medians) | × eager (min of rounds) |",
                  "|---|---|---|---|"]
        for label, row in rows.items():
            if "median" not in row:
                lines.append(f"| {label} | failed: {'; '.join(row['failures'])[:300]} | | |")
                continue
            ratio = row.get("x_eager_medians")
            lines.append(
                f"| {label} | {row['min']:.2f} / {row['median']:.2f} | "
                + (f"{ratio:.2f} | {row['x_eager_min_of_rounds']:.2f} |" if ratio is not None else " | |")
                + (f" ({len(row['failures'])} failed)" if row["failures"] else "")
            )
        package = rows.get(PACKAGE, {})
        if "x_eager_medians" in package:
            verdict = "holds" if package["x_eager_medians"] <= GOAL and not package["failures"] else "does NOT hold"
            lines += ["", f"Goal (package load within {GOAL}× eager, medians): {verdict} "
                      f"({package['x_eager_medians']:.2f}×)."]
            for other in (COLD, UPSTREAM_MEGACACHE):
                if "median" in rows.get(other, {}):
                    lines.append(f"Package load vs {other}: {rows[other]['median'] / package['median']:.1f}× faster "
                                 "(medians).")
    lines += ["", "### Where the time goes (rank 0, medians of its own phase timers, seconds)", "",
              "| job | configuration | interpreter start + rest (may be < 0: medians do not add) | " + " | ".join(PHASES) + " |",
              "|---|---|---|" + "---|" * len(PHASES)]
    for job, rows in report["jobs"].items():
        for label, row in rows.items():
            phases = row.get("phases_median_rank0")
            if not phases or "median" not in row:
                continue
            rest = row["median"] - sum(phases.values())
            lines.append(f"| {job} | {label} | {rest:.2f} | "
                         + " | ".join(f"{phases[n]:.2f}" if n in phases else "" for n in PHASES) + " |")
    return "\n".join(lines) + "\n"


def _versions() -> tuple[str, str]:
    ours = subprocess.run([str(OVERLAY_PY), "-c", "import torch; print(torch.__version__)"],
                          capture_output=True, text=True, check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TORCH_OVERLAY")}
    upstream = subprocess.run([str(UPSTREAM_PY), "-c", "import torch; print(torch.__version__)"],
                              capture_output=True, text=True, env=env).stdout.strip() or "missing"
    return ours, upstream


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--no-upstream", action="store_true", help="leave out the 2.13 rows")
    parser.add_argument("--upstream-caching-precompile", action="store_true",
                        help="2.13's jobs with caching_precompile on (its Dynamo entries in the Mega-Cache)")
    parser.add_argument("--kinds", help="run only these, comma-separated: " + ",".join(k for _, k in CONFIGS.values()))
    parser.add_argument("--out", type=Path, default=RESULTS, help="results path without suffix (.json and .md)")
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global UPSTREAM_CACHING_PRECOMPILE
    UPSTREAM_CACHING_PRECOMPILE = args.upstream_caching_precompile
    if args.rank:
        rank_main(json.loads(args.rank))
        return 0
    ours, upstream = _versions()
    labels = [EAGER, EAGER_OVERLAY, COLD, PACKAGE] + ([] if args.no_upstream or upstream == "missing"
                                       else [UPSTREAM_COLD, UPSTREAM_MEGACACHE])
    if args.kinds:
        labels = [label for label in labels if CONFIGS[label][1] in args.kinds.split(",")]
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "torch": ours, "upstream_torch": upstream, "upstream_caching_precompile": UPSTREAM_CACHING_PRECOMPILE, "world_size": args.world_size, "rounds": 0,
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "jobs": {}, "load_average_1min": [],
    }
    jobs = [j for j in args.jobs.split(",") if j]
    runs = {job: {label: [] for label in labels} for job in jobs}
    workdir = Path(tempfile.mkdtemp(prefix="distributed-first-step-"))
    try:
        for round_index in range(args.rounds):
            for job in jobs:
                packages = workdir / f"{job}-packages-{round_index}"
                megacache = workdir / f"{job}-megacache.bin"
                for label in labels:
                    if label == UPSTREAM_COLD and round_index:
                        continue
                    artifact = megacache if label.startswith("upstream") else packages
                    if label == UPSTREAM_MEGACACHE and not megacache.exists():
                        result = {"error": "no Mega-Cache artifact (the 2.13 cold job failed)"}
                    else:
                        result = run_job(job, label, artifact, args.world_size, workdir)
                    cold = runs[job][COLD][-1] if runs[job].get(COLD) else None
                    _check(label, result, cold)
                    runs[job][label].append(result)
                    if "load_average_1min" in result:
                        report["load_average_1min"].append(result["load_average_1min"])
                    seconds = result.get("seconds")
                    print(f"{job:6s} {label:42s} round {round_index + 1}: "
                          + (f"{seconds:7.2f} s" if seconds is not None else "no figure")
                          + (f" FAILED: {result['error']}" if "error" in result else "")
                          + f"  (load {result.get('load_average_1min', 0):.1f})", flush=True)
                shutil.rmtree(packages, ignore_errors=True)
            # Written after every round, so that a run stopped early keeps the rounds it finished.
            report["rounds"] = round_index + 1
            report["finished"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
            report["jobs"] = {job: summarize(runs[job]) for job in jobs}
            report["raw"] = runs
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.with_suffix(".json").write_text(json.dumps(report, indent=2))
            args.out.with_suffix(".md").write_text(render(report))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(args.out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
