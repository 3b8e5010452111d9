"""Compile package artifacts: compiled graphs, their kernels, and the files they go in.

What a :class:`~torch._dynamo.package.CompilePackage` writes for each graph its
backend compiled, and how it turns those bytes back into callables in a fresh
process; then the package's files: the manifest that is checked before anything
is unpickled, the directory written atomically, and the one-file archive
(aot_compile's format).

Provides :func:`serialize_graph` / :func:`deserialize_graph` (eager, aot_eager,
Inductor and custom-backend graphs), the packaged graph callables
(:class:`_PackagedInductorGraph`, :class:`_PackagedAOTEagerGraph`), the kernel
redirect that loads packaged CPU kernels instead of compiling them, and
:func:`read_manifest` / :func:`check_manifest` / :func:`write_archive` /
:func:`read_archive`.
"""

# NOTE: [Package format]
# <dir>/manifest.json       read and checked before anything is unpickled:
#                           format version, torch version, overlay series hash,
#                           Python version, CPU capability, device, and the sha256
#                           of every other file
# <dir>/dynamo.bin          the entries: builtin containers only (read with an
#                           unpickler that resolves no global at all)
# <dir>/graphs/<name>.bin   one backend artifact per compiled graph
# <dir>/kernels/<h>.so      Inductor's compiled CPU kernels, by the hash of their
#                           (cache-dir independent) source
# A save writes a sibling temporary directory and renames it into place, so a
# crashed save never leaves a half package.
#
# NOTE: [Loading Inductor graphs without compiling]
# An Inductor graph is saved as its AOTAutograd cache entry with the forward and
# backward CompiledFxGraphs embedded (2.7.1's entries only hold FX-graph-cache
# keys), plus the kernel binaries the graphs' wrapper code loads. At load the
# wrapper code runs with kernel loading redirected to the package's binaries, so
# neither the C++ compiler nor Inductor's CPU ISA probe runs; the CPU capability
# recorded at save is checked instead.

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import io
import enum
import inspect
import json
import logging
import marshal
import os
import pickle
import platform
import re
import shutil
import sys
import tempfile
import types
from pathlib import Path
from typing import Any, Callable, cast, Optional

import torch
from torch._dynamo.exc import PackageError
from torch.utils.weak import WeakIdKeyDictionary

from .package_format import (
    DYNAMO_FILE as _DYNAMO_FILE,
    MANIFEST,
    PACKAGE_FORMAT_VERSION,
    SIGNATURE_FILE,
)
from .package_trust import (
    kernel_copies_dir,
    load_graph_pickle,
    load_inductor_payload,
    remove_kernel_copies,
    remove_kernel_copies_with,
)


log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------
# Bytecode with constants marshal cannot write
# ---------------------------------------------------------------------------

# NOTE: [Constants of compiled bytecode]
# Dynamo writes into the bytecode it generates, with LOAD_CONST, every value it
# deems a safe constant (utils.is_safe_constant in 2.7.1): marshal's own types,
# plus torch.Size, torch.device, torch.dtype, torch.layout, torch.memory_format,
# torch.finfo/iinfo, enum members (torch.nn.attention.SDPBackend...), classes,
# slices, NotImplemented, and tuples/frozensets of any of these. Found by
# tracing the serving models (GPT-2 and Llama with a DynamicCache, greedy
# decode, dynamic=True, aot_eager; prompt, decode steps, a legacy-tuple cache):
#   torch.Size([1, 1]), device(type='cpu')  GPT-2's GPT2Model.forward, compiled
#       on its own after a graph break (a shape and a device Dynamo rebuilds
#       after the graph: the outputs' view and new_ones calls);
#   the context-manager target values of resume functions (grad mode bools,
#       autocast device types and dtypes) and the index constants of sources
#       (ints, slices) come from the same codegen paths;
#   the no-argument function PyCodegen.pop_null loads to pop a NULL off the
#       stack (it is called and its None popped), in the resume path of a frame
#       that graph-breaks inside an inlined call (DeepSeek-V3's MoE block). It is
#       saved as its kind ("pop_null") and loaded as _popped_null, a function of
#       the same behaviour.
# marshal writes none of the torch types. Such a code object is saved as
# _CODE_WITH_CONSTANTS followed by marshal of (code, table): in the code each such
# constant is None, and the table says where each goes (a path of indices
# through co_consts, nested code objects included) and what it is, as builtin
# values tagged with one of _CONSTANT_KINDS. Loading rebuilds a constant only
# from that allow-list, each from plain data (a torch.Size from ints, a dtype
# looked up by name in torch's namespace and checked to be a dtype, an enum
# member or class looked up in the namespace of a module already imported,
# with no attribute hooks run); anything else is a PackageError. The bytes of a
# code object whose constants marshal writes are unchanged: marshal's own.
# Kinds Dynamo may also write but that have no meaning in another process
# (typing aliases, CUDA device properties) are refused at save, naming the type.
_CODE_WITH_CONSTANTS = b"\0torch-package-code-constants-1\0"
_MAX_CONSTANT_DEPTH = 16


def _is_marshallable(value) -> bool:
    try:
        marshal.dumps(value)
    except ValueError:
        return False
    return True


def _named_class_path(cls: type) -> Optional[tuple[str, str]]:
    """(module, qualname) that finds ``cls`` again by namespace lookups only."""
    module, qualname = getattr(cls, "__module__", None), getattr(cls, "__qualname__", None)
    if not (isinstance(module, str) and isinstance(qualname, str)) or "<" in qualname:
        return None
    return (module, qualname) if _namespace_lookup(module, qualname) is cls else None


def _namespace_lookup(module: str, qualname: str):
    """``module.qualname`` by dict lookups in an imported module's namespace and
    its classes' ``__dict__`` (never importing, never running ``__getattr__``)."""
    obj: Any = sys.modules.get(module)
    if obj is None:
        return None
    for part in qualname.split("."):
        namespace = vars(obj) if isinstance(obj, (types.ModuleType, type)) else None
        if namespace is None or part not in namespace:
            return None
        obj = namespace[part]
    return obj


def _encode_constant(value, depth: int = 0) -> tuple:
    """``value`` as builtin data tagged with its kind (NOTE: [Constants of
    compiled bytecode]); a PackageError names a type that cannot be saved."""
    if depth > _MAX_CONSTANT_DEPTH:
        raise PackageError("a constant of its bytecode nests too deeply")
    cls = type(value)
    if cls is torch.Size:
        return ("size", tuple(int(v) for v in value))
    if cls is torch.device:
        return ("device", value.type, value.index)
    if cls in (torch.dtype, torch.layout, torch.memory_format):
        name = str(value).rpartition(".")[2]
        if vars(torch).get(name) is not value:
            raise PackageError(f"its bytecode holds {value!r}, which is not torch.{name}")
        return (cls.__name__, name)
    if cls in (torch.finfo, torch.iinfo):
        return (cls.__name__, str(value.dtype).rpartition(".")[2])
    if cls in (tuple, frozenset):
        items = tuple(_encode_constant(v, depth + 1) for v in value)
        return (cls.__name__, items)
    if cls is slice:
        return ("slice", tuple(_encode_constant(v, depth + 1) for v in (value.start, value.stop, value.step)))
    if value is NotImplemented:
        return ("NotImplemented",)
    if isinstance(value, enum.Enum):
        where = _named_class_path(cls)
        if where is not None and cls.__members__.get(value.name) is value:
            return ("enum", *where, value.name)
        raise PackageError(f"its bytecode holds {value!r}, a member of an enum with no stable name")
    if isinstance(value, type):
        where = _named_class_path(value)
        if where is not None:
            return ("class", *where)
        raise PackageError(f"its bytecode holds the class {value.__qualname__}, which has no stable name")
    if _is_pop_null_function(value):
        return ("pop_null",)
    if _is_marshallable(value):
        return ("const", value)
    raise PackageError(
        f"its bytecode holds a constant of type {cls.__module__}.{cls.__qualname__}, which "
        "a package cannot save"
    )


def _popped_null() -> None:
    """What a loaded bytecode calls where Dynamo's PyCodegen.pop_null put its
    own no-argument function (NOTE: [Constants of compiled bytecode])."""
    return None


def _is_pop_null_function(value) -> bool:
    """Whether ``value`` is the function PyCodegen.pop_null writes into bytecode."""
    code = getattr(value, "__code__", None)
    return (
        isinstance(value, types.FunctionType)
        and value.__module__ == "torch._dynamo.codegen"
        and value.__qualname__ == "PyCodegen.pop_null.<locals>.<lambda>"
        and value.__closure__ is None
        and not value.__defaults__
        and code is not None
        and code.co_argcount == 0
        and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        and code.co_names == ()
        and code.co_consts in ((None,), ())
    )


def _decode_constant(data, depth: int = 0):
    """The constant ``data`` encodes, rebuilt only from _CONSTANT_KINDS."""
    if depth > _MAX_CONSTANT_DEPTH:
        raise PackageError("a constant nests too deeply")
    if not (isinstance(data, tuple) and data and isinstance(data[0], str)):
        raise PackageError(f"a constant is malformed: {str(data)[:80]}")
    kind, fields = data[0], data[1:]
    shape = _CONSTANT_KINDS.get(kind)
    if shape is None or len(fields) != len(shape) or not all(
        isinstance(f, t) for f, t in zip(fields, shape)
    ):
        raise PackageError(f"a constant is malformed: {str(data)[:80]}")
    if kind == "size":
        if not all(type(v) is int for v in fields[0]):
            raise PackageError("a torch.Size constant holds something other than ints")
        return torch.Size(fields[0])
    if kind == "device":
        if fields[1] is not None and type(fields[1]) is not int:
            raise PackageError("a torch.device constant has a malformed index")
        try:
            return torch.device(fields[0]) if fields[1] is None else torch.device(fields[0], fields[1])
        except Exception as e:
            raise PackageError(f"a torch.device constant is malformed: {e!r}"[:200]) from e
    if kind in ("dtype", "layout", "memory_format", "finfo", "iinfo"):
        wanted = torch.dtype if kind in ("finfo", "iinfo") else getattr(torch, kind)
        value = vars(torch).get(fields[0])
        if type(value) is not wanted:
            raise PackageError(f"a {kind} constant names {fields[0][:40]!r}, which is not one")
        if kind == "finfo":
            return torch.finfo(cast(torch.dtype, value))
        if kind == "iinfo":
            return torch.iinfo(cast(torch.dtype, value))
        return value
    if kind in ("tuple", "frozenset"):
        items = tuple(_decode_constant(v, depth + 1) for v in fields[0])
        return items if kind == "tuple" else frozenset(items)
    if kind == "slice":
        if len(fields[0]) != 3:
            raise PackageError("a slice constant is malformed")
        return slice(*(_decode_constant(v, depth + 1) for v in fields[0]))
    if kind == "NotImplemented":
        return NotImplemented
    if kind == "pop_null":
        return _popped_null
    if kind == "const":
        if type(fields[0]) not in _MARSHAL_LEAF_TYPES:
            raise PackageError(f"a constant is a {type(fields[0]).__name__}")
        return fields[0]
    found = _namespace_lookup(fields[0], fields[1])
    if kind == "class":
        if not isinstance(found, type):
            raise PackageError(f"a class constant names {fields[0][:80]}.{fields[1][:80]}, not an imported class")
        return found
    # enum
    member = found.__members__.get(fields[2]) if isinstance(found, enum.EnumMeta) else None
    if member is None:
        raise PackageError(f"an enum constant names {fields[0][:80]}.{fields[1][:80]}.{fields[2][:40]}, not a member")
    return member


