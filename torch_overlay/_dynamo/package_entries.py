"""What a compile package holds for each code, and how a fresh process finds that code.

An entry (:class:`_Entry`) is one compile of one code under a package: its
transformed bytecode, serialized guards, the globals the bytecode reads, and
what it was derived from; or Dynamo's decision not to compile that code. Each is
keyed by something a fresh process can find the code by (NOTE: [Keys of package
entries]), and installed only in a module the live function names. Upstream's
data of a saved package are here too: entries grouped by code
(:class:`_DynamoCodeCacheEntry`), the inlined sources (:class:`SourceInfo`) and
the system (:class:`SystemInfo`) they were compiled with. Split out of torch/_dynamo/package.py, which re-exports these names;
the package model, its recording (torch/_dynamo/package_recording.py) and its
directory format (torch/_dynamo/package_store.py) all build on them.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import sys
import types
from typing import Any, Optional

import torch
from torch._dynamo.exc import PackageError

from .package_artifacts import _sha256, load_code
from .package_sources import (
    code_fingerprint,
    generated_code_owner,
    inlined_code_record,
    read_module_lines,
)


@dataclasses.dataclass
class _Entry:
    code_key: tuple
    out_code: bytes  # marshal
    guards_state: bytes
    global_module: str
    # global name -> ("graph", artifact name) | ("resume", code key)
    #              | ("module", module name) | ("named", module, path)
    #              | ("random_values", calls) (NOTE: [Replayed random calls])
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
    obj: Any = module
    try:
        for part in outer.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return _code_of_frozen_module(module, qualname)
    obj = getattr(obj, "__func__", obj)
    if isinstance(obj, property):
        # A property's accessor (transformers' ModuleUtilsMixin.device, whose
        # getter runs as a frame of its own after a graph break) has the
        # property's qualname: found when just one of them has that code.
        accessors: list[Any] = [f for f in (obj.fget, obj.fset, obj.fdel) if getattr(f, "__code__", None) is not None]
        named = [f for f in accessors if f.__code__.co_qualname == outer]
        obj = named[0] if len(named) == 1 else None
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


def _code_of_frozen_module(module: types.ModuleType, qualname: str):
    """The code of ``qualname`` in a module that this process imported from
    the interpreter's frozen modules (``os`` on Python 3.11), read from the
    module's own frozen code object: a function the module deletes once it
    has run it (``os._createenviron``, whose local functions encode and
    decode the keys of ``os.environ``) has no name to be found by. The
    module's functions were made from that very code, so the code found is
    the code they run."""
    spec = getattr(module, "__spec__", None)
    if spec is None or spec.origin != "frozen":
        return None
    import _imp

    try:
        module_code = _imp.get_frozen_object(module.__name__)
    except ImportError:
        return None
    found = [c for c in _nested_codes(module_code) if c.co_qualname == qualname]
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


# ---------------------------------------------------------------------------
# What the live function names
# ---------------------------------------------------------------------------


# A global container is read this far for the modules of what it holds.
_CONTAINER_ITEMS_READ = 256


def _modules_of_callables_in(container) -> set[str]:
    """The modules of the functions and classes a global dict, list or tuple
    holds (its first _CONTAINER_ITEMS_READ items)."""
    items = container.values() if isinstance(container, dict) else container
    return {
        item.__module__
        for item in itertools.islice(items, _CONTAINER_ITEMS_READ)
        if isinstance(item, (types.FunctionType, type)) and isinstance(item.__module__, str)
    }


def _compiled_module(fn) -> Optional[torch.nn.Module]:
    """The module this package compiles: torch.compile(module), or
    module.compile() / torch.compile(module.forward), which compile a bound
    method of the module (generate() then runs the compiled module)."""
    if isinstance(fn, torch.nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


def _modules_named_by_live_function(fn) -> Optional[set]:
    """The modules the compiled function's globals (and, for a module, its
    submodules' classes and the functions they hold) name: the only ones an
    entry may run in. A global container (transformers' ROPE_INIT_FUNCTIONS,
    a dict of functions a rotary embedding picks from) names the modules of
    the functions and classes it holds. None when the function is not known
    yet (aot_compile checks after the load)."""
    if fn is None:
        return None
    names = {"torch._dynamo.external_utils"}  # the inline wrapper's frame
    holders = [fn]
    module = _compiled_module(fn)
    if module is not None:
        for m in module.modules():
            holders.append(type(m).forward)
            names.add(type(m).__module__)
            names |= {
                value.__module__
                for value in vars(m).values()
                if isinstance(value, types.FunctionType) and isinstance(value.__module__, str)
            }
    seen_globals: set[int] = set()
    for holder in holders:
        holder = getattr(holder, "__func__", holder)
        f_globals = getattr(holder, "__globals__", None) or {}
        own = f_globals.get("__name__") or getattr(holder, "__module__", None)
        if isinstance(own, str):
            names.add(own)
        if id(f_globals) in seen_globals:
            # Submodules of one class (32 Linear layers) share one module's
            # globals: read each once (a load calls this for every entry).
            continue
        seen_globals.add(id(f_globals))
        for value in f_globals.values():
            owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            if isinstance(owner, str):
                names.add(owner)
            elif type(value) in (dict, list, tuple):
                names |= _modules_of_callables_in(value)
    return names


def _live_function_globals(fn) -> dict[str, dict]:
    """The globals the compiled function (and, for a module, its submodules'
    forwards) run with, by module name. Usually the module's own dict; not
    under torch.multiprocessing.spawn, where the user's script runs in a
    namespace of runpy's that sys.modules["__mp_main__"] only copies: the
    bytecode's globals go where its frame reads them."""
    holders = [fn]
    module = _compiled_module(fn)
    if module is not None:
        holders += [type(m).forward for m in module.modules()]
    found: dict[str, dict] = {}
    for holder in holders:
        f_globals = getattr(getattr(holder, "__func__", holder), "__globals__", None)
        if isinstance(f_globals, dict) and isinstance(f_globals.get("__name__"), str):
            found.setdefault(f_globals["__name__"], f_globals)
    return found


