# Owner(s): ["module: dynamo"]
"""Compile packages of frozen models: Inductor's freezing under torch.no_grad().

Every case is saved by one interpreter and loaded by a FRESH one with an empty
TORCHINDUCTOR_CACHE_DIR under torch.compiler.set_stance("fail_on_recompile").
A frozen graph (parameters folded into constants: conv+bn folded, linear
weights transposed), compiled with default options, loads with zero
recompiles and eager's outputs; the manifest says the package is frozen; a
package loaded for a module whose parameters changed is refused (NOTE:
[Parameters of frozen packages] in torch/_dynamo/package_artifacts.py); what
cannot be packaged is refused at save with a warning naming why; an
aot_compile'd frozen forward loads or is refused at load, never wrong.
"""

import shutil
import tempfile
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


FREEZING_RUNNER = r'''
import io, json, logging, os, sys, warnings
import torch
import torch._inductor.config as inductor_config
from torch.testing._internal.fresh_process import write_report

CASES = {CASES}


class ConvBN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 32)
        self.linear2 = torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.linear2(torch.relu(self.linear1(x)))


def drop_tensor_identity_guards(entries):
    # Freezing guards the parameters it folds by identity, which no other
    # process can check; the package checks their values at load instead.
    return [not (e.guard_type == "ID_MATCH" and isinstance(e.value, torch.Tensor)) for e in entries]


def make(model):
    torch.manual_seed(0)
    module = {"conv_bn": ConvBN, "mlp": MLP}[model]().eval()
    if model == "conv_bn":
        with torch.no_grad():
            module.bn.running_mean.uniform_(-1, 1)
            module.bn.running_var.uniform_(0.5, 2.0)
            module.bn.weight.uniform_(0.5, 1.5)
        return module, torch.randn(2, 3, 10, 10)
    return module, torch.randn(4, 16)


class PrepackLogs(logging.Handler):
    """Counts the package's INFO lines saying weight prepack is off."""

    def __enter__(self):
        self.count = 0
        self.logger = logging.getLogger("torch._dynamo.package")
        self.level = self.logger.level
        self.logger.setLevel(logging.INFO)
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
        self.logger.setLevel(self.level)

    def emit(self, record):
        self.count += record.levelno == logging.INFO and "weight_prepack" in record.getMessage()


def frozen_constants(package):
    graphs = os.path.join(package, "graphs")
    count = 0
    for name in os.listdir(graphs) if os.path.isdir(graphs) else ():
        with open(os.path.join(graphs, name), "rb") as f:
            payload = torch.load(io.BytesIO(f.read()), weights_only=False)
        count += len(payload.get("frozen", {}).get("constants", {}))
    return count


def aot_compile_case(mode, module, x, options, path, change_at_load=None):
    got = {}
    if mode == "load" and change_at_load:
        with torch.no_grad():
            dict(module.named_parameters())[change_at_load].mul_(1.5)
    with torch._dynamo.config.patch("enable_aot_compile", True), torch.no_grad():
        try:
            if mode == "save":
                compiled = torch.compile(module, fullgraph=True, options=options)
                compiled.forward.aot_compile(((x,), {})).save_compiled_function(path)
            else:
                with torch.compiler.set_stance("fail_on_recompile"):
                    loaded = torch.compiler.load_compiled_function(path)
                    got["same"] = bool(torch.allclose(loaded(module, x), module(x), atol=1e-5))
        except Exception as e:
            got["error"] = f"{type(e).__name__}: {e}"[:600]
    return got


mode, where = sys.argv[1:3]
report = {}
DEFAULT_WEIGHT_PREPACK = inductor_config.cpp.weight_prepack
for name, case in CASES.items():
    torch._dynamo.reset()
    inductor_config.freezing = case["global_freezing"]
    inductor_config.cpp.weight_prepack = case.get("weight_prepack", DEFAULT_WEIGHT_PREPACK)
    module, x = make(case["model"])
    options = dict(case.get("options", {}))
    if case.get("drop_identity_guards"):
        options["guard_filter_fn"] = drop_tensor_identity_guards
    package = os.path.join(where, name)
    if case.get("aot_compile"):
        report[name] = aot_compile_case(
            mode, module, x, options, package, case.get("change_at_load")
        )
        continue
    compiled = torch.compile(module, package=package, options=options)
    got = {}
    if mode == "save":
        prepack_logs = PrepackLogs()
        with warnings.catch_warnings(record=True) as caught, torch.no_grad(), prepack_logs:
            warnings.simplefilter("always")
            compiled(x)
            compiled.save_package()
        got["warnings"] = [str(w.message) for w in caught if "package" in str(w.message)]
        got["prepack_off_logs"] = prepack_logs.count
        with open(os.path.join(package, "manifest.json")) as f:
            manifest = json.load(f)
        got["entries"] = manifest["entries"]
        got["frozen"] = manifest.get("frozen")
        got["frozen_constants"] = frozen_constants(package)
    else:
        from torch._dynamo.utils import counters

        if case.get("change_at_load"):
            with torch.no_grad():
                dict(module.named_parameters())[case["change_at_load"]].mul_(1.5)
        if case.get("replace_at_load"):
            owner, _, leaf = case["replace_at_load"].rpartition(".")
            old = getattr(module.get_submodule(owner), leaf)
            setattr(module.get_submodule(owner), leaf, torch.nn.Parameter(old.detach().clone()))
        counters.clear()
        with torch.compiler.set_stance("fail_on_recompile"), torch.no_grad():
            try:
                compiled.load_package()
                got["same"] = bool(torch.allclose(compiled(x), module(x), atol=1e-5))
            except Exception as e:
                got["error"] = f"{type(e).__name__}: {e}"[:600]
        got["traced_graphs"] = counters["stats"]["unique_graphs"]
    report[name] = got
write_report(report)
'''

