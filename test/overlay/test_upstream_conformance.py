# Owner(s): ["module: dynamo"]
"""The upstream conformance run (tools/upstream_conformance/): its plugin supplies
no precompile name, and its comparison flags every unexplained difference and
every stale keep-list entry."""

import importlib
import sys
from pathlib import Path

from torch._dynamo.test_case import run_tests, TestCase


TOOLS = Path(__file__).resolve().parents[2] / "tools" / "upstream_conformance"
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS / "plugin"))
run_conformance = importlib.import_module("run_conformance")

# Modules whose names are precompile's: the project provides them, never the plugin.
PRECOMPILE_MODULES = (
    "torch._dynamo.package",
    "torch._dynamo.precompile_context",
    "torch._dynamo.aot_compile",
    "torch._dynamo.aot_compile_types",
    "torch._dynamo.guards",
    "torch._dynamo.config",
    "torch._functorch.config",
    "torch._functorch._aot_autograd.autograd_cache",
    "torch.compiler",
)

FILE = "test/dynamo/test_x.py"


class TestUpstreamConformance(TestCase):
    def test_no_precompile_names(self):
        plugin = importlib.import_module("upstream_conformance_plugin")

        class Config:
            stash = {}

        plugin.pytest_configure(Config())
        self.assertTrue(plugin.SUPPLIED)
        for (module, name), pr in plugin.SUPPLIED.items():
            self.assertNotIn(module, PRECOMPILE_MODULES, f"{module}.{name}")
            self.assertTrue(pr.isdigit(), f"{module}.{name} names no upstream PR")

    def _compare(self, expected, results, keep):
        runs = {"overlay": {FILE: {"results": results}}}
        return {r.test_id.split("::")[-1]: r for r in run_conformance.compare(expected, runs, keep, ["overlay"])}

    def test_differences_need_a_reason(self):
        expected = {f"{FILE}::C::{t}": "passed" for t in ("same", "regressed", "kept")}
        results = {
            f"{FILE}::C::same": ("passed", ""),
            f"{FILE}::C::regressed": ("failed", "boom"),
            f"{FILE}::C::kept": ("failed", "boom"),
        }
        keep = [run_conformance.KeepEntry([f"{FILE}::C::kept"], "not-yet", "why", ["overlay", "wheel"])]
        rows = self._compare(expected, results, keep)
        self.assertEqual(rows["same"].problem, "")
        self.assertIn("no keep-list entry", rows["regressed"].problem)
        self.assertEqual((rows["kept"].problem, rows["kept"].reason), ("", "why"))

    def test_stale_entry_and_uncollected_test(self):
        expected = {f"{FILE}::C::fixed": "passed", f"{FILE}::C::gone": "skipped"}
        results = {
            f"{FILE}::C::fixed": ("passed", ""),
            f"{FILE}::<collection>": ("failed", "ImportError: x"),
        }
        keep = [run_conformance.KeepEntry([f"{FILE}::C::fixed"], "not-yet", "why", ["overlay"])]
        rows = self._compare(expected, results, keep)
        self.assertIn("stale", rows["fixed"].problem)
        self.assertEqual(rows["gone"].outcomes["overlay"], "failed")
        self.assertEqual(rows["gone"].details["overlay"], "not collected: ImportError: x")
        self.assertIn("no keep-list entry", rows["gone"].problem)

    def test_a_flaky_entry_is_neither_stale_nor_a_disagreement(self):
        expected = {f"{FILE}::C::racy": "passed", f"{FILE}::C::fixed": "passed"}
        keep = [
            run_conformance.KeepEntry([f"{FILE}::C::racy"], "flaky", "races", ["overlay", "wheel"]),
            run_conformance.KeepEntry([f"{FILE}::C::fixed"], "2.13-only", "why", ["overlay", "wheel"]),
        ]
        runs = {
            "overlay": {FILE: {"results": {f"{FILE}::C::racy": ("passed", ""), f"{FILE}::C::fixed": ("passed", "")}}},
            "wheel": {FILE: {"results": {f"{FILE}::C::racy": ("failed", "hung"), f"{FILE}::C::fixed": ("passed", "")}}},
        }
        rows = {
            r.test_id.split("::")[-1]: r
            for r in run_conformance.compare(expected, runs, keep, ["overlay", "wheel"])
        }
        self.assertEqual((rows["racy"].problem, rows["racy"].kind), ("", "flaky"))
        # Any other kind that matches no difference is stale.
        self.assertIn("stale", rows["fixed"].problem)

    def test_a_session_that_finished_but_does_not_exit_is_killed(self):
        # See NOTE: [A test file that does not exit]: the junit file is
        # written, a non-daemon thread keeps the interpreter alive.
        import subprocess
        import tempfile
        import time
        import unittest.mock

        with tempfile.TemporaryDirectory() as tmp:
            junit = Path(tmp) / "junit.xml"
            code = (
                "import pathlib, sys, threading, time\n"
                "pathlib.Path(sys.argv[1]).write_text('<testsuites/>')\n"
                "threading.Thread(target=time.sleep, args=(600,)).start()\n"
            )
            proc = subprocess.Popen([sys.executable, "-c", code, str(junit)])
            started = time.monotonic()
            with unittest.mock.patch.object(run_conformance, "EXIT_GRACE", 2.0):
                rc, note = run_conformance._wait_for_pytest(proc, junit, started + 120)
            self.assertEqual(rc, -2)
            self.assertIn("did not exit", note)
            self.assertLess(time.monotonic() - started, 60)
            # A process that exits is waited for, its status returned.
            proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
            self.assertEqual(run_conformance._wait_for_pytest(proc, junit, time.monotonic() + 60), (3, ""))

    def test_keep_list_parses(self):
        entries = run_conformance.read_keep_list(TOOLS / "keep_list.toml")
        self.assertTrue(entries)
        for entry in entries:
            self.assertIn(entry.kind, run_conformance.KEEP_KINDS)


if __name__ == "__main__":
    run_tests()
