# Owner(s): ["module: dynamo"]
"""Compile packages: torch.compile(f, package=...), save_package, load_package.

Every case is saved by one interpreter and loaded by a FRESH one with an empty
TORCHINDUCTOR_CACHE_DIR under torch.compiler.set_stance("fail_on_recompile"),
and the loaded outputs (and gradients) are compared with eager. The loading
process also checks that Dynamo traced nothing and no C++ was compiled.
"""

import gc
import inspect
import json
import os
import shutil
import tempfile
import textwrap
import types
import unittest
import unittest.mock
import warnings
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._dynamo.exc import PackageError
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
    subtest,
)
from torch.testing._internal.fresh_process import run_code, start_code


RUNNER = r'''
import importlib.util, json, os, sys, time, warnings
import torch
from torch.testing._internal.fresh_process import write_report
from torch.utils._pytree import tree_leaves

mode, case_path, package_dir = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("pkg_case", case_path)
case = importlib.util.module_from_spec(spec)
sys.modules["pkg_case"] = case
spec.loader.exec_module(case)
target, calls, compile_kwargs = case.make()
train = getattr(case, "TRAIN", False)
# how the target is called: directly, or under the case's transforms
call = getattr(case, "CALL", lambda fn, args: fn(*args))
compiled = torch.compile(target, package=package_dir, **compile_kwargs)


def run(fn, args):
    args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a for a in args]
    out = call(fn, args)
    grads = []
    if train:
        out.sum().backward()
        grads = [a.grad for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
        if isinstance(target, torch.nn.Module):
            grads += [p.grad.clone() for p in target.parameters()]
            target.zero_grad()
    return out, grads


report = {}
if mode == "save":
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for args in calls:
            run(compiled, args)
        compiled.save_package()
    report["warnings"] = [str(w.message) for w in caught if "package" in str(w.message)]
    with open(os.path.join(package_dir, "manifest.json")) as f:
        manifest = json.load(f)
    report["entries"] = manifest["entries"]
    report["skipped_frames"] = manifest.get("skipped_frames", 0)
else:
    compiled.load_package()
    from torch._dynamo.utils import counters
    results = []
    stance = os.environ.get("CASE_STANCE", "fail_on_recompile")
    with torch.compiler.set_stance(stance):
        for args in calls:
            try:
                got, got_grads = run(compiled, args)
            except Exception as e:
                results.append({"error": f"{type(e).__name__}: {e}"[:300]})
                continue
            want, want_grads = run(target, args)
            # outputs may be tuples (nn.MultiheadAttention, nn.LSTM)
            same = all(
                torch.allclose(g, w, atol=1e-5) for g, w in zip(tree_leaves(got), tree_leaves(want))
            ) and all(
                torch.allclose(g, w, atol=1e-5) for g, w in zip(got_grads, want_grads)
            )
            results.append({"same": bool(same), "grads": len(got_grads)})
    report["results"] = results
    report["traced_graphs"] = counters["stats"]["unique_graphs"]
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    report["compiled_binaries"] = sorted(
        f for _, _, files in os.walk(cache) for f in files if f.endswith(".so")
    )
write_report(report)
'''


CASES = {
    "simple": """
        import torch
        def f(x, y):
            return torch.sin(x) * 2 + y.cos()
        def make():
            torch.manual_seed(0)
            return f, [(torch.randn(8), torch.randn(8))], dict(backend=BACKEND)
    """,
    "recompile_limit": """
        import torch
        # recompile_limit on 2.7; cache_size_limit, its alias there, on 2.6
        torch._dynamo.config.cache_size_limit = 2
        def f(x, n):
            return x * n + 1
        def make():
            torch.manual_seed(0)
            x = torch.randn(4)
            calls = [(x, 1), (x, 2), (x, 3), (x, 4), (x, 1), (x, 2)]
            return f, calls, dict(backend=BACKEND, dynamic=False)
    """,
    "recompile_limit_graph_break": """
        import torch
        torch._dynamo.config.cache_size_limit = 2
        def f(x, n):
            y = x * n
            if y.sum() > 0:  # data-dependent: a graph break, a resume function per branch
                return y + 1
            return y - 1
        def make():
            torch.manual_seed(0)
            x = torch.rand(4) + 0.1
            # n = 3 hits the limit; then n = 1 with -x takes f's first entry
            # into the other branch's resume function, which run-only mode
            # runs eagerly: nothing compiled it, so the package has no entry
            # for it.
            calls = [(x, 1), (x, 2), (x, 3), (-x, 1), (-x, 2), (x, 1)]
            return f, calls, dict(backend=BACKEND, dynamic=False)
    """,
    "graph_break_in_an_inlined_method": """
        import torch
        class Experts(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
            def route(self, x):
                out = torch.zeros_like(x)
                for i in range(2):
                    rows, = torch.where(x[:, i] > 0)
                    if rows.numel() > 0:  # a graph break inside the inlined call
                        out[rows] += self.lin(x[rows])
                return out
            def forward(self, x):
                shape = x.shape
                return self.route(x.view(-1, 4)).view(*shape) + x
        def make():
            torch.manual_seed(0)
            return Experts(), [(torch.randn(2, 3, 4),)], dict(backend=BACKEND)
    """,
    "property_frame": """
        import torch
        class Scaled(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(4))
            @property
            def scale(self):
                # A graph break inside the getter: the call runs eagerly and the
                # getter is compiled as a frame of its own (as transformers'
                # ModuleUtilsMixin.device under Llama-4).
                torch._dynamo.graph_break()
                return self.w.detach() * 2
            def forward(self, x):
                return torch.relu(x) * self.scale + 1
        def make():
            torch.manual_seed(0)
            return Scaled(), [(torch.randn(4),)], dict(backend=BACKEND)
    """,
    "numpy_call": """
        import numpy as np
        import torch
        def f(x, n):
            return x * np.sqrt(n) + x.shape[0]
        def make():
            torch.manual_seed(0)
            return f, [(torch.randn(4), 8), (torch.randn(6), 9)], dict(backend=BACKEND, dynamic=True)
    """,
    "numpy_wrappers": """
        import numpy as np
        import torch
        def f(x):
            # np.arange and np.log: calls of torch._numpy functions; % and /
            # on ndarrays: calls of operators; .max(): an ndarray method. Each is
            # a call of one of Dynamo's NumPy wrappers in the graph.
            pos = np.arange(x.shape[0]) % 3 / 2.0
            return x * torch.from_numpy(np.log(pos + 1.0)).float() + pos.max() + np.lcm(4, 6)
        def make():
            torch.manual_seed(0)
            return f, [(torch.randn(5),), (torch.randn(7),)], dict(backend=BACKEND, dynamic=True)
    """,
    "random_calls": """
        import random
        import torch
        def f(x):
            # Dynamo replays these calls before the graph, through a function
            # it installs as the global __gen_rand_values_<n>.
            return x * random.uniform(0, b=2) + random.randint(1, 5) + random.randrange(0, 10, 2)
        # Both the compiled call and eager's draw from the same seed.
        CALL = lambda fn, args: (random.seed(0), fn(*args))[1]
        def make():
            torch.manual_seed(0)
            x = torch.randn(4)
            return f, [(x,), (x,)], dict(backend=BACKEND)
    """,
    "graph_breaks": """
        import torch
        def f(x):
            y = x.relu() + 1
            torch._dynamo.graph_break()
            z = y * 3
            torch._dynamo.graph_break()
            return z.sum(0) + x.mean()
        def make():
            torch.manual_seed(0)
            return f, [(torch.randn(4, 4),)], dict(backend=BACKEND)
    """,
    "recompiles": """
        import torch
        def f(x, scale):
            return x * scale + 1
        def make():
            torch.manual_seed(0)
            return f, [
                (torch.randn(5), 2),
                (torch.randn(5), 3),
                (torch.randn(5, dtype=torch.float64), 2),
            ], dict(backend=BACKEND)
    """,
    "module": """
        import torch
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = torch.nn.Linear(16, 32)
                self.fc2 = torch.nn.Linear(32, 4)
            def forward(self, x):
                return self.fc2(torch.relu(self.fc1(x)))
        def make():
            torch.manual_seed(0)
            return MLP(), [(torch.randn(3, 16),)], dict(backend=BACKEND)
    """,
    "training": """
        import torch
        TRAIN = True
        class MLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = torch.nn.Linear(8, 8)
            def forward(self, x):
                return torch.tanh(self.fc1(x)) * x
        def make():
            torch.manual_seed(0)
            return MLP(), [(torch.randn(2, 8, requires_grad=True),)], dict(backend=BACKEND)
    """,
    "closure_and_defaults": """
        import torch
        def make_fn(offset):
            def f(x, scale=3.0, *, shift=1):
                return x * scale + offset + shift
            return f
        FN = make_fn(2.0)
        def make():
            torch.manual_seed(0)
            return FN, [(torch.randn(6),)], dict(backend=BACKEND)
    """,
    "inside_functorch_transforms": """
        import torch
        def f(x):
            return (x.sin() * x).sum()
        def CALL(fn, args):
            # the compiled frame runs under vmap(grad(...)): its inputs are
            # wrapped tensors and its guards include the functorch stack
            return torch.vmap(torch.func.grad(fn))(*args)
        def make():
            torch.manual_seed(0)
            return f, [(torch.randn(4, 3),), (torch.randn(7, 3),)], dict(backend=BACKEND)
    """,
    "dynamic": """
        import torch
        def f(x):
            return x * x.shape[0] + 1
        def make():
            torch.manual_seed(0)
            first = torch.randn(6)
            torch._dynamo.mark_dynamic(first, 0)
            # 6 compiles static, 9 recompiles with a dynamic size (s0 >= 2); 3 is
            # in that range, 1 is out of it (0/1 specialization)
            return f, [(first,), (torch.randn(9),), (torch.randn(3),), (torch.randn(1),)], dict(backend=BACKEND)
    """,
    "closure_graph_break": """
        import torch
        def make_fn(scale):
            def f(x):
                y = x * scale
                torch._dynamo.graph_break()
                # the resume function has a free variable: the saved bytecode
                # builds it from a code constant instead of calling a global
                return y + scale
            return f
        FN = make_fn(2.0)
        def make():
            torch.manual_seed(0)
            return FN, [(torch.randn(6),), (torch.randn(6, dtype=torch.float64),)], dict(backend=BACKEND)
    """,
    "recursion_graph_breaks": """
        import torch
        def fn(x, depth):
            if depth == 0:
                return x.sin()
            y = x * 2 + depth
            torch._dynamo.graph_break()
            # every level runs in a resume function of fn; each depth is a
            # recompile of fn and of both of its resume functions
            return fn(y, depth - 1) + 1
        def make():
            torch.manual_seed(0)
            return fn, [(torch.randn(5), 5), (torch.randn(5), 2), (torch.randn(5), 0)], dict(backend=BACKEND)
    """,
    # KIND: which built-in module; torch.compile runs these through Dynamo's
    # inline wrapper (their forward is a torch.nn frame Dynamo does not trace
    # into on its own)
    "builtin_module": """
        import torch
        from torch import nn
        class Blocks(nn.Module):
            def __init__(self):
                super().__init__()
                self.layers = nn.ModuleList([nn.Linear(6, 6) for _ in range(2)])
                self.heads = nn.ModuleDict({"a": nn.Linear(6, 3), "b": nn.Linear(6, 3)})
            def forward(self, x):
                for layer in self.layers:
                    x = torch.relu(layer(x))
                return self.heads["a"](x) - self.heads["b"](x)
        def build():
            if KIND == "linear":
                return nn.Linear(6, 3), (torch.randn(4, 6),)
            if KIND == "sequential":
                return nn.Sequential(nn.Linear(6, 8), nn.GELU(), nn.LayerNorm(8), nn.Linear(8, 3)), (torch.randn(4, 6),)
            if KIND == "sequential_of_containers":
                return nn.Sequential(Blocks(), nn.Tanh()), (torch.randn(4, 6),)
            if KIND == "transformer_encoder_layer":
                layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
                return layer.eval(), (torch.randn(2, 5, 8),)
            if KIND == "transformer_encoder":
                layer = nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0, batch_first=True)
                encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
                return encoder.eval(), (torch.randn(2, 5, 8),)
            if KIND == "multihead_attention":
                x = torch.randn(2, 5, 8)
                return nn.MultiheadAttention(8, 2, batch_first=True), (x, x, x)
            if KIND == "lstm":
                return nn.LSTM(6, 4, batch_first=True), (torch.randn(2, 3, 6),)
            raise ValueError(KIND)
        def make():
            torch.manual_seed(0)
            # with allow_rnn Dynamo traces nn.LSTM (and guards its weakrefs)
            torch._dynamo.config.allow_rnn = globals().get("ALLOW_RNN", False)
            module, args = build()
            return module, [args], dict(backend=BACKEND)
    """,
}