# Frozen the way CPU inference sets it, with default options: Inductor's
# global freezing flag under torch.no_grad() (Dynamo reads
# torch._inductor.config.freezing when it traces, to fold the parameters it
# marks static). The package drops Dynamo's identity guards on the folded
# parameters itself and compiles with weight prepack off (NOTE: [Weight
# prepacking in frozen packages]).
FROZEN = dict(global_freezing=True)

ROUND_TRIP_CASES = {
    "conv_bn": dict(FROZEN, model="conv_bn"),
    "mlp": dict(FROZEN, model="mlp"),
    # A parameter replaced by an equal one: the package checks values.
    "mlp_equal_parameter_replaced": dict(FROZEN, model="mlp", replace_at_load="linear1.weight"),
    # What a user of the first frozen packages wrote keeps working.
    "mlp_user_guard_filter": dict(
        FROZEN,
        model="mlp",
        weight_prepack=False,
        drop_identity_guards=True,
        options={"cpp.weight_prepack": False},
    ),
    # options={"freezing": True} alone: 2.7.1's Dynamo does not see the option
    # when it traces, so no parameter is folded (they stay graph inputs), but
    # Inductor compiles the graph with its freezing compiler all the same.
    "mlp_freezing_option": dict(
        model="mlp",
        global_freezing=False,
        options={"freezing": True},
        change_at_load="linear1.weight",
    ),
}

CHANGED_PARAMETER_CASES = {
    "conv_bn_changed_conv_weight": dict(FROZEN, model="conv_bn", change_at_load="conv.weight"),
    "mlp_changed_linear2_bias": dict(FROZEN, model="mlp", change_at_load="linear2.bias"),
}

# aot_compile of a frozen module's forward: name -> what its load and first call
# say (None: it loads and matches eager). The module is the first argument of
# each call of an aot_compile'd forward: folded values are checked against it.
AOT_COMPILE_CASES = {
    "aot_compile_freezing_option": (
        dict(model="mlp", global_freezing=False, aot_compile=True, options={"freezing": True}),
        None,
    ),
    "aot_compile_folded": (dict(FROZEN, model="mlp", aot_compile=True), None),
    "aot_compile_folded_changed_parameter": (
        dict(FROZEN, model="mlp", aot_compile=True, change_at_load="linear2.bias"),
        "from other values of 'linear2.bias'",
    ),
}

