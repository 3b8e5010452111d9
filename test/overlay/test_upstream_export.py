# Owner(s): ["module: dynamo"]
"""The upstream export: build_scripts/export_upstream.py writes a git am series of one
commit per upstream PR, each owning its new files, that applies and reads as upstream."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import unittest.mock
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


REPO_ROOT = Path(__file__).resolve().parents[2]
EXPORTER = REPO_ROOT / "build_scripts" / "export_upstream.py"
# DEP-3 header fields (the patch bookkeeping that stays in patches/).
DEP3_FIELD = re.compile(
    r"^(Origin|Forwarded|Last-Update|Author|Bug(-\w+)?|Applied-Upstream|Reviewed-by|Description):",
    re.MULTILINE,
)
TORCH_OVERLAY_IMPORT = re.compile(
    r"^\+\s*(import torch_overlay\b|from torch_overlay[\w.]* import\b).*", re.MULTILINE
)


def run_exporter(*args):
    return subprocess.run(
        [sys.executable, str(EXPORTER), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=300,
    )


def load_exporter():
    spec = importlib.util.spec_from_file_location("export_upstream", EXPORTER)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def diff_body(text: str) -> str:
    return text[text.index("diff --git") :]


def message(text: str) -> str:
    """The commit message of a format-patch text: subject line to the '---'."""
    subject_at = text.index("\nSubject: ")
    return text[subject_at : text.index("\n---\n", subject_at)]


def created_files(text: str) -> list[str]:
    return re.findall(r"^diff --git a/\S+ b/(\S+)\nnew file mode", text, re.MULTILINE)


@unittest.skipIf(
    importlib.util.find_spec("torch_overlay") is None, "needs torch_overlay"
)
class TestUpstreamExport(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.exporter = load_exporter()
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
        cls.texts = {p.name: p.read_text() for p in cls.exported}

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()

    def series_infos(self):
        """The exported patches of the series (compat patches left out)."""
        from torch_overlay._overlay.series import read_series

        compat = self.exporter.compat_patch_names(self.exporter.ownership_file())
        patches = self.exporter.exported_patches(read_series(), compat)
        return [self.exporter.read_patch_info(p) for p in patches]

    def test_series_applies(self):
        proc = run_exporter("--check", "--no-bisect", "--export-dir", str(self.out))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue((self.out / "README.txt").is_file())
        for patch in self.exported:
            self.assertRegex(patch.name, r"^\d{4}-.+\.patch$")

    def test_one_commit_per_upstream_pr(self):
        infos = self.series_infos()
        prs = {info.pr for info in infos if info.pr is not None}
        own = [info for info in infos if info.pr is None]
        self.assertIn(151318, prs)
        self.assertEqual(len(self.exported), len(prs) + len(own), list(self.texts))
        # The commits are the series' PR groups in order; each holds every file
        # its patches change.
        groups = []
        for info in infos:
            if info.pr is not None and groups and groups[-1][0] == info.pr:
                groups[-1][1].append(info)
            else:
                groups.append((info.pr, [info]))
        for (pr, patches), text in zip(groups, self.texts.values()):
            exported = set(self.exporter.file_diffs(text))
            for info in patches:
                changed = set(self.exporter.file_diffs(info.patch.path.read_text()))
                self.assertLessEqual(changed, exported, (pr, info.patch.name))
        # Our own patches (no upstream PR) keep their subjects as commit titles.
        titles = [
            self.exporter.series.read_subject_text(t) for t in self.texts.values()
        ]
        for info in own:
            self.assertIn(info.patch.subject, titles)

    def test_messages_are_upstream_pr_style_without_dep3(self):
        for name, text in self.texts.items():
            msg = message(text)
            self.assertIsNone(DEP3_FIELD.search(msg), f"{name}: DEP-3 line in\n{msg}")
            self.assertRegex(
                msg,
                r"^\nSubject: \[PATCH \d+/\d+\] \[(dynamo|functorch|aotautograd|inductor|decomp|fx)\] ",
            )
            self.assertIn("\nTest Plan:\n", msg, name)

    def test_test_plan_runs_the_tests_the_commit_adds(self):
        for name, text in self.texts.items():
            tests = sorted(f for f in created_files(text) if f.startswith("test/"))
            plan = message(text).split("\nTest Plan:\n", 1)[1]
            if tests:
                self.assertIn("python -m pytest " + " ".join(tests), plan, name)
            else:
                self.assertNotIn("pytest", plan, name)

    def test_new_files_come_with_the_commit_that_owns_them(self):
        # The guard serialization commit carries its module; nothing of the package
        # machinery arrives before it is imported.
        (guards,) = [
            t
            for t in self.texts.values()
            if "torch/_dynamo/guard_serialization.py" in created_files(t)
        ]
        self.assertIn("b/torch/_dynamo/guards.py\n", guards)
        self.assertIn("test/dynamo/test_guard_serialization.py", created_files(guards))
        added = [f for t in self.texts.values() for f in created_files(t)]
        self.assertEqual(len(added), len(set(added)))
        self.assertFalse(
            [f for f in added if f.startswith(("test/overlay/", "torch/compat/"))]
        )
        self.assertNotIn("test/conftest.py", added)

    def test_cpp_is_exported_with_the_functorch_pr(self):
        csrc = REPO_ROOT / "torch_overlay" / "csrc"
        new_files = {
            str(p.relative_to(csrc)): p
            for p in csrc.rglob("*")
            if p.is_file() and p.suffix != ".patch"
        }
        self.assertIn("aten/src/ATen/functorch/InterpreterSerialization.cpp", new_files)
        (commit,) = [
            t for t in self.texts.values() if set(new_files) & set(created_files(t))
        ]
        self.assertIn("[functorch]", message(commit))
        self.assertIn("b/torch/_functorch/pyfunctorch.py\n", commit)
        self.assertTrue(set(new_files) <= set(created_files(commit)))
        for rel, path in new_files.items():
            added = commit[commit.index(f"+++ b/{rel}") :].split("\ndiff --git", 1)[0]
            added_lines = [
                line[1:] for line in added.splitlines()[2:] if line.startswith("+")
            ]
            self.assertEqual(added_lines, path.read_text().splitlines(), rel)
        stored = (csrc / "torch" / "csrc" / "functorch" / "init.cpp.patch").read_text()
        rel = "torch/csrc/functorch/init.cpp"
        self.assertEqual(
            self.exporter.file_diffs(commit)[rel], self.exporter.file_diffs(stored)[rel]
        )
        self.assertIn(
            " torch/csrc/functorch/init.cpp ", commit.split("\ndiff --git", 1)[0]
        )

    def test_compat_layer_is_never_exported(self):
        for name, text in self.texts.items():
            self.assertNotIn("_interpreter_serialization_C", text, name)
            self.assertNotIn("b/torch/compat/", text, name)
            self.assertNotIn("interpreter_serialization_bindings", text, name)

    def test_exported_files_do_not_import_torch_overlay(self):
        # Upstream has no torch_overlay: an exported module importing it, even
        # lazily, is backport scaffolding shipped as torch code.
        found = {
            name: [m.group(0) for m in TORCH_OVERLAY_IMPORT.finditer(text)]
            for name, text in self.texts.items()
        }
        self.assertEqual({name: lines for name, lines in found.items() if lines}, {})

    def test_exported_functorch_tests_use_only_the_api(self):
        (commit,) = [
            t
            for t in self.texts.values()
            if "test/functorch/test_interpreter_serialization.py" in created_files(t)
        ]
        section = self.exporter.file_diffs(commit)[
            "test/functorch/test_interpreter_serialization.py"
        ]
        self.assertNotIn(
            "_interpreter_serialization",
            section.replace("test_interpreter_serialization", ""),
        )
        self.assertNotIn("ExtensionNotBuiltError", section)

    def ownership(self):
        from torch_overlay._overlay.series import read_series

        declared, _ = self.exporter.load_ownership(self.exporter.ownership_file())
        names = [p.name for p in read_series()]
        return declared, names, self.exporter.exportable_files()

    def test_ownership_of_the_project_is_valid(self):
        declared, names, available = self.ownership()
        owned = self.exporter.assign_files(declared, names, available)
        for kind, files in available.items():
            owners = [
                name for name in names for rel in owned[name][kind] if rel in files
            ]
            self.assertEqual(len(owners), len(files), kind)

    def test_ownership_rejects_an_undeclared_module(self):
        declared, names, available = self.ownership()
        available["modules"]["torch/_dynamo/a_new_module.py"] = Path("a_new_module.py")
        with self.assertRaisesRegex(
            Exception,
            r"new files that no patch owns: \['torch/_dynamo/a_new_module.py'\]",
        ):
            self.exporter.assign_files(declared, names, available)

    def test_ownership_rejects_a_doubly_owned_module(self):
        declared, names, available = self.ownership()
        module = "torch/_dynamo/guard_serialization.py"
        (first,) = [n for n, kinds in declared.items() if module in kinds["modules"]]
        other = next(n for n in names if n != first)
        declared.setdefault(other, {k: [] for k in self.exporter.FILE_KINDS})
        declared[other]["modules"] = [*declared[other]["modules"], module]
        with self.assertRaisesRegex(Exception, f"{module} is owned twice"):
            self.exporter.assign_files(declared, names, available)

    def test_ownership_rejects_a_patch_the_series_lacks(self):
        declared, names, available = self.ownership()
        declared["no-such.patch"] = {"modules": [], "tests": [], "csrc": []}
        with self.assertRaisesRegex(
            Exception, r"for \['no-such.patch'\], which the series does not list"
        ):
            self.exporter.assign_files(declared, names, available)

    def test_a_patch_without_declarations_is_its_own_commit(self):
        # A patch added to the series later, citing no PR and owning nothing.
        infos = self.series_infos()
        patch = self.exporter.series.Patch(
            "late.patch", infos[0].patch.path, "[dynamo] A later change"
        )
        late = self.exporter.PatchInfo(patch, "A later change.", None)
        declared, names, available = self.ownership()
        owned = self.exporter.assign_files(declared, [*names, "late.patch"], available)
        commits = self.exporter.group_commits([*infos, late], owned, {})
        self.assertEqual(commits[-1].patches, [late])
        self.assertEqual(commits[-1].title, "[dynamo] A later change")

    def test_compat_patches_are_applied_but_never_exported(self):
        from torch_overlay._overlay.series import read_series

        compat = self.exporter.compat_patch_names(self.exporter.ownership_file())
        patches = read_series()
        self.assertTrue(compat, "export.toml marks no patch compat")
        # Each group's compat patches are its last ones (NOTE: [Series groups]).
        tails = set()
        for group in self.exporter.series.GROUPS:
            names = [p.name for p in patches if p.group == group]
            while names and names[-1] in compat:
                tails.add(names.pop())
        self.assertEqual(tails, set(compat))
        titles = [
            self.exporter.series.read_subject_text(t) for t in self.texts.values()
        ]
        # What each compat patch imports from the compat layer, which upstream
        # torch does not have, or the glue it adds for it (the cache key's
        # series: the exported package_artifacts.py imports _backport_build
        # too, optionally).
        compat_imports = {
            "functorch-Backport-attach-CInterpreter-serialization-at-import-torch.patch":
                "import torch._functorch._interpreter_serialization",
            "dynamo-Backport-recursive-dict-tags-skip-unchanged-module-subtrees.patch":
                "from torch._dynamo._dict_tag_guards import",
            "inductor-Backport-Inductor-s-cache-key-names-the-patch-series-served.patch":
                "def _backport_series() -> str:",
        }
        self.assertEqual(set(compat_imports), set(compat))
        for patch in (p for p in patches if p.name in compat):
            self.assertNotIn(patch.subject, titles)
            self.assertIn(compat_imports[patch.name], patch.path.read_text())
        for name, text in self.texts.items():
            for imported in compat_imports.values():
                self.assertNotIn(imported, text, name)
            self.assertNotIn("_require_cinterpreter_serialization", text, name)

    def test_compat_patches_come_last_and_own_nothing(self):
        from torch_overlay._overlay.series import read_series

        patches = read_series()
        with self.assertRaisesRegex(Exception, r"compat patches \(never exported\) must be the last"):
            self.exporter.exported_patches(patches, {patches[0].name})
        with self.assertRaisesRegex(Exception, r"marks \['no-such.patch'\] compat"):
            self.exporter.exported_patches(patches, {"no-such.patch"})
        self.assertEqual(self.exporter.exported_patches(patches, {patches[-1].name}), patches[:-1])
        toml = self.tmp / "compat-owns.toml"
        toml.write_text('[patches."x.patch"]\ncompat = true\nmodules = ["torch/x.py"]\n')
        with self.assertRaisesRegex(Exception, r"compat patch x.patch declares \['modules'\]"):
            self.exporter.load_ownership(toml)
        toml.write_text('[patches."x.patch"]\ncompat = "yes"\n')
        with self.assertRaisesRegex(Exception, r"compat must be true"):
            self.exporter.load_ownership(toml)

    def test_bisect_processes_cannot_import_torch_overlay(self):
        sys.path.insert(0, str(EXPORTER.parent))
        try:
            import export_bisect
        finally:
            sys.path.remove(str(EXPORTER.parent))
        # Even when the caller runs with the overlay on.
        with unittest.mock.patch.dict(os.environ, {"TORCH_OVERLAY": "1"}):
            env = export_bisect._child_env(self.tmp, self.tmp, 0)
        probe = "import importlib.util, os; print(importlib.util.find_spec('torch_overlay'), os.environ.get('TORCH_OVERLAY'))"
        proc = subprocess.run(
            [sys.executable, "-c", probe],
            env=env,
            capture_output=True,
            text=True,
            cwd=self.tmp,
        )
        self.assertEqual(proc.stdout.strip(), "None None", proc.stderr)
        self.assertIsNotNone(importlib.util.find_spec("torch_overlay"))  # here it is

    def test_binding_change_adding_what_the_compat_layer_does_not_is_refused(self):
        broken = self.tmp / "broken-binding"
        shutil.copytree(self.out, broken)
        (victim,) = [
            broken / n
            for n, t in self.texts.items()
            if "diff --git a/torch/csrc/functorch/init.cpp" in t
        ]
        victim.write_text(
            victim.read_text().replace(
                "+      .def_static(\n",
                '+      .def("name", &Interpreter::name)\n+      .def_static(\n',
            )
        )
        proc = run_exporter("--check", "--no-bisect", "--export-dir", str(broken))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(
            f"{victim.name}: it adds '.def(\"name\", &Interpreter::name)', which the compat layer's C++",
            proc.stderr,
        )

    def test_broken_patch_is_named(self):
        broken = self.tmp / "broken"
        shutil.copytree(self.out, broken)
        # The first context line of a hunk of the first patch that changes an
        # existing torch file.
        for patch in self.exported:
            victim = broken / patch.name
            lines = victim.read_text().splitlines(keepends=True)
            starts = [
                i
                for i, line in enumerate(lines)
                if line.startswith("diff --git a/torch/") and "/csrc/" not in line
            ]
            hunks = [
                i
                for i, line in enumerate(lines)
                if line.startswith("@@ ") and starts and i > starts[0]
            ]
            context = (
                [i for i in range(hunks[0], len(lines)) if lines[i].startswith(" ")]
                if hunks
                else []
            )
            if context:
                break
        else:
            self.skipTest("no exported patch changes an existing file")
        lines[context[0]] = " # a context line that torch 2.7.1 does not have\n"
        victim.write_text("".join(lines))

        proc = run_exporter("--check", "--no-bisect", "--export-dir", str(broken))
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"exported patch {victim.name} does not apply", proc.stderr)


if __name__ == "__main__":
    run_tests()
