# Owner(s): ["module: dynamo"]
"""What every call of a torch.compile'd function does on its way in and out.

See NOTE: [Calls that ask JustKnobs] and NOTE: [on_enter is a call, not an
enter/exit hook]: the entry sets the frame evaluator without asking JustKnobs
when there is no knob service, and runs the context's on_enter (the module
generation bump) as a plain call, with no enter/exit hook of its own. What the
entry does is unchanged: one generation per call, modules made during a call
tagged with it, every enter/exit hook entered and cleaned up once per call.
"""

import sys

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._C._dynamo.eval_frame import set_eval_frame
from torch._dynamo import eval_frame
from torch._dynamo.mutation_guard import GenerationTracker
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


def add_one(x):
    return torch.relu(x) + 1


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.linear(x) + 1


def python_calls(fn):
    """The qualified name of every Python function entered while fn() runs."""
    calls = []

    def profile(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return calls


class TestCompiledCallEntry(torch._dynamo.test_case.TestCase):
    def test_the_frame_evaluator_is_set_without_asking_justknobs(self):
        self.assertTrue(torch._utils_internal.DISABLE_JUSTKNOBS)
        self.assertIs(eval_frame._maybe_set_eval_frame, set_eval_frame)
        compiled = torch.compile(add_one, backend="eager")
        x = torch.randn(4)
        compiled(x)
        names = set(python_calls(lambda: compiled(x)))
        # Stock 2.7.1: four calls of each per call of a compiled function.
        self.assertNotIn("_maybe_set_eval_frame", names)
        self.assertNotIn("justknobs_check", names)

    def test_a_compiled_call_enters_through_no_hook_of_its_own(self):
        compiled = torch.compile(Affine(), backend="eager")
        x = torch.randn(2, 4)
        compiled(x)
        self.assertEqual(compiled.dynamo_ctx.enter_exit_hooks, [])
        names = python_calls(lambda: compiled(x))
        # Stock 2.7.1 runs call_on_enter, OptimizeContext's on_enter closure and
        # a nothing() cleanup on every call.
        for wrapper in (
            "_TorchDynamoContext.__init__.<locals>.call_on_enter",
            "OptimizeContext.__init__.<locals>.on_enter",
            "nothing",
        ):
            self.assertNotIn(wrapper, names)
        self.assertEqual(names.count("install_generation_tagging_init"), 1)

    @parametrize("how", ["compile", "run_only"])
    def test_every_call_starts_one_module_generation(self, how):
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(add_one, backend=counter)
        x = torch.randn(4)
        compiled(x)
        if how == "run_only":
            # RunOnlyContext's on_enter: the generation cudagraph trees read.
            compiled = torch._dynamo.run(compiled)
        before = GenerationTracker.generation
        for _ in range(3):
            compiled(x)
        self.assertEqual(GenerationTracker.generation, before + 3)
        self.assertEqual(counter.frame_count, 1)

    def test_a_module_made_during_a_call_belongs_to_that_calls_generation(self):
        made = []

        @torch._dynamo.disable
        def make():
            made.append(torch.nn.Identity())

        def make_and_add(x):
            x = x + 1
            make()
            return x * 2

        compiled = torch.compile(make_and_add, backend="eager")
        x = torch.randn(4)
        compiled(x)
        self.assertTrue(GenerationTracker.check(made[-1]))
        compiled(x)
        self.assertFalse(GenerationTracker.check(made[0]))
        self.assertTrue(GenerationTracker.check(made[1]))

    def test_enter_exit_hooks_still_enter_and_clean_up_once_per_call(self):
        events = []

        def hook():
            events.append("enter")
            return lambda: events.append("exit")

        compiled = torch.compile(add_one, backend="eager", dynamic=False)
        # torch.compile's wrapper of a function closes over its context.
        cells = dict(zip(compiled.__code__.co_freevars, compiled.__closure__))
        dynamo_ctx = cells["self"].cell_contents
        self.assertIsInstance(dynamo_ctx, eval_frame.OptimizeContext)
        # dynamic=False brings one hook; ours goes after it.
        self.assertEqual(len(dynamo_ctx.enter_exit_hooks), 1)
        dynamo_ctx.enter_exit_hooks.append(hook)
        before = GenerationTracker.generation
        x = torch.randn(4)
        compiled(x)
        compiled(x)
        self.assertEqual(events, ["enter", "exit"] * 2)
        self.assertEqual(GenerationTracker.generation, before + 2)


instantiate_parametrized_tests(TestCompiledCallEntry)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
