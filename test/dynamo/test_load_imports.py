# Owner(s): ["module: dynamo"]
"""What loading precompiled code imports: the runtime, not the compiler.

A compile package and an aot_compile'd function are saved by one interpreter and
loaded by a FRESH one with an empty TORCHINDUCTOR_CACHE_DIR. After the load and
the first call under ``set_stance("fail_on_recompile")``, none of
:data:`COMPILE_ONLY_MODULES` may have been imported. Then a call that misses
compiles in that same process, imports them, and must give eager's result. Each
load logs one INFO line saying what it loaded and what it cost.
"""

import json
import shutil
import tempfile
import textwrap
import types
import unittest
from pathlib import Path

import torch._dynamo.test_case
from torch.testing._internal.common_utils import slowTest
from torch.testing._internal.fresh_process import run_code
from torch.utils._triton import has_triton_package


# NOTE: [Compile-only modules]
# Invariant: a process that loads a compile package (of a torch.nn.Module, of a
# plain function, of a built-in torch module) or an aot_compile'd function, and
# runs it, imports the runtime and nothing that only compiling needs. Loaded
# code is the generated wrapper and the kernels' .so files; before a compile
# starts, Dynamo is asked only whether a frame is skipped. So none of these is
# imported by such a process:
# - Inductor's compiler: compile_fx, lowering and its mm templates, pattern
#   matching and the FX passes, the scheduler and codegen (with the hipify
#   tables the C++ wrapper imports), the compile workers (not started either),
#   the multi-kernel code generator, and filelock;
# - Dynamo's tracer: symbolic_convert, output_graph and the variable trackers
#   (with the trace_wrapped custom op and torch.onnx), the torch object rule map
#   (whose names import symbolic_shapes, torch.distributed.tensor and the rest),
#   torch._numpy with numpy.random, cProfile and pstats, profile-guided code
#   state (torch._dynamo.pgo), replay records, torch._dynamo.testing;
# - AOTAutograd's compile side, the aot_eager backend, networkx (one
#   partitioner solver) and torch.distributed.fsdp (one FSDP2 method the
#   tracer recognises);
# - sympy, torch.utils._sympy and symbolic_shapes, which static shapes never
#   need; torch.distributed.tensor (DTensor placements an EQUALS_MATCH guard
#   might compare with); triton, for a package without Triton kernels.
# The list below is what the tests check; a module joins it when a load stops
# importing it, and a test that fails names the modules a load imported.
COMPILE_ONLY_MODULES = [
    "torch._inductor.compile_fx",
    "torch._inductor.lowering",
    "torch._inductor.select_algorithm",
    "torch._inductor.pattern_matcher",
    "torch._inductor.decomposition",
    "torch._inductor.fx_passes.joint_graph",
    "torch._inductor.fx_passes.post_grad",
    "torch._inductor.kernel.mm",
    "torch._inductor.graph",
    "torch._inductor.ir",
    "torch._inductor.scheduler",
    "torch._inductor.codegen.wrapper",
    "torch._inductor.codegen.memory_planning",
    "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.cpp_wrapper_cpu",
    "torch.utils.hipify.hipify_python",
    "networkx",
    "torch._functorch._activation_checkpointing.graph_info_provider",
    "torch.distributed.fsdp",
    "torch.distributed.fsdp._fully_shard",
    "sympy",
    "torch.utils._sympy.functions",
    "torch.utils._sympy.value_ranges",
    "torch.fx.experimental.symbolic_shapes",
    "torch.fx.passes._tensorify_python_scalars",
    "torch._inductor.codegen.common",
    "torch.distributed.tensor",
    "torch.distributed.tensor._api",
    "filelock",
    "torch.utils._filelock",
    "torch._inductor.codegen.multi_kernel",
    "triton",
    "torch._dynamo.testing",
    "functorch.compile",
    "torch._functorch.aot_autograd",
    "torch._dynamo.symbolic_convert",
    "torch._dynamo.output_graph",
    "torch._dynamo.variables",
    "torch._dynamo.variables.builder",
    "torch._dynamo.variables.torch",
    "torch._dynamo.codegen",
    "torch._dynamo.side_effects",
    "torch._dynamo._trace_wrapped_higher_order_op",
    "torch.onnx",
    "torch._numpy",
    "numpy.random",
    "cProfile",
    "pstats",
    "torch._dynamo.pgo",
    "torch._dynamo.replay_record",
]

