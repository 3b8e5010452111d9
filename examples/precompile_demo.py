"""Precompile demo: compile once with a package, load it in a fresh process.

`make demo` runs this. The "save" step compiles the seed's MLP (benchmarks/models.py)
with an empty inductor cache and saves a compile package; the "load" step runs in a
NEW interpreter with another empty inductor cache, loads the package under
set_stance("fail_on_recompile"), and reports the load time, whether the outputs
match eager, and that nothing was traced or compiled.
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent

STEP = r"""
import json, os, sys, time
started = float(sys.argv[3])
sys.path.insert(0, {bench!r})
import torch
import models
from torch._dynamo.utils import counters
model, inputs = models.make_mlp()
compiled = torch.compile(model, package=sys.argv[2])
with torch.no_grad():
    if sys.argv[1] == "save":
        out = compiled(*inputs)
        first_output = time.time() - started
        compiled.save_package()
    else:
        compiled.load_package()
        torch.compiler.set_stance("fail_on_recompile")
        out = compiled(*inputs)
        first_output = time.time() - started
    same = bool(torch.allclose(out, model(*inputs)))
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
print("RESULT" + json.dumps({{
    "seconds_to_first_output": first_output,
    "same_as_eager": same,
    "graphs_traced": counters["stats"]["unique_graphs"],
    "kernels_compiled": sum(f.endswith(".so") for _, _, fs in os.walk(cache) for f in fs),
}}))
"""


def step(mode: str, package: str, workdir: str) -> dict:
    env = dict(os.environ, TORCH_OVERLAY="1")
    env["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix=f"{mode}-cache-", dir=workdir)
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-c", STEP.format(bench=str(ROOT / "benchmarks")), mode, package, str(started)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"demo {mode} step failed")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("RESULT"))
    return json.loads(line[len("RESULT") :])


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="precompile-demo-") as workdir:
        package = os.path.join(workdir, "mlp-package")
        print("1. compile the seed MLP in a fresh process (empty inductor cache) and save a package")
        saved = step("save", package, workdir)
        print(f"   cold compile: {saved['seconds_to_first_output']:.1f} s from process start to first output")
        print(f"   package: {package} ({len(os.listdir(package))} top-level files)")
        print("2. load it in ANOTHER fresh process (another empty inductor cache), fail_on_recompile")
        loaded = step("load", package, workdir)
        print(f"   load: {loaded['seconds_to_first_output']:.1f} s from process start to first output")
        print(f"   outputs match eager: {loaded['same_as_eager']}")
        print(f"   graphs traced by Dynamo: {loaded['graphs_traced']}, C++ kernels compiled: {loaded['kernels_compiled']}")
        ok = loaded["same_as_eager"] and loaded["graphs_traced"] == 0 and loaded["kernels_compiled"] == 0
        print("OK: nothing recompiled" if ok else "FAILED")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
