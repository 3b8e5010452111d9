# Owner(s): ["module: functorch"]
"""AOTAutogradCache tells its listeners the cache key each graph gets and the
entry saved or found under it (compile packages save those entries)."""

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

    def on_cache_key(self, key, gm, aot_config) -> None:
        self.keys.append(key)

    def on_cache_entry(self, key, entry) -> None:
        self.entries.append((key, entry))


def _scale_shift(x):
    return x.sin() * 2 + 1


class AOTAutogradCacheListenerTests(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.listener = _RecordingListener()
        autograd_cache._cache_event_listeners.append(self.listener)

    def tearDown(self):
        autograd_cache._cache_event_listeners.remove(self.listener)
        super().tearDown()

    def test_a_miss_then_a_hit_report_one_key_and_its_entry(self):
        x = torch.randn(8)
        with torch._functorch.config.patch(enable_autograd_cache=True), fresh_inductor_cache():
            torch.compile(_scale_shift, backend="inductor")(x)
            self.assertEqual(len(self.listener.keys), 1)
            (key,) = self.listener.keys
            # The miss compiled and saved an entry under that key.
            self.assertEqual([k for k, _ in self.listener.entries], [key])
            saved = self.listener.entries[0][1]
            self.assertIsInstance(saved, autograd_cache.AOTAutogradCacheEntry)

            torch._dynamo.reset()
            out = torch.compile(_scale_shift, backend="inductor")(x)
            self.assertEqual(out, _scale_shift(x))
            # The hit reports the same key and the entry it loaded.
            self.assertEqual(self.listener.keys, [key, key])
            self.assertEqual([k for k, _ in self.listener.entries], [key, key])
            self.assertIsNot(self.listener.entries[1][1], saved)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
