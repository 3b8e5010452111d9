"""The distributed jobs of the behaviour diff: train, save, then train again in
a fresh job from what one rank saved (issue #47, item 7).

Two jobs, each on 2 CPU ranks joined by gloo through a file store, with the
models of benchmarks/distributed_models.py (the jobs of
test/distributed/test_package_distributed.py and
test/distributed/test_package_fsdp2_training.py):

* ``ddp``: ``DDPNet`` under DistributedDataParallel with ``bucket_cap_mb=1``
  (DDPOptimizer splits the frame's graph), compiled with Inductor, SGD;
* ``fsdp2``: ``FSDP2Net``, each block compiled with Inductor on its own
  (``fullgraph=True``) and ``fully_shard``ed, then the root; AdamW.

Each runs in every mode the environment's torch has (NOTE: [Distributed job
modes]): a cold job (every rank with an empty TORCHINDUCTOR_CACHE_DIR of its
own) trains ``--steps`` steps and rank 0 saves its artifacts; then a FRESH job
(new processes, new empty caches) where EVERY rank loads rank 0's artifacts and
trains the same steps on the same data. What is recorded per job and mode:

* whether the fresh job recompiles: the graphs Dynamo traced on each rank,
  and the Inductor FX graph cache hits and misses;
* whether each rank's losses over the steps are bitwise equal (``float.hex``)
  to the cold job's on the same rank;
* whether rank 0's artifacts serve every rank: on each rank, nothing compiled
  (no Dynamo graph, no FX graph miss), only Inductor's graphs served (Dynamo
  traced again, every FX graph a hit), or compiled.

Writes ``<out>/distributed_jobs.json``; tools/behaviour_diff/diff_upstream.py
runs it in the overlay and upstream-2.13 environments and renders the table.

    python tools/behaviour_diff/distributed_jobs.py --out /tmp/dj [--jobs ddp] [--steps 3]
"""

# NOTE: [Distributed job modes]
# * packages (torch.compile(..., package=...), the overlay and the patched
#   wheel): rank 0 calls save_package() on every compiled holder (the DDP
#   model; each FSDP2 block); every rank of the fresh job calls load_package()
#   on the same prefix before its first step.
# * mega-cache (upstream 2.13's best path for a training script it does not
#   change): rank 0 writes torch.compiler.save_cache_artifacts()'s bytes; every
#   rank of the fresh job calls torch.compiler.load_cache_artifacts() on them
#   before it builds the model. Dynamo traces again; Inductor's graphs come
#   from the bytes.
# * mega-cache + caching_precompile: the same with 2.13's
#   torch._dynamo.config.caching_precompile on in both jobs
#   (TORCH_CACHING_PRECOMPILE=1), which adds Dynamo's entries to the bytes.
# A torch whose torch.compile takes package= runs the first; any other the
# last two (2.13's aot_compile saves one fullgraph callable: neither job is
# one, DDPOptimizer splits the DDP frame and FSDP2 compiles per block).
# Ranks run with OMP_NUM_THREADS=1 and TORCHINDUCTOR_COMPILE_THREADS=1 (a fork
# for parallel compile after gloo started its threads can deadlock), and leave
# without tearing gloo down (pytorch#75097), after a barrier.

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


REPO_ROOT = Path(__file__).resolve().parents[2]
MODELS_DIR = REPO_ROOT / "benchmarks"
JOBS = ("ddp", "fsdp2")
PACKAGES = "packages"
MEGA_CACHE = "mega-cache"
MEGA_CACHE_PRECOMPILE = "mega-cache + caching_precompile"
RESULT_FILE = "distributed_jobs.json"
RANK_REPORT = "RANK_REPORT"
WORLD_SIZE = 2
DEFAULT_STEPS = 3
# Seconds: one collective, and one job of all ranks.
COLLECTIVE_TIMEOUT_S = 120
JOB_TIMEOUT_S = 600
# --keep-logs: where each rank's stderr is copied.
KEEP_LOGS: Path | None = None


# -- one rank (a fresh process) ----------------------------------------------------


