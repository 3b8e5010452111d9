# Owner(s): ["module: functorch"]
"""A compile that runs with the tracing context's fakify_first_call set (as
DDPOptimizer compiles each piece of a split graph) bypasses the AOTAutograd
cache, unless the compile listener of the context asks for such entries
(record_fakified_compiles): then the compile gets its key, never finds an
entry, and its entry is told to the listener and written nowhere."""

import os

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch._functorch.config
import torch._guards
from torch._dynamo.utils import counters
from torch._functorch._aot_autograd import autograd_cache
from torch._guards import detect_fake_mode
from torch._inductor.utils import fresh_inductor_cache
from torch._subclasses.fake_tensor import FakeTensor


class _Listener:
    def __init__(self, record_fakified_compiles: bool) -> None:
        if record_fakified_compiles:
            self.record_fakified_compiles = True
        self.keys: list[str] = []
        self.entries: list[tuple[str, object]] = []

    def on_cache_key(self, key, gm, aot_config) -> None:
        self.keys.append(key)

    def on_cache_entry(self, key, entry) -> None:
        self.entries.append((key, entry))


def _fakified_inductor(gm, example_inputs):
    """Inductor, compiled and first called as DDPOptimizer does a piece: with
    fakify_first_call set, then once on the fake example inputs."""
    from torch._inductor.compile_fx import compile_fx

    context = torch._guards.TracingContext.get()
    context.fakify_first_call = True
    try:
        compiled = compile_fx(gm, example_inputs)
    finally:
        context.fakify_first_call = False
    with detect_fake_mode(example_inputs):
        outs = compiled(*example_inputs)
    assert all(isinstance(t, FakeTensor) for t in outs), outs
    return compiled


def _mlp(x, w):
    return torch.relu(x @ w).sum(dim=1)


class AOTAutogradCacheFakifiedTests(torch._dynamo.test_case.TestCase):
    def _compile_and_run(self, listener):
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(4, 8, generator=gen)
        w = torch.randn(8, 8, generator=gen, requires_grad=True)
        torch._dynamo.reset()
        with torch._functorch.config.patch(
            enable_autograd_cache=True, force_non_lazy_backward_lowering=True
        ), autograd_cache.compile_listener(listener):
            out = torch.compile(_mlp, backend=_fakified_inductor)(x, w)
        out.sum().backward()
        self.assertEqual(out, _mlp(x, w.detach()))
        return w.grad

    def test_fakified_compiles_bypass_the_cache_by_default(self):
        listener = _Listener(record_fakified_compiles=False)
        with fresh_inductor_cache():
            counters.clear()
            self._compile_and_run(listener)
            self.assertEqual(counters["aot_autograd"]["autograd_cache_bypass"], 1)
            self.assertEqual(counters["aot_autograd"]["autograd_cache_miss"], 0)
        self.assertEqual((listener.keys, listener.entries), ([], []))

    def test_a_listener_that_asks_gets_the_entry_written_nowhere(self):
        listener = _Listener(record_fakified_compiles=True)
        with fresh_inductor_cache():
            counters.clear()
            grad = self._compile_and_run(listener)
            (key,) = listener.keys
            ((entry_key, entry),) = listener.entries
            self.assertEqual(entry_key, key)
            self.assertIsInstance(entry, autograd_cache.AOTAutogradCacheEntry)
            # Forward and backward: the backward's entry came with the forward.
            self.assertIsNotNone(entry.compiled_bw)
            self.assertEqual(counters["aot_autograd"]["autograd_cache_bypass"], 0)
            self.assertEqual(counters["aot_autograd"]["autograd_cache_saved"], 0)
            self.assertFalse(
                os.path.exists(os.path.join(autograd_cache.AOTAutogradCache._get_tmp_dir(), key))
            )
            # The same graph again: a miss under the same key, never a hit (a hit
            # could not answer the fake first call).
            self.assertEqual(self._compile_and_run(listener), grad)
            self.assertEqual(listener.keys, [key, key])
            self.assertEqual(counters["aot_autograd"]["autograd_cache_miss"], 2)
            self.assertEqual(counters["aot_autograd"]["autograd_cache_hit"], 0)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
