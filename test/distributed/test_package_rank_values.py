# Owner(s): ["module: dynamo"]
"""A compile package is not run with another rank's get_rank() or get_world_size().

Dynamo folds ``torch.distributed.get_rank()`` and ``get_world_size()`` into the
graph as constants. A package saved on rank 0 and loaded on every rank must
not run rank 0's constants on rank 1: the folded values are guarded, so rank 1
rejects the loaded entry and recompiles. Real ranks, as in
test_package_distributed.py: this file, started again as a worker once per
rank, two ranks on the gloo backend joined through a file store, a timeout on
every collective and on the processes; the package is saved by one job and
loaded by a FRESH one.
"""

import datetime
import sys
import tempfile
import unittest
from pathlib import Path

import torch
import torch._dynamo.test_case
import torch.distributed as dist
from torch.testing._internal.fresh_process import rank_worker_main, run_ranks


WORLD_SIZE = 2
# Seconds: any one collective, and one phase of all ranks.
COLLECTIVE_TIMEOUT_S = 60
PHASE_TIMEOUT_S = 120
PACKAGE = "rank_values"


def _add_rank_values(x):
    return x + dist.get_rank() + dist.get_world_size()


def _worker(args: dict) -> dict:
    rank = int(args["rank"])
    dist.init_process_group(
        "gloo",
        init_method=f"file://{args['store']}",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    compiled = torch.compile(_add_rank_values, backend="eager", package=PACKAGE)
    prefix = args["prefix"]
    x = torch.arange(4.0)
    expected = x + rank + WORLD_SIZE
    result: dict = {"rank": rank}
    if args["phase"] == "save":
        if rank == 0:
            torch.testing.assert_close(compiled(x), expected)
            compiled.save_package(prefix=prefix)
            result["left_out"] = list(compiled._package._unsaveable)
    else:
        dist.barrier()  # rank 0's package is complete
        compiled.load_package(prefix=prefix)
        result["entries"] = len(compiled._package._loaded)
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
    dist.barrier()
    return result


def _worker_main(argv: list[str]) -> None:
    rank_worker_main(argv, _worker)


def _run_ranks(phase: str, workdir: Path, **args) -> list[dict]:
    return run_ranks(__file__, workdir, WORLD_SIZE, PHASE_TIMEOUT_S, phase=phase, **args)


@unittest.skipUnless(dist.is_available() and dist.is_gloo_available(), "needs torch.distributed with gloo")
class TestPackageRankValues(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.workdir = Path(tempfile.mkdtemp(prefix="test_package_rank_values_"))

    def tearDown(self):
        import shutil

        shutil.rmtree(self.workdir, ignore_errors=True)
        super().tearDown()

    def test_rank_0_package_on_every_rank(self):
        prefix = str(self.workdir / "rank0")
        saved = _run_ranks("save", self.workdir, prefix=prefix)
        self.assertEqual(saved[0]["left_out"], [], saved)
        loaded = _run_ranks("load", self.workdir, prefix=prefix)
        for r in loaded:
            self.assertGreaterEqual(r["entries"], 1, r)
            self.assertTrue(r["correct"], r)
        # Rank 0 runs its own package as it is.
        self.assertIsNone(loaded[0]["fail_on_recompile_error"], loaded[0])
        self.assertTrue(loaded[0]["correct_without_recompile"], loaded[0])
        # Rank 1's rank is not the one the package folded: the loaded entry's
        # guard rejects it, so it recompiles (and fail_on_recompile refuses to).
        self.assertIn("fail_on_recompile", loaded[1]["fail_on_recompile_error"] or "", loaded[1])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        _worker_main(sys.argv[2:])
    else:
        from torch._dynamo.test_case import run_tests

        run_tests()
