"""Typed errors of the torch_overlay machinery.

Every way activation or materialisation can go wrong has its own exception type,
all under :class:`OverlayError`, so callers (and tests) can tell them apart and a
user sees a message that says what happened and what to do instead.
"""

from __future__ import annotations


class OverlayError(RuntimeError):
    """Base class of every error raised by the overlay machinery."""


class ActivationTooLateError(OverlayError):
    """A module the overlay patches was imported before the overlay was activated."""

    def __init__(self, modules: list[str]) -> None:
        self.modules = sorted(modules)
        shown = ", ".join(self.modules[:5])
        if len(self.modules) > 5:
            shown += f" and {len(self.modules) - 5} more"
        super().__init__(
            f"torch_overlay was activated after the patched module(s) {shown} "
            "had already been imported unpatched; activating now would leave a "
            "half-patched torch. Set TORCH_OVERLAY=1 in the environment before "
            "starting Python, or call torch_overlay.activate() before `import torch`."
        )


class UnsupportedTorchVersionError(OverlayError):
    """The installed torch is not a release the overlay has a patch series for."""

    def __init__(
        self, installed: str, base: str, location: str, supported: list[str] | None = None
    ) -> None:
        self.installed = installed
        self.base = base
        self.supported = list(supported or [base])
        message = (
            f"torch_overlay's patch series targets torch {base}, but torch "
            f"{installed} is installed at {location}. Install torch=={base} "
            "(e.g. `make venv`), or unset TORCH_OVERLAY to run stock torch."
        )
        others = [b for b in self.supported if b != base]
        if others:
            message += (
                f" Supported bases (a series in patches/v<base>/): "
                f"{', '.join(self.supported)}; `make venv BASE=<base>` makes "
                "a venv for another one."
            )
        super().__init__(message)


class AlreadyPatchedTorchError(OverlayError):
    """The installed torch is the patched wheel: the overlay must not patch it twice."""

    def __init__(self, installed: str, location: str) -> None:
        self.installed = installed
        super().__init__(
            f"torch {installed} at {location} is a torch_overlay patched wheel; "
            "it already carries the patch series. Unset TORCH_OVERLAY."
        )


class TorchNotFoundError(OverlayError):
    """No torch installation could be found on sys.path."""


class PatchApplyError(OverlayError):
    """A patch of the series does not apply to the installed torch sources."""

    def __init__(self, patch: str, files: list[str], detail: str) -> None:
        self.patch = patch
        self.files = files
        where = ", ".join(files) if files else "(git apply named no file)"
        super().__init__(
            f"patch {patch} does not apply to {where}:\n{detail.strip()}"
        )


class ExtensionNotBuiltError(OverlayError, ImportError):
    """torch_overlay's C++ extension is missing or was built for another torch."""