# ---------------------------------------------------------------------------
# Upstream's cache entry data: codes, sources, system
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InlinedSource:
    """A function Dynamo inlined into a saved frame, and its source's hash."""

    module: str
    firstlineno: int
    lastlineno: int
    checksum: str


@dataclasses.dataclass
class SourceInfo:
    """The sources a package's entries were traced from (checked at load)."""

    inlined_sources: set[InlinedSource] = dataclasses.field(default_factory=set)

    def add_code(self, code: types.CodeType) -> None:
        self.add_record(inlined_code_record(code))

    def add_record(self, record: tuple) -> None:
        """Add an inlined function's record (torch/_dynamo/package_sources.py)
        when it holds the hash of its source lines, read the way a load reads
        them, so that an unchanged file always hashes the same."""
        _, module, _, _, first, last, digest = record
        if digest.startswith("lines:"):
            self.inlined_sources.add(
                InlinedSource(module=module, firstlineno=first, lastlineno=last, checksum=digest.removeprefix("lines:"))
            )

    def check_unchanged(self) -> None:
        """RuntimeError naming the first inlined source that changed since save."""
        for source in sorted(self.inlined_sources, key=dataclasses.astuple):
            module = sys.modules.get(source.module)
            current = _module_lines(module, source.firstlineno, source.lastlineno)
            if current is None or _sha256("".join(current).encode()) != source.checksum:
                raise RuntimeError(
                    f"Source code changes detected for {source.module} "
                    f"(line {source.firstlineno} - line {source.lastlineno})"
                )

    def as_fields(self) -> list[list]:
        return [list(dataclasses.astuple(s)) for s in sorted(self.inlined_sources, key=dataclasses.astuple)]

    @classmethod
    def from_fields(cls, fields, where) -> SourceInfo:
        if not isinstance(fields, list) or not all(
            isinstance(f, list)
            and len(f) == 4
            and isinstance(f[0], str)
            and isinstance(f[1], int)
            and isinstance(f[2], int)
            and isinstance(f[3], str)
            for f in fields
        ):
            raise PackageError(f"package {where}: its manifest's inlined_sources are malformed")
        return cls({InlinedSource(*f) for f in fields})


def _module_lines(module, first: int, last: int) -> Optional[list[str]]:
    """Lines first..last of ``module``'s source as it is now on disk."""
    lines = read_module_lines(getattr(module, "__file__", None))
    if lines is None or last > len(lines):
        return None
    return lines[first - 1 : last]


