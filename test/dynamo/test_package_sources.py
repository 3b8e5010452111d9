# Owner(s): ["module: dynamo"]
"""Compile packages against the code and config that load them.

A model file is saved with a package by one interpreter, edited, and loaded by
a fresh one (empty TORCHINDUCTOR_CACHE_DIR): an entry derived from code or
config the loading process no longer has is never run; it is dropped with a
warning naming what changed, and its frame compiles from the live code (NOTE:
[What an entry was derived from] in torch/_dynamo/package_sources.py). Also:
a save that fails on one graph writes the rest (NOTE: [A save never loses what
it could save]), and a call the loaded entries reject says which entry and
guard (NOTE: [Explaining a loaded miss]).
"""

import shutil
import tempfile
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
)
from torch.testing._internal.fresh_process import run_code


MODEL = '''\
import torch

SCALE = 2.0


def helper(x):
    return x * 3.0


def tail(x):
    return x * 7.0


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x):
        def shift(v):
            return v + 1.0

        y = shift(helper(self.linear(x))) * SCALE
        if BREAK:
            torch._dynamo.graph_break()
            y = tail(y)
        return y + 0.5


BREAK = False
'''

# One line of MODEL and what a test edits it to; no edit moves a line.
EDITS = {
    "forward": ("        return y + 0.5", "        return y + 2.5"),
    "helper": ("    return x * 3.0", "    return x * 4.0"),
    "closure": ("            return v + 1.0", "            return v - 1.0"),
    "global": ("SCALE = 2.0", "SCALE = 5.0"),
    "tail": ("    return x * 7.0", "    return x * 9.0"),
}

CHILD = r'''
import json, logging, os, sys, warnings
import torch
from torch.testing._internal.fresh_process import write_report

mode, where = sys.argv[1:3]
options = json.loads(sys.argv[3])
sys.path.insert(0, where)
import drift_model

torch.manual_seed(0)
model = drift_model.Net()
package = os.path.join(where, "pkg")
compiled = torch.compile(model, package=package, backend=options.get("backend", "eager"))
x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
for name, value in options.get("config", {}).items():
    module, _, attr = name.rpartition(".")
    setattr(sys.modules[module], attr, value)
report = {}


def messages(caught):
    return [str(w.message).replace(where, "<dir>") for w in caught if "package" in str(w.message)]


if mode == "save":
    if options.get("inject_failure"):
        # The second graph's serialization raises (the first entry's graph saves).
        # The package directory format serializes the graphs (package_store).
        import torch._dynamo.package_store as package_store

        serialize = package_store.serialize_graph
        calls = []

        def failing_serialize(record):
            calls.append(record)
            if len(calls) == 2:
                raise RuntimeError("injected failure")
            return serialize(record)

        package_store.serialize_graph = failing_serialize
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(x)
        try:
            compiled.save_package()
        except Exception as e:
            report["error"] = f"{type(e).__name__}: {e}".replace(where, "<dir>")
    report["warnings"] = messages(caught)
    if os.path.exists(os.path.join(package, "manifest.json")):
        report["entries"] = json.load(open(os.path.join(package, "manifest.json")))["entries"]
    write_report(report)
    sys.exit(0)

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try:
        compiled.load_package()
    except Exception as e:
        report["error"] = f"{type(e).__name__}: {e}".replace(where, "<dir>")
report["warnings"] = messages(caught)
if "error" not in report:
    if options.get("call_shape"):
        x = torch.randn(*options["call_shape"])
        from torch._dynamo.package import explain_entries

        report["explain"] = explain_entries(compiled, x).replace(where, "<dir>")
        logged = []
        handler = logging.Handler()
        handler.emit = lambda record: logged.append(record.getMessage().replace(where, "<dir>"))
        logging.getLogger("torch._dynamo.package.__recompiles").addHandler(handler)
        torch._logging.set_logs(recompiles=True)
        with torch.compiler.set_stance("fail_on_recompile"):
            try:
                compiled(x)
            except RuntimeError as e:
                report["fail_on_recompile"] = str(e).replace(where, "<dir>")
        report["logged"] = logged
    torch._dynamo.utils.counters.clear()
    out = compiled(x)
    report["graphs_compiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    report["max_abs_diff"] = (out - model(x)).abs().max().item()
write_report(report)
'''

