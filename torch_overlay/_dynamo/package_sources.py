"""What each entry of a compile package was derived from, checked at load.

A compile package's entry is Dynamo's bytecode for one frame and the graphs it
calls. Both were produced from code and settings of the saving process: the
frame's own code, every function Dynamo inlined into it, and the configuration
that steers tracing and code generation. This module records those, per
entry, when the entry is compiled, and tells a load which entries were derived
from something the loading process no longer has (NOTE: [What an entry was
derived from]).

Provides :func:`code_fingerprint` (a digest of everything a code object runs),
:func:`frame_code_record`, :func:`inlined_code_record` and
:func:`config_records` (the records an entry saves), :func:`check_source_records`
(their shape, for the package reader) and :class:`LiveSources` (a load's view
of the live code and configuration, which names what changed).
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
import types
from typing import Any, Callable, Optional


log = logging.getLogger(__name__)

# NOTE: [What an entry was derived from]
# Entries are found at load by the code they run for ((module, qualname) of a
# function, the fingerprint of a resume function), and their guards check the
# values a frame runs with. Neither says whether the code that was traced is
# the code the loading process runs: a model file edited between save and
# load (a changed constant in forward, an edited helper Dynamo inlined) would
# otherwise run the old code's graph. So every entry records what its bytecode
# and graphs were derived from, as records of seven fields
# (kind, module, qualname, filename, firstlineno, lastlineno, digest):
# - "code": the frame's own code, for an entry keyed by function name: the
#   fingerprint of its code object (bytecode, constants, names, line table).
#   A resume function's entry is keyed by that fingerprint already.
# - "inlined": each function Dynamo inlined into the frame (closures and
#   helpers it called, methods of submodules, torch's own functions): the
#   sha256 of its source lines as the file on disk holds them now. A function
#   without a source file (code run with ``python -c``, a dataclass's generated
#   ``__init__``) records the fingerprint of its code instead, found again by
#   name: its function's module and qualname (generated_code_owner), or its
#   qualname in the module the entry runs in.
# - "config": each configuration value, other than its default, that changes
#   what is traced or generated without a guard that would see it:
#   Dynamo's tracing switches (_DYNAMO_TRACED_CONFIG: what is captured and how
#   it is decomposed, not the shape decisions, which the guards hold); for
#   graphs of AOTAutograd backends the functorch config, and for Inductor's the
#   Inductor config, each as the FX graph cache and AOTAutogradCache key them
#   (save_config_portable), less the switches that only steer caching,
#   debugging and tracing output (_NOT_CODEGEN). torch.compile's mode= and
#   options= are recorded with the package (NOTE: [Compile options in
#   packages]); global state Dynamo guards (grad mode, default dtype,
#   deterministic algorithms) is in the guards.
# Module globals a frame reads are in its guards (their values or identities).
#
# At load, an entry any of whose records differs from the live process is
# dropped: one warning per package names each changed function (module,
# qualname, file:lines) or config value, and says that its frames will
# compile; the package's other entries load. With config.strict_precompile
# (NOTE: [One strict flag]) it is a PackageError naming the same. A record
# that cannot be checked (no source to read, a function no longer found) drops
# its entry too: a package never runs bytecode traced from other source.

CODE = "code"
INLINED = "inlined"
CONFIG = "config"
_KINDS = (CODE, INLINED, CONFIG)
# A record's fields after its kind: module, qualname, filename, first and last
# line, digest.
_FIELD_TYPES = (str, str, str, str, int, int, str)

# Dynamo switches that change what a frame's graph captures, with no guard
# that would see the change.
_DYNAMO_TRACED_CONFIG = (
    "allow_empty_graphs",
    "allow_rnn",
    "capture_autograd_function",
    "capture_dynamic_output_shape_ops",
    "capture_func_transforms",
    "capture_scalar_outputs",
    "capture_sparse_compute",
    "dead_code_elimination",
    "do_not_emit_runtime_asserts",
    "enable_trace_contextlib",
    "guard_nn_modules",
    "inline_inbuilt_nn_modules",
    "numpy_default_complex",
    "numpy_default_float",
    "numpy_default_int",
    "optimize_ddp",
    "prefer_deferred_runtime_asserts_over_guards",
    "rewrite_assert_with_torch_assert",
    "skip_fsdp_hooks",
    "trace_numpy",
    "use_graph_deduplication",
    "use_numpy_random_stream",
)
# Words in the names of functorch and Inductor switches that only steer
# caching, debugging and tracing output, never the code generated.
_NOT_CODEGEN = ("cache", "debug", "trace.", "test", "visualize", "pareto", "graph_format", "verbose")


def _const_token(value) -> bytes:
    """A byte string for a code constant that is the same in every process."""
    if isinstance(value, types.CodeType):
        return b"code:" + code_fingerprint(value).encode()
    if isinstance(value, tuple):
        return b"(" + b",".join(_const_token(v) for v in value) + b")"
    if isinstance(value, frozenset):
        # Iteration order of a frozenset of str follows the process's randomized str hashing.
        return b"{" + b",".join(sorted(_const_token(v) for v in value)) + b"}"
    return f"{type(value).__name__}:{value!r}".encode()


_fingerprints: Any = None


def code_fingerprint(code: types.CodeType) -> str:
    """A digest of everything a code object runs: equal digests, same code."""
    global _fingerprints
    if _fingerprints is None:
        from torch._dynamo.utils import ExactWeakKeyDictionary

        _fingerprints = ExactWeakKeyDictionary()
    found = _fingerprints.get(code)
    if found is not None:
        return found
    digest = hashlib.sha256()
    for field in (
        code.co_name,
        code.co_qualname,
        code.co_filename,
        code.co_firstlineno,
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_nlocals,
        code.co_stacksize,
        code.co_flags,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
        code.co_cellvars,
    ):
        digest.update(repr(field).encode() + b"\0")
    for raw in (code.co_code, code.co_linetable, getattr(code, "co_exceptiontable", b"")):
        digest.update(raw + b"\0")
    digest.update(_const_token(code.co_consts))
    found = digest.hexdigest()[:32]
    _fingerprints[code] = found
    return found


def _last_line(code: types.CodeType) -> int:
    return max((line for _, _, line in code.co_lines() if line is not None), default=code.co_firstlineno)


def _sha256_lines(lines: list[str]) -> str:
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def read_module_lines(path: Optional[str]) -> Optional[list[str]]:
    """The lines of the source file ``path`` as it is now on disk."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            return f.readlines()
    except (OSError, UnicodeDecodeError):
        return None


