"""Build of torch_overlay: ships ``torch_overlay.pth`` at the root of site-packages
and builds the C++ extension (``torch_overlay/csrc/`` and ``torch_overlay/compat/csrc/``).

The .pth file is what makes ``TORCH_OVERLAY=1`` work for every Python process of
the environment. setuptools has no declarative way to place a file at the root of
site-packages, so ``build_py`` copies it there for regular installs; editable
installs (``make venv``) get it from ``python -m torch_overlay install-pth``,
because setuptools' editable wheels carry only their own path hooks.

The extension is built against the installed torch with torch.utils.cpp_extension
(ninja when available; needs ``--no-build-isolation`` so that torch is visible), from
the upstream C++ under ``torch_overlay/csrc/`` (each file at its upstream path) and
the compat layer's glue under ``torch_overlay/compat/csrc/``. It lands in the compat
layer, where the torch module it provides is laid out:
``torch_overlay/compat/X/_n.so`` is served as ``torch.X._n`` and copied to
``torch/X/`` in the patched wheel. Editable installs build it in place; ``make ext``
rebuilds it.

The C++ uses nlohmann/json, as upstream's tree does; torch 2.7.1 does not ship it,
so it comes from the system's include path (``make venv`` / ``make ext`` install
Debian's nlohmann-json3-dev when the header is missing), or from
``NLOHMANN_JSON_INCLUDE_DIR``.
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


CSRC = "torch_overlay/csrc"
# Upstream's include roots of the files under csrc/ (aten/src/ATen/... is included
# as <ATen/...>), ahead of torch's installed headers.
# Absolute: ninja compiles from the build directory.
REPO_ROOT = os.path.dirname(os.path.abspath(__file__))
INCLUDE_ROOTS = [os.path.join(REPO_ROOT, CSRC, "aten", "src")]
# The objects embed source paths (__FILE__ in TORCH_CHECK, ours and torch's
# headers'): written relative to the checkout (the dev venv lies inside it), so
# checkouts in other directories build the same extension, and the same wheel
# (NOTE: [Reproducible patched wheel] in build_scripts/build_wheel.py).
REPRODUCIBLE_PATHS = [f"-ffile-prefix-map={REPO_ROOT}=."]
NLOHMANN_JSON_INCLUDE_DIR = os.environ.get("NLOHMANN_JSON_INCLUDE_DIR")

ext_modules = [
    # torch.X._n is built as torch_overlay/compat/X/_n.<abi>.so
    CppExtension(
        "torch_overlay.compat._functorch._interpreter_serialization_C",
        [
            f"{CSRC}/aten/src/ATen/functorch/InterpreterSerialization.cpp",
            "torch_overlay/compat/csrc/interpreter_serialization_bindings.cpp",
        ],
        include_dirs=INCLUDE_ROOTS
        + ([NLOHMANN_JSON_INCLUDE_DIR] if NLOHMANN_JSON_INCLUDE_DIR else []),
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", *REPRODUCIBLE_PATHS],
    ),
    # The fast path of recursive dict-tag guards (CPython's C API only).
    CppExtension(
        "torch_overlay.compat._dynamo._dict_tag_guards_C",
        ["torch_overlay/compat/csrc/dict_tag_guards.cpp"],
        extra_compile_args=["-O2", "-g0", "-fvisibility=hidden", *REPRODUCIBLE_PATHS],
    ),
]


setup(
    ext_modules=ext_modules,
    cmdclass={"build_py": build_py_with_pth, "build_ext": BuildExtension},
)
