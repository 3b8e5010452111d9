# Owner(s): ["module: dynamo"]
"""The nightly build machinery, on small synthetic inputs (no download, no torch wheel).

* build_scripts/build_wheel.py: the same base wheel, series and added files give a
  byte-identical wheel whatever the clock, the directories or the order of the base
  wheel's entries; a changed input changes it; the version sorts by date.
* build_scripts/publish_index.py: a PEP 503 index that pip installs from, in a fresh
  venv, with the newest nightly picked.
* torch_overlay/_overlay/rebase_check.py: a series carried onto another "release" by
  3-way merge, each patch classified (clean, offset, conflict, upstream), and the
  mirrored modules the release already has.
* .github/workflows/nightly.yml: scheduled, and runs only targets the Makefile has.

Skipped where torch_overlay is not importable (the patched wheel's own venv).
"""

import csv
import dataclasses
import difflib
import hashlib
import importlib
import importlib.util
import io
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import unittest.mock
import zipfile
from pathlib import Path

from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    TestCase,
)


HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None
REPO_ROOT = Path(__file__).resolve().parents[2]

if HAS_OVERLAY:
    from torch_overlay._overlay import errors, importer, rebase_check, series


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "build_scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unified_patch(rel: str, before: str, after: str) -> str:
    """A ``git apply``-able diff of one file, as the series' patches hold."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
    )
    return f"diff --git a/{rel} b/{rel}\n" + "".join(lines)


def _write_patch(directory: Path, name: str, diffs: list[str]) -> "series.Patch":
    path = directory / name
    path.write_text(f"From 0 Mon Sep 17 00:00:00 2001\nSubject: [PATCH] {name}\n\n---\n" + "".join(diffs))
    return series.Patch(name, path, name)


def _with_record(files: dict[str, bytes], dist_info: str) -> dict[str, bytes]:
    """``files`` and a RECORD listing them (``wheel unpack`` checks it)."""
    import base64

    rows = []
    for name, data in sorted(files.items()):
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rows.append(f"{name},sha256={digest},{len(data)}\n")
    return {**files, f"{dist_info}/RECORD": "".join([*rows, f"{dist_info}/RECORD,,\n"]).encode()}


def _write_wheel(path: Path, files: dict[str, bytes], order: list[str], date_time, modes: dict[str, int]) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in order:
            info = zipfile.ZipInfo(name, date_time=date_time)
            info.external_attr = (0o100000 | modes.get(name, 0o644)) << 16
            zf.writestr(info, files[name])
    return path


GUARDS_PY = "".join(f"line_{i} = {i}\n" for i in range(30))
BASE_FILES = _with_record({
    "torch/__init__.py": b"from torch.version import __version__\n",
    "torch/version.py": b"__version__ = '2.7.1+cpu'\ngit_version = 'abc'\n",
    "torch/_dynamo/guards.py": GUARDS_PY.encode(),
    "torch/bin/torch_shm_manager": b"\x7fELF not really\n",
    "torch-2.7.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: torch\nVersion: 2.7.1\n\nbody\n",
    "torch-2.7.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
}, "torch-2.7.1.dist-info")
BASE_MODES = {"torch/bin/torch_shm_manager": 0o775}
WHEEL_NAME = "torch-2.7.1-cp311-cp311-linux_x86_64.whl"


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (not installed next to the wheel)")
class TestReproducibleWheel(TestCase):
    """build_wheel.build_from_base on a tiny base wheel."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.build_wheel = _load_script("build_wheel")

    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="test-nightly-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)
        after = GUARDS_PY.replace("line_10 = 10\n", "line_10 = 'patched'\n")
        self.patches = [_write_patch(self.tmp, "p.patch", [_unified_patch("torch/_dynamo/guards.py", GUARDS_PY, after)])]
        self.module = self.tmp / "package.py"
        self.module.write_text("VALUE = 1\n")

    def build(self, name: str, order_seed: int, clock: float, added=None, epoch=1764547200):
        """Build from a base wheel whose entries are in a seeded random order and
        dated by ``clock``, with the wall clock at ``clock``."""
        order = sorted(BASE_FILES)
        random.Random(order_seed).shuffle(order)
        base_dir = self.tmp / f"base-{name}"
        base_dir.mkdir()
        import time

        stamp = time.gmtime(clock)[:6]
        base = _write_wheel(base_dir / WHEEL_NAME, BASE_FILES, order, stamp, BASE_MODES)
        added = added or {"torch/_dynamo/package.py": self.module}
        for src in added.values():
            os.utime(src, (clock, clock))
        version = self.build_wheel.overlay_version("2.7.1", "ab" * 32, epoch)
        with unittest.mock.patch("time.time", return_value=clock):
            return self.build_wheel.build_from_base(
                base, self.tmp / f"work-{name}", version, epoch, self.patches, added
            )

    def test_same_inputs_same_sha256(self):
        first = self.build("first", order_seed=1, clock=1.7e9)
        second = self.build("second", order_seed=2, clock=1.8e9)
        self.assertNotEqual(first.parent, second.parent)
        self.assertEqual(first.name, "torch-2.7.1+overlay.20251201.abababababab-cp311-cp311-linux_x86_64.whl")
        self.assertEqual(_sha256(first), _sha256(second))

    def test_changed_input_changes_sha256(self):
        first = self.build("first", order_seed=1, clock=1.7e9)
        other = self.tmp / "other.py"
        other.write_text("VALUE = 2\n")
        changed = self.build("changed", order_seed=1, clock=1.7e9, added={"torch/_dynamo/package.py": other})
        self.assertNotEqual(_sha256(first), _sha256(changed))
        later = self.build("later", order_seed=1, clock=1.7e9, epoch=1764547200 + 3600)
        self.assertNotEqual(_sha256(first), _sha256(later))

    def test_archive_is_normalised(self):
        wheel = self.build("one", order_seed=3, clock=1.7e9)
        with zipfile.ZipFile(wheel) as zf:
            infos = zf.infolist()
            names = [i.filename for i in infos]
            dist_info = "torch-2.7.1+overlay.20251201.abababababab.dist-info"
            self.assertEqual(names[-1], f"{dist_info}/RECORD")
            self.assertEqual(names[:-1], sorted(names[:-1], key=lambda n: (".dist-info/" in n, n)))
            self.assertEqual({i.date_time for i in infos}, {(2025, 12, 1, 0, 0, 0)})
            modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in infos}
            self.assertEqual(modes["torch/bin/torch_shm_manager"], 0o755)
            self.assertEqual({m for n, m in modes.items() if "bin/" not in n}, {0o644})
            self.assertIn("line_10 = 'patched'", zf.read("torch/_dynamo/guards.py").decode())
            self.assertEqual(zf.read("torch/_dynamo/package.py"), b"VALUE = 1\n")
            self.assertIn("__version__ = '2.7.1+overlay.20251201.abababababab'", zf.read("torch/version.py").decode())
            rows = list(csv.reader(io.StringIO(zf.read(f"{dist_info}/RECORD").decode())))
            self.assertEqual([r[0] for r in rows], names)
            self.assertEqual(rows[-1], [f"{dist_info}/RECORD", "", ""])
            for name, digest, size in rows[:-1]:
                data = zf.read(name)
                self.assertEqual((digest, int(size)), (self.build_wheel._record_hash(hashlib.sha256(data).digest()), len(data)))

    def test_version_sorts_by_date_and_names_the_series(self):
        from packaging.version import Version

        day = 24 * 3600
        older = self.build_wheel.overlay_version("2.7.1", "ffffffffffff" + "0" * 52, 1764547200)
        newer = self.build_wheel.overlay_version("2.7.1", "000000000001" + "0" * 52, 1764547200 + day)
        self.assertEqual(older, "2.7.1+overlay.20251201.ffffffffffff")
        self.assertEqual(newer, "2.7.1+overlay.20251202.000000000001")
        self.assertLess(Version(older), Version(newer))
        self.assertLess(Version("2.7.1"), Version(older))
        self.assertEqual(Version(newer).public, "2.7.1")
        # The overlay still refuses to patch a torch that carries the series already.
        with self.assertRaises(errors.AlreadyPatchedTorchError):
            importer.check_torch_version(newer, "/site-packages/torch", base="2.7.1")

    def test_series_hash_read_back_from_the_version(self):
        try:
            backport_build = importlib.import_module("torch._dynamo._backport_build")
        except ImportError:
            self.skipTest("torch._dynamo._backport_build is served only by the overlay or the wheel")
        import torch

        with unittest.mock.patch.object(torch, "__version__", "2.7.1+overlay.20251202.0123456789ab"):
            self.assertEqual(backport_build.series_hash(), "0123456789ab")

    def test_source_date_epoch(self):
        self.assertEqual(self.build_wheel.source_date_epoch(self.tmp, {"SOURCE_DATE_EPOCH": "1234"}), 1234)
        with self.assertRaisesRegex(errors.OverlayError, "SOURCE_DATE_EPOCH"):
            self.build_wheel.source_date_epoch(self.tmp, {"SOURCE_DATE_EPOCH": "yesterday"})
        repo = self.tmp / "repo"
        (repo / "patches").mkdir(parents=True)
        env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
               "GIT_COMMITTER_EMAIL": "t@t", "GIT_CEILING_DIRECTORIES": str(self.tmp)}

        def commit(path: str, date: int) -> None:
            (repo / path).write_text(str(date))
            subprocess.run(["git", "add", path], cwd=repo, env=env, check=True)
            subprocess.run(["git", "commit", "-qm", path], cwd=repo, check=True,
                           env={**env, "GIT_COMMITTER_DATE": f"{date} +0000"})

        subprocess.run(["git", "init", "-q"], cwd=repo, env=env, check=True)
        commit("patches/series", 1700000000)
        commit("README.md", 1800000000)  # touches neither patches/ nor torch_overlay/
        with unittest.mock.patch.dict(os.environ, {"GIT_CEILING_DIRECTORIES": str(self.tmp)}):
            self.assertEqual(self.build_wheel.source_date_epoch(repo, {}), 1700000000)
            with self.assertRaisesRegex(errors.OverlayError, "set SOURCE_DATE_EPOCH"):
                self.build_wheel.source_date_epoch(self.tmp, {})


