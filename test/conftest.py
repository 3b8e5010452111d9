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
# the patched wheel, which has no torch_overlay) nothing is skipped. A key is a
# node id, a prefix of one up to "::" or "[" (a file, a class), or the id of a
# test as written, which covers every test instantiate_parametrized_tests makes
# of it (test_x_how_a, test_x_how_b, ... of test_x).
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


# NOTE: [Tests of groups not served]
# TORCH_OVERLAY_GROUPS=features serves the series without its speed-ups (NOTE:
# [Series groups] in torch_overlay/_overlay/series.py). The test files a left-out
# patch owns (patches/v<primary base>/export.toml; the compat patches own none,
# so theirs are named here) test what it adds, and are skipped naming it.
_COMPAT_PATCH_TESTS = {
    "dynamo-Backport-recursive-dict-tags-skip-unchanged-module-subtrees.patch": [
        "test/overlay/test_dict_tag_guards.py",
    ],
}


def _group_test_skips() -> dict[str, str]:
    try:
        from torch_overlay._overlay import series
    except ImportError:
        return {}
    groups = series.selected_groups()
    if groups == series.GROUPS:
        return {}
    import tomllib

    ownership = series.REPO_ROOT / "patches" / f"v{series.base_version()}" / "export.toml"
    with open(ownership, "rb") as f:
        declared = tomllib.load(f).get("patches", {})
    skips = {}
    for patch in series.read_series(series.patches_dir()):
        if patch.group in groups:
            continue
        tests = [*declared.get(patch.name, {}).get("tests", []), *_COMPAT_PATCH_TESTS.get(patch.name, [])]
        for rel in tests:
            skips[rel] = (
                f"{series.GROUPS_ENV}={','.join(groups)}: the {patch.group} patch "
                f"{patch.name!r} that this tests is not served"
            )
    return skips


# NOTE: [A warm save cache per group selection]
# Inductor keys its caches on torch's files on disk (codecache.torch_key), which
# the overlay leaves as they are: the whole series and the features alone get the
# same keys, and one's generated code (importing what only the speed-ups add, e.g.
# runtime_utils.AssertedInputLayouts) would load into the other. test_package.py's
# saving side shares a warm cache across runs (PACKAGE_TEST_SAVE_CACHE); with a
# subset of the groups served it gets its own.
def pytest_configure(config):
    if "PACKAGE_TEST_SAVE_CACHE" in os.environ:
        return
    try:
        from torch_overlay._overlay import series
    except ImportError:
        return
    groups = series.selected_groups()
    if groups != series.GROUPS:
        import tempfile

        os.environ["PACKAGE_TEST_SAVE_CACHE"] = os.path.join(
            tempfile.gettempdir(), "package-test-save-cache-" + "-".join(groups)
        )


def _written_test_id(item) -> str:
    """The node id of the test as its file spells it: for a parametrization made
    by instantiate_parametrized_tests, whose function keeps the written name
    (functools.wraps), that name's id; otherwise the item's own id."""
    written = getattr(getattr(item, "function", None), "__name__", None)
    if not written or written == item.name or "::" not in item.nodeid:
        return item.nodeid
    return f"{item.nodeid.rsplit('::', 1)[0]}::{written}"


def pytest_collection_modifyitems(config, items):
    skips = {**_base_test_skips(), **_group_test_skips()}
    if not skips:
        return
    for item in items:
        written = _written_test_id(item)
        for key, reason in skips.items():
            if key in (item.nodeid, written) or item.nodeid.startswith((key + "::", key + "[")):
                item.add_marker(pytest.mark.skip(reason=reason))
                break
