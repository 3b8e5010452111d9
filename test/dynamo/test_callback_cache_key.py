# Owner(s): ["module: dynamo"]
"""The frame callback a compiled call installs, and the cache key it leads to.

See NOTE: [The installed callback links straight to its cache key]: under the
default and fail_on_recompile stances the frame evaluator gets a _KeyedCallback
whose one _torchdynamo_orig_callable link is the end of the callback's chain,
the object eval_frame.c keys cache entries on. These tests check that the key
is the same object stock's walk reaches, so a frame finds the entries it found
before, and that the forwarder is made once and forwards misses.
"""

import functools
import gc
import weakref

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import eval_frame
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


# The tracer of Python calls the per-call entry tests use.
from test_compiled_call_entry import python_calls


def add_one(x):
    return torch.relu(x) + 1


def chain_end(callback):
    """The walk eval_frame.c's get_backend does, and the links it takes."""
    links = 0
    while hasattr(callback, "_torchdynamo_orig_callable"):
        callback = callback._torchdynamo_orig_callable
        links += 1
    return callback, links


def dynamo_callback(compiled):
    """The Dynamo callback a torch.compile'd function's context holds."""
    cells = dict(zip(compiled.__code__.co_freevars, compiled.__closure__))
    return cells["self"].cell_contents.callback


class TestCallbackCacheKey(torch._dynamo.test_case.TestCase):
    @parametrize("stance", ["default", "fail_on_recompile"])
    def test_the_installed_callback_has_one_link_to_the_same_key(self, stance):
        counter = torch._dynamo.testing.CompileCounter()
        callback = dynamo_callback(torch.compile(add_one, backend=counter))
        key, links = chain_end(callback)
        # CatchErrorsWrapper -> ConvertFrame -> WrapBackendDebug -> torch.compile's
        # wrapper of the backend.
        self.assertEqual(links, 3)
        self.assertIs(key.compiler_fn, counter)
        with torch.compiler.set_stance(stance):
            installed = eval_frame._callback_from_stance(callback)
            self.assertIsInstance(installed, eval_frame._KeyedCallback)
            self.assertEqual(chain_end(installed), (key, 1))
            # Made once: every later call of the compiled function gets it again.
            self.assertIs(eval_frame._callback_from_stance(callback), installed)
            if stance == "default":
                self.assertIs(installed.callback, callback)
            else:
                # fail_on_recompile's callback, which wraps the Dynamo callback.
                self.assertIs(installed.callback._torchdynamo_orig_callable, callback)

    @parametrize("stance", ["default", "fail_on_recompile"])
    def test_a_reinstalled_prior_callback_keeps_its_key(self, stance):
        callback = dynamo_callback(torch.compile(add_one, backend="eager"))
        with torch.compiler.set_stance(stance):
            installed = eval_frame._callback_from_stance(callback)
            reinstalled = eval_frame._callback_from_stance(installed)
            self.assertEqual(chain_end(reinstalled), chain_end(installed))
            if stance == "default":
                self.assertIs(reinstalled, installed)
            else:
                # As stock, a fail_on_recompile callback around the prior one.
                self.assertIs(reinstalled.callback._torchdynamo_orig_callable, installed.callback)

    def test_entries_are_found_under_the_same_key(self):
        # Two torch.compile()s of one function with one backend share its
        # cache entries (stock keys them on the backend); another backend does
        # not. A forwarder keyed on anything else would recompile here.
        counter = torch._dynamo.testing.CompileCounter()
        x = torch.randn(4)
        torch.compile(add_one, backend=counter)(x)
        torch.compile(add_one, backend=counter)(x)
        self.assertEqual(counter.frame_count, 1)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(torch.compile(add_one, backend=counter)(x), add_one(x))
        other = torch._dynamo.testing.CompileCounter()
        torch.compile(add_one, backend=other)(x)
        self.assertEqual((counter.frame_count, other.frame_count), (1, 1))

    def test_a_miss_is_forwarded_to_the_callback(self):
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(add_one, backend=counter, dynamic=False)
        compiled(torch.randn(4))
        compiled(torch.randn(5))
        self.assertEqual(counter.frame_count, 2)
        with torch.compiler.set_stance("fail_on_recompile"):
            with self.assertRaisesRegex(RuntimeError, "function name: 'add_one'"):
                compiled(torch.randn(6))

    @parametrize("stance", ["eager_then_compile", "aot_eager_then_compile"])
    def test_stances_that_read_the_chain_get_the_callback(self, stance):
        # A context's __exit__ reinstalls its prior through _callback_from_stance;
        # these stances read the Dynamo callback's links (ConvertFrame's backend).
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(add_one, backend=counter)
        callback = dynamo_callback(compiled)
        keyed = eval_frame._callback_from_stance(callback)
        with torch.compiler.set_stance(stance):
            delayed = eval_frame._callback_from_stance(keyed)
            cells = dict(zip(delayed.__code__.co_freevars, delayed.__closure__))
            self.assertIs(cells["callback"].cell_contents, callback)
            for _ in range(3):
                x = torch.randn(4)
                self.assertEqual(compiled(x), add_one(x))

    def test_a_copied_attribute_is_not_trusted(self):
        # functools.wraps copies __dict__, forwarder included.
        first = dynamo_callback(torch.compile(add_one, backend="eager"))
        installed = eval_frame._callback_from_stance(first)

        class Callback:
            def __call__(self, *args, **kwargs):
                return first(*args, **kwargs)

        second = functools.wraps(first)(Callback())
        self.assertIs(second._torchdynamo_keyed_callback, installed)
        self.assertIs(eval_frame._callback_from_stance(second).callback, second)

    def test_a_callback_without_attributes_is_installed_as_it_is(self):
        callback = dynamo_callback(torch.compile(add_one, backend="eager"))

        class Holder:
            def callback(self, *args, **kwargs):
                return callback(*args, **kwargs)

        bound = Holder().callback
        self.assertIs(eval_frame._callback_from_stance(bound), bound)

    def test_a_call_walks_nothing_in_python(self):
        compiled = torch.compile(add_one, backend="eager")
        x = torch.randn(4)
        compiled(x)
        calls = python_calls(lambda: compiled(x))
        self.assertIn("_callback_from_stance", calls)
        self.assertNotIn("_keyed_callback", calls)
        self.assertNotIn("_KeyedCallback.__call__", calls)

    def test_a_dropped_compiled_function_frees_its_callback_without_gc(self):
        # The callback keeps its forwarder; the forwarder holds it weakly, so
        # no cycle keeps the backend (and what it compiled) alive.
        compiled = torch.compile(add_one, backend="eager")
        compiled(torch.randn(4))
        callback = dynamo_callback(compiled)
        self.assertIsInstance(callback._torchdynamo_keyed_callback, eval_frame._KeyedCallback)
        dropped = weakref.ref(callback)
        del callback
        gc.disable()
        try:
            del compiled
            self.assertIsNone(dropped())
        finally:
            gc.enable()

    def test_force_backend_is_unchanged(self):
        callback = dynamo_callback(torch.compile(add_one, backend="eager"))
        with torch.compiler.set_stance("default", force_backend="eager"):
            forced = eval_frame._callback_from_stance(callback)
        self.assertNotIsInstance(forced, eval_frame._KeyedCallback)
        self.assertIsNot(forced, callback)


instantiate_parametrized_tests(TestCallbackCacheKey)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
