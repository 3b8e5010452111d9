# Owner(s): ["module: functorch"]
"""AOTAutograd tells the compile listener of a context the cache key each graph
gets, the entry saved or found under it, and each inference graph it compiled
(compile packages save those); nothing is told outside the context."""

import threading

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch._functorch.config
from torch._functorch._aot_autograd import autograd_cache
from torch._inductor.utils import fresh_inductor_cache


class _RecordingListener:
    def __init__(self) -> None:
        self.keys: list[str] = []
        self.entries: list[tuple[str, object]] = []
        self.inference: list[object] = []

    def on_cache_key(self, key, gm, aot_config) -> None:
        self.keys.append(key)

    def on_cache_entry(self, key, entry) -> None:
        self.entries.append((key, entry))

    def on_inference_compiled(self, compiled) -> None:
        self.inference.append(compiled)


def _scale_shift(x):
    return x.sin() * 2 + 1


class AOTAutogradCacheListenerTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.listener = _RecordingListener()

    def test_a_miss_then_a_hit_report_one_key_and_its_entry(self):
        x = torch.randn(8)
        with torch._functorch.config.patch(enable_autograd_cache=True), fresh_inductor_cache():
            with autograd_cache.compile_listener(self.listener):
                torch.compile(_scale_shift, backend="inductor")(x)
            self.assertEqual(len(self.listener.keys), 1)
            (key,) = self.listener.keys
            # The miss compiled and saved an entry under that key.
            self.assertEqual([k for k, _ in self.listener.entries], [key])
            saved = self.listener.entries[0][1]
            self.assertIsInstance(saved, autograd_cache.AOTAutogradCacheEntry)

            torch._dynamo.reset()
            with autograd_cache.compile_listener(self.listener):
                out = torch.compile(_scale_shift, backend="inductor")(x)
            self.assertEqual(out, _scale_shift(x))
            # The hit reports the same key and the entry it loaded.
            self.assertEqual(self.listener.keys, [key, key])
            self.assertEqual([k for k, _ in self.listener.entries], [key, key])
            self.assertIsNot(self.listener.entries[1][1], saved)

    def test_an_inference_compile_reports_what_it_built(self):
        x = torch.randn(8)
        # An empty cache: a hit from an earlier test compiles nothing to report.
        with fresh_inductor_cache(), torch.no_grad():
            with autograd_cache.compile_listener(self.listener):
                torch.compile(_scale_shift, backend="inductor")(x)
        (compiled,) = self.listener.inference
        self.assertIsInstance(compiled, autograd_cache.InferenceCompiled)
        self.assertIsInstance(compiled.fw_module, torch.fx.GraphModule)
        self.assertEqual(compiled.compiled_fw([x])[0], _scale_shift(x))
        self.assertFalse(compiled.fw_metadata.is_train)

    def test_compiles_outside_the_context_are_not_reported(self):
        x = torch.randn(8)
        with torch._functorch.config.patch(enable_autograd_cache=True), fresh_inductor_cache():
            with autograd_cache.compile_listener(self.listener):
                # Another thread compiles while the listener is installed here.
                worker = threading.Thread(
                    target=lambda: torch.compile(_scale_shift, backend="inductor")(x)
                )
                worker.start()
                worker.join()
            torch._dynamo.reset()
            torch.compile(lambda t: _scale_shift(t) + 1, backend="inductor")(x)
        self.assertEqual((self.listener.keys, self.listener.entries, self.listener.inference), ([], [], []))
        self.assertIsNone(autograd_cache._compile_listener.get())


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