# kind -> the types of its fields (checked before anything is rebuilt).
_CONSTANT_KINDS: dict[str, tuple[type, ...]] = {
    "size": (tuple,),
    "device": (str, object),
    "dtype": (str,),
    "layout": (str,),
    "memory_format": (str,),
    "finfo": (str,),
    "iinfo": (str,),
    "tuple": (tuple,),
    "frozenset": (tuple,),
    "slice": (tuple,),
    "NotImplemented": (),
    "pop_null": (),
    "const": (object,),
    "class": (str, str),
    "enum": (str, str, str),
}
_MARSHAL_LEAF_TYPES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))


# NOTE: [Replayed random calls]
# A frame that calls Python's ``random`` (random.uniform(0, 1) in MusicGen's
# LayerDrop, evaluated even in eval mode) is traced by Dynamo with each call's
# value as a graph input: the bytecode calls a function it installs as the
# global __gen_rand_values_<n> before the graph, which makes the same calls
# again, in order, and returns their values (OutputGraph.random_calls, the
# function torch._dynamo.output_graph._get_gen_rand_values_fn makes, under
# torch._dynamo.disable). That function is a closure, which no name finds
# again; it is saved as what it is, its list of calls, each as data:
# (name, args, kwargs) with the name one of the functions of ``random`` that
# Dynamo replays (random.random, randint, randrange, uniform: methods of the
# module's shared generator) and the arguments constant ints, floats or bools.
# A load rebuilds the function (_replay_random_calls, the same loop, under
# torch._dynamo.disable as Dynamo's) from those calls, each function looked up
# again in the loading process's ``random``. Saving
# checks the function is that closure under that disable wrapper and each
# call is one of those functions, by identity; anything else (a method of a
# random.Random object Dynamo traced, whose calls replay a captured state)
# keeps the entry out. Loading refuses, with a PackageError, any other name or
# argument type before anything runs.
_RANDOM_FUNCTIONS = ("random", "randint", "randrange", "uniform")
_RANDOM_ARGUMENT_TYPES = (bool, int, float)
_MAX_RANDOM_CALLS = 4096


def _dynamo_random_values_code() -> Optional[tuple[types.CodeType, types.CodeType]]:
    """The code of the function Dynamo installs to replay random calls, and of
    the disable wrapper around it; None before Dynamo has traced anything."""
    # Taken from the imported module: importing torch._dynamo.output_graph on
    # its own, before Dynamo's entry points, is a circular import.
    output_graph = sys.modules.get("torch._dynamo.output_graph")
    make = getattr(output_graph, "_get_gen_rand_values_fn", None)
    if make is None:
        return None
    inner = make([])
    return inner.__code__, torch._dynamo.disable(inner).__code__


def _replay_random_calls(calls: list) -> Callable[[], list]:
    """A function making ``calls`` (function, args, kwargs) in order and
    returning their values: what Dynamo's random-values function does."""

    def replay_random_calls() -> list:
        return [fn(*args, **kwargs) for fn, args, kwargs in calls]

    return replay_random_calls


def random_calls_as_data(value) -> tuple:
    """The calls Dynamo's random-values function ``value`` replays, as data
    (NOTE: [Replayed random calls]); a PackageError says why it cannot be saved."""
    import random

    codes = _dynamo_random_values_code()
    inner = getattr(value, "__wrapped__", None)
    if codes is None:
        raise PackageError("Dynamo has not made a function to replay random calls in this process")
    inner_code, wrapper_code = codes
    if not (
        isinstance(value, types.FunctionType)
        and value.__code__ is wrapper_code
        and isinstance(inner, types.FunctionType)
        and inner.__code__ is inner_code
        and inner.__closure__ is not None
        and len(inner.__closure__) == 1
    ):
        raise PackageError("it is not the function Dynamo makes to replay random calls")
    calls = inner.__closure__[0].cell_contents
    if not isinstance(calls, list):
        raise PackageError("its random calls are not a list")
    saved = []
    for fn, args, kwargs in calls:
        name = next((n for n in _RANDOM_FUNCTIONS if vars(random).get(n) is fn), None)
        if name is None:
            raise PackageError(
                f"it replays {getattr(fn, '__qualname__', type(fn).__name__)}, not one of the "
                f"functions of the random module ({', '.join(_RANDOM_FUNCTIONS)})"
            )
        values = [*args, *kwargs.values()]
        if not all(type(v) in _RANDOM_ARGUMENT_TYPES for v in values):
            raise PackageError(f"it calls random.{name} with an argument that is not an int, float or bool")
        saved.append((name, tuple(args), tuple(sorted(kwargs.items()))))
    return tuple(saved)


def random_values_function(data, what: str) -> Callable[[], list]:
    """The function replaying the random calls ``data`` records, built by the
    loading process (NOTE: [Replayed random calls]); PackageError for a call
    that is not one of the allowed functions with constant arguments."""
    import random

    if not (isinstance(data, tuple) and 0 < len(data) <= _MAX_RANDOM_CALLS):
        raise PackageError(f"{what}: its random calls are malformed")
    calls = []
    for call in data:
        if not (
            isinstance(call, tuple)
            and len(call) == 3
            and isinstance(call[0], str)
            and isinstance(call[1], tuple)
            and isinstance(call[2], tuple)
        ):
            raise PackageError(f"{what}: a random call is malformed")
        name, args, kwargs = call
        if name not in _RANDOM_FUNCTIONS:
            raise PackageError(
                f"{what}: a random call names {name[:80]!r}, not one of the functions of the "
                f"random module a package replays ({', '.join(_RANDOM_FUNCTIONS)})"
            )
        if not all(isinstance(kv, tuple) and len(kv) == 2 and isinstance(kv[0], str) for kv in kwargs):
            raise PackageError(f"{what}: the keyword arguments of a call of random.{name} are malformed")
        if not all(type(v) in _RANDOM_ARGUMENT_TYPES for v in (*args, *(v for _, v in kwargs))):
            raise PackageError(f"{what}: a call of random.{name} has an argument that is not an int, float or bool")
        fn = vars(random).get(name)
        if not callable(fn):
            raise PackageError(f"{what}: random.{name} is not a function in this process")
        calls.append((fn, args, dict(kwargs)))
    return torch._dynamo.disable(_replay_random_calls(calls))


def dump_code(code: types.CodeType) -> bytes:
    """``code`` as bytes a package holds (NOTE: [Constants of compiled bytecode]);
    a PackageError names a constant that cannot be saved."""
    try:
        return marshal.dumps(code)
    except ValueError:
        pass
    table: list[tuple] = []

    def strip(c: types.CodeType, path: tuple) -> types.CodeType:
        consts = list(c.co_consts)
        for i, const in enumerate(consts):
            if isinstance(const, types.CodeType):
                consts[i] = strip(const, (*path, i))
            elif not _is_marshallable(const):
                table.append(((*path, i), _encode_constant(const)))
                consts[i] = None
        return c.replace(co_consts=tuple(consts))

    stripped = strip(code, ())
    return _CODE_WITH_CONSTANTS + marshal.dumps((stripped, tuple(table)))


def load_code(data: bytes, what: str) -> types.CodeType:
    """The code object of ``dump_code``'s bytes; anything malformed (damaged
    bytes, a constant outside the allow-list, a table that points nowhere) is a
    PackageError, before any constant is used."""
    with_constants = data.startswith(_CODE_WITH_CONSTANTS)
    try:
        loaded = marshal.loads(data[len(_CODE_WITH_CONSTANTS) :] if with_constants else data)
    except Exception as e:
        raise PackageError(f"{what}: its bytecode is damaged: {e!r}"[:400]) from e
    if not with_constants:
        if not isinstance(loaded, types.CodeType):
            raise PackageError(f"{what}: its bytecode is a {type(loaded).__name__}, not a code object")
        return loaded
    if not (
        isinstance(loaded, tuple)
        and len(loaded) == 2
        and isinstance(loaded[0], types.CodeType)
        and isinstance(loaded[1], tuple)
    ):
        raise PackageError(f"{what}: its bytecode with constants is malformed")
    code, table = loaded
    placed: dict[tuple, Any] = {}
    for item in table:
        if not (
            isinstance(item, tuple)
            and len(item) == 2
            and isinstance(item[0], tuple)
            and 0 < len(item[0]) <= _MAX_CONSTANT_DEPTH
            and all(type(i) is int and i >= 0 for i in item[0])
        ) or item[0] in placed:
            raise PackageError(f"{what}: a constant of its bytecode is malformed")
        try:
            placed[item[0]] = _decode_constant(item[1])
        except PackageError as e:
            raise PackageError(f"{what}: {e}") from e

    def fill(c: types.CodeType, path: tuple) -> types.CodeType:
        consts = list(c.co_consts)
        for i, const in enumerate(consts):
            if isinstance(const, types.CodeType):
                consts[i] = fill(const, (*path, i))
            elif (*path, i) in placed:
                if const is not None:
                    raise PackageError(f"{what}: a constant of its bytecode is placed over another")
                consts[i] = placed.pop((*path, i))
        return c.replace(co_consts=tuple(consts))

    filled = fill(code, ())
    if placed:
        raise PackageError(f"{what}: a constant of its bytecode is placed where there is none")
    return filled


# NOTE: [SerializedCode]
# Upstream's picklable form of a code object (torch._dynamo.package.SerializedCode):
# a frozen dataclass of the code's fields in the order types.CodeType takes them
# (bytecode_transformation.get_code_keys), nested code objects among the
# constants turned into SerializedCode too. Conversions are cached by the
# identity of what is converted, never by its hash: a code object or a
# SerializedCode may hold an unhashable constant (a dict), and equal code objects
# compiled in different places must not share one conversion. A package stores
# code as dump_code's bytes, which check every constant at load; SerializedCode
# is for code that pickles, as upstream uses it.
_SERIALIZED_CODE_CACHE = WeakIdKeyDictionary()


def _code_keys() -> list[str]:
    from torch._dynamo.bytecode_transformation import get_code_keys

    return get_code_keys()


