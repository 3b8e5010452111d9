"""Loads the C++ half of functorch interpreter serialization (pytorch#152616).

Backport only (the compat layer, never exported): upstream, torch._C binds these
methods itself.

Importing this module gives ``torch._C._functorch.CInterpreter`` the methods
``serialize() -> str`` and ``deserialize(str) -> CInterpreter`` (a staticmethod),
which torch 2.7.1's own bindings lack. They live in the compiled extension
``torch._functorch._interpreter_serialization_C``, which adds them to the class
when it is imported; this module imports it and, where it is missing, says how to
build it instead of failing with a bare ModuleNotFoundError.

Importing it raises ``torch_overlay.ExtensionNotBuiltError`` (an ImportError)
when the extension is missing or was built for another torch, and leaves
``serialize`` / ``deserialize`` in place that raise the same error when called.
"""

# NOTE: [Building the interpreter serialization extension]
# The extension is built once, from torch_overlay/csrc/ (the upstream C++) and
# torch_overlay/compat/csrc/ (the glue), by
# ``make ext`` (and by ``make venv``, which runs ``pip install -e .``); the
# patched wheel carries the built file. It is never built on import: a build
# needs a C++ compiler and ninja, and an import that silently compiles for tens of
# seconds (or fails to) is worse than one that fails at once and names the fix.

from __future__ import annotations

import importlib


EXTENSION = "torch._functorch._interpreter_serialization_C"


def _not_built_error(cause: ImportError) -> ImportError:
    if isinstance(cause, ModuleNotFoundError) and cause.name == EXTENSION:
        detail = f"{EXTENSION} is not built"
    else:
        detail = (
            f"{EXTENSION} cannot be loaded ({cause}); it was probably built for "
            "another torch, rebuild it"
        )
    try:
        from torch_overlay import ExtensionNotBuiltError
        from torch_overlay._overlay.series import base_version, installed_base
    except ImportError:
        # A patched wheel without torch_overlay: the wheel ships the extension,
        # so only a damaged installation gets here.
        return ImportError(_not_built_message(detail, "`make ext`"), name=EXTENSION)
    # Each supported base has its own build (NOTE: [One extension build per base]).
    base = installed_base()
    make = "`make ext` (or `make venv`)"
    if base != base_version():
        make = f"`make ext BASE={base}` (or `make venv BASE={base}`)"
    return ExtensionNotBuiltError(_not_built_message(detail, make))


def _not_built_message(detail: str, make: str) -> str:
    return (
        "functorch interpreter serialization (CInterpreter.serialize / "
        f"deserialize) is unavailable: {detail}. It is built from "
        f"torch_overlay/csrc/ and torch_overlay/compat/csrc/ by {make} in the "
        "torch_overlay checkout."
    )


def _attach_unavailable_methods(cause: ImportError) -> None:
    """CInterpreter.serialize / deserialize that raise the not-built error: code
    written for upstream calls them without importing anything first, and learns
    how to build the extension instead of meeting an AttributeError."""
    from torch._C._functorch import CInterpreter

    def unavailable(*args, **kwargs):
        raise _not_built_error(cause) from cause

    CInterpreter.serialize = unavailable
    CInterpreter.deserialize = staticmethod(unavailable)


try:
    importlib.import_module(EXTENSION)
except ImportError as e:
    _attach_unavailable_methods(e)
    raise _not_built_error(e) from e
