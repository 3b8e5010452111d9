"""Build of torch_overlay: ships ``torch_overlay.pth`` at the root of site-packages.

The .pth file is what makes ``TORCH_OVERLAY=1`` work for every Python process of
the environment. setuptools has no declarative way to place a file at the root of
site-packages, so ``build_py`` copies it there for regular installs; editable
installs (``make venv``) get it from ``python -m torch_overlay install-pth``,
because setuptools' editable wheels carry only their own path hooks.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py


PTH = "torch_overlay.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            shutil.copyfile(PTH, os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if getattr(self, "editable_mode", False):
            return outputs
        return [*outputs, os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": build_py_with_pth})
