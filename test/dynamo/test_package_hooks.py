# Owner(s): ["module: dynamo"]
"""Loading a compile package changes nothing in the process outside the load.

A packaged Inductor graph loads its CPU kernels from the package and takes the
vector ISA they were built for without Inductor's probe, through two hooks
scoped to the load (NOTE: [Prebuilt CPU kernels] in torch/_inductor/codecache.py,
NOTE: [A recorded vector ISA] in torch/_inductor/cpu_vec_isa.py); a package's
compile hears what AOTAutograd built through a listener scoped to that compile
(NOTE: [AOTAutograd compile listeners] in autograd_cache.py). These tests load a
package saved by another process, then compile something else in the same
process, and show that compile is the one torch would have run without the load.
"""

import os
import shutil
import tempfile
import textwrap
import threading
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._functorch._aot_autograd import autograd_cache
from torch._inductor import codecache, cpu_vec_isa
from torch._inductor import config as inductor_config
from torch._inductor.utils import fresh_inductor_cache
from torch.testing._internal.common_utils import slowTest
from torch.testing._internal.fresh_process import run_code


MODEL_SOURCE = textwrap.dedent(
    """
    import torch


    def scaled_gelu(x):
        return torch.nn.functional.gelu(x) * 3 - x.cos()
    """
)

SAVE = textwrap.dedent(
    """
    import sys

    import torch
    from torch.testing._internal.fresh_process import write_report

    import hooks_model

    compiled = torch.compile(hooks_model.scaled_gelu, package=sys.argv[1])
    compiled(torch.randn(4, 8))
    compiled.save_package()
    write_report({"saved": True})
    """
)


def _compiled_binaries(cache_dir: str) -> list[str]:
    return sorted(str(p) for p in Path(cache_dir).rglob("*.so"))


class TestLoadLeavesTheProcessAlone(torch._dynamo.test_case.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.where = Path(tempfile.mkdtemp(prefix="package-hooks-"))
        (cls.where / "hooks_model.py").write_text(MODEL_SOURCE)
        cls.package = cls.where / "package"
        run_code(SAVE, cls.package, pythonpath=[cls.where], fresh_inductor_cache=True)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.where, ignore_errors=True)
        super().tearDownClass()

    def _hook_state(self):
        return (
            inductor_config.cpp.vec_isa_ok,
            codecache.CppPythonBindingsCodeCache.__dict__["load_pybinding_async"],
            codecache._prebuilt_kernel_lookup.get(),
            cpu_vec_isa._recorded_vec_isa.get(),
            autograd_cache._compile_listener.get(),
        )

    def _load_and_call(self):
        import sys

        sys.path.insert(0, str(self.where))
        self.addCleanup(sys.path.remove, str(self.where))
        import hooks_model

        compiled = torch.compile(hooks_model.scaled_gelu, package=str(self.package))
        compiled.load_package()
        x = torch.randn(4, 8)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(compiled(x), hooks_model.scaled_gelu(x))

    @slowTest
    def test_a_load_then_a_compile_in_the_same_process(self):
        before = self._hook_state()
        cache_dir = tempfile.mkdtemp(dir=self.where, prefix="inductor-cache-")
        with fresh_inductor_cache(dir=cache_dir):
            self._load_and_call()
            # The load ran no compiler: its kernels came from the package.
            self.assertEqual(_compiled_binaries(cache_dir), [])
            self.assertEqual(self._hook_state(), before)
            self.assertIsNone(inductor_config.cpp.vec_isa_ok)

            # A compile after the load builds its own kernel with gcc, for the
            # ISA Inductor picks itself, and computes the right thing.
            def other(x):
                return x.sigmoid() * 5 + 1

            x = torch.randn(16)
            self.assertEqual(torch.compile(other, backend="inductor")(x), other(x))
            self.assertNotEqual(_compiled_binaries(cache_dir), [])

    def test_the_hooks_hold_only_inside_their_block_and_thread(self):
        seen = {}

        def elsewhere():
            seen["lookup"] = codecache._prebuilt_kernel_lookup.get()
            seen["isa"] = cpu_vec_isa.pick_vec_isa()

        isa = cpu_vec_isa.pick_vec_isa()
        with codecache.prebuilt_cpp_kernels(lambda *args: None), cpu_vec_isa.recorded_vec_isa(str(isa)):
            self.assertEqual(str(cpu_vec_isa.pick_vec_isa()), str(isa))
            self.assertIsNotNone(codecache._prebuilt_kernel_lookup.get())
            worker = threading.Thread(target=elsewhere)
            worker.start()
            worker.join()
        self.assertIsNone(seen["lookup"])
        self.assertEqual(str(seen["isa"]), str(isa))
        self.assertIsNone(codecache._prebuilt_kernel_lookup.get())
        self.assertIsNone(cpu_vec_isa._recorded_vec_isa.get())

    def test_a_recorded_isa_the_cpu_lacks_is_ignored(self):
        # A package cannot make Inductor target instructions this CPU does not
        # report: such a name (or an unknown one) leaves the probe in charge.
        lacking = [
            isa
            for isa in cpu_vec_isa.supported_vec_isa_list
            if os.uname().machine == "x86_64"
            and not all(flag in cpu_vec_isa.x86_isa_checker() for flag in str(isa).split())
        ]
        picked = cpu_vec_isa.pick_vec_isa()
        for name in [*(str(isa) for isa in lacking), "no-such-isa"]:
            with cpu_vec_isa.recorded_vec_isa(name):
                self.assertEqual(str(cpu_vec_isa.pick_vec_isa()), str(picked))


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
