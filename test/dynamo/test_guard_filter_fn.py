# Owner(s): ["module: dynamo"]
"""guard_filter_fn: torch.compile(options={"guard_filter_fn": fn}) and CheckFunctionManager."""

from typing import TYPE_CHECKING

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch._dynamo.testing
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


if TYPE_CHECKING:
    from torch._dynamo.types import GuardFilterEntry


GLOBAL_SCALE = 2


def scale_by_global(x):
    return x * GLOBAL_SCALE


class Scaler(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = 3

    def forward(self, x):
        return x * self.scale


class GuardFilterFnTests(torch._dynamo.test_case.TestCase):
    def compile(self, fn, guard_filter_fn, backend=None):
        cnt = backend or torch._dynamo.testing.CompileCounter()
        return torch.compile(fn, backend=cnt, options={"guard_filter_fn": guard_filter_fn}), cnt

    def test_entries_describe_each_guard(self):
        seen: list[GuardFilterEntry] = []

        def record(entries):
            seen.extend(entries)
            return [True] * len(entries)

        x = torch.randn(4)
        opt, _ = self.compile(scale_by_global, record)
        self.assertEqual(opt(x), x * GLOBAL_SCALE)
        summary = "\n".join(
            f"{e.name or '<global state>'}: {e.guard_type} {e.derived_guard_types} "
            f"global={e.is_global} has_value={e.has_value}"
            for e in sorted(seen, key=lambda e: (e.name, e.guard_type))
            # The guard filter presets' patch adds upstream's GLOBAL_STATE guard
            # (test_guard_filter_presets.py); this summary holds with and without it.
            if e.guard_type != "GLOBAL_STATE"
        )
        self.assertExpectedInline(
            summary,
            """\
<global state>: DEFAULT_DEVICE ('DEFAULT_DEVICE',) global=False has_value=False
<global state>: DETERMINISTIC_ALGORITHMS () global=False has_value=False
<global state>: GRAD_MODE () global=False has_value=False
<global state>: SHAPE_ENV () global=False has_value=False
<global state>: TORCH_FUNCTION_STATE () global=False has_value=False
G['GLOBAL_SCALE']: CONSTANT_MATCH ('EQUALS_MATCH',) global=True has_value=True
x: TENSOR_MATCH ('TENSOR_MATCH',) global=False has_value=True""",
        )
        by_name = {e.name: e for e in seen}
        self.assertIs(by_name["x"].value, x)
        self.assertEqual(by_name["G['GLOBAL_SCALE']"].value, GLOBAL_SCALE)
        self.assertEqual(by_name["x"].source.name(), "L['x']")
        self.assertIs(by_name["x"].orig_guard.originating_source, by_name["x"].source)

    @parametrize("drop_globals", [True, False])
    def test_dropping_global_guards_skips_recompile(self, drop_globals):
        global GLOBAL_SCALE

        def keep(entries):
            return [not (drop_globals and e.is_global) for e in entries]

        opt, cnt = self.compile(scale_by_global, keep)
        x = torch.randn(4)
        old = GLOBAL_SCALE
        try:
            opt(x)
            GLOBAL_SCALE = 5
            out = opt(x)
        finally:
            GLOBAL_SCALE = old
        if drop_globals:
            # Unsafe by design: the stale specialization runs.
            self.assertEqual(cnt.frame_count, 1)
            self.assertEqual(out, x * old)
        else:
            self.assertEqual(cnt.frame_count, 2)
            self.assertEqual(out, x * 5)

    def test_dropping_nn_module_attribute_guard(self):
        mod = Scaler()

        def skip_scale(entries):
            return ["scale" not in e.name for e in entries]

        opt, cnt = self.compile(mod, skip_scale)
        x = torch.randn(4)
        opt(x)
        mod.scale = 7
        opt(x)
        self.assertEqual(cnt.frame_count, 1)

    def test_tensor_guards_still_decide_when_others_are_dropped(self):
        def tensors_only(entries):
            return [e.guard_type == "TENSOR_MATCH" for e in entries]

        opt, cnt = self.compile(lambda x: x + 1, tensors_only)
        opt(torch.randn(4))
        opt(torch.randn(4))
        self.assertEqual(cnt.frame_count, 1)
        opt(torch.randn(4, dtype=torch.float64))
        self.assertEqual(cnt.frame_count, 2)

    def test_inductor_accepts_the_option_and_user_options_are_not_mutated(self):
        options = {"guard_filter_fn": lambda entries: [True] * len(entries)}
        torch.compile(lambda x: x + 1, options=options)  # inductor validates here
        self.assertIn("guard_filter_fn", options)
        with self.assertRaisesRegex(RuntimeError, "Unexpected optimization option"):
            torch.compile(lambda x: x + 1, options={"not_an_option": 1})

    @parametrize("bad", ["short", "not_bool"])
    def test_bad_filter_result_is_an_error(self, bad):
        def broken(entries):
            if bad == "short":
                return [True] * (len(entries) - 1)
            return [1] * len(entries)

        opt, _ = self.compile(lambda x: x + 1, broken)
        expected = "one bool per entry" if bad == "short" else "list of bools"
        with self.assertRaisesRegex(Exception, expected):
            opt(torch.randn(4))


instantiate_parametrized_tests(GuardFilterFnTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
