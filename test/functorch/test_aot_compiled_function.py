# Owner(s): ["module: functorch"]
"""AOTAutograd applies a joint graph's CompiledFunction through a boxed caller
that skips torch.autograd.Function.apply's generic work (See NOTE: [Applying
CompiledFunction]), and the forward reads its metadata once (See NOTE: [What
CompiledFunction.forward reads once]). Outputs, requires_grad flags and
gradients stay eager's: returns that never require grad are non-differentiable,
saved views and symints reach the backward, dead functorch wrappers arrive
unwrapped and a functorch transform still takes Function.apply."""

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


def _with_returns_that_never_require_grad(x, w):
    y = x @ w
    return y.sin(), y.detach() * 2, y.argmax(dim=1), (x.view(-1) * 3).cos()


def _reshapes_by_its_batch(x, w):
    return (x.reshape(x.shape[0], -1) @ w).tanh() * x.shape[0]


class _Double(torch.autograd.Function):
    """Records what its forward receives."""

    seen: list = []

    @staticmethod
    def forward(ctx, x, n):
        _Double.seen.append((x, n))
        return x * 2 * n

    @staticmethod
    def backward(ctx, grad):
        return grad * 2, None


def _inputs(*shapes):
    return [torch.randn(*s, requires_grad=True) for s in shapes]


def _detached_copies(tensors):
    return [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]


class _EagerComparison(torch._dynamo.test_case.TestCase):
    """Compiles a function and compares it with eager."""

    def setUp(self):
        super().setUp()
        _Double.seen.clear()

    def _check_against_eager(self, fn, args, backend, dynamic=None, calls=None):
        """Compile ``fn``, call it on ``args`` (and each of ``calls``), and
        compare outputs, requires_grad flags and input gradients with eager."""
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)
        for call_args in [args, *(calls or [])]:
            ref_args = _detached_copies(call_args)
            out, expected = compiled(*call_args), fn(*ref_args)
            self.assertEqual(out, expected)
            outs = out if isinstance(out, tuple) else (out,)
            expected_outs = expected if isinstance(expected, tuple) else (expected,)
            self.assertEqual(
                [o.requires_grad for o in outs], [e.requires_grad for e in expected_outs]
            )
            sum(o.float().sum() for o in outs if o.requires_grad).backward()
            sum(e.float().sum() for e in expected_outs if e.requires_grad).backward()
            for a, r in zip(call_args, ref_args):
                self.assertEqual(a.grad, r.grad)
        return compiled


class CompiledFunctionResultsTests(_EagerComparison):
    """What a compiled joint graph returns: eager's, on any base."""

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_returns_that_never_require_grad_are_non_differentiable(self, backend):
        x, w = _inputs((4, 5), (5, 3))
        self._check_against_eager(_with_returns_that_never_require_grad, [x, w], backend)

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_saved_symints_reach_the_backward(self, backend):
        self._check_against_eager(
            _reshapes_by_its_batch,
            _inputs((4, 2, 3), (6, 5)),
            backend,
            dynamic=True,
            calls=[_inputs((7, 2, 3), (6, 5)), _inputs((3, 2, 3), (6, 5))],
        )


class BoxedFunctionApplyTests(_EagerComparison):
    """How AOTAutograd applies CompiledFunction (See NOTE: [Applying
    CompiledFunction])."""

    @parametrize("backend", ["aot_eager", "inductor"])
    def test_a_compiled_call_does_not_go_through_function_apply(self, backend):
        x, w = _inputs((4, 5), (5, 3))
        compiled = self._check_against_eager(_mlp, [x, w], backend)
        # Function.apply's generic per-call work, which it looks up when it
        # runs (AOTAutograd's caller binds unwrap_dead_wrappers at import, and
        # the graph's bound apply is captured when it is compiled).
        generic = AssertionError("Function.apply's generic path")
        with mock.patch.object(
            torch.autograd.function, "_is_setup_context_defined", side_effect=generic
        ), mock.patch.object(
            torch._functorch.utils, "unwrap_dead_wrappers", side_effect=generic
        ):
            out = compiled(x, w)
        self.assertEqual(out, _mlp(x, w))
        self.assertTrue(out.requires_grad)

    def test_the_boxed_caller_passes_symints_and_records_the_backward(self):
        apply_boxed = runtime_wrappers._boxed_function_apply(_Double)
        self.assertTrue(apply_boxed._boxed_call)
        x = torch.randn(3, requires_grad=True)
        out = apply_boxed([x, 5])
        self.assertIs(_Double.seen[0][0], x)
        self.assertEqual(_Double.seen[0][1], 5)
        self.assertEqual(out, x * 10)
        self.assertEqual(type(out.grad_fn).__name__, "_DoubleBackward")
        out.sum().backward()
        self.assertEqual(x.grad, torch.full((3,), 2.0))

    def test_a_dead_functorch_wrapper_arrives_unwrapped(self):
        leaked = []

        def f(x):
            leaked.append(x)
            return x.sin().sum()

        torch.func.grad(f)(torch.randn(3))
        (dead,) = leaked
        self.assertTrue(torch._C._functorch.is_functorch_wrapped_tensor(dead))
        expected = _Double.apply(dead, 1)
        runtime_wrappers._boxed_function_apply(_Double)([dead, 1])
        (generic_x, _), (boxed_x, _) = _Double.seen
        self.assertFalse(torch._C._functorch.is_functorch_wrapped_tensor(generic_x))
        self.assertFalse(torch._C._functorch.is_functorch_wrapped_tensor(boxed_x))
        self.assertIs(boxed_x, generic_x)
        self.assertEqual(expected, boxed_x * 2)

    def test_under_a_functorch_transform_it_is_function_apply(self):
        apply_boxed = runtime_wrappers._boxed_function_apply(_Double)
        x = torch.randn(2, 3)
        msg = "setup_context"
        with self.assertRaisesRegex(RuntimeError, msg):
            torch.func.vmap(lambda t: _Double.apply(t, 1))(x)
        with self.assertRaisesRegex(RuntimeError, msg):
            torch.func.vmap(lambda t: apply_boxed([t, 1]))(x)
        self.assertEqual(_Double.seen, [])

    def test_a_function_with_setup_context_is_refused(self):
        class WithSetupContext(torch.autograd.Function):
            @staticmethod
            def forward(x):
                return x.clone()

            @staticmethod
            def setup_context(ctx, inputs, output):
                pass

            @staticmethod
            def backward(ctx, grad):
                return grad

        with self.assertRaises(AssertionError):
            runtime_wrappers._boxed_function_apply(WithSetupContext)


instantiate_parametrized_tests(CompiledFunctionResultsTests)
instantiate_parametrized_tests(BoxedFunctionApplyTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