def _ddp_job(torch, models, compile_kwargs):
    """The DDP model and its optimizer; the compiled holders of its artifacts."""
    from torch.nn.parallel import DistributedDataParallel

    torch.manual_seed(0)
    model = torch.compile(
        DistributedDataParallel(models.DDPNet(), bucket_cap_mb=1),
        backend="inductor",
        **compile_kwargs("ddp_net"),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def batch(rank, step):
        g = torch.Generator().manual_seed(1000 * rank + step)
        return (torch.randn(4, 512, generator=g),)

    def loss_fn(out):
        return out.square().mean()

    return model, optimizer, batch, loss_fn, [model]


def _fsdp2_job(torch, models, compile_kwargs):
    """The FSDP2 model (torchtitan's spelling) and its optimizer; the compiled blocks."""
    import torch.nn.functional as F
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = models.FSDP2Net()
    for i, block in enumerate(model.layers):
        model.layers[i] = torch.compile(
            block, backend="inductor", fullgraph=True, **compile_kwargs(f"block{i}")
        )
    holders = list(model.layers)
    for block in model.layers:
        fully_shard(block)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    def batch(rank, step):
        g = torch.Generator().manual_seed(1000 * rank + step)
        return torch.randn(8, 128, generator=g), torch.randint(0, 16, (8,), generator=g)

    def loss_fn(out, labels):
        return F.cross_entropy(out, labels)

    return model, optimizer, batch, loss_fn, holders


def _loaded_entries(holder) -> int:
    package = (
        holder._compile_package()
        if hasattr(holder, "_compile_package")
        else holder._package
    )
    return len(package._loaded)


def rank_main(spec: dict[str, Any]) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    sys.path.insert(0, str(MODELS_DIR))
    import distributed_models

    torch.set_num_threads(1)
    rank, mode, phase = int(spec["rank"]), spec["mode"], spec["phase"]
    artifact = Path(spec["artifact"])
    dist.init_process_group(
        "gloo",
        init_method=f"file://{spec['store']}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    if phase == "fresh" and mode != PACKAGES:
        torch.compiler.load_cache_artifacts(artifact.read_bytes())

    def compile_kwargs(name):
        return {"package": name} if mode == PACKAGES else {}

    job = {"ddp": _ddp_job, "fsdp2": _fsdp2_job}[spec["job"]]
    model, optimizer, batch, loss_fn, holders = job(
        torch, distributed_models, compile_kwargs
    )
    report: dict[str, Any] = {"rank": rank}
    if phase == "fresh" and mode == PACKAGES:
        for holder in holders:
            holder.load_package(prefix=str(artifact))
        report["entries_loaded"] = sum(_loaded_entries(h) for h in holders)
    losses = []
    for step in range(int(spec["steps"])):
        x, *targets = batch(rank, step)
        optimizer.zero_grad()
        loss = loss_fn(model(x), *targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.item().hex())
    from torch._dynamo.utils import counters

    report.update(
        losses=losses,
        # Graphs Dynamo traced (frames_ok also counts frames it only looked at).
        graphs_traced=counters["stats"]["unique_graphs"],
        fxgraph_cache_hit=counters["inductor"]["fxgraph_cache_hit"],
        fxgraph_cache_miss=counters["inductor"]["fxgraph_cache_miss"],
    )
    if phase == "cold" and rank == 0:
        if mode == PACKAGES:
            for holder in holders:
                holder.save_package(prefix=str(artifact))
        else:
            data, _ = torch.compiler.save_cache_artifacts()
            artifact.write_bytes(data)
    dist.barrier()
    print(f"{RANK_REPORT} {json.dumps(report)}", flush=True)
    sys.stdout.flush()
    os._exit(0)


# -- the parent -------------------------------------------------------------------


def modes_of_this_torch() -> list[str]:
    import inspect

    import torch

    if "package" in inspect.signature(torch.compile).parameters:
        return [PACKAGES]
    return [MEGA_CACHE, MEGA_CACHE_PRECOMPILE]


def rank_env(mode: str, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        TORCHINDUCTOR_COMPILE_THREADS="1",
        TORCHINDUCTOR_CACHE_DIR=str(cache),
    )
    env.pop("TORCH_CACHING_PRECOMPILE", None)
    if mode == MEGA_CACHE_PRECOMPILE:
        env["TORCH_CACHING_PRECOMPILE"] = "1"
    return env


def run_ranks(
    job: str, mode: str, phase: str, artifact: Path, steps: int, workdir: Path
) -> dict[str, Any]:
    """One job of WORLD_SIZE fresh ranks: their reports, or an error."""
    jobdir = Path(tempfile.mkdtemp(prefix=f"{job}-{phase}-", dir=workdir))
    result: dict[str, Any] = {"ranks": []}
    started = time.perf_counter()
    with contextlib.ExitStack() as files:
        procs = []
        for rank in range(WORLD_SIZE):
            spec = {
                "job": job,
                "mode": mode,
                "phase": phase,
                "rank": rank,
                "steps": steps,
                "store": str(jobdir / "store"),
                "artifact": str(artifact),
            }
            cache = jobdir / f"inductor-cache-rank{rank}"
            cache.mkdir()
            stderr = files.enter_context(open(jobdir / f"rank{rank}.stderr", "w"))
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        str(Path(__file__).resolve()),
                        "--rank",
                        json.dumps(spec),
                    ],
                    env=rank_env(mode, cache),
                    stdout=subprocess.PIPE,
                    stderr=stderr,
                    text=True,
                )
            )
        for rank, proc in enumerate(procs):
            try:
                out, _ = proc.communicate(
                    timeout=max(1, JOB_TIMEOUT_S - (time.perf_counter() - started))
                )
            except subprocess.TimeoutExpired:
                for other in procs:
                    other.kill()
                out, _ = proc.communicate()
                result.setdefault(
                    "error", f"rank {rank} timed out after {JOB_TIMEOUT_S} s"
                )
            report = next(
                (
                    json.loads(line[len(RANK_REPORT) :])
                    for line in out.splitlines()
                    if line.startswith(RANK_REPORT)
                ),
                None,
            )
            if report is None and "error" not in result:
                lines = (jobdir / f"rank{rank}.stderr").read_text().strip().splitlines()
                tail = next((ln for ln in reversed(lines) if ln.strip()), "")
                result["error"] = (
                    f"rank {rank} exit {proc.returncode}: {tail.strip()[:300]}"
                )
            result["ranks"].append(report or {})
    result["seconds"] = round(time.perf_counter() - started, 1)
    if KEEP_LOGS is not None:
        KEEP_LOGS.mkdir(parents=True, exist_ok=True)
        for rank in range(WORLD_SIZE):
            shutil.copy(
                jobdir / f"rank{rank}.stderr",
                KEEP_LOGS / f"{job}-{phase}-{mode.replace(' ', '')}-rank{rank}.log",
            )
    shutil.rmtree(jobdir, ignore_errors=True)
    return result