@dataclasses.dataclass(frozen=True)
class SerializedCode:
    """A code object as a picklable dataclass (NOTE: [SerializedCode])."""

    co_argcount: int
    co_posonlyargcount: int
    co_kwonlyargcount: int
    co_nlocals: int
    co_stacksize: int
    co_flags: int
    co_code: bytes
    co_consts: tuple[Any, ...]
    co_names: tuple[str, ...]
    co_varnames: tuple[str, ...]
    co_filename: str
    co_name: str
    co_firstlineno: int
    co_cellvars: tuple[str, ...]
    co_freevars: tuple[str, ...]
    co_linetable: Optional[bytes] = None
    co_qualname: Optional[str] = None
    co_exceptiontable: Optional[bytes] = None
    co_lnotab: Optional[str] = None

    @classmethod
    def from_code_object(cls, code: types.CodeType) -> SerializedCode:
        """``code`` (and the code objects among its constants) as SerializedCode."""
        cache = _SERIALIZED_CODE_CACHE
        cached = cache.get(code)
        if cached is not None:
            return cached
        fields = {key: getattr(code, key) for key in _code_keys()}
        fields["co_consts"] = tuple(
            cls.from_code_object(c) if isinstance(c, types.CodeType) else c
            for c in code.co_consts
        )
        serialized = cls(**fields)
        cache[code] = serialized
        return serialized

    @classmethod
    def to_code_object(cls, serialized_code: SerializedCode) -> types.CodeType:
        """The code object ``serialized_code`` describes."""
        cache = _SERIALIZED_CODE_CACHE
        cached = cache.get(serialized_code)
        if cached is not None:
            return cached
        fields = {key: getattr(serialized_code, key) for key in _code_keys()}
        fields["co_consts"] = tuple(
            cls.to_code_object(c) if isinstance(c, SerializedCode) else c
            for c in serialized_code.co_consts
        )
        code = types.CodeType(*fields.values())
        cache[serialized_code] = code
        return code


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def overlay_series_hash() -> str:
    """The patch series this torch carries, as its backport build reports it
    (``torch._dynamo._backport_build``, present only in a backport build), or "none"."""
    try:
        from torch._dynamo._backport_build import series_hash
    except ImportError:
        return "none"
    return series_hash()


def _environment() -> dict:
    return {
        "torch_version": str(torch.__version__).split("+")[0],
        "python_version": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "machine": platform.machine(),
    }


# ---------------------------------------------------------------------------
# Backend artifacts
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _GraphRecord:
    """What a package keeps of one graph compiled by its backend."""

    backend: str
    gm: Any
    devices: tuple = ()
    aot_cache_key: Optional[str] = None
    aot_config: Optional[dict] = None
    aot_entry: Any = None
    # A custom backend's compiled callable: saved through its class's
    # serialize_compile_artifacts (see NOTE: [Custom backend artifacts]).
    compiled: Any = None
    # The torch.compile options the graph was compiled with (NOTE: [Compile
    # options in packages]), and whether Inductor compiled it with freezing on
    # (under no_grad that folds its weights into constants).
    options: dict = dataclasses.field(default_factory=dict)
    freezing: bool = False
    frozen_under_no_grad: bool = False
    # What the compile of a frozen graph left behind (NOTE: [Frozen graphs in
    # packages]); filled by package_recording.py's _AOTCompileListener.
    frozen: Optional[_FrozenCapture] = None
    # The CPU kernels (argument types, C++ source) Inductor loaded while it
    # compiled the graph (See NOTE: [Kernels of a packaged graph]).
    cpp_kernels: list = dataclasses.field(default_factory=list)

    def note_cpp_kernel(self, code_cache: type, argtypes: list[str], source_code: str) -> None:
        """Inductor's prebuilt-kernel lookup while the graph compiles: records
        each CPU kernel its wrapper code loads, and lets Inductor build it."""
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        if code_cache is CppPythonBindingsCodeCache:
            self.cpp_kernels.append((list(argtypes), source_code))
        return None


_CUSTOM_BACKEND = "custom:"


# NOTE: [Custom backend artifacts]
# A backend other than eager / aot_eager / inductor is saved the way upstream
# saves every backend's output: its compiled callable must be an instance of
# torch._dynamo.aot_compile_types.SerializableCallable, whose class turns it into
# bytes (serialize_compile_artifacts(fn)) and back into a callable
# (deserialize_compile_artifacts(data)). The artifact names the class by module
# and qualified name, so the class must be importable where the package loads
# (defined at module level); the bytes are the class's own business.


def _backend_name(kind: str) -> str:
    return kind[len(_CUSTOM_BACKEND) :]


def _serialize_custom_graph(record: _GraphRecord) -> bytes:
    from torch._dynamo.aot_compile_types import SerializableCallable

    compiled = record.compiled
    cls = type(compiled)
    if not isinstance(compiled, SerializableCallable):
        raise PackageError(
            f"Compiled function type {cls} (produced from backend "
            f"{_backend_name(record.backend)!r}) does not implement SerializableCallable: "
            "return an instance of a torch._dynamo.aot_compile_types.SerializableCallable "
            "subclass from the backend to save its graphs"
        )
    if "<locals>" in cls.__qualname__ or _import_class(cls.__module__, cls.__qualname__) is not cls:
        raise PackageError(
            f"the compiled function class {cls.__module__}.{cls.__qualname__} of backend "
            f"{_backend_name(record.backend)!r} cannot be imported by name: define it at "
            "module level so that loading can find its deserialize_compile_artifacts"
        )
    try:
        artifacts = cls.serialize_compile_artifacts(compiled)
    except Exception as e:
        raise PackageError(
            f"{cls.__qualname__}.serialize_compile_artifacts failed: {e!r}"
        ) from e
    if not isinstance(artifacts, (bytes, bytearray)):
        raise PackageError(
            f"{cls.__qualname__}.serialize_compile_artifacts returned "
            f"{type(artifacts).__name__}, not bytes"
        )
    return pickle.dumps(
        {
            "backend": record.backend,
            "callable_class": (cls.__module__, cls.__qualname__),
            "artifacts": bytes(artifacts),
        }
    )


def _import_class(module_name: str, qualname: str):
    """The object ``module_name.qualname`` names in a module this process has
    already imported; a package never makes the loader import a module by name."""
    if not (isinstance(module_name, str) and isinstance(qualname, str)):
        return None
    obj: Any = sys.modules.get(module_name)
    if obj is None or "<" in qualname:
        return None
    for part in qualname.split("."):
        if part.startswith("__"):
            return None
        obj = getattr(obj, part, None)
    return obj


def _deserialize_custom_graph(payload: dict, name: str = "<graph>"):
    from torch._dynamo.aot_compile_types import SerializableCallable

    callable_class = payload.get("callable_class")
    if not (
        isinstance(callable_class, tuple)
        and len(callable_class) == 2
        and all(isinstance(part, str) for part in callable_class)
        and isinstance(payload.get("artifacts"), bytes)
    ):
        raise PackageError(f"packaged graph {name}: its custom backend artifact is malformed")
    module_name, qualname = callable_class
    cls = _import_class(module_name, qualname)
    if not (isinstance(cls, type) and issubclass(cls, SerializableCallable)):
        raise PackageError(
            f"the graph of backend {_backend_name(payload['backend'])!r} was saved by "
            f"{module_name[:100]}.{qualname[:100]}, which is not a SerializableCallable "
            "of a module this process has imported (import the backend's module before "
            "loading: a package never imports a module by name)"
        )
    if cls.__module__ == "torch" or cls.__module__.startswith("torch."):
        # torch's own serializable callables pickle graphs: their bytes pass the
        # graph allow-list first (the same bytes then unpickle the same globals).
        load_graph_pickle(payload["artifacts"], f"graph {name} ({cls.__qualname__})")
    try:
        return cls.deserialize_compile_artifacts(payload["artifacts"])
    except PackageError:
        raise
    except Exception as e:
        raise PackageError(
            f"packaged graph {name}: {cls.__qualname__}.deserialize_compile_artifacts "
            f"failed: {e!r}"[:600]
        ) from e


# NOTE: [Kernels of a packaged graph]
# A package carries the shared library of every CPU kernel its Inductor graphs
# load, and a loaded graph never runs gcc. The list is taken where Inductor
# makes it: while the package's backend compiles a graph (forward and
# backward), Inductor's prebuilt-kernel hook (NOTE: [Prebuilt CPU kernels] in
# torch/_inductor/codecache.py) hears every kernel request the graph's wrapper
# code makes, whether Inductor generated the code just now or read it from its
# caches; _GraphRecord.note_cpp_kernel records each and lets Inductor build it
# as usual. The save writes each kernel's library under its hash and the
# graph's list of hashes; the load checks that the package holds every kernel
# on the list, and while the graph is rebuilt the package's redirect answers
# each request the code makes, refusing one the package does not hold. cpp_wrapper's
# generated C++ wrapper module is not a kernel: it is built again at load.


# Kernels include Inductor's prefix header by its absolute path in the cache dir.
_ABSOLUTE_INCLUDE = re.compile(r'#include\s*"/[^"]*/([^"/]+)"')


def kernel_hash(argtypes, source_code: str) -> str:
    """Identity of a CPU kernel that does not depend on the inductor cache dir."""
    normalized = _ABSOLUTE_INCLUDE.sub(r'#include "\1"', source_code)
    return _sha256(repr(list(argtypes)).encode() + b"\0" + normalized.encode())


# NOTE: [Extern kernels of packaged graphs]
# Generated wrapper code calls ATen kernels as ``extern_kernels.<name>``, a
# namespace Inductor fills by importing its lowering modules (seconds). A graph
# is saved with the kernels its code names, each only if pickling gives back
# the very same object (builtins such as torch.addmm), and the loader
# registers them before the code runs; any other name fills the namespace on
# first use, the way a compile would.
_EXTERN_KERNEL_NAME = re.compile(r"\bextern_kernels\.(\w+)")


def _extern_kernels(*graph_blobs: Optional[bytes]) -> dict[str, Any]:
    """The picklable extern kernels the graphs' wrapper code calls, by name."""
    from torch._inductor.select_algorithm import extern_kernels

    kernels = {}
    for blob in graph_blobs:
        if blob is None:
            continue
        for name in set(_EXTERN_KERNEL_NAME.findall(pickle.loads(blob).source_code)):
            kernel = vars(extern_kernels).get(name)
            try:
                if kernel is not None and pickle.loads(pickle.dumps(kernel)) is kernel:
                    kernels[name] = kernel
            except Exception:
                log.debug("package: extern kernel %s is not picklable", name)
    return kernels


def _register_extern_kernels(kernels: dict[str, Any]) -> None:
    from torch._inductor.runtime.runtime_utils import extern_kernels

    for name, kernel in kernels.items():
        vars(extern_kernels).setdefault(name, kernel)


def _compiled_fx_graph_blob(key: str) -> bytes:
    from torch._inductor.codecache import FxGraphCache

    directory = FxGraphCache._get_tmp_dir_for_key(key)
    if not os.path.isdir(directory):
        raise PackageError(f"FX graph cache entry {key} is missing from {directory}")
    candidates = sorted(
        (os.path.join(directory, f) for f in os.listdir(directory)),
        key=os.path.getmtime,
    )
    if not candidates:
        raise PackageError(f"FX graph cache entry {key} is empty")
    # The newest candidate is the one this process's compile wrote or read.
    with open(candidates[-1], "rb") as f:
        return f.read()


def _kernel_binaries(record: _GraphRecord) -> dict[str, bytes]:
    """The shared library of every CPU kernel ``record``'s graphs load, by hash."""
    from torch._inductor.codecache import CppPythonBindingsCodeCache

    binaries = {}
    for argtypes, source in record.cpp_kernels:
        digest = kernel_hash(argtypes, source)
        if digest in binaries:
            continue
        kernel = CppPythonBindingsCodeCache.load_pybinding(argtypes, source)
        module = getattr(kernel, "__self__", None)
        path = getattr(module, "__file__", None)
        if not path or not os.path.exists(path):
            raise PackageError(f"compiled kernel binary for {argtypes} not found")
        with open(path, "rb") as f:
            binaries[digest] = f.read()
    return binaries


