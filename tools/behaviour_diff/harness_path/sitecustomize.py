"""Started by every Python process of the behaviour diff's stock 2.7.1 and torch
2.13 runs (this folder is on their PYTHONPATH).

The suite's save/load tests start their fresh interpreters through
``torch.testing._internal.fresh_process``, a test harness the overlay and the
patched wheel ship (torch_overlay/testing/_internal/fresh_process.py). Stock
torch 2.7.1 and upstream 2.13 do not have it, so without it those files would
not even be collected there, and the diff would compare collection errors
instead of behaviour. This serves that one module from the project's file,
and only where the running torch lacks it. It is standard-library-only test
plumbing, not precompile: what the tests exercise is still the environment's
own torch.
"""

import importlib.abc
import importlib.util
import os
import sys


_NAME = "torch.testing._internal.fresh_process"
_PATH = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
    "torch_overlay",
    "testing",
    "_internal",
    "fresh_process.py",
)


class _FreshProcessFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != _NAME:
            return None
        # The running torch's own module wins where it has one.
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                return spec
        return importlib.util.spec_from_file_location(fullname, _PATH)


if os.path.exists(_PATH):
    sys.meta_path.insert(0, _FreshProcessFinder())
