# Owner(s): ["module: inductor"]
"""Inductor's wrapper code calls extern_kernels.addmm without alpha and beta
when both are addmm's default 1 (See NOTE: [addmm's default scalars in wrapper
code]), and with them otherwise; results are eager's, in the Python wrapper and
the C++ one."""

import re

import torch
import torch._dynamo
import torch._inductor.config as inductor_config
from torch._inductor.test_case import TestCase
from torch._inductor.utils import fresh_inductor_cache, run_and_get_code
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def _linear(x, w, b):
    return torch.nn.functional.linear(x, w, b).relu()


def _scaled_addmm(x, w, b):
    return torch.addmm(b, x, w.t(), alpha=2, beta=0.5)


def _addmm_with_float_one(x, w, b):
    return torch.addmm(b, x, w.t(), alpha=1.0, beta=1)


def _int_addmm(x, w, b):
    return torch.addmm(b, x, w.t())


def _addmm_calls(code: str) -> list[str]:
    return re.findall(r"extern_kernels\.addmm\((.*)\)", code)


class AddmmDefaultScalarsTests(TestCase):
    def _compile_and_check(self, fn, *args):
        torch._dynamo.reset()
        with fresh_inductor_cache():
            out, (code, *_) = run_and_get_code(torch.compile(fn, fullgraph=True), *args)
        self.assertEqual(out, fn(*args))
        return code

    def _float_args(self):
        return torch.randn(3, 8), torch.randn(5, 8), torch.randn(5)

    @parametrize(
        "fn,expected_kwargs",
        [
            (_linear, []),
            (_scaled_addmm, ["alpha=2", "beta=0.5"]),
            (_addmm_with_float_one, ["alpha=1.0", "beta=1"]),
        ],
        name_fn=lambda fn, expected_kwargs: fn.__name__.lstrip("_"),
    )
    def test_the_wrapper_passes_only_scalars_that_are_not_the_default(self, fn, expected_kwargs):
        code = self._compile_and_check(fn, *self._float_args())
        (call,) = _addmm_calls(code)
        kwargs = [a.strip() for a in call.split(",") if "=" in a and not a.strip().startswith("out=")]
        self.assertEqual(kwargs, expected_kwargs)

    def test_integer_inputs_with_the_defaults(self):
        x = torch.randint(-5, 5, (3, 8))
        w = torch.randint(-5, 5, (5, 8))
        b = torch.randint(-5, 5, (5,))
        code = self._compile_and_check(_int_addmm, x, w, b)
        (call,) = _addmm_calls(code)
        self.assertNotIn("alpha", call)

    @inductor_config.patch(cpp_wrapper=True)
    def test_the_cpp_wrapper_reads_the_schema_defaults(self):
        code = self._compile_and_check(_linear, *self._float_args())
        self.assertIn("addmm_out", code)


instantiate_parametrized_tests(AddmmDefaultScalarsTests)


if __name__ == "__main__":
    from torch._inductor.test_case import run_tests

    run_tests()
