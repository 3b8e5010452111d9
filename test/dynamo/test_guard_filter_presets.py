# Owner(s): ["module: dynamo"]
"""torch.compiler's guard filter presets and set_enable_guard_collectives.

Each preset is checked on small programs (an nn.Module's attributes, an inbuilt
nn.Linear, globals, tensors and parameters, the global grad mode) for whether a
change after compiling recompiles; the expected decisions are upstream 2.13's on
the same programs. Then the presets with torch._dynamo.optimize, with a compile
package saved in one process and loaded in a fresh one under
set_stance("fail_on_recompile"), and with aot_compile.
"""

import functools
import json

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)

from test_package import PackageTestCase


PRESETS = [
    "skip_guard_on_all_nn_modules_unsafe",
    "skip_guard_on_inbuilt_nn_modules_unsafe",
    "skip_guard_on_globals_unsafe",
    "keep_tensor_guards_unsafe",
    "keep_portable_guards_unsafe",
    "skip_all_guards_unsafe",
]

SCALE = 3


def scale_by_global(x):
    return x * SCALE


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = 2
        self.w = torch.nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.lin(x) * self.scale + self.w


def add(x, y):
    return x + y


# Whether the change recompiles under each preset; the same on torch 2.13.
EXPECTED_RECOMPILES = {
    "module_attribute": {
        "skip_guard_on_all_nn_modules_unsafe": False,
        "skip_guard_on_inbuilt_nn_modules_unsafe": True,
        "skip_guard_on_globals_unsafe": True,
        "keep_tensor_guards_unsafe": False,
        "keep_portable_guards_unsafe": False,
        "skip_all_guards_unsafe": False,
    },
    "global_constant": {
        "skip_guard_on_all_nn_modules_unsafe": True,
        "skip_guard_on_inbuilt_nn_modules_unsafe": True,
        "skip_guard_on_globals_unsafe": False,
        "keep_tensor_guards_unsafe": False,
        "keep_portable_guards_unsafe": False,
        "skip_all_guards_unsafe": False,
    },
    "input_shape": {
        "skip_guard_on_all_nn_modules_unsafe": True,
        "skip_guard_on_inbuilt_nn_modules_unsafe": True,
        "skip_guard_on_globals_unsafe": True,
        "keep_tensor_guards_unsafe": True,
        "keep_portable_guards_unsafe": True,
        "skip_all_guards_unsafe": False,
    },
    "grad_mode": {
        "skip_guard_on_all_nn_modules_unsafe": True,
        "skip_guard_on_inbuilt_nn_modules_unsafe": True,
        "skip_guard_on_globals_unsafe": True,
        "keep_tensor_guards_unsafe": False,
        "keep_portable_guards_unsafe": True,
        "skip_all_guards_unsafe": False,
    },
}


