# Owner(s): ["module: dynamo"]
"""The behaviour diff's distributed jobs section (tools/behaviour_diff/).

distributed_jobs.py judges a fresh job against the cold one it loads from
(recompiles, bitwise losses, what rank 0's artifacts served each rank), and
diff_upstream.py renders the verdicts of every environment into one table, a
row per job and environment (NOTE: [Distributed jobs in the behaviour diff]).
Both are checked here on recorded rank reports, without starting ranks.
"""

import importlib
import sys
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


TOOLS = Path(__file__).resolve().parents[2] / "tools" / "behaviour_diff"
HAS_TOOLS = (TOOLS / "diff_upstream.py").exists()


def _import_tools():
    sys.path.insert(0, str(TOOLS))
    try:
        return importlib.import_module("diff_upstream"), importlib.import_module(
            "distributed_jobs"
        )
    finally:
        sys.path.pop(0)


def _rank(losses, graphs=0, hit=0, miss=0, **extra):
    return {
        "losses": losses,
        "graphs_traced": graphs,
        "fxgraph_cache_hit": hit,
        "fxgraph_cache_miss": miss,
        **extra,
    }


@unittest.skipUnless(
    HAS_TOOLS, "needs the repository's tools/ (not shipped in the wheel)"
)
class TestDistributedJobsSection(TestCase):
    def setUp(self):
        super().setUp()
        self.diff_upstream, self.distributed_jobs = _import_tools()

    def test_judge_a_fresh_job(self):
        judge = self.distributed_jobs.judge
        cold = {
            "seconds": 90.0,
            "ranks": [
                _rank(["0x1p-1", "0x1p-2"], graphs=4),
                _rank(["0x1p-3", "0x1p-4"], graphs=4),
            ],
        }
        packages = judge(
            cold,
            {
                "seconds": 9.0,
                "ranks": [
                    _rank(["0x1p-1", "0x1p-2"], entries_loaded=4),
                    _rank(["0x1p-3", "0x1p-4"], entries_loaded=4),
                ],
            },
        )
        self.assertFalse(packages["recompiles"])
        self.assertEqual(packages["losses_bitwise_equal"], [True, True])
        self.assertEqual(packages["served"], ["all", "all"])
        self.assertEqual(packages["entries_loaded"], [4, 4])
        # Dynamo traces again, every FX graph a hit on rank 0, a miss on rank 1,
        # and rank 1's second loss differs in its last bit.
        mega_cache = judge(
            cold,
            {
                "seconds": 50.0,
                "ranks": [
                    _rank(["0x1p-1", "0x1p-2"], graphs=4, hit=8),
                    _rank(["0x1p-3", "0x1.0000000000001p-4"], graphs=4, hit=7, miss=1),
                ],
            },
        )
        self.assertTrue(mega_cache["recompiles"])
        self.assertEqual(mega_cache["losses_bitwise_equal"], [True, False])
        self.assertEqual(mega_cache["served"], ["inductor", "compiled"])
        self.assertEqual(mega_cache["fxgraph_cache"], [[8, 0], [7, 1]])
        failed = judge(
            {"error": "rank 1 timed out", "ranks": []},
            {"error": "no artifacts", "ranks": []},
        )
        self.assertEqual(failed["error"], "cold job: rank 1 timed out")

    def test_render_rows_job_by_environment(self):
        report = {
            "distributed_jobs": {
                "overlay": {
                    "status": "ran",
                    "steps": 3,
                    "jobs": {
                        "ddp": {
                            "packages": {
                                "recompiles": False,
                                "graphs_traced": [0, 0],
                                "fxgraph_cache": [[0, 0], [0, 0]],
                                "entries_loaded": [4, 4],
                                "losses_bitwise_equal": [True, True],
                                "served": ["all", "all"],
                                "cold_seconds": 120.0,
                                "fresh_seconds": 12.0,
                            }
                        },
                        "fsdp2": {
                            "packages": {"error": "fresh job: rank 1 exit 1: boom"}
                        },
                    },
                },
                "upstream-2.13": {
                    "status": "ran",
                    "steps": 3,
                    "jobs": {
                        "ddp": {
                            "mega-cache": {
                                "recompiles": True,
                                "graphs_traced": [1, 1],
                                "fxgraph_cache": [[8, 0], [7, 1]],
                                "losses_bitwise_equal": [True, False],
                                "served": ["inductor", "compiled"],
                                "cold_seconds": 140.0,
                                "fresh_seconds": 60.0,
                            }
                        }
                    },
                },
                "wheel": {"status": "timeout", "detail": "timed out after 2400 s"},
            }
        }
        lines = self.diff_upstream.render_distributed(report)
        text = "\n".join(lines)
        self.assertIn(
            "## Distributed jobs: one rank saves, every rank of a fresh job loads", text
        )
        self.assertIn(
            "| ddp | overlay (packages) | no (package entries loaded per rank: 4, 4) | yes, every rank | "
            "every rank: everything (nothing traced or compiled) | 120.0 / 12.0 |",
            lines,
        )
        self.assertIn(
            "| ddp | upstream-2.13 (mega-cache) | yes: Dynamo graphs per rank 1, 1; FX graph cache hit/miss "
            "per rank 8/0, 7/1 | **NO** on rank 1 | rank 0: Inductor's graphs only (Dynamo traced again); "
            "rank 1: no (Inductor compiled) | 140.0 / 60.0 |",
            lines,
        )
        self.assertIn(
            "| fsdp2 | overlay (packages) | failed: fresh job: rank 1 exit 1: boom |  |  | None / None |",
            lines,
        )
        self.assertIn(
            "| all | wheel | did not run (timeout): timed out after 2400 s | | | |",
            lines,
        )
        # Rows are grouped by job: every ddp row before the first fsdp2 row.
        rows = [line for line in lines if line.startswith(("| ddp", "| fsdp2"))]
        self.assertEqual(
            [row.split(" | ")[0] for row in rows], ["| ddp", "| ddp", "| fsdp2"]
        )
        # The section is one of the report's.
        self.assertIn(
            self.diff_upstream.render_distributed, self.diff_upstream.REPORT_SECTIONS
        )

    def test_no_section_without_distributed_runs(self):
        self.assertEqual(self.diff_upstream.render_distributed({}), [])


if __name__ == "__main__":
    run_tests()
