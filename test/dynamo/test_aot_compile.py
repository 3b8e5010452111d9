# Owner(s): ["module: dynamo"]
"""aot_compile, save_compiled_function, torch.compiler.load_compiled_function.

The seed's test plan runs unchanged in fresh interpreters (twice: the second on
the warm caches the first left); saved functions load in a fresh interpreter with
an empty inductor cache under fail_on_recompile without tracing or compiling.
"""

import gc
import io
import json
import os
import pickle
import shutil
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
from torch.testing._internal.fresh_process import run_code


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
SEED_TEST_PLAN_DONE = """
from torch.testing._internal.fresh_process import write_report
write_report("ran to its end")
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
from torch.testing._internal.fresh_process import write_report
m, x = aot_models.make()
with torch._dynamo.config.patch("enable_aot_compile", True):
    fn = torch.compile(m, fullgraph=True).forward.aot_compile(((x,), {{}}))
    fn.save_compiled_function({path!r})
    g = torch.compile(aot_models.add_mul, fullgraph=True).aot_compile(((x, x), {{}}))
    g.save_compiled_function({path!r} + ".fn")
write_report("saved")
"""


LOAD = """
import json, os, sys, torch
sys.path.insert(0, {dir!r})
import aot_models
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
m, x = aot_models.make()
with torch.compiler.set_stance("fail_on_recompile"):
    fn = torch.compiler.load_compiled_function(open({path!r}, "rb"))
    g = torch.compiler.load_compiled_function({path!r} + ".fn")
    out = fn(m, x)
    out_g = g(x, x)
cache = os.environ["TORCHINDUCTOR_CACHE_DIR"]
import tempfile
write_report({{
    "kernel_copies": len([d for d in os.listdir(tempfile.gettempdir()) if d.startswith("torch_package_kernels_")]),
    "same": bool(torch.allclose(out, m(x))),
    "same_fn": bool(torch.allclose(out_g, aot_models.add_mul(x, x))),
    "traced_graphs": counters["stats"]["unique_graphs"],
    "compiled_binaries": [f for _, _, fs in os.walk(cache) for f in fs if f.endswith(".so")],
}})
"""


CUSTOM_BACKEND_MODULE = """
import pickle
import torch
from torch._dynamo.aot_compile_types import SerializableCallable

class ReplayGraph(SerializableCallable):
    # Runs the Dynamo graph; counts how often an instance was loaded from bytes.
    loaded = 0

    def __init__(self, graph_module):
        self.graph_module = graph_module

    @classmethod
    def serialize_compile_artifacts(cls, fn):
        return pickle.dumps(torch.fx.GraphModule(fn.graph_module, fn.graph_module.graph))

    @classmethod
    def deserialize_compile_artifacts(cls, data):
        cls.loaded += 1
        return cls(pickle.loads(data))

    def __call__(self, *args):
        return self.graph_module(*args)

def replay_backend(gm, example_inputs):
    return ReplayGraph(gm)

def fn(x, y):
    return torch.sin(x) * y + 1
"""


SAVE_CUSTOM = """
import sys, torch
sys.path.insert(0, {dir!r})
import custom_backend
from torch.testing._internal.fresh_process import write_report
x = torch.randn(4)
if {mode!r} == "aot_compile":
    with torch._dynamo.config.patch("enable_aot_compile", True):
        compiled = torch.compile(
            custom_backend.fn, fullgraph=True, backend=custom_backend.replay_backend
        ).aot_compile(((x, x), {{}}))
    compiled.save_compiled_function({path!r})
else:
    compiled = torch.compile(
        custom_backend.fn, backend=custom_backend.replay_backend, package={path!r}
    )
    compiled(x, x)
    compiled.save_package()
write_report("saved")
"""


LOAD_CUSTOM = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import custom_backend
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
x = torch.randn(4)
with torch.compiler.set_stance("fail_on_recompile"):
    if {mode!r} == "aot_compile":
        loaded = torch.compiler.load_compiled_function({path!r})
    else:
        loaded = torch.compile(
            custom_backend.fn, backend=custom_backend.replay_backend, package={path!r}
        )
        loaded.load_package()
    out = loaded(x, x)
write_report({{
    "same": bool(torch.allclose(out, custom_backend.fn(x, x))),
    "graphs_loaded": custom_backend.ReplayGraph.loaded,
    "traced_graphs": counters["stats"]["unique_graphs"],
}})
"""


LOCAL_FUNCTION_SAVE = """
import torch
from torch.testing._internal.fresh_process import write_report

def make():
    def scaled_sum(x, y):
        return x * 3 + y
    return scaled_sum

with torch._dynamo.config.patch("enable_aot_compile", True):
    compiled = torch.compile(make(), fullgraph=True, backend="eager").aot_compile(
        ((torch.ones(2), torch.ones(2)), {{}})
    )
compiled.save_compiled_function({path!r})
write_report("saved")
"""


LOCAL_FUNCTION_LOAD = """
import torch
from torch._dynamo.exc import PackageError
from torch.testing._internal.fresh_process import write_report
try:
    torch.compiler.load_compiled_function({path!r})
except PackageError as e:
    write_report(str(e))