AOT_FUNCTION = '''\
import torch


def fn(x):
    return torch.sin(x) + 1.0
'''

AOT_CHILD = r'''
import os, sys
import torch
from torch.testing._internal.fresh_process import write_report

mode, where = sys.argv[1:3]
sys.path.insert(0, where)
import drift_fn

path = os.path.join(where, "fn.pt2")
x = torch.randn(4)
torch._dynamo.config.enable_aot_compile = True
if mode == "save":
    compiled = torch.compile(drift_fn.fn, fullgraph=True, backend="eager").aot_compile(((x,), {}))
    compiled.save_compiled_function(path)
    write_report({})
    sys.exit(0)
try:
    with open(path, "rb") as f:
        loaded = torch.compiler.load_compiled_function(f)
    write_report({"same": bool(torch.equal(loaded(x), drift_fn.fn(x)))})
except Exception as e:
    write_report({"error": f"{type(e).__name__}: {e}".replace(where, "<dir>")})
'''


class TestPackageSources(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="package-sources-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def write_model(self, graph_break=False):
        source = MODEL.replace("BREAK = False", f"BREAK = {graph_break}")
        (self.tmp / "drift_model.py").write_text(source)

    def edit_model(self, edit):
        path = self.tmp / "drift_model.py"
        old, new = EDITS[edit]
        source = path.read_text()
        self.assertEqual(source.count(old), 1)
        path.write_text(source.replace(old, new))

    def run_child(self, mode, child=CHILD, **options):
        import json

        return run_code(child, mode, str(self.tmp), json.dumps(options), cwd=self.tmp, fresh_inductor_cache=True)

    def save(self, **options):
        report = self.run_child("save", **options)
        self.assertNotIn("error", report)
        self.assertEqual(report["warnings"], [])
        self.assertGreaterEqual(report["entries"], 1)
        return report

    def test_unchanged_model_loads_without_compiling(self):
        self.write_model()
        self.save()
        report = self.run_child("load")
        self.assertEqual(report["warnings"], [])
        self.assertEqual(report["graphs_compiled"], 0)
        self.assertEqual(report["max_abs_diff"], 0.0)

    @parametrize("edit", ["forward", "helper", "closure"])
    def test_edited_code_drops_its_entry(self, edit):
        self.write_model()
        self.save()
        self.edit_model(edit)
        report = self.run_child("load")
        # The live code runs: compiled anew, never the saved graph.
        self.assertEqual(report["max_abs_diff"], 0.0)
        self.assertEqual(report["graphs_compiled"], 1)
        (warning,) = report["warnings"]
        changed = {
            "forward": "drift_model.Net.forward (<dir>/drift_model.py:19-27): its code changed",
            "helper": "drift_model.helper (<dir>/drift_model.py:6-7): its source changed",
            # The closure is a constant of forward's code, and Dynamo inlined it.
            "closure": "drift_model.Net.forward (<dir>/drift_model.py:19-27): its code changed; "
            "drift_model.Net.forward.<locals>.shift (<dir>/drift_model.py:20-21): its source changed",
        }[edit]
        self.assertEqual(
            warning,
            "package <dir>/pkg: 1 of its 1 entries were compiled from code or config that differs "
            f"in this process, and are not loaded: {changed}. The frames they ran will compile.",
        )

    def test_edited_global_is_caught_by_its_guard(self):
        self.write_model()
        self.save()
        self.edit_model("global")
        report = self.run_child("load")
        # Not stale: the entry's guard on SCALE rejects the call, which compiles.
        self.assertEqual(report["warnings"], [])
        self.assertEqual(report["graphs_compiled"], 1)
        self.assertEqual(report["max_abs_diff"], 0.0)

    def test_changed_config_drops_the_entry(self):
        self.write_model()
        self.save()
        report = self.run_child("load", config={"torch._dynamo.config.capture_scalar_outputs": True})
        self.assertEqual(report["graphs_compiled"], 1)
        self.assertExpectedInline(
            report["warnings"][0],
            """package <dir>/pkg: 1 of its 1 entries were compiled from code or config that differs in this process, and are not loaded: config torch._dynamo.config.capture_scalar_outputs: saved with its default, now True. The frames they ran will compile.""",
        )

    @slowTest
    def test_changed_inductor_config_drops_the_entry(self):
        self.write_model()
        self.save(backend="inductor")
        report = self.run_child("load", backend="inductor")
        self.assertEqual((report["warnings"], report["graphs_compiled"]), ([], 0))
        report = self.run_child("load", backend="inductor", config={"torch._inductor.config.fallback_random": True})
        self.assertEqual(report["graphs_compiled"], 1)
        self.assertEqual(report["max_abs_diff"], 0.0)
        self.assertIn(
            "config torch._inductor.config.fallback_random: saved with its default, now True", report["warnings"][0]
        )

    def test_changed_function_costs_only_its_own_entries(self):
        self.write_model(graph_break=True)
        self.assertEqual(self.save()["entries"], 2)
        self.edit_model("tail")
        report = self.run_child("load")
        # forward's entry loads; the resume function's, which inlined tail, compiles.
        self.assertEqual(report["graphs_compiled"], 1)
        self.assertEqual(report["max_abs_diff"], 0.0)
        (warning,) = report["warnings"]
        self.assertIn("1 of its 2 entries", warning)
        self.assertIn("drift_model.tail (<dir>/drift_model.py:10-11): its source changed", warning)

    def test_strict_refuses_the_package(self):
        self.write_model()
        self.save()
        self.edit_model("helper")
        report = self.run_child("load", config={"torch._dynamo.config.package_strict": True})
        self.assertEqual(
            report["error"],
            "PackageError: package <dir>/pkg: 1 of its 1 entries were compiled from code or config "
            "that differs in this process, and are not loaded: drift_model.helper "
            "(<dir>/drift_model.py:6-7): its source changed",
        )

    def test_aot_compiled_function_from_edited_code_is_refused(self):
        (self.tmp / "drift_fn.py").write_text(AOT_FUNCTION)
        self.run_child("save", child=AOT_CHILD)
        self.assertEqual(self.run_child("load", child=AOT_CHILD), {"same": True})
        (self.tmp / "drift_fn.py").write_text(AOT_FUNCTION.replace("+ 1.0", "+ 2.0"))
        report = self.run_child("load", child=AOT_CHILD)
        self.assertIn("PackageError: ", report["error"])
        self.assertIn("drift_fn.fn (<dir>/drift_fn.py:4-5): its code changed", report["error"])

    def test_failing_graph_leaves_only_its_entry_out(self):
        self.write_model(graph_break=True)
        saved = self.run_child("save", inject_failure=True)
        self.assertEqual(saved["entries"], 1)
        (warning,) = saved["warnings"]
        self.assertIn("is not saved: its graph cannot be packaged: serializing graph", warning)
        self.assertIn("raised RuntimeError: injected failure", warning)
        report = self.run_child("load")
        self.assertEqual(report["warnings"], [])
        # The entry whose graph saved loads; the other frame compiles.
        self.assertEqual(report["graphs_compiled"], 1)
        self.assertEqual(report["max_abs_diff"], 0.0)

    def test_failing_graph_is_an_error_under_strict(self):
        self.write_model(graph_break=True)
        saved = self.run_child(
            "save", inject_failure=True, config={"torch._dynamo.config.package_strict": True}
        )
        self.assertIn("PackageError: ", saved["error"])
        self.assertIn("raised RuntimeError: injected failure", saved["error"])

    def test_loaded_miss_names_entry_and_guard(self):
        self.write_model()
        self.save()
        report = self.run_child("load", call_shape=[5, 8])
        rejection = (
            "package <dir>/pkg, entry 0 (Net.forward (module drift_model)): "
            "tensor 'x' size mismatch at index 0. expected 4, actual 5"
        )
        self.assertEqual(
            report["explain"],
            "package <dir>/pkg, entry 0 (Net.forward (module drift_model)): rejects the call: "
            "tensor 'x' size mismatch at index 0. expected 4, actual 5",
        )
        self.assertExpectedInline(
            report["fail_on_recompile"].split("line number: ")[1],
            """\
19. forward in <dir>/drift_model.py:19: its entries loaded from packages reject the call:
- package <dir>/pkg, entry 0 (Net.forward (module drift_model)): tensor 'x' size mismatch at index 0. expected 4, actual 5""",
        )
        self.assertTrue(any(rejection in line for line in report["logged"]), report["logged"])


instantiate_parametrized_tests(TestPackageSources)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