# name -> (case, what the save warning names). Saved by one process, in this
# order: Inductor registers its weight-packing passes at the first frozen
# compile of a process that has cpp.weight_prepack on, and applies them from
# then on, whatever the option says.
REFUSED_CASES = {
    "explicit_weight_prepack": (
        dict(FROZEN, model="conv_bn", options={"cpp.weight_prepack": True}),
        "cpp.weight_prepack, set explicitly",
    ),
    "weight_prepack_registered_earlier": (
        dict(FROZEN, model="mlp"),
        "once per process",
    ),
}

# One save process and one load process for every case that loads.
ALL_CASES = {
    **ROUND_TRIP_CASES,
    **CHANGED_PARAMETER_CASES,
    **{name: case for name, (case, _) in AOT_COMPILE_CASES.items()},
}


class TestPackageFreezing(torch._dynamo.test_case.TestCase):
    reports: dict = {}

    def run_cases(self, cases=None, modes=("save", "load")):
        cases = ALL_CASES if cases is None else cases
        key = tuple(cases)
        if key in TestPackageFreezing.reports:
            return TestPackageFreezing.reports[key]
        where = Path(tempfile.mkdtemp(prefix="package-freezing-"))
        self.addCleanup(shutil.rmtree, where, True)
        source = FREEZING_RUNNER.replace("{CASES}", repr(cases))
        reports = {}
        for mode in modes:
            # Each process has an empty inductor cache of its own.
            reports[mode] = run_code(source, mode, where, cwd=where, fresh_inductor_cache=True)
        TestPackageFreezing.reports[key] = reports
        return reports

    @parametrize("name", list(ROUND_TRIP_CASES))
    def test_frozen_package_loads_without_recompiling(self, name):
        reports = self.run_cases()
        saved, loaded = reports["save"][name], reports["load"][name]
        self.assertEqual((saved["warnings"], saved["entries"]), ([], 1))
        self.assertTrue(saved["frozen"])
        if ROUND_TRIP_CASES[name]["global_freezing"]:
            # the parameters really were folded into constants the package carries
            self.assertGreater(saved["frozen_constants"], 0)
            # one INFO line says weight prepack is off, unless the user set it
            self.assertEqual(
                saved["prepack_off_logs"],
                0 if "cpp.weight_prepack" in ROUND_TRIP_CASES[name].get("options", {}) else 1,
            )
        self.assertEqual(
            (loaded.get("error"), loaded["same"], loaded["traced_graphs"]), (None, True, 0)
        )

    @parametrize("name", list(CHANGED_PARAMETER_CASES))
    def test_frozen_package_for_changed_parameters_is_refused(self, name):
        reports = self.run_cases()
        saved, loaded = reports["save"][name], reports["load"][name]
        self.assertEqual((saved["entries"], saved["frozen"]), (1, True))
        self.assertIn("PackageError", loaded.get("error", ""))
        self.assertIn(repr(CHANGED_PARAMETER_CASES[name]["change_at_load"]), loaded["error"])
        self.assertNotIn("same", loaded)

    @parametrize("name", list(AOT_COMPILE_CASES))
    def test_aot_compiled_frozen_forward(self, name):
        reports = self.run_cases()
        self.assertNotIn("error", reports["save"][name])
        loaded, refusal = reports["load"][name], AOT_COMPILE_CASES[name][1]
        if refusal is None:
            self.assertEqual((loaded.get("error"), loaded.get("same")), (None, True))
        else:
            self.assertIn("PackageError", loaded.get("error", ""))
            self.assertIn(refusal, loaded["error"])
            self.assertNotIn("same", loaded)

    @parametrize("name", list(REFUSED_CASES))
    def test_frozen_graph_refused_at_save_with_a_warning_naming_why(self, name):
        cases = {n: case for n, (case, _) in REFUSED_CASES.items()}
        saved = self.run_cases(cases, modes=("save",))["save"][name]
        self.assertEqual(saved["entries"], 0)
        self.assertEqual(len(saved["warnings"]), 1, saved["warnings"])
        self.assertIn(REFUSED_CASES[name][1], saved["warnings"][0])
        self.assertIn("freezing", saved["warnings"][0])


instantiate_parametrized_tests(TestPackageFreezing)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