MODEL = """
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 32)
        self.linear2 = torch.nn.Linear(32, 8)
        self.scale = 2  # an int attribute: an EQUALS_MATCH guard

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x))) * self.scale


def make():
    torch.manual_seed(0)
    return MLP().eval()


# An MLP called with keyword options that it passes on, as transformers'
# models do: Dynamo guards the keys of the frame's **options dict
# (DICT_KEYS_MATCH, order ignored), through sources that index it by
# constant keys.
class KeywordMLP(MLP):
    def forward(self, x, **options):
        return self.rescale(super().forward(x), **options)

    def rescale(self, out, scale, shift):
        return out * scale + shift


def make_keyword():
    torch.manual_seed(0)
    return KeywordMLP().eval()


# The MLP in training mode: a loaded entry runs its saved backward too.
def make_training():
    torch.manual_seed(0)
    return MLP()


# The keyword arguments each kind of package is called with.
def package_options(kind):
    return {"scale": 2.0, "shift": 0.5} if kind == "dynamic-package" else {}


def scaled_relu(x):
    return torch.relu(x * 3.0 + 1.0).sum(dim=-1)


def make_sequential():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
    ).eval()


# What a package of each kind compiles: a user's module, a plain function, a
# torch nn module, the user's module with dynamic shapes.
def package_target(kind):
    return {
        "package": make,
        "function-package": lambda: scaled_relu,
        "torch-module-package": make_sequential,
        "dynamic-package": make_keyword,
        "training-package": make_training,
    }[kind]()


def grads(model):
    return [p.grad.clone() for p in model.parameters()]
"""

SAVE = """
import sys
import torch
import load_imports_model

model = load_imports_model.make()
x = torch.randn(4, 16)
training = sys.argv[1] == "training-package"
with torch.set_grad_enabled(training):
    if sys.argv[1].endswith("package"):
        target = load_imports_model.package_target(sys.argv[1])
        compiled = torch.compile(
            target, package=sys.argv[2], dynamic=sys.argv[1].startswith("dynamic")
        )
        out = compiled(x, **load_imports_model.package_options(sys.argv[1]))
        if training:
            out.sum().backward()
        compiled.save_package()
    else:
        with torch._dynamo.config.patch("enable_aot_compile", True):
            fn = torch.compile(model, fullgraph=True).forward.aot_compile(((x,), {}))
        fn.save_compiled_function(sys.argv[2])
from torch.testing._internal.fresh_process import write_report
write_report("saved")
"""