# Two built-in modules compiled with two packages: both are compiled through
# Dynamo's inline wrapper, i.e. frames of one and the same code object.
TWO_MODULES = r'''
import json, os, sys
import torch
from torch import nn
from torch.testing._internal.fresh_process import write_report

mode, where = sys.argv[1:3]
torch.manual_seed(0)
linear = nn.Linear(6, 3)
sequential = nn.Sequential(nn.Linear(6, 4), nn.ReLU(), nn.Linear(4, 3))
x = torch.randn(2, 6)


def compiled(module, name):
    return torch.compile(module, backend="eager", package=os.path.join(where, name))


report = {}
if mode == "save":
    for module, name in ((linear, "linear"), (sequential, "sequential")):
        c = compiled(module, name)
        c(x)
        c.save_package()
else:
    from torch._dynamo.utils import counters

    c_linear, c_sequential = compiled(linear, "linear"), compiled(sequential, "sequential")
    c_linear.load_package()
    c_sequential.load_package()
    with torch.compiler.set_stance("fail_on_recompile"):
        report["same"] = [
            bool(torch.allclose(c(x), m(x)))
            for c, m in ((c_linear, linear), (c_sequential, sequential), (c_linear, linear))
        ]
    report["traced_graphs"] = counters["stats"]["unique_graphs"]
    # The Linear's package loaded for the Sequential: its entries are not for it.
    torch._dynamo.reset()
    crossed = compiled(sequential, "linear")
    crossed.load_package()
    with torch.compiler.set_stance("fail_on_recompile"):
        try:
            crossed(x)
            report["crossed"] = "ran"
        except RuntimeError as e:
            report["crossed"] = str(e)
write_report(report)
'''


# One class, two instances, two packages, the second made after the first's entry
# was compiled (NOTE: [Entries a package's model uses]): no callable runs a
# package hook; the second package's model is served by the first's entry, holds
# it once saved, and loads it alone.
SHARED_LATER = r'''
import os, sys
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report


class Affine(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(5, 3)

    def forward(self, x):
        return torch.relu(self.linear(x)) + 1


mode, where = sys.argv[1:3]
model, copy = Affine(0), Affine(1)
x = torch.randn(4, 5)


def hooks(compiled):
    return [h.__name__ for h in compiled.dynamo_ctx.enter_exit_hooks]


report = {}
if mode == "save":
    # What a compile without a package runs on every call: the hooks a package
    # adds are those beyond it.
    report["plain_hooks"] = hooks(torch.compile(Affine(2), backend="eager"))
    c_model = torch.compile(model, backend="eager", package=os.path.join(where, "model"))
    c_model(x)
    report["model_hooks_alone"] = hooks(c_model)
    c_copy = torch.compile(copy, backend="eager", package=os.path.join(where, "copy"))
    report["hooks_shared"] = [hooks(c_model), hooks(c_copy)]
    graphs = counters["stats"]["unique_graphs"]
    report["same"] = bool(torch.equal(c_copy(x), copy(x)))
    report["graphs_for_copy"] = counters["stats"]["unique_graphs"] - graphs
    c_copy.save_package()
    c_model.save_package()
else:
    c_copy = torch.compile(copy, backend="eager", package=os.path.join(where, "copy"))
    c_copy.load_package()
    with torch.compiler.set_stance("fail_on_recompile"):
        report["same"] = bool(torch.equal(c_copy(x), copy(x)))
    report["traced_graphs"] = counters["stats"]["unique_graphs"]
write_report(report)
'''


# One class, two instances, two packages, one code at its recompile limit under
# the first (NOTE: [Entries a package's model uses], NOTE: [Frames Dynamo
# skips]): the second package takes the first's entries of that code when saved,
# both of them though its model ran one, and not the first's run-only decision.
SHARED_AT_LIMIT = r"""
import json, os, sys, warnings
import torch
from torch import nn
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report

# recompile_limit on 2.7; cache_size_limit, its alias there, on 2.6
torch._dynamo.config.cache_size_limit = 2


class Scale(nn.Module):
    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.linear = nn.Linear(4, 4)

    def forward(self, x, n):
        return self.linear(x) * n + 1


mode, where = sys.argv[1:3]
model, copy = Scale(0), Scale(1)
x = torch.randn(2, 4)


def manifest(name):
    with open(os.path.join(where, name, "manifest.json")) as f:
        found = json.load(f)
    return [found["entries"], found["skipped_frames"]]


report = {}
if mode == "save":
    torch._dynamo.config.strict_precompile = True
    c_model = torch.compile(model, backend="eager", dynamic=False, package=os.path.join(where, "model"))
    c_copy = torch.compile(copy, backend="eager", dynamic=False, package=os.path.join(where, "copy"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        same = [bool(torch.equal(c_model(x, n), model(x, n))) for n in (1, 2, 3)]
        graphs = counters["stats"]["unique_graphs"]
        # Served by the model's entry (1), run eagerly at the limit (3).
        same += [bool(torch.equal(c_copy(x, n), copy(x, n))) for n in (1, 3)]
        report["graphs_for_copy"] = counters["stats"]["unique_graphs"] - graphs
        c_copy.save_package()
        c_model.save_package()
    report["warnings"] = [str(w.message) for w in caught if "package" in str(w.message)]
    report["same"] = same
    report["model"], report["copy"] = manifest("model"), manifest("copy")
else:
    c_copy = torch.compile(copy, backend="eager", dynamic=False, package=os.path.join(where, "copy"))
    c_copy.load_package()
    with torch.compiler.set_stance("fail_on_recompile"):
        report["same"] = [bool(torch.equal(c_copy(x, n), copy(x, n))) for n in (1, 2)]
    report["traced_graphs"] = counters["stats"]["unique_graphs"]
write_report(report)
"""


# A helper that graph-breaks is compiled as a frame of its own; defined in a local
# scope, a fresh process has no name to find its code by.
def _make_generated_helper():
    # Code generated at run time (exec): no module attribute and no enclosing
    # function's constants hold it, so another process cannot find it again.
    namespace = {"__name__": __name__, "torch": torch}
    exec(
        textwrap.dedent(
            """
            def helper(x):
                y = x.cos()
                torch._dynamo.graph_break()
                return y + 1
            """
        ),
        namespace,
    )
    return namespace["helper"]


def _make_local_helper():
    def helper(x):
        y = x.cos()
        torch._dynamo.graph_break()
        return y + 1

    return helper