"""


MODULE_ENTRY_POINTS_SAVE = """
import sys, torch
sys.path.insert(0, {dir!r})
import aot_models
from torch._dynamo.aot_compile import ModelInput
from torch.testing._internal.fresh_process import write_report
m, x = aot_models.make()
torch._dynamo.config.enable_aot_compile = True
compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
compiled._aot_compile([
    ModelInput((x,), {{}}, []),
    ModelInput((torch.randn(5, 8),), {{}}, [torch.no_grad()]),
])
data = compiled._save_aot_compiled_module({path!r})
assert open({path!r}, "rb").read() == data
write_report("saved")
"""


MODULE_ENTRY_POINTS_LOAD = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import aot_models
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
m, x = aot_models.make()
torch._dynamo.config.enable_aot_compile = True
compiled = torch.compile(m, fullgraph=True, backend="aot_eager")
with torch.compiler.set_stance("fail_on_recompile"):
    compiled._load_aot_compiled_module(open({path!r}, "rb").read())
    out = compiled(x)
    with torch.no_grad():
        x5 = torch.randn(5, 8)
        out5 = compiled(x5)
    try:
        compiled(x5)  # grad mode: neither compiled input accepts it
        rejected = None
    except RuntimeError as e:
        rejected = "guards reject" in str(e)
write_report({{
    "forward": type(compiled.forward).__name__,
    "same": bool(torch.allclose(out, m(x))),
    "same_no_grad": bool(torch.allclose(out5, m(x5))),
    "grad_mode_rejected": rejected,
    "traced_graphs": counters["stats"]["unique_graphs"],
}})
"""


class NotSerializable:
    """A backend output that does not follow the SerializableCallable protocol."""

    def __init__(self, gm):
        self.gm = gm

    def __call__(self, *args):
        return self.gm(*args)


def not_serializable_backend(gm, example_inputs):
    return NotSerializable(gm)


def add_one_and_double(x):
    return (x + 1) * 2


OFFSET = 1.0


def add_offset(x):
    return x + OFFSET


WRAPPED_MODULE = """
import functools
import torch

def traced(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs) + 1
    return wrapper

@traced
def scaled(x):
    return x * 3
"""


WRAPPED_ROUND_TRIP = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import wrapped_models
from torch.testing._internal.fresh_process import write_report
x = torch.arange(4.0)
if sys.argv[1] == "save":
    with torch._dynamo.config.patch("enable_aot_compile", True):
        fn = torch.compile(wrapped_models.scaled, fullgraph=True, backend="eager")
        fn.aot_compile(((x,), {{}})).save_compiled_function({path!r})
    write_report("saved")
else:
    from torch._dynamo.utils import counters
    with torch.compiler.set_stance("fail_on_recompile"):
        loaded = torch.compiler.load_compiled_function({path!r})
        same = bool(torch.equal(loaded(x), wrapped_models.scaled(x)))
    write_report({{"same": same, "traced_graphs": counters["stats"]["unique_graphs"]}})
"""


# Upstream's entry points to saved guards, used as upstream's loaders use them:
# the save side keeps the guards_state bytes of an aot_compile'd entry and the
# decisions of Dynamo's own guards (of a plain compile) on a set of probes; the
# load side (a fresh interpreter) rebuilds the guards from the bytes alone and
# decides the probes. Written against what torch 2.13 has too, so that the
# behaviour diff runs it there.
GUARDS_API = r'''
import importlib.util, json, os, sys
import torch
from torch.testing._internal.fresh_process import write_report

def guards_state_of(fn, args):
    # keep every guard: torch 2.13's aot_compile leaves out guards on globals
    # unless it is given a filter
    keep_all = {"guard_filter_fn": lambda entries: [True] * len(entries)}
    compiled = torch.compile(fn, fullgraph=True, backend="eager", options=keep_all)
    with torch._dynamo.config.patch(enable_aot_compile=True):
        aot = compiled.aot_compile((args, {}))
    # torch 2.13 keeps it in the artifacts of the compiled function
    artifacts = getattr(aot, "_artifacts", None)
    return artifacts.guards_state if artifacts is not None else aot._guards_state

mode, case_path, state_path = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("guards_case", case_path)
case = importlib.util.module_from_spec(spec)
sys.modules["guards_case"] = case
spec.loader.exec_module(case)


def probes():
    torch.manual_seed(0)
    return [
        {"x": torch.randn(3), "y": torch.randn(3)},
        {"x": torch.randn(3, dtype=torch.float64), "y": torch.randn(3)},
        {"x": torch.randn(4), "y": torch.randn(4)},
        {"x": torch.randn(3, requires_grad=True), "y": torch.randn(3)},
    ]


report = {}
if mode == "save":
    example = (torch.randn(3), torch.randn(3))
    with open(state_path, "wb") as f:
        f.write(guards_state_of(case.fn, example))
    torch._dynamo.reset()
    torch.compile(case.fn, backend="eager")(*example)
    (cache_entry,) = torch._dynamo.eval_frame._debug_get_cache_entry_list(case.fn.__code__)
    report["decisions"] = [bool(cache_entry.guard_manager.check(p)) for p in probes()]
else:
    from torch._dynamo.package import load_guard_manager, load_guards_state

    with open(state_path, "rb") as f:
        state = load_guards_state(f.read())
    report["state"] = [type(state).__name__, hasattr(state, "output_graph"), hasattr(state, "shape_code_parts")]
    manager = load_guard_manager(state, case.fn.__code__, case.__dict__)
    report["decisions"] = [bool(manager.check(p)) for p in probes()]
    # the guards read the globals given at load whenever they run
    case.SCALE = 3
    report["after_global_changed"] = bool(manager.check(probes()[0]))
write_report(report)
'''


# A decorator defined at module level, applied twice: two live functions named
# check_inputs.<locals>._fn, told apart by the code their closures hold.
DECORATED_MODULE = """
import torch

def check_inputs(fn):
    def _fn(*args, **kwargs):
        for arg in args:
            assert arg.shape[0] > 1
        return fn(*args, **kwargs)
    return _fn

@check_inputs
def doubled_sum(x, y):
    return (x + y) * 2

@check_inputs
def tripled_sum(x, y):
    return (x + y) * 3
"""


DECORATED_ROUND_TRIP = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import decorated_models
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
x, y = torch.ones(3), torch.arange(3.0)
if sys.argv[1] == "save":
    with torch._dynamo.config.patch("enable_aot_compile", True):
        fn = torch.compile(decorated_models.doubled_sum, fullgraph=True, backend="eager")
        fn.aot_compile(((x, y), {{}})).save_compiled_function({path!r})
    write_report("saved")
else:
    with torch.compiler.set_stance("fail_on_recompile"):
        loaded = torch.compiler.load_compiled_function({path!r})
        out = loaded(x, y)
    write_report({{
        "same": bool(torch.equal(out, decorated_models.doubled_sum(x, y))),
        "traced_graphs": counters["stats"]["unique_graphs"],
    }})
"""


