# Owner(s): ["module: dynamo"]
"""aot_compile, save_compiled_function, torch.compiler.load_compiled_function.

The seed's test plan runs unchanged in fresh interpreters (twice: the second on
the warm caches the first left); saved functions load in a fresh interpreter with
an empty inductor cache under fail_on_recompile without tracing or compiling.
"""

import json
import os
import pickle
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._dynamo.exc import PackageError
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


SEED_TEST_PLAN = """
import torch

class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(2, 4)
        self.relu = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(4, 8)
    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))

device = "{device}"
m = M().to(device)
sample_inputs = (torch.randn(2, 2, device=device),)
eager_out = m(*sample_inputs)

with torch._dynamo.config.patch("enable_aot_compile", True):
    compiled_fn_path = "./m.pt"
    compiled_fn = torch.compile(
        m,
        fullgraph=True
    ).forward.aot_compile((sample_inputs, {{}}))
    compiled_fn.save_compiled_function(compiled_fn_path)

torch._dynamo.reset()

with torch.compiler.set_stance("fail_on_recompile"):
    with open(compiled_fn_path, "rb") as f:
        loaded_fn = torch.compiler.load_compiled_function(f)

assert loaded_fn is not None

compiled_out = loaded_fn(m, *sample_inputs)
assert torch.allclose(eager_out, compiled_out)
"""


MODEL_MODULE = """
import torch

class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(8, 16)
        self.relu = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(16, 4)
    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))

def add_mul(x, y, scale=2.0):
    return (x + y) * scale

def make():
    torch.manual_seed(0)
    return MLP(), torch.randn(3, 8)
"""


SAVE = """
import sys, torch
sys.path.insert(0, {dir!r})
import aot_models
m, x = aot_models.make()
with torch._dynamo.config.patch("enable_aot_compile", True):
    fn = torch.compile(m, fullgraph=True).forward.aot_compile(((x,), {{}}))
    fn.save_compiled_function({path!r})
    g = torch.compile(aot_models.add_mul, fullgraph=True).aot_compile(((x, x), {{}}))
    g.save_compiled_function({path!r} + ".fn")
"""


LOAD = """
import json, os, sys, torch
sys.path.insert(0, {dir!r})
import aot_models
from torch._dynamo.utils import counters
m, x = aot_models.make()
with torch.compiler.set_stance("fail_on_recompile"):
    fn = torch.compiler.load_compiled_function(open({path!r}, "rb"))
    g = torch.compiler.load_compiled_function({path!r} + ".fn")
    out = fn(m, x)
    out_g = g(x, x)
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
import tempfile
print("REPORT" + json.dumps({{
    "kernel_copies": len([d for d in os.listdir(tempfile.gettempdir()) if d.startswith("torch_package_kernels_")]),
    "same": bool(torch.allclose(out, m(x))),
    "same_fn": bool(torch.allclose(out_g, aot_models.add_mul(x, x))),
    "traced_graphs": counters["stats"]["unique_graphs"],
    "compiled_binaries": [f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".so")],
}}))
"""


class TestAOTCompile(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="aot-compile-test-"))

    def run_script(self, code, cwd=None, cache=None, tmpdir=None):
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache or str(self.tmp / "cache")}
        if tmpdir is not None:
            env["TMPDIR"] = tmpdir
        proc = subprocess.run(
            [sys.executable, "-c", code],
            cwd=cwd or self.tmp,
            env=env,
            capture_output=True,
            text=True,
        )
        self.assertEqual(proc.returncode, 0, f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
        return proc.stdout

    @parametrize("device", ["cpu", "cuda"])
    def test_seed_test_plan_runs_twice_in_fresh_processes(self, device):
        if device == "cuda" and not torch.cuda.is_available():
            raise unittest.SkipTest("needs a CUDA device")
        script = SEED_TEST_PLAN.format(device=device)
        self.run_script(script)  # cold caches
        self.run_script(script)  # warm caches left by the first run

    def test_load_in_fresh_process_with_empty_cache_compiles_nothing(self):
        (self.tmp / "aot_models.py").write_text(MODEL_MODULE)
        path = str(self.tmp / "mlp.pt")
        self.run_script(SAVE.format(dir=str(self.tmp), path=path))
        tmpdir = self.tmp / "process-tmp"
        tmpdir.mkdir()
        out = self.run_script(
            LOAD.format(dir=str(self.tmp), path=path),
            cache=str(self.tmp / "empty"),
            tmpdir=str(tmpdir),
        )
        report = json.loads(out.split("REPORT", 1)[1])
        self.assertEqual(
            report,
            # one copy of each archive's kernel binaries while loaded...
            {"kernel_copies": 2, "same": True, "same_fn": True, "traced_graphs": 0, "compiled_binaries": []},
        )
        # ... and none left once the process is gone
        self.assertEqual([p.name for p in tmpdir.iterdir() if p.name.startswith("torch_package_kernels_")], [])

    def test_guard_failure_names_the_guard_and_can_be_disabled(self):
        def fn(x, y):
            return x * 2 + y

        with torch._dynamo.config.patch("enable_aot_compile", True):
            compiled = torch.compile(fn, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(3), torch.ones(3)), {})
            )
        self.assertEqual(compiled(torch.ones(3), torch.ones(3)), torch.full((3,), 3.0))
        with self.assertRaisesRegex(RuntimeError, r"guards reject: tensor 'x' dtype mismatch"):
            compiled(torch.ones(3, dtype=torch.float64), torch.ones(3))
        compiled.disable_guard_check()
        out = compiled(torch.ones(3, dtype=torch.float64), torch.ones(3))
        self.assertEqual(out.dtype, torch.float64)

    def test_aot_compile_is_opt_in(self):
        compiled = torch.compile(lambda x: x + 1, fullgraph=True, backend="eager")
        with self.assertRaisesRegex(RuntimeError, "enable_aot_compile"):
            compiled.aot_compile(((torch.ones(2),), {}))

    def test_damaged_file_is_a_package_error(self):
        path = self.tmp / "broken.pt"
        path.write_bytes(b"PK\x03\x04 truncated")
        with self.assertRaises(PackageError):
            torch.compiler.load_compiled_function(str(path))


class TestAOTAutogradCacheEntryBytes(torch._dynamo.test_case.TestCase):
    def test_entry_loaded_from_cache_serializes_to_its_bytes(self):
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

        with tempfile.TemporaryDirectory() as cache, unittest.mock.patch.dict(
            os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}
        ):
            torch._inductor.codecache.FxGraphCache.clear()

            def fn(x):
                return torch.sin(x) * 3

            with torch.no_grad():
                torch.compile(fn)(torch.randn(4))
            root = Path(AOTAutogradCache._get_tmp_dir())
            keys = [p.name for p in root.iterdir()]
            self.assertEqual(len(keys), 1)
            on_disk = (root / keys[0] / "entry").read_bytes()
            entry = AOTAutogradCache._lookup(keys[0], local=True, remote=False)
            self.assertEqual(entry.serialize(), on_disk)
            # Whatever hydrating the loaded object does to it (2.13's entries load
            # kernels into themselves), saving it again gives the loaded bytes.
            entry.compiled_fw = lambda *args: None
            self.assertEqual(entry.serialize(), on_disk)
            # The bytes are not part of the entry's own pickle.
            self.assertNotIn(b"_serialized", pickle.dumps(pickle.loads(on_disk)))
            fresh = pickle.loads(on_disk)
            self.assertEqual(pickle.loads(fresh.serialize()).compiled_fw, fresh.compiled_fw)


instantiate_parametrized_tests(TestAOTCompile)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
