# Owner(s): ["module: dynamo"]
"""Shape guards holding an opaque unary function of a size evaluate in Python:
PythonPrinter prints OpaqueUnaryFn_log2 as math.log2 (BLOOM's ALiBi slopes,
2 ** math.floor(math.log2(num_heads)) under dynamic=True, crashed Dynamo's
guard build on torch 2.7.1 with "name 'OpaqueUnaryFn_log2' is not defined")."""

import math

import sympy

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.utils._sympy.functions import OpaqueUnaryFn_log2
from torch.utils._sympy.printers import PythonPrinter


class TestOpaqueUnaryGuards(torch._dynamo.test_case.TestCase):
    def test_python_printer_prints_log2_as_math(self):
        s0 = sympy.Symbol("s0", integer=True, positive=True)
        self.assertExpectedInline(PythonPrinter().doprint(OpaqueUnaryFn_log2(s0)), """math.log2(s0)""")

    def test_guard_on_log2_of_a_dynamic_int(self):
        counter = CompileCounter()

        @torch.compile(backend=counter, dynamic=True)
        def alibi_scale(x, n):
            return x * 2 ** math.floor(math.log2(n))

        x = torch.randn(3)
        for n in (8, 12, 16, 5):
            self.assertEqual(alibi_scale(x, n), x * 2 ** math.floor(math.log2(n)))
        # Each call ran a compiled graph: the guards evaluated, none raised.
        self.assertGreaterEqual(counter.frame_count, 1)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
