# Owner(s): ["module: functorch"]
"""FUNCTORCH_STACK_MATCH and DUAL_LEVEL guards saved and loaded (pytorch#152616).

Protocol: keep one guard type with guard_filter_fn, run InstructionTranslator
directly on an example function to get the OutputGraph and the reference
CheckFunctionManager (save_guards=True), rebuild a guard manager from its
``guards_state`` with torch._dynamo.package.load_guard_manager (guard_round_trip.py,
the harness of test_guard_serialization.py), then check both under accepted and
rejected functorch stacks and require equal decisions. The six cases are where
the compiled frame runs: 0. under no layer (the function itself uses
torch.func), 1. vmap, 2. grad, 3. jvp + vmap, 4. functionalize, 5. vmap + grad.
Order matters: a stack is a sequence of layers.

On 2.7.1 Dynamo compiles a frame that runs inside vmap / grad / jvp only with
the eager backend (any other backend falls back to eager at once), so the
example frames are traced with it, as upstream's test does.
"""

import contextlib
import dataclasses

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch.autograd.forward_ad as fwAD
from torch._C._functorch import _func_decrement_nesting, _func_increment_nesting
from torch._dynamo.package import load_guards_state
from torch._functorch.eager_transforms import (
    grad_increment_nesting,
    jvp_increment_nesting,
)
from torch._functorch.vmap import vmap_increment_nesting
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)

from guard_round_trip import (
    build_check_fn_manager as _build_check_fn_manager,
    load_built,
    save_and_load_in_fresh_processes,
)


# ---------------------------------------------------------------------------
# Example functions (module level: their code is found again in a fresh process)
# ---------------------------------------------------------------------------


def summed(x):
    return x.sum()


def sin_sum(x):
    return x.sin().sum()


def uses_jvp(x):
    return torch.func.jvp(torch.sin, (x,), (x,))


def uses_vmap_of_grad(x):
    return torch.func.vmap(torch.func.grad(sin_sum))(x)


def uses_dual_level(x):
    with fwAD.dual_level():
        return x + 1


# ---------------------------------------------------------------------------
# Building and saving guards
# ---------------------------------------------------------------------------


def build_check_fn_manager(fn, args, guard_filter_fn):
    """guard_round_trip.build_check_fn_manager, traced here, inside whatever
    functorch layers are live, with the eager backend."""
    return _build_check_fn_manager(
        fn,
        args,
        guard_filter_fn=guard_filter_fn,
        backend=torch._dynamo.lookup_backend("eager"),
    )


def keep_only(guard_type):
    def guard_filter_fn(entries):
        keep = [e.guard_type == guard_type for e in entries]
        assert any(keep), f"no {guard_type} guard among {[e.guard_type for e in entries]}"
        return keep

    return guard_filter_fn


def keep_local_and_global_state_guards(entries):
    """Drops guards on globals (torch.func internals here), like upstream's
    torch.compiler.skip_guard_on_globals_unsafe."""
    return [not e.is_global for e in entries]


# ---------------------------------------------------------------------------
# Functorch stacks
# ---------------------------------------------------------------------------


@contextlib.contextmanager
def _functionalize_layer():
    _func_increment_nesting(True)
    try:
        yield
    finally:
        _func_decrement_nesting()


@contextlib.contextmanager
def _grad_layer_entered_under_no_grad():
    # The layer remembers grad mode was off; grad mode itself is back on, so
    # only the functorch stack differs from a plain grad layer.
    with torch.no_grad(), grad_increment_nesting(), torch.enable_grad():
        yield


@contextlib.contextmanager
def _jvp_layer_entered_with_fwd_grad_disabled():
    with fwAD._set_fwd_grad_enabled(False), jvp_increment_nesting():
        with fwAD._set_fwd_grad_enabled(True):
            yield


