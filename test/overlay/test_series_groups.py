# Owner(s): ["module: dynamo"]
"""The series in two groups, features then speed-ups (NOTE: [Series groups] in
torch_overlay/_overlay/series.py): how `series` marks them, which groups
TORCH_OVERLAY_GROUPS serves, how `refresh` keeps them, the project's own series
on every base, and the upstream export of the features alone.

Skipped where torch_overlay is not importable (the patched wheel's own venv).
"""

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import unittest
import unittest.mock
from pathlib import Path

from torch.testing._internal.common_utils import run_tests, TestCase


HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None
REPO_ROOT = Path(__file__).resolve().parents[2]

if HAS_OVERLAY:
    from torch_overlay._overlay import errors, series, workflow

SERIES_TEXT = """\
# a header
early.patch
# group: features
#   a description line is a comment
feature.patch
# group: speed-ups
faster.patch
fastest.patch  # a trailing comment
"""


def _load_exporter():
    spec = importlib.util.spec_from_file_location(
        "export_upstream", REPO_ROOT / "build_scripts" / "export_upstream.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@unittest.skipUnless(HAS_OVERLAY, "torch_overlay is not installed (patched wheel venv)")
class TestSeriesGroups(TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-groups-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def write_series(self, text=SERIES_TEXT) -> Path:
        (self.tmp / "series").write_text(text)
        for name, _ in series.parse_series(text):
            (self.tmp / name).write_text(f"Subject: [PATCH] [dynamo] {name}\n\n---\n")
        return self.tmp

    def test_markers_give_each_patch_its_group(self):
        self.assertEqual(
            series.parse_series(SERIES_TEXT),
            [
                ("early.patch", "features"),
                ("feature.patch", "features"),
                ("faster.patch", "speed-ups"),
                ("fastest.patch", "speed-ups"),
            ],
        )
        directory = self.write_series()
        self.assertEqual(
            series.series_groups(directory),
            {
                "features": ["early.patch", "feature.patch"],
                "speed-ups": ["faster.patch", "fastest.patch"],
            },
        )
        self.assertEqual(
            [(p.name, p.group) for p in series.read_series(directory, ("features",))],
            [("early.patch", "features"), ("feature.patch", "features")],
        )

    def test_unknown_repeated_or_reordered_groups_are_refused(self):
        for text, message in [
            ("# group: extras\na.patch\n", r"unknown group 'extras'"),
            (
                "# group: speed-ups\na.patch\n# group: features\nb.patch\n",
                "comes after",
            ),
            ("# group: features\na.patch\n# group: features\nb.patch\n", "comes after"),
        ]:
            with self.assertRaisesRegex(errors.OverlayError, message):
                series.parse_series(text)

    def test_format_is_the_inverse_of_parse(self):
        entries = series.parse_series(SERIES_TEXT)
        text = series.format_series("header one\n\nheader two", entries)
        self.assertTrue(
            text.startswith("# header one\n#\n# header two\n# group: features\n")
        )
        self.assertEqual(series.parse_series(text), entries)

    def test_groups_served_follow_the_environment(self):
        cases = {
            None: series.GROUPS,
            "": series.GROUPS,
            "features": ("features",),
            " features , speed-ups ": series.GROUPS,
        }
        for value, expected in cases.items():
            env = {} if value is None else {series.GROUPS_ENV: value}
            with unittest.mock.patch.dict(os.environ, env, clear=False):
                if value is None:
                    os.environ.pop(series.GROUPS_ENV, None)
                self.assertEqual(series.selected_groups(), expected)
        # A later group is applied on top of the earlier ones: never alone.
        for value in ("speed-ups", "speed-ups,features", "features,extras"):
            with unittest.mock.patch.dict(os.environ, {series.GROUPS_ENV: value}):
                with self.assertRaisesRegex(errors.OverlayError, "from the first on"):
                    series.selected_groups()

    def test_the_features_alone_are_served_and_hashed_apart(self):
        directory = self.write_series()
        every = series.series_hash(directory, "2.7.1", series.GROUPS)
        features = series.series_hash(directory, "2.7.1", ("features",))
        self.assertNotEqual(every, features)
        with unittest.mock.patch.dict(os.environ, {series.GROUPS_ENV: "features"}):
            self.assertEqual(
                [p.name for p in series.served_series(directory)],
                ["early.patch", "feature.patch"],
            )
            self.assertEqual(series.series_hash(directory, "2.7.1"), features)

    def test_refresh_keeps_groups_and_places_new_patches_after_their_neighbour(self):
        old = series.parse_series(SERIES_TEXT)
        self.assertEqual(
            workflow.regroup(
                [
                    "early.patch",
                    "feature.patch",
                    "new-feature.patch",
                    "faster.patch",
                    "fastest.patch",
                    "new-speed-up.patch",
                ],
                old,
            ),
            [
                ("early.patch", "features"),
                ("feature.patch", "features"),
                ("new-feature.patch", "features"),
                ("faster.patch", "speed-ups"),
                ("fastest.patch", "speed-ups"),
                ("new-speed-up.patch", "speed-ups"),
            ],
        )
        # A feature commit moved after a speed-up: refresh names it and stops.
        with self.assertRaisesRegex(
            errors.OverlayError, r"feature.patch \(features\) comes after faster.patch"
        ):
            workflow.regroup(["early.patch", "faster.patch", "feature.patch"], old)

    def test_project_series_is_grouped_on_every_base(self):
        for base in series.supported_bases():
            directory = series.patches_dir(base)
            groups = series.series_groups(directory)
            self.assertEqual(list(groups), list(series.GROUPS), base)
            text = (directory / "series").read_text()
            self.assertEqual(
                [line for line in text.splitlines() if line.startswith("# group:")],
                [f"# group: {g}" for g in series.GROUPS],
                base,
            )
            # Both bases order their common patches alike.
            primary = series.series_names(series.patches_dir(series.base_version()))
            names = [n for n in series.series_names(directory) if n in primary]
            self.assertEqual(names, [n for n in primary if n in names], base)
            # A patch is in the same group on every base.
            primary_groups = dict(
                series.parse_series(
                    (series.patches_dir(series.base_version()) / "series").read_text()
                )
            )
            for group, group_names in groups.items():
                for name in group_names:
                    self.assertEqual(primary_groups.get(name, group), group, name)

    def test_features_export_leaves_out_the_speed_ups_and_their_files(self):
        # The export is of the primary base's series, whichever torch is installed.
        exporter = _load_exporter()
        primary = series.patches_dir(series.base_version())
        everything = exporter.plan_export(primary)
        with unittest.mock.patch.dict(os.environ, {series.GROUPS_ENV: "features"}):
            features = exporter.plan_export(primary)
        speed_ups = set(series.series_groups(primary)["speed-ups"])
        self.assertEqual(
            [c.title for c in features],
            [c.title for c in everything if c.group == "features"],
        )
        self.assertTrue(features)
        self.assertEqual({c.group for c in features}, {"features"})
        exported = {i.patch.name for c in features for i in c.patches}
        self.assertFalse(exported & speed_ups)
        tests = {t for c in features for t in c.tests}
        self.assertIn("test/dynamo/test_package.py", tests)
        self.assertNotIn("test/dynamo/test_load_imports.py", tests)
        # The speed-ups come after every feature commit.
        kinds = [c.group for c in everything]
        self.assertEqual(kinds, sorted(kinds, key=series.GROUPS.index))

    def test_overlay_serves_the_features_alone(self):
        # A fresh process: the materialised tree of the features alone is its own
        # (hashed apart), and the packages' API is there.
        env = {
            **os.environ,
            "TORCH_OVERLAY": "1",
            series.GROUPS_ENV: "features",
            "PYTHONPATH": str(REPO_ROOT),
        }
        code = (
            "import torch, torch._dynamo.package\n"
            "from torch_overlay._overlay import importer, series\n"
            "assert importer.is_active()\n"
            "print(len(series.served_series()), series.series_hash()[:16])\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        count, digest = out.stdout.split()
        self.assertEqual(int(count), len(series.series_groups()["features"]))
        self.assertNotEqual(digest, series.series_hash(groups=series.GROUPS)[:16])


if __name__ == "__main__":
    run_tests()
