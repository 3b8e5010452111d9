# Owner(s): ["module: dynamo"]
"""``python -m torch_overlay package ...``: the overlay's command line hands the
package commands to torch._dynamo.package_trust (tested in
test/dynamo/test_package_trust.py). Overlay machinery: never exported."""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch._dynamo.test_case


def _overlay_cli(*args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "torch_overlay", "package", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "TORCH_OVERLAY": "1"},
    )


class TestOverlayPackageCli(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        try:
            import torch_overlay  # noqa: F401
        except ImportError:
            self.skipTest("the torch_overlay command line is not installed (patched wheel)")
        self.tmp = Path(tempfile.mkdtemp(prefix="overlay-package-cli-"))

    def test_keygen_then_a_typed_error_for_a_missing_package(self):
        key = self.tmp / "k.pem"
        proc = _overlay_cli("keygen", str(key), cwd=self.tmp)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(key.is_file() and Path(f"{key}.pub").is_file())
        proc = _overlay_cli(
            "verify", str(self.tmp / "no-such-package"), "--trusted-key", f"{key}.pub", cwd=self.tmp
        )
        self.assertEqual(proc.returncode, 1)
        self.assertTrue(proc.stderr.startswith("error: "), proc.stderr)
        self.assertIn("not a package directory or archive", proc.stderr)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