LAYERS = {
    "vmap": lambda: vmap_increment_nesting(1, "error"),
    # The batch size is not part of the guarded state; randomness is.
    "vmap_of_7": lambda: vmap_increment_nesting(7, "error"),
    "vmap_same_randomness": lambda: vmap_increment_nesting(1, "same"),
    "grad": grad_increment_nesting,
    "grad_under_no_grad": _grad_layer_entered_under_no_grad,
    "jvp": jvp_increment_nesting,
    "jvp_fwd_grad_disabled": _jvp_layer_entered_with_fwd_grad_disabled,
    "functionalize": _functionalize_layer,
}


@contextlib.contextmanager
def functorch_stack(stack):
    """Pushes the layers named by ``stack`` (a '+'-joined string, bottom first)."""
    with contextlib.ExitStack() as exit_stack:
        for name in stack.split("+") if stack else ():
            exit_stack.enter_context(LAYERS[name]())
        yield


# ---------------------------------------------------------------------------
# The six cases
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class StackCase:
    # Calls ``run`` (which compiles ``fn``) under the case's transforms.
    nest: object
    fn: object
    saved_states: list
    accepted: list
    rejected: list


def _compiled_directly(run, x):
    return run(x)


CASES = {
    "no_layer": StackCase(
        nest=_compiled_directly,
        fn=uses_jvp,
        saved_states=[],
        accepted=[""],
        rejected=["vmap", "grad", "jvp", "functionalize", "vmap+grad"],
    ),
    "vmap": StackCase(
        nest=lambda run, x: torch.vmap(run)(x),
        fn=summed,
        saved_states=[("Vmap", 1, "error")],
        accepted=["vmap", "vmap_of_7"],
        rejected=["", "vmap_same_randomness", "vmap+vmap", "grad", "functionalize"],
    ),
    "grad": StackCase(
        nest=lambda run, x: torch.func.grad(run)(x),
        fn=summed,
        saved_states=[("Grad", 1, True)],
        accepted=["grad"],
        rejected=["", "grad_under_no_grad", "grad+grad", "vmap", "jvp"],
    ),
    "jvp_vmap": StackCase(
        nest=lambda run, x: torch.func.jvp(torch.vmap(run), (x,), (x,)),
        fn=summed,
        saved_states=[("Jvp", 1, True), ("Vmap", 2, "error")],
        accepted=["jvp+vmap"],
        rejected=["", "vmap+jvp", "jvp", "vmap", "jvp_fwd_grad_disabled+vmap"],
    ),
    "functionalize": StackCase(
        nest=lambda run, x: torch.func.functionalize(run)(x),
        fn=summed,
        saved_states=[("Functionalize", 1)],
        accepted=["functionalize"],
        rejected=["", "jvp", "vmap", "functionalize+functionalize"],
    ),
    "vmap_grad": StackCase(
        nest=lambda run, x: torch.vmap(torch.func.grad(run))(x),
        fn=summed,
        saved_states=[("Vmap", 1, "error"), ("Grad", 2, True)],
        accepted=["vmap+grad", "vmap_of_7+grad"],
        rejected=["", "grad+vmap", "vmap", "grad", "vmap+grad_under_no_grad"],
    ),
}


def save_case(case_name, guard_filter_fn=None):
    """Compiles the case's function where the case says, keeping the guards
    ``guard_filter_fn`` keeps (by default the FUNCTORCH_STACK_MATCH guard);
    returns the reference manager and its ``guards_state``."""
    case = CASES[case_name]
    built = {}

    def run(x):
        # Dynamo would make automatic-dynamic shapes out of a recompile here;
        # the guard under test does not depend on them.
        with torch._dynamo.config.patch(automatic_dynamic_shapes=False):
            built["built"] = build_check_fn_manager(
                case.fn, (x,), guard_filter_fn or keep_only("FUNCTORCH_STACK_MATCH")
            )
        return case.fn(x)

    case.nest(run, torch.randn(3, 2))
    return built["built"]


def decide_under_stacks(guard_manager, stacks, f_locals):
    decisions = {}
    for stack in stacks:
        with functorch_stack(stack):
            decisions[stack] = guard_manager.check(f_locals)
    return decisions


