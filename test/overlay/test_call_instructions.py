# Owner(s): ["module: dynamo"]
"""The per-call instruction gate (benchmarks/call_instructions.py) can fail: its
comparison flags a loaded row above the baseline by more than the margin or
missing, and its parser reads the Ir count of a callgrind output file.

No valgrind run here: the gate itself is `make check-call-instructions`.
"""

import contextlib
import importlib
import io
import sys
from pathlib import Path
from unittest import mock

from torch._dynamo.test_case import run_tests, TestCase


BENCH_DIR = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
call_instructions = importlib.import_module("call_instructions")

# A callgrind dump as --callgrind-out-file writes one (trimmed): the header, one
# function's costs, the totals.
CALLGRIND_DUMP = """\
# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
cmd:  /venv/bin/python call_instructions.py --child {}
part: 2

desc: I1 cache:
desc: D1 cache:
desc: LL cache:

desc: Timerange: Basic block 26126 - 254605
desc: Trigger: Client Request

positions: line
events: Ir
summary: 7520931

ob=(1) /usr/lib/libpython3.11.so
fl=(1) ???
fn=(1) _PyEval_EvalFrameDefault
0 7520931

totals: 7520931
"""


class TestCallInstructions(TestCase):
    BASELINE = {"mlp/package": 100_000.0, "mlp/aot": 80_000.0, "stack32/package": 2_000_000.0}

    def test_within_the_margin_passes(self):
        measured = {"mlp/package": 104_999.0, "mlp/aot": 70_000.0, "stack32/package": 2_000_000.0}
        self.assertEqual(call_instructions.compare(self.BASELINE, measured, margin=0.05), [])

    def test_above_the_margin_fails_naming_the_row(self):
        measured = {"mlp/package": 105_001.0, "mlp/aot": 80_000.0, "stack32/package": 2_400_000.0}
        failures = call_instructions.compare(self.BASELINE, measured, margin=0.05)
        self.assertEqual(
            failures,
            [
                "mlp/package: baseline 100,000 instructions per call, now 105,001 (1.050x, margin 5%)",
                "stack32/package: baseline 2,000,000 instructions per call, now 2,400,000 (1.200x, margin 5%)",
            ],
        )

    def test_a_row_no_longer_measured_fails(self):
        measured = {"mlp/package": 100_000.0, "stack32/package": 2_000_000.0}
        self.assertEqual(
            call_instructions.compare(self.BASELINE, measured, margin=0.05),
            ["mlp/aot: baseline 80,000 instructions per call, now not measured"],
        )

    def test_only_loaded_variants_are_gated(self):
        report = {
            "rows": {
                "mlp": {
                    "eager": {"per_call": 40_000.0},
                    "package": {"per_call": 100_000.0, "vs_eager": 2.5},
                    "aot": {"per_call": 80_000.0, "vs_eager": 2.0},
                }
            }
        }
        self.assertEqual(
            call_instructions.gated(report), {"mlp/package": 100_000.0, "mlp/aot": 80_000.0}
        )

    def test_committed_baseline_gates_every_row(self):
        import json

        baseline = call_instructions.gated(json.loads(call_instructions.BASELINE.read_text()))
        self.assertEqual(
            sorted(baseline),
            sorted(f"{r}/{v}" for r in call_instructions.ROWS for v in call_instructions.GATED_VARIANTS),
        )

    def test_the_mlp_is_gated_in_grad_mode_too(self):
        # The joint graph's wrappers run only when the parameters need gradients.
        self.assertEqual(call_instructions.GATE_ROWS["mlp_grad"], ("mlp", "grad"))
        self.assertEqual(call_instructions.row_title("mlp_grad"), "(b) seed MLP, batch 2, grad")
        self.assertEqual(call_instructions.row_title("mlp"), "(b) seed MLP, batch 2")

    def test_missing_valgrind_is_exit_2_with_a_message(self):
        stderr = io.StringIO()
        with mock.patch("shutil.which", return_value=None), contextlib.redirect_stderr(stderr):
            self.assertEqual(call_instructions.main(["--check"]), 2)
        self.assertIn(
            "CallInstructionsError: valgrind and callgrind_control not found", stderr.getvalue()
        )

    def test_parser_reads_totals(self):
        self.assertEqual(call_instructions.parse_callgrind_ir(CALLGRIND_DUMP), 7520931)

    def test_parser_reads_the_ir_column(self):
        text = "events: Dr Ir Dw\nsummary: 5 123 7\n"
        self.assertEqual(call_instructions.parse_callgrind_ir(text), 123)
        text += "totals: 6 456 8\n"
        self.assertEqual(call_instructions.parse_callgrind_ir(text), 456)

    def test_parser_rejects_a_file_without_totals(self):
        with self.assertRaisesRegex(call_instructions.CallInstructionsError, "no totals"):
            call_instructions.parse_callgrind_ir("events: Ir\nfn=(1) f\n0 12\n")


if __name__ == "__main__":
    run_tests()