def served(rank: dict) -> str:
    """What rank 0's artifacts did for one rank of the fresh job."""
    if rank.get("fxgraph_cache_miss"):
        return "compiled"
    if rank.get("graphs_traced"):
        return "inductor"
    return "all"


def judge(cold: dict, fresh: dict) -> dict[str, Any]:
    """The fresh job against the cold one."""
    out: dict[str, Any] = {
        "cold_seconds": cold.get("seconds"),
        "fresh_seconds": fresh.get("seconds"),
    }
    error = (
        cold.get("error")
        and f"cold job: {cold['error']}"
        or fresh.get("error")
        and f"fresh job: {fresh['error']}"
    )
    if error:
        out["error"] = error
        return out
    ranks = fresh["ranks"]
    out.update(
        graphs_traced=[r.get("graphs_traced", 0) for r in ranks],
        fxgraph_cache=[
            [r.get("fxgraph_cache_hit", 0), r.get("fxgraph_cache_miss", 0)]
            for r in ranks
        ],
        cold_graphs_traced=[r.get("graphs_traced", 0) for r in cold["ranks"]],
        recompiles=any(
            r.get("graphs_traced") or r.get("fxgraph_cache_miss") for r in ranks
        ),
        losses_bitwise_equal=[
            c.get("losses") == f.get("losses") for c, f in zip(cold["ranks"], ranks)
        ],
        served=[served(r) for r in ranks],
    )
    if any("entries_loaded" in r for r in ranks):
        out["entries_loaded"] = [r.get("entries_loaded") for r in ranks]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory for distributed_jobs.json")
    parser.add_argument(
        "--label", default="", help="the environment's label, for the log"
    )
    parser.add_argument("--jobs", default=",".join(JOBS))
    parser.add_argument(
        "--modes", help="comma-separated; default: every mode this torch has"
    )
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--keep-logs", type=Path, help="copy every rank's stderr here")
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global KEEP_LOGS
    KEEP_LOGS = args.keep_logs
    if args.rank:
        rank_main(json.loads(args.rank))
        return 0
    import torch

    modes = args.modes.split(",") if args.modes else modes_of_this_torch()
    results: dict[str, Any] = {
        "torch": str(torch.__version__),
        "world_size": WORLD_SIZE,
        "steps": args.steps,
        "modes": modes,
        "jobs": {},
    }
    workdir = Path(tempfile.mkdtemp(prefix="behaviour-diff-distributed-"))
    try:
        for job in [j for j in args.jobs.split(",") if j]:
            results["jobs"][job] = {}
            for mode in modes:
                artifact = workdir / f"{job}-{mode.replace(' ', '').replace('+', '-')}"
                if mode != PACKAGES:
                    artifact = artifact.with_suffix(".bin")
                cold = run_ranks(job, mode, "cold", artifact, args.steps, workdir)
                if "error" not in cold and not artifact.exists():
                    cold["error"] = f"rank 0 saved nothing at {artifact.name}"
                fresh = (
                    run_ranks(job, mode, "fresh", artifact, args.steps, workdir)
                    if "error" not in cold
                    else {"error": "no artifacts", "ranks": []}
                )
                results["jobs"][job][mode] = verdict = judge(cold, fresh)
                print(
                    f"[{args.label}] {job} / {mode}: {json.dumps(verdict)}", flush=True
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / RESULT_FILE).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
