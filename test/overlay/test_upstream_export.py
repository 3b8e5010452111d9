# Owner(s): ["module: dynamo"]
"""The upstream export: build_scripts/export_upstream.py writes a git am series that applies."""

import importlib.util
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

    def test_cpp_is_exported_at_its_upstream_paths(self):
        # A file under torch_overlay/csrc/ goes upstream unchanged at its path
        # there; a csrc/<path>.patch is the change to that existing file, exported
        # as it is, right after the new files and before the tests that need them.
        csrc = REPO_ROOT / "torch_overlay" / "csrc"
        new_files = {
            str(p.relative_to(csrc)): p
            for p in csrc.rglob("*")
            if p.is_file() and p.suffix != ".patch"
        }
        self.assertIn("aten/src/ATen/functorch/InterpreterSerialization.cpp", new_files)
        names = [p.name for p in self.exported]
        (cpp_commit,) = [p for p in self.exported if set(new_files) & set(created_files(p))]
        self.assertEqual(set(created_files(cpp_commit)), set(new_files), names)
        text = cpp_commit.read_text()
        for rel, path in new_files.items():
            added = text[text.index(f"+++ b/{rel}") :].split("\ndiff --git", 1)[0]
            added_lines = [line[1:] for line in added.splitlines()[2:] if line.startswith("+")]
            self.assertEqual(added_lines, path.read_text().splitlines(), rel)

        binding = self.exported[self.exported.index(cpp_commit) + 1]
        stored = csrc / "torch" / "csrc" / "functorch" / "init.cpp.patch"
        self.assertEqual(diff_body(binding), diff_body(stored))
        self.assertIn('-      .def("level", &Interpreter::level);\n+      .def("level", &Interpreter::level)\n', diff_body(binding))
        tests_at = next(i for i, p in enumerate(self.exported) if any(f.startswith("test/") for f in created_files(p)))
        self.assertLess(self.exported.index(binding), tests_at)
        self.assertIn(binding.name, (self.out / "README.txt").read_text())

    def test_compat_layer_is_never_exported(self):
        for patch in self.exported:
            text = patch.read_text()
            self.assertNotIn("_interpreter_serialization_C", text, patch.name)
            self.assertNotIn("b/torch/compat/", text, patch.name)
            self.assertNotIn("interpreter_serialization_bindings", text, patch.name)

    def test_exported_functorch_tests_use_only_the_api(self):
        (tests_commit,) = [
            p for p in self.exported if "test/functorch/test_interpreter_serialization.py" in created_files(p)
        ]
        text = tests_commit.read_text()
        self.assertNotIn("_interpreter_serialization", text.replace("test_interpreter_serialization", ""))
        self.assertNotIn("ExtensionNotBuiltError", text)

    def test_binding_patch_adding_what_the_compat_layer_does_not_is_refused(self):
        broken = self.tmp / "broken-binding"
        shutil.copytree(self.out, broken)
        (victim,) = [
            broken / p.name
            for p in self.exported
            if "diff --git a/torch/csrc/functorch/init.cpp" in p.read_text()
        ]
        victim.write_text(
            victim.read_text().replace(
                '+      .def_static(\n',
                '+      .def("name", &Interpreter::name)\n+      .def_static(\n',
            )
        )
        proc = run_exporter("--check", "--export-dir", str(broken))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(
            f"{victim.name}: it adds '.def(\"name\", &Interpreter::name)', which the compat layer's C++",
            proc.stderr,
        )

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
