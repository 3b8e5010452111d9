# Owner(s): ["module: functorch"]
"""AOTAutograd runs a joint graph with nothing to fix up behind one wrapper
(See NOTE: [Joint graphs with nothing to fix up]): inputs that never need
gradients arrive detached, the compiled function runs with grad and original
view tracking on, both modes are restored after the call (also when it raises),
and outputs and gradients are eager's. A joint graph that mutates an input,
returns an alias of one or was compiled under autocast keeps the full runtime
wrapper."""

from unittest import mock

import torch
import torch._dynamo
import torch._dynamo.test_case
from torch._functorch._aot_autograd import runtime_wrappers
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def _mlp(x, w):
    return torch.relu(x @ w).sum(dim=1)


def _mutates_buffer(x, buf):
    buf.add_(1)
    return (x * buf).sin()


def _returns_a_view_of_its_input(x, w):
    return x.view(-1), x @ w


class JointRuntimeWrapperTests(torch._dynamo.test_case.TestCase):
    def _compile(self, fn, backend="aot_eager"):
        torch._dynamo.reset()
        return torch.compile(fn, backend=backend, fullgraph=True)

    def _run(self, fn, *args):
        """Compile ``fn`` with aot_eager and call it once; return the outputs and
        whether the one-wrapper path was taken."""
        real = runtime_wrappers._joint_runtime_wrapper
        with mock.patch.object(runtime_wrappers, "_joint_runtime_wrapper", side_effect=real) as spy:
            out = self._compile(fn)(*args)
        return out, spy.call_count > 0

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_a_joint_graph_with_nothing_to_fix_up_gets_one_wrapper(self, backend):
        x = torch.randn(4, 5, requires_grad=True)
        w = torch.randn(5, 3, requires_grad=True)
        real = runtime_wrappers._joint_runtime_wrapper
        with mock.patch.object(runtime_wrappers, "_joint_runtime_wrapper", side_effect=real) as spy:
            compiled = self._compile(_mlp, backend)
            out = compiled(x, w)
        self.assertEqual(spy.call_count, 1)
        self.assertTrue(torch.is_grad_enabled())
        self.assertFalse(torch._C._is_view_replay_enabled())
        x_ref = x.detach().clone().requires_grad_()
        w_ref = w.detach().clone().requires_grad_()
        expected = _mlp(x_ref, w_ref)
        self.assertEqual(out, expected)
        self.assertTrue(out.requires_grad)
        out.sum().backward()
        expected.sum().backward()
        self.assertEqual(x.grad, x_ref.grad)
        self.assertEqual(w.grad, w_ref.grad)
        # A second call takes the same entry and gives eager's result again.
        self.assertEqual(compiled(x, w), _mlp(x, w))

    def _wrapper_around(self, record):
        """_joint_runtime_wrapper around a boxed function that calls ``record``
        with its arguments, then returns them as its outputs."""

        def compiled_fn(args):
            record(list(args))
            return tuple(args)

        compiled_fn._boxed_call = True
        return runtime_wrappers._joint_runtime_wrapper(compiled_fn, [1])

    @parametrize("grad", [False, True])
    def test_the_compiled_function_runs_with_grad_and_view_tracking_on(self, grad):
        seen = []
        wrapper = self._wrapper_around(
            lambda args: seen.append((torch.is_grad_enabled(), torch._C._is_view_replay_enabled()))
        )
        with torch.set_grad_enabled(grad):
            outs = wrapper([torch.randn(2), torch.randn(2)])
            self.assertEqual(torch.is_grad_enabled(), grad)
        self.assertEqual(seen, [(True, True)])
        self.assertFalse(torch._C._is_view_replay_enabled())
        # Outputs come back as a list, as runtime_wrapper returns them.
        self.assertIsInstance(outs, list)

    def test_view_tracking_already_on_stays_on(self):
        wrapper = self._wrapper_around(lambda args: None)
        torch._C._set_view_replay_enabled(True)
        try:
            wrapper([torch.randn(2), torch.randn(2)])
            self.assertTrue(torch._C._is_view_replay_enabled())
        finally:
            torch._C._set_view_replay_enabled(False)

    def test_modes_are_restored_when_the_compiled_function_raises(self):
        def fail(args):
            raise RuntimeError("compiled forward failed")

        wrapper = self._wrapper_around(fail)
        with torch.no_grad():
            with self.assertRaisesRegex(RuntimeError, "compiled forward failed"):
                wrapper([torch.randn(2), torch.randn(2)])
            self.assertFalse(torch.is_grad_enabled())
        self.assertFalse(torch._C._is_view_replay_enabled())

    def test_inputs_that_never_need_gradients_arrive_detached(self):
        seen = []
        wrapper = self._wrapper_around(seen.append)
        x = torch.randn(2, requires_grad=True)
        w = torch.randn(2, requires_grad=True)
        caller_args = [x, w, 3]
        wrapper(caller_args)
        (got,) = seen
        # Index 1 is the one to detach: it arrives without requires_grad, a
        # detached alias of w; x is passed as it is.
        self.assertIs(got[0], x)
        self.assertFalse(got[1].requires_grad)
        self.assertEqual(got[1].data_ptr(), w.data_ptr())
        self.assertEqual(got[2], 3)
        # The caller's list is not changed.
        self.assertIs(caller_args[1], w)

    def test_a_graph_compiled_under_autocast_keeps_the_full_wrapper(self):
        # AOTAutograd turns autocast off around such a graph's compiled
        # forward (disable_amp): the full wrapper and its helper do that.
        x = torch.randn(4, 5, requires_grad=True)
        w = torch.randn(5, 3, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, flattened = self._run(_mlp, x, w)
            expected = _mlp(x, w)
        self.assertFalse(flattened)
        self.assertEqual(out.dtype, expected.dtype)
        self.assertEqual(out, expected)
        out.sum().backward()
        self.assertIsNotNone(w.grad)

    def test_an_input_mutation_keeps_the_full_wrapper(self):
        x = torch.randn(4, requires_grad=True)
        buf = torch.zeros(4)
        expected_buf = buf.clone()
        expected = _mutates_buffer(x, expected_buf)
        out, flattened = self._run(_mutates_buffer, x, buf)
        self.assertFalse(flattened)
        self.assertEqual(out, expected)
        self.assertEqual(buf, expected_buf)

    def test_an_output_aliasing_an_input_keeps_the_full_wrapper(self):
        x = torch.randn(4, 5, requires_grad=True)
        w = torch.randn(5, 3, requires_grad=True)
        (flat, product), flattened = self._run(_returns_a_view_of_its_input, x, w)
        self.assertFalse(flattened)
        self.assertEqual(product, x @ w)
        # The output is regenerated as a view of the input, as in eager.
        self.assertEqual(flat.untyped_storage().data_ptr(), x.untyped_storage().data_ptr())
        self.assertEqual(flat._base, x)


instantiate_parametrized_tests(JointRuntimeWrapperTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