_LOCAL_HELPER = _make_generated_helper()
_NESTED_HELPER = _make_local_helper()


def _calls_local_helper(x):
    return _LOCAL_HELPER(x) * 2


def _calls_nested_helper(x):
    return _NESTED_HELPER(x) * 2


def _compile_with_local_helper(package_dir):
    compiled = torch.compile(_calls_local_helper, backend="eager", package=package_dir)
    compiled(torch.randn(3))
    return compiled


def _scaled_sum(x):
    return (x.sin() + x.cos() * 2).sum(0)


def _write_into(cache, row):
    cache[1].copy_(row * 2)
    return cache.sum()


class PackageTestCase(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="package-test-"))
        # The saving side may reuse a warm cache; every load gets an empty one.
        self.save_cache = os.environ.get(
            "PACKAGE_TEST_SAVE_CACHE", str(Path(tempfile.gettempdir()) / "package-test-save-cache")
        )

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def write_case(self, name, backend, directory=None, **constants):
        header = "".join(f"{k} = {v!r}\n" for k, v in {"BACKEND": backend, **constants}.items())
        source = header + textwrap.dedent(CASES[name])
        path = (directory or self.tmp) / f"case_{name}_{backend}.py"
        path.write_text(source)
        return path

    def run_process(self, mode, case_path, package_dir, **env):
        # The save may reuse a warm cache; every load gets an empty one.
        if mode == "save":
            env = {"TORCHINDUCTOR_CACHE_DIR": self.save_cache, **env}
        return run_code(
            RUNNER,
            mode,
            case_path,
            package_dir,
            env=env,
            cwd=self.tmp,  # not the repo: a wheel run must not import torch_overlay
            fresh_inductor_cache=mode != "save",
        )

    def run_script(self, script, mode, where):
        """A fresh process running ``script`` with argv ``mode where``, both modes
        on the saving side's cache (the script's own packages are what it loads)."""
        return run_code(
            script,
            mode,
            where,
            env={"TORCHINDUCTOR_CACHE_DIR": self.save_cache},
            cwd=self.tmp,
        )

    def save_and_load(self, name, backend, constants=None, **load_env):
        case = self.write_case(name, backend, **(constants or {}))
        package = self.tmp / "pkg" / name
        saved = self.run_process("save", case, package)
        self.assertEqual(saved["warnings"], [])
        self.assertTrue((package / "manifest.json").exists())
        report = self.run_process("load", case, package, **load_env)
        report["saved_entries"] = saved["entries"]
        report["saved_skipped_frames"] = saved["skipped_frames"]
        return report

    def assert_loaded_without_compiling(self, report, expected_results):
        self.assertEqual(report["results"], expected_results)
        self.assertEqual(report["traced_graphs"], 0)
        self.assertEqual(report["compiled_binaries"], [])


