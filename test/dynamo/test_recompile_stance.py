# Owner(s): ["module: dynamo"]
"""set_stance("fail_on_recompile"): frames Dynamo never compiles (torch's own, by
trace_rules) are not recompiles, and the error names the frame that would
recompile."""

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch._dynamo.testing
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def _double(x):
    return x * 2


class FailOnRecompileStanceTests(torch._dynamo.test_case.TestCase):
    def test_a_new_shape_the_dynamic_entry_covers_is_not_a_recompile(self):
        # pytorch#139202: the dynamic entry serves the new shape, but on the way
        # Dynamo's own size helper (torch/_dynamo/utils.py) reaches the callback.
        counter = torch._dynamo.testing.CompileCounter()
        f = torch.compile(_double, backend=counter)
        f(torch.randn(2, 3))
        f(torch.randn(2, 4))
        self.assertEqual(counter.frame_count, 2)
        with torch.compiler.set_stance("fail_on_recompile"):
            x = torch.randn(2, 6)
            self.assertEqual(f(x), x * 2)
        self.assertEqual(counter.frame_count, 2)

    def test_each_compiled_callable_keeps_its_own_callback(self):
        # The stance reuses the callback it built for the same Dynamo callback
        # (it is asked on every call); two compiled callables called in turn
        # still each run their own entries, and a miss of either still fails.
        from torch._dynamo.eval_frame import _callback_from_stance

        def _triple(x):
            return x * 3

        counter = torch._dynamo.testing.CompileCounter()
        f = torch.compile(_double, backend=counter, dynamic=False)
        g = torch.compile(_triple, backend=counter, dynamic=False)
        x = torch.randn(3)
        f(x), g(x)
        with torch.compiler.set_stance("fail_on_recompile"):
            for _ in range(2):
                self.assertEqual(f(x), x * 2)
                self.assertEqual(g(x), x * 3)
            first = _callback_from_stance(counter)
            self.assertIs(_callback_from_stance(counter), first)
            self.assertIsNot(_callback_from_stance(torch._dynamo.testing.CompileCounter()), first)
            with self.assertRaisesRegex(RuntimeError, "function name: '_triple'"):
                g(torch.randn(4))
        self.assertEqual(counter.frame_count, 2)

    @parametrize("backend", ["eager", "aot_eager"])
    def test_the_error_names_the_frame(self, backend):
        f = torch.compile(_double, backend=backend, dynamic=False)
        f(torch.randn(3))
        with torch.compiler.set_stance("fail_on_recompile"):
            with self.assertRaisesRegex(
                RuntimeError,
                r"Detected recompile when torch.compile stance is 'fail_on_recompile'\. "
                r"filename: '.*test_recompile_stance\.py', function name: '_double', "
                r"line number: \d+",
            ):
                f(torch.randn(4))


instantiate_parametrized_tests(FailOnRecompileStanceTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
