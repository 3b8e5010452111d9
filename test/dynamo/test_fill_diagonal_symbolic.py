# Owner(s): ["module: dynamo"]
"""fill_diagonal_ compiles under dynamic shapes.

ATen's fill_diagonal_ reads storage_offset() and stride() as plain ints, so
under dynamic=True Dynamo failed with "Cannot call storage_offset() on tensor
with symbolic sizes/strides" (ProphetNet's ngram_attention_bias, the
transformers sweep). See NOTE: [fill_diagonal_ under symbolic shapes].
"""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def square(n):
    return torch.arange(float(n * n)).reshape(n, n)


# name -> (a tensor of a size n, fill_diagonal_'s wrap)
CASES = {
    "square": (square, False),
    "wide": (lambda n: torch.arange(float(n * (n + 3))).reshape(n, n + 3), False),
    "tall": (lambda n: torch.arange(float(n * (3 * n))).reshape(3 * n, n), False),
    "tall_wrapped": (
        lambda n: torch.arange(float(n * (3 * n))).reshape(3 * n, n),
        True,
    ),
    "cube": (lambda n: torch.arange(float(n**3)).reshape(n, n, n), False),
    "transposed": (lambda n: square(n).t(), False),
    "row_of_a_stack": (
        lambda n: torch.arange(float(2 * n * n)).reshape(2, n, n),
        False,
    ),
}


def fill(case, n):
    make, wrap = CASES[case]
    x = make(n)
    if case == "row_of_a_stack":
        # As ProphetNet fills right_block[stream_idx]: a view at an offset.
        x[1].fill_diagonal_(-1.0, wrap=wrap)
    else:
        x.fill_diagonal_(-1.0, wrap=wrap)
    return x * 2


class TestFillDiagonalSymbolic(torch._dynamo.test_case.TestCase):
    @parametrize("case", sorted(CASES))
    def test_matches_eager_for_every_size(self, case):
        counter = CompileCounter()
        compiled = torch.compile(fill, backend="aot_eager", dynamic=True)
        counted = torch.compile(fill, backend=counter, dynamic=True)
        for n in (3, 4, 6):
            self.assertEqual(compiled(case, n), fill(case, n))
            counted(case, n)
        # One graph, sizes symbolic: no recompile for another n.
        self.assertEqual(counter.frame_count, 1)

    def test_checks_equal_dimensions(self):
        @torch.compile(backend="aot_eager", dynamic=True)
        def fill_uneven(n):
            return torch.zeros(n, n, n + 1).fill_diagonal_(1.0)

        with self.assertRaisesRegex(Exception, "equal length"):
            fill_uneven(3)


instantiate_parametrized_tests(TestFillDiagonalSymbolic)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