LOAD = """
import json, logging, os, sys
import torch
import load_imports_model


class KeepMessages(logging.Handler):
    def __init__(self):
        super().__init__()
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def child_processes():
    children = []
    for task in os.listdir(f"/proc/{os.getpid()}/task"):
        with open(f"/proc/{os.getpid()}/task/{task}/children") as f:
            children += f.read().split()
    return children


package_messages = KeepMessages()
logging.getLogger("torch._dynamo.package").addHandler(package_messages)
logging.getLogger("torch._dynamo.package").setLevel(logging.INFO)
compile_only = json.loads(sys.argv[3])
dynamic = sys.argv[1].startswith("dynamic")
training = sys.argv[1] == "training-package"
model = load_imports_model.make()
# A dynamic package is called at a batch size its save never saw: its entry's
# shape-env guards decide.
x = torch.randn(9 if dynamic else 4, 16)
report = {}
with torch.set_grad_enabled(training):
    expected = model(x)
    if sys.argv[1].endswith("package"):
        model = load_imports_model.package_target(sys.argv[1])
        options = load_imports_model.package_options(sys.argv[1])
        expected = model(x, **options)
        if training:
            # The eager gradients, then the loaded backward's.
            expected.sum().backward()
            expected_grads = load_imports_model.grads(model)
            model.zero_grad()
        compiled = torch.compile(model, package=sys.argv[2], dynamic=dynamic)
        compiled.load_package()
        with torch.compiler.set_stance("fail_on_recompile"):
            out = compiled(x, **options)
            if training:
                out.sum().backward()
                report["grads_same"] = all(
                    torch.allclose(a, b)
                    for a, b in zip(load_imports_model.grads(model), expected_grads)
                )
    else:
        with torch.compiler.set_stance("fail_on_recompile"):
            loaded = torch.compiler.load_compiled_function(sys.argv[2])
            out = loaded(model, x)
        compiled = torch.compile(model)
    report["loaded_same"] = torch.allclose(out, expected)
    report["imported_at_load"] = [m for m in compile_only if m in sys.modules]
    report["child_processes_at_load"] = child_processes()
    report["load_messages"] = [
        m for m in package_messages.messages if m.startswith("loaded package")
    ]
    # A call the loaded guards reject (another batch size; for dynamic shapes,
    # a batch of 1, which they specialize) compiles here.
    y = torch.randn(1 if dynamic else 7, 16)
    options = load_imports_model.package_options(sys.argv[1])
    report["miss_same"] = torch.allclose(compiled(y, **options), model(y, **options))
    if training:
        compiled(y, **options).sum().backward()
    report["frames_compiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
report["imported_after_miss"] = [m for m in compile_only if m in sys.modules]
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""

CHECK_BEFORE_AND_AFTER_THE_MAP = """
import json
import torch
import torch._dynamo
from torch._dynamo import trace_rules
import load_imports_model

built_before = trace_rules.rule_map_is_built()
before = trace_rules.check_verbose(load_imports_model.scaled_relu)
trace_rules.get_torch_obj_rule_map()
after = trace_rules.check_verbose(load_imports_model.scaled_relu)
from torch.testing._internal.fresh_process import write_report
write_report({
    "built_before": built_before,
    "before": [before.skipped, before.reason],
    "after": [after.skipped, after.reason],
})
"""

NUMPY_INTEROP = """
import json, sys

import numpy as np
import torch
import torch._dynamo

report = {"tnp_at_import": "torch._numpy" in sys.modules}
from torch._dynamo.utils import NP_SUPPORTED_MODULES, NP_TO_TNP_MODULE

import torch._numpy as tnp

report["supported"] = [m.__name__ for m in NP_SUPPORTED_MODULES]
report["in_sync"] = list(NP_TO_TNP_MODULE) == list(NP_SUPPORTED_MODULES)
report["to_tnp"] = [m.__name__ for m in NP_TO_TNP_MODULE.values()]
report["same_table"] = torch._dynamo.utils.NP_TO_TNP_MODULE is NP_TO_TNP_MODULE
report["tnp_attr"] = torch._dynamo.utils.tnp is tnp


def f(x):
    a = x.numpy()
    return torch.from_numpy(np.fft.fft(np.sin(a)).real + a.sum())


from torch._dynamo.testing import CompileCounter

counter = CompileCounter()
x = torch.randn(4, 5)
out = torch.compile(f, backend=counter, fullgraph=True)(x)
report["same"] = torch.allclose(out.double(), f(x).double(), atol=1e-4)
report["frames"] = counter.frame_count
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""

RULE_MAP_AGREES = """
import builtins, json, types

import torch
import torch._dynamo
from torch._dynamo import trace_rules

# The file map, made before the object map (as a code object's lookup before any
# compile makes it), has the object map's string entries.
file_map = dict(trace_rules.get_torch_file_rule_map())
rule_map = trace_rules.get_torch_obj_rule_map()
string_keys = {key: rule for key, rule in rule_map.items() if isinstance(key, str)}
report = {
    "built": trace_rules.rule_map_is_built(),
    "method_keys": [repr(key) for key in rule_map if isinstance(key, types.MethodType)],
    "file_map_differs_at": sorted(
        key for key in set(file_map) | set(string_keys) if file_map.get(key) != string_keys.get(key)
    ),
    # The polyfills Dynamo registered while it was imported are in it.
    "all_is_polyfilled": trace_rules._variable_class(rule_map.get(builtins.all))
    is torch._dynamo.variables.PolyfilledFunctionVariable,
}
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""


RULE_MAPS_HOLD_NAMES = """
import torch
import torch._dynamo
from torch._dynamo import trace_rules

