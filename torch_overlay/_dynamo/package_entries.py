"""What a compile package holds for each code, and how a fresh process finds that code.

An entry (:class:`_Entry`) is one compile of one code under a package: its
transformed bytecode, serialized guards, the globals the bytecode reads, and
what it was derived from; or Dynamo's decision not to compile that code. Each is
keyed by something a fresh process can find the code by (NOTE: [Keys of package
entries]). Split out of torch/_dynamo/package.py, which re-exports these names;
the package model, its recording (torch/_dynamo/package_recording.py) and its
directory format (torch/_dynamo/package_store.py) all build on them.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import types
from typing import Any

from .package_sources import code_fingerprint, generated_code_owner


@dataclasses.dataclass
class _Entry:
    code_key: tuple
    out_code: bytes  # marshal
    guards_state: bytes
    global_module: str
    # global name -> ("graph", artifact name) | ("resume", code key)
    #              | ("module", module name) | ("named", module, path)
    globals: dict
    # What the bytecode and graphs were derived from: records of
    # torch/_dynamo/package_sources.py (NOTE: [What an entry was derived from]).
    sources: tuple = ()
    # For a recorded decision about a code (no out_code): SKIP_CODE or
    # RUN_ONLY_CODE (NOTE: [Frames Dynamo skips]); "" for a compiled entry.
    frame_action: str = ""


# The frame_action of a code Dynamo decided not to compile, and of a code that
# hit its recompile limit (it runs its cache entries only, or eagerly).
SKIP_CODE, RUN_ONLY_CODE = "skip", "run_only"


@dataclasses.dataclass
class _LoadedEntry:
    entry: _Entry
    out_code: types.CodeType
    f_globals: dict
    guard_manager: Any = None
    # Where it was loaded from, for people: the package and the entry's
    # position in it (NOTE: [Explaining a loaded miss]).
    where: str = ""


# The kinds of code key (NOTE: [Keys of package entries]).
_CODE_KEY_KINDS = ("function", "resume", "inline_wrapper")


# NOTE: [Keys of package entries]
# An entry is looked up by the code object of the frame being called, so the
# package keys each entry by something a fresh process can find that code by:
#   ("function", module, qualname)  a function reachable from its module by
#                                   name, or the code of the compiled callable
#                                   itself (the package's root), by qualname;
#   ("resume", name, fingerprint)   a resume function Dynamo generated at a
#                                   graph break. Its name is not unique (every
#                                   graph break on one line gives the same name,
#                                   and a recursive function re-enters the same
#                                   resume code from many entries), and a fresh
#                                   process holds as many copies of it as there
#                                   are saved entries that call it. The key is
#                                   a fingerprint of the code's contents, so
#                                   every copy (and the copy Dynamo generates
#                                   again if a caller recompiles) matches;
#   ("inline_wrapper", module, qualname of the module's class)
#                                   a built-in nn.Module (or one whose forward
#                                   Dynamo skips) compiled through Dynamo's
#                                   inline wrapper (external_utils.wrap_inline):
#                                   the frame is the wrapper's, whose code every
#                                   such module shares, so the key names the
#                                   class of the module really compiled and only
#                                   a package compiled for that class uses it.
# A key that cannot be found again in a fresh process (a nested function, a
# local class's method reached through a graph break) leaves its entry out at
# save, with a warning (an error with config.strict_precompile).


def _is_resume_code(code: types.CodeType) -> bool:
    return code.co_name.startswith(("torch_dynamo_resume_in_", "__resume_at_"))


@functools.cache
def _inline_wrapper_code() -> types.CodeType:
    """The code of the frame Dynamo compiles for a module whose forward it skips
    (OptimizedModule wraps such a module with external_utils.wrap_inline)."""
    from torch._dynamo import external_utils

    return external_utils.wrap_inline(_inline_wrapper_code).__code__


def _compiled_through_inline_wrapper(module) -> bool:
    """Whether torch.compile(module) runs ``module`` through the inline wrapper
    (the same test OptimizedModule makes)."""
    from torch._dynamo import trace_rules

    forward = getattr(module, "forward", None)
    return isinstance(forward, types.MethodType) and bool(trace_rules.check(forward))


def _code_key(code: types.CodeType, f_globals: dict) -> tuple:
    if _is_resume_code(code):
        return ("resume", code.co_name, code_fingerprint(code))
    if code.co_filename.startswith("<") and "<locals>" in code.co_qualname:
        # Compiled from a string (a dataclass's __init__): found by its function's name.
        owner = generated_code_owner(code)
        if owner is not None:
            return ("function", *owner)
    return ("function", f_globals.get("__name__"), code.co_qualname)


def _describe_key(key: tuple) -> str:
    """A package entry's key, for people."""
    if key[0] == "resume":
        return f"resume function {key[1]}"
    if key[0] == "inline_wrapper":
        return f"{key[1]}.{key[2]} (through Dynamo's inline wrapper)"
    return f"{key[2]} (module {key[1]})"


def _resolve_code(key: tuple, root_codes: list[types.CodeType]):
    if key[0] != "function":
        return None
    _, module_name, qualname = key
    for code in root_codes:
        if code.co_qualname == qualname:
            return code
    module = sys.modules.get(module_name)
    if module is None:
        return None
    # A function defined inside another one (contextlib.contextmanager's
    # helper, which runs under DDP's forward) is a code constant of the
    # enclosing function's code, found by its qualname when there is just one.
    outer, _, _ = qualname.partition(".<locals>.")
    if "<" in outer:
        return None
    obj = module
    try:
        for part in outer.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None
    obj = getattr(obj, "__func__", obj)
    # A decorated function (functools.wraps: transformers' can_return_tuple on
    # forward) is found as its wrapper; its code is the wrapped one's.
    for _ in range(8):
        found_code = getattr(obj, "__code__", None)
        if found_code is None or found_code.co_qualname == outer or not hasattr(obj, "__wrapped__"):
            break
        obj = getattr(obj.__wrapped__, "__func__", obj.__wrapped__)
    outer_code = getattr(obj, "__code__", None)
    if outer_code is None or outer == qualname:
        return outer_code
    found = [c for c in _nested_codes(outer_code) if c.co_qualname == qualname]
    return found[0] if len(found) == 1 else None


def _rename_globals(code: types.CodeType, renames: dict[str, str]) -> types.CodeType:
    consts = tuple(
        _rename_globals(c, renames) if isinstance(c, types.CodeType) else c
        for c in code.co_consts
    )
    names = tuple(renames.get(n, n) for n in code.co_names)
    return code.replace(co_names=names, co_consts=consts)


def _nested_codes(code: types.CodeType):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested_codes(const)


def _all_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for nested in _nested_codes(code):
        names |= set(nested.co_names)
    return names


