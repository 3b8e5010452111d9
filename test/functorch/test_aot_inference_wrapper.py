# Owner(s): ["module: functorch"]
"""AOTAutograd runs an inference graph with nothing to fix up behind one wrapper
(See NOTE: [Inference graphs with nothing to fix up]); a graph that mutates an
input, returns an alias or changes the grad mode keeps the full runtime wrapper,
and both give eager's results."""

from unittest import mock

import torch
import torch._dynamo
import torch._dynamo.test_case
from torch._functorch._aot_autograd import runtime_wrappers
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def _pointwise(x):
    return x.sin() * 2 + 1


def _mutates_input(x):
    x.add_(1)
    return x.cos()


def _returns_a_view_of_input(x):
    return x.view(-1), x.sum()


def _turns_grad_on(x):
    torch._C._set_grad_enabled(True)
    return x * 3


class InferenceRuntimeWrapperTests(torch._dynamo.test_case.TestCase):
    def _run(self, fn, x, *, grad):
        """Compile ``fn`` with aot_eager and call it once under ``grad``; return
        the output, the grad mode after the call, and whether the one-wrapper
        path was taken."""
        torch._dynamo.reset()
        real = runtime_wrappers._inference_runtime_wrapper
        with mock.patch.object(
            runtime_wrappers, "_inference_runtime_wrapper", side_effect=real
        ) as spy, torch.set_grad_enabled(grad):
            out = torch.compile(fn, backend="aot_eager")(x)
            grad_after = torch.is_grad_enabled()
        return out, grad_after, spy.call_count > 0

    @parametrize("grad", [False, True])
    def test_a_graph_with_nothing_to_fix_up_gets_one_wrapper(self, grad):
        x = torch.randn(6)
        out, grad_after, flattened = self._run(_pointwise, x, grad=grad)
        self.assertTrue(flattened)
        self.assertEqual(out, _pointwise(x))
        self.assertEqual(grad_after, grad)
        self.assertFalse(out.requires_grad)

    def test_the_compiled_function_runs_with_grad_off(self):
        seen = []

        def record_grad_mode(gm, example_inputs):
            def run(*args):
                seen.append(torch.is_grad_enabled())
                return gm(*args)

            return run

        from torch._dynamo.backends.common import aot_autograd

        torch._dynamo.reset()
        backend = aot_autograd(fw_compiler=record_grad_mode)
        x = torch.randn(6)
        # Grad on, but no input needs a gradient: an inference graph.
        out = torch.compile(_pointwise, backend=backend)(x)
        self.assertEqual(out, _pointwise(x))
        self.assertEqual(seen, [False])
        self.assertTrue(torch.is_grad_enabled())

    def test_an_input_mutation_keeps_the_full_wrapper(self):
        x = torch.randn(6)
        expected_x = x.clone()
        expected = _mutates_input(expected_x)
        with torch.no_grad():
            out, _, flattened = self._run(_mutates_input, x, grad=False)
        self.assertFalse(flattened)
        self.assertEqual(out, expected)
        self.assertEqual(x, expected_x)

    def test_an_output_aliasing_an_input_keeps_the_full_wrapper(self):
        x = torch.randn(2, 3)
        (flat, total), _, flattened = self._run(_returns_a_view_of_input, x, grad=False)
        self.assertFalse(flattened)
        self.assertEqual(total, x.sum())
        # The output is regenerated as a view of the input, as in eager.
        self.assertEqual(flat.untyped_storage().data_ptr(), x.untyped_storage().data_ptr())

    def test_a_grad_mode_change_keeps_the_full_wrapper(self):
        x = torch.randn(6)
        out, grad_after, flattened = self._run(_turns_grad_on, x, grad=False)
        self.assertFalse(flattened)
        self.assertEqual(out, x * 3)
        # The graph turned grad on; the caller sees it on after the call, as in eager.
        self.assertTrue(grad_after)
        torch._C._set_grad_enabled(True)


instantiate_parametrized_tests(InferenceRuntimeWrapperTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
