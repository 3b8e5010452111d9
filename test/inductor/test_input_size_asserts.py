# Owner(s): ["module: inductor"]
"""The input size asserts of Inductor's wrapper code.

See NOTE: [Input size asserts once per input layout] in
torch/_inductor/runtime/runtime_utils.py: a graph with static shapes runs its
assert_size_stride lines only when its inputs' layouts differ from those of the
last call whose asserts passed, and raises exactly when those asserts would.
"""

import torch
import torch._inductor.test_case
from torch._C._dynamo.guards import assert_size_stride
from torch._inductor.codecache import PyCodeCache
from torch._inductor.runtime import runtime_utils
from torch._inductor.utils import run_and_get_code
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def sin_plus(x, y):
    return x.sin() + y


def prologue(code: str) -> str:
    """The lines of call() between args.clear() and the first buffer."""
    lines = code[code.index("def call(args):") :].splitlines()[3:]
    return "\n".join(line for line in lines[: next(i for i, l in enumerate(lines) if "buf0" in l)])


def compiled_module(**compile_kwargs):
    """The wrapper module Inductor generates for sin_plus on (4, 4) and (4,)."""
    torch._dynamo.reset()
    x, y = torch.randn(4, 4), torch.randn(4)
    result, (code,) = run_and_get_code(torch.compile(sin_plus, **compile_kwargs), x, y)
    torch.testing.assert_close(result, sin_plus(x, y))
    return code, PyCodeCache.load(code)


def stock_error(item, size, stride):
    """What torch's own assert_size_stride raises for ``item``."""
    try:
        assert_size_stride(item, size, stride)
    except (AssertionError, TypeError) as e:
        return type(e), str(e)
    return None


class TestInputSizeAsserts(torch._inductor.test_case.TestCase):
    def test_a_static_graph_asserts_only_inputs_of_a_new_layout(self):
        code, _ = compiled_module()
        self.assertIn("asserted_input_layouts = AssertedInputLayouts()\n", code)
        self.assertExpectedInline(
            prologue(code),
            """\
    if not asserted_input_layouts.check(arg0_1, arg1_1):
        assert_size_stride(arg0_1, (4, 4), (4, 1))
        assert_size_stride(arg1_1, (4, ), (1, ))
        asserted_input_layouts.record(arg0_1, arg1_1)""",
        )

    def test_a_dynamic_graph_keeps_its_plain_asserts(self):
        code, _ = compiled_module(dynamic=True)
        self.assertNotIn("asserted_input_layouts", code)
        self.assertIn("assert_size_stride(", prologue(code))

    @parametrize(
        "bad",
        ["transposed", "larger", "not_a_tensor"],
    )
    def test_a_call_raises_exactly_when_the_asserts_would(self, bad):
        _, module = compiled_module()
        x, y = torch.randn(4, 4), torch.randn(4)
        expected = sin_plus(x, y)
        for _ in range(3):
            torch.testing.assert_close(module.call([x, y])[0], expected)
        self.assertTrue(module.asserted_input_layouts.check(x, y))
        wrong = {
            "transposed": torch.randn(4, 4).t(),
            "larger": torch.randn(5, 4),
            "not_a_tensor": 4.0,
        }[bad]
        error_type, message = stock_error(wrong, (4, 4), (4, 1))
        with self.assertRaises(error_type) as raised:
            module.call([wrong, y])
        self.assertEqual(str(raised.exception), message)
        # The inputs of the passing calls still pass, with no assert of their own.
        torch.testing.assert_close(module.call([x, y])[0], expected)
        self.assertTrue(module.asserted_input_layouts.check(x, y))

    def test_a_new_layout_that_passes_is_recorded(self):
        _, module = compiled_module()
        x, y = torch.randn(4, 4), torch.randn(4)
        module.call([x, y])
        # Same sizes and strides, another dtype: the asserts pass (they compare
        # sizes and strides only) and the new layout is what check() accepts.
        xd, yd = x.double(), y.double()
        self.assertFalse(module.asserted_input_layouts.check(xd, yd))
        module.call([xd, yd])
        self.assertTrue(module.asserted_input_layouts.check(xd, yd))
        self.assertFalse(module.asserted_input_layouts.check(x, y))


class TestAssertedInputLayouts(torch._inductor.test_case.TestCase):
    def test_nothing_passes_before_a_record(self):
        self.assertFalse(runtime_utils.AssertedInputLayouts().check(torch.randn(2, 3)))

    @parametrize(
        "other",
        ["same_layout", "strides", "sizes", "dtype", "requires_grad", "inference_mode"],
    )
    def test_check_accepts_only_the_recorded_layouts(self, other):
        layouts = runtime_utils.AssertedInputLayouts()
        x, w = torch.randn(2, 3), torch.nn.Parameter(torch.randn(3))
        layouts.record(x, w)
        if other == "inference_mode":
            # Another dispatch key set: the asserts run again there.
            with torch.inference_mode():
                self.assertFalse(layouts.check(x, w))
            return
        candidate = {
            "same_layout": (torch.randn(2, 3), w),
            "strides": (torch.randn(3, 2).t(), w),
            "sizes": (torch.randn(3, 3), w),
            "dtype": (x.double(), w),
            "requires_grad": (x, w.detach()),
        }[other]
        self.assertEqual(layouts.check(*candidate), other == "same_layout")


instantiate_parametrized_tests(TestInputSizeAsserts)
instantiate_parametrized_tests(TestAssertedInputLayouts)


if __name__ == "__main__":
    from torch._inductor.test_case import run_tests

    run_tests()