# A module's bound method captured in a functools.partial in a local
# function's closure: upstream's external_data contract.
CAPTURED_MODULE = """
import functools
import torch

class Affine(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x)

def call(f, *args):
    return f(*args)

def wrap(fn):
    def wrapped(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapped

def make():
    torch.manual_seed(0)
    mod = Affine()
    return mod, wrap(functools.partial(call, mod.forward))
"""


CAPTURED_ROUND_TRIP = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import captured_models
from torch._dynamo.exc import PackageError
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
mod, fn = captured_models.make()
x = torch.randn(4, 3)
report = {{}}

def error(call):
    try:
        call()
    except (RuntimeError, PackageError) as e:
        return type(e).__name__ + ": " + str(e).split(chr(10))[0][:400]
    return None

if sys.argv[1] == "save":
    with torch._dynamo.config.patch("enable_aot_compile", True):
        compiled = torch.compile(fn, fullgraph=True, backend="eager").aot_compile(((x,), {{}}))
    report["without_external_data"] = error(lambda: compiled.save_compiled_function({path!r}))
    compiled.save_compiled_function({path!r}, external_data={{"mod": mod}})
else:
    with torch.compiler.set_stance("fail_on_recompile"):
        report["without_external_data"] = error(
            lambda: torch.compiler.load_compiled_function({path!r})
        )
        report["another_module"] = error(
            lambda: torch.compiler.load_compiled_function(
                {path!r}, external_data={{"mod": captured_models.Affine()}}
            )
        )
        loaded = torch.compiler.load_compiled_function({path!r}, external_data={{"mod": mod}})
        report["same"] = bool(torch.equal(loaded(x), fn(x)))
    report["traced_graphs"] = counters["stats"]["unique_graphs"]
write_report(report)
"""


# A function whose bytecode builds its output with a module-level class (an
# external reference) and adds a module-level tensor (a graph input).
GLOBALS_MODULE = """
import torch

BIAS = torch.ones(3)

class Boxed:
    def __init__(self, value):
        self.value = value

def boxed_sum(x, y):
    return Boxed(x + y + BIAS)

def biased(x):
    return x + BIAS
"""


GLOBALS_ROUND_TRIP = """
import json, sys, torch
sys.path.insert(0, {dir!r})
import globals_models
from torch.testing._internal.fresh_process import write_report
x, y = torch.randn(3), torch.randn(3)
report = {{}}
if sys.argv[1] == "save":
    with torch._dynamo.config.patch("enable_aot_compile", True):
        for name in ("boxed_sum", "biased"):
            fn = torch.compile(getattr(globals_models, name), fullgraph=True, backend="eager")
            args = (x, y) if name == "boxed_sum" else (x,)
            fn.aot_compile((args, {{}})).save_compiled_function({path!r} + name)
else:
    from torch._dynamo.utils import counters
    with torch.compiler.set_stance("fail_on_recompile"):
        try:
            torch.compiler.load_compiled_function({path!r} + "boxed_sum")
        except RuntimeError as e:
            report["without_f_globals"] = str(e).split(" Please")[0]
        boxed = torch.compiler.load_compiled_function(
            {path!r} + "boxed_sum", f_globals=vars(globals_models)
        )
        report["boxed"] = bool(torch.equal(boxed(x, y).value, globals_models.boxed_sum(x, y).value))
        biased = torch.compiler.load_compiled_function({path!r} + "biased")
        report["biased"] = bool(torch.equal(biased(x), globals_models.biased(x)))
    report["traced_graphs"] = counters["stats"]["unique_graphs"]