def _source_file(code: types.CodeType) -> tuple[Optional[str], Optional[str]]:
    """(module name, source file) of ``code`` when it was read from a file."""
    import inspect

    module = inspect.getmodule(code)
    path = getattr(module, "__file__", None)
    if module is None or not path:
        return None, None
    return module.__name__, path


_owners: Any = None


def generated_code_owner(code: types.CodeType) -> Optional[tuple[str, str]]:
    """(module, qualname) that find the function running ``code`` again, for
    code compiled from a string whose own qualname cannot (a dataclass's
    ``__init__``, ``__create_fn__.<locals>.__init__``, is found as
    ``Class.__init__``); None when no such name leads back to it."""
    global _owners
    if _owners is None:
        import weakref

        _owners = weakref.WeakKeyDictionary()
    if code in _owners:
        return _owners[code]
    import gc

    owner = None
    for ref in gc.get_referrers(code):
        if not (isinstance(ref, types.FunctionType) and ref.__code__ is code):
            continue
        module, qualname = ref.__module__, ref.__qualname__
        if not isinstance(module, str) or "<" in qualname:
            continue
        obj: Any = sys.modules.get(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if getattr(obj, "__func__", obj) is ref:
            owner = (module, qualname)
            break
    _owners[code] = owner
    return owner


def frame_code_record(code: types.CodeType, module_name: str) -> tuple:
    """The record of an entry's own code (a function found by name)."""
    return (
        CODE,
        module_name or "",
        code.co_qualname,
        code.co_filename,
        code.co_firstlineno,
        _last_line(code),
        code_fingerprint(code),
    )


def inlined_code_record(code: types.CodeType) -> tuple:
    """The record of a function Dynamo inlined: its source lines' hash, or
    for a function without a source file, its code's fingerprint."""
    first, last = code.co_firstlineno, _last_line(code)
    module_name, path = _source_file(code)
    lines = read_module_lines(path)
    if module_name is not None and lines is not None and last <= len(lines):
        digest = "lines:" + _sha256_lines(lines[first - 1 : last])
        return (INLINED, module_name, code.co_qualname, code.co_filename, first, last, digest)
    module_name, qualname = generated_code_owner(code) or frozen_code_owner(code) or ("", code.co_qualname)
    return (INLINED, module_name, qualname, code.co_filename, first, last, "code:" + code_fingerprint(code))


def frozen_code_owner(code: types.CodeType) -> Optional[tuple[str, str]]:
    """(module, qualname) of code from a module frozen into the interpreter
    (``os`` on Python 3.11: co_filename ``<frozen os>``), which has no source
    file to hash: its functions, local ones too (the encoder and decoder of
    ``os.environ``, ``_createenviron.<locals>.encode``), are found again by
    module and qualname and compared by their code's fingerprint."""
    filename = code.co_filename
    if not (filename.startswith("<frozen ") and filename.endswith(">")):
        return None
    module_name = filename[len("<frozen ") : -1]
    if module_name not in sys.modules:
        return None
    return module_name, code.co_qualname


def _portable_repr(value) -> str:
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(_portable_repr(v) for v in value)) + "}"
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}.{value.__qualname__}"
    return repr(value)


