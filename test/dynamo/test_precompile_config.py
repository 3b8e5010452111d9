# Owner(s): ["module: dynamo"]
"""Upstream's precompile config flags: strict_precompile and caching_precompile.

strict_precompile turns an entry a compile package would leave out (with a
warning) into an error; caching_precompile gives every torch.compile() a compile
package kept in the inductor cache dir, written by
torch.compiler.save_cache_artifacts() and loaded when the same function is
compiled in a fresh process.
"""

import json
import shutil
import tempfile
import warnings
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._dynamo.exc import InternalTorchDynamoError
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


CACHED_MODELS = """
import torch

def scaled_sin(x):
    return torch.sin(x) * 3 + x

class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x).relu() + 1

def subject(kind):
    torch.manual_seed(0)
    return scaled_sin if kind == "function" else Block()
"""


CACHING_RUN = """
import json, os, sys, torch
sys.path.insert(0, {dir!r})
import cached_models
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
torch._dynamo.config.caching_precompile = {caching!r}
subject = cached_models.subject({kind!r})
compiled = torch.compile(subject, backend="eager")
x = torch.randn(2, 4)
with torch.compiler.set_stance({stance!r}):
    out = compiled(x)
if not {hold!r}:
    # the compiled callable is gone before the save, as after torch.compile(f)(x)
    import gc
    del compiled
    gc.collect()
if {save!r}:
    torch.compiler.save_cache_artifacts()
dynamo_dir = os.path.join(os.environ["TORCHINDUCTOR_CACHE_DIR"], "dynamo")
write_report({{
    "same": bool(torch.allclose(out, subject(x))),
    "traced_graphs": counters["stats"]["unique_graphs"],
    "dynamo_cache": dict(counters["dynamo_cache"]),
    "saved_packages": len(os.listdir(dynamo_dir)) if os.path.isdir(dynamo_dir) else 0,
}})
"""


def make_local_scale():
    class Scale:
        def __init__(self):
            self.factor = 3

    return Scale()


def scale_by(x, scale):
    return x * scale.factor


class TestStrictPrecompile(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="precompile-config-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_unsaveable_guard_leaves_the_entry_out_with_a_warning(self):
        compiled = torch.compile(scale_by, backend="eager", package=str(self.tmp / "pkg"))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = compiled(torch.ones(2), make_local_scale())
        self.assertEqual(out, torch.full((2,), 3.0))
        messages = [str(w.message) for w in caught]
        self.assertTrue(
            any("TYPE_MATCH guard cannot be serialized." in m for m in messages), messages
        )
        compiled.save_package()
        manifest = json.loads((self.tmp / "pkg" / "manifest.json").read_text())
        self.assertEqual(manifest["entries"], 0)

    def test_unsaveable_guard_raises_under_strict_precompile(self):
        compiled = torch.compile(scale_by, backend="eager", package=str(self.tmp / "pkg"))
        # Dynamo wraps what the compile raised, naming its type, as upstream does.
        with torch._dynamo.config.patch("strict_precompile", True):
            with self.assertRaisesRegex(
                InternalTorchDynamoError,
                r"^PackageError: .*TYPE_MATCH guard cannot be serialized\.",
            ):
                compiled(torch.ones(2), make_local_scale())


class TestCachingPrecompile(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="caching-precompile-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        (self.tmp / "cached_models.py").write_text(CACHED_MODELS)

    def run_process(self, kind, *, caching=True, stance="default", save=False, hold=True):
        script = CACHING_RUN.format(
            dir=str(self.tmp), kind=kind, caching=caching, stance=stance, save=save, hold=hold
        )
        return run_code(
            script, cwd=self.tmp, env={"TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "cache")}
        )

    @parametrize("kind", ["function", "module"])
    def test_fresh_process_loads_what_save_cache_artifacts_wrote(self, kind):
        self.assertEqual(
            self.run_process(kind, save=True),
            {
                "same": True,
                "traced_graphs": 1,
                "dynamo_cache": {"dynamo_cache_miss": 1},
                "saved_packages": 1,
            },
        )
        self.assertEqual(
            self.run_process(kind, stance="fail_on_recompile"),
            {
                "same": True,
                "traced_graphs": 0,
                "dynamo_cache": {"dynamo_cache_hit": 1},
                "saved_packages": 1,
            },
        )

    def test_entries_of_a_dropped_compiled_callable_are_saved(self):
        # save_cache_artifacts writes every compile's entries, also those of a
        # torch.compile()'d callable the program no longer holds.
        self.assertEqual(
            self.run_process("function", save=True, hold=False),
            {
                "same": True,
                "traced_graphs": 1,
                "dynamo_cache": {"dynamo_cache_miss": 1},
                "saved_packages": 1,
            },
        )
        self.assertEqual(
            self.run_process("function", stance="fail_on_recompile")["dynamo_cache"],
            {"dynamo_cache_hit": 1},
        )

    def test_off_by_default(self):
        self.assertEqual(
            self.run_process("function", caching=False, save=True),
            {"same": True, "traced_graphs": 1, "dynamo_cache": {}, "saved_packages": 0},
        )

    def test_damaged_cache_entry_is_ignored_and_the_function_compiles(self):
        self.run_process("function", save=True)
        (entry,) = (self.tmp / "cache" / "dynamo").iterdir()
        (entry / "dynamo.bin").write_bytes(b"damaged")
        self.assertEqual(
            self.run_process("function"),
            {
                "same": True,
                "traced_graphs": 1,
                "dynamo_cache": {"dynamo_cache_error": 1},
                "saved_packages": 1,
            },
        )


instantiate_parametrized_tests(TestCachingPrecompile)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
