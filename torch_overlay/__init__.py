"""torch_overlay: torch.compile precompile for PyTorch 2.7.1, as a patch set.

Importing this package patches nothing. The patch set is served by an import hook
once activated, either by ``TORCH_OVERLAY=1`` in the environment (honoured at
interpreter start by the installed ``torch_overlay.pth``) or by calling
:func:`activate` before ``import torch``.

Provides :func:`activate`, :func:`deactivate`, :func:`is_active`, the typed errors
of :mod:`torch_overlay._overlay.errors`, and ``python -m torch_overlay`` (status,
edit, refresh).
"""

from ._overlay.errors import (
    ActivationTooLateError,
    AlreadyPatchedTorchError,
    ExtensionNotBuiltError,
    OverlayError,
    PatchApplyError,
    TorchNotFoundError,
    UnsupportedTorchVersionError,
)
from ._overlay.importer import activate, deactivate, is_active
from ._overlay.series import base_version


__all__ = [
    "ActivationTooLateError",
    "AlreadyPatchedTorchError",
    "ExtensionNotBuiltError",
    "OverlayError",
    "PatchApplyError",
    "TorchNotFoundError",
    "UnsupportedTorchVersionError",
    "activate",
    "base_version",
    "deactivate",
    "is_active",
]