def _config_values(module_name: str, names: Optional[tuple]) -> tuple[str, dict[str, str]]:
    """The digest of ``module_name``'s config values, and those of them that
    are not their defaults, by name. (A default read from the environment is
    only in the digest.)"""
    config = importlib.import_module(module_name)
    entries = config._config
    if names is None:
        names = tuple(
            name
            for name in config.save_config_portable()
            if not any(word in name for word in _NOT_CODEGEN)
        )
    digest = hashlib.sha256()
    not_default = {}
    for name in sorted(names):
        entry = entries.get(name)
        if entry is None or getattr(entry, "alias", None) is not None:
            continue
        value = _portable_repr(getattr(config, name))
        digest.update(f"{name}={value}\0".encode())
        if value != _portable_repr(entry.default):
            not_default[name] = value
    return "sha256:" + digest.hexdigest()[:32], not_default


# The config modules an entry records, with the names it records of each
# (None: the module's portable config less _NOT_CODEGEN).
_CONFIG_NAMES: dict[str, Optional[tuple]] = {
    "torch._dynamo.config": _DYNAMO_TRACED_CONFIG,
    "torch._functorch.config": None,
    "torch._inductor.config": None,
}


def _config_modules(backend_kind: Optional[str]) -> list[str]:
    """The config modules whose values an entry of ``backend_kind`` records."""
    modules = ["torch._dynamo.config"]
    if backend_kind in ("aot_eager", "inductor"):
        modules.append("torch._functorch.config")
    if backend_kind == "inductor":
        modules.append("torch._inductor.config")
    return modules


def config_records(backend_kind: Optional[str]) -> list[tuple]:
    """The records of the config values an entry compiled now is derived from."""
    records = []
    for module_name in _config_modules(backend_kind):
        digest, not_default = _config_values(module_name, _CONFIG_NAMES[module_name])
        records.append((CONFIG, module_name, "", "", 0, 0, digest))
        # The values a change is named by.
        for name, value in sorted(not_default.items()):
            records.append((CONFIG, module_name, name, "", 0, 0, value))
    return records


