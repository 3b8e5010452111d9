# Owner(s): ["module: dynamo"]
"""Compile packages saved and loaded under the launchers users start jobs with.

torch.multiprocessing.spawn, the launcher of PyTorch's own DDP tutorials, runs the
user's script again in every child as the module ``__mp_main__``; torchrun and
``python -m`` run it as ``__main__``. A package saved under one must load under
the same one, in a fresh process with an empty TORCHINDUCTOR_CACHE_DIR, under
torch.compiler.set_stance("fail_on_recompile") (NOTE: [Globals found through
another module] in torch/_dynamo/package_trust.py).
"""

import pickle
import shutil
import sys
import tempfile
import types
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
from torch.testing._internal.fresh_process import run_script


SCRIPT = r'''
import json, os, sys
import torch
import torch.multiprocessing as mp


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


LIVE = []  # what a job holds until its process ends


def worker(rank, mode, where, report):
    torch.manual_seed(0)
    net = Net()
    compiled = torch.compile(net, package=os.path.join(where, "pkg"))
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    result = {"main": __name__}
    if mode == "save":
        compiled(x)
        compiled.save_package()
        with open(os.path.join(where, "pkg", "manifest.json")) as f:
            result["entries"] = json.load(f)["entries"]
    else:
        compiled.load_package()
        LIVE.append(compiled)
        torch._dynamo.utils.counters.clear()
        with torch.compiler.set_stance("fail_on_recompile"):
            out = compiled(x)
        result["graphs_compiled"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
        result["same"] = bool(torch.allclose(out, net(x), atol=1e-6))
    with open(report, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    mode, where, launcher = sys.argv[1:4]
    report = os.path.join(where, f"{mode}.json")
    if launcher == "spawn":
        mp.spawn(worker, args=(mode, where, report), nprocs=1)
    else:
        worker(0, mode, where, report)
    from torch.testing._internal.fresh_process import write_report

    with open(report) as f:
        write_report(json.load(f))
'''


class TestPackageLaunchers(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="package-launchers-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    @parametrize("launcher", ["spawn", subtest("main", decorators=[slowTest])])
    def test_inductor_package_saves_and_loads(self, launcher):
        script = self.tmp / "train.py"
        script.write_text(SCRIPT)
        saved = run_script(script, "save", self.tmp, launcher, cwd=self.tmp, fresh_inductor_cache=True)
        self.assertEqual(saved["main"], "__mp_main__" if launcher == "spawn" else "__main__")
        self.assertEqual(saved["entries"], 1)
        process_tmp = self.tmp / "process-tmp"
        process_tmp.mkdir()
        loaded = run_script(
            script, "load", self.tmp, launcher, cwd=self.tmp, fresh_inductor_cache=True,
            env={"TMPDIR": str(process_tmp)},
        )
        self.assertEqual((loaded["graphs_compiled"], loaded["same"]), (0, True))
        # The load's copies of the package's kernels are gone with the process
        # (NOTE: [Kernel copies are removed at exit] in torch/_dynamo/package_trust.py).
        self.assertEqual([p.name for p in process_tmp.iterdir() if p.name.startswith("torch_package_")], [])

    def test_memory_format_found_through_another_module(self):
        # The C pickler names an object without __module__ (a memory format, a
        # dtype) by the first module in sys.modules that reaches it: a user
        # module imported before torch reaches it as <module>.torch.<name>.
        from torch._dynamo.package_trust import load_graph_pickle

        user_module = types.ModuleType("user_script_imported_first")
        user_module.torch = torch
        modules = dict(sys.modules)
        sys.modules.clear()
        sys.modules["user_script_imported_first"] = user_module
        try:
            sys.modules.update(modules)
            data = pickle.dumps([torch.contiguous_format, torch.float16])
        finally:
            sys.modules.pop("user_script_imported_first", None)
        self.assertIn(b"user_script_imported_first", data)
        self.assertEqual(load_graph_pickle(data, "<test>"), [torch.contiguous_format, torch.float16])
        # Only data: a callable reached that way is still refused.
        for name in (b"torch.load", b"torch.nn.Module", b"os.system"):
            forged = b"cuser_script_imported_first\n" + name + b"\n."  # GLOBAL, STOP
            with self.assertRaisesRegex(PackageError, "refusing to unpickle"):
                load_graph_pickle(forged, "<test>")


instantiate_parametrized_tests(TestPackageLaunchers)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
