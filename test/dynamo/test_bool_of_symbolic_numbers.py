# Owner(s): ["module: dynamo"]
"""bool() of a symbolic number traces: a SymInt or SymFloat n gives the SymBool
n != 0 and a SymBool is itself (NOTE: [bool() of a symbolic number] in
torch/_dynamo/variables/builtin.py). On torch 2.7.1 it graph broke, which
split transformers' HybridCache.__init__ (bool((i + 1) % sliding_window_pattern)
per layer under dynamic=True) into a frame of its own."""

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


class Config:
    def __init__(self, sliding_window_pattern):
        self.sliding_window_pattern = sliding_window_pattern


def sliding_layers(x, config):
    is_sliding = [bool((i + 1) % config.sliding_window_pattern) for i in range(4)]
    for sliding in is_sliding:
        x = x + 1 if sliding else x * 2
    return x


def bool_of_an_int(x, n):
    return x + 1 if bool(n % 3) else x - 1


def bool_of_a_float(x, n):
    return x + 1 if bool(n * 0.5 - 2.0) else x - 1


def bool_of_a_bool(x, n):
    return x + 1 if bool(n > 4) else x - 1


class TestBoolOfSymbolicNumbers(torch._dynamo.test_case.TestCase):
    @parametrize("fn", [bool_of_an_int, bool_of_a_float, bool_of_a_bool])
    def test_bool_of_a_dynamic_int_traces(self, fn):
        counter = CompileCounter()
        compiled = torch.compile(fn, backend=counter, dynamic=True, fullgraph=True)
        x = torch.randn(3)
        for n in (5, 6, 4, 9):
            self.assertEqual(compiled(x, n), fn(x, n))
        self.assertGreaterEqual(counter.frame_count, 1)

    def test_bool_of_a_config_int_in_a_list_comprehension(self):
        # Each pattern's flags guard on their own values: a pattern seen before
        # runs its entry again.
        counter = CompileCounter()
        compiled = torch.compile(sliding_layers, backend=counter, dynamic=True, fullgraph=True)
        x = torch.randn(3)
        for pattern in (2, 3, 2):
            self.assertEqual(compiled(x, Config(pattern)), sliding_layers(x, Config(pattern)))
        self.assertEqual(counter.frame_count, 2)

    def test_bool_of_constants_still_folds(self):
        @torch.compile(backend="eager", fullgraph=True)
        def f(x):
            return x + bool(0) + bool(2.5) + bool([]) + bool((1,))

        x = torch.randn(2)
        self.assertEqual(f(x), x + 2)


instantiate_parametrized_tests(TestBoolOfSymbolicNumbers)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
