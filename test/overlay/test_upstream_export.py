# Owner(s): ["module: dynamo"]
"""The upstream export: build_scripts/export_upstream.py writes a git am series that applies."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


REPO_ROOT = Path(__file__).resolve().parents[2]
EXPORTER = REPO_ROOT / "build_scripts" / "export_upstream.py"


def run_exporter(*args):
    return subprocess.run(
        [sys.executable, str(EXPORTER), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
    )


def diff_body(patch: Path) -> str:
    text = patch.read_text()
    return text[text.index("diff --git") :]


def created_files(patch: Path) -> list[str]:
    return re.findall(r"^diff --git a/\S+ b/(\S+)\nnew file mode", patch.read_text(), re.M)


@unittest.skipIf(importlib.util.find_spec("torch_overlay") is None, "needs torch_overlay")
class TestUpstreamExport(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = Path(tempfile.mkdtemp(prefix="test_upstream_export-"))
        cls.out = cls.tmp / "export"
        proc = run_exporter("--out", str(cls.out))
        if proc.returncode != 0:
            shutil.rmtree(cls.tmp, ignore_errors=True)
            raise AssertionError(f"export failed:\n{proc.stderr}")
        cls.exported = [
            cls.out / line
            for line in (cls.out / "series").read_text().splitlines()
            if line and not line.startswith("#")
        ]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def test_series_applies(self):
        proc = run_exporter("--check", "--export-dir", str(self.out))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue((self.out / "README.txt").is_file())
        for patch in self.exported:
            self.assertRegex(patch.name, r"^\d{4}-.+\.patch$")

    def test_series_patches_come_first_unchanged(self):
        from torch_overlay._overlay.series import read_series

        own = read_series()
        exported = read_series(self.out)
        self.assertGreaterEqual(len(exported), len(own))
        for patch, copy in zip(own, exported):
            self.assertEqual(copy.subject, patch.subject)
            self.assertEqual(diff_body(copy.path), diff_body(patch.path), copy.name)

    def test_tests_commit_holds_upstream_tests_only(self):
        tests_commits = [
            p for p in self.exported if any(f.startswith("test/") for f in created_files(p))
        ]
        if not any((REPO_ROOT / "test" / "dynamo").glob("**/*.py")):
            self.skipTest("the project has no test/dynamo tests yet")
        self.assertEqual(len(tests_commits), 1, [p.name for p in tests_commits])
        files = created_files(tests_commits[0])
        self.assertTrue(any(f.startswith("test/dynamo/") for f in files), files)
        self.assertFalse([f for f in files if f.startswith("test/overlay/")])
        self.assertNotIn("test/conftest.py", files)

    def test_cpp_is_exported_as_the_upstream_change(self):
        # The extension's ATen source goes upstream unchanged, its declarations
        # into Interpreter.h, and its .def chain into torch/csrc/functorch/init.cpp,
        # right after the ATen commit and before the tests that need them.
        csrc = REPO_ROOT / "torch_overlay" / "csrc" / "functorch"
        names = [p.name for p in self.exported]
        aten = [p for p in self.exported if "aten/src/ATen/functorch/InterpreterSerialization.cpp" in created_files(p)]
        self.assertEqual(len(aten), 1, names)
        text = aten[0].read_text()
        added_file = text[text.index("+++ b/aten/src/ATen/functorch/InterpreterSerialization.cpp") :]
        added_lines = [line[1:] for line in added_file.splitlines()[2:] if line.startswith("+")]
        self.assertEqual(added_lines, (csrc / "InterpreterSerialization.cpp").read_text().splitlines())
        self.assertIn("+TORCH_API std::string serializeInterpreter(const Interpreter& interpreter);", text)
        self.assertIn("diff --git a/aten/src/ATen/functorch/Interpreter.h", text)

        binding = self.exported[self.exported.index(aten[0]) + 1]
        body = diff_body(binding)
        self.assertIn("diff --git a/torch/csrc/functorch/init.cpp", body)
        self.assertIn('-      .def("level", &Interpreter::level);\n+      .def("level", &Interpreter::level)\n', body)
        bindings = (csrc / "interpreter_serialization_bindings.cpp").read_text()
        chain = bindings[bindings.index("BEGIN CInterpreter") : bindings.index("// END CInterpreter")]
        for line in chain.splitlines()[1:]:
            if line.strip():
                self.assertIn("+" + line, body)
        tests_at = next(i for i, p in enumerate(self.exported) if any(f.startswith("test/") for f in created_files(p)))
        self.assertLess(self.exported.index(binding), tests_at)
        self.assertIn(binding.name, (self.out / "README.txt").read_text())

    def test_binding_patch_with_another_context_is_refused(self):
        broken = self.tmp / "broken-binding"
        shutil.copytree(self.out, broken)
        (victim,) = [
            broken / p.name
            for p in self.exported
            if "diff --git a/torch/csrc/functorch/init.cpp" in p.read_text()
        ]
        victim.write_text(
            victim.read_text().replace(
                '       .def("key", &Interpreter::key)\n',
                '       .def("key", &Interpreter::key)\n       .def("name", &Interpreter::name)\n',
            )
        )
        proc = run_exporter("--check", "--export-dir", str(broken))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"{victim.name}: its context binds CInterpreter methods", proc.stderr)

    def test_broken_patch_is_named(self):
        broken = self.tmp / "broken"
        shutil.copytree(self.out, broken)
        # The first context line of a hunk (new files have none) of the first patch
        # that changes an existing torch file.
        for patch in self.exported:
            victim = broken / patch.name
            lines = victim.read_text().splitlines(keepends=True)
            hunks = [i for i, line in enumerate(lines) if line.startswith("@@ ")]
            context = [i for i in range(hunks[0], len(lines)) if lines[i].startswith(" ")]
            if context:
                break
        else:
            self.skipTest("no exported patch changes an existing file")
        lines[context[0]] = " # a context line that torch 2.7.1 does not have\n"
        victim.write_text("".join(lines))

        proc = run_exporter("--check", "--export-dir", str(broken))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"exported patch {victim.name} does not apply", proc.stderr)


if __name__ == "__main__":
    run_tests()