class GuardFilterPresetTests(torch._dynamo.test_case.TestCase):
    def compile(self, fn, guard_filter_fn):
        cnt = torch._dynamo.testing.CompileCounter()
        opt = torch.compile(fn, backend=cnt, options={"guard_filter_fn": guard_filter_fn})
        return opt, cnt

    def entries_of(self, fn, args, preset):
        """(guard_type, name, parameter?, kept) for each guard the preset saw."""
        seen = []

        def record(entries):
            keep = preset(entries)
            seen.extend(
                (e.guard_type, e.name, isinstance(e.value, torch.nn.Parameter), k)
                for e, k in zip(entries, keep)
            )
            return keep

        opt, _ = self.compile(fn, record)
        opt(*args)
        return seen

    @parametrize("preset", PRESETS)
    def test_module_attribute(self, preset):
        mod = Scaled()
        opt, cnt = self.compile(mod, getattr(torch.compiler, preset))
        x = torch.randn(2, 4)
        opt(x)
        mod.scale = 5
        opt(x)
        self.assertEqual(
            cnt.frame_count > 1, EXPECTED_RECOMPILES["module_attribute"][preset]
        )

    @parametrize("preset", PRESETS)
    def test_global_constant(self, preset):
        global SCALE
        opt, cnt = self.compile(scale_by_global, getattr(torch.compiler, preset))
        x = torch.randn(4)
        try:
            opt(x)
            SCALE = 7
            opt(x)
        finally:
            SCALE = 3
        self.assertEqual(
            cnt.frame_count > 1, EXPECTED_RECOMPILES["global_constant"][preset]
        )

    @parametrize("preset", PRESETS)
    def test_input_shape(self, preset):
        opt, cnt = self.compile(add, getattr(torch.compiler, preset))
        opt(torch.randn(4), torch.randn(4))
        opt(torch.randn(5), torch.randn(5))
        self.assertEqual(cnt.frame_count > 1, EXPECTED_RECOMPILES["input_shape"][preset])

    @parametrize("preset", PRESETS)
    def test_grad_mode(self, preset):
        # The GLOBAL_STATE guard, which keep_portable_guards_unsafe keeps.
        opt, cnt = self.compile(add, getattr(torch.compiler, preset))
        x, y = torch.randn(4), torch.randn(4)
        opt(x, y)
        with torch.no_grad():
            opt(x, y)
        self.assertEqual(cnt.frame_count > 1, EXPECTED_RECOMPILES["grad_mode"][preset])

    def test_inbuilt_linear(self):
        lin = torch.nn.Linear(4, 4)
        x = torch.randn(2, 4)
        kept = {
            preset: {
                name
                for _, name, _, k in self.entries_of(lin, (x,), getattr(torch.compiler, preset))
                if k
            }
            for preset in PRESETS
        }
        params = {"fn._parameters['weight']", "fn._parameters['bias']"}
        # Both nn-module presets drop the guards on the Linear's parameters.
        self.assertFalse(params & kept["skip_guard_on_all_nn_modules_unsafe"])
        self.assertFalse(params & kept["skip_guard_on_inbuilt_nn_modules_unsafe"])
        self.assertLessEqual(params, kept["skip_guard_on_globals_unsafe"])
        self.assertLessEqual(params, kept["keep_portable_guards_unsafe"])
        self.assertEqual(kept["keep_tensor_guards_unsafe"], {"args[0]"})
        self.assertEqual(kept["skip_all_guards_unsafe"], set())

    def test_user_module_vs_inbuilt_submodule(self):
        mod = Scaled()
        x = torch.randn(2, 4)
        all_nn = self.entries_of(mod, (x,), torch.compiler.skip_guard_on_all_nn_modules_unsafe)
        inbuilt = self.entries_of(mod, (x,), torch.compiler.skip_guard_on_inbuilt_nn_modules_unsafe)
        dropped_all = {name for _, name, _, k in all_nn if not k}
        dropped_inbuilt = {name for _, name, _, k in inbuilt if not k}
        # The user module's own attributes are dropped only by the all-modules preset.
        self.assertIn("self.scale", dropped_all)
        self.assertNotIn("self.scale", dropped_inbuilt)
        self.assertIn("self._parameters['w']", dropped_all)
        self.assertNotIn("self._parameters['w']", dropped_inbuilt)
        # The inbuilt submodule's parameters are dropped by both.
        lin_weight = "self._modules['lin']._parameters['weight']"
        self.assertIn(lin_weight, dropped_all)
        self.assertIn(lin_weight, dropped_inbuilt)

    @parametrize("keep_parameters", [False, True])
    def test_keep_tensor_guards_parameters(self, keep_parameters):
        mod = Scaled()
        preset = functools.partial(
            torch.compiler.keep_tensor_guards_unsafe, keep_parameters=keep_parameters
        )
        seen = self.entries_of(mod, (torch.randn(2, 4),), preset)
        kept = {(t, name, is_param) for t, name, is_param, k in seen if k}
        self.assertTrue(all(t == "TENSOR_MATCH" for t, _, _ in kept))
        self.assertIn(("TENSOR_MATCH", "x", False), kept)
        self.assertEqual(
            any(is_param for _, _, is_param in kept),
            keep_parameters,
        )

    def test_keep_portable_guards(self):
        seen = self.entries_of(
            scale_by_global, (torch.randn(4),), torch.compiler.keep_portable_guards_unsafe
        )
        kept = sorted((t, name) for t, name, _, k in seen if k)
        self.assertEqual(
            kept, [("GLOBAL_STATE", ""), ("SHAPE_ENV", ""), ("TENSOR_MATCH", "x")]
        )

    def test_skip_guard_on_globals_keeps_locals(self):
        seen = self.entries_of(
            scale_by_global, (torch.randn(4),), torch.compiler.skip_guard_on_globals_unsafe
        )
        self.assertEqual({name for _, name, _, k in seen if not k}, {"G['SCALE']"})

    @parametrize("preset", PRESETS)
    def test_dynamo_optimize(self, preset):
        global SCALE
        cnt = torch._dynamo.testing.CompileCounter()
        opt = torch._dynamo.optimize(cnt, guard_filter_fn=getattr(torch.compiler, preset))(
            scale_by_global
        )
        x = torch.randn(4)
        try:
            opt(x)
            SCALE = 7
            opt(x)
        finally:
            SCALE = 3
        self.assertEqual(
            cnt.frame_count > 1, EXPECTED_RECOMPILES["global_constant"][preset]
        )

    def test_presets_are_public(self):
        for name in [*PRESETS, "set_enable_guard_collectives"]:
            self.assertIn(name, torch.compiler.__all__)

    def test_guard_collectives_off(self):
        self.assertFalse(torch.compiler.set_enable_guard_collectives(False))

    def test_guard_collectives_on_is_refused(self):
        # NOTE: [Guard collectives on torch 2.7.1]
        with self.assertRaisesRegex(NotImplementedError, "set_guard_complete_hook"):
            torch.compiler.set_enable_guard_collectives(True)
        self.assertFalse(torch.compiler.set_enable_guard_collectives(False))


