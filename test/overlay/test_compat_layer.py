# Owner(s): ["module: dynamo"]
"""The compat layer (torch_overlay/compat/): what only the backport needs.

On torch 2.7.1 ``CInterpreter.serialize`` / ``deserialize`` come from the compat
layer's extension, served (overlay) or shipped (patched wheel) as
``torch._functorch._interpreter_serialization_C`` and loaded at ``import torch`` by
``torch._functorch._interpreter_serialization``. These tests check where it is and
what a missing build says; the API itself is tested by
test/functorch/test_interpreter_serialization.py. Never exported upstream.
"""

import importlib
import importlib.util
import os
import subprocess
import sys
import textwrap
import unittest

import torch
from torch._C._functorch import CInterpreter
from torch.testing._internal.common_utils import run_tests, TestCase


EXTENSION = "torch._functorch._interpreter_serialization_C"
HAS_OVERLAY = importlib.util.find_spec("torch_overlay") is not None


class TestCompatLayer(TestCase):
    def test_extension_is_served_as_a_torch_module(self):
        ext = importlib.import_module(EXTENSION)
        expected_dir = os.path.join(
            os.path.dirname(os.path.abspath(torch.__file__)), "_functorch"
        )
        if os.environ.get("TORCH_OVERLAY_EXPECT") != "wheel":
            # The overlay loads it from where it was built for this torch: in the
            # compat layer (NOTE: [One extension build per base]).
            from torch_overlay._overlay import series

            build_dir = series.extension_build_dir(series.installed_base())
            expected_dir = str(build_dir / "_functorch")
        self.assertEqual(os.path.dirname(os.path.abspath(ext.__file__)), expected_dir)
        for name in ("serialize", "deserialize"):
            self.assertTrue(getattr(CInterpreter, name).__doc__.strip())

    @unittest.skipUnless(HAS_OVERLAY, "the compat layer's sources are in torch_overlay")
    def test_compat_modules_are_not_mirrored_upstream_modules(self):
        from torch_overlay._overlay import series

        compat = series.compat_modules()
        self.assertIn("torch._functorch._interpreter_serialization", compat)
        self.assertIn(EXTENSION, compat)
        self.assertFalse(set(compat) & set(series.mirrored_modules()))
        self.assertLessEqual(set(compat), set(series.served_new_modules()))

    def test_missing_extension_names_the_make_target(self):
        # A fresh interpreter in which the compiled module cannot be found.
        script = textwrap.dedent(
            f"""
            import importlib.abc, sys
            class Missing(importlib.abc.MetaPathFinder):
                def find_spec(self, name, path=None, target=None):
                    if name == {EXTENSION!r}:
                        raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            sys.meta_path.insert(0, Missing())
            import torch, pickle
            from torch._functorch import pyfunctorch
            try:
                from torch_overlay import ExtensionNotBuiltError as expected
            except ImportError:  # a patched wheel without torch_overlay
                expected = ImportError
            try:
                with torch._functorch.vmap.vmap_increment_nesting(2, "error"):
                    pickle.dumps(pyfunctorch.retrieve_current_functorch_interpreter())
            except ImportError as e:
                print(type(e) is expected)
                print(e)
            # Called directly, as upstream code does, the methods say the same.
            try:
                torch._C._functorch.CInterpreter.deserialize("{{}}")
            except ImportError as e:
                print(type(e) is expected)
            """
        )
        safe_path = ["-P"] if sys.flags.safe_path else []
        proc = subprocess.run(
            [sys.executable, *safe_path, "-c", script], capture_output=True, text=True
        )
        self.assertEqual(proc.returncode, 0, proc.stderr)
        expected_type, message, direct_call_type = proc.stdout.splitlines()
        self.assertEqual((expected_type, direct_call_type), ("True", "True"), proc.stdout)
        self.assertIn(f"{EXTENSION} is not built", message)
        # The build command of the base this torch is served by (NOTE: [One
        # extension build per base]); the patched wheel, without torch_overlay,
        # names `make ext`.
        try:
            from torch_overlay._overlay.series import base_version, installed_base
        except ImportError:
            build = "`make ext`"
        else:
            base = installed_base()
            build = "`make ext`" if base == base_version() else f"`make ext BASE={base}`"
        self.assertIn(build, message)


if __name__ == "__main__":
    run_tests()
