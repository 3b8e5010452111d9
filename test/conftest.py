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


# NOTE: [Tests skipped on another base]
# The suite runs unchanged on every supported base (`make test BASE=2.6.0`). A
# test of something an older torch lacks, or of a patch its series leaves out,
# is listed with its reason in patches/v<base>/test-skips.toml, and skipped with
# that reason when the overlay serves that base; on the primary base (and with
# the patched wheel, which has no torch_overlay) nothing is skipped.
def _base_test_skips() -> dict[str, str]:
    try:
        from torch_overlay._overlay import series
    except ImportError:
        return {}
    base = series.installed_base()
    if base == series.base_version():
        return {}
    path = series.REPO_ROOT / "patches" / f"v{base}" / "test-skips.toml"
    if not path.exists():
        return {}
    import tomllib

    with open(path, "rb") as f:
        return dict(tomllib.load(f).get("skip", {}))


def pytest_collection_modifyitems(config, items):
    skips = _base_test_skips()
    if not skips:
        return
    for item in items:
        for prefix, reason in skips.items():
            if item.nodeid == prefix or item.nodeid.startswith((prefix + "::", prefix + "[")):
                item.add_marker(pytest.mark.skip(reason=reason))
                break
