"""Activation from the environment: run by ``torch_overlay.pth`` at interpreter start.

With ``TORCH_OVERLAY=1`` every Python process of the venv serves the patched torch,
so unmodified user scripts and upstream-style tests run patched. A ``.pth`` line
cannot usefully raise (``site`` prints and carries on), so if activation fails here
the error is kept and raised by the first ``import torch`` instead: a process never
runs stock torch while believing it is patched.
"""

from __future__ import annotations

import importlib.abc
import os
import sys

from .errors import OverlayError


ENV_VAR = "TORCH_OVERLAY"


def requested_by_environment() -> bool:
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("", "0", "false", "no")


class _DeferredActivationErrorFinder(importlib.abc.MetaPathFinder):
    """Raises the activation error when torch is imported."""

    def __init__(self, error: OverlayError) -> None:
        self.error = error

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            raise self.error
        return None


def activate_from_environment() -> None:
    if not requested_by_environment():
        return
    from .importer import activate

    try:
        activate()
    except OverlayError as error:
        sys.meta_path.insert(0, _DeferredActivationErrorFinder(error))
    except Exception as error:
        wrapped = OverlayError(f"torch_overlay: activation failed: {error!r}")
        wrapped.__cause__ = error
        sys.meta_path.insert(0, _DeferredActivationErrorFinder(wrapped))


activate_from_environment()
