# Owner(s): ["module: inductor"]
"""Inductor's cache key names the patch series a backport build serves.

The compat patch "Backport: Inductor's cache key names the patch series served"
(NOTE: [The cache key of a backport build] in torch/_inductor/codecache.py) is
never exported, so these tests live here. Under the overlay the files on disk
stay stock 2.7.1: without the series in the key, code Inductor generated and
cached under stock torch (or another series) would be loaded under this one.
"""

import os
import tempfile
import unittest
import unittest.mock

import torch
import torch._inductor.test_case
from torch.testing._internal.common_utils import slowTest
from torch.testing._internal.fresh_process import REPORT_PATH_ENV, run_code


# One Inductor compile in a fresh process; reports the FX graph cache's hits and
# misses. The cache directory is the parent's (TORCHINDUCTOR_CACHE_DIR). Stock
# torch has no torch.testing._internal.fresh_process: the report is written where
# its write_report writes it.
COMPILE = r"""
import json, os
import torch
from torch._dynamo.utils import counters

def write_report(report):
    with open(os.environ[REPORT_PATH_ENV], "w") as f:
        json.dump(report, f)

def f(x):
    return torch.nn.functional.gelu(x * 3.0) - 1.0

x = torch.randn(16)
torch.testing.assert_close(torch.compile(f, backend="inductor")(x), f(x))
write_report({"hit": counters["inductor"]["fxgraph_cache_hit"],
              "miss": counters["inductor"]["fxgraph_cache_miss"]})
""".replace("REPORT_PATH_ENV", repr(REPORT_PATH_ENV))


class TestBackportCacheKey(torch._inductor.test_case.TestCase):
    def key_for_series(self, series):
        from torch._dynamo import _backport_build
        from torch._inductor import codecache

        codecache.torch_key.cache_clear()
        try:
            with unittest.mock.patch.object(_backport_build, "series_hash", return_value=series):
                return codecache.torch_key()
        finally:
            codecache.torch_key.cache_clear()

    def test_the_series_is_part_of_the_key(self):
        self.assertEqual(self.key_for_series("a" * 12), self.key_for_series("a" * 12))
        self.assertNotEqual(self.key_for_series("a" * 12), self.key_for_series("b" * 12))
        self.assertNotEqual(self.key_for_series("a" * 12), self.key_for_series("none"))

    @unittest.skipUnless(
        os.environ.get("TORCH_OVERLAY_EXPECT") == "overlay",
        "stock torch and the overlay share a venv only in the overlay's suite",
    )
    @slowTest
    def test_stock_torch_and_the_overlay_do_not_share_generated_code(self):
        with tempfile.TemporaryDirectory(prefix="backport-cache-key-") as cache:
            env = {"TORCHINDUCTOR_CACHE_DIR": cache}
            stock = run_code(COMPILE, env={**env, "TORCH_OVERLAY": "0"}, cwd=cache)
            overlay = run_code(COMPILE, env={**env, "TORCH_OVERLAY": "1"}, cwd=cache)
            again = run_code(COMPILE, env={**env, "TORCH_OVERLAY": "1"}, cwd=cache)
        self.assertEqual(stock, {"hit": 0, "miss": 1})
        # The overlay compiles its own code, then finds it.
        self.assertEqual(overlay, {"hit": 0, "miss": 1})
        self.assertEqual(again, {"hit": 1, "miss": 0})


if __name__ == "__main__":
    from torch._inductor.test_case import run_tests

    run_tests()
