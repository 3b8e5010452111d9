# Owner(s): ["module: dynamo"]
"""FloorToInt and CeilToInt round a rational exactly.

They rounded through a float (53 bits), so near 2**63 a bound was rounded to
the next float, not the next integer. Solving an equality for a symbol's
bounds (ShapeEnv._set_replacement) then left them looser than the equality
implies and failed its own check, "tgt_bound=VR[5, 18446744073709551613] not
a subset of src_bound=VR[5, 18446744073709551612]", as LED's sliding-window
attention did under dynamic=True in the transformers sweep.
"""

import sympy

import torch
import torch._dynamo.test_case
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils._sympy.functions import CeilToInt, FloorToInt


class TestExactIntRounding(torch._dynamo.test_case.TestCase):
    @parametrize(
        "numerator,denominator",
        [(2**64 - 5, 2), (-(2**64) + 5, 2), (7, 2), (-7, 2), (6, 3), (2**70 + 1, 3)],
    )
    def test_rational(self, numerator, denominator):
        number = sympy.Rational(numerator, denominator)
        self.assertEqual(FloorToInt(number), numerator // denominator)
        self.assertEqual(CeilToInt(number), -(-numerator // denominator))

    def test_infinities(self):
        from torch.utils._sympy.numbers import int_oo

        self.assertEqual(FloorToInt(-int_oo), -int_oo)
        self.assertEqual(CeilToInt(int_oo), int_oo)

    def test_solving_an_equality_near_2_63(self):
        shape_env = ShapeEnv()

        def symint(name, hint):
            symbol = shape_env.create_symbol(
                hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC
            )
            return shape_env.create_symintnode(symbol, hint=hint)

        w, n = symint("w", 2), symint("n", 5)
        # Bounds as slicing with sys.maxsize left them on LED's sizes.
        self.assertTrue(w >= 2 and w <= 2**63 - 2)
        self.assertTrue(n >= 5 and n <= 2**64 - 4)
        self.assertTrue(n == 2 * w + 1)
        # n is odd and at most 2**64 - 4, so w is at most 2**63 - 3.
        self.assertEqual(shape_env.bound_sympy(w.node.expr).upper, 2**63 - 3)


instantiate_parametrized_tests(TestExactIntRounding)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
