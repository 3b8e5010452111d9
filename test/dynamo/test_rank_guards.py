# Owner(s): ["module: dynamo"]
"""Folded torch.distributed.get_rank(), get_world_size() and is_initialized() are
guarded, and so are ProcessGroup.rank() and size() and DeviceMesh.get_coordinate();
under a compile package a group's member ranks are not folded.

One process, a gloo group of one rank; another rank or world size is played
by the default group ``get_rank()`` and ``get_world_size()`` read (patching
``torch.distributed.get_rank`` itself would fail the guard on the function
object, not the one on its value), or, for a group's own ``rank()`` and
``size()``, by ProcessGroup's methods patched on the class.
test/distributed/test_package_rank_values.py runs real ranks.
"""

import contextlib
import tempfile
import unittest
from unittest import mock

import torch
import torch._dynamo.test_case
import torch.distributed as dist
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters
from torch.distributed import distributed_c10d
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


class _DefaultGroup:
    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


def _as_rank(rank: int, size: int = 1):
    return mock.patch.object(
        distributed_c10d, "_get_default_group", lambda: _DefaultGroup(rank, size)
    )


@contextlib.contextmanager
def _as_group_rank(rank: int, size: int = 1):
    # Every ProcessGroup, so the default group too, whichever way it is reached.
    with (
        mock.patch.object(dist.ProcessGroup, "rank", lambda self: rank),
        mock.patch.object(dist.ProcessGroup, "size", lambda self: size),
    ):
        yield


def _add_rank_values(x):
    return x + dist.get_rank() + dist.get_world_size()


def _add_group_rank_values(x):
    # The default group reached two ways: the group.WORLD global, and the
    # inlined distributed_c10d._get_default_group().
    return (
        x + 10 * dist.group.WORLD.rank() + distributed_c10d._get_default_group().size()
    )


def _add_mesh_coordinate(x):
    return x + 10 * _MESH.get_coordinate()[0] + 1


def _as_mesh_rank(rank: int, size: int = 1):
    # This rank's coordinate in _MESH (a mesh of one dimension: its size is
    # the mesh's shape, which the mesh's own guard compares).
    return mock.patch.object(DeviceMesh, "get_coordinate", lambda self: [rank])


def _add_group_ranks(x):
    return x + len(dist.get_process_group_ranks(dist.group.WORLD))


# How a frame reads the rank: (function, how a test plays another rank and
# world size, the function's result less x as (rank, size) make it, the other
# (rank, size) pairs played: each differs from the saving process's (0, 1)
# and from the others in what the function reads).
_SPELLINGS = {
    "get_rank": (_add_rank_values, _as_rank, lambda r, s: r + s, [(1, 2), (0, 2)]),
    "group_rank": (_add_group_rank_values, _as_group_rank, lambda r, s: 10 * r + s, [(5, 6), (0, 3)]),
    "mesh_coordinate": (_add_mesh_coordinate, _as_mesh_rank, lambda r, s: 10 * r + 1, [(1, 1), (2, 1)]),
}


# A DeviceMesh's groups have no source Dynamo can guard on; set in setUp.
_MESH = None


def _add_mesh_group_rank(x):
    return x + _MESH.get_group().rank()


@unittest.skipUnless(
    dist.is_available() and dist.is_gloo_available(),
    "needs torch.distributed with gloo",
)
class TestRankGuards(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.workdir = tempfile.mkdtemp(prefix="test_rank_guards_")
        dist.init_process_group(
            "gloo", init_method=f"file://{self.workdir}/store", rank=0, world_size=1
        )
        global _MESH
        _MESH = init_device_mesh("cpu", (1,))

    def tearDown(self):
        import shutil

        global _MESH
        _MESH = None
        dist.destroy_process_group()
        shutil.rmtree(self.workdir, ignore_errors=True)
        super().tearDown()

    @parametrize("spelling", list(_SPELLINGS))
    def test_another_rank_recompiles(self, spelling):
        fn, as_rank, value, others = _SPELLINGS[spelling]
        cnt = CompileCounter()
        compiled = torch.compile(fn, backend=cnt)
        x = torch.ones(2)
        self.assertEqual(compiled(x), x + 1)
        for rank, size in others:
            with as_rank(rank, size):
                self.assertEqual(compiled(x), x + value(rank, size))
        self.assertEqual(cnt.frame_count, 3)

    @parametrize("spelling", list(_SPELLINGS))
    def test_loaded_guard_compares_the_saved_rank(self, spelling):
        fn, as_rank, _, others = _SPELLINGS[spelling]
        x = torch.ones(2)
        compiled = torch.compile(fn, backend="eager", package=f"rank_guards_{spelling}")
        self.assertEqual(compiled(x), x + 1)
        compiled.save_package(prefix=self.workdir)
        self.assertEqual(compiled._package._unsaveable, [])
        torch._dynamo.reset()
        loaded = torch.compile(fn, backend="eager", package=f"rank_guards_{spelling}")
        loaded.load_package(prefix=self.workdir)
        self.assertGreaterEqual(len(loaded._package._loaded), 1)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(loaded(x), x + 1)
            for rank, size in others:
                with as_rank(rank, size):
                    with self.assertRaisesRegex(RuntimeError, "fail_on_recompile"):
                        loaded(x)

    def test_group_without_source_graph_breaks_under_a_package(self):
        x = torch.ones(2)
        # Without a package the mesh's group rank folds, as in torch 2.7.1.
        counters.clear()
        cnt = CompileCounter()
        self.assertEqual(torch.compile(_add_mesh_group_rank, backend=cnt)(x), x)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(dict(counters["graph_break"]), {})
        # Under a package no guard could check it: the frame graph-breaks.
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(
            _add_mesh_group_rank, backend="eager", package="mesh_group_rank"
        )
        self.assertEqual(compiled(x), x)
        breaks = list(counters["graph_break"])
        self.assertTrue(
            any("ProcessGroup.rank() under a compile package" in b for b in breaks),
            breaks,
        )

    def test_group_ranks_are_not_folded_under_a_package(self):
        x = torch.ones(2)
        # Without a package the group's member ranks fold, as in torch 2.7.1.
        counters.clear()
        cnt = CompileCounter()
        self.assertEqual(torch.compile(_add_group_ranks, backend=cnt)(x), x + 1)
        self.assertEqual(cnt.frame_count, 1)
        self.assertEqual(dict(counters["graph_break"]), {})
        # Under a package they differ between the ranks of a subgroup and no
        # guard could check them: the frame graph-breaks on the call.
        torch._dynamo.reset()
        counters.clear()
        compiled = torch.compile(_add_group_ranks, backend="eager", package="group_ranks")
        self.assertEqual(compiled(x), x + 1)
        breaks = list(counters["graph_break"])
        self.assertTrue(
            any("get_process_group_ranks under a compile package" in b for b in breaks),
            breaks,
        )


instantiate_parametrized_tests(TestRankGuards)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
