# Owner(s): ["module: dynamo"]
"""The transformers sweep's CI sample (issue 46; the whole sweep is
`make transformers-sweep`, run by the nightly workflow).

Eight of transformers' text-generation architectures, across decoder-only
(GPT-2, OPT, Qwen2, Falcon), encoder-decoder (BART, T5), mixture of experts
(Mixtral) and sliding-window attention (Mistral), each built from the sweep's
tiny config and decoded two ways (a: a greedy loop over torch.compile(model),
the prefill with no cache object; c: generate() over the compiled forward):
saved by one fresh process, loaded by another with an empty Inductor cache
under fail_on_recompile, at a prompt length and a number of new tokens the
save never saw, and token-identical to eager (NOTE: [Sweep results] in
tools/transformers_sweep/sweep.py).

Runs the overlay's venv (the sweep's phases run there); skipped in the
patched wheel's venv, whose suite does not have the sweep's tooling on its
path.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


REPO = Path(__file__).resolve().parents[2]
SWEEP = REPO / "tools" / "transformers_sweep" / "sweep.py"
HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None
HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

SAMPLE = ["gpt2", "opt", "qwen2", "falcon", "seq2seq:bart", "t5", "mixtral", "mistral"]
SPELLINGS = ["a", "c"]


@unittest.skipUnless(HAS_OVERLAY and HAS_TRANSFORMERS, "the sweep runs the overlay's venv, with transformers")
class TestTransformersSweepSample(TestCase):
    def test_sample_decodes_from_packages(self):
        with tempfile.TemporaryDirectory(prefix="sweep-sample-") as out:
            subprocess.run(
                [
                    sys.executable, str(SWEEP), "--out", out, "--env", "overlay",
                    "--archs", ",".join(SAMPLE), "--spellings", ",".join(SPELLINGS),
                ],
                check=True, cwd=REPO, env={**os.environ, "TORCH_OVERLAY": "1"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
            results = json.loads((Path(out) / "results.json").read_text())
        self.assertEqual(results["backend"], "aot_eager")
        for arch in SAMPLE:
            for spelling in SPELLINGS:
                with self.subTest(arch=arch, spelling=spelling):
                    case = results["cases"][arch][spelling]
                    self.assertEqual(case["result"], "pass", json.dumps(case.get("error"))[:600])
                    # Something was compiled and packaged, and the load ran it:
                    # a frame Dynamo skips would pass the token check eagerly.
                    self.assertGreater(case["entries"], 0)
                    self.assertEqual(case["max_logit_difference"]["load"], 0.0)
                    self.assertEqual(case["left_out"], [])


def _run(result, error=""):
    case = {"result": result}
    if error:
        case["error"] = {"stage": "decode under fail_on_recompile", "type": "RuntimeError", "message": error}
    return case


@unittest.skipUnless(HAS_OVERLAY, "the sweep's tooling is on the overlay's path")
class TestSweepComparison(TestCase):
    """What make transformers-sweep-compare writes, and the behaviour diff shows."""

    def test_comparison_lists_each_side_failing_where_the_other_passes(self):
        versions = {"transformers": "4.52.4", "spellings": ["a", "c"]}
        ours = {**versions, "env": "overlay", "torch": "2.7.1", "backend": "aot_eager", "cases": {
            "gpt2": {"a": _run("pass"), "c": _run("recompiles", "L['x'] changed")},
            "bamba": {"a": _run("eager-fails", "no past_key_values"), "c": _run("pass")},
            "opt": {"a": _run("pass")},
        }}
        upstream = {**versions, "env": "upstream", "torch": "2.13.0", "backend": "inductor", "cases": {
            "gpt2": {"a": _run("crash-load", "no such graph"), "c": _run("pass")},
            "bamba": {"a": _run("pass"), "c": _run("pass")},
        }}
        with tempfile.TemporaryDirectory(prefix="sweep-compare-") as tmp:
            for name, results in (("ours", ours), ("upstream", upstream)):
                (Path(tmp) / name).mkdir()
                (Path(tmp) / name / "results.json").write_text(json.dumps(results))
            subprocess.run(
                [sys.executable, str(SWEEP), "--compare", f"{tmp}/ours", f"{tmp}/upstream", "--out", tmp],
                check=True, cwd=REPO,
            )
            comparison = json.loads((Path(tmp) / "results_vs_upstream.json").read_text())
            markdown = (Path(tmp) / "results_vs_upstream.md").read_text()
        # An eager failure, or a case one side did not run, is in neither list.
        self.assertEqual(
            [(c["arch"], c["spelling"], c["result"]) for c in comparison["upstream_fails_where_ours_passes"]],
            [("gpt2", "a", "crash-load")],
        )
        self.assertEqual(
            [(c["arch"], c["spelling"], c["result"]) for c in comparison["ours_fails_where_upstream_passes"]],
            [("gpt2", "c", "recompiles")],
        )
        self.assertEqual(comparison["rows"]["opt"], {"a": ["pass", ""], "c": ["", ""]})
        self.assertIn("| gpt2 | pass / crash-load | recompiles / pass |", markdown)

        sys.path.insert(0, str(REPO / "tools" / "behaviour_diff"))
        try:
            import diff_upstream
        finally:
            sys.path.pop(0)
        section = "\n".join(diff_upstream.render_sweep({"sweep": comparison}))
        self.assertIn("| a | 2 | 1 | 1 |", section)  # gpt2 and bamba ran a on both sides
        self.assertIn("| c | 2 | 1 | 2 |", section)
        self.assertIn("2.13 fails where we pass (1):\n\n- gpt2 / a: crash-load", section)
        self.assertIn("We fail where 2.13 passes (1):\n\n- gpt2 / c: recompiles", section)


if __name__ == "__main__":
    run_tests()