# NOTE: [View replay in packaged AOTAutograd entries]
# With config.view_replay_for_aliased_outputs (on outside fbcode), an output
# that aliases an input or an intermediate keeps, in its OutputAliasInfo, the
# FunctionalTensor it was traced as (functional_tensor, a
# FunctionalTensorMetadataEq; collect_metadata_analysis.py), so that the
# runtime can replay its view chain on the real base. That tensor wraps a
# FakeTensor and has no storage: it cannot be pickled, and 2.7.1's
# AOTAutogradCache refuses such entries (check_metadata_cacheable) while the
# compile listener still hands them to the package. A graph as small as
# `input_ids.view(-1, n)` before a graph break (GPT-2 decoding from a
# legacy-tuple cache) has one. Upstream records a picklable ViewMetaSequence
# instead, a C++ binding 2.7.1 lacks, and drops it where it cannot be replayed
# (symbolic views). The package drops it: a loaded graph regenerates such an
# output from its base with _view_func or as_strided (gen_alias_from_base),
# which is what 2.7.1 itself runs with view replay off (make_runtime_safe).
# The live entry is not touched; a copy is pickled.
def _without_view_replay(meta):
    """``meta`` (a ViewAndMutationMeta), or a copy of it whose outputs carry no
    FunctionalTensor to replay views from (NOTE: [View replay in packaged
    AOTAutograd entries])."""
    if meta is None or not any(
        getattr(o, "functional_tensor", None) is not None for o in meta.output_info
    ):
        return meta
    meta = copy.copy(meta)
    meta.output_info = [
        dataclasses.replace(o, functional_tensor=None) for o in meta.output_info
    ]
    return meta


def _entry_bytes(entry) -> bytes:
    """The pickled AOTAutogradCacheEntry, less what cannot be pickled."""
    if entry.__dict__.get("_serialized") is None:
        meta = _without_view_replay(entry.runtime_metadata)
        sub = entry.maybe_subclass_meta
        sub_meta = _without_view_replay(getattr(sub, "fw_metadata", None))
        if meta is not entry.runtime_metadata or (
            sub is not None and sub_meta is not sub.fw_metadata
        ):
            entry = copy.copy(entry)
            entry.runtime_metadata = meta
            if sub is not None and sub_meta is not sub.fw_metadata:
                entry.maybe_subclass_meta = copy.copy(sub)
                entry.maybe_subclass_meta.fw_metadata = sub_meta
    return entry.serialize() if hasattr(entry, "serialize") else pickle.dumps(entry)


def serialize_graph(record: _GraphRecord) -> tuple[bytes, dict[str, bytes]]:
    """The artifact of one graph and the kernel binaries it needs."""
    if record.backend in ("eager", "aot_eager"):
        nodes = _fx_graph_as_data(record.gm)
        if nodes is not None:
            return pickle.dumps({"backend": record.backend, "graph": nodes}), {}
        return pickle.dumps({"backend": record.backend, "gm": record.gm}), {}
    if record.backend.startswith(_CUSTOM_BACKEND):
        return _serialize_custom_graph(record), {}
    if record.backend != "inductor":
        raise PackageError(f"backend {record.backend!r} artifacts cannot be packaged")
    if record.freezing:
        return _serialize_frozen_graph(record)
    entry = record.aot_entry
    if entry is None:
        raise PackageError(
            "AOTAutograd did not write a cache entry for it (keep "
            "torch._functorch.config.enable_autograd_cache on; graphs AOTAutograd "
            "cannot cache, e.g. with higher-order ops, cannot be packaged)"
        )
    fw_blob = _compiled_fx_graph_blob(entry.compiled_fw.fx_graph_cache_key)
    bw_blob = (
        _compiled_fx_graph_blob(entry.compiled_bw.fx_graph_cache_key)
        if entry.compiled_bw is not None
        else None
    )
    kernels = _kernel_binaries(record)
    payload = {
        "entry": _entry_bytes(entry),
        "fw_graph": fw_blob,
        "bw_graph": bw_blob,
        "aot_config": record.aot_config,
        "cpp_kernels": sorted(kernels),
    }
    return _inductor_artifact(record, payload), kernels


def _inductor_artifact(record: _GraphRecord, payload: dict) -> bytes:
    """An Inductor graph's artifact: ``payload`` (its entry and compiled graphs)
    with the graph module's parameters, the CPU ISA and the extern kernels."""
    from torch._inductor.codecache import pick_vec_isa

    payload = {
        "backend": "inductor",
        **payload,
        "params": {
            name: t.detach()
            for name, t in [
                *record.gm.named_parameters(remove_duplicate=False),
                *record.gm.named_buffers(remove_duplicate=False),
            ]
        },
        "vec_isa": str(pick_vec_isa()),
        "extern_kernels": _extern_kernels(payload["fw_graph"], payload["bw_graph"]),
    }
    buf = io.BytesIO()
    torch.save(payload, buf)
    return buf.getvalue()


# NOTE: [Frozen graphs in packages]
# Under torch.no_grad() with Inductor's freezing on, compile_fx hands the
# AOTAutograd inference graph to fw_compiler_freezing: the parameters Dynamo
# marked static become constants (folded: conv+bn, transposed or packed linear
# weights), the graph is compiled without them, and a wrapper passes only the
# arguments that were kept (preserved_arg_indices). 2.7.1's AOTAutograd cache
# bypasses every graph compiled with freezing on, and its FX graph cache
# stores a frozen graph's constants by NAME only (taking the values from the
# graph module at load), so neither cache holds what a package needs. While
# the backend compiles a graph with freezing on, the package's AOTAutograd
# compile listener (NOTE: [AOTAutograd compile listeners]) records what
# AOTAutograd and the freezing compiler built (AOTAutograd's
# config, dispatch wrappers and runtime metadata, the frozen graph module and
# the freezing wrapper); the package then saves an AOTAutograd inference
# entry, written the way aot_dispatch_base would write one, whose forward is
# the frozen CompiledFxGraph with its constants VALUES and the kept argument
# indices. At load the entry's post-compile wrappers are rebuilt as for any
# packaged Inductor graph, around the frozen graph with its saved constants.
#
# Inductor's cpp.weight_prepack (on by default on CPU) would turn the folded
# conv and linear weights into MKLDNN tensors, opaque and unserializable: a
# frozen graph a package records is compiled with it off (NOTE: [Weight
# prepacking in frozen packages] in package_recording.py). Refused at save, naming why:
# a frozen graph whose constants are MKLDNN tensors all the same (the user set
# cpp.weight_prepack explicitly, or the process registered Inductor's packing
# passes at an earlier frozen compile with prepack on), a frozen graph of
# tensor subclasses, and freezing in grad mode (Inductor does not freeze
# there, and AOTAutograd keeps no entry).
#
# Upstream 2.13 packages no frozen graph: its AOTAutograd cache, which its
# precompile saves graphs through, bypasses every graph compiled with freezing
# on ("Cannot cache a graph with freezing enabled"), and its FX graph cache
# keeps a frozen graph's constants by name, taking their values from the live
# graph module. Its config.caching_precompile drops every ID_MATCH guard (on
# any object, with a warning, in the compiling process too) and checks
# nothing in its place.
#
# NOTE: [Parameters of frozen packages]
# A frozen graph computes with the parameter values it was saved with. Dynamo
# freezes the parameters of the module it compiles as attributes of its graph
# and guards each by identity (ID_MATCH), which a fresh process cannot check
# (a tensor has no name another process could find it by). The package
# replaces those guards by a check of its own: the guard_filter_fn the package
# gives each frame it records (package.py's _with_frozen_parameter_filter,
# applied after the user's) drops the ID_MATCH guards on exactly the
# parameters and buffers of the compiled module (sources L['self']...) that a
# frozen graph of that frame folded, and the package records the values they
# were folded from, by their path under the module. Loading compares them
# with the module the package is loaded for (CompilePackage's compiled
# module: dtype, shape and values): any difference and the load is refused
# with a PackageError naming the parameter, never a silently wrong result.
# A parameter REPLACED by an equal one loads (the identity a fresh process
# re-establishes is "the module's live parameter at that path, with the
# saved value"). What is not seen, in the saving process as in a loading
# one: a parameter changed after the compile or load, in place (freezing's
# contract, as without a package) or, since its identity guard is gone, by
# replacement. A folded parameter reached other than through the compiled
# module (a global module's) keeps its ID_MATCH guard, so its entry is left
# out at save, with a warning. An aot_compile'd function has no module at load
# (the module is the first argument of each call): its frozen graphs are
# checked against the module a call passes, at the first call with that module
# (AOTCompiledFunction._check_frozen_module); a module whose folded values
# differ is refused there, with the same PackageError.


@dataclasses.dataclass
class _FrozenCapture:
    """What compiling one graph with freezing on left behind, for its package."""

    aot_config: Any = None
    dispatch_wrappers: Any = None
    maybe_subclass_meta: Any = None
    fw_metadata: Any = None
    frozen_gm: Any = None
    freezing_wrapper: Any = None
    # Dynamo graph attribute -> the source it was read from (L['self']...).
    param_sources: dict = dataclasses.field(default_factory=dict)
    # Inductor's cpp.weight_prepack while the freezing compiler ran.
    weight_prepack: bool = False


def _freezing_wrapper_state(wrapper) -> dict[str, Any]:
    """The compiled graph and kept-argument bookkeeping fw_compiler_freezing's
    wrapper closes over (2.7.1's names)."""
    names = ("optimized_function", "preserved_arg_indices", "unwrapped_args_offsets", "max_offset_idx")
    code = getattr(wrapper, "__code__", None)
    cells = dict(zip(code.co_freevars, wrapper.__closure__ or ())) if code else {}
    if any(name not in cells for name in names):
        raise PackageError(
            "options={'freezing': True}: Inductor's freezing compiler returned "
            f"{type(wrapper).__name__}, not the wrapper this torch's packages know"
        )
    return {name: cells[name].cell_contents for name in names}


def _frozen_constants(capture: _FrozenCapture, graph) -> dict[str, torch.Tensor]:
    from torch._inductor.output_code import CompiledFxGraphConstantsWithGm

    constants = CompiledFxGraphConstantsWithGm(capture.frozen_gm).unwrap(graph)
    packed = sorted(name for name, t in constants.items() if t.is_mkldnn)
    if packed or getattr(graph, "_fx_graph_cache_key", None) is None:
        reason = "Inductor's FX graph cache did not store it"
        if packed and capture.weight_prepack:
            reason = (
                f"its constants {', '.join(packed)} are MKLDNN tensors (Inductor option "
                "cpp.weight_prepack, set explicitly, packs weights on CPU), which cannot be "
                "serialized; leave cpp.weight_prepack unset (a package compiles frozen "
                "graphs without it) to package it"
            )
        elif packed:
            reason = (
                f"its constants {', '.join(packed)} are MKLDNN tensors although "
                "cpp.weight_prepack was off for this compile: Inductor registers its "
                "weight-packing passes once per process, at the first frozen compile with "
                "cpp.weight_prepack on, and applies them from then on; save the package from "
                "a process that compiled no frozen graph with weight prepack before"
            )
        raise PackageError(f"options={{'freezing': True}}: the frozen graph cannot be packaged: {reason}")
    return {name: t.detach() for name, t in constants.items()}


