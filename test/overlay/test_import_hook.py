# Owner(s): ["module: dynamo"]
"""Tests of the overlay delivery: activation, the import hook, the cache, the CLI.

Activation is per process, so most tests run a fresh interpreter; the environment
of each is built explicitly (TORCH_OVERLAY set or not, a private cache dir).
"""

import importlib.machinery
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None

if HAS_OVERLAY:
    from torch_overlay._overlay import importer, materialize, series
    from torch_overlay._overlay.errors import (
        UnsupportedTorchVersionError,
    )


def _env(overlay: bool, cache_dir: str, **extra: str) -> dict:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TORCH_OVERLAY") and k != "PYTHONDONTWRITEBYTECODE"
    }
    env["TORCH_OVERLAY_CACHE_DIR"] = cache_dir
    if overlay:
        env["TORCH_OVERLAY"] = "1"
    env.update(extra)
    return env


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (overlay venv only)")
class TestImportHook(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-test-"))
        self.cache = str(self.tmp / "cache")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def run_python(self, code: str, overlay: bool = True, check: bool = True, **env):
        proc = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(code)],
            env=_env(overlay, self.cache, **env),
            capture_output=True,
            text=True,
            cwd=str(self.tmp),
        )
        if check and proc.returncode != 0:
            self.fail(f"subprocess failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def test_import_torch_overlay_alone_patches_nothing(self):
        out = self.run_python(
            """
            import torch_overlay, torch, torch._dynamo.types
            print(torch_overlay.is_active(), hasattr(torch._dynamo.types, "GuardFilterEntry"))
            print(type(torch._dynamo.types.__loader__).__name__)
            """,
            overlay=False,
        ).stdout.split()
        self.assertEqual(out, ["False", "False", "SourceFileLoader"])

    def test_environment_activation_serves_patched_modules_at_torch_paths(self):
        out = self.run_python(
            """
            import json, torch, torch._dynamo.guards as guards, torch_overlay
            print(json.dumps({
                "active": torch_overlay.is_active(),
                "loader": type(guards.__loader__).__name__,
                "file": guards.__file__,
                "code_file": guards.make_guard_filter_entry.__code__.co_filename,
                "torch_dir": torch.__path__[0],
                "has_entry": hasattr(torch._dynamo.types, "GuardFilterEntry"),
            }))
            """
        ).stdout
        info = json.loads(out.strip().splitlines()[-1])
        self.assertTrue(info["active"])
        self.assertTrue(info["has_entry"])
        self.assertEqual(info["loader"], "PatchedSourceLoader")
        expected = os.path.join(info["torch_dir"], "_dynamo", "guards.py")
        self.assertEqual(info["file"], expected)
        self.assertEqual(info["code_file"], expected)

    def test_activate_call_before_import_is_idempotent_and_reversible(self):
        out = self.run_python(
            """
            import sys, torch_overlay
            first = torch_overlay.activate()
            assert torch_overlay.activate() is first
            import torch._dynamo.types
            print(hasattr(torch._dynamo.types, "GuardFilterEntry"))
            torch_overlay.deactivate()
            print(torch_overlay.is_active(), first in sys.meta_path)
            """,
            overlay=False,
        ).stdout.split()
        self.assertEqual(out, ["True", "False", "False"])

    def test_activation_after_import_is_an_error(self):
        proc = self.run_python(
            """
            import torch, torch_overlay
            try:
                torch_overlay.activate()
            except torch_overlay.ActivationTooLateError as e:
                print(" ".join(e.modules))
                print(e)
            print("active:", torch_overlay.is_active())
            """,
            overlay=False,
        )
        # The error carries every module `import torch` imported that the
        # installed base's series patches, sorted: both series patch
        # torch._decomp.decompositions (slice_forward, fill_diagonal_); the
        # 2.7.1 series also patches torch._utils_internal (DISABLE_JUSTKNOBS),
        # the config modules' installer and torch._functorch.utils (per-call
        # and load-time patches 2.6.0's leaves out). The message names the
        # first five.
        from torch_overlay._overlay.series import base_version, installed_base

        if installed_base() == base_version():
            imported_patched = [
                "torch",
                "torch._decomp.decompositions",
                "torch._functorch.pyfunctorch",
                "torch._functorch.utils",
                "torch._utils_internal",
                "torch.compiler",
                "torch.utils._config_module",
            ]
            shown = (
                "torch, torch._decomp.decompositions, torch._functorch.pyfunctorch, "
                "torch._functorch.utils, torch._utils_internal and 2 more"
            )
        else:
            imported_patched = [
                "torch",
                "torch._decomp.decompositions",
                "torch._functorch.pyfunctorch",
                "torch.compiler",
            ]
            shown = "torch, torch._decomp.decompositions, torch._functorch.pyfunctorch, torch.compiler"
        modules_line, message = proc.stdout.strip().split("\n", 1)
        self.assertEqual(modules_line.split(), imported_patched)
        self.assertIn(f"module(s) {shown} had already", message)
        self.assertExpectedInline(
            message.replace(shown, "<modules>"),
            """\
torch_overlay was activated after the patched module(s) <modules> had already been imported unpatched; activating now would leave a half-patched torch. Set TORCH_OVERLAY=1 in the environment before starting Python, or call torch_overlay.activate() before `import torch`.
active: False""",
        )

    def test_unsupported_torch_version_is_refused_naming_both(self):
        with self.assertRaises(UnsupportedTorchVersionError) as ctx:
            importer.check_torch_version("2.13.0+cpu", "/somewhere/torch", base="2.7.1")
        self.assertExpectedInline(
            str(ctx.exception),
            """torch_overlay's patch series targets torch 2.7.1, but torch 2.13.0+cpu is installed at /somewhere/torch. Install torch==2.7.1 (e.g. `make venv`), or unset TORCH_OVERLAY to run stock torch.""",
        )
        # Local build tags of the base release are the base release.
        importer.check_torch_version("2.7.1+cu126", "/x", base="2.7.1")
        importer.check_torch_version("2.7.1", "/x", base="2.7.1")

        # End to end: a torch 2.13 on sys.path; TORCH_OVERLAY=1 makes `import
        # torch` fail with the typed error instead of running unpatched.
        fake = self.tmp / "fake" / "torch"
        fake.mkdir(parents=True)
        (fake / "__init__.py").write_text("raise SystemExit('stock torch ran')\n")
        (fake / "version.py").write_text("__version__ = '2.13.0+cpu'\n")
        proc = self.run_python(
            """
            try:
                import torch
            except Exception as e:
                print(type(e).__name__, e)
            """,
            PYTHONPATH=str(self.tmp / "fake"),
        )
        self.assertIn("UnsupportedTorchVersionError", proc.stdout)
        self.assertIn("targets torch 2.7.1, but torch 2.13.0+cpu", proc.stdout)

    def test_patch_that_does_not_apply_names_patch_and_file(self):
        patches = self.tmp / "patches"
        shutil.copytree(series.patches_dir(), patches)
        victim = series.read_series(patches)[0]
        text = victim.path.read_text()
        # Damage a context line of the guards.py hunk so it no longer matches.
        marker = "class CheckFunctionManager:\n"
        self.assertIn(" " + marker, text)
        victim.path.write_text(text.replace(" " + marker, " class CheckFunctionManagr:\n", 1))
        proc = self.run_python(
            """
            import torch_overlay
            try:
                torch_overlay.activate()
            except torch_overlay.PatchApplyError as e:
                print("patch:", e.patch)
                print("files:", e.files)
            """,
            overlay=False,
            TORCH_OVERLAY_PATCHES_DIR=str(patches),
        )
        self.assertIn(f"patch: {victim.name}", proc.stdout)
        self.assertIn("files: ['torch/_dynamo/guards.py']", proc.stdout)
        # Nothing half-built is left behind as a valid cache.
        built = [p for p in Path(self.cache).iterdir() if not p.name.startswith(".")]
        self.assertEqual(built, [])

    def _materialize_here(self):
        torch_root, version = importer.find_torch()
        return materialize.materialize(
            torch_root, version, series.series_hash(), cache_root=Path(self.cache)
        )

    def test_damaged_cache_is_rebuilt_not_trusted(self):
        tree = self._materialize_here()
        guards = tree.patched_path("torch/_dynamo/guards.py")
        original = guards.read_bytes()
        guards.write_bytes(original + b"\nraise RuntimeError('damaged cache ran')\n")
        proc = self.run_python("import torch._dynamo.guards; print('ok')")
        self.assertIn("ok", proc.stdout)
        self.assertNotIn("damaged cache ran", proc.stderr)
        self.assertEqual(guards.read_bytes(), original)

        # A damaged manifest is rebuilt at activation.
        (tree.root / materialize.MANIFEST).write_text("{not json")
        self.run_python("import torch._dynamo.guards; print('ok')")
        json.loads((tree.root / materialize.MANIFEST).read_text())

        # A damaged .pyc is ignored and rewritten.
        pycs = list((tree.root / "__pycache__").glob("torch._dynamo.guards.*.pyc"))
        self.assertEqual(len(pycs), 1)
        pycs[0].write_bytes(b"garbage")
        self.run_python("import torch._dynamo.guards; print('ok')")
        self.assertGreater(pycs[0].stat().st_size, 1000)

    def test_processes_starting_together_build_the_cache_once(self):
        # See NOTE: [One process builds a series' cache]: three processes find
        # no cache for the series at the same moment; one builds it, the others
        # wait for it and use it, and no tree is replaced under a reader.
        go = self.tmp / "go"
        code = f"""
            import logging, os, sys, time
            from pathlib import Path
            from torch_overlay._overlay import importer, materialize, series
            logging.basicConfig(level=logging.INFO, format="%(message)s")
            torch_root, version = importer.find_torch()
            while not os.path.exists({str(go)!r}):
                time.sleep(0.01)
            tree = materialize.materialize(
                torch_root, version, series.series_hash(), cache_root=Path({self.cache!r})
            )
            print("root", tree.root, len(tree.files))
        """
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(code)],
                env=_env(False, self.cache),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                cwd=str(self.tmp),
            )
            for _ in range(3)
        ]
        go.write_text("")
        outs = [p.communicate(timeout=600) for p in procs]
        self.assertEqual([p.returncode for p in procs], [0, 0, 0], outs)
        builders = [err for _, err in outs if "materialised" in err]
        self.assertEqual(len(builders), 1, outs)
        roots = {out.split()[1] for out, _ in outs}
        self.assertEqual(len(roots), 1)
        trees = [p for p in Path(self.cache).iterdir() if not p.name.startswith(".")]
        self.assertEqual([t.name for t in trees], [Path(roots.pop()).name])

    def test_bytecode_cache_is_reused(self):
        self.run_python("import torch._dynamo.guards")
        tree = self._materialize_here()
        pyc = next((tree.root / "__pycache__").glob("torch._dynamo.guards.*.pyc"))
        before = pyc.stat().st_mtime_ns
        self.run_python("import torch._dynamo.guards")
        self.assertEqual(pyc.stat().st_mtime_ns, before)

    def test_bytecode_cache_is_written_under_dont_write_bytecode(self):
        # NOTE: [Overlay bytecode under PYTHONDONTWRITEBYTECODE]: the overlay's
        # cache is its installation; nothing is written next to any source.
        mirrored_pycache = Path(importer.__file__).parents[1] / "_dynamo" / "__pycache__"
        before = set(mirrored_pycache.glob("*.pyc")) if mirrored_pycache.exists() else set()
        self.run_python("import torch._dynamo.package", PYTHONDONTWRITEBYTECODE="1")
        tree = self._materialize_here()
        pyc = next((tree.root / "__pycache__").glob("torch._dynamo.guards.*.pyc"))
        mirrored = next((tree.root / "__pycache__" / "mirrored").glob("torch._dynamo.package.*.pyc"))
        written = (pyc.stat().st_mtime_ns, mirrored.stat().st_mtime_ns)
        self.run_python("import torch._dynamo.package", PYTHONDONTWRITEBYTECODE="1")
        self.assertEqual((pyc.stat().st_mtime_ns, mirrored.stat().st_mtime_ns), written)
        after = set(mirrored_pycache.glob("*.pyc")) if mirrored_pycache.exists() else set()
        self.assertEqual(after - before, set())

    def test_bytecode_cache_serves_torch_at_another_path_with_that_path(self):
        # NOTE: [Cached overlay bytecode is keyed by source and path]: the same
        # environment reached through a symlink has torch at another path; the
        # cached bytecode of the first process must not give the second one's
        # modules the first one's file names (Dynamo recognises torch's frames
        # by their files).
        linked_prefix = self.tmp / "linked-venv"
        linked_prefix.symlink_to(sys.prefix, target_is_directory=True)
        linked_python = linked_prefix / Path(sys.executable).relative_to(sys.prefix)
        code = """
            import torch, torch._dynamo.eval_frame as ef, torch._dynamo.package as pkg
            torch_dir = torch.__file__.rsplit("/", 1)[0]
            print(ef.DisableContext.__call__.__code__.co_filename.startswith(torch_dir))
            print(pkg.CompilePackage.load.__code__.co_filename.startswith(torch_dir))
            print(torch._dynamo.trace_rules.check(ef.DisableContext.__call__))
            """
        for python in (sys.executable, str(linked_python)):
            proc = subprocess.run(
                [python, "-c", textwrap.dedent(code)],
                env=_env(True, self.cache),
                capture_output=True,
                text=True,
                cwd=str(self.tmp),
            )
            self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
            self.assertEqual(proc.stdout.split()[-3:], ["True", "True", "True"], python)

    def test_traceback_points_into_patched_source(self):
        # make_guard_filter_entry exists only in the patched guards.py: a failure in
        # it must report the patched line number and the patched text.
        proc = self.run_python(
            """
            import traceback, torch._dynamo.guards as g
            try:
                g.make_guard_filter_entry(None, None)
            except AttributeError as e:
                frame = traceback.extract_tb(e.__traceback__)[-1]
                print(frame.filename)
                print(frame.lineno)
                print(frame.line)
            """
        )
        filename, lineno, line = proc.stdout.strip().splitlines()[-3:]
        tree = self._materialize_here()
        patched_lines = tree.patched_path("torch/_dynamo/guards.py").read_text().splitlines()
        self.assertTrue(filename.endswith(os.path.join("torch", "_dynamo", "guards.py")))
        self.assertEqual(patched_lines[int(lineno) - 1].strip(), line.strip())
        self.assertIn("guard.name", line)

    def test_dynamo_skips_patched_and_mirrored_modules_like_torch_internals(self):
        proc = self.run_python(
            """
            import json, sys, torch, torch_overlay
            import torch._dynamo.trace_rules as trace_rules
            finder = torch_overlay._overlay.importer.active_finder()
            result = {}
            for name in sorted(finder.served):
                try:
                    __import__(name)
                except ImportError:
                    continue
                mod = sys.modules[name]
                result[name] = [mod.__file__, trace_rules.check_file(mod.__file__).skipped]
            outside = trace_rules.check_file(torch_overlay.__file__).skipped
            print(json.dumps({"served": result, "outside": outside}))
            """
        )
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        # The check discriminates: a file outside torch's tree is not skipped.
        self.assertFalse(info["outside"])
        self.assertIn("torch._dynamo.guards", info["served"])
        # A patched module is decided as stock torch decides its file (a few
        # torch modules, e.g. torch._higher_order_ops.triton_kernel_wrap, are
        # inlined by design); a new mirrored module as a torch internal: skipped.
        stock = json.loads(
            self.run_python(
                f"""
                import json, os, torch._dynamo.trace_rules as trace_rules
                paths = {[path for path, _ in info["served"].values()]!r}
                print(json.dumps({{p: trace_rules.check_file(p).skipped for p in paths if os.path.exists(p)}}))
                """,
                overlay=False,
            ).stdout.strip().splitlines()[-1]
        )
        for name, (path, skipped) in info["served"].items():
            if path.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
                # Compiled code: Dynamo has no bytecode to trace, whatever the path.
                continue
            self.assertEqual(skipped, stock.get(path, True), f"Dynamo decides {name} ({path}) unlike stock torch")

    def test_mirrored_module_is_served_under_its_upstream_path(self):
        probe = self.tmp / "mirror" / "_dynamo" / "overlay_probe.py"
        probe.parent.mkdir(parents=True)
        probe.write_text("VALUE = 42\n\ndef fail():\n    raise ValueError('probe')\n")
        mirrored = series.mirrored_modules(self.tmp / "mirror")
        self.assertEqual(list(mirrored), ["torch._dynamo.overlay_probe"])
        torch_root, _ = importer.find_torch()
        finder = importer.OverlayFinder(torch_root, self._materialize_here(), mirrored)
        spec = finder.find_spec("torch._dynamo.overlay_probe")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        expected = str(torch_root / "torch" / "_dynamo" / "overlay_probe.py")
        self.assertEqual(module.VALUE, 42)
        self.assertEqual(module.__file__, expected)
        self.assertEqual(module.fail.__code__.co_filename, expected)
        import linecache

        self.assertEqual(linecache.getline(expected, 4).strip(), "raise ValueError('probe')")
        self.assertIsNone(finder.find_spec("torch._dynamo.not_served"))
        self.assertEqual(
            series.mirrored_relpath(probe, self.tmp / "mirror"),
            os.path.join("torch", "_dynamo", "overlay_probe.py"),
        )

    def test_status_cli(self):
        proc = self.run_python(
            "from torch_overlay._overlay.cli import main; main(['status', '--json'])",
            overlay=False,
        )
        info = json.loads(proc.stdout)
        # The base whose series serves the installed torch (2.7.1 in .venv).
        base = series.installed_base()
        self.assertEqual(info["base"], base)
        self.assertIn(base, info["supported_bases"])
        self.assertFalse(info["active"])
        self.assertTrue(info["installed_torch"].startswith(base))
        self.assertEqual(
            info["patches"][0]["subject"],
            "[dynamo] Add guard_filter_fn to torch.compile and CheckFunctionManager",
        )
        self.assertTrue(info["cache"].startswith(self.cache))
        text = subprocess.run(
            [sys.executable, "-m", "torch_overlay", "status"],
            env=_env(False, self.cache),
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.assertIn(f"base torch:       {base} (supported: ", text)
        self.assertIn("overlay active:   no", text)
        self.assertIn("[dynamo] Add guard_filter_fn", text)


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (overlay venv only)")
class TestEditRefresh(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-edit-"))
        self.patches = self.tmp / "patches"
        shutil.copytree(series.patches_dir(), self.patches)
        self.env = _env(
            False, str(self.tmp / "cache"), TORCH_OVERLAY_PATCHES_DIR=str(self.patches)
        )

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def cli(self, *args):
        return subprocess.run(
            [sys.executable, "-m", "torch_overlay", *args],
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )

    def git(self, *args, cwd):
        return subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout

    def test_edit_then_refresh_reproduces_the_series_and_records_new_work(self):
        work = self.tmp / "work"
        before = {p.name: p.read_bytes() for p in self.patches.iterdir()}
        shutil.copyfile(self.patches / "series", self.tmp / "series-before")
        self.cli("edit", str(work))
        log = self.git("log", "--format=%s", cwd=work).splitlines()
        self.assertEqual(len(log), 1 + len(series.series_names(self.patches)))
        self.assertEqual(log[0], series.read_series(self.patches)[-1].subject)

        # refresh with no edits is byte-identical (idempotent patches)
        self.cli("refresh", str(work))
        after = {p.name: p.read_bytes() for p in self.patches.iterdir()}
        self.assertEqual(before, after)

        # a new commit becomes a new patch at the end of the series
        hooks = work / "torch" / "_dynamo" / "hooks.py"
        hooks.write_text(hooks.read_text() + "\nOVERLAY_EDIT_PROBE = 1\n")
        self.git("commit", "-qam", "[dynamo] Add an edit probe\n\nWhy: test.", cwd=work)
        self.cli("refresh", str(work))
        names = series.series_names(self.patches)
        # one more patch than before (the directory also holds `series` and the
        # export ownership file, which refresh leaves alone)
        self.assertEqual(len(names), len([n for n in before if n.endswith(".patch")]) + 1)
        self.assertEqual(names[-1], "dynamo-Add-an-edit-probe.patch")
        # ...in the group of the commit before it, the last (NOTE: [Series groups]);
        # the other patches keep theirs
        groups = series.series_groups(self.patches)
        self.assertEqual(list(groups), list(series.GROUPS))
        self.assertEqual(groups[series.GROUPS[-1]][-1], "dynamo-Add-an-edit-probe.patch")
        self.assertEqual(
            dict(series.parse_series((self.tmp / "series-before").read_text())),
            {n: g for n, g in series.parse_series((self.patches / "series").read_text()) if n in before},
        )

        # refusing to refresh over uncommitted work loses nothing
        hooks.write_text(hooks.read_text() + "\nUNCOMMITTED = 1\n")
        proc = subprocess.run(
            [sys.executable, "-m", "torch_overlay", "refresh", str(work)],
            env=self.env,
            capture_output=True,
            text=True,
        )
        self.assertEqual(proc.returncode, 1)
        self.assertIn("uncommitted changes", proc.stderr)

        # the refreshed series is what the overlay serves
        out = subprocess.run(
            [sys.executable, "-c", "import torch._dynamo.hooks as h; print(h.OVERLAY_EDIT_PROBE)"],
            env={**self.env, "TORCH_OVERLAY": "1"},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        self.assertEqual(out.strip(), "1")


if __name__ == "__main__":
    run_tests()