write_report(report)
"""


def _check_inputs(fn):
    def _fn(*args):
        return fn(*args)

    return _fn


def _scaled_sum(x):
    return (x.sin() + x.cos() * 2).sum(0)



class TestAOTCompile(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="aot-compile-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def run_process(self, code, *argv, cache=None, tmpdir=None):
        """Runs ``code`` in a fresh interpreter and returns its report."""
        env = {"TORCHINDUCTOR_CACHE_DIR": cache or str(self.tmp / "cache")}
        if tmpdir is not None:
            env["TMPDIR"] = tmpdir
        return run_code(code, *argv, cwd=self.tmp, env=env)

    @parametrize("device", ["cpu", "cuda"])
    def test_seed_test_plan_runs_twice_in_fresh_processes(self, device):
        if device == "cuda" and not torch.cuda.is_available():
            raise unittest.SkipTest("needs a CUDA device")
        # The seed's plan as it is, then the report that it ran to its end.
        script = SEED_TEST_PLAN.format(device=device) + SEED_TEST_PLAN_DONE
        self.run_process(script)  # cold caches
        self.run_process(script)  # warm caches left by the first run

    def test_load_in_fresh_process_with_empty_cache_compiles_nothing(self):
        (self.tmp / "aot_models.py").write_text(MODEL_MODULE)
        path = str(self.tmp / "mlp.pt")
        self.run_process(SAVE.format(dir=str(self.tmp), path=path))
        tmpdir = self.tmp / "process-tmp"
        tmpdir.mkdir()
        report = self.run_process(
            LOAD.format(dir=str(self.tmp), path=path),
            cache=str(self.tmp / "empty"),
            tmpdir=str(tmpdir),
        )
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
        with self.assertRaisesRegex(RuntimeError, r"GuardManager check failed, reason: tensor 'x' dtype mismatch.*guards reject"):
            compiled(torch.ones(3, dtype=torch.float64), torch.ones(3))
        compiled.disable_guard_check()
        out = compiled(torch.ones(3, dtype=torch.float64), torch.ones(3))
        self.assertEqual(out.dtype, torch.float64)

    def test_aot_compile_is_opt_in(self):
        compiled = torch.compile(lambda x: x + 1, fullgraph=True, backend="eager")
        with self.assertRaisesRegex(RuntimeError, "enable_aot_compile"):
            compiled.aot_compile(((torch.ones(2),), {}))

    @parametrize("mode", ["aot_compile", "package"])
    def test_custom_backend_serializable_callable_loads_in_fresh_process(self, mode):
        (self.tmp / "custom_backend.py").write_text(CUSTOM_BACKEND_MODULE)
        path = str(self.tmp / "custom_fn")
        self.run_process(SAVE_CUSTOM.format(dir=str(self.tmp), path=path, mode=mode))
        report = self.run_process(LOAD_CUSTOM.format(dir=str(self.tmp), path=path, mode=mode))
        self.assertEqual(report, {"same": True, "graphs_loaded": 1, "traced_graphs": 0})

    def test_aot_compile_refuses_a_backend_output_that_is_not_serializable(self):
        with torch._dynamo.config.patch("enable_aot_compile", True):
            with self.assertRaisesRegex(
                RuntimeError,
                r"^Compiled function type <class '.*NotSerializable'> \(produced from "
                r"backend <function not_serializable_backend at 0x\w+>\) does not "
                r"implement SerializableCallable\.",
            ):
                torch.compile(
                    add_one_and_double, fullgraph=True, backend=not_serializable_backend
                ).aot_compile(((torch.ones(2),), {}))

    def test_package_leaves_out_a_backend_output_that_is_not_serializable(self):
        compiled = torch.compile(
            add_one_and_double,
            backend=not_serializable_backend,
            package=str(self.tmp / "not_serializable"),
        )
        self.assertEqual(compiled(torch.ones(2)), torch.full((2,), 4.0))
        with self.assertWarnsRegex(UserWarning, "does not implement SerializableCallable"):
            compiled.save_package()
        self.assertEqual(
            json.loads((self.tmp / "not_serializable" / "manifest.json").read_text())["entries"], 0
        )
        with torch._dynamo.config.patch("strict_precompile", True):
            with self.assertRaisesRegex(PackageError, "does not implement SerializableCallable"):
                compiled.save_package()

    def test_serializable_callable_class_in_a_local_scope_cannot_be_saved(self):
        from torch._dynamo.aot_compile_types import GraphModuleSerializableCallable

        class LocalReplay(GraphModuleSerializableCallable):
            pass

        with torch._dynamo.config.patch("enable_aot_compile", True):
            compiled = torch.compile(
                add_one_and_double,
                fullgraph=True,
                backend=lambda gm, example_inputs: LocalReplay(gm),
            ).aot_compile(((torch.ones(2),), {}))
        self.assertEqual(compiled(torch.ones(2)), torch.full((2,), 4.0))
        with self.assertWarns(UserWarning), self.assertRaisesRegex(
            PackageError,
            "LocalReplay of backend '<lambda>' cannot be imported by name: define it at "
            "module level",
        ):
            compiled.save_compiled_function(str(self.tmp / "local_class.pt"))

    def test_graph_module_serializable_callable_round_trip(self):
        from torch._dynamo.aot_compile_types import GraphModuleSerializableCallable

        path = str(self.tmp / "graph_module.pt")
        with torch._dynamo.config.patch("enable_aot_compile", True):
            torch.compile(
                add_one_and_double,
                fullgraph=True,
                backend=lambda gm, example_inputs: GraphModuleSerializableCallable(gm),
            ).aot_compile(((torch.ones(3),), {})).save_compiled_function(path)
        loaded = torch.compiler.load_compiled_function(path)
        x = torch.randn(3)
        self.assertEqual(loaded(x), add_one_and_double(x))

    def test_local_function_loads_where_it_is_alive(self):
        def scaled_sum(x, y):
            return x * 3 + y

        path = str(self.tmp / "local_fn.pt")
        with torch._dynamo.config.patch("enable_aot_compile", True):
            torch.compile(scaled_sum, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(2), torch.ones(2)), {})
            ).save_compiled_function(path)
        torch._dynamo.reset()
        with torch.compiler.set_stance("fail_on_recompile"):
            loaded = torch.compiler.load_compiled_function(path)
            x, y = torch.randn(2), torch.randn(2)
            self.assertEqual(loaded(x, y), scaled_sum(x, y))

    def test_function_decorated_with_functools_wraps_loads_in_fresh_process(self):
        # The guards hold a FUNCTION_MATCH on the wrapped function, and the
        # wrapper's code is named after the decorator: both are found again by
        # the decorated function's own name.
        (self.tmp / "wrapped_models.py").write_text(WRAPPED_MODULE)
        path = str(self.tmp / "wrapped.pt")
        script = WRAPPED_ROUND_TRIP.format(dir=str(self.tmp), path=path)
        reports = [run_code(script, mode, cwd=self.tmp) for mode in ("save", "load")]
        self.assertEqual(reports[1], {"same": True, "traced_graphs": 0})

    def test_local_function_is_a_package_error_in_a_process_without_it(self):
        path = str(self.tmp / "local_fn.pt")
        self.run_process(LOCAL_FUNCTION_SAVE.format(path=path))
        error = self.run_process(LOCAL_FUNCTION_LOAD.format(path=path))
        self.assertExpectedInline(
            error.replace(path, "<path>"),
            """<path> was compiled from make.<locals>.scaled_sum in module __main__, which cannot be found in this process: it is defined in a local scope, so it loads only where that function exists (define it at module level to load it anywhere)""",
        )

    def test_local_function_with_several_live_closures_is_ambiguous(self):
        def make(scale):
            def scaled(x):
                return x * scale

            return scaled

        by_two, by_three = make(2), make(3)
        path = str(self.tmp / "closure.pt")
        with torch._dynamo.config.patch("enable_aot_compile", True):
            torch.compile(by_two, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(2),), {})
            ).save_compiled_function(path)
        with self.assertRaisesRegex(PackageError, "2 live functions of that name"):
            torch.compiler.load_compiled_function(path)
        del by_three
        loaded = torch.compiler.load_compiled_function(path)
        self.assertEqual(loaded(torch.ones(2)), torch.full((2,), 2.0))

    def run_modes(self, script, modes=("save", "load")):
        return {mode: self.run_process(script, mode) for mode in modes}

    def test_decorated_function_loads_in_fresh_process_by_its_closure_code(self):
        # The guard on the wrapped function's identity cannot be saved; aot_compile
        # leaves it out and records the code the closure holds instead, which
        # tells doubled_sum's wrapper from tripled_sum's (same qualified name).
        (self.tmp / "decorated_models.py").write_text(DECORATED_MODULE)
        path = str(self.tmp / "decorated.pt")
        reports = self.run_modes(DECORATED_ROUND_TRIP.format(dir=str(self.tmp), path=path))
        self.assertEqual(reports["load"], {"same": True, "traced_graphs": 0})

    def test_closure_code_picks_the_live_function_and_refuses_another(self):
        # Local functions: no stable name, so their identity guards are left out
        # (one with a stable name is guarded by that name).
        def _doubled(x):
            return x * 2

        def _tripled(x):
            return x * 3

        doubled, tripled = _check_inputs(_doubled), _check_inputs(_tripled)
        path = str(self.tmp / "closure_code.pt")
        with torch._dynamo.config.patch("enable_aot_compile", True):
            compiled = torch.compile(doubled, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(2),), {})
            )
        self.assertEqual(compiled(torch.ones(2)), torch.full((2,), 2.0))
        compiled.save_compiled_function(path)
        torch._dynamo.reset()
        with torch.compiler.set_stance("fail_on_recompile"):
            loaded = torch.compiler.load_compiled_function(path)
            self.assertEqual(loaded(torch.ones(2)), torch.full((2,), 2.0))
        del compiled, loaded, doubled
        gc.collect()
        with self.assertRaisesRegex(
            PackageError, "none is the one compiled .its closure holds no function with the code"
        ):
            torch.compiler.load_compiled_function(path)
        self.assertEqual(tripled(torch.ones(2)), torch.full((2,), 3.0))

    def test_guard_filter_keeping_a_closure_guard_is_upstreams_refusal(self):
        def _doubled(x):
            return x * 2

        keep_all = {"guard_filter_fn": lambda entries: [True] * len(entries)}
        with torch._dynamo.config.patch("enable_aot_compile", True):
            with self.assertWarns(UserWarning), self.assertRaisesRegex(
                PackageError,
                r"^CLOSURE_MATCH guard cannot be serialized\. Guarded source: L\['fn'\]\. "
                r"It guards on the identity of function .*_doubled",
            ):
                torch.compile(
                    _check_inputs(_doubled), fullgraph=True, backend="eager", options=keep_all
                ).aot_compile(((torch.ones(2),), {}))

    def test_module_in_closure_is_external_data_at_save_and_load(self):
        (self.tmp / "captured_models.py").write_text(CAPTURED_MODULE)
        path = str(self.tmp / "captured.pt")
        reports = self.run_modes(CAPTURED_ROUND_TRIP.format(dir=str(self.tmp), path=path))
        self.assertRegex(
            reports["save"]["without_external_data"],
            r"^RuntimeError: Failed to serialize the following objects: \[Affine\(",
        )
        load = reports["load"]
        self.assertRegex(
            load["without_external_data"],
            r"^RuntimeError: Missing required external reference to data: mod\. Please load",
        )
        self.assertRegex(
            load["another_module"],
            r"^PackageError: .*none is the one compiled \(its closure does not hold "
            r"external_data\['mod'\]\)",
        )
        self.assertEqual({k: load[k] for k in ("same", "traced_graphs")}, {"same": True, "traced_graphs": 0})

    def test_globals_the_bytecode_reads_are_given_at_load(self):
        (self.tmp / "globals_models.py").write_text(GLOBALS_MODULE)
        path = str(self.tmp / "globals_")
        reports = self.run_modes(GLOBALS_ROUND_TRIP.format(dir=str(self.tmp), path=path))
        self.assertEqual(
            reports["load"],
            {
                "without_f_globals": "Missing required external references: ['Boxed'].",
                "boxed": True,
                # a global tensor is a graph input, read from the module
                "biased": True,
                "traced_graphs": 0,
            },
        )

    def test_aot_compile_fullgraph_takes_torch_compiles_dynamic(self):
        from torch._dynamo.aot_compile import aot_compile_fullgraph
        from torch._dynamo.aot_compile_types import GraphModuleSerializableCallable

        settings = []

        def backend(gm, example_inputs):
            settings.append(
                (
                    torch._dynamo.config.automatic_dynamic_shapes,
                    torch._dynamo.config.assume_static_by_default,
                )
            )
            return GraphModuleSerializableCallable(gm)

        x = torch.randn(3, 4)
        with torch._dynamo.config.patch("enable_aot_compile", True):
            for dynamic in (None, False, True):
                compiled = aot_compile_fullgraph(add_one_and_double, backend, ((x,), {}), dynamic=dynamic)
                self.assertEqual(compiled(x), add_one_and_double(x))
        # upstream's: dynamic=False turns automatic dynamic shapes off while
        # compiling, True assumes every size dynamic
        self.assertEqual(settings, [(True, True), (False, True), (True, False)])

    def test_aot_compile_under_fail_on_recompile_compiles(self):
        def fn(x):
            return x.cos() + 1

        with torch.compiler.set_stance("fail_on_recompile"), torch._dynamo.config.patch(
            "enable_aot_compile", True
        ):
            compiled = torch.compile(fn, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(3),), {})
            )
            x = torch.randn(3)
            self.assertEqual(compiled(x), fn(x))
            # The stance still holds for everything else.
            with self.assertRaisesRegex(RuntimeError, "Detected recompile"):
                torch.compile(fn, backend="eager")(x)

    def test_upstream_keyword_arguments_of_save_and_load(self):
        path = str(self.tmp / "offset.pt")
        with torch._dynamo.config.patch("enable_aot_compile", True):
            compiled = torch.compile(add_offset, fullgraph=True, backend="eager").aot_compile(
                ((torch.ones(2),), {})
            )
            compiled.save_compiled_function(path, external_data={})
            with self.assertRaisesRegex(TypeError, "external_data must be a dict"):
                compiled.save_compiled_function(path, external_data=[1])
        torch._dynamo.reset()
        x = torch.arange(2.0)
        data = Path(path).read_bytes()
        with torch.compiler.set_stance("fail_on_recompile"):
            # f_globals: what the compiled code and its guards read over the module's
            same = torch.compiler.load_compiled_function(
                io.BytesIO(data), f_globals={"OFFSET": 1.0}, external_data={}
            )
            self.assertEqual(same(x), x + 1)
            other = torch.compiler.load_compiled_function(
                io.BytesIO(data), f_globals={"OFFSET": 5.0}
            )
            with self.assertRaisesRegex(RuntimeError, "GuardManager check failed, reason: .*OFFSET.*guards reject"):
                other(x)
            plain = torch.compiler.load_compiled_function(io.BytesIO(data))
            self.assertEqual(plain(x), x + 1)

    def test_module_entry_points_save_and_load_in_fresh_process(self):
        (self.tmp / "aot_models.py").write_text(MODEL_MODULE)
        path = str(self.tmp / "module.bin")
        self.run_process(MODULE_ENTRY_POINTS_SAVE.format(dir=str(self.tmp), path=path))
        report = self.run_process(MODULE_ENTRY_POINTS_LOAD.format(dir=str(self.tmp), path=path))
        self.assertEqual(
            report,
            {
                "forward": "AOTCompiledModel",
                "same": True,
                "same_no_grad": True,
                "grad_mode_rejected": True,
                "traced_graphs": 0,
            },
        )

    def test_module_entry_points_need_fullgraph_and_opt_in(self):
        from torch._dynamo.aot_compile import ModelInput

        m, x = torch.nn.Linear(2, 2), torch.randn(1, 2)
        inputs = [ModelInput((x,), {}, [])]
        with self.assertRaisesRegex(RuntimeError, "AOT Compile is not enabled"):
            torch.compile(m, fullgraph=True, backend="eager")._aot_compile(inputs)
        with torch._dynamo.config.patch("enable_aot_compile", True):
            with self.assertRaisesRegex(
                RuntimeError, r"Please use torch.compile\(fullgraph=True\)"
            ):
                torch.compile(m, backend="eager")._aot_compile(inputs)
            with self.assertRaisesRegex(RuntimeError, "no ahead-of-time compiled forward"):
                torch.compile(m, fullgraph=True, backend="eager")._save_aot_compiled_module()
            with self.assertRaises(PackageError):
                torch.compile(m, fullgraph=True, backend="eager")._load_aot_compiled_module(b"junk")

    def test_damaged_file_is_a_package_error(self):
        path = self.tmp / "broken.pt"
        path.write_bytes(b"PK\x03\x04 truncated")
        with self.assertRaises(PackageError):
            torch.compiler.load_compiled_function(str(path))


class TestAOTAutogradCacheEntryBytes(torch._dynamo.test_case.TestCase):
    def test_entry_loaded_from_cache_serializes_to_its_bytes(self):
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

        # The cache is on by default from torch 2.7 (torch 2.6.0, another supported
        # base, leaves it off).
        with tempfile.TemporaryDirectory() as cache, unittest.mock.patch.dict(
            os.environ, {"TORCHINDUCTOR_CACHE_DIR": cache}
        ), torch._functorch.config.patch(enable_autograd_cache=True):
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


class TestSerializedCode(torch._dynamo.test_case.TestCase):
    """torch._dynamo.package.SerializedCode, upstream's picklable code object."""

    def test_round_trip_with_nested_code_and_pickle(self):
        from torch._dynamo.package import SerializedCode

        def outer(x, *, k=2):
            def inner(y):
                return y * k

            return inner(x) + len({"a": 1})

        serialized = SerializedCode.from_code_object(outer.__code__)
        nested = [c for c in serialized.co_consts if isinstance(c, SerializedCode)]
        self.assertEqual([c.co_name for c in nested], ["inner"])
        # identity-cached in both directions
        self.assertIs(SerializedCode.from_code_object(outer.__code__), serialized)
        code = SerializedCode.to_code_object(serialized)
        self.assertIs(SerializedCode.to_code_object(serialized), code)
        self.assertEqual(code, outer.__code__)
        unpickled = pickle.loads(pickle.dumps(serialized))
        self.assertEqual(unpickled, serialized)
        rebuilt = type(outer)(SerializedCode.to_code_object(unpickled), globals())
        self.assertEqual(rebuilt(3, k=2), 7)

    def test_unhashable_constant(self):
        from torch._dynamo.package import SerializedCode

        def foo():
            pass

        serialized = SerializedCode.from_code_object(foo.__code__)
        # A frozen dataclass: upstream's test sets a field the same way.
        object.__setattr__(serialized, "co_consts", serialized.co_consts + ({1: 2},))
        code = SerializedCode.to_code_object(serialized)
        self.assertEqual(code.co_consts[-1], {1: 2})
        self.assertEqual(SerializedCode.from_code_object(code), serialized)


