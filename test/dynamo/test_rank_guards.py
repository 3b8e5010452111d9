# Owner(s): ["module: dynamo"]
"""Folded torch.distributed.get_rank(), get_world_size() and is_initialized() are guarded.

One process, a gloo group of one rank; another rank or world size is played
by the default group ``get_rank()`` and ``get_world_size()`` read (patching
``torch.distributed.get_rank`` itself would fail the guard on the function
object, not the one on its value). test/distributed/test_package_rank_values.py
runs real ranks.
"""

import tempfile
import unittest
from unittest import mock

import torch
import torch._dynamo.test_case
import torch.distributed as dist
from torch._dynamo.testing import CompileCounter
from torch.distributed import distributed_c10d


class _DefaultGroup:
    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def _as_rank(rank: int, size: int = 1):
    return mock.patch.object(distributed_c10d, "_get_default_group", lambda: _DefaultGroup(rank, size))


def _add_rank_values(x):
    return x + dist.get_rank() + dist.get_world_size()


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "needs torch.distributed with gloo")
class TestRankGuards(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.workdir = tempfile.mkdtemp(prefix="test_rank_guards_")
        dist.init_process_group("gloo", init_method=f"file://{self.workdir}/store", rank=0, world_size=1)

    def tearDown(self):
        import shutil

        dist.destroy_process_group()
        shutil.rmtree(self.workdir, ignore_errors=True)
        super().tearDown()

    def test_another_rank_recompiles(self):
        cnt = CompileCounter()
        compiled = torch.compile(_add_rank_values, backend=cnt)
        x = torch.ones(2)
        self.assertEqual(compiled(x), x + 1)
        with _as_rank(5):
            self.assertEqual(compiled(x), x + 6)
        with _as_rank(0, size=3):
            self.assertEqual(compiled(x), x + 3)
        self.assertEqual(cnt.frame_count, 3)

    def test_loaded_guard_compares_the_saved_rank(self):
        x = torch.ones(2)
        compiled = torch.compile(_add_rank_values, backend="eager", package="rank_guards")
        self.assertEqual(compiled(x), x + 1)
        compiled.save_package(prefix=self.workdir)
        torch._dynamo.reset()
        loaded = torch.compile(_add_rank_values, backend="eager", package="rank_guards")
        loaded.load_package(prefix=self.workdir)
        self.assertGreaterEqual(len(loaded._package._loaded), 1)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(loaded(x), x + 1)
            with _as_rank(1):
                with self.assertRaisesRegex(RuntimeError, "fail_on_recompile"):
                    loaded(x)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