def _serialize_frozen_graph(record: _GraphRecord) -> tuple[bytes, dict[str, bytes]]:
    """A frozen Inductor graph (NOTE: [Frozen graphs in packages])."""
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCacheEntry, CompiledForward

    capture = record.frozen
    if capture is None or capture.freezing_wrapper is None or capture.aot_config is None:
        raise PackageError("options={'freezing': True}: the frozen graph's compile was not recorded")
    if capture.maybe_subclass_meta is not None:
        raise PackageError(
            "options={'freezing': True}: a frozen graph of tensor subclasses cannot be packaged"
        )
    state = _freezing_wrapper_state(capture.freezing_wrapper)
    graph = state.pop("optimized_function")
    constants = _frozen_constants(capture, graph)
    entry = AOTAutogradCacheEntry(
        compiled_fw=CompiledForward(graph._fx_graph_cache_key),
        compiled_bw=None,
        aot_joint_graph_str=None,
        aot_forward_graph_str=None,
        aot_backward_graph_str=None,
        runtime_metadata=capture.fw_metadata,
        dispatch_wrappers=capture.dispatch_wrappers,
        maybe_subclass_meta=None,
        num_fw_outs_saved_for_bw=None,
        indices_of_inps_to_detach=[],
        forward_time_taken_ns=0,
        backward_time_taken_ns=0,
    )
    fw_blob = _compiled_fx_graph_blob(graph._fx_graph_cache_key)
    kernels = _kernel_binaries(record)
    payload: dict[str, Any] = {
        "entry": pickle.dumps(entry),
        "fw_graph": fw_blob,
        "bw_graph": None,
        "aot_config": _aot_config_fields(capture.aot_config),
        "frozen": {**state, "constants": constants, "parameters": _frozen_parameters(record)},
        "cpp_kernels": sorted(kernels),
    }
    return _inductor_artifact(record, payload), kernels


def _aot_config_fields(aot_config) -> dict:
    """The AOTConfig fields a packaged graph's post-compile wrappers read."""
    return {
        "num_params_buffers": aot_config.num_params_buffers,
        "keep_inference_input_mutations": aot_config.keep_inference_input_mutations,
        "is_export": aot_config.is_export,
        "no_tangents": aot_config.no_tangents,
        "dynamic_shapes": aot_config.dynamic_shapes,
        "static_input_indices": aot_config.static_input_indices,
        "pre_dispatch": aot_config.pre_dispatch,
    }


class _FrozenForward:
    """fw_compiler_freezing's wrapper again: the frozen graph called with the
    arguments it kept (boxed, as AOTAutograd calls it)."""

    def __init__(self, graph, preserved_arg_indices, unwrapped_args_offsets, max_offset_idx) -> None:
        # An instance attribute: AOTAutograd's wrappers copy __dict__ (functools.wraps).
        self._boxed_call = True
        self.graph = graph
        self.preserved_arg_indices = preserved_arg_indices
        self.unwrapped_args_offsets = unwrapped_args_offsets
        self.max_offset_idx = max_offset_idx

    def __call__(self, args: list) -> Any:
        offsets, last = self.unwrapped_args_offsets, self.max_offset_idx
        kept = [args[i - offsets[min(i, last)]] for i in self.preserved_arg_indices]
        args.clear()
        return self.graph(kept)


_LOCAL_ROOT = re.compile(r"^L\['(\w+)'\]")
_SOURCE_STEP = re.compile(r"^(?:\._(?:modules|parameters|buffers)\['([\w.]+)'\]|\.(\w+))")


def _module_path(source_name: str) -> Optional[str]:
    """``L['self']._modules['conv']._parameters['weight']`` -> ``conv.weight``:
    the path of a parameter under the compiled module, or None."""
    root = _LOCAL_ROOT.match(source_name)
    if root is None:
        return None
    rest, parts = source_name[root.end() :], []
    while rest:
        step = _SOURCE_STEP.match(rest)
        if step is None:
            return None
        parts.append(step.group(1) or step.group(2))
        rest = rest[step.end() :]
    return ".".join(parts) or None


def _frozen_parameters(record: _GraphRecord) -> dict[str, torch.Tensor]:
    """The values the frozen constants were folded from, by their path under the
    compiled module (NOTE: [Parameters of frozen packages])."""
    assert record.frozen is not None
    sources = record.frozen.param_sources
    parameters = {}
    for name, t in [
        *record.gm.named_parameters(remove_duplicate=False),
        *record.gm.named_buffers(remove_duplicate=False),
    ]:
        path = _module_path(sources.get(name, ""))
        if path is None:
            raise PackageError(
                f"options={{'freezing': True}}: the frozen graph folded {sources.get(name, name)}, "
                "which is not a parameter or buffer of the compiled module; a loaded package "
                "could not check it against the module it runs for"
            )
        parameters[path] = t.detach()
    return parameters


def folded_parameters(graph) -> dict[str, torch.Tensor]:
    """The saved values a loaded frozen graph's constants were folded from, by
    their path under the module; empty for a graph that folded none."""
    frozen = getattr(graph, "payload", {}).get("frozen")
    return frozen["parameters"] if frozen is not None else {}


def check_frozen_parameters(graph, module: Optional[torch.nn.Module], name: str) -> None:
    """Refuse a frozen graph whose folded parameters differ from ``module``'s
    (NOTE: [Parameters of frozen packages])."""
    parameters = folded_parameters(graph)
    if not parameters:
        return
    if module is None:
        raise PackageError(
            f"packaged graph {name} is frozen (options={{'freezing': True}}) and this load "
            "has no module to check its parameters against: load it with "
            "torch.compile(module, package=...).load_package()"
        )
    live: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
    live.update(module.named_buffers(remove_duplicate=False))
    for path, value in parameters.items():
        current = live.get(path)
        if (
            current is None
            or current.shape != value.shape
            or current.dtype != value.dtype
            or not torch.equal(current.detach(), value)
        ):
            raise PackageError(
                f"packaged graph {name} was frozen (options={{'freezing': True}}) from other "
                f"values of {path!r} than the module it was loaded for has: its constants were "
                "folded from the saved values; compile again (and save a new package) after "
                "changing parameters"
            )



class _KernelRedirect:
    """The packaged CPU kernels a graph loads instead of compiling them."""

    def __init__(self, kernel_paths: dict[str, str]) -> None:
        self.kernel_paths = kernel_paths

    def lookup(self, code_cache: type, argtypes: list[str], source_code: str) -> Optional[str]:
        """Inductor's prebuilt-kernel lookup (NOTE: [Prebuilt CPU kernels] in
        torch/_inductor/codecache.py): the packaged library of a kernel."""
        from torch._inductor.codecache import CppPythonBindingsCodeCache

        path = self.kernel_paths.get(kernel_hash(argtypes, source_code))
        if path is None and code_cache is not CppPythonBindingsCodeCache:
            # cpp_wrapper: the graph's C++ wrapper module (CppWrapperCodeCache)
            # is built again at load, as documented; kernels never are.
            log.info("package: building a cpp_wrapper graph's C++ wrapper module")
            return None
        if path is None:
            # A packaged graph only runs the kernels its package verified
            # (deserialize_graph checks the list at load); never gcc.
            raise PackageError(
                f"packaged graph needs kernel {kernel_hash(argtypes, source_code)}, "
                "which its package does not hold"
            )
        return path

    @contextlib.contextmanager
    def active(self, vec_isa: Optional[str]):
        """While a packaged graph loads: its kernels come from the package, and
        the vector ISA they were built for (``vec_isa``, recorded at save; the
        manifest check compared the CPU) is taken without Inductor's probe.
        Both hooks hold for this block and this thread only."""
        from torch._inductor import config as inductor_config
        from torch._inductor.codecache import prebuilt_cpp_kernels
        from torch._inductor.cpu_vec_isa import recorded_vec_isa

        with prebuilt_cpp_kernels(self.lookup), recorded_vec_isa(vec_isa):
            with inductor_config.patch(compile_threads=1):
                yield


def _graph_from_blob(blob: bytes, constants, example_inputs, fx_config, extern_kernel_refs, redirect, vec_isa):
    """A packaged CompiledFxGraph made runnable: unpickled, its extern kernels
    registered, its kernels loaded from the package (redirect, for the vector
    ISA ``vec_isa`` they were built for), post-compiled."""
    from torch._inductor.output_code import CompiledFxGraph

    graph = load_graph_pickle(blob, "compiled graph")
    if not isinstance(graph, CompiledFxGraph):
        raise PackageError(f"packaged compiled graph is a {type(graph).__name__}, not a CompiledFxGraph")
    _register_extern_kernels(extern_kernel_refs)
    with redirect.active(vec_isa):
        graph.after_deserialization(constants)
    graph.post_compile(example_inputs, fx_config["cudagraphs"], constants)
    return graph


def _frozen_loadable(original, blob: bytes, frozen: dict, extern_kernel_refs, redirect, vec_isa):
    """The forward of a frozen graph's entry: its CompiledFxGraph with the saved
    constants, behind the kept-argument wrapper (NOTE: [Frozen graphs in packages])."""
    from torch._functorch._aot_autograd.autograd_cache import CompiledForward
    from torch._inductor.output_code import CompiledFxGraphConstants

    class _SavedConstants(CompiledFxGraphConstants):
        def unwrap(self, g) -> dict[str, torch.Tensor]:
            return frozen["constants"]

    class _EmbeddedFrozen(CompiledForward):
        def load(self, example_inputs, fx_config):
            graph = _graph_from_blob(
                blob, _SavedConstants(), example_inputs, fx_config, extern_kernel_refs, redirect, vec_isa
            )
            return _FrozenForward(
                graph,
                frozen["preserved_arg_indices"],
                frozen["unwrapped_args_offsets"],
                frozen["max_offset_idx"],
            )

    return _EmbeddedFrozen(original.fx_graph_cache_key)


