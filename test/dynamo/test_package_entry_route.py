# Owner(s): ["module: dynamo"]
"""A loaded package's module calls its entries without the frame hook.

See NOTE: [A loaded package's module calls its entries without the frame hook]
in torch/_dynamo/package.py: a module compiled with a compile package binds its
forward's locals, checks the guards of the entries it loaded and calls the
hit's bytecode as a function, as the aot_compile function does; whenever the
frame hook's path could differ (stance, hooks, profiler, tracing, an entry
with resume functions or one compiled in this process) it takes Dynamo's _fn.

The packages are saved by another process (setUpClass); each test loads them
here. A routed call shows call_loaded_entry and no _fn among the Python frames
it enters; one that takes the hook shows _fn. Linear.forward among them means
the model ran eagerly.
"""

import json
import os
import shutil
import sys
import tempfile
import textwrap

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import package as dynamo_package
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


# The tracer of Python calls the per-call entry tests use.
from test_compiled_call_entry import python_calls


MODEL_SOURCE = textwrap.dedent(
    """
    import torch


    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.l1 = torch.nn.Linear(4, 8)
            self.l2 = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.l2(torch.relu(self.l1(x)))


    class Scaled(MLP):
        def forward(self, x, scale=2.0, shift=None):
            out = super().forward(x) * scale
            return out if shift is None else out + shift


    class Breaks(MLP):
        def forward(self, x):
            y = torch.relu(self.l1(x))
            torch._dynamo.graph_break()
            return self.l2(y)
    """
)

SAVE = textwrap.dedent(
    """
    import os
    import sys

    import torch
    from torch.testing._internal.fresh_process import write_report

    import route_model

    where, backend, names, grads = sys.argv[1:]
    x, shift = torch.randn(2, 4), torch.randn(2, 4)
    calls_of = {
        "MLP": [((x,), {})],
        "Scaled": [((x,), {}), ((x,), {"shift": shift})],
        "Breaks": [((x,), {})],
    }
    for name in names.split(","):
        calls = calls_of[name]
        for grad in (mode == "grad" for mode in grads.split(",")):
            model = getattr(route_model, name)()
            path = os.path.join(where, f"{name}-{backend}-{'grad' if grad else 'no_grad'}")
            compiled = torch.compile(model, backend=backend, package=path)
            with torch.set_grad_enabled(grad):
                for args, kwargs in calls:
                    compiled(*args, **kwargs)
            compiled.save_package()
    write_report({"saved": True})
    """
)

LOAD_IN_A_FRESH_PROCESS = textwrap.dedent(
    """
    import os
    import sys

    import torch
    from torch.testing._internal.fresh_process import write_report

    import route_model

    model = route_model.MLP()
    path = os.path.join(sys.argv[1], "MLP-inductor-no_grad")
    compiled = torch.compile(model, package=path)
    compiled.load_package()
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_qualname)

    x = torch.randn(2, 4)
    with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
        first = compiled(x)
        sys.setprofile(profile)
        second = compiled(x)
        sys.setprofile(None)
        write_report(
            {
                "calls": calls,
                "first": torch.allclose(first, model(x)),
                "second": torch.allclose(second, model(x)),
            }
        )
    """
)


# Bytecode shaped as Dynamo's entries are (at module level: in a class body
# Python would mangle the names).
def calls_a_graph(self, x):
    return __compiled_fn_1(x)  # noqa: F821


def calls_a_resume_function(self, x):
    return __resume_at_10_2(x)  # noqa: F821


def stores_an_attribute(self, x):
    self.y = x
    return x


def calls_a_python_function(self, x):
    return __import_os.path.join(x)  # noqa: F821


def calls_a_builtin(self, x):
    return __import_torch.relu(x)  # noqa: F821


# An entry of a deep model: more locals than one byte of argument names, so
# its bytecode carries EXTENDED_ARG prefixes.
_many_locals = "\n".join(f"    v{i} = x" for i in range(300))
exec(f"def reads_many_inputs(self, x):\n{_many_locals}\n    return __compiled_fn_1(v299)\n")


# The qualified names of the Python frames that tell the paths apart.
ROUTED = "loaded_entry_route.<locals>.call_loaded_entry"
DYNAMO_FN = "_TorchDynamoContext.__call__.<locals>._fn"