class TestPackage(PackageTestCase):
    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_function(self, backend):
        report = self.save_and_load("simple", backend)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    @parametrize("backend", ["eager", subtest("inductor", decorators=[slowTest])])
    def test_graph_breaks_and_resume_functions(self, backend):
        report = self.save_and_load("graph_breaks", backend)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_graph_break_in_an_inlined_method(self):
        # The frame resumes with a NULL on the stack, which Dynamo's bytecode
        # pops by calling a function it writes in as a constant (PyCodegen.pop_null).
        report = self.save_and_load("graph_break_in_an_inlined_method", "eager")
        self.assertGreaterEqual(report["saved_entries"], 2)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    @parametrize("backend", [subtest("eager", decorators=[slowTest]), "aot_eager"])
    def test_numpy_call_in_graph(self, backend):
        # Dynamo traces np.sqrt as its wrapper of torch._numpy's sqrt; the graph
        # saves it by that function's name (a fresh process has not imported
        # torch._numpy).
        report = self.save_and_load("numpy_call", backend)
        self.assertGreaterEqual(report["saved_entries"], 1)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 2)

    @parametrize("backend", [subtest("eager", decorators=[slowTest]), "aot_eager"])
    def test_numpy_wrappers_in_graph(self, backend):
        # NOTE: [NumPy calls in packaged graphs]: a NumPy function, an operator
        # on ndarrays and an ndarray method, each saved by what it wraps.
        report = self.save_and_load("numpy_wrappers", backend)
        self.assertGreaterEqual(report["saved_entries"], 1)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 2)

    @parametrize("backend", ["eager", "aot_eager"])
    def test_random_calls_replayed_before_the_graph(self, backend):
        # NOTE: [Replayed random calls]
        report = self.save_and_load("random_calls", backend)
        self.assertGreaterEqual(report["saved_entries"], 1)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 2)

    def test_property_getter_frame(self):
        # The getter's frame is keyed by its qualname, which names a property on
        # the class: the load finds the getter's code through the property.
        report = self.save_and_load("property_frame", "eager")  # no entry left out
        self.assertGreaterEqual(report["saved_entries"], 2)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_graph_break_in_a_closure(self):
        report = self.save_and_load("closure_graph_break", "eager")
        self.assertEqual(report["saved_entries"], 4)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 2)

    @parametrize("backend", [subtest("eager", decorators=[slowTest]), "aot_eager"])
    def test_graph_break_inside_recursion(self, backend):
        report = self.save_and_load("recursion_graph_breaks", backend)
        # fn and its two resume functions (after the graph break, after the
        # recursive call), each compiled more than once: for the first depth,
        # then with depth dynamic, and for depth 0; the copies of one resume
        # function in the package must all find the code a fresh process runs
        self.assertGreaterEqual(report["saved_entries"], 6)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 3)

    @parametrize(
        "kind",
        [
            "linear",
            "sequential",
            "sequential_of_containers",
            "transformer_encoder_layer",
            "transformer_encoder",
            "multihead_attention",
        ],
    )
    def test_builtin_module(self, kind):
        report = self.save_and_load("builtin_module", "eager", {"KIND": kind})
        self.assertGreaterEqual(report["saved_entries"], 1)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_module_dynamo_does_not_compile(self):
        # With config.allow_rnn off Dynamo runs nn.LSTM eagerly: nothing is
        # compiled, and the package records that, so that a fresh process runs
        # it eagerly too instead of tracing it again.
        report = self.save_and_load("builtin_module", "eager", {"KIND": "lstm"})
        self.assertEqual((report["saved_entries"], report["saved_skipped_frames"]), (0, 1))
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_code_at_its_recompile_limit(self):
        # Each int compiles an entry (dynamic=False) until the recompile limit
        # (2); Dynamo then runs the code's entries only, eagerly for 3 and 4.
        # The package records that, so that a fresh process runs 3 and 4
        # eagerly too instead of compiling them, and 1 and 2 from its entries.
        report = self.save_and_load("recompile_limit", "eager")
        self.assertEqual((report["saved_entries"], report["saved_skipped_frames"]), (2, 1))
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 6)

    def test_frames_called_under_a_code_at_its_recompile_limit(self):
        # Past its limit f runs in run-only mode, and so do the frames it
        # calls: the resume function of the branch first taken after the
        # limit runs eagerly in the saving process, and must in a fresh one
        # too, under f's loaded entries (NOTE: [Frames called under a code at
        # its recompile limit]). f's two entries, the first branch's resume
        # function (one entry, shapes static) and f's decision are saved.
        report = self.save_and_load("recompile_limit_graph_break", "eager")
        self.assertEqual((report["saved_entries"], report["saved_skipped_frames"]), (3, 1))
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 6)

    def test_rnn_traced_with_allow_rnn(self):
        # Its guards include TYPE_MATCH on the weak references in
        # _flat_weight_refs: saved as weak references to the weights' stand-ins.
        report = self.save_and_load("builtin_module", "eager", {"KIND": "lstm", "ALLOW_RNN": True})
        self.assertEqual((report["saved_entries"], report["saved_skipped_frames"]), (1, 0))
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    @slowTest
    def test_builtin_module_inductor(self):
        report = self.save_and_load("builtin_module", "inductor", {"KIND": "sequential"})
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_builtin_modules_through_one_wrapper_keep_their_entries_apart(self):
        import pickle

        where = self.tmp / "pkgs"
        self.run_script(TWO_MODULES, "save", where)
        keys = {
            name: {entry[0] for entry in pickle.loads((where / name / "dynamo.bin").read_bytes())}
            for name in ("linear", "sequential")
        }
        self.assertEqual(keys["linear"], {("inline_wrapper", "torch.nn.modules.linear", "Linear")})
        self.assertEqual(
            keys["sequential"], {("inline_wrapper", "torch.nn.modules.container", "Sequential")}
        )
        report = self.run_script(TWO_MODULES, "load", where)
        self.assertEqual(report["same"], [True, True, True])
        self.assertEqual(report["traced_graphs"], 0)
        self.assertIn("fail_on_recompile", report["crossed"])

    def test_a_second_package_holds_entries_compiled_before_it_existed(self):
        where = self.tmp / "pkgs"
        saved = self.run_script(SHARED_LATER, "save", where)
        # A package adds no hook to its callable's calls, alone or beside a
        # second package: the copy's package takes the entry when it is saved.
        self.assertEqual(saved["model_hooks_alone"], saved["plain_hooks"])
        self.assertEqual(saved["hooks_shared"], [saved["plain_hooks"]] * 2)
        self.assertTrue(saved["same"])
        self.assertEqual(saved["graphs_for_copy"], 0)
        loaded = self.run_script(SHARED_LATER, "load", where)
        self.assertTrue(loaded["same"])
        self.assertEqual(loaded["traced_graphs"], 0)

    def test_a_second_package_takes_entries_not_decisions_of_a_shared_code(self):
        where = self.tmp / "pkgs"
        saved = self.run_script(SHARED_AT_LIMIT, "save", where)
        self.assertEqual(saved["warnings"], [])
        self.assertEqual(saved["same"], [True] * 5)
        self.assertEqual(saved["graphs_for_copy"], 0)
        # [entries, skipped frames]: the model's two entries and its decision
        # that the code runs only those; the copy takes both entries (guards
        # decide at load), not the decision.
        self.assertEqual(saved["model"], [2, 1])
        self.assertEqual(saved["copy"], [2, 0])
        loaded = self.run_script(SHARED_AT_LIMIT, "load", where)
        self.assertEqual(loaded["same"], [True, True])
        self.assertEqual(loaded["traced_graphs"], 0)

    def test_entry_whose_code_cannot_be_found_again_is_left_out(self):
        package_dir = str(self.tmp / "pkg")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            compiled = _compile_with_local_helper(package_dir)
            compiled.save_package()
        messages = [str(w.message) for w in caught if "could not find its code" in str(w.message)]
        # helper's entry, and then its resume function's (nothing else calls it)
        self.assertEqual(len(messages), 2)
        self.assertIn("the entry for helper (module test_package)", messages[0])
        self.assertIn("define it at module level", messages[0])
        self.assertIn("resume function torch_dynamo_resume_in_helper_at", messages[1])
        manifest = json.loads((Path(package_dir) / "manifest.json").read_text())
        # _calls_local_helper and its resume function after the call stay
        self.assertEqual(manifest["entries"], 2)
        torch._dynamo.reset()
        with torch._dynamo.config.patch(package_strict=True):
            compiled = _compile_with_local_helper(package_dir)
            with self.assertRaisesRegex(PackageError, "helper .* could not find its code"):
                compiled.save_package()

    def test_entry_of_a_function_nested_in_a_module_level_one_is_kept(self):
        # Its code is a constant of the enclosing function's code, found again
        # by its qualname (as contextlib.contextmanager's helper under DDP).
        package_dir = str(self.tmp / "pkg")
        compiled = torch.compile(_calls_nested_helper, backend="eager", package=package_dir)
        compiled(torch.randn(3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled.save_package()
        manifest = json.loads((Path(package_dir) / "manifest.json").read_text())
        # the caller, the helper, and the resume function of each
        self.assertEqual(manifest["entries"], 4)

    @parametrize("under_package", [True, False])
    def test_static_address_tensor(self, under_package):
        # mark_static_address(t) (guard=True, as StaticCache marks its tensors):
        # a compile for a package takes t as a graph input with TENSOR_MATCH
        # guards, so another tensor of its kind hits; a compile without one
        # keeps 2.7.1's identity guard. See NOTE: [Static addresses under a
        # compile package].
        from torch._dynamo.utils import counters

        def fresh_cache():
            cache = torch.zeros(4, 3)
            torch._dynamo.mark_static_address(cache)
            return cache

        options = {"package": str(self.tmp / "pkg")} if under_package else {}
        compiled = torch.compile(_write_into, backend="eager", fullgraph=True, **options)
        counters.clear()
        caches = [fresh_cache(), fresh_cache()]
        for cache in caches:
            compiled(cache, torch.ones(3))
        self.assertEqual(counters["stats"]["unique_graphs"], 1 if under_package else 2)
        for cache in caches:
            self.assertEqual(cache[1].tolist(), [2.0, 2.0, 2.0])
        if under_package:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                compiled.save_package()
            torch._dynamo.reset()
            compiled = torch.compile(_write_into, backend="eager", fullgraph=True, **options)
            compiled.load_package()
            counters.clear()
            cache = fresh_cache()
            with torch.compiler.set_stance("fail_on_recompile"):
                compiled(cache, torch.ones(3))
            self.assertEqual(counters["stats"]["unique_graphs"], 0)
            self.assertEqual(cache[1].tolist(), [2.0, 2.0, 2.0])

    def test_package_with_nothing_in_it_warns_at_save(self):
        compiled = torch.compile(_scaled_sum, backend="eager", package=str(self.tmp / "pkg"))
        with self.assertWarnsRegex(UserWarning, "holds no entries: nothing was compiled"):
            compiled.save_package()
        compiled(torch.randn(2, 3))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            compiled.save_package()

    def test_several_recompiles_in_one_package(self):
        report = self.save_and_load("recompiles", "eager")
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 3)

    @parametrize("backend", ["aot_eager", subtest("inductor", decorators=[slowTest])])
    def test_nn_module(self, backend):
        report = self.save_and_load("module", backend)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    @parametrize("backend", ["aot_eager", subtest("inductor", decorators=[slowTest])])
    def test_training_forward_and_backward(self, backend):
        report = self.save_and_load("training", backend)
        # input grad + weight + bias
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 3}])

    def test_closure_and_default_arguments(self):
        report = self.save_and_load("closure_and_defaults", "inductor")
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_frame_compiled_inside_functorch_transforms(self):
        # 2.7.1 compiles frames inside vmap / grad with the eager backend only.
        report = self.save_and_load("inside_functorch_transforms", "eager")
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}] * 2)

    def test_entry_whose_guards_cannot_be_rebuilt_is_dropped_with_a_warning(self):
        # e.g. guards saved under a thread-local dispatch key set this process
        # cannot make: the entry is not used and the frame compiles instead.
        from unittest import mock

        from torch._dynamo import guard_serialization

        def f(x):
            return x.sin() + 1

        package_dir = str(self.tmp / "pkg")
        x = torch.randn(4)
        compiled = torch.compile(f, backend="eager", package=package_dir)
        compiled(x)
        compiled.save_package()
        torch._dynamo.reset()
        compiled = torch.compile(f, backend="eager", package=package_dir)
        compiled.load_package()
        cannot = PackageError("dispatch key set cannot be rebuilt")
        with mock.patch.object(
            guard_serialization, "_dispatch_key_set_from_raw", side_effect=cannot
        ):
            with self.assertWarnsRegex(UserWarning, "entry for f .* cannot be used: dispatch key set"):
                self.assertEqual(compiled(x), f(x))
            with torch.compiler.set_stance("fail_on_recompile"):
                self.assertEqual(compiled(x), f(x))  # compiled by the first call

    @slowTest
    def test_dynamic_shapes(self):
        case = self.write_case("dynamic", "inductor")
        package = self.tmp / "pkg"
        # The save process sees the out-of-range size too: three entries.
        self.run_process("save", case, package)
        report = self.run_process("load", case, package)
        self.assertEqual(report["results"], [{"same": True, "grads": 0}] * 4)
        self.assertEqual(report["traced_graphs"], 0)
        self.assertEqual(report["compiled_binaries"], [])
        # Without the out-of-range entry, that call must recompile (and raise).
        case.write_text(case.read_text().replace(", (torch.randn(1),)]", "]"))
        self.run_process("save", case, package)
        case.write_text(case.read_text().replace("(torch.randn(3),)]", "(torch.randn(3),), (torch.randn(1),)]"))
        report = self.run_process("load", case, package)
        self.assertEqual(report["results"][:3], [{"same": True, "grads": 0}] * 3)
        self.assertIn("fail_on_recompile", report["results"][3]["error"])

    def test_guard_failure_after_load_recompiles_or_raises(self):
        case = self.write_case("simple", "eager")
        package = self.tmp / "pkg"
        self.run_process("save", case, package)
        # A call the saved guards reject: float64 inputs.
        case.write_text(
            case.read_text().replace(
                "[(torch.randn(8), torch.randn(8))]",
                "[(torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64))]",
            )
        )
        strict = self.run_process("load", case, package)
        self.assertEqual(len(strict["results"]), 1)
        self.assertIn("fail_on_recompile", strict["results"][0]["error"])
        relaxed = self.run_process("load", case, package, CASE_STANCE="default")
        self.assertEqual(relaxed["results"], [{"same": True, "grads": 0}])
        self.assertEqual(relaxed["traced_graphs"], 1)

    def test_unserializable_guard_keeps_entry_out_with_a_warning(self):
        case = self.tmp / "case_local_class.py"
        case.write_text(
            textwrap.dedent(
                """
                import torch
                def make():
                    class Local:
                        pass
                    def f(x, o):
                        return x + (1 if isinstance(o, Local) else 2)
                    return (lambda x: f(x, Local())), [(torch.randn(3),)], dict(backend="eager")
                """
            )
        )
        package = self.tmp / "pkg"
        saved = self.run_process("save", case, package)
        self.assertEqual(len(saved["warnings"]), 1)
        self.assertIn("is not saved", saved["warnings"][0])
        self.assertIn("at module scope", saved["warnings"][0])
        failed = start_code(
            RUNNER,
            "save",
            case,
            self.tmp / "strict",
            env={"TORCH_DYNAMO_PACKAGE_STRICT": "1"},
            cwd=self.tmp,
        ).failure()
        self.assertNotEqual(failed.returncode, 0)
        self.assertIn("PackageError", failed.stderr)


