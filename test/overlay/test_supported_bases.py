# Owner(s): ["module: dynamo"]
"""The overlay on more than one torch release (NOTE: [Supported bases] in
torch_overlay/_overlay/series.py): which series serves which torch, the typed
refusal of a torch without one, the extension built per base, and the edit tree
of another base made from its wheel's pristine sources.

Skipped where torch_overlay is not importable (the patched wheel's own venv).
"""

import importlib.util
import os
import tempfile
import unittest
import unittest.mock
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None

if HAS_OVERLAY:
    from torch_overlay._overlay import errors, importer, series, workflow


@unittest.skipUnless(HAS_OVERLAY, "torch_overlay is not installed (patched wheel venv)")
class TestSupportedBases(TestCase):
    def test_every_release_with_a_series_is_supported(self):
        bases = series.supported_bases()
        self.assertIn(series.base_version(), bases)
        self.assertIn("2.6.0", bases)
        for base in bases:
            self.assertTrue((series.REPO_ROOT / "patches" / f"v{base}" / "series").is_file())
        self.assertEqual(bases, sorted(bases, key=series._version_key))

    def test_installed_torch_picks_its_series(self):
        for base in series.supported_bases():
            self.assertEqual(importer.check_torch_version(f"{base}+cpu", "/x"), base)
            self.assertEqual(series.patches_dir(base), series.REPO_ROOT / "patches" / f"v{base}")
        _, installed = importer.find_torch()
        self.assertEqual(series.installed_base(), installed.partition("+")[0])
        self.assertEqual(series.patches_dir(), series.patches_dir(series.installed_base()))

    def test_torch_without_a_series_names_the_supported_bases(self):
        with self.assertRaises(errors.UnsupportedTorchVersionError) as ctx:
            importer.check_torch_version("2.5.1+cpu", "/somewhere/torch")
        message = str(ctx.exception)
        self.assertIn("torch 2.5.1+cpu is installed at /somewhere/torch", message)
        self.assertIn("Supported bases (a series in patches/v<base>/): ", message)
        self.assertIn(", ".join(series.supported_bases()), message)
        self.assertEqual(ctx.exception.supported, series.supported_bases())
        # The patched wheel is never patched again, whatever its base.
        with self.assertRaises(errors.AlreadyPatchedTorchError):
            importer.check_torch_version("2.6.0+overlay.20261201.abc", "/x")

    def test_each_base_has_its_own_series_hash(self):
        hashes = {base: series.series_hash(base=base) for base in series.supported_bases()}
        self.assertEqual(len(set(hashes.values())), len(hashes))
        self.assertEqual(series.series_hash(), hashes[series.installed_base()])

    def test_extension_is_served_from_the_build_of_the_base(self):
        ext = "torch._functorch._interpreter_serialization_C"
        primary = series.base_version()
        self.assertEqual(series.extension_build_dir(primary), series.COMPAT_DIR)
        other_dir = series.extension_build_dir("2.6.0")
        self.assertEqual(
            other_dir,
            series.REPO_ROOT / "build" / "ext" / "torch-2.6.0" / "torch_overlay" / "compat",
        )
        modules = series.compat_modules("2.6.0")
        if ext in modules:
            self.assertTrue(modules[ext].is_relative_to(other_dir), modules[ext])
        # The pure-Python compat modules are shared by every base.
        python_modules = {k for k, v in series.compat_modules(primary).items() if v.suffix == ".py"}
        self.assertTrue(python_modules)
        self.assertTrue(python_modules <= set(modules))

    def test_edit_tree_per_base(self):
        self.assertEqual(
            workflow.default_work_dir(series.base_version()), series.REPO_ROOT / ".overlay-work"
        )
        self.assertEqual(
            workflow.default_work_dir("2.6.0"), series.REPO_ROOT / ".overlay-work-2.6.0"
        )

    def test_refresh_writes_the_series_of_its_base(self):
        # An edit tree made by hand (no torch sources needed): one commit on the
        # base tag becomes patches/v<base>/ with that base in the header.
        with tempfile.TemporaryDirectory() as tmp:
            work, out = Path(tmp) / "work", Path(tmp) / "patches"
            (work / "torch").mkdir(parents=True)
            (work / "torch" / "x.py").write_text("a = 1\n")
            workflow.git(["init", "-q", "-b", "main"], work)
            env = dict(workflow._IDENTITY)
            workflow.git(["add", "torch"], work)
            workflow.git(["commit", "-q", "-m", "pristine"], work, env=env)
            workflow.git(["tag", workflow.BASE_TAG], work)
            (work / "torch" / "x.py").write_text("a = 2\n")
            workflow.git(["commit", "-q", "-am", "[dynamo] Change a"], work, env=env)
            with unittest.mock.patch.dict(os.environ, {"TORCH_OVERLAY_PATCHES_DIR": ""}):
                names = workflow.refresh(work, directory=out, base="9.9.9")
            self.assertEqual(names, ["dynamo-Change-a.patch"])
            text = (out / "series").read_text()
            self.assertTrue(
                text.startswith(
                    "# torch_overlay patch series against torch 9.9.9; applied in order.\n"
                )
            )
            # A patch of a new series is a feature (NOTE: [Series groups]).
            self.assertIn("# group: features\n", text)
            self.assertEqual(
                series.parse_series(text), [("dynamo-Change-a.patch", "features")]
            )


if __name__ == "__main__":
    run_tests()
