# Owner(s): ["module: dynamo"]
"""torch._dynamo.mark_static_address called inside a compiled frame.

Caches that mark the tensors they allocate in ``__init__`` (transformers'
HybridCache, MambaCache, HybridChunkedCache), built inside a compiled forward,
used to fail the compile with "Attempt to trace forbidden callable". Dynamo
now replays the call after the graph on the real tensor (NOTE:
[mark_static_address in a compiled frame] in torch/_dynamo/symbolic_convert.py):
the compiled function gives eager's result and leaves eager's mark on the
tensor, on every call, and a compile package of such a model saved by one
interpreter loads in a fresh one under fail_on_recompile.
"""

import shutil
import tempfile
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


class LayerCache:
    """A cache written like transformers' static caches: one zeroed tensor per
    layer, marked static in __init__."""

    def __init__(self, batch, length, width, layers, guard=True):
        self.keys = []
        for _ in range(layers):
            keys = torch.zeros(batch, length, width)
            torch._dynamo.mark_static_address(keys, guard=guard)
            self.keys.append(keys)

    def update(self, layer, positions, states):
        self.keys[layer].index_copy_(1, positions, states)
        return self.keys[layer]


def prefill(x, guard):
    cache = LayerCache(x.shape[0], 8, x.shape[-1], 2, guard=guard)
    positions = torch.arange(x.shape[1])
    out = x
    for layer in range(2):
        out = out + cache.update(layer, positions, out.sin()).sum(1, keepdim=True)
    return out, cache


def static_input_types(cache):
    return [getattr(t, "_dynamo_static_input_type", None) for t in cache.keys]


class TestMarkStaticAddressTraced(torch._dynamo.test_case.TestCase):
    @parametrize("guard", [True, False])
    def test_cache_built_in_a_compiled_frame(self, guard):
        counter = CompileCounter()
        compiled = torch.compile(prefill, backend=counter, fullgraph=True)
        x = torch.randn(1, 5, 4)
        want, eager_cache = prefill(x, guard)
        for _ in range(2):
            # The second call runs the compiled code: the mark is replayed on
            # the new cache's tensors, not applied once while tracing.
            got, cache = compiled(x, guard)
            self.assertEqual(got, want)
            self.assertEqual(cache.keys, eager_cache.keys)
            self.assertEqual(static_input_types(cache), static_input_types(eager_cache))
            self.assertEqual(static_input_types(cache), ["guarded" if guard else "unguarded"] * 2)
        self.assertEqual(counter.frame_count, 1)

    def test_marked_cache_is_a_static_input_of_the_next_frame(self):
        # As in eager: a guarded mark makes the next compile guard the tensor's
        # identity, so a second cache compiles again.
        counter = CompileCounter()

        @torch.compile(backend=counter, fullgraph=True)
        def step(cache, states):
            return cache.update(0, torch.tensor([1]), states) * 2

        caches = [torch.compile(prefill, backend="eager", fullgraph=True)(torch.randn(1, 3, 4), True)[1]]
        caches.append(prefill(torch.randn(1, 3, 4), True)[1])
        states = torch.randn(1, 1, 4)
        for cache in caches:
            self.assertEqual(step(cache, states), cache.keys[0] * 2)
        self.assertEqual(counter.frame_count, 2)

    def test_mark_of_an_input_tensor_is_replayed_on_every_call(self):
        @torch.compile(backend="eager", fullgraph=True)
        def mark_and_add(t):
            torch._dynamo.mark_static_address(t, guard=False)
            return t + 1

        for _ in range(2):
            t = torch.randn(3)
            self.assertEqual(mark_and_add(t), t + 1)
            self.assertEqual(t._dynamo_static_input_type, "unguarded")

    def test_mark_before_a_graph_break(self):
        counter = CompileCounter()

        @torch.compile(backend=counter)
        def mark_then_break(x):
            t = torch.zeros(3)
            torch._dynamo.mark_static_address(t)
            torch._dynamo.graph_break()
            return t.add_(x), t

        x = torch.randn(3)
        out, t = mark_then_break(x)
        self.assertEqual(out, x)
        self.assertIs(out, t)
        self.assertEqual(t._dynamo_static_input_type, "guarded")
        self.assertEqual(counter.frame_count, 2)

    def test_mark_of_a_non_tensor_raises_as_in_eager(self):
        # Not traced: the call graph breaks and eager raises.
        @torch.compile(backend="eager")
        def mark_an_int(x):
            torch._dynamo.mark_static_address(3)
            return x + 1

        with self.assertRaisesRegex(TypeError, "mark_static_address expects a tensor"):
            mark_an_int(torch.randn(2))