class TestPackageAndReset(PackageTestCase):
    @parametrize("final_backend", ["aot_eager", "inductor"])
    @parametrize("stance", ["default", "fail_on_recompile"])
    def test_reset_between_compiles_of_one_function(self, stance, final_backend):
        from torch._dynamo.utils import counters

        package_dir = str(self.tmp / "pkg")
        x = torch.randn(4, 3)
        compiled = torch.compile(_scaled_sum, backend="eager", package=package_dir)
        compiled(x)
        compiled.save_package()
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(_scaled_sum, backend="eager", package=package_dir)
        compiled.load_package()
        with torch.compiler.set_stance(stance):
            self.assertEqual(compiled(x), _scaled_sum(x))
        self.assertEqual(counters["stats"]["unique_graphs"], 0)
        torch._dynamo.reset()
        # The same code compiled anew, with another backend: nothing of the
        # loaded entry may be left behind. Inductor compiles in a cache dir of its
        # own, its in-memory caches cleared: an earlier test of this process may
        # have left them pointing into a temporary cache dir that is gone.
        # They are cleared again after, as the temporary dir goes with the block.
        from torch._inductor.utils import clear_inductor_caches, fresh_inductor_cache

        try:
            with fresh_inductor_cache():
                recompiled = torch.compile(_scaled_sum, backend=final_backend)
                self.assertEqual(recompiled(x), _scaled_sum(x))
                self.assertEqual(recompiled(x + 1), _scaled_sum(x + 1))
        finally:
            clear_inductor_caches()
        self.assertEqual(counters["stats"]["unique_graphs"], 1)


class TestPackageLoadLeavesGCAlone(PackageTestCase):
    """NOTE: [Loads leave the garbage collector alone]: a load neither turns
    the cyclic collector off nor on, so it runs while a package is read and
    unpickled and while a loaded entry's guards are built, and one the user
    turned off stays off."""

    def setUp(self):
        super().setUp()
        self.package = str(self.tmp / "pkg")
        compiled = torch.compile(_scaled_sum, backend="eager", package=self.package)
        compiled(torch.randn(4, 3))
        compiled.save_package()
        torch._dynamo.reset()
        self.guard_builds_with_gc = []
        self.loads_with_gc = []

    def tearDown(self):
        gc.enable()
        super().tearDown()

    def load_and_call(self):
        """Load the package and call it once, recording the collector's state
        where the package's files are checked and unpickled (load_files) and
        where the first call builds the entry's guards."""
        from torch._dynamo import guards
        from torch._dynamo.package import CompilePackage

        build_guards, load_files = guards.CheckFunctionManager, CompilePackage.load_files

        def recording_build(*args, **kwargs):
            self.guard_builds_with_gc.append(gc.isenabled())
            return build_guards(*args, **kwargs)

        def recording_load_files(package, *args, **kwargs):
            self.loads_with_gc.append(gc.isenabled())
            return load_files(package, *args, **kwargs)

        compiled = torch.compile(_scaled_sum, backend="eager", package=self.package)
        with unittest.mock.patch.object(CompilePackage, "load_files", recording_load_files):
            compiled.load_package()
        x = torch.randn(4, 3)
        with unittest.mock.patch.object(guards, "CheckFunctionManager", recording_build):
            with torch.compiler.set_stance("fail_on_recompile"):
                self.assertEqual(compiled(x), _scaled_sum(x))

    def test_collector_stays_on_through_a_load(self):
        self.assertTrue(gc.isenabled())
        self.load_and_call()
        self.assertEqual(self.loads_with_gc, [True])
        self.assertEqual(self.guard_builds_with_gc, [True])
        self.assertTrue(gc.isenabled())

    def test_collector_turned_off_by_the_user_stays_off(self):
        gc.disable()
        self.load_and_call()
        self.assertEqual(self.loads_with_gc, [False])
        self.assertEqual(self.guard_builds_with_gc, [False])
        self.assertFalse(gc.isenabled())