class TestPackageEntryRoute(torch._dynamo.test_case.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.where = tempfile.mkdtemp(prefix="package_entry_route_")
        with open(os.path.join(cls.where, "route_model.py"), "w") as f:
            f.write(MODEL_SOURCE)
        run_code(SAVE, cls.where, "eager", "MLP,Scaled,Breaks", "no_grad,grad", pythonpath=[cls.where])
        sys.path.insert(0, cls.where)
        import route_model

        cls.models = route_model

    @classmethod
    def tearDownClass(cls):
        sys.path.remove(cls.where)
        sys.modules.pop("route_model", None)
        shutil.rmtree(cls.where, ignore_errors=True)
        super().tearDownClass()

    def load(self, name="MLP", grad=False):
        model = getattr(self.models, name)()
        path = os.path.join(self.where, f"{name}-eager-{'grad' if grad else 'no_grad'}")
        compiled = torch.compile(model, backend="eager", package=path)
        compiled.load_package()
        return model, compiled

    def assertRouted(self, calls):
        self.assertEqual(
            (ROUTED in calls, DYNAMO_FN in calls, "Linear.forward" in calls), (True, False, False)
        )

    def assertThroughTheHook(self, calls):
        self.assertEqual((DYNAMO_FN in calls, "Linear.forward" in calls), (True, False))

    @parametrize("stance", ["default", "fail_on_recompile"])
    @parametrize("grad", [False, True])
    def test_a_loaded_entry_is_called_without_the_frame_hook(self, stance, grad):
        model, compiled = self.load(grad=grad)
        x = torch.randn(2, 4)
        with torch.set_grad_enabled(grad), torch.compiler.set_stance(stance):
            # The first call installs the loaded entry through the frame hook.
            self.assertThroughTheHook(python_calls(lambda: compiled(x)))
            out = []
            self.assertRouted(python_calls(lambda: out.append(compiled(x))))
        expected = model(x)
        self.assertEqual(out[0], expected)
        if grad:
            out[0].sum().backward()
            routed_grads = [p.grad.clone() for p in model.parameters()]
            model.zero_grad()
            expected.sum().backward()
            self.assertEqual(routed_grads, [p.grad for p in model.parameters()])

    def test_keywords_and_defaults_bind_as_the_frame_does(self):
        model, compiled = self.load("Scaled")
        x = torch.randn(2, 4)
        shift = torch.randn(2, 4)
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
            compiled(x)
            compiled(x, shift=shift)
            for args, kwargs in (
                ((x,), {}),
                ((x, 2.0), {}),
                ((), {"x": x}),
                ((x,), {"scale": 2.0, "shift": shift}),
                ((x, 2.0, shift), {}),
                ((), {"shift": shift, "x": x}),
            ):
                out = []
                self.assertRouted(python_calls(lambda: out.append(compiled(*args, **kwargs))))
                self.assertEqual(out[0], model(*args, **kwargs))
            # The binding feeds the guards: a scale the package never saw is a recompile.
            with self.assertRaisesRegex(RuntimeError, "Detected recompile"):
                compiled(x, 3.0)
            # A call the frame would refuse raises what it raises.
            for args, kwargs in (((), {}), ((x,), {"x": x}), ((x,), {"bias": 1})):
                with self.assertRaises(TypeError):
                    compiled(*args, **kwargs)

    def test_hooks_registered_after_load_run(self):
        # Under the default stance: the hooks run inside the compiled call, where
        # Dynamo compiles their frames as it does stock's.
        model, compiled = self.load()
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            seen = []
            handle = model.register_forward_hook(lambda mod, args, out: seen.append("module") or out + 1)
            out = []
            self.assertThroughTheHook(python_calls(lambda: out.append(compiled(x))))
            self.assertEqual(seen, ["module"])
            handle.remove()
            self.assertEqual(out[0], model(x) + 1)
            handle = torch.nn.modules.module.register_module_forward_pre_hook(
                lambda mod, args: seen.append(type(mod).__name__)
            )
            try:
                self.assertThroughTheHook(python_calls(lambda: compiled(x)))
            finally:
                handle.remove()
            self.assertIn("MLP", seen)
            self.assertRouted(python_calls(lambda: compiled(x)))

    def test_a_forward_replaced_after_load_is_called(self):
        model, compiled = self.load()
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            model.forward = lambda x: x * 5
            try:
                out = []
                calls = python_calls(lambda: out.append(compiled(x)))
                self.assertIn(DYNAMO_FN, calls)
                self.assertEqual(out[0], x * 5)
            finally:
                del model.forward
            self.assertRouted(python_calls(lambda: compiled(x)))

    def test_entries_with_resume_functions_take_the_frame_hook(self):
        model, compiled = self.load("Breaks")
        x = torch.randn(2, 4)
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
            compiled(x)
            out = []
            self.assertThroughTheHook(python_calls(lambda: out.append(compiled(x))))
        self.assertEqual(out[0], model(x))

    def test_entries_compiled_in_this_process_take_the_frame_hook(self):
        model = self.models.MLP()
        compiled = torch.compile(
            model, backend="eager", package=os.path.join(self.where, "compiled-here")
        )
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            self.assertThroughTheHook(python_calls(lambda: compiled(x)))

    def test_a_second_package_adopts_an_entry_its_model_runs_routed(self):
        # NOTE: [Entries a package's model uses]: an entry that serves another
        # package's model joins that package when its guards pass while that
        # model runs; the routed call runs the running-package hook first.
        model_a, compiled_a = self.load()
        where = tempfile.mkdtemp(prefix="package_entry_route_second_")
        self.addCleanup(shutil.rmtree, where, ignore_errors=True)
        compiled_b = torch.compile(self.models.MLP(), backend="eager", package=where)
        x = torch.randn(2, 4)
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
            compiled_a(x)
            # One backend, one cache key: B's first call already finds A's entry.
            out = []
            self.assertRouted(python_calls(lambda: out.append(compiled_b(x))))
        self.assertEqual(out[0], model_a(x))
        compiled_b.save_package()
        with open(os.path.join(where, "manifest.json")) as f:
            self.assertEqual(json.load(f)["entries"], 1)

    def test_stances_and_callers_that_change_the_path_take_it(self):
        model, compiled = self.load()
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            with torch.compiler.set_stance("force_eager"):
                calls = python_calls(lambda: compiled(x))
                self.assertEqual((ROUTED in calls, "Linear.forward" in calls), (True, True))
            with torch.compiler.set_stance("eager_on_recompile"):
                self.assertThroughTheHook(python_calls(lambda: compiled(x)))
            # A caller's frame callback (run-only) is installed.
            self.assertThroughTheHook(python_calls(torch._dynamo.run(lambda: compiled(x))))
            self.assertRouted(python_calls(lambda: compiled(x)))

    def test_an_outer_compile_traces_the_inner_module(self):
        # Dynamo unwraps an OptimizedModule to its _orig_mod: the route's
        # wrapper is never traced.
        model, compiled = self.load()
        counter = torch._dynamo.testing.CompileCounter()
        outer = torch.compile(lambda x: compiled(x) * 2, backend=counter, fullgraph=True)
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            self.assertEqual(outer(x), model(x) * 2)
        self.assertEqual((counter.frame_count, counter.op_count), (1, 4))

    def test_the_profiler_sees_the_compiled_region(self):
        model, compiled = self.load()
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            with torch.profiler.profile() as prof:
                compiled(x)
        names = {event.name for event in prof.events()}
        self.assertIn("Torch-Compiled Region: loaded from package", names)

    def test_fx_and_jit_tracing_get_dynamo_s_errors(self):
        model, compiled = self.load()
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)

            class Caller(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.compiled = compiled

                def forward(self, x):
                    return self.compiled(x)

            with self.assertRaisesRegex(RuntimeError, "symbolically trace a dynamo-optimized"):
                torch.fx.symbolic_trace(Caller())
            with self.assertRaisesRegex(RuntimeError, "torch.jit.trace"):
                torch.jit.trace(Caller(), (x,))

    def test_reset_drops_the_routed_entries(self):
        model, compiled = self.load()
        x = torch.randn(2, 4)
        with torch.no_grad():
            compiled(x)
            self.assertRouted(python_calls(lambda: compiled(x)))
            torch._dynamo.reset()
            # The forward code's cache is empty: the hook installs the entry again.
            self.assertThroughTheHook(python_calls(lambda: compiled(x)))
            self.assertRouted(python_calls(lambda: compiled(x)))

    def test_a_new_guard_failure_takes_the_hook_and_fails_on_recompile(self):
        model, compiled = self.load()
        with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
            compiled(torch.randn(2, 4))
            with self.assertRaisesRegex(RuntimeError, "Detected recompile"):
                compiled(torch.randn(2, 4, dtype=torch.float64))

    def test_only_bytecode_that_reads_inputs_and_calls_graphs_is_routable(self):
        routable = dynamo_package._routable_bytecode
        f_globals = {"__import_os": os, "__import_torch": torch}
        self.assertTrue(routable(calls_a_graph.__code__, f_globals))
        self.assertTrue(routable(calls_a_builtin.__code__, f_globals))
        self.assertTrue(routable(reads_many_inputs.__code__, f_globals))  # noqa: F821
        self.assertFalse(routable(calls_a_resume_function.__code__, f_globals))
        self.assertFalse(routable(stores_an_attribute.__code__, f_globals))
        self.assertFalse(routable(calls_a_python_function.__code__, f_globals))

    def test_a_fresh_process_routes_an_inductor_package(self):
        where = tempfile.mkdtemp(prefix="package_entry_route_inductor_")
        self.addCleanup(shutil.rmtree, where, ignore_errors=True)
        shutil.copy(os.path.join(self.where, "route_model.py"), where)
        run_code(SAVE, where, "inductor", "MLP", "no_grad", pythonpath=[where], fresh_inductor_cache=True)
        report = run_code(LOAD_IN_A_FRESH_PROCESS, where, pythonpath=[where], fresh_inductor_cache=True)
        self.assertTrue(report["first"])
        self.assertTrue(report["second"])
        self.assertRouted(report["calls"])


instantiate_parametrized_tests(TestPackageEntryRoute)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
