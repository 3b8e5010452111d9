"""Which backport build of torch this is: the patch series it carries.

Backport only (the compat layer, never exported). A compile package records the
series of the torch that wrote it, so that a package is only loaded by a torch that
carries the same patches (torch 2.7.1 with another series may pickle and guard
differently). Upstream torch has no series: ``torch._dynamo.package_artifacts``
imports this module optionally and records "none" where it is absent.

The patched wheel stamps its series into ``torch.__version__``
(``2.7.1+overlay.<YYYYMMDD>.<hash>``, the hash last: NOTE: [Patched wheel version] in
build_scripts/build_wheel.py); under the overlay, ``torch.__version__`` is the base's
and the series is hashed from the overlay's sources.
"""

import torch


def series_hash() -> str:
    """The first 12 hex digits of the carried series' hash, or "none"."""
    version = str(torch.__version__)
    if "+overlay." in version:
        return version.split("+overlay.", 1)[1].split(".")[-1][:12]
    try:
        from torch_overlay._overlay.series import series_hash as overlay_series_hash
    except ImportError:
        return "none"
    return overlay_series_hash()[:12]