@dataclasses.dataclass(frozen=True)
class SystemInfo:
    """The Python, torch and accelerator a package was saved with."""

    python_version: str
    torch_version: str
    toolkit_version: Optional[str]
    gpu_name: Optional[str]
    CHECK_GPUS = ("cuda", "xpu")

    @classmethod
    def current(cls) -> SystemInfo:
        import platform

        gpu_name = toolkit_version = None
        for device_type in cls.CHECK_GPUS:
            device_module = getattr(torch, device_type, None)
            if device_module is not None and device_module.is_available():
                gpu_name = device_module.get_device_name()
                toolkit_version = getattr(torch.version, device_type, None)
                break
        # The release, as the manifest records it (_environment): the patched
        # wheel's local version (+overlay...) and CUDA tag do not change the format.
        return cls(platform.python_version(), str(torch.__version__).split("+")[0], toolkit_version, gpu_name)

    def check_compatibility(self, other: SystemInfo, device_type: str = "cpu") -> None:
        """RuntimeError (upstream's wording) when ``other`` cannot load what
        ``self`` saved on ``device_type``."""
        if self.python_version != other.python_version:
            raise RuntimeError(
                f"Compile package was created with a different Python version: {self.python_version}"
            )
        if self.torch_version != other.torch_version:
            raise RuntimeError(
                f"Compile package was created with a different PyTorch version: {self.torch_version}"
            )
        if device_type in self.CHECK_GPUS:
            if not getattr(torch, device_type).is_available():
                raise RuntimeError(f"{device_type} is not available")
            if self.toolkit_version != other.toolkit_version:
                raise RuntimeError(
                    f"Compile package was created with a different toolkit version: {self.toolkit_version}"
                )
            if self.gpu_name is not None and self.gpu_name != other.gpu_name:
                raise RuntimeError(
                    f"Compile package was created with different GPU: cached={self.gpu_name}, "
                    f"current={other.gpu_name}"
                )


@functools.lru_cache(maxsize=1024)
def _resume_ref_fingerprint(data: bytes) -> str:
    """The fingerprint of the resume function a global reference holds (the
    key of that function's own entries: NOTE: [Keys of package entries])."""
    return code_fingerprint(load_code(data, "a resume function"))


@dataclasses.dataclass
class _DynamoCodeCacheEntry:
    """One code Dynamo compiled under a package (upstream's name and fields):
    the module whose globals it runs in; the global names its callers reach it
    by (a resume function, which a load installs as a global of that module:
    install_to_global); its entries (guarded_codes: bytecode and guards, or
    Dynamo's decision to skip it, NOTE: [Frames Dynamo skips]); the modules its
    bytecode names and the graphs (backend ids) it calls. A bypassed code is
    saved without its entries: a fresh process compiles it again."""

    code_key: tuple
    python_module: str
    function_names: list[str]
    guarded_codes: list[_Entry]
    import_sources: dict[str, str]
    backend_ids: list[str]
    install_to_global: bool
    code_source: Optional[str] = None
    has_compile_id: bool = True
    bypassed: bool = False


def _codes_of_entries(entries: list[_Entry], root_qualnames: frozenset = frozenset()) -> list[_DynamoCodeCacheEntry]:
    """``entries`` grouped by the code they were compiled for, in order. A code
    of ``root_qualnames`` (the compiled callable's own) has no function name,
    as upstream's main code has none."""
    names_by_fingerprint: dict[str, list[str]] = {}
    for entry in entries:
        for name, ref in entry.globals.items():
            if ref[0] == "resume":
                names = names_by_fingerprint.setdefault(_resume_ref_fingerprint(ref[2]), [])
                if name not in names:
                    names.append(name)
    codes: dict[tuple, _DynamoCodeCacheEntry] = {}
    for entry in entries:
        key = tuple(entry.code_key)
        code = codes.get(key)
        if code is None:
            if key[0] == "resume":
                names = list(names_by_fingerprint.get(key[2], []))
            elif key[0] == "function" and key[2] not in root_qualnames:
                names = [key[2]]
            else:
                names = []
            code = codes[key] = _DynamoCodeCacheEntry(
                code_key=key,
                python_module=entry.global_module,
                function_names=names,
                guarded_codes=[],
                import_sources={},
                backend_ids=[],
                install_to_global=key[0] == "resume" and bool(names),
            )
        code.guarded_codes.append(entry)
        for name, ref in entry.globals.items():
            if ref[0] == "graph" and ref[1] not in code.backend_ids:
                code.backend_ids.append(ref[1])
            elif ref[0] == "module":
                code.import_sources[name] = ref[1]
    return list(codes.values())


def _bypassed_codes(manifest: dict, where) -> list[_DynamoCodeCacheEntry]:
    """The codes a package was saved without (its manifest's bypassed_codes)."""
    keys = manifest.get("bypassed_codes", [])
    if not (
        isinstance(keys, list)
        and all(
            isinstance(key, list)
            and len(key) == 3
            and key[0] in _CODE_KEY_KINDS
            and all(isinstance(part, str) for part in key)
            for key in keys
        )
    ):
        raise PackageError(f"package {where}: its manifest's bypassed_codes are malformed")
    return [
        _DynamoCodeCacheEntry(
            code_key=tuple(key),
            python_module=key[1] if key[0] != "resume" else "",
            function_names=[],
            guarded_codes=[],
            import_sources={},
            backend_ids=[],
            install_to_global=False,
            bypassed=True,
        )
        for key in keys
    ]