class _PackagedInductorGraph:
    """A compiled Inductor graph rebuilt from a package on its first call."""

    def __init__(self, payload: dict, redirect: _KernelRedirect, name: str) -> None:
        self.payload = payload
        self.redirect = redirect
        self.name = name
        self.params_flat = list(payload["params"].values())
        self.compiled: Optional[Callable[..., Any]] = None

    def _hydrate(self, full_args):
        from torch._functorch._aot_autograd.autograd_cache import CompiledBackward, CompiledForward
        from torch._functorch._aot_autograd.schemas import AOTConfig
        from torch._inductor.output_code import CompiledFxGraphConstants
        from torch._inductor.utils import BoxedBool

        entry = pickle.loads(self.payload["entry"])
        redirect = self.redirect
        extern_kernel_refs = self.payload.get("extern_kernels", {})
        vec_isa = self.payload.get("vec_isa")

        def loadable(base, original, blob):
            class _Embedded(base):  # type: ignore[valid-type,misc]
                def load(self, example_inputs, fx_config):
                    return _graph_from_blob(
                        blob,
                        CompiledFxGraphConstants(),
                        example_inputs,
                        fx_config,
                        extern_kernel_refs,
                        redirect,
                        vec_isa,
                    )

            fields = {f.name: getattr(original, f.name) for f in dataclasses.fields(base)}
            return _Embedded(**fields)

        frozen = self.payload.get("frozen")
        if frozen is not None:
            entry.compiled_fw = _frozen_loadable(
                entry.compiled_fw, self.payload["fw_graph"], frozen, extern_kernel_refs, redirect, vec_isa
            )
        else:
            entry.compiled_fw = loadable(CompiledForward, entry.compiled_fw, self.payload["fw_graph"])
        if entry.compiled_bw is not None:
            entry.compiled_bw = loadable(
                CompiledBackward, entry.compiled_bw, self.payload["bw_graph"]
            )

        def no_compile(*args, **kwargs):
            raise PackageError(f"packaged graph {self.name} tried to compile at load")

        aot_config = AOTConfig(
            fw_compiler=no_compile,
            bw_compiler=no_compile,
            partition_fn=no_compile,
            decompositions={},
            aot_id=-1,
            inference_compiler=no_compile,
            enable_log=False,
            **self.payload["aot_config"],
        )
        from torch._dynamo.utils import dynamo_timed

        # wrap_post_compile reports to the event a compile would have open.
        with dynamo_timed("backend_compile", log_pt2_compile_event=True):
            return entry.wrap_post_compile(
                list(full_args), aot_config, {"cudagraphs": BoxedBool(False)}
            )

    def __call__(self, *runtime_args):
        full_args = [*self.params_flat, *runtime_args]
        if self.compiled is None:
            self.compiled = self._hydrate(full_args)
        return self.compiled(full_args)


class _PackagedAOTEagerGraph:
    """aot_eager: AOTAutograd runs again on the saved graph, on the first call
    with each input signature (the Dynamo graph itself is saved)."""

    def __init__(self, gm) -> None:
        self.gm = gm
        self.compiled: dict[tuple, Callable] = {}

    def __call__(self, *args):
        key = tuple(
            (tuple(a.shape), tuple(a.stride()), a.dtype, a.requires_grad)
            if isinstance(a, torch.Tensor)
            else (type(a), a)
            for a in args
        )
        fn = self.compiled.get(key)
        if fn is None:
            from torch._dynamo.backends.debugging import aot_eager

            fn = self.compiled[key] = aot_eager(self.gm, list(args))
        return fn(*args)


# NOTE: [A packaged graph's frame is skipped by Dynamo with all it calls]
# A loaded entry's bytecode calls its graphs the way a fresh compile's does,
# with Dynamo's frame hook still set (the entry's own frame is Dynamo's), and
# Dynamo must neither compile the graph's frame nor any frame it calls
# (AOTAutograd's wrappers, the generated module's call(), the first call's
# rebuilding). OutputGraph installs each compiled graph wrapped in
# torch._dynamo.disable for that, and so did a load: a Python wrapper that
# unsets the hook and sets it back, two more Python frames and five C calls on
# every call. The __call__ of the graph classes above is code this module owns:
# its code object carries the frame exec strategy "skip this frame and every
# frame it calls" (torch 2.7's FrameExecStrategy, what Dynamo sets on a code
# that hit the recompile limit under skip_code_recursive_on_recompile_limit_hit),
# which the C frame hook reads from the code and obeys by running the frame with
# the hook unset: the same effect, without a Python frame. A graph of another
# kind (the eager backend's forward, a custom backend's callable) keeps the
# wrapper, and so does every graph on a torch whose frame hook has no exec
# strategies (torch 2.6.0).
def _skip_with_all_it_calls(code: types.CodeType) -> bool:
    """Mark ``code`` (see the NOTE above); False where this torch cannot."""
    try:
        from torch._C._dynamo.eval_frame import set_code_exec_strategy
        from torch._dynamo.types import FrameAction, FrameExecStrategy
    except ImportError:  # torch 2.6.0
        return False
    set_code_exec_strategy(code, FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP))
    return True


_CALLS_SKIPPED_BY_THEIR_CODE: frozenset[types.CodeType] = frozenset(
    cls.__call__.__code__
    for cls in (_PackagedInductorGraph, _PackagedAOTEagerGraph)
    if _skip_with_all_it_calls(cls.__call__.__code__)
)


def graph_for_bytecode(graph: Callable[..., Any]) -> Callable[..., Any]:
    """What a loaded entry's bytecode calls for ``graph``: the graph itself when
    Dynamo skips its frame and all it calls by its code, else the graph under
    torch._dynamo.disable (NOTE: [A packaged graph's frame is skipped by Dynamo
    with all it calls])."""
    # The code its call runs must be one marked above: a subclass's __call__,
    # or a function set as the class's __call__ (a profiler's timer), is code
    # of its own, unmarked, which Dynamo would otherwise compile.
    call_code = getattr(type(graph).__call__, "__code__", None)
    if call_code in _CALLS_SKIPPED_BY_THEIR_CODE:
        return graph
    return cast(Callable[..., Any], torch._dynamo.disable(graph))


# NOTE: [FX graphs of eager and aot_eager packages]
# A GraphModule pickles as its generated code, which unpickling traces again
# with torch.fx's symbolic tracer. Dynamo's graphs with dynamic shapes do not
# survive that: ``torch.arange(0, sym_size)`` gets a Proxy where it takes a
# number, ``if`` on a size is control flow on a Proxy. So the graph of an eager
# or aot_eager entry is saved as data: one tuple per node (op, name, target,
# args, kwargs), where a node argument is its name, a constant is encoded as a
# bytecode constant is (NOTE: [Constants of compiled bytecode]) and a function
# target is (module, qualname), found again at load by namespace lookups only in
# torch's, operator's, math's or builtins' namespace (never eval, exec, open,
# getattr...); the tensors ``get_attr`` reads are saved with the graph. A graph
# that holds anything else (submodules, other callables) is saved as before.
# Two calls reach attributes of a graph value by name: ``getattr(value, name)``
# (Dynamo emits it for properties such as ``weight.T``) is saved only with a
# constant public name, and ``call_method`` only with a name that is not a
# dunder: a graph value's ``__class__`` or ``__globals__`` would lead out of the
# graph to any function, which the allow-list exists to refuse. A NumPy call
# Dynamo traced is a call of one of Dynamo's three NumPy wrappers (see NOTE:
# [NumPy calls in packaged graphs]).
#
# NOTE: [NumPy calls in packaged graphs]
# Dynamo traces NumPy code into calls of wrapper objects of
# torch._dynamo.utils, which no namespace names; each is saved as a tag and the
# name of what it wraps, and wrapped again at load by the loading process's own
# wrapper class, only around what that name finds in the allow-list:
#   ("numpy", module, qualname)           numpy_to_tensor_wrapper of the
#       torch._numpy twin of a NumPy function (``np.sqrt(d_model)`` in CTRL,
#       ``np.lcm`` in Reformer, ``np.log`` in PEGASUS-X), only for a function of
#       torch._numpy;
#   ("numpy_operator", module, qualname)  numpy_operator_wrapper of the operator
#       an operator on ndarrays calls (``a % b``, ``a / b`` in Reformer's and
#       PEGASUS-X's position code), only for a function a graph may call itself
#       (the wrapper only turns tensor arguments into ndarrays first);
#   ("numpy_method", "ndarray", name)      numpy_method_wrapper of an ndarray
#       method, only for a name call_method may call (no dunder).
# Anything else (another tag, a name outside these) is a PackageError at load,
# and at save a graph holding another wrapper is not saved as data.
#
# NOTE: [Modules a graph target is found through]
# A target's qualname is looked up attribute by attribute, and a module's
# namespace holds the modules it imported: ("torch", "os.system") would find
# os.system, ("torch", "utils.cpp_extension.load_inline") a C++ compiler. Each
# module a lookup passes through must itself be one a target may come from,
# so a name never leaves the allowed modules. operator's call, attrgetter and
# methodcaller are refused like getattr: each reaches, or calls, what a graph
# value leads to by a name the graph holds (attrgetter("__class__...")).
_GRAPH_TARGET_MODULES = ("torch", "operator", "_operator", "math", "builtins")
_UNSAFE_TARGETS = frozenset(
    {"eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr",
     "globals", "locals", "vars", "input", "breakpoint", "exit", "quit", "help", "load",
     "call", "attrgetter", "methodcaller"}
)


class _NotGraphData(Exception):
    pass


_ATTRIBUTE_READ = ("builtins", "getattr")
# The tags of calls of Dynamo's NumPy wrappers (NOTE: [NumPy calls in packaged graphs]).
_NUMPY_CALL = "numpy"
_NUMPY_OPERATOR_CALL = "numpy_operator"
_NUMPY_METHOD_CALL = "numpy_method"
_NUMPY_CALL_TAGS = (_NUMPY_CALL, _NUMPY_OPERATOR_CALL, _NUMPY_METHOD_CALL)
_NUMPY_METHOD_OWNER = "ndarray"
_NUMPY_TWIN_MODULE = "torch._numpy"


def _numpy_twin_name_allowed(module: str, qualname: str) -> bool:
    """Whether ``module.qualname`` may name a NumPy call's torch._numpy twin."""
    return (module == _NUMPY_TWIN_MODULE or module.startswith(_NUMPY_TWIN_MODULE + ".")) and not (
        set(qualname.split(".")) & _UNSAFE_TARGETS
    )


def _numpy_call_target(target) -> Optional[tuple[str, str, str]]:
    """``target`` as (tag, module, qualname) when it is one of Dynamo's NumPy
    wrappers around what that name finds again (NOTE: [NumPy calls in packaged
    graphs]); else None."""
    from torch._dynamo.utils import (
        numpy_method_wrapper,
        numpy_operator_wrapper,
        numpy_to_tensor_wrapper,
    )

    cls = type(target)
    if cls is numpy_method_wrapper:
        name = target.method
        return (_NUMPY_METHOD_CALL, _NUMPY_METHOD_OWNER, name) if _method_name_allowed(name) else None
    if cls is numpy_to_tensor_wrapper:
        fn, allowed = target.f, _numpy_twin_name_allowed
    elif cls is numpy_operator_wrapper:
        fn, allowed = target.op, _target_module_allowed
    else:
        return None
    # A torch._numpy function wrapped by its argument normalizer keeps the
    # module and name of its implementation, and is found in torch._numpy.
    module = getattr(fn, "__module__", None)
    names = (getattr(fn, "__qualname__", None), getattr(fn, "__name__", None))
    for candidate in (module, _NUMPY_TWIN_MODULE):
        for qualname in names:
            if (
                isinstance(candidate, str)
                and isinstance(qualname, str)
                and _graph_target_lookup(candidate, qualname, allowed) is fn
            ):
                tag = _NUMPY_CALL if cls is numpy_to_tensor_wrapper else _NUMPY_OPERATOR_CALL
                return (tag, candidate, qualname)
    return None