class _KernelLike:
    """What the side table's kernels look like to the helpers: ``fn`` is the
    function a triton JITFunction wraps."""

    def __init__(self, fn):
        self.fn = fn


class TestTritonKernelSideTable(torch._dynamo.test_case.TestCase):
    """_serialize_triton_kernel / _deserialize_triton_kernel (upstream's)."""

    def test_side_table_round_trip_by_module_and_name(self):
        from torch._dynamo.aot_compile_types import (
            _deserialize_triton_kernel,
            _serialize_triton_kernel,
        )
        from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table

        try:
            idx = kernel_side_table.add_kernel(_KernelLike(add_one_and_double))
            saved = {i: _serialize_triton_kernel(k) for i, k in kernel_side_table.id_to_kernel.items()}
            self.assertEqual(saved[idx], (__name__, "add_one_and_double"))
            kernel_side_table.reset_table()
            for i, info in pickle.loads(pickle.dumps(saved)).items():
                kernel = _deserialize_triton_kernel(info)
                kernel_side_table.id_to_kernel[i] = kernel
                kernel_side_table.kernel_to_id[kernel] = i
            self.assertIs(kernel_side_table.get_kernel(idx), add_one_and_double)
        finally:
            kernel_side_table.reset_table()

    def test_kernels_that_cannot_be_found_by_name(self):
        from torch._dynamo.aot_compile_types import (
            _deserialize_triton_kernel,
            _serialize_triton_kernel,
        )

        def local_kernel():
            pass

        with self.assertRaisesRegex(RuntimeError, "Kernel fn missing __module__ or __name__"):
            _serialize_triton_kernel(object())
        with self.assertRaisesRegex(RuntimeError, "local_kernel is defined in a local scope"):
            _serialize_triton_kernel(_KernelLike(local_kernel))
        # Loading imports nothing by name: the kernel's module must be imported.
        with self.assertRaisesRegex(PackageError, "module not_imported_kernels, which is not imported"):
            _deserialize_triton_kernel(("not_imported_kernels", "k"))
        self.assertNotIn("not_imported_kernels", sys.modules)
        with self.assertRaisesRegex(PackageError, "module torch has no triton kernel no_such_kernel"):
            _deserialize_triton_kernel(("torch", "no_such_kernel"))


