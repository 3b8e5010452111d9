"""Checks that the suite runs against the torch it claims to run against.

``make`` sets ``TORCH_OVERLAY_EXPECT`` to ``overlay`` (stock 2.7.1 + import hook) or
``wheel`` (the patched wheel, no overlay); a run that silently tested stock torch
would prove nothing, so a mismatch stops the session before any test runs.
"""

import os

import pytest


def pytest_sessionstart(session):
    expected = os.environ.get("TORCH_OVERLAY_EXPECT")
    if not expected:
        return
    import torch
    import torch._dynamo.guards

    loader = type(getattr(torch._dynamo.guards, "__loader__", None)).__name__
    if expected == "overlay":
        import torch_overlay

        if not torch_overlay.is_active() or loader != "PatchedSourceLoader":
            raise pytest.UsageError(
                "TORCH_OVERLAY_EXPECT=overlay but torch is not served by the overlay"
            )
    elif expected == "wheel":
        if "+overlay." not in torch.__version__ or loader == "PatchedSourceLoader":
            raise pytest.UsageError(
                f"TORCH_OVERLAY_EXPECT=wheel but torch is {torch.__version__} ({loader})"
            )
    else:
        raise pytest.UsageError(f"unknown TORCH_OVERLAY_EXPECT={expected!r}")