def _numpy_call_from(target: tuple) -> Any:
    """Dynamo's NumPy wrapper ``target`` names, made by the loading process's
    own wrapper class (NOTE: [NumPy calls in packaged graphs]), or None when the
    tag or the name is not one a packaged graph may call."""
    from torch._dynamo.utils import (
        numpy_method_wrapper,
        numpy_operator_wrapper,
        numpy_to_tensor_wrapper,
    )

    tag, module, qualname = target
    if tag == _NUMPY_METHOD_CALL:
        ok = module == _NUMPY_METHOD_OWNER and _method_name_allowed(qualname)
        return numpy_method_wrapper(qualname) if ok else None
    if tag == _NUMPY_OPERATOR_CALL:
        fn = _graph_target_lookup(module, qualname, _target_module_allowed)
        ok = callable(fn) and not isinstance(fn, type)
        return numpy_operator_wrapper(fn) if ok else None
    if tag != _NUMPY_CALL:
        return None
    # torch's own NumPy twin, imported by Dynamo only once it traces NumPy: a
    # fixed module, so a package names what is looked up in it, never what is imported.
    import torch._numpy  # noqa: F401

    fn = _graph_target_lookup(module, qualname, _numpy_twin_name_allowed)
    return numpy_to_tensor_wrapper(fn) if callable(fn) and not isinstance(fn, type) else None


def _public_attribute_read(args, kwargs) -> bool:
    """Whether ``getattr(*args, **kwargs)`` reads a public attribute of a graph
    value by a constant name."""
    return (
        not kwargs
        and len(args) == 2
        and isinstance(args[0], torch.fx.Node)
        and isinstance(args[1], str)
        and args[1].isidentifier()
        and not args[1].startswith("_")
    )


def _method_name_allowed(name) -> bool:
    return isinstance(name, str) and name.isidentifier() and not (name.startswith("__") and name.endswith("__"))


def _target_module_allowed(module: str, qualname: str) -> bool:
    return (
        (module.split(".")[0] in _GRAPH_TARGET_MODULES)
        and not set(qualname.split(".")) & _UNSAFE_TARGETS
        and not module.startswith(("torch.serialization", "torch.hub", "torch.utils.cpp_extension"))
    )


def _graph_target_lookup(module: str, qualname: str, allowed: Callable[[str, str], bool]) -> Any:
    """What ``module.qualname`` finds by _namespace_lookup's dict lookups when
    ``allowed`` accepts it and every module the lookup passes through, else None
    (NOTE: [Modules a graph target is found through])."""
    if not allowed(module, qualname):
        return None
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        namespace = vars(obj) if isinstance(obj, (types.ModuleType, type)) else None
        if namespace is None or part not in namespace:
            return None
        obj = namespace[part]
        if isinstance(obj, types.ModuleType) and not (isinstance(obj.__name__, str) and allowed(obj.__name__, qualname)):
            return None
    return None if isinstance(obj, types.ModuleType) else obj


def _graph_arg_as_data(value):
    if isinstance(value, torch.fx.Node):
        return ("node", value.name)
    if isinstance(value, (list, torch.fx.immutable_collections.immutable_list)):
        return ("list", tuple(_graph_arg_as_data(v) for v in value))
    if type(value) is tuple:
        return ("tuple", tuple(_graph_arg_as_data(v) for v in value))
    if type(value) is slice:
        return ("slice", tuple(_graph_arg_as_data(v) for v in (value.start, value.stop, value.step)))
    if isinstance(value, (dict, torch.fx.immutable_collections.immutable_dict)):
        return ("dict", tuple((_graph_arg_as_data(k), _graph_arg_as_data(v)) for k, v in value.items()))
    try:
        return ("const", _encode_constant(value))
    except PackageError as e:
        raise _NotGraphData(str(e)) from e


def _fx_graph_as_data(gm) -> Optional[dict]:
    """``gm``'s graph as builtin data and tensors (NOTE: [FX graphs of eager and
    aot_eager packages]), or None when it holds something else."""
    if not isinstance(gm, torch.fx.GraphModule) or type(gm.graph._codegen) is not torch.fx.graph.CodeGen:
        return None
    nodes = []
    attrs: dict[str, Any] = {}
    try:
        for node in gm.graph.nodes:
            target = node.target
            numpy_call = _numpy_call_target(target) if node.op == "call_function" else None
            if numpy_call is not None:
                target = numpy_call
            elif node.op == "call_function" and target is getattr:
                if not _public_attribute_read(node.args, node.kwargs):
                    return None
                target = _ATTRIBUTE_READ
            elif node.op == "call_function":
                where = _named_class_path(target) if isinstance(target, type) else None
                if where is None:
                    module = getattr(target, "__module__", None)
                    names = (getattr(target, "__qualname__", None), getattr(target, "__name__", None))
                    where = next(
                        (
                            (candidate, qualname)
                            for candidate in (module, "torch", "operator")
                            for qualname in names
                            if isinstance(candidate, str)
                            and isinstance(qualname, str)
                            and _graph_target_lookup(candidate, qualname, _target_module_allowed) is target
                        ),
                        None,
                    )
                if where is None or _graph_target_lookup(*where, _target_module_allowed) is not target:
                    return None
                target = where
            elif node.op == "get_attr":
                value = gm
                for part in target.split("."):
                    value = getattr(value, part)
                if not isinstance(value, torch.Tensor) or type(value) not in (torch.Tensor, torch.nn.Parameter):
                    return None
                attrs[target] = value
            elif node.op == "call_method" and not _method_name_allowed(target):
                return None
            elif node.op not in ("placeholder", "call_method", "output"):
                return None
            nodes.append((node.op, node.name, target, _graph_arg_as_data(node.args), _graph_arg_as_data(node.kwargs)))
    except _NotGraphData:
        return None
    return {"nodes": nodes, "attrs": attrs}


def _graph_arg_from_data(data, env: dict, where: str, depth: int = 0):
    if depth > 64 or not (isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], str)):
        raise PackageError(f"{where}: a node argument is malformed")
    kind, value = data
    if kind == "node":
        if value not in env:
            raise PackageError(f"{where}: a node reads {str(value)[:80]!r}, which no earlier node is")
        return env[value]
    if kind in ("list", "tuple", "dict", "slice"):
        if not isinstance(value, tuple) or (kind == "slice" and len(value) != 3):
            raise PackageError(f"{where}: a node argument is malformed")
        if kind == "dict":
            if not all(isinstance(kv, tuple) and len(kv) == 2 for kv in value):
                raise PackageError(f"{where}: a node argument is malformed")
            return {
                _graph_arg_from_data(k, env, where, depth + 1): _graph_arg_from_data(v, env, where, depth + 1)
                for k, v in value
            }
        items = [_graph_arg_from_data(v, env, where, depth + 1) for v in value]
        if kind == "slice":
            return slice(*items)
        return items if kind == "list" else tuple(items)
    if kind == "const":
        try:
            return _decode_constant(value)
        except PackageError as e:
            raise PackageError(f"{where}: {e}") from e
    raise PackageError(f"{where}: a node argument is malformed")


def _fx_graph_from_data(data, name: str) -> torch.fx.GraphModule:
    """The GraphModule of ``_fx_graph_as_data``'s data; anything malformed or a
    target outside the allow-list is a PackageError."""
    where = f"packaged graph {name}"
    if not (isinstance(data, dict) and isinstance(data.get("nodes"), list) and isinstance(data.get("attrs"), dict)):
        raise PackageError(f"{where}: its graph is malformed")
    attrs = data["attrs"]
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in attrs.items()):
        raise PackageError(f"{where}: its graph's attributes are malformed")
    graph = torch.fx.Graph()
    env: dict[str, Any] = {}
    for node in data["nodes"]:
        if not (isinstance(node, tuple) and len(node) == 5 and isinstance(node[1], str) and node[1].isidentifier()):
            raise PackageError(f"{where}: a node is malformed")
        op, node_name, target, args, kwargs = node
        if op == "call_function":
            if not (
                isinstance(target, tuple)
                and (len(target) == 2 or (len(target) == 3 and target[0] in _NUMPY_CALL_TAGS))
                and all(isinstance(t, str) for t in target)
            ):
                raise PackageError(f"{where}: node {node_name} has a malformed target")
            if target == _ATTRIBUTE_READ:
                # Checked below, with its arguments.
                fn: Any = getattr
            elif len(target) == 3:
                fn = _numpy_call_from(target)
            else:
                fn = _graph_target_lookup(*target, _target_module_allowed)
            if fn is None or not callable(fn):
                raise PackageError(
                    f"{where}: node {node_name} calls {target[-2][:80]}.{target[-1][:80]}, which is "
                    "not a function a packaged graph may call"
                )
            target = fn
        elif op in ("placeholder", "call_method", "get_attr"):
            if not (isinstance(target, str) and all(p.isidentifier() for p in target.split("."))):
                raise PackageError(f"{where}: node {node_name} has a malformed target")
            if op == "get_attr" and target not in attrs:
                raise PackageError(f"{where}: node {node_name} reads attribute {target[:80]!r}, which the graph does not hold")
            if op == "call_method" and not _method_name_allowed(target):
                raise PackageError(f"{where}: node {node_name} calls method {target[:80]!r}, which a packaged graph may not call")
        elif op != "output":
            raise PackageError(f"{where}: node {node_name} has op {str(op)[:40]!r}")
        node_args = _graph_arg_from_data(args, env, where)
        node_kwargs = _graph_arg_from_data(kwargs, env, where)
        if not (isinstance(node_args, tuple) and isinstance(node_kwargs, dict)):
            raise PackageError(f"{where}: node {node_name} has malformed arguments")
        if target is getattr and not _public_attribute_read(node_args, node_kwargs):
            raise PackageError(
                f"{where}: node {node_name} reads an attribute that is not a public one named by a constant"
            )
        created = graph.create_node(op, target, node_args, node_kwargs, name=node_name)
        env[node_name] = created
    try:
        graph.lint()
        return torch.fx.GraphModule(dict(attrs), graph)
    except Exception as e:
        raise PackageError(f"{where}: its graph is malformed: {e!r}"[:400]) from e


def deserialize_graph(blob: bytes, redirect: _KernelRedirect, name: str):
    """A packaged graph's callable, read with the graph allow-list (NOTE:
    [Classes of graph artifacts]); any damage is a PackageError naming it."""
    if blob[:2] == b"PK":  # torch.save zip: an Inductor graph
        payload = load_inductor_payload(blob, f"graph {name}")
        _check_packaged_kernels(payload, redirect, name)
        _check_aot_config(payload["aot_config"], name)
        return _CheckedInductorGraph(payload, redirect, name)
    payload = load_graph_pickle(blob, f"graph {name}")
    backend = payload.get("backend") if isinstance(payload, dict) else None
    if not isinstance(backend, str):
        raise PackageError(f"packaged graph {name} is not a graph artifact (no backend field)")
    if backend.startswith(_CUSTOM_BACKEND):
        return _deserialize_custom_graph(payload, name)
    gm = payload.get("gm")
    if "graph" in payload and backend in ("eager", "aot_eager"):
        gm = _fx_graph_from_data(payload["graph"], name)
    if backend not in ("eager", "aot_eager") or not isinstance(gm, torch.fx.GraphModule):
        raise PackageError(f"packaged graph {name}: backend {backend[:40]!r} with no graph module")
    if backend == "eager":
        return gm.forward
    return _PackagedAOTEagerGraph(gm)


class _CheckedInductorGraph(_PackagedInductorGraph):
    """A packaged Inductor graph whose rebuilding on its first call reports any
    failure as a PackageError naming the graph (a damaged artifact that passed
    the checks at load, e.g. a wrapper's metadata with wrong values)."""

    def _hydrate(self, full_args):
        try:
            return super()._hydrate(full_args)
        except PackageError:
            raise
        except Exception as e:
            raise PackageError(
                f"packaged graph {self.name} cannot be rebuilt from its package: {e!r}"[:600]
            ) from e


