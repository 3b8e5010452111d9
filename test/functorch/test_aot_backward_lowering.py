# Owner(s): ["module: functorch"]
"""torch._functorch.config.force_non_lazy_backward_lowering: AOTAutograd compiles
the backward graph together with the forward one instead of at the first
backward call."""

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch._functorch.config
from torch._dynamo.backends.common import aot_autograd
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


class _CountingCompilers:
    """An AOTAutograd backend that runs the graphs as they are and counts how
    often each side was compiled."""

    def __init__(self) -> None:
        self.forward_compiles = 0
        self.backward_compiles = 0

    def fw_compiler(self, gm, example_inputs):
        self.forward_compiles += 1
        return gm.forward

    def bw_compiler(self, gm, example_inputs):
        self.backward_compiles += 1
        return gm.forward

    def backend(self):
        return aot_autograd(fw_compiler=self.fw_compiler, bw_compiler=self.bw_compiler)


def _mlp(x, w):
    return (x @ w).relu().sum()


class ForceNonLazyBackwardLoweringTests(torch._dynamo.test_case.TestCase):
    @parametrize("force", [False, True])
    def test_when_the_backward_is_compiled(self, force):
        compilers = _CountingCompilers()
        f = torch.compile(_mlp, backend=compilers.backend())
        x = torch.randn(4, 3)
        w = torch.randn(3, 2, requires_grad=True)
        with torch._functorch.config.patch(force_non_lazy_backward_lowering=force):
            out = f(x, w)
        self.assertEqual(compilers.forward_compiles, 1)
        # Without the flag the backward waits for its first call.
        self.assertEqual(compilers.backward_compiles, 1 if force else 0)
        out.backward()
        self.assertEqual(compilers.backward_compiles, 1)
        w_ref = w.detach().clone().requires_grad_()
        _mlp(x, w_ref).backward()
        self.assertEqual(w.grad, w_ref.grad)

    def test_off_by_default(self):
        self.assertFalse(torch._functorch.config.force_non_lazy_backward_lowering)


instantiate_parametrized_tests(ForceNonLazyBackwardLoweringTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
