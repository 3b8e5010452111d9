"""Build of torch_overlay: ships ``torch_overlay.pth`` at the root of site-packages
and builds the C++ extension under ``torch_overlay/csrc/``.

The .pth file is what makes ``TORCH_OVERLAY=1`` work for every Python process of
the environment. setuptools has no declarative way to place a file at the root of
site-packages, so ``build_py`` copies it there for regular installs; editable
installs (``make venv``) get it from ``python -m torch_overlay install-pth``,
because setuptools' editable wheels carry only their own path hooks.

The extension is built against the installed torch with torch.utils.cpp_extension
(ninja when available; needs ``--no-build-isolation`` so that torch is visible).
It lands where the torch module it provides is mirrored: ``torch_overlay/X/_n.so``
is served as ``torch.X._n`` and copied to ``torch/X/`` in the patched wheel.
Editable installs build it in place; ``make ext`` rebuilds it.
"""

import os
import shutil

from setuptools import setup
from setuptools.command.build_py import build_py

from torch.utils.cpp_extension import BuildExtension, CppExtension


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


ext_modules = [
    # torch.X._n is built from torch_overlay/csrc/ as torch_overlay/X/_n.<abi>.so
    CppExtension(
        "torch_overlay._functorch._interpreter_serialization_C",
        [
            "torch_overlay/csrc/functorch/InterpreterSerialization.cpp",
            "torch_overlay/csrc/functorch/interpreter_serialization_bindings.cpp",
        ],
        include_dirs=["."],
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden"],
    ),
]


setup(
    ext_modules=ext_modules,
    cmdclass={"build_py": build_py_with_pth, "build_ext": BuildExtension},
)