def _check_aot_config(fields: dict, name: str) -> None:
    """The recorded AOTConfig fields are exactly those _aot_config_fields saves."""
    expected: dict[str, Any] = {
        "num_params_buffers": int,
        "keep_inference_input_mutations": bool,
        "is_export": bool,
        "no_tangents": bool,
        "dynamic_shapes": bool,
        "static_input_indices": (list, type(None)),
        "pre_dispatch": bool,
    }
    if set(fields) != set(expected) or not all(
        isinstance(fields[k], t) for k, t in expected.items()
    ):
        raise PackageError(f"packaged graph {name}: its AOTConfig fields are malformed")


def _check_packaged_kernels(payload: dict, redirect: _KernelRedirect, name: str) -> None:
    """Every CPU kernel the graph's compile loaded is one its package holds;
    while the graph is rebuilt, the redirect refuses any other (NOTE: [Kernels
    of a packaged graph])."""
    digests = payload.get("cpp_kernels")
    if not isinstance(digests, list) or not all(isinstance(d, str) for d in digests):
        raise PackageError(f"packaged graph {name} has no list of the CPU kernels it loads")
    for digest in digests:
        if digest not in redirect.kernel_paths:
            raise PackageError(
                f"packaged graph {name} loads kernel {digest[:80]}, which is not in its "
                "package (a kernel is never compiled at load)"
            )


def redirect_to_kernel_binaries(kernels: dict[str, bytes], prefix: str) -> _KernelRedirect:
    """A redirect to copies of ``kernels`` (kernel hash -> .so bytes) written to a
    temporary directory, removed with the redirect (or at exit)."""
    kernel_paths: dict[str, str] = {}
    if not kernels:
        return _KernelRedirect(kernel_paths)
    # Kernel binaries must be files to be loaded.
    kernel_dir = kernel_copies_dir(prefix)
    for digest, blob in kernels.items():
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= set("0123456789abcdef")):
            remove_kernel_copies(kernel_dir)
            raise PackageError(f"kernel name {str(digest)[:80]!r} is not a kernel hash")
        (kernel_dir / f"{digest}.so").write_bytes(blob)
        kernel_paths[digest] = str(kernel_dir / f"{digest}.so")
    redirect = _KernelRedirect(kernel_paths)
    remove_kernel_copies_with(redirect, kernel_dir)
    return redirect


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------


# NOTE: [Replacing a package atomically]
# Many processes may load a package while one (or several) save to the same
# path. A save writes a complete new directory next to the package (manifest
# last: a directory without one is not a package), then swaps the two names in
# one step (renameat2(RENAME_EXCHANGE) on Linux), so the path always holds a
# complete package, the old or the new one, and deletes the old one. Swaps of
# concurrent saves to one directory are serialized by an exclusive flock on
# the parent directory (writing the files is not): the last swap wins, every
# other save's directory is deleted, nothing is left beside the package.
# Loaders take no lock and write nothing: every file is checked against the
# manifest's sha256, so a load never mixes two packages' files, and a loader
# whose read overlapped a swap (the directory it started on, held open, is no
# longer the one at the path) reads the new package again
# (package_storage.read_consistently). Where the exchange is not available
# (other systems, some filesystems), the old package is renamed away and the
# new one renamed in: a loader starting between the two renames finds no
# package (a PackageError) rather than a mix.

_RENAME_EXCHANGE = 2  # linux/fs.h


def _exchange_names(a: Path, b: Path) -> bool:
    """Swap two paths' names in one step; False where the system cannot."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    errno = ctypes.get_errno()
    if errno in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not on this filesystem
        return False
    raise OSError(errno, os.strerror(errno), str(a), None, str(b))


@contextlib.contextmanager
def _saves_serialized(directory: Path):
    """An exclusive flock on ``directory`` while a save swaps its package in."""
    try:
        import fcntl
    except ImportError:  # not POSIX: swaps are not serialized
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _write_atomically(path: Path, files: dict[str, bytes], manifest: dict) -> None:
    """Write the package at ``path`` (NOTE: [Replacing a package atomically])."""
    path = path.resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.saving-", dir=path.parent))
    try:
        for name, data in files.items():
            target = staging / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        # The manifest goes last: a directory without one is not a package.
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        with _saves_serialized(path.parent):
            if not os.path.lexists(path):
                os.rename(staging, path)
            elif not _exchange_names(staging, path):
                trash = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
                try:
                    os.rename(path, trash / "old")
                    os.rename(staging, path)
                finally:
                    shutil.rmtree(trash, ignore_errors=True)
    finally:
        # After an exchange, the previous package: loaders pinned it already.
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)


def read_manifest(path: Path) -> dict:
    """Read and check a package's manifest (a regular file, its signature verified
    first: NOTE: [Trust model of compile packages]); nothing else is read."""
    from .package_trust import (
        _exists,
        MAX_MANIFEST_BYTES,
        MAX_SIGNATURE_BYTES,
        parse_manifest,
        read_confined,
        verify_manifest,
    )

    path = Path(path)
    if not _exists(path, MANIFEST):
        raise PackageError(f"{path} is not a torch.compile package (no {MANIFEST})")
    raw = read_confined(path, MANIFEST, path, MAX_MANIFEST_BYTES)
    signature = None
    if _exists(path, SIGNATURE_FILE):
        signature = read_confined(path, SIGNATURE_FILE, path, MAX_SIGNATURE_BYTES)
    verify_manifest(raw, signature, path)
    return check_manifest(parse_manifest(raw, path), path)


# NOTE: [Guard filter of a package]
# A package compiled with one of torch.compiler's guard filter presets
# (NOTE: [Guard filter presets]) saved only the guards that preset kept, and its
# entries check only those when loaded: the load decides as the saving process
# did. The manifest names the preset (``"guard_filter_fn":
# "torch.compiler.skip_guard_on_all_nn_modules_unsafe"``; ``"<custom>"`` for
# any other filter, whose name says nothing in another process) and a load
# reports it. torch._dynamo.optimize notes the filter of a package's compile
# (note_guard_filter); the manifest's writer adds guard_filter_manifest_fields.
GUARD_FILTER_PRESETS = (
    "keep_portable_guards_unsafe",
    "skip_guard_on_inbuilt_nn_modules_unsafe",
    "skip_guard_on_all_nn_modules_unsafe",
    "keep_tensor_guards_unsafe",
    "skip_guard_on_globals_unsafe",
    "skip_all_guards_unsafe",
)
CUSTOM_GUARD_FILTER = "<custom>"


def guard_filter_name(guard_filter_fn) -> Optional[str]:
    """The manifest's name for ``guard_filter_fn``: ``torch.compiler.<preset>``
    (``keep_tensor_guards_unsafe(keep_parameters=True)`` for that partial),
    ``"<custom>"`` for another function, None for no filter."""
    import functools

    import torch.compiler

    if guard_filter_fn is None:
        return None
    for name in GUARD_FILTER_PRESETS:
        if guard_filter_fn is getattr(torch.compiler, name):
            return f"torch.compiler.{name}"
    if (
        isinstance(guard_filter_fn, functools.partial)
        and guard_filter_fn.func is torch.compiler.keep_tensor_guards_unsafe
        and not guard_filter_fn.args
        and set(guard_filter_fn.keywords) <= {"keep_parameters"}
    ):
        keep = bool(guard_filter_fn.keywords.get("keep_parameters", False))
        return f"torch.compiler.keep_tensor_guards_unsafe(keep_parameters={keep})"
    return CUSTOM_GUARD_FILTER


def note_guard_filter(package, guard_filter_fn) -> None:
    """Remember the guard filter ``package``'s frames are compiled with."""
    package._guard_filter_name = guard_filter_name(guard_filter_fn)


def guard_filter_manifest_fields(package) -> dict:
    """The manifest fields that record ``package``'s guard filter (none without one)."""
    name = getattr(package, "_guard_filter_name", None)
    return {"guard_filter_fn": name} if name is not None else {}


def saved_guard_filter(manifest: dict, where) -> Optional[str]:
    """The guard filter a package was saved with (None: all guards kept), checked
    and reported."""
    name = manifest.get("guard_filter_fn")
    if name is None:
        return None
    presets = {f"torch.compiler.{p}" for p in GUARD_FILTER_PRESETS}
    if not isinstance(name, str) or not (
        name in presets
        or name == CUSTOM_GUARD_FILTER
        or re.fullmatch(r"torch\.compiler\.keep_tensor_guards_unsafe\(keep_parameters=(True|False)\)", name)
    ):
        raise PackageError(
            f"package {where}: {MANIFEST} field 'guard_filter_fn' is {str(name)[:80]!r}, "
            "not a torch.compiler guard filter preset or '<custom>'"
        )
    log.info(
        "package %s was saved with guard_filter_fn=%s: its entries check only the "
        "guards that filter kept",
        where,
        name,
    )
    return name


def check_manifest(manifest, path) -> dict:
    """Check a manifest's fields (types, allowed values) and it against this
    process (format, versions, CPU, devices)."""
    from .package_trust import check_manifest_schema, device_available

    manifest = check_manifest_schema(manifest, path)
    if "format_version" not in manifest:
        raise PackageError(f"package {path}: {MANIFEST} is damaged (no format_version)")
    if manifest["format_version"] != PACKAGE_FORMAT_VERSION:
        raise PackageError(
            f"package {path} has format version {manifest['format_version']}; this "
            f"torch reads format {PACKAGE_FORMAT_VERSION}"
        )
    here = {**_environment(), "overlay_series_hash": overlay_series_hash()}
    for field, value in here.items():
        if manifest.get(field) != value:
            raise PackageError(
                f"package {path} was saved with {field}={manifest.get(field)!r}, "
                f"this process has {field}={value!r}"
            )
    for device in manifest.get("device", "cpu").split(","):
        if not device_available(device):
            raise PackageError(
                f"package {path} was compiled for device {device!r}, which this "
                "process does not have"
            )
    if not isinstance(manifest.get("files"), dict) or _DYNAMO_FILE not in manifest["files"]:
        raise PackageError(f"package {path}: {MANIFEST} lists no entries file")
    saved_guard_filter(manifest, path)
    return manifest


def write_archive(fileobj, files: dict[str, bytes], manifest: dict) -> None:
    """The package format in one file: an uncompressed zip of the same files, and
    the manifest's signature when config.package_signing_key is set."""
    from .package_trust import manifest_bytes, sign_manifest, write_signed_archive

    raw = manifest_bytes(manifest)
    files = {name: data for name, data in files.items() if name != SIGNATURE_FILE}
    write_signed_archive(fileobj, files, raw, sign_manifest(raw))


def read_archive(fileobj, where: str) -> tuple[dict[str, bytes], dict]:
    """Files and checked manifest of an archive written by :func:`write_archive`:
    its signature verified first, every member name confined, every file checked
    against the manifest's sha256 (NOTE: [Trust model of compile packages])."""
    from .package_trust import read_archive_files

    package = read_archive_files(fileobj, where, check_manifest)
    return package.files, package.manifest