CASE = """
import torch
SCALE = float(__import__("os").environ.get("CASE_SCALE", "3"))
def f(x):
    return x * SCALE
def make():
    options = {{"guard_filter_fn": {preset}}} if {preset!r} != "None" else {{}}
    return f, [(torch.ones(4),)], dict(backend="eager", options=options)
"""


class GuardFilterPresetPackageTests(PackageTestCase):
    def save_and_load(self, preset, load_scale):
        case = self.tmp / "case.py"
        case.write_text(CASE.format(preset=preset))
        package = self.tmp / "pkg"
        self.run_process("save", case, package)
        report = self.run_process("load", case, package, CASE_SCALE=load_scale)
        return report, json.loads((package / "manifest.json").read_text())

    def test_loaded_entry_checks_only_kept_guards(self):
        # Saved with SCALE == 3, loaded where SCALE == 5: the preset dropped the
        # guard on the global, so the saved entry runs (with the value it was
        # compiled for, as upstream) and nothing recompiles.
        report, _ = self.save_and_load("torch.compiler.skip_guard_on_globals_unsafe", "5")
        self.assertEqual(report["results"], [{"same": False, "grads": 0}])
        self.assertEqual(report["traced_graphs"], 0)

    def test_without_preset_the_global_is_checked(self):
        report, _ = self.save_and_load("None", "5")
        self.assertIn("error", report["results"][0])
        self.assertIn("fail_on_recompile", report["results"][0]["error"])

    def test_same_environment_loads(self):
        report, _ = self.save_and_load("torch.compiler.keep_portable_guards_unsafe", "3")
        self.assertEqual(report["results"], [{"same": True, "grads": 0}])
        self.assertEqual(report["traced_graphs"], 0)

    def test_manifest_names_the_preset(self):
        _, manifest = self.save_and_load("torch.compiler.skip_guard_on_globals_unsafe", "3")
        self.assertEqual(
            manifest["guard_filter_fn"], "torch.compiler.skip_guard_on_globals_unsafe"
        )

    def test_manifest_field_is_checked_and_reported(self):
        from torch._dynamo.exc import PackageError
        from torch._dynamo.package_artifacts import guard_filter_name, saved_guard_filter

        name = guard_filter_name(torch.compiler.skip_guard_on_all_nn_modules_unsafe)
        self.assertEqual(name, "torch.compiler.skip_guard_on_all_nn_modules_unsafe")
        self.assertEqual(
            guard_filter_name(
                functools.partial(torch.compiler.keep_tensor_guards_unsafe, keep_parameters=True)
            ),
            "torch.compiler.keep_tensor_guards_unsafe(keep_parameters=True)",
        )
        self.assertEqual(guard_filter_name(lambda entries: entries), "<custom>")
        self.assertIsNone(guard_filter_name(None))
        with self.assertLogs("torch._dynamo.package_artifacts", "INFO") as logs:
            self.assertEqual(saved_guard_filter({"guard_filter_fn": name}, "p"), name)
        self.assertIn(name, logs.output[0])
        self.assertIsNone(saved_guard_filter({}, "p"))
        with self.assertRaisesRegex(PackageError, "guard_filter_fn"):
            saved_guard_filter({"guard_filter_fn": "os.system"}, "p")


class Doubler(torch.nn.Module):
    def forward(self, x):
        return x * SCALE


class GuardFilterPresetAOTCompileTests(torch._dynamo.test_case.TestCase):
    def aot_compile(self, preset):
        mod = Doubler()
        options = {"guard_filter_fn": preset} if preset else {}
        with torch._dynamo.config.patch("enable_aot_compile", True):
            compiled = torch.compile(mod, fullgraph=True, backend="eager", options=options)
            fn = compiled.forward.aot_compile(((torch.ones(3),), {}))
        return mod, fn

    def test_aot_compile_checks_guards_without_preset(self):
        global SCALE
        mod, fn = self.aot_compile(None)
        self.assertEqual(fn(mod, torch.ones(3)), torch.full((3,), 3.0))
        try:
            SCALE = 5
            with self.assertRaises(RuntimeError):
                fn(mod, torch.ones(3))
        finally:
            SCALE = 3

    def test_aot_compile_with_preset(self):
        global SCALE
        mod, fn = self.aot_compile(torch.compiler.skip_guard_on_globals_unsafe)
        try:
            SCALE = 5
            # As on 2.13: the guard on the global is gone, the entry runs.
            self.assertEqual(fn(mod, torch.ones(3)), torch.full((3,), 3.0))
        finally:
            SCALE = 3


instantiate_parametrized_tests(GuardFilterPresetTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