class TestPackageFormat(PackageTestCase):
    def setUp(self):
        super().setUp()
        self.case = self.write_case("simple", "eager")
        self.package = self.tmp / "pkg"
        self.run_process("save", self.case, self.package)

    def load_error(self):
        from torch._dynamo.package import CompilePackage

        with self.assertRaises(PackageError) as ctx:
            CompilePackage(lambda x: x).load(str(self.package))
        return str(ctx.exception)

    def test_manifest_lists_every_artifact_with_its_sha256(self):
        import hashlib

        manifest = json.loads((self.package / "manifest.json").read_text())
        for field in ("format_version", "torch_version", "overlay_series_hash",
                      "python_version", "cpu_capability", "device"):
            self.assertIn(field, manifest)
        on_disk = sorted(
            str(p.relative_to(self.package)) for p in self.package.rglob("*")
            if p.is_file() and p.name != "manifest.json"
        )
        self.assertEqual(sorted(manifest["files"]), on_disk)
        for name, digest in manifest["files"].items():
            self.assertEqual(hashlib.sha256((self.package / name).read_bytes()).hexdigest(), digest)

    def test_corrupted_artifact(self):
        graph = next((self.package / "graphs").iterdir())
        data = bytearray(graph.read_bytes())
        data[len(data) // 2] ^= 0xFF
        graph.write_bytes(bytes(data))
        self.assertIn("is corrupted (sha256 does not match the manifest)", self.load_error())

    def test_truncated_package(self):
        dynamo_bin = self.package / "dynamo.bin"
        dynamo_bin.write_bytes(dynamo_bin.read_bytes()[:10])
        self.assertIn("dynamo.bin is corrupted", self.load_error())
        (self.package / "manifest.json").write_text('{"format_version": 1, "fil')
        self.assertIn("manifest.json is damaged", self.load_error())
        (self.package / "manifest.json").unlink()
        self.assertIn("is not a torch.compile package", self.load_error())

    def test_tampered_entries_are_refused_before_running(self):
        import hashlib
        import pickle

        class Exploit:
            def __reduce__(self):
                return (os.system, ("echo pwned",))

        data = pickle.dumps([Exploit()])
        (self.package / "dynamo.bin").write_bytes(data)
        manifest = json.loads((self.package / "manifest.json").read_text())
        manifest["files"]["dynamo.bin"] = hashlib.sha256(data).hexdigest()
        (self.package / "manifest.json").write_text(json.dumps(manifest))
        self.assertIn("may only hold builtin containers", self.load_error())

    @parametrize(
        "frame_action",
        [
            "skip",  # a decision where the entry has compiled code
            "run_only",
            "compile_everything",  # no such decision
            None,
            ("skip",),
        ],
    )
    def test_malformed_frame_action_is_refused(self, frame_action):
        # An entry with compiled code carries no frame decision ("" only); a
        # package that says otherwise was not written by a save and is refused
        # before anything of it runs.
        import hashlib
        import pickle

        dynamo_bin = self.package / "dynamo.bin"
        entries = pickle.loads(dynamo_bin.read_bytes())
        self.assertGreaterEqual(len(entries), 1)
        self.assertTrue(entries[0][1], "the first entry has compiled code")
        self.assertEqual(entries[0][-1], "")
        entries[0] = (*entries[0][:-1], frame_action)
        data = pickle.dumps(entries)
        dynamo_bin.write_bytes(data)
        manifest = json.loads((self.package / "manifest.json").read_text())
        manifest["files"]["dynamo.bin"] = hashlib.sha256(data).hexdigest()
        (self.package / "manifest.json").write_text(json.dumps(manifest))
        self.assertIn("dynamo.bin entry 0: field frame_action is malformed", self.load_error())

    @parametrize(
        "field,value",
        [
            ("format_version", 99),
            ("torch_version", "2.13.0"),
            ("overlay_series_hash", "0" * 64),
            ("python_version", "3.12.0"),
            ("cpu_capability", "AVX512_FAKE"),
        ],
    )
    def test_version_mismatch(self, field, value):
        manifest = json.loads((self.package / "manifest.json").read_text())
        manifest[field] = value
        (self.package / "manifest.json").write_text(json.dumps(manifest))
        message = self.load_error()
        self.assertIn(str(value), message)
        if field != "format_version":
            self.assertIn(field, message)

    @unittest.skipIf(torch.cuda.is_available(), "needs a machine without CUDA")
    def test_package_for_a_missing_device(self):
        manifest = json.loads((self.package / "manifest.json").read_text())
        self.assertEqual(manifest["device"], "cpu")
        manifest["device"] = "cpu,cuda"
        (self.package / "manifest.json").write_text(json.dumps(manifest))
        self.assertIn("compiled for device 'cuda'", self.load_error())

    def test_crashed_save_leaves_the_previous_package_intact(self):
        from torch._dynamo import package as package_mod, package_store

        before = (self.package / "manifest.json").read_text()
        real_mkdtemp = tempfile.mkdtemp

        def failing_write(path, files, manifest):
            staging = Path(real_mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
            (staging / "dynamo.bin").write_bytes(b"half")
            raise OSError("disk full")

        pkg = package_mod.CompilePackage(lambda x: x, str(self.package))
        # The package directory format writes it (torch/_dynamo/package_store.py).
        original = package_store._write_atomically
        package_store._write_atomically = lambda path, files, manifest: (
            original(path, {**files, "graphs/x.bin": None}, manifest)  # type: ignore[dict-item]
        )
        try:
            with self.assertRaises(TypeError):
                pkg.save()
        finally:
            package_store._write_atomically = original
        self.assertEqual((self.package / "manifest.json").read_text(), before)
        leftovers = [p.name for p in self.package.parent.iterdir() if p.name.startswith(".pkg")]
        self.assertEqual(leftovers, [])


class TestTamperedGeneratedCalls(PackageTestCase):
    """What a package saves of the functions Dynamo generates (its replay of
    random calls, its NumPy wrappers) names what they call; a package naming
    anything else is refused at load, before anything runs."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        # Each case is saved once; every test tampers with a copy of it.
        cls.saved_cases = Path(tempfile.mkdtemp(prefix="package-tamper-"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.saved_cases, ignore_errors=True)
        super().tearDownClass()

    def saved(self, name):
        """The case ``name`` and a copy of its package, saved by a fresh process."""
        original = self.saved_cases / name
        case = original / f"case_{name}_eager.py"
        if not case.exists():
            original.mkdir()
            self.write_case(name, "eager", directory=original)
            saved = self.run_process("save", case, original / "pkg")
            self.assertEqual(saved["warnings"], [])
            self.assertGreaterEqual(saved["entries"], 1)
        package = self.tmp / "pkg"
        shutil.copytree(original / "pkg", package)
        return case, package

    def rewrite(self, package, name, edit):
        """Rewrite the pickle ``name`` of ``package`` (this test's own data) with
        ``edit``, keeping the manifest's sha256 right, as a forger would."""
        import hashlib
        import pickle

        path = package / name
        data = pickle.dumps(edit(pickle.loads(path.read_bytes())))
        path.write_bytes(data)
        manifest = json.loads((package / "manifest.json").read_text())
        manifest["files"][name] = hashlib.sha256(data).hexdigest()
        (package / "manifest.json").write_text(json.dumps(manifest))

    def load(self, case, package):
        """Load ``package`` for the case's function (in this process: a refused
        load installs nothing)."""
        import importlib.util
        import sys

        from torch._dynamo.package import CompilePackage

        spec = importlib.util.spec_from_file_location("pkg_case", case)
        module = importlib.util.module_from_spec(spec)
        with unittest.mock.patch.dict(sys.modules, {"pkg_case": module}):
            spec.loader.exec_module(module)
            CompilePackage(module.f).load(str(package))

    @parametrize(
        "call",
        [
            ("seed", (0,), ()),  # a function of random, not one Dynamo replays
            ("system", ("echo pwned",), ()),
            ("uniform", ("0", 1), ()),  # an argument that is not a number
            ("uniform", (0,), (("b", [1]),)),
            ("uniform", (0, 1)),  # malformed
        ],
    )
    def test_random_call_of_another_function_is_refused(self, call):
        case, package = self.saved("random_calls")
        self.load(case, package)  # untampered, it loads

        def edit(entries):
            edited = []
            for fields in entries:
                refs = dict(fields[4])
                for name, ref in refs.items():
                    if ref[0] == "random_values":
                        refs[name] = ("random_values", (call, *ref[1][1:]))
                edited.append((*fields[:4], refs, *fields[5:]))
            self.assertNotEqual(edited, entries)
            return edited

        self.rewrite(package, "dynamo.bin", edit)
        with self.assertRaisesRegex(PackageError, "random call|random\\.uniform"):
            self.load(case, package)

    @parametrize(
        "target",
        [
            ("numpy_operator", "builtins", "eval"),
            ("numpy_operator", "os", "system"),
            ("numpy_method", "ndarray", "__class__"),
            ("numpy_method", "os", "max"),
            ("numpy", "os", "system"),
            ("numpy", "torch._numpy", "load"),
            ("numpy_other", "torch._numpy", "arange"),
        ],
    )
    def test_numpy_wrapper_of_another_function_is_refused(self, target):
        case, package = self.saved("numpy_wrappers")
        self.load(case, package)
        tags = ("numpy", "numpy_operator", "numpy_method")

        def edit(payload):
            nodes = payload["graph"]["nodes"]
            # A call of a wrapper of the same kind (of any, for an unknown tag).
            index = next(
                i for i, (op, _, called, _, _) in enumerate(nodes)
                if op == "call_function" and len(called) == 3 and (called[0] == target[0] or target[0] not in tags)
            )
            op, name, _, args, kwargs = nodes[index]
            nodes[index] = (op, name, target, args, kwargs)
            return payload

        graph = next((package / "graphs").iterdir())
        self.rewrite(package, f"graphs/{graph.name}", edit)
        with self.assertRaisesRegex(PackageError, "not a function a packaged graph may call|malformed target"):
            self.load(case, package)


def _gelu_affine(x):
    return torch.nn.functional.gelu(x * 2.0) + 1.0


class TestPackagedGraphKernels(PackageTestCase):
    """A package holds the CPU kernels Inductor loaded for its graphs, as the
    prebuilt-kernel hook heard them (NOTE: [Kernels of a packaged graph])."""

    def save(self, name):
        compiled = torch.compile(_gelu_affine, backend="inductor", package=str(self.tmp / name))
        x = torch.randn(8)
        self.assertEqual(compiled(x), _gelu_affine(x))
        compiled.save_package()
        torch._dynamo.reset()
        return self.tmp / name

    def saved_kernels(self, package):
        from torch._dynamo.package_trust import load_inductor_payload

        listed = []
        for path in sorted((package / "graphs").iterdir()):
            data = path.read_bytes()
            if data[:2] == b"PK":
                listed.append(load_inductor_payload(data, path.name)["cpp_kernels"])
        held = sorted(p.stem for p in (package / "kernels").iterdir())
        return listed, held

    def test_kernels_of_a_compile_and_of_a_cache_hit(self):
        from torch._inductor.utils import fresh_inductor_cache

        with fresh_inductor_cache():
            generated = self.saved_kernels(self.save("generated"))
            # The same graph again: Inductor reads its code from the FX graph
            # cache and loads the kernels it already built.
            from_cache = self.saved_kernels(self.save("from_cache"))
        listed, held = generated
        self.assertEqual(len(listed), 1)
        self.assertGreater(len(listed[0]), 0)
        self.assertEqual(sorted(listed[0]), held)
        self.assertEqual(from_cache, generated)

    def test_the_kernel_list_is_checked_at_load(self):
        from torch._dynamo.package_artifacts import _check_packaged_kernels, _KernelRedirect

        digest = "ab" * 32
        redirect = _KernelRedirect({digest: "/nonexistent/kernel.so"})
        _check_packaged_kernels({"cpp_kernels": [digest]}, redirect, "g")
        for payload, message in [
            ({}, "has no list of the CPU kernels it loads"),
            ({"cpp_kernels": [digest, 5]}, "has no list of the CPU kernels it loads"),
            ({"cpp_kernels": ["cd" * 32]}, "which is not in its package"),
        ]:
            with self.assertRaisesRegex(PackageError, message):
                _check_packaged_kernels(payload, redirect, "g")

    def test_a_kernel_not_on_the_list_is_refused_when_the_graph_loads(self):
        from torch._dynamo.package_artifacts import _KernelRedirect
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        redirect = _KernelRedirect({})
        with self.assertRaisesRegex(PackageError, "which its package does not hold"):
            redirect.lookup(CppPythonBindingsCodeCache, ["float*"], 'extern "C" void kernel(float* a) {}')


# Each torch.compile mode / option of OPTION_CASES on a tiny module: compiled
# and saved by one process (torch._dynamo.reset() between options), loaded by a
# fresh one with an empty inductor cache. A custom backend gets its options as
# keyword arguments; its compiled callable keeps them and serializes them.
OPTIONS_RUNNER = r'''
import json, os, pickle, sys, warnings
import torch
from torch._dynamo.aot_compile_types import SerializableCallable
from torch.testing._internal.fresh_process import write_report


class ShiftedGraph(SerializableCallable):
    """A custom backend's output: the graph plus the option it was given."""

    def __init__(self, graph_module, shift):
        self.graph_module, self.shift = graph_module, shift

    @classmethod
    def serialize_compile_artifacts(cls, fn):
        gm = torch.fx.GraphModule(fn.graph_module, fn.graph_module.graph)
        return pickle.dumps((gm, fn.shift))

    @classmethod
    def deserialize_compile_artifacts(cls, data):
        return cls(*pickle.loads(data))

    def __call__(self, *args):
        return [out + self.shift for out in self.graph_module(*args)]


def shifting_backend(gm, example_inputs, options=None):
    return ShiftedGraph(gm, (options or {}).get("shift", 0.0))


sys.modules["options_runner"] = sys.modules["__main__"]
ShiftedGraph.__module__ = "options_runner"

OPTION_CASES = {OPTION_CASES}


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


mode, where = sys.argv[1:3]
torch._dynamo.config.package_strict = os.environ.get("PACKAGE_STRICT") == "1"
report = {}


def binaries():
    cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
    return [f for _, _, files in os.walk(cache) for f in files if f.endswith(".so")]


seen = set(binaries())
for name, (kwargs, no_grad, shift) in OPTION_CASES.items():
    torch._dynamo.reset()
    torch.manual_seed(0)
    module = Block().eval()
    kwargs = dict(kwargs)
    if kwargs.get("backend") == "shifting":
        kwargs["backend"] = shifting_backend
    compiled = torch.compile(module, package=os.path.join(where, name), **kwargs)
    calls = [torch.randn(4, 8), torch.randn(6, 8)] if kwargs.get("dynamic") else [torch.randn(4, 8)]
    grad_mode = torch.no_grad() if no_grad else torch.enable_grad()
    got = {}
    if mode == "save":
        with warnings.catch_warnings(record=True) as caught, grad_mode:
            warnings.simplefilter("always")
            try:
                for x in calls:
                    compiled(x)
                compiled.save_package()
                got["saved"] = True
            except Exception as e:
                got["error"] = f"{type(e).__name__}: {e}"[:500]
        got["warnings"] = [str(w.message) for w in caught if "package" in str(w.message)]
        manifest_path = os.path.join(where, name, "manifest.json")
        if os.path.exists(manifest_path):
            with open(manifest_path) as f:
                manifest = json.load(f)
            got["entries"] = manifest["entries"]
            got["compile_options"] = manifest["compile_options"]
    else:
        from torch._dynamo.utils import counters

        counters.clear()
        with torch.compiler.set_stance("fail_on_recompile"), grad_mode:
            try:
                compiled.load_package()
                got["same"] = all(
                    bool(torch.allclose(compiled(x), module(x) + shift, atol=1e-5)) for x in calls
                )
            except Exception as e:
                got["error"] = f"{type(e).__name__}: {e}"[:500]
        got["traced_graphs"] = counters["stats"]["unique_graphs"]
        # C++ binaries built while this case loaded and ran
        got["compiled_binaries"] = sorted(set(binaries()) - seen)
        seen.update(got["compiled_binaries"])
    report[name] = got
write_report(report)
'''

# name -> (torch.compile kwargs, run under no_grad, shift the output by)
OPTION_CASES = {
    "mode_default": (dict(mode="default"), True, 0.0),
    "mode_reduce_overhead": (dict(mode="reduce-overhead"), True, 0.0),
    "mode_max_autotune": (dict(mode="max-autotune"), True, 0.0),
    "mode_max_autotune_no_cudagraphs": (dict(mode="max-autotune-no-cudagraphs"), True, 0.0),
    "fullgraph": (dict(fullgraph=True), False, 0.0),
    "dynamic_true": (dict(dynamic=True), True, 0.0),
    "dynamic_false": (dict(dynamic=False), True, 0.0),
    "dynamic_none": (dict(dynamic=None), True, 0.0),
    "cpp_wrapper": (dict(options={"cpp_wrapper": True}), True, 0.0),
    "epilogue_fusion": (dict(options={"epilogue_fusion": False}), True, 0.0),
    "coordinate_descent_tuning": (dict(options={"coordinate_descent_tuning": True}), True, 0.0),
    "custom_backend_options": (dict(backend="shifting", options={"shift": 0.5}), True, 0.5),
    # frozen inference (more cases, folded constants: test_package_freezing.py)
    "freezing": (dict(options={"freezing": True}), True, 0.0),
}
# Refused at save: the warning names the option.
REFUSED_OPTION_CASES = {
    # with gradients on Inductor does not freeze, but AOTAutograd still caches nothing
    "freezing_with_grad": (dict(options={"freezing": True}), False, 0.0),
    "fx_graph_cache_off": (dict(options={"fx_graph_cache": False}), True, 0.0),
}
REFUSED_OPTION_NAMES = {"freezing_with_grad": "'freezing': True", "fx_graph_cache_off": "'fx_graph_cache': False"}


class TestPackageCompileOptions(PackageTestCase):
    """Every mode and common option round-trips or is refused at save, by name."""

    reports: dict = {}

    def run_options(self, cases, **env):
        key = tuple(sorted(cases)) + tuple(sorted(env.items()))
        if key in TestPackageCompileOptions.reports:
            return TestPackageCompileOptions.reports[key]
        where = Path(tempfile.mkdtemp(prefix="package-options-"))
        self.addCleanup(shutil.rmtree, where, True)
        source = OPTIONS_RUNNER.replace("{OPTION_CASES}", repr(cases))
        reports = {}
        for mode in ("save", "load"):
            # The save may reuse a warm cache; the load gets an empty one.
            save_cache = {"TORCHINDUCTOR_CACHE_DIR": self.save_cache} if mode == "save" else {}
            reports[mode] = run_code(
                source,
                mode,
                where,
                env={**save_cache, **env},
                cwd=where,
                fresh_inductor_cache=mode != "save",
            )
        TestPackageCompileOptions.reports[key] = reports
        return reports

    @parametrize("name", list(OPTION_CASES))
    def test_option_round_trips(self, name):
        reports = self.run_options(OPTION_CASES)
        saved, loaded = reports["save"][name], reports["load"][name]
        self.assertEqual((saved.get("error"), saved["warnings"]), (None, []))
        self.assertGreaterEqual(saved["entries"], 1)
        self.assertEqual((loaded["same"], loaded["traced_graphs"]), (True, 0))
        # The package carries the kernels of Python wrapper code (cpp_pybinding);
        # cpp_wrapper's generated C++ wrapper module and its kernels are built
        # again at load (no Dynamo trace, no Inductor codegen, but gcc runs).
        if name != "cpp_wrapper":
            self.assertEqual(loaded["compiled_binaries"], [])
        # the manifest records the options the graphs were compiled with
        recorded = saved["compile_options"]
        for option, value in OPTION_CASES[name][0].get("options", {}).items():
            if option in recorded:  # an Inductor config name
                self.assertEqual(recorded[option], repr(value))
            else:  # passed to a custom backend as options=
                self.assertIn(f"{option!r}: {value!r}", recorded["options"])

    @parametrize("name", list(REFUSED_OPTION_CASES))
    def test_option_refused_at_save_with_a_warning_naming_it(self, name):
        saved = self.run_options(REFUSED_OPTION_CASES)["save"][name]
        self.assertIsNone(saved.get("error"))
        self.assertEqual(len(saved["warnings"]), 1, saved["warnings"])
        self.assertIn(REFUSED_OPTION_NAMES[name], saved["warnings"][0])
        self.assertEqual(saved["entries"], 0)

    def test_option_refused_at_save_is_an_error_with_package_strict(self):
        saved = self.run_options(
            {"freezing_with_grad": REFUSED_OPTION_CASES["freezing_with_grad"]}, PACKAGE_STRICT="1"
        )["save"]["freezing_with_grad"]
        self.assertIn("PackageError", saved["error"])
        self.assertIn("'freezing': True", saved["error"])


class TestPackageCallbackChain(torch._dynamo.test_case.TestCase):
    """What the cache lookup of every compiled call walks (NOTE: [A package's
    backend links straight to the cache key] in torch/_dynamo/package.py)."""

    @staticmethod
    def links(callback):
        walked = []
        while hasattr(callback, "_torchdynamo_orig_callable"):
            walked.append(type(callback).__name__)
            callback = callback._torchdynamo_orig_callable
        return walked, callback

    @parametrize("backend", ["eager", "aot_eager", "inductor"])
    def test_lookup_walks_as_many_links_as_a_plain_compile(self, backend):
        from torch._dynamo.eval_frame import innermost_fn

        model = torch.nn.Linear(2, 2)
        with tempfile.TemporaryDirectory() as where:
            plain = torch.compile(model, backend=backend)
            packaged = torch.compile(model, backend=backend, package=where)
            plain_links, plain_key = self.links(plain.dynamo_ctx.callback)
            package_links, package_key = self.links(packaged.dynamo_ctx.callback)
        self.assertEqual(len(package_links), len(plain_links))
        self.assertIs(type(package_key), type(plain_key))
        # The links above the backend are where Dynamo reads them.
        self.assertEqual(package_links[:3], ["CatchErrorsWrapper", "PackageAwareConvertFrame", "RecordingBackend"])
        recording = packaged.dynamo_ctx.callback._torchdynamo_orig_callable._torchdynamo_orig_callable
        self.assertIs(recording._torchdynamo_orig_callable, package_key)
        self.assertIs(innermost_fn(recording.backend), package_key)

    def test_entries_keyed_on_the_backend_serve_a_package_and_a_plain_compile(self):
        model = torch.nn.Linear(2, 2)
        x = torch.randn(3, 2)
        with tempfile.TemporaryDirectory() as where:
            packaged = torch.compile(model, backend="eager", package=where)
            packaged(x)
            graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
            plain = torch.compile(model, backend="eager")
            with torch.compiler.set_stance("fail_on_recompile"):
                self.assertEqual(plain(x), model(x))
            self.assertEqual(torch._dynamo.utils.counters["stats"]["unique_graphs"], graphs)


class TestLoadedGraphCalls(PackageTestCase):
    """How a loaded entry's bytecode calls its graphs (NOTE: [A packaged graph's
    frame is skipped by Dynamo with all it calls] in
    torch/_dynamo/package_artifacts.py)."""

    def load(self, backend):
        package_dir = str(self.tmp / "pkg")
        x = torch.randn(4, 3)
        compiled = torch.compile(_scaled_sum, backend=backend, package=package_dir)
        compiled(x)
        compiled.save_package()
        torch._dynamo.reset()
        compiled = torch.compile(_scaled_sum, backend=backend, package=package_dir)
        before = set(globals())
        compiled.load_package()
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(compiled(x), _scaled_sum(x))
        # What this load installed in _scaled_sum's module for its graph.
        (installed,) = [globals()[name] for name in set(globals()) - before if name.startswith("__compiled_fn")]
        return compiled, installed, x

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_the_bytecode_calls_the_packaged_graph_itself(self, backend):
        from torch._dynamo.package_artifacts import _PackagedAOTEagerGraph, _PackagedInductorGraph

        _, graph, _ = self.load(backend)
        kind = _PackagedAOTEagerGraph if backend == "aot_eager" else _PackagedInductorGraph
        self.assertIsInstance(graph, kind)
        self.assertFalse(hasattr(graph, "_torchdynamo_disable"))

    def test_an_eager_graph_is_called_through_disable(self):
        # The eager backend's graph is a GraphModule's forward, code this
        # module does not own.
        _, graph, _ = self.load("eager")
        self.assertTrue(graph._torchdynamo_disable)
        self.assertIsInstance(graph._torchdynamo_orig_callable.__self__, torch.fx.GraphModule)

    def test_dynamo_sees_no_frame_under_a_packaged_graph(self):
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        compiled, graph, x = self.load("aot_eager")
        calls = []

        def through_user_code(real):
            # A frame Dynamo would compile (a user function taking tensors):
            # under fail_on_recompile, seeing it raises.
            def user_frame(*args):
                calls.append(len(args))
                return real(*args)

            return user_frame

        graph.compiled = {key: through_user_code(fn) for key, fn in graph.compiled.items()}
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(compiled(x), _scaled_sum(x))
        self.assertEqual(len(calls), 1)
        # Without the code's exec strategy, the hook reaches the user frame.
        call_code = type(graph).__call__.__code__
        set_code_exec_strategy(call_code, FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT))
        try:
            with torch.compiler.set_stance("fail_on_recompile"):
                with self.assertRaisesRegex(RuntimeError, "Detected recompile.*user_frame"):
                    compiled(x)
        finally:
            set_code_exec_strategy(call_code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_a_call_patched_onto_the_graph_class_runs_under_disable(self, backend):
        # A profiler timing each graph call replaces the class's __call__ with
        # a function of its own before the load: Dynamo must not compile that
        # frame (under fail_on_recompile, seeing it raises), as it would not
        # under a fresh compile's disable.
        from torch._dynamo import package_artifacts

        kind = package_artifacts._PackagedAOTEagerGraph if backend == "aot_eager" else package_artifacts._PackagedInductorGraph
        real_call = kind.__call__
        timed = []

        def timed_graph_call(graph, *args):
            timed.append(isinstance(graph, kind))
            return real_call(graph, *args)

        with unittest.mock.patch.object(kind, "__call__", timed_graph_call):
            compiled, graph, x = self.load(backend)
            with torch.compiler.set_stance("fail_on_recompile"):
                self.assertEqual(compiled(x), _scaled_sum(x))
        self.assertTrue(graph._torchdynamo_disable)
        self.assertEqual(timed, [True, True])

    def test_a_graph_that_raises_leaves_dynamo_as_it_was(self):
        from torch._dynamo.testing import CompileCounter

        compiled, installed, x = self.load("aot_eager")
        graph = getattr(installed, "_torchdynamo_orig_callable", installed)
        kept = graph.compiled

        def raising(*args):
            raise ValueError("from the graph")

        graph.compiled = dict.fromkeys(kept, raising)
        with self.assertRaisesRegex(ValueError, "from the graph"):
            compiled(x)
        graph.compiled = kept
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(compiled(x), _scaled_sum(x))
        counter = CompileCounter()
        other = torch.compile(_write_into, backend=counter)
        other(torch.zeros(4, 3), torch.ones(3))
        self.assertEqual(counter.frame_count, 1)


instantiate_parametrized_tests(TestPackage)
instantiate_parametrized_tests(TestLoadedGraphCalls)
instantiate_parametrized_tests(TestPackageCallbackChain)
instantiate_parametrized_tests(TestPackageCompileOptions)
instantiate_parametrized_tests(TestPackageFormat)
instantiate_parametrized_tests(TestTamperedGeneratedCalls)
instantiate_parametrized_tests(TestPackageAndReset)


class TestBytecodeConstants(torch._dynamo.test_case.TestCase):
    """NOTE: [Constants of compiled bytecode]: what Dynamo writes with LOAD_CONST
    and marshal cannot save round-trips; hand-made encodings are refused."""

    CONSTANTS = {
        "size": torch.Size([1, 1]),
        "device": torch.device("cpu"),
        "device_index": torch.device("cuda", 1),
        "dtype": torch.bfloat16,
        "layout": torch.sparse_coo,
        "memory_format": torch.channels_last,
        "finfo": torch.finfo(torch.float16),
        "enum": inspect.Parameter.KEYWORD_ONLY,
        "class": torch.nn.Linear,
        "slice": slice(None, torch.Size([2]), None),
        "tuple": (1, torch.float32, (torch.device("cpu"), "x")),
        "frozenset": frozenset({torch.float32, torch.int64}),
    }

    def _code_with(self, value):
        code = compile("a = 1\ndef f():\n    return 2\n", "<t>", "exec")
        nested = next(c for c in code.co_consts if isinstance(c, types.CodeType))
        nested = nested.replace(co_consts=(*nested.co_consts, value))
        consts = tuple(nested if isinstance(c, types.CodeType) else c for c in code.co_consts)
        return code.replace(co_consts=(*consts, value))

    def test_each_constant_round_trips(self):
        from torch._dynamo.package_artifacts import dump_code, load_code

        for name, value in self.CONSTANTS.items():
            with self.subTest(name):
                loaded = load_code(dump_code(self._code_with(value)), "test")
                self.assertEqual(loaded.co_consts[-1], value)
                self.assertIs(type(loaded.co_consts[-1]), type(value))
                nested = next(c for c in loaded.co_consts if isinstance(c, types.CodeType))
                self.assertEqual(nested.co_consts[-1], value)

    def test_marshallable_code_keeps_marshal_bytes(self):
        import marshal

        from torch._dynamo.package_artifacts import dump_code

        code = self._code_with(3)
        self.assertEqual(dump_code(code), marshal.dumps(code))

    def test_unsaveable_constant_is_named(self):
        from torch._dynamo.package_artifacts import dump_code

        with self.assertRaisesRegex(PackageError, "threading.Lock|_thread.lock"):
            import threading

            dump_code(self._code_with(threading.Lock()))

    def test_hand_made_encodings_are_refused(self):
        import marshal

        from torch._dynamo.package_artifacts import _CODE_WITH_CONSTANTS, load_code

        code = self._code_with(None)
        last = len(code.co_consts) - 1
        hostile = [
            ("class", "os", "system"),  # not a class
            ("class", "subprocess", "Popen.__init__"),
            ("enum", "os", "environ", "x"),
            ("dtype", "load"),  # torch.load is not a dtype
            ("dtype", "_dynamo"),  # never imported through torch's __getattr__
            ("size", ("1",)),
            ("device", "no-such-device", None),
            ("unknown-kind", 1),
            ("const", [1]),
            ("tuple", (("class", "builtins", "eval"),)),
        ]
        for encoded in hostile:
            with self.subTest(encoded):
                data = _CODE_WITH_CONSTANTS + marshal.dumps((code, (((last,), encoded),)))
                with self.assertRaises(PackageError):
                    load_code(data, "test")
        for table in ((((last + 5,), ("size", (1,))),), (((0,), ("size", (1,))),), "x", ((("a",), 1),)):
            with self.subTest(table):
                data = _CODE_WITH_CONSTANTS + marshal.dumps((code, table))
                with self.assertRaises(PackageError):
                    load_code(data, "test")
        with self.assertRaises(PackageError):
            load_code(_CODE_WITH_CONSTANTS + b"\xff\x00garbage", "test")

    def test_hand_made_graph_calling_eval_is_refused(self):
        from torch._dynamo.package_artifacts import _fx_graph_as_data, _fx_graph_from_data

        gm = torch.fx.symbolic_trace(lambda x: torch.relu(x) + 1)
        data = _fx_graph_as_data(gm)
        self.assertIsNotNone(data)
        self.assertEqual(_fx_graph_from_data(data, "g")(torch.ones(2)).tolist(), [2.0, 2.0])
        hostile = (
            ("builtins", "eval"),
            ("os", "system"),
            ("torch", "load"),
            # NOTE: [Modules a graph target is found through]
            ("torch", "os.system"),  # torch's namespace holds the os module
            ("torch", "hub.load_state_dict_from_url"),
            ("torch", "utils.cpp_extension.load_inline"),
            ("_operator", "attrgetter"),
            ("_operator", "call"),
            ("numpy_operator", "torch", "os.system"),
            ("numpy", "torch._numpy", "_util.torch.os.system"),
        )
        for target in hostile:
            with self.subTest(target):
                nodes = [
                    (op, name, target if op == "call_function" else t, a, k)
                    for op, name, t, a, k in data["nodes"]
                ]
                with self.assertRaisesRegex(PackageError, "not a function a packaged graph may call"):
                    _fx_graph_from_data({"nodes": nodes, "attrs": {}}, "g")

    def test_graph_attribute_reads_are_public_and_constant(self):
        from torch._dynamo.package_artifacts import _fx_graph_as_data, _fx_graph_from_data

        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        transposed = graph.call_function(getattr, (x, "T"))
        graph.output(graph.call_method("add", (transposed, 1)))
        data = _fx_graph_as_data(torch.fx.GraphModule({}, graph))
        self.assertIsNotNone(data)
        a = torch.arange(6.0).reshape(2, 3)
        self.assertEqual(_fx_graph_from_data(data, "g")(a), a.T + 1)

        def with_node(index, op, target, args):
            nodes = list(data["nodes"])
            _, name, _, _, kwargs = nodes[index]
            nodes[index] = (op, name, target, args, kwargs)
            return {"nodes": nodes, "attrs": {}}

        hostile = {
            "dunder attribute": with_node(1, "call_function", ("builtins", "getattr"), ("tuple", (("node", "x"), ("const", ("const", "__class__"))))),
            "private attribute": with_node(1, "call_function", ("builtins", "getattr"), ("tuple", (("node", "x"), ("const", ("const", "_cdata"))))),
            "attribute from a node": with_node(1, "call_function", ("builtins", "getattr"), ("tuple", (("node", "x"), ("node", "x")))),
            "dunder method": with_node(2, "call_method", "__getattribute__", ("tuple", (("node", "x"), ("const", ("const", "__class__"))))),
        }
        for what, damaged in hostile.items():
            with self.subTest(what):
                with self.assertRaisesRegex(PackageError, "attribute that is not a public one|may not call"):
                    _fx_graph_from_data(damaged, "g")
        numpy_calls = {
            "a function outside torch._numpy": ("numpy", "os", "system"),
            "NumPy's own": ("numpy", "numpy", "sqrt"),
            "an unsafe name": ("numpy", "torch._numpy", "load"),
        }
        for what, target in numpy_calls.items():
            with self.subTest(what):
                with self.assertRaisesRegex(PackageError, "not a function a packaged graph may call"):
                    _fx_graph_from_data(with_node(1, "call_function", target, ("tuple", (("node", "x"),))), "g")
        # Saving never writes such a graph as data.
        graph = torch.fx.Graph()
        x = graph.placeholder("x")
        graph.output(graph.call_function(getattr, (x, "__class__")))
        self.assertIsNone(_fx_graph_as_data(torch.fx.GraphModule({}, graph)))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