maps_before = [id(m) for m in trace_rules.torch_name_rule_map]
same_dicts = maps_before == [
    id(trace_rules.manual_torch_name_rule_map),
    id(trace_rules.torch_c_binding_in_graph_functions),
    id(trace_rules.torch_non_c_binding_in_graph_functions),
]
torch.compile(lambda x: torch.nn.functional.relu(x) + 1, backend="eager")(torch.randn(3))
rules = [v for m in trace_rules.torch_name_rule_map for v in m.values()]
report = {
    "built": trace_rules.rule_map_is_built(),
    "same_dicts": same_dicts and maps_before == [id(m) for m in trace_rules.torch_name_rule_map],
    "rule_types": sorted({type(v).__name__ for v in rules}),
    "obj_map_rule_types": sorted(
        {type(v).__name__ for v in trace_rules.get_torch_obj_rule_map().values()}
    ),
    "relu": trace_rules.lookup(torch.nn.functional.relu).__name__,
    "skip_class": trace_rules.SkipFunctionVariable.__name__,
}
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""

USER_POLYFILL = """
import torch
import torch._dynamo
from torch._dynamo import trace_rules


def add_one(x):
    return x + 1


@torch._dynamo.substitute_in_graph(add_one)
def add_one_polyfill(x):
    return x + 1


rule = trace_rules.lookup_inner(add_one)
counter = torch._dynamo.testing.CompileCounter()
out = torch.compile(lambda x: add_one(x) * 2, backend=counter, fullgraph=True)(
    torch.ones(2)
)
report = {
    "rule": rule.__name__ if rule is not None else None,
    "out": out.tolist(),
    "frames": counter.frame_count,
}
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""


SHAPE_GUARD_NAMES = """
import sys
import torch
import torch._dynamo
from torch._dynamo import guards

SHAPE_MODULE = "torch.fx.experimental.symbolic_shapes"
report = {}
names = guards._shape_guard_closure_vars(["2 <= L['x'].size()[0]", "math.log2(L['x'].size()[1]) > 1"])
report["plain"] = {"imported": SHAPE_MODULE in sys.modules, "names": sorted(names)}
names = guards._shape_guard_closure_vars(["IsNonOverlappingAndDenseIndicator(3, 1, L['x'].stride()[0], 1) == 1"])
report["helper"] = {"imported": SHAPE_MODULE in sys.modules, "names": sorted(names)}
from torch.fx.experimental.symbolic_shapes import SYMPY_INTERP

report["sympy_interp"] = sorted(SYMPY_INTERP)
report["sympy_interp_beyond_modules"] = sorted(set(SYMPY_INTERP) - {"math", "torch"})
report["helpers"] = sorted(guards._SYMBOLIC_SHAPES_GUARD_HELPERS)
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""


RESET_CODE_STATE = """
import json, sys

import torch
import torch._dynamo

torch._dynamo.reset()
report = {"pgo_after_reset": "torch._dynamo.pgo" in sys.modules}


def f(x):
    return x * 2


compiled = torch.compile(f, backend="eager", dynamic=False)
for n in (3, 4):
    compiled(torch.randn(n))
import torch._dynamo.pgo as pgo

report["same_function"] = torch._dynamo.reset_code_state is pgo.reset_code_state
report["state_before"] = pgo._CODE_STATE is not None
torch._dynamo.reset()
report["state_after"] = pgo._CODE_STATE is not None
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""

TRITON_DTYPE = """
import json, sys
import torch
import torch._dynamo

report = {"triton_imported_by_dynamo": "triton" in sys.modules}
import triton.language as tl

counter = torch._dynamo.testing.CompileCounter()
DTYPE = tl.float32


