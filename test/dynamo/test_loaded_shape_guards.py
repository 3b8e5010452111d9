# Owner(s): ["module: dynamo"]
"""A loaded entry's shape guards reuse the guard body the saving process wrote
(the patch "A loaded entry's shape guards reuse the saved guard body", NOTE:
[Loaded shape guards reuse the saved guard body] in torch/_dynamo/guards.py).

The body build_guard_function writes from the shape guard expressions (after
PyExprCSEPass) is saved as the third of the shape code parts; a load wraps it
instead of running the pass again, and decides as the saving process's
manager does. A state saved with two parts still loads, deriving the body.
"""

import pickle
import unittest.mock

import torch
import torch._dynamo.test_case
from torch._dynamo import guards as dynamo_guards
from torch._dynamo.exc import PackageError
from torch._dynamo.package import load_guard_manager, load_guards_state
from torch.testing._internal.common_utils import run_tests

from guard_round_trip import build_check_fn_manager


def rows_of(x, y):
    # Guards relating the two sizes, with subexpressions the pass names.
    return x[: y.shape[0]] * x.shape[0] + y


class TestLoadedShapeGuards(torch._dynamo.test_case.TestCase):
    def built(self):
        x, y = torch.ones(6), torch.ones(3)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(y, 0)
        return build_check_fn_manager(rows_of, (x, y), guard_types=("SHAPE_ENV", "TENSOR_MATCH"))

    def assert_decides_as(self, built, loaded):
        accepted = [{"x": torch.ones(8), "y": torch.ones(4)}, {"x": torch.ones(5), "y": torch.ones(5)}]
        rejected = [{"x": torch.ones(3), "y": torch.ones(4)}, {"x": torch.ones(8), "y": torch.ones(1)}]
        for expected, inputs in ((True, accepted), (False, rejected)):
            for f_locals in inputs:
                self.assertEqual(built.ref.guard_manager.check(f_locals), expected, f_locals)
                self.assertEqual(loaded.check(f_locals), expected, f_locals)

    def test_the_saved_state_holds_the_guard_body(self):
        built = self.built()
        python_exprs, verbose_exprs, body = load_guards_state(built.ref.guards_state).shape_code_parts
        self.assertTrue(python_exprs)
        self.assertEqual(len(python_exprs), len(verbose_exprs))
        # What build_guard_function writes from the expressions, whatever the
        # closure arguments: a load wraps it with its own.
        self.assertEqual(body, dynamo_guards.build_guard_function(list(python_exprs), "")[0])
        self.assertEqual(
            dynamo_guards.wrap_guard_body(body, "a, b"),
            dynamo_guards.build_guard_function(list(python_exprs), "a, b")[1],
        )

    def test_a_load_runs_no_subexpression_pass(self):
        built = self.built()
        state = load_guards_state(built.ref.guards_state)
        with unittest.mock.patch.object(
            dynamo_guards, "PyExprCSEPass", side_effect=AssertionError("the load ran the CSE pass")
        ):
            loaded = load_guard_manager(state, built.code, built.f_globals)
        self.assert_decides_as(built, loaded)

    def test_a_state_saved_without_the_body_derives_it(self):
        built = self.built()
        state = load_guards_state(built.ref.guards_state)
        state.shape_code_parts = state.shape_code_parts[:2]
        derived = []
        original = dynamo_guards.build_guard_function

        def counting(code_parts, closure_args):
            derived.append(len(code_parts))
            return original(code_parts, closure_args)

        with unittest.mock.patch.object(dynamo_guards, "build_guard_function", counting):
            loaded = load_guard_manager(pickle.loads(pickle.dumps(state)), built.code, built.f_globals)
        self.assertEqual(derived, [len(state.shape_code_parts[0])])
        self.assert_decides_as(built, loaded)

    def test_damaged_shape_code_parts_are_refused(self):
        built = self.built()
        state = load_guards_state(built.ref.guards_state)
        # Also on a torch without the speed-ups, whose states have two parts.
        exprs, verbose = state.shape_code_parts[:2]
        for damaged in ((exprs, verbose, 5), (exprs, [1]), (exprs,), [exprs, verbose]):
            state.shape_code_parts = damaged
            with self.subTest(damaged=type(damaged).__name__), self.assertRaisesRegex(
                PackageError, "guards state is damaged: its shape guards"
            ):
                load_guard_manager(state, built.code, built.f_globals)


if __name__ == "__main__":
    run_tests()