def check_source_records(records: Any) -> bool:
    """Whether ``records`` (read from a package) has the records' shape."""
    return isinstance(records, tuple) and all(
        isinstance(r, tuple)
        and len(r) == len(_FIELD_TYPES)
        and r[0] in _KINDS
        and all(type(v) is t for v, t in zip(r, _FIELD_TYPES))
        for r in records
    )


def describe_record(record: tuple) -> str:
    kind, module, qualname, filename, first, last, _ = record
    if kind == CONFIG:
        return f"{module}.{qualname}"
    return f"{module or '?'}.{qualname} ({filename}:{first}-{last})"


class LiveSources:
    """A load's view of the live code and config: which records still hold.

    Each source file is read and each line range hashed once, and each config
    module's values computed once per load, however many entries name them."""

    def __init__(self, resolve_code: Callable[[str, str], Optional[types.CodeType]]) -> None:
        # (module, qualname) -> the live code object of that function, or None.
        self._resolve_code = resolve_code
        self._lines: dict[str, Optional[list[str]]] = {}
        self._digests: dict[tuple[str, int, int], Optional[str]] = {}
        self._configs: dict[str, tuple[str, dict[str, str]]] = {}

    def _module_lines(self, module_name: str) -> Optional[list[str]]:
        if module_name not in self._lines:
            module = sys.modules.get(module_name)
            self._lines[module_name] = read_module_lines(getattr(module, "__file__", None))
        return self._lines[module_name]

    def _lines_digest(self, module_name: str, first: int, last: int) -> Optional[str]:
        """The digest of lines first..last of the module's file now (once per
        range and load: entries share the functions they inline)."""
        key = (module_name, first, last)
        if key not in self._digests:
            lines = self._module_lines(module_name)
            self._digests[key] = (
                None if lines is None or last > len(lines) else "lines:" + _sha256_lines(lines[first - 1 : last])
            )
        return self._digests[key]

    def _live_config(self, module_name: str) -> Optional[tuple[str, dict[str, str]]]:
        if module_name not in self._configs:
            if module_name not in _CONFIG_NAMES:
                return None
            self._configs[module_name] = _config_values(module_name, _CONFIG_NAMES[module_name])
        return self._configs[module_name]

    def changes(self, records: tuple, entry_module: str) -> list[str]:
        """What differs between ``records`` (one entry's) and this process,
        one line each; empty when the entry was derived from what runs here."""
        changed = []
        saved_digests: dict[str, str] = {}
        saved_values: dict[str, dict[str, str]] = {}
        for record in records:
            kind, module, qualname, _, first, last, digest = record
            if kind == CONFIG:
                if qualname:
                    saved_values.setdefault(module, {})[qualname] = digest
                else:
                    saved_digests[module] = digest
                continue
            why = self._code_change(kind, module or entry_module, qualname, first, last, digest)
            if why is not None:
                changed.append(f"{describe_record(record)}: {why}")
        for module, saved_digest in sorted(saved_digests.items()):
            live = self._live_config(module)
            if live is None:
                changed.append(f"{module}: not a config module of this process")
                continue
            live_digest, live_values = live
            if live_digest == saved_digest:
                continue
            saved = saved_values.get(module, {})
            named = [
                f"config {module}.{name}: saved with {saved.get(name, 'its default')}, "
                f"now {live_values.get(name, 'its default')}"
                for name in sorted(set(saved) | set(live_values))
                if saved.get(name) != live_values.get(name)
            ]
            changed.extend(named or [f"config {module}: a value set from the environment differs"])
        return changed

    def _code_change(
        self, kind: str, module: str, qualname: str, first: int, last: int, digest: str
    ) -> Optional[str]:
        if digest.startswith("lines:"):
            live_digest = self._lines_digest(module, first, last)
            if live_digest is None:
                return "its source file cannot be read"
            return "its source changed" if live_digest != digest else None
        live = self._resolve_code(module, qualname)
        if live is None:
            return "no such function in this process"
        expected = digest.removeprefix("code:")
        if code_fingerprint(live) != expected:
            return "its code changed"
        return None