class TestGuardsStateEntryPoints(torch._dynamo.test_case.TestCase):
    """torch._dynamo.package.load_guards_state / load_guard_manager, upstream's
    signatures and behaviour."""

    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="guards-state-test-"))
        self.save_cache = str(self.tmp / "save-cache")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def _guards_of_scaled_sum(self):
        compiled = torch.compile(_scaled_sum, fullgraph=True, backend="eager")
        with torch._dynamo.config.patch(enable_aot_compile=True):
            aot = compiled.aot_compile(((torch.randn(4, 3),), {}))
        artifacts = getattr(aot, "_artifacts", None)  # torch 2.13
        return artifacts.guards_state if artifacts is not None else aot._guards_state

    def test_in_process(self):
        from torch._dynamo.package import load_guard_manager, load_guards_state

        state = load_guards_state(self._guards_of_scaled_sum())
        self.assertEqual(type(state).__name__, "GuardsState")
        manager = load_guard_manager(state, _scaled_sum.__code__, globals())
        self.assertTrue(manager.check({"x": torch.randn(4, 3)}))
        self.assertFalse(manager.check({"x": torch.randn(4, 3, dtype=torch.float64)}))
        self.assertFalse(manager.check({"x": torch.randn(5, 3)}))

    def test_damaged_bytes_are_refused(self):
        from torch._dynamo.package import load_guards_state

        data = self._guards_of_scaled_sum()
        with self.assertRaisesRegex(PackageError, "damaged"):
            load_guards_state(data[: len(data) // 2])

    def test_guards_of_another_code_are_refused(self):
        from torch._dynamo.package import load_guard_manager, load_guards_state

        state = load_guards_state(self._guards_of_scaled_sum())
        with self.assertRaisesRegex(PackageError, "_scaled_sum"):
            load_guard_manager(state, add_one_and_double.__code__, globals())

    def test_fresh_process(self):
        case = self.tmp / "guards_case.py"
        case.write_text(
            textwrap.dedent(
                """
                import torch
                SCALE = 2
                def fn(x, y):
                    return x * SCALE + y.cos()
                """
            )
        )
        state_path = self.tmp / "pkg" / "guards_state.bin"
        state_path.parent.mkdir()
        reports = {
            mode: run_code(
                GUARDS_API,
                mode,
                case,
                state_path,
                cwd=self.tmp,
                env={"TORCHINDUCTOR_CACHE_DIR": self.save_cache},
            )
            for mode in ("save", "load")
        }
        saved, loaded = reports["save"], reports["load"]
        self.assertEqual(loaded["state"], ["GuardsState", True, True])
        # the probes are not all alike: some pass, some fail Dynamo's own guards
        self.assertEqual(set(saved["decisions"]), {True, False})
        self.assertEqual(loaded["decisions"], saved["decisions"])
        self.assertFalse(loaded["after_global_changed"])


instantiate_parametrized_tests(TestAOTCompile)


def _scaled_add(x, y, scale=2.0):
    return x * scale + y


def _make_closure_fn():
    offset = torch.ones(3)

    def add_offset(x):
        return x + offset

    return add_offset, offset


class _Doubler(torch.nn.Module):
    def forward(self, x, bias=None):
        return x * 2 if bias is None else x * 2 + bias


class TestUpstreamAOTCompileNames(torch._dynamo.test_case.TestCase):
    """torch 2.13's aot_compile names on the backport: prepare_f_locals,
    GraphRuntimeEnv, AOTCompilePickler and AOTCompileUnpickler."""

    def _aot_compile(self, fn, args, kwargs=None):
        with torch._dynamo.config.patch(enable_aot_compile=True):
            return torch.compile(fn, fullgraph=True, backend="eager").aot_compile(
                (args, kwargs or {})
            )

    @parametrize("kind", ["function", "closure", "module_forward"])
    def test_prepare_f_locals(self, kind):
        x = torch.randn(3)
        if kind == "function":
            compiled = self._aot_compile(_scaled_add, (x, x))
            f_locals = compiled.prepare_f_locals(x, y=x)
            self.assertEqual(list(f_locals), ["x", "y", "scale"])
            self.assertIs(f_locals["y"], x)
            self.assertEqual(f_locals["scale"], 2.0)
        elif kind == "closure":
            fn, offset = _make_closure_fn()
            compiled = self._aot_compile(fn, (x,))
            f_locals = compiled.prepare_f_locals(x)
            self.assertIs(f_locals["x"], x)
            self.assertIs(f_locals["offset"], offset)
        else:
            model = _Doubler()
            with torch._dynamo.config.patch(enable_aot_compile=True):
                compiled = torch.compile(model, fullgraph=True, backend="eager").forward.aot_compile(
                    ((x,), {})
                )
            f_locals = compiled.prepare_f_locals(model, x)
            self.assertEqual(f_locals, {"self": model, "x": x, "bias": None})
        with self.assertRaises(TypeError):
            compiled.prepare_f_locals(x, x, x, x, x)

    def test_call_checks_guards_on_prepare_f_locals(self):
        from unittest import mock

        x = torch.randn(3)
        compiled = self._aot_compile(_scaled_add, (x, x))
        with mock.patch.object(compiled, "prepare_f_locals", wraps=compiled.prepare_f_locals) as spy:
            self.assertEqual(compiled(x, x), _scaled_add(x, x))
        spy.assert_called_once_with(x, x)
        self.assertTrue(compiled.guard_check(x, x))
        self.assertFalse(compiled.guard_check(x.double(), x))

    def test_graph_runtime_env_of_compiled_function(self):
        from torch._dynamo.aot_compile import GraphRuntimeEnv

        fn, _ = _make_closure_fn()
        x = torch.randn(3)
        compiled = self._aot_compile(fn, (x,))
        env = compiled.runtime_env
        self.assertIsInstance(env, GraphRuntimeEnv)
        self.assertIs(compiled._artifacts.runtime_env, env)
        self.assertEqual(env.pycode, [])
        self.assertIs(env.closure, fn.__closure__)
        self.assertEqual(env.bytecode.co_name, fn.__code__.co_name)
        self.assertIs(env.used_globals, fn.__globals__)
        runnable = env.forward_callable(None, None)
        self.assertEqual(torch._dynamo.disable(runnable)(x), fn(x))
        with self.assertRaisesRegex(RuntimeError, "No Python code generated"):
            env.forward_callable(None, None, use_python_codegen=True)

    def test_graph_runtime_env_forward_callable(self):
        import math

        from torch._dynamo.aot_compile import GraphRuntimeEnv

        namespace = {}
        exec(
            "def body(x, k=1, *, m=2):\n"
            "    return __compiled_fn_9(x) + __import_math.floor(k + m) + OFFSET\n",
            namespace,
        )
        code = namespace["body"].__code__
        module_globals = {"__name__": "scratch"}
        env = GraphRuntimeEnv(
            bytecode=code,
            pycode=[],
            import_sources={"__import_math": "math"},
            used_globals=module_globals,
            closure=None,
            argdefs=(1.5,),
            kwdefaults={"m": 2},
            external_refs={"OFFSET"},
        )
        with self.assertRaisesRegex(RuntimeError, r"Missing required external references: \['OFFSET'\]"):
            env.forward_callable("__compiled_fn_9", lambda v: v * 10)
        fn = env.forward_callable("__compiled_fn_9", lambda v: v * 10, extra_globals={"OFFSET": 100})
        self.assertEqual(fn(1), 10 + 3 + 100)
        self.assertIs(fn.__globals__["__import_math"], math)
        self.assertNotIn("__compiled_fn_9", module_globals)
        # A package never imports a module by name.
        env = GraphRuntimeEnv(code, [], {"__import_math": "not_imported_anywhere"}, {}, None, None)
        with self.assertRaisesRegex(PackageError, "not imported"):
            env.forward_callable("__compiled_fn_9", abs, extra_globals={"OFFSET": 0})

    def test_pickler_round_trip_with_external_data(self):
        from torch._dynamo.aot_compile import AOTCompilePickler, AOTCompileUnpickler

        saved_model, loaded_model = _Doubler(), _Doubler()
        record = {"archives": [b"\x00archive"], "names": ("a", 1, 2.5), "model": saved_model}
        buf = io.BytesIO()
        pickler = AOTCompilePickler({"model": saved_model}, buf)
        pickler.dump(record)
        self.assertEqual(pickler.errors, {})
        loaded = AOTCompileUnpickler({"model": loaded_model}, io.BytesIO(buf.getvalue())).load()
        self.assertEqual(loaded["archives"], record["archives"])
        self.assertEqual(loaded["names"], record["names"])
        self.assertIs(loaded["model"], loaded_model)
        with self.assertRaisesRegex(RuntimeError, "Missing required external reference to data: model"):
            AOTCompileUnpickler({}, io.BytesIO(buf.getvalue())).load()
        # An nn.Module that is not external data is collected for the caller to refuse.
        pickler = AOTCompilePickler({}, io.BytesIO())
        pickler.dump([saved_model])
        self.assertEqual(list(pickler.errors.values()), [saved_model])

    def test_unpickler_refuses_hostile_pickle(self):
        from torch._dynamo.aot_compile import AOTCompileUnpickler

        marker = Path(tempfile.mkdtemp()) / "ran"

        class Hostile:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        for data in (pickle.dumps([b"archive", Hostile()]), pickle.dumps(_Doubler())):
            with self.assertRaisesRegex(PackageError, "builtin containers"):
                AOTCompileUnpickler({}, io.BytesIO(data)).load()
        self.assertFalse(marker.exists())

    def test_compiled_module_data_uses_the_restricted_unpickler(self):
        from torch._dynamo.aot_compile import AOTCompiledModel

        model = _Doubler()
        with self.assertRaisesRegex(PackageError, "builtin containers"):
            AOTCompiledModel.deserialize(model, pickle.dumps([_Doubler()]))


instantiate_parametrized_tests(TestUpstreamAOTCompileNames)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
