"""Many replicas loading one compile package at once.

A serving fleet starts N replicas together, each loading the same package.
This benchmark saves one package (in its own process), then loads it in one
fresh process alone and in N fresh processes at once (all released together
once every one has imported torch and built its compiled module), each with an
empty TORCHINDUCTOR_CACHE_DIR, and reports the load time distribution
(load_package, and the first call under set_stance("fail_on_recompile"))
against the single load of the same run. Every replica must hit: a recompile
is an error.

    TORCH_OVERLAY=1 python benchmarks/replica_load.py --replicas 8
    TORCH_OVERLAY=1 python benchmarks/replica_load.py --replicas 8 --backend aot_eager --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


PACKAGE = "replica_mlp"
TIMEOUT_S = 600


def _model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.Linear(512, 64),
    )


def _worker(args: dict) -> dict:
    import torch

    compiled = torch.compile(_model(), backend=args["backend"], package=PACKAGE)
    x = torch.randn(32, 256, generator=torch.Generator().manual_seed(1))
    if args["phase"] == "save":
        compiled(x)
        compiled.save_package(prefix=args["prefix"])
        return {"saved": True}
    Path(args["ready"]).touch()
    while not os.path.exists(args["go"]):
        time.sleep(0.005)
    started = time.perf_counter()
    compiled.load_package(prefix=args["prefix"])
    loaded = time.perf_counter()
    with torch.compiler.set_stance("fail_on_recompile"):
        compiled(x)
    first_call = time.perf_counter()
    return {"load_s": loaded - started, "first_call_s": first_call - loaded}


def _spawn(args: dict, workdir: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=workdir, prefix="inductor_cache_"),
        "OMP_NUM_THREADS": "1",
    }
    return subprocess.Popen(
        [sys.executable, __file__, "--worker", json.dumps(args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _collect(procs: list[subprocess.Popen]) -> list[dict]:
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=TIMEOUT_S)
            if proc.returncode != 0:
                raise RuntimeError(f"replica failed ({proc.returncode}):\n{err[-4000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _load_together(n: int, base: dict, workdir: Path, tag: str) -> list[dict]:
    go = workdir / f"go_{tag}"
    readies = [workdir / f"ready_{tag}_{i}" for i in range(n)]
    procs = [
        _spawn({**base, "phase": "load", "ready": str(r), "go": str(go)}, workdir)
        for r in readies
    ]
    deadline = time.monotonic() + TIMEOUT_S
    while not all(r.exists() for r in readies):
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            break
        time.sleep(0.02)
    go.touch()
    return _collect(procs)


def _summary(values: list[float]) -> dict:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
    }


def run(replicas: int, backend: str) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="replica_load_"))
    try:
        base = {"backend": backend, "prefix": str(workdir / "packages")}
        _collect([_spawn({**base, "phase": "save"}, workdir)])
        single = _load_together(1, base, workdir, "single")[0]
        many = _load_together(replicas, base, workdir, "many")
        return {
            "replicas": replicas,
            "backend": backend,
            "cpus": os.cpu_count(),
            "single": single,
            "concurrent_load_s": _summary([r["load_s"] for r in many]),
            "concurrent_first_call_s": _summary([r["first_call_s"] for r in many]),
            "all_hit": len(many) == replicas,
        }
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, default=8, help="processes loading at once")
    parser.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager"])
    parser.add_argument("--json", help="also write the result to this file")
    args = parser.parse_args()
    result = run(args.replicas, args.backend)
    single = result["single"]
    print(f"{result['replicas']} replicas, backend {result['backend']}, {result['cpus']} CPUs")
    print(f"single load:       load {single['load_s']:.3f} s, first call {single['first_call_s']:.3f} s")
    for name in ("concurrent_load_s", "concurrent_first_call_s"):
        s = result[name]
        print(
            f"{name:24s} min {s['min']:.3f}  median {s['median']:.3f}  max {s['max']:.3f} s"
            f"  (max / single: {s['max'] / max(single[name.split('_', 1)[1]], 1e-9):.1f}x)"
        )
    print("every replica hit the package (fail_on_recompile)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        print(json.dumps(_worker(json.loads(sys.argv[2]))))
    else:
        main()