PROBE = "overlay-index-probe"


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (not installed next to the wheel)")
class TestPublishIndex(TestCase):
    """publish_index.py: a PEP 503 index that pip installs from."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.build_wheel = _load_script("build_wheel")
        cls.publish_index = _load_script("publish_index")

    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="test-nightly-index-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def probe_wheel(self, version: str, value: str) -> Path:
        """A pure-Python wheel of ``overlay-index-probe``, packed as the nightly is."""
        root = self.tmp / f"tree-{version}"
        (root / "overlay_index_probe").mkdir(parents=True)
        (root / "overlay_index_probe" / "__init__.py").write_text(f"VALUE = {value!r}\n")
        dist_info = root / f"overlay_index_probe-{version}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {PROBE}\nVersion: {version}\nRequires-Python: >=3.8\n"
        )
        (dist_info / "WHEEL").write_text("Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        name = f"overlay_index_probe-{version}-py3-none-any.whl"
        return self.build_wheel.repack(root, self.tmp / "dist" / name, 1764547200)

    def test_publish_is_idempotent_and_sorted(self):
        older = self.probe_wheel("0.1+overlay.20251201.ffffffffffff", "older")
        newer = self.probe_wheel("0.1+overlay.20251202.000000000001", "newer")
        index = self.tmp / "index"
        simple = self.publish_index.publish([newer, older], index)
        page = (simple / PROBE / "index.html").read_text()
        hrefs = re.findall(r'href="([^"#]+)#sha256=([0-9a-f]{64})"', page)
        self.assertEqual([h[0] for h in hrefs], [newer.name, older.name])
        for name, digest in hrefs:
            self.assertEqual(digest, _sha256(simple / PROBE / name))
        self.assertIn('data-requires-python="&gt;=3.8"', page)
        self.assertIn(f'href="{PROBE}/"', (simple / "index.html").read_text())

        snapshot = {p: p.read_bytes() for p in index.rglob("*") if p.is_file()}
        self.publish_index.publish([older], index)
        self.assertEqual({p: p.read_bytes() for p in index.rglob("*") if p.is_file()}, snapshot)

        clash = self.tmp / "clash" / older.name
        clash.parent.mkdir()
        clash.write_bytes(newer.read_bytes())
        with self.assertRaisesRegex(self.publish_index.PublishError, "already published"):
            self.publish_index.publish([clash], index)

    def test_pip_installs_the_newest_from_the_index(self):
        wheels = [
            self.probe_wheel("0.1+overlay.20251201.ffffffffffff", "older"),
            self.probe_wheel("0.1+overlay.20251202.000000000001", "newer"),
        ]
        simple = self.publish_index.publish(wheels, self.tmp / "index")
        venv = self.tmp / "venv"
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
        venv_python = venv / "bin" / "python"
        # Only the index: no pip configuration, find-links or cache of this machine.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv_python), "install", "--no-cache-dir",
             "--disable-pip-version-check", "--index-url", simple.as_uri(), "--no-deps", PROBE],
            env=env, capture_output=True, text=True,
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        out = subprocess.run(
            [str(venv_python), "-c", "import overlay_index_probe, importlib.metadata as m; "
             f"print(overlay_index_probe.VALUE, m.version({PROBE!r}))"],
            capture_output=True, text=True, check=True, cwd=self.tmp,
        ).stdout.split()
        self.assertEqual(out, ["newer", "0.1+overlay.20251202.000000000001"])


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _numbered(prefix: str, count: int = 30) -> str:
    return "".join(f"{prefix}_{i} = {i}\n" for i in range(count))


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (not installed next to the wheel)")
@instantiate_parametrized_tests
class TestRebaseCheck(TestCase):
    """rebase_check.carry_series / check_release on synthetic releases."""

    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="test-nightly-rebase-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def series(self) -> tuple[list, dict[str, str], dict[str, str]]:
        """A base "release", a target "release" and a series of six patches:
        clean, offset, conflict, upstream (reverse-applies), upstream (lines present)
        and one on top of the clean one; the first three are the features group,
        the others the speed-ups (NOTE: [Series groups])."""
        base = {f"torch/{n}.py": _numbered(n) for n in ("clean", "moved", "clash", "done", "present")}
        target = dict(base)
        target["torch/moved.py"] = "import os\nimport sys\n\n" + base["torch/moved.py"]
        target["torch/clash.py"] = base["torch/clash.py"].replace("clash_15 = 15", "clash_15 = 'theirs'")
        target["torch/done.py"] = base["torch/done.py"].replace("done_20 = 20", "done_20 = 'fixed'")
        target["torch/present.py"] = (
            base["torch/present.py"].replace("present_5 = 5\n", "")
            .replace("present_25 = 25\n", "present_25 = 25\npresent_extra = 'upstream'\n")
        )

        def change(rel, old, new, text=None):
            text = text if text is not None else base[rel]
            return _unified_patch(rel, text, text.replace(old, new)), text.replace(old, new)

        clean_diff, clean_after = change("torch/clean.py", "clean_10 = 10", "clean_10 = 'ours'")
        on_top_diff, _ = change("torch/clean.py", "clean_10 = 'ours'", "clean_10 = 'ours, again'", clean_after)
        patches = [
            _write_patch(self.tmp, "1-clean.patch", [clean_diff]),
            _write_patch(self.tmp, "2-offset.patch", [change("torch/moved.py", "moved_12 = 12", "moved_12 = 'ours'")[0]]),
            _write_patch(self.tmp, "3-conflict.patch", [change("torch/clash.py", "clash_15 = 15", "clash_15 = 'ours'")[0]]),
            _write_patch(self.tmp, "4-upstream.patch", [change("torch/done.py", "done_20 = 20", "done_20 = 'fixed'")[0]]),
            _write_patch(self.tmp, "5-present.patch", [change(
                "torch/present.py", "present_5 = 5\n", "present_5 = 5\npresent_extra = 'upstream'\n")[0]]),
            _write_patch(self.tmp, "6-on-top.patch", [on_top_diff]),
        ]
        patches[3:] = [dataclasses.replace(p, group="speed-ups") for p in patches[3:]]
        return patches, base, target

    def test_each_patch_is_classified(self):
        patches, base, target = self.series()
        base_tree = _tree(self.tmp / "base", base)
        target_tree = _tree(self.tmp / "target", target)
        results = rebase_check.carry_series(patches, base_tree, target_tree, "9.9.9")
        self.assertEqual(
            [(r.name, r.status) for r in results],
            [("1-clean.patch", "clean"), ("2-offset.patch", "offset"), ("3-conflict.patch", "conflict"),
             ("4-upstream.patch", "upstream"), ("5-present.patch", "upstream"), ("6-on-top.patch", "clean")],
        )
        offset = results[1].files[0]
        self.assertEqual(offset.offsets, [{"hunk": 1, "line": 13, "offset": 3}])
        self.assertEqual(results[2].how, "torch/clash.py (1 hunk(s))")
        (hunk,) = results[2].files[0].conflicts
        self.assertEqual(hunk["line"], 16)
        self.assertIn("clash_15 = 'theirs'", hunk["text"])
        self.assertIn("clash_15 = 'ours'", hunk["text"])
        self.assertEqual([results[3].how, results[4].how], ["reverse-applies", "every added line present"])
        # Carried forward: the later patch applied on top of the earlier one, the
        # conflict resolved to the patch's side, the upstream change left as it was.
        carried = {rel: (target_tree / rel).read_text() for rel in base}
        self.assertIn("clean_10 = 'ours, again'", carried["torch/clean.py"])
        self.assertIn("moved_12 = 'ours'", carried["torch/moved.py"])
        self.assertIn("clash_15 = 'ours'", carried["torch/clash.py"])
        self.assertNotIn("<<<<<<<", carried["torch/clash.py"])
        self.assertEqual(carried["torch/done.py"], target["torch/done.py"])
        self.assertEqual(carried["torch/present.py"], target["torch/present.py"])

    @parametrize(
        "release_edit, patch_edit, kind",
        [
            # Both change the line: the patch's own edit meets the release's.
            ({"x_5 = 5": "x_5 = 'release'"}, {"x_5 = 5": "x_5 = 'patch'"}, "same-lines"),
            # The patch deletes a line the release changes.
            ({"x_5 = 5": "x_5 = 'release'"}, {"x_5 = 5\n": ""}, "same-lines"),
            # The release adds a line inside lines the patch deletes (a name added to
            # an import list the patch takes out).
            ({"x_5 = 5\n": "x_5 = 5\nrelease_line = 1\n"}, {"x_5 = 5\nx_6 = 6\n": ""}, "same-lines"),
            # Each changes its own line, next to the other's.
            ({"x_6 = 6": "x_6 = 'release'"}, {"x_5 = 5": "x_5 = 'patch'"}, "adjacent"),
            # The patch only adds a line, above a line the release changes.
            ({"x_5 = 5": "x_5 = 'release'"}, {"x_5 = 5": "patch_line = 1\nx_5 = 5"}, "insert-beside"),
            # A line of the file that reads like a separator is text.
            ({"x_5 = 5": "======="}, {"x_5 = 5": "x_5 = 'patch'"}, "same-lines"),
            # Both add lines at one point, neither changes a line of the base.
            ({"x_5 = 5": "release_line = 1\nx_5 = 5"}, {"x_5 = 5": "patch_line = 1\nx_5 = 5"}, "insert-beside"),
        ],
    )
    def test_conflicting_hunk_kind(self, release_edit, patch_edit, kind):
        base = _numbered("x")
        (release_old, release_new), = release_edit.items()
        (patch_old, patch_new), = patch_edit.items()
        release = base.replace(release_old, release_new, 1)
        patch = base.replace(patch_old, patch_new, 1)
        with tempfile.TemporaryDirectory() as work:
            _, hunks = rebase_check.merge_file(release, base, patch, ("release", "base", "patch"), Path(work))
        self.assertEqual([h["kind"] for h in hunks], [kind])

    def test_missing_file_is_a_conflict(self):
        patches, base, target = self.series()
        del target["torch/moved.py"]
        results = rebase_check.carry_series(
            patches[1:2], _tree(self.tmp / "base", base), _tree(self.tmp / "target", target), "9.9.9"
        )
        self.assertEqual((results[0].status, results[0].how), ("conflict", "torch/moved.py (missing)"))

    def test_check_release_reports_patches_and_colliding_modules(self):
        patches, base, target = self.series()
        mirrored = _tree(self.tmp / "torch_overlay", {"_dynamo/new_module.py": "A = 1\n", "_dynamo/package.py": "B = 2\n"})
        target["torch/_dynamo/package.py"] = "B = 'upstream'\n"
        wheels = {}
        for name, files in (("1.0.0", base), ("9.9.9", target)):
            data = _with_record({rel: text.encode() for rel, text in files.items()}, f"torch-{name}.dist-info")
            wheels[name] = _write_wheel(self.tmp / f"torch-{name}-py3-none-any.whl", data, sorted(data), (2025, 1, 1, 0, 0, 0), {})
        modules = {
            "torch._dynamo.new_module": mirrored / "_dynamo" / "new_module.py",
            "torch._dynamo.package": mirrored / "_dynamo" / "package.py",
        }
        report = rebase_check.check_release("9.9.9", wheels["9.9.9"], wheels["1.0.0"], patches, modules)
        data = json.loads(json.dumps(report.to_json()))
        self.assertEqual(data["target"], "9.9.9")
        self.assertEqual(
            data["summary"], {"clean": 2, "offset": 1, "conflict": 1, "upstream": 2, "module_collisions": 1}
        )
        self.assertEqual(
            [(m["module"], m["collides"], m["existing"]) for m in data["modules"]],
            [("torch._dynamo.new_module", False, []),
             ("torch._dynamo.package", True, ["torch/_dynamo/package.py"])],
        )
        self.assertEqual(data["target_wheel_sha256"], _sha256(wheels["9.9.9"]))
        # Per group: how many of its patches carry cleanly, and how many conflict.
        self.assertEqual(
            data["groups"],
            {
                "features": {"patches": 3, "clean": 1, "offset": 1, "conflict": 1, "upstream": 0},
                "speed-ups": {"patches": 3, "clean": 1, "offset": 0, "conflict": 0, "upstream": 2},
            },
        )
        self.assertEqual([p["group"] for p in data["patches"]], ["features"] * 3 + ["speed-ups"] * 3)
        table = report.table()
        self.assertIn("group features (3 patches): 1 clean, 1 offset, 1 conflict, 0 upstream\n", table)
        self.assertIn("group speed-ups (3 patches): 1 clean, 0 offset, 0 conflict, 2 upstream\n", table)
        self.assertIn(
            "2 clean, 1 offset, 1 conflict, 2 upstream; 1 of 2 mirrored modules collide; "
            "1 conflicting hunk(s): 1 same-lines, 0 adjacent, 0 insert-beside",
            table,
        )
        self.assertRegex(table, r"(?m)^torch/_dynamo/package\.py +collides +torch 9\.9\.9 has it \(differs\)$")
        markdown = report.markdown()
        self.assertIn("| `3-conflict.patch` | conflict | torch/clash.py (1 hunk(s)) |", markdown)
        self.assertIn(
            "| **group speed-ups** |  |  |\n| `4-upstream.patch` | upstream | reverse-applies |",
            markdown,
        )
        # A report from before the groups: its patches carry no group.
        older_patches = [{k: v for k, v in p.items() if k != "group"} for p in data["patches"][:1]]
        older = {**data, "target": "1.10.0", "modules": [], "patches": older_patches}
        self.assertEqual(
            rebase_check.matrix_markdown([data, older]).splitlines(),
            [
                "| patch / mirrored module | torch 1.10.0 | torch 9.9.9 |",
                "|---|---|---|",
                "| **group features** | | |",
                "| `1-clean.patch` | clean | clean |",
                "| `2-offset.patch` | - | offset: 1 hunk(s) at other lines |",
                "| `3-conflict.patch` | - | conflict: 1 hunk(s) in 1 file(s) |",
                "| **group speed-ups** | | |",
                "| `4-upstream.patch` | - | upstream (reverse-applies) |",
                "| `5-present.patch` | - | upstream (every added line present) |",
                "| `6-on-top.patch` | - | clean |",
                "| `torch/_dynamo/package.py` | new | collides |",
            ],
        )


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (not installed next to the wheel)")
class TestNightlyWorkflow(TestCase):
    """.github/workflows/nightly.yml: scheduled, dispatchable, calling make targets only."""

    WORKFLOW = REPO_ROOT / ".github" / "workflows" / "nightly.yml"

    def test_workflow_runs_existing_make_targets(self):
        try:
            import yaml
        except ImportError:
            self.skipTest("needs PyYAML")
        workflow = yaml.safe_load(self.WORKFLOW.read_text())
        triggers = workflow.get("on", workflow.get(True))  # YAML 1.1 reads `on` as True
        self.assertRegex(triggers["schedule"][0]["cron"], r"^\S+ \S+ \S+ \S+ \S+$")
        self.assertIn("workflow_dispatch", triggers)
        targets = set(re.findall(r"^([A-Za-z][\w-]*):", (REPO_ROOT / "Makefile").read_text(), re.MULTILINE))
        called = set()
        for job in workflow["jobs"].values():
            for step in job["steps"]:
                run = re.sub(r"\$\{\{.*?\}\}", "EXPR", step.get("run", ""))
                for command in re.findall(r"\bmake\s+([^;&|\n]+)", run):
                    called.update(w for w in command.split() if "=" not in w and not w.startswith("-"))
        self.assertTrue({"wheel", "test-wheel", "publish", "rebase-check"} <= called, called)
        self.assertEqual(called - targets, set())

    def test_actionlint(self):
        actionlint = shutil.which("actionlint")
        if actionlint is None:
            self.skipTest("actionlint is not installed")
        proc = subprocess.run([actionlint, str(self.WORKFLOW)], capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


if __name__ == "__main__":
    run_tests()