PACKAGE_RUNNER = r'''
import sys
import torch
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report

mode, package_dir = sys.argv[1:3]
CACHE_LENGTH = 16


class LayerCache:
    def __init__(self, batch, length, width, layers):
        self.keys = []
        for _ in range(layers):
            keys = torch.zeros(batch, length, width)
            torch._dynamo.mark_static_address(keys)
            self.keys.append(keys)

    def update(self, layer, positions, states):
        self.keys[layer].index_copy_(1, positions, states)
        return self.keys[layer]


class TinyDecoder(torch.nn.Module):
    """Builds its cache inside forward when given none, as transformers'
    gemma2 does with HybridCache."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def forward(self, x, cache=None, positions=None):
        if cache is None:
            cache = LayerCache(x.shape[0], CACHE_LENGTH, x.shape[-1], len(self.layers))
            positions = torch.arange(x.shape[1])
        for i, layer in enumerate(self.layers):
            keys = cache.update(i, positions, layer(x))
            x = x + keys.sum(1, keepdim=True) / CACHE_LENGTH
        return x, cache


def decode(fn, prompt, steps):
    out, cache = fn(prompt)
    outs = [out]
    for k in range(steps):
        position = torch.tensor([prompt.shape[1] + k])
        out, cache = fn(out[:, -1:], cache, position)
        outs.append(out)
    return outs, cache


torch.manual_seed(0)
model = TinyDecoder()
compiled = torch.compile(model, backend="aot_eager", dynamic=True, package=package_dir)
prompt_length, steps = (5, 3) if mode == "save" else (7, 4)
prompt = torch.randn(1, prompt_length, 8, generator=torch.Generator().manual_seed(prompt_length))
report = {}
with torch.no_grad():
    want, _ = decode(model, prompt, steps)
    if mode == "save":
        got, cache = decode(compiled, prompt, steps)
        compiled.save_package()
        import json, os
        with open(os.path.join(package_dir, "manifest.json")) as f:
            report["entries"] = json.load(f)["entries"]
    else:
        compiled.load_package()
        counters.clear()
        with torch.compiler.set_stance("fail_on_recompile"):
            got, cache = decode(compiled, prompt, steps)
        report["traced_graphs"] = counters["stats"]["unique_graphs"]
report["same"] = all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))
report["static_input_types"] = [getattr(t, "_dynamo_static_input_type", None) for t in cache.keys]
write_report(report)
'''


class TestMarkStaticAddressTracedPackage(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="mark-static-address-test-"))

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def test_package_of_a_model_that_builds_its_cache(self):
        package = self.tmp / "pkg"
        options = dict(cwd=self.tmp, fresh_inductor_cache=True)
        saved = run_code(PACKAGE_RUNNER, "save", package, **options)
        self.assertTrue(saved["same"])
        self.assertGreater(saved["entries"], 0)
        self.assertEqual(saved["static_input_types"], ["guarded", "guarded"])
        # A fresh interpreter, another prompt length and more steps: every call
        # runs the package (the prefill that builds and marks the cache, the
        # steps that take the marked tensors as graph inputs).
        loaded = run_code(PACKAGE_RUNNER, "load", package, **options)
        self.assertTrue(loaded["same"])
        self.assertEqual(loaded["traced_graphs"], 0)
        self.assertEqual(loaded["static_input_types"], ["guarded", "guarded"])


instantiate_parametrized_tests(TestMarkStaticAddressTraced)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
