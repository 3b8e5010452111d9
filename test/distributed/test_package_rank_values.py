# Owner(s): ["module: dynamo"]
"""A compile package is not run with another rank's rank or world size.

Dynamo folds ``torch.distributed.get_rank()`` and ``get_world_size()``, and a
process group's ``rank()`` and ``size()``, into the graph as constants. A
package saved on rank 0 and loaded on every rank must not run rank 0's
constants on rank 1: the folded values are guarded, so rank 1 rejects the
loaded entry and recompiles (or, where no guard can be saved, the entry is not
saved and rank 1 compiles its own). Real ranks, as in
test_package_distributed.py: this file, started again as a worker once per
rank, two ranks on the gloo backend joined through a file store, a timeout on
every collective and on the processes; the package is saved by one job and
loaded by a FRESH one. One job runs every case (each its own package).
"""

import datetime
import sys
import tempfile
import unittest
from pathlib import Path

import torch
import torch._dynamo.test_case
import torch.distributed as dist
from torch.distributed import distributed_c10d
from torch.testing._internal.fresh_process import rank_worker_main, run_ranks


WORLD_SIZE = 2
# Seconds: any one collective, and one phase of all ranks.
COLLECTIVE_TIMEOUT_S = 60
PHASE_TIMEOUT_S = 120


def _add_rank_values(x):
    return x + dist.get_rank() + dist.get_world_size()


def _add_world_group_rank(x):
    return x + 10 * dist.group.WORLD.rank() + dist.group.WORLD.size()


def _add_default_group_rank(x):
    pg = distributed_c10d._get_default_group()
    return x + 10 * pg.rank() + pg.size()


class _GroupRankNet(torch.nn.Module):
    """Keeps its process group as an attribute, as DDP and FSDP do."""

    def __init__(self) -> None:
        super().__init__()
        self.pg = dist.group.WORLD

    def forward(self, x):
        return x + 10 * self.pg.rank() + self.pg.size()


def _cases() -> dict:
    """name -> (what to compile, its expected value on this rank for x)."""
    rank, size = dist.get_rank(), dist.get_world_size()
    return {
        "get_rank": (_add_rank_values, lambda x: x + rank + size),
        "group_world": (_add_world_group_rank, lambda x: x + 10 * rank + size),
        "default_group": (_add_default_group_rank, lambda x: x + 10 * rank + size),
        "module_group": (_GroupRankNet(), lambda x: x + 10 * rank + size),
    }


def _package_of(compiled):
    # A compiled module (OptimizedModule) makes its package on demand.
    if isinstance(compiled, torch.nn.Module):
        return compiled._compile_package()
    return compiled._package


def _worker(args: dict) -> dict:
    rank = int(args["rank"])
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args['store']}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    prefix = args["prefix"]
    x = torch.arange(4.0)
    results: dict = {}
    if args["phase"] == "load":
        dist.barrier()  # rank 0's packages are complete
    for name, (fn, expected_fn) in _cases().items():
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="eager", package=f"rank_values_{name}")
        expected = expected_fn(x)
        result: dict = {"rank": rank}
        if args["phase"] == "save":
            if rank == 0:
                result["correct"] = torch.equal(compiled(x), expected)
                compiled.save_package(prefix=prefix)
                result["left_out"] = list(_package_of(compiled)._unsaveable)
        else:
            compiled.load_package(prefix=prefix)
            result["entries"] = len(_package_of(compiled)._loaded)
            with torch.compiler.set_stance("fail_on_recompile"):
                try:
                    out = compiled(x)
                except RuntimeError as e:
                    result["fail_on_recompile_error"] = str(e)
                else:
                    result["fail_on_recompile_error"] = None
                    result["correct_without_recompile"] = torch.equal(out, expected)
            # Under the default stance every rank gets its own values.
            result["correct"] = torch.equal(compiled(x), expected)
        results[name] = result
    dist.barrier()
    return results


def _worker_main(argv: list[str]) -> None:
    rank_worker_main(argv, _worker)


@unittest.skipUnless(
    dist.is_available() and dist.is_gloo_available(),
    "needs torch.distributed with gloo",
)
class TestPackageRankValues(torch._dynamo.test_case.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.workdir = Path(tempfile.mkdtemp(prefix="test_package_rank_values_"))
        prefix = str(cls.workdir / "rank0")
        # Both jobs run once for every test below: starting ranks is slow.
        cls.saved = run_ranks(
            __file__,
            cls.workdir,
            WORLD_SIZE,
            PHASE_TIMEOUT_S,
            phase="save",
            prefix=prefix,
        )
        cls.loaded = run_ranks(
            __file__,
            cls.workdir,
            WORLD_SIZE,
            PHASE_TIMEOUT_S,
            phase="load",
            prefix=prefix,
        )

    @classmethod
    def tearDownClass(cls):
        import shutil

        shutil.rmtree(cls.workdir, ignore_errors=True)
        super().tearDownClass()

    def _check_saved_and_guarded(self, case: str) -> None:
        saved = self.saved[0][case]
        self.assertTrue(saved["correct"], saved)
        self.assertEqual(saved["left_out"], [], saved)
        loaded = [ranks[case] for ranks in self.loaded]
        for r in loaded:
            self.assertGreaterEqual(r["entries"], 1, r)
            self.assertTrue(r["correct"], r)
        # Rank 0 runs its own package as it is.
        self.assertIsNone(loaded[0]["fail_on_recompile_error"], loaded[0])
        self.assertTrue(loaded[0]["correct_without_recompile"], loaded[0])
        # Rank 1's rank is not the one the package folded: the loaded entry's
        # guard rejects it, so it recompiles (and fail_on_recompile refuses to).
        self.assertIn(
            "fail_on_recompile", loaded[1]["fail_on_recompile_error"] or "", loaded[1]
        )

    def test_get_rank(self):
        self._check_saved_and_guarded("get_rank")

    def test_group_world_rank(self):
        self._check_saved_and_guarded("group_world")

    def test_default_group_rank(self):
        self._check_saved_and_guarded("default_group")

    def test_module_group_rank(self):
        # A group kept on a module has no name another process could find it
        # by: its ID_MATCH guard is refused, so the entry is not saved and
        # every rank compiles its own. What matters: rank 1 never runs rank 0's
        # value.
        saved = self.saved[0]["module_group"]
        self.assertTrue(saved["correct"], saved)
        self.assertTrue(any("ID_MATCH" in why for why in saved["left_out"]), saved)
        for r in (ranks["module_group"] for ranks in self.loaded):
            self.assertTrue(r["correct"], r)
            if r["fail_on_recompile_error"] is None:
                self.assertTrue(r["correct_without_recompile"], r)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
    else:
        from torch._dynamo.test_case import run_tests

        run_tests()