@torch.compile(backend=counter, fullgraph=True)
def add_by_dtype(x):
    return x + (1 if DTYPE == tl.float32 else 2)


outs = [add_by_dtype(torch.ones(1)).item()]
DTYPE = tl.float16  # the guard on the constant fails: a second graph
outs.append(add_by_dtype(torch.ones(1)).item())
report["outs"] = outs
report["graphs"] = counter.frame_count
report["is_constant_type"] = tl.dtype in torch._dynamo.utils.common_constant_types
# Imported last: what this process imported is what it reports.
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""


FIRST_COMPILE_IMPORTS = """
import sys
import torch
from torch._dynamo import _lazy_imports

# Which frame first imported each compile-only module: a finder first on
# sys.meta_path sees every import and records whether import_compiler() is on
# the stack, then lets the real finders find the module.
first_imported_under = {}


class RecordFirstImport:
    def find_spec(self, name, path=None, target=None):
        if name in _lazy_imports.COMPILE_ONLY_MODULES and name not in first_imported_under:
            frame, under = sys._getframe(1), False
            while frame is not None:
                under = under or frame.f_code.co_name == "import_compiler"
                frame = frame.f_back
            first_imported_under[name] = under
        return None


already = [m for m in _lazy_imports.COMPILE_ONLY_MODULES if m in sys.modules]
sys.meta_path.insert(0, RecordFirstImport())


def f(x):
    return torch.relu(x * 2.0) + 1.0


compiled = torch.compile(f, backend="eager", dynamic=False)
out = compiled(torch.ones(3))
report = {
    "imported_before_compile": already,
    "first_imported_under": first_imported_under,
    "same": out.tolist() == [3.0, 3.0, 3.0],
}
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""


class TestLoadImports(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="load-imports-test-"))
        (self.tmp / "load_imports_model.py").write_text(textwrap.dedent(MODEL))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def run_fresh(self, script, *args):
        return run_code(
            textwrap.dedent(script),
            *args,
            cwd=self.tmp,  # not the repo: a wheel run must not import torch_overlay
            pythonpath=[self.tmp],  # load_imports_model
            fresh_inductor_cache=True,
        )

    def check_loads_only_the_runtime(self, kind):
        artifact = str(self.tmp / f"saved-{kind}")
        self.run_fresh(SAVE, kind, artifact)
        report = self.run_fresh(LOAD, kind, artifact, json.dumps(COMPILE_ONLY_MODULES))
        self.assertTrue(report["loaded_same"])
        self.assertEqual(report["imported_at_load"], [])
        # No compile worker was started (no process at all).
        self.assertEqual(report["child_processes_at_load"], [])
        # One INFO line per load says what it cost.
        self.assertEqual(len(report["load_messages"]), 1, report["load_messages"])
        self.assertRegex(
            report["load_messages"][0],
            rf"^loaded package .*saved-{kind}: 1 entries, [1-9][0-9]* kernels in [0-9]+\.[0-9]{{3}} s$",
        )
        # The miss really compiled with Inductor, and correctly.
        self.assertTrue(report["miss_same"])
        self.assertGreaterEqual(report["frames_compiled"], 1)
        self.assertIn("torch._inductor.compile_fx", report["imported_after_miss"])
        self.assertIn("torch._inductor.lowering", report["imported_after_miss"])
        self.assertIn("sympy", report["imported_after_miss"])
        self.assertIn("torch._dynamo.symbolic_convert", report["imported_after_miss"])
        self.assertIn("torch._dynamo.variables.builder", report["imported_after_miss"])
        return report

    def test_the_first_compile_imports_the_compiler_in_one_place(self):
        # See NOTE: [Compile-only imports]: none of Dynamo's compile-only
        # modules is imported before the first compile, and each is first
        # imported under import_compiler(), so a profile of the first compile
        # shows their cost under that one frame.
        from torch._dynamo import _lazy_imports

        report = self.run_fresh(FIRST_COMPILE_IMPORTS)
        self.assertTrue(report["same"])
        self.assertEqual(report["imported_before_compile"], [])
        self.assertEqual(
            report["first_imported_under"],
            dict.fromkeys(_lazy_imports.COMPILE_ONLY_MODULES, True),
        )

    def test_package_load_imports_only_the_runtime(self):
        self.check_loads_only_the_runtime("package")

    def test_package_training_step_imports_only_the_runtime(self):
        # The loaded entry's backward checks its arguments with torch._check
        # on plain bools, which imported symbolic_shapes and sympy on the
        # first backward (0.6 s of a DDP job's first step from a package).
        report = self.check_loads_only_the_runtime("training-package")
        self.assertTrue(report["grads_same"])

    @slowTest
    def test_load_compiled_function_imports_only_the_runtime(self):
        self.check_loads_only_the_runtime("aot")

    @slowTest
    def test_package_of_a_plain_function_imports_only_the_runtime(self):
        # torch.compile(fn) looks fn up in trace_rules without building the
        # rule map (NOTE: [Functions of other modules are not in the torch
        # object rule map]).
        self.check_loads_only_the_runtime("function-package")

    @slowTest
    def test_package_of_a_torch_nn_module_imports_only_the_runtime(self):
        # torch.compile(nn.Sequential(...)) checks the function wrap_inline
        # wraps it in without building the rule map either.
        self.check_loads_only_the_runtime("torch-module-package")

    @slowTest
    def test_package_with_dynamic_shapes_imports_only_the_runtime(self):
        # Its shape-env guards are code that compares sizes with ints, and
        # its guards on the **options dict index it by constant keys: they
        # build without
        # symbolic_shapes, sympy or the variable trackers
        # (_shape_guard_closure_vars in torch/_dynamo/guards.py, and
        # utils.is_literal for DictGetItemSource).
        self.check_loads_only_the_runtime("dynamic-package")

    def test_shape_guard_code_imports_symbolic_shapes_only_for_its_helpers(self):
        report = self.run_fresh(SHAPE_GUARD_NAMES)
        # What the loaded code may call is SYMPY_INTERP, whichever way it is made.
        self.assertEqual(report["helpers"], report["sympy_interp_beyond_modules"])
        self.assertEqual(
            report["plain"], {"imported": False, "names": ["math", "torch"]}
        )
        self.assertEqual(
            report["helper"],
            {"imported": True, "names": sorted(report["sympy_interp"])},
        )

    def test_python_functions_in_the_rule_map_are_torch_functions(self):
        # What the lookup without the map relies on: every Python function key
        # of the built map is defined in torch, so one defined elsewhere is not
        # a key; and such a function is looked up alike before and after the
        # map is built.
        from torch._dynamo import trace_rules

        report = self.run_fresh(CHECK_BEFORE_AND_AFTER_THE_MAP)
        self.assertFalse(report["built_before"])
        self.assertEqual(report["before"], report["after"])
        self.assertEqual(report["before"][0], False)  # compiled, not skipped
        rule_map = trace_rules.get_torch_obj_rule_map()
        outside_torch = [
            key
            for key in rule_map
            if isinstance(key, types.FunctionType)
            and key.__module__.split(".")[0] != "torch"
            and id(key) not in trace_rules._polyfilled_function_ids
        ]
        self.assertEqual(outside_torch, [])

    def test_a_polyfilled_function_outside_torch_is_looked_up_as_polyfilled(self):
        # substitute_in_graph takes a Python function of any module; the
        # lookup that answers "not in the map" for functions outside torch
        # (before and after the map is built alike) asks the polyfilled ids
        # first.
        report = self.run_fresh(USER_POLYFILL)
        self.assertEqual(report["rule"], "PolyfilledFunctionVariable")
        self.assertEqual(report["out"], [4.0, 4.0])
        self.assertEqual(report["frames"], 1)

    def test_rule_maps_hold_class_names_and_are_never_rewritten(self):
        # See NOTE: [Dynamo imports its tracer only when it compiles]: after
        # a compile the maps are the same dicts, still holding class names,
        # and lookups answer classes.
        report = self.run_fresh(RULE_MAPS_HOLD_NAMES)
        self.assertTrue(report["built"])
        self.assertTrue(report["same_dicts"])
        self.assertEqual(report["rule_types"], ["str"])
        self.assertEqual(report["obj_map_rule_types"], ["str"])
        self.assertEqual(report["relu"], "TorchInGraphFunctionVariable")
        self.assertEqual(report["skip_class"], "SkipFunctionVariable")

    def test_a_rule_map_patched_in_is_what_lookups_consult(self):
        # A test that patches a rule map in (with classes as values, as stock
        # torch's maps hold) changes what the lookup answers, and only while
        # patched.
        from torch._dynamo import trace_rules
        from torch._dynamo.variables import SkipFunctionVariable

        relu = torch.nn.functional.relu
        self.assertEqual(
            trace_rules.lookup(relu).__name__, "TorchInGraphFunctionVariable"
        )
        patched = [{"torch.nn.functional.relu": SkipFunctionVariable}]
        try:
            with unittest.mock.patch.object(trace_rules, "torch_name_rule_map", patched):
                trace_rules.clear_lru_cache()
                self.assertIs(trace_rules.lookup(relu), SkipFunctionVariable)
        finally:
            trace_rules.clear_lru_cache()
        self.assertEqual(
            trace_rules.lookup(relu).__name__, "TorchInGraphFunctionVariable"
        )

    @unittest.skipUnless(has_triton_package(), "needs triton")
    def test_triton_dtype_is_a_constant_once_triton_is_imported(self):
        # See NOTE: [Triton's dtype joins the constant types when triton is
        # imported]: Dynamo no longer imports triton, and a triton dtype that the
        # user's code holds is still a constant to trace and to guard on.
        report = self.run_fresh(TRITON_DTYPE)
        self.assertFalse(report["triton_imported_by_dynamo"])
        self.assertEqual(report["outs"], [2.0, 3.0])
        self.assertEqual(report["graphs"], 2)
        self.assertTrue(report["is_constant_type"])

    def test_numpy_interop_tables_are_made_on_first_use(self):
        # See NOTE: [NumPy interop modules are imported on first use]: import
        # torch._dynamo no longer imports torch._numpy; the tables are made,
        # in sync, on first access, and tracing NumPy code uses them.
        report = self.run_fresh(NUMPY_INTEROP)
        self.assertFalse(report["tnp_at_import"])
        self.assertEqual(
            report["supported"], ["numpy", "numpy.fft", "numpy.linalg", "numpy.random"]
        )
        self.assertEqual(
            report["to_tnp"],
            ["torch._numpy", "torch._numpy.fft", "torch._numpy.linalg", "torch._numpy.random"],
        )
        self.assertTrue(report["in_sync"])
        self.assertTrue(report["same_table"])
        self.assertTrue(report["tnp_attr"])
        self.assertTrue(report["same"])
        self.assertEqual(report["frames"], 1)

    def test_reset_clears_code_state_without_importing_pgo_first(self):
        # reset() before any compile does not import torch._dynamo.pgo (there
        # is no code state yet); after compiles it clears the state as before.
        report = self.run_fresh(RESET_CODE_STATE)
        self.assertFalse(report["pgo_after_reset"])
        self.assertTrue(report["same_function"])
        self.assertTrue(report["state_before"])
        self.assertFalse(report["state_after"])

    def test_rule_map_lookups_without_the_map_agree_with_it(self):
        # See NOTE: [The torch object rule map is built on first use]: before
        # the map is built, a bound method is looked up as "not in the map"
        # and a code object in the map's "file#name" entries. In a fresh
        # process: creating a process group (earlier tests of this process may
        # have) clears the maps, and a map rebuilt then lacks the polyfills, as
        # in stock torch.
        report = self.run_fresh(RULE_MAP_AGREES)
        self.assertEqual(report["method_keys"], [])
        self.assertEqual(report["file_map_differs_at"], [])
        self.assertTrue(report["built"])
        self.assertTrue(report["all_is_polyfilled"])

if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