class TestFunctorchStackGuardSerialization(torch._dynamo.test_case.TestCase):
    def assert_same_decisions(self, built, loaded, accepted, rejected):
        self.assertTrue(accepted and rejected, "need accepted and rejected stacks")
        f_locals = {"x": torch.randn(3, 2)}
        for expected, stacks in ((True, accepted), (False, rejected)):
            ref = decide_under_stacks(built.ref.guard_manager, stacks, f_locals)
            got = decide_under_stacks(loaded, stacks, f_locals)
            self.assertEqual(ref, dict.fromkeys(stacks, expected))
            self.assertEqual(got, ref)

    def check_case(self, case_name):
        case = CASES[case_name]
        built = save_case(case_name)
        state = load_guards_state(built.ref.guards_state)
        self.assertEqual(state.output_graph.global_state.functorch_states, case.saved_states)
        loaded = load_built(built)
        self.assert_same_decisions(built, loaded, case.accepted, case.rejected)

    def test_no_layer(self):
        self.check_case("no_layer")

    def test_in_vmap(self):
        self.check_case("vmap")

    def test_in_grad(self):
        self.check_case("grad")

    def test_in_jvp_and_vmap(self):
        self.check_case("jvp_vmap")

    def test_in_functionalize(self):
        self.check_case("functionalize")

    def test_in_vmap_and_grad(self):
        self.check_case("vmap_grad")

    @parametrize("case_name", ["vmap", "vmap_grad"])
    def test_loading_under_other_layers_uses_the_saved_stack(self, case_name):
        # The loaded guard compares with the stack saved, not the one live at load.
        case = CASES[case_name]
        built = save_case(case_name)
        with functorch_stack("grad+grad+functionalize"):
            loaded = load_built(built)
        self.assert_same_decisions(built, loaded, case.accepted, case.rejected)

    @parametrize("case_name", ["vmap", "vmap_grad"])
    def test_cross_process(self, case_name):
        # Saved by one interpreter, loaded and decided by a fresh one.
        case = CASES[case_name]
        decisions = save_and_load_in_fresh_processes(
            __file__,
            f"""
            save(t.save_case({case_name!r}))
            """,
            f"""
            case = t.CASES[{case_name!r}]
            stacks = case.accepted + case.rejected
            report(t.decide_under_stacks(load(case.fn), stacks, {{"x": torch.ones(2)}}))
            """,
        )
        expected = {
            **dict.fromkeys(case.accepted, True),
            **dict.fromkeys(case.rejected, False),
        }
        self.assertEqual(decisions, expected)

    @parametrize("case_name", ["vmap", "grad", "jvp_vmap", "functionalize", "vmap_grad"])
    def test_tensor_match_on_functorch_wrapped_inputs(self, case_name):
        # The input is a BatchedTensor / grad or jvp TensorWrapper /
        # FunctionalTensorWrapper: its dispatch keys and those live in the layers
        # are part of the guard, rebuilt at load outside any layer.
        case = CASES[case_name]
        built = save_case(case_name, keep_only("TENSOR_MATCH"))
        loaded = load_built(built)
        not_wrapped = torch.randn(2)
        decisions = {}

        def decide(x):
            f_locals = {
                "wrapped": {"x": x},
                "wrapped_float64": {"x": x.double()},
                "not_wrapped": {"x": not_wrapped},
            }
            for name, item in f_locals.items():
                decisions[(tuple(x.shape), name)] = (
                    built.ref.guard_manager.check(item),
                    loaded.check(item),
                )
            return case.fn(x)

        for shape in ((3, 2), (3, 5)):
            case.nest(decide, torch.randn(*shape))
        reference = {key: ref for key, (ref, _) in decisions.items()}
        self.assertEqual(
            {key: got for key, (_, got) in decisions.items()}, reference
        )
        accepted = [key for key, ref in reference.items() if ref]
        self.assertEqual(accepted, [((2,) if "vmap" in case_name else (3, 2), "wrapped")])

    def test_all_guards_in_vmap_of_grad_cross_process(self):
        # Every guard Dynamo makes for a frame compiled inside vmap(grad(...))
        # (tensor, global state, functorch stack...), loaded by a fresh
        # interpreter and decided there inside and outside the transforms.
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            save(t.save_case("vmap_grad", lambda entries: [True] * len(entries)))
            """,
            """
            loaded = load(t.summed)
            decisions = []
            def decide(x):
                decisions.append(loaded.check({"x": x}))
                return t.summed(x)
            for shape in ((3, 2), (3, 5), (4, 2)):
                torch.vmap(torch.func.grad(decide))(torch.randn(*shape))
            decisions.append(loaded.check({"x": torch.randn(2)}))
            report(decisions)
            """,
        )
        # batch of 3 x (2,) accepted, (5,) rejected, batch of 4 (not guarded)
        # accepted, outside the transforms rejected
        self.assertEqual(decisions, [True, False, True, False])


class TestTransformsInCompiledRegion(torch._dynamo.test_case.TestCase):
    """The compiled function itself calls torch.func transforms."""

    def assert_same_decisions(self, built, loaded, accepted, rejected):
        for expected, items in ((True, accepted), (False, rejected)):
            for stack, f_locals in items:
                with functorch_stack(stack):
                    ref = built.ref.guard_manager.check(f_locals)
                    got = loaded.check(f_locals)
                self.assertEqual(ref, expected, f"reference on {stack!r}")
                self.assertEqual(got, ref, f"loaded on {stack!r}")

    # functionalize in a compiled region is a graph break on 2.7.1.
    @parametrize("fn_name", ["uses_vmap_of_grad", "uses_jvp"])
    def test_functorch_stack_match(self, fn_name):
        fn = globals()[fn_name]
        x = torch.randn(3, 2)
        built = build_check_fn_manager(fn, (x,), keep_only("FUNCTORCH_STACK_MATCH"))
        loaded = load_built(built)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[("", {"x": x})],
            rejected=[("vmap", {"x": x}), ("grad", {"x": x}), ("functionalize", {"x": x})],
        )

    @parametrize("fn_name", ["uses_vmap_of_grad", "uses_jvp"])
    @parametrize("kept", ["local_and_global_state", "all"])
    def test_guards_beyond_the_functorch_stack(self, fn_name, kept):
        # "local_and_global_state": every guard but those on globals (torch.func's
        # internals): the input's tensor guards, the global state and the
        # functorch stack. "all": torch.func's own functions too; the function
        # grad's decorator wraps is named through the wrapper's closure.
        fn = globals()[fn_name]
        x = torch.randn(3, 2)
        keep = {
            "local_and_global_state": keep_local_and_global_state_guards,
            "all": lambda entries: [True] * len(entries),
        }[kept]
        built = build_check_fn_manager(fn, (x,), keep)
        if kept == "all" and fn_name == "uses_vmap_of_grad":
            self.assertIn(b"grad_and_value_impl.__closure__[0]", built.ref.guards_state)
        loaded = load_built(built)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[("", {"x": torch.randn(3, 2)})],
            rejected=[
                ("", {"x": torch.randn(4, 2)}),
                ("", {"x": torch.randn(3, 2, dtype=torch.float64)}),
                ("vmap", {"x": torch.randn(3, 2)}),
            ],
        )

    def test_dual_level(self):
        x = torch.randn(3)
        built = build_check_fn_manager(uses_dual_level, (x,), keep_only("DUAL_LEVEL"))
        state = load_guards_state(built.ref.guards_state)
        self.assertEqual(state.output_graph.global_state.dual_level, -1)
        loaded = load_built(built)
        with fwAD.dual_level():
            # Built from the saved level, not the one live at load.
            loaded_in_dual_level = load_built(built)
        for manager in (loaded, loaded_in_dual_level):
            self.assertTrue(built.ref.guard_manager.check({"x": x}))
            self.assertTrue(manager.check({"x": x}))
            with fwAD.dual_level():
                self.assertFalse(built.ref.guard_manager.check({"x": x}))
                self.assertFalse(manager.check({"x": x}))


instantiate_parametrized_tests(TestFunctorchStackGuardSerialization)
instantiate_parametrized_tests(TestTransformsInCompiledRegion)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
