# Owner(s): ["module: dynamo"]
"""The patched wheel (build_scripts/build_wheel.py) against the overlay's own sources.

Reads the wheel built for the current series hash in dist/ (``make wheel``) and
checks its RECORD, its version stamp, and that every patched and mirrored file is
byte for byte what the overlay serves. Skipped when no such wheel is built, and in
the wheel's own venv, where torch_overlay is not installed.
"""

import base64
import csv
import hashlib
import importlib.metadata
import importlib.util
import io
import re
import unittest
import zipfile

from torch.testing._internal.common_utils import run_tests, TestCase


HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None

if HAS_OVERLAY:
    from torch_overlay._overlay import importer, materialize, series

    BASE = series.base_version()
    SERIES_HASH = series.series_hash()
    # The version build_wheel.py stamps (NOTE: [Patched wheel version] there).
    _spec = importlib.util.spec_from_file_location(
        "build_wheel", series.REPO_ROOT / "build_scripts" / "build_wheel.py"
    )
    build_wheel = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(build_wheel)
    VERSION = build_wheel.overlay_version(BASE, SERIES_HASH, build_wheel.source_date_epoch())
    WHEELS = sorted((series.REPO_ROOT / "dist").glob(f"torch-{VERSION}-*.whl"))
else:
    WHEELS = []

# Shared libraries of the base wheel: >95% of its bytes, copied through unchanged, so
# their RECORD entries are checked by size only to keep this test fast.
_BASE_SHARED_LIB = re.compile(r"\.so(\.[0-9.]+)?$")


def _sha256(data: bytes) -> str:
    # Digests, not bytes, go to assertEqual: torch's compares a bytes object element by
    # element, which takes seconds for a large module.
    return hashlib.sha256(data).hexdigest()


def _record_digest(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


@unittest.skipIf(not HAS_OVERLAY, "needs torch_overlay (not installed next to the wheel)")
@unittest.skipIf(not WHEELS, "no patched wheel built for this series; run `make wheel`")
class TestPatchedWheel(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.wheel = zipfile.ZipFile(WHEELS[0])
        cls.members = {
            info.filename: info
            for info in cls.wheel.infolist()
            if not info.filename.endswith("/")
        }
        cls.dist_info = f"torch-{VERSION}.dist-info"
        # The mirrored new modules and the compat layer, extensions included.
        cls.new_files = {
            series.mirrored_relpath(path): path
            for path in series.served_new_modules().values()
        }

    @classmethod
    def tearDownClass(cls):
        cls.wheel.close()
        super().tearDownClass()

    def read(self, name: str) -> bytes:
        if name not in self.members:
            self.fail(f"{name} is missing from {WHEELS[0].name}")
        return self.wheel.read(name)

    def test_record_lists_every_file_with_its_hash(self):
        record_name = f"{self.dist_info}/RECORD"
        rows = list(csv.reader(io.StringIO(self.read(record_name).decode())))
        record = {row[0]: (row[1], row[2]) for row in rows}
        self.assertEqual(len(record), len(rows), "RECORD lists a file twice")
        self.assertEqual(set(record), set(self.members))
        self.assertEqual(record.pop(record_name), ("", ""))
        wrong_size, wrong_hash = [], []
        for name, (digest, size) in sorted(record.items()):
            info = self.members[name]
            if int(size) != info.file_size:
                wrong_size.append(name)
            elif _BASE_SHARED_LIB.search(name) and name not in self.new_files:
                continue
            elif digest != _record_digest(self.wheel.read(info)):
                wrong_hash.append(name)
        self.assertEqual(wrong_size, [])
        self.assertEqual(wrong_hash, [])

    def test_version_stamp_agrees_everywhere(self):
        self.assertIn(SERIES_HASH[:12], VERSION)
        self.assertTrue(WHEELS[0].name.startswith(f"torch-{VERSION}-"))
        dist_infos = {name.split("/")[0] for name in self.members if ".dist-info/" in name}
        self.assertEqual(dist_infos, {self.dist_info})
        metadata = self.read(f"{self.dist_info}/METADATA").decode()
        headers = metadata.partition("\n\n")[0]
        self.assertEqual(re.findall(r"^Version: (.*)$", headers, re.MULTILINE), [VERSION])
        version_py = self.read("torch/version.py").decode()
        self.assertEqual(
            re.findall(r"^__version__\s*=\s*['\"]([^'\"]*)['\"]", version_py, re.MULTILINE),
            [VERSION],
        )
        self.assertRegex(version_py, r"(?m)^git_version\s*=")

    def test_patched_files_match_the_overlay(self):
        torch_root, torch_version = importer.find_torch()
        importer.check_torch_version(torch_version, str(torch_root / "torch"))
        patches = series.served_series()
        tree = materialize.materialize(torch_root, torch_version, SERIES_HASH, patches=patches)
        touched = {rel for p in patches for rel in materialize.patch_files(p.path)}
        self.assertEqual(set(tree.files), touched & set(tree.files))
        for rel in sorted(touched):
            if rel in tree.files:
                self.assertEqual(
                    _sha256(self.read(rel)),
                    _sha256(tree.patched_path(rel).read_bytes()),
                    f"{rel} differs from the overlay's {tree.patched_path(rel)}",
                )
            else:
                self.assertFalse(rel in self.members, f"the series deletes {rel}")

    def test_adds_exactly_the_new_files(self):
        base_files = {str(f) for f in importlib.metadata.distribution("torch").files}
        added = {
            name
            for name in self.members
            if name not in base_files and not name.startswith(self.dist_info + "/")
        }
        self.assertEqual(sorted(added), sorted(self.new_files))

    def test_new_files_match_their_sources(self):
        for rel, src in sorted(self.new_files.items()):
            self.assertEqual(
                _sha256(self.read(rel)), _sha256(src.read_bytes()), f"{rel} differs from {src}"
            )


if __name__ == "__main__":
    run_tests()
