"""Serialization of Dynamo guards: save a guard manager, rebuild it in another process.

``CheckFunctionManager(code, output_graph, save_guards=True)`` records, while
it builds the guards, every value the GuardBuilder reads; this module turns
those values and the rest of what the guards depend on (the guards themselves,
tensor metadata, shape-env guard code, the global state, the torch-function
mode stack, functorch and forward-AD levels) into a :class:`GuardsState`,
pickled into ``CheckFunctionManager.guards_state``.
``torch._dynamo.package.load_guard_manager(state, code, f_globals)``, which
passes ``state.output_graph`` where a compile passes its OutputGraph, rebuilds
the same C++ GuardManager tree from it. (``guards_serialization_mode="save"``
/ ``"load"`` is the earlier spelling, kept as an alias: NOTE: [Guard
serialization spellings] in guards.py.)

Provides :class:`GuardsState`, :class:`OutputGraphGuardsState`,
:func:`pickle_guards_state`, :func:`load_guards_state` (a restricted unpickler,
the only way in: NOTE: [One guard load path]), :func:`hydrate`,
:func:`guard_type_name` (a guard's type, as filters and refusals name it), the
refusal policy (:data:`UNSUPPORTED_SERIALIZATION_GUARD_TYPES`,
:data:`SERIALIZATION_REFUSAL_REASONS`, :func:`refusal_message`,
:class:`LocalScopeTypeError`), stable names (:func:`find_stable_name`,
:func:`resolve_name`) and the recorder the GuardBuilder reports to. What each
kind of value is saved as, and loaded back from, is one codec per kind in
:mod:`torch._dynamo.guard_serialization_codecs` (NOTE: [Stand-in codecs]).
"""

# NOTE: [Guard serialization by recorded values]
# The GuardBuilder decides everything from values it reads with ``self.get(name)``
# (a type id, a constant, a length, dict keys, a tensor's dtype/device/dispatch
# keys...) and binds accessors by SOURCE, not by value. So saving records
# ``name -> value`` for every name the builder evaluates, and loading answers
# ``get(name)`` from that table: the same builder code then makes the same
# decisions and builds the same tree, without the original objects.
#
# Recorded values are converted into stand-ins that are cheap and safe to pickle
# (one codec per kind, see NOTE: [Stand-in codecs] in guard_serialization_codecs.py):
#   * constants are kept as they are;
#   * modules, module-level classes and functions, builtins, and objects reachable
#     from a module by attribute path are saved BY NAME and resolved at load, so an
#     identity guard (ID_MATCH, FUNCTION_MATCH, ...) guards on what the name
#     resolves to; a name that no longer resolves becomes an object that matches
#     nothing, so the guard fails (and the frame recompiles) instead of the load;
#   * tensors become small real tensors with the same dtype, device,
#     requires_grad, Python type and dispatch keys (sizes and strides are saved
#     separately, as TENSOR_MATCH takes them explicitly);
#   * other guarded objects become instances of their class created without
#     running ``__init__``, with a ``__dict__`` that has the same keys and only
#     the values the guards read; a class with no stable name is rebuilt as a
#     stand-in class (see NOTE: [Classes defined in local scope]);
#   * traceable tensor subclasses are rebuilt with ``__tensor_unflatten__`` from
#     their flatten context and stand-ins of their inner tensors (see NOTE:
#     [Tensor subclass stand-ins]); dict views view a rebuilt dict;
#   * everything reachable but not guarded becomes a placeholder, so unpicklable
#     bystanders (locks, generators, process groups...) never break a save.
#
# NOTE: [Runtime globals]
# The C++ globals accessor binds to a dict object when built. A loaded manager
# must bind to the RUNTIME globals of the module that owns the code (binding to
# a saved copy would silently check stale values), while the values it is built
# from are the SAVED ones. The GuardBuilder therefore keeps the two apart:
# ``scope["G"]`` for values, ``runtime_global_scope`` for binding.

from __future__ import annotations

import builtins
import collections
import contextlib
import copyreg
import dataclasses
import enum
import functools
import gc
import importlib
import io
import itertools
import logging
import pickle
import re
import sys
import types
import weakref
from typing import Any, Optional, Union

import torch
from torch._dynamo.exc import PackageError
from torch.utils.weak import TensorWeakRef


log = logging.getLogger(__name__)

# 2: tensor stand-ins carry their functorch wrapper; the global state carries
# the thread-local dispatch key sets.
# 3: stand-ins of local classes, tensor subclasses and dict views.
# 4: stand-ins live in torch._dynamo.guard_serialization_codecs; a named dict
# key or set item is a (frozen) _NamedRef, not a ("__named__", module, path)
# tuple, and so is the class of a frozen-dataclass key.
# 5: a saved guard is an (originating_source, create_fn) pair, not a Guard.
# 6: the saved guards are two lists, their sources and their create_fns.
GUARDS_STATE_FORMAT_VERSION = 6

# Guard types refused whatever the guarded value: they have no meaning in another
# process. Every other guard type serializes, or is refused for a specific value
# (see SERIALIZATION_REFUSAL_REASONS).
UNSUPPORTED_SERIALIZATION_GUARD_TYPES: tuple[str, ...] = (
    "DATA_PTR_MATCH",
    "WEAKREF_ALIVE",
    "OBJECT_MUTATION",
)

SERIALIZATION_REFUSAL_REASONS: dict[str, str] = {
    "DATA_PTR_MATCH": (
        "it guards on a tensor's memory address, which has no meaning in another "
        "process; pass the tensor as an input instead of capturing it"
    ),
    "WEAKREF_ALIVE": (
        "it guards that a weakly referenced object is still alive in this process"
    ),
    "OBJECT_MUTATION": (
        "it watches a live object for mutation in this process"
    ),
    "TENSOR_SUBCLASS_METADATA_MATCH": (
        "refused only for tensor subclasses defined in local scope: the metadata "
        "check calls the subclass's own __tensor_flatten__ / __metadata_guard__, so "
        "the class must be found again by name; define it at global scope"
    ),
    "DICT_VERSION": (
        "it guards on a dict's version tag, which is per process (the dict of "
        "registered pytree nodes is the exception: it is saved as a keys match)"
    ),
    "ID_MATCH": (
        "refused only when the object has no stable name (module, module-level "
        "function or class, builtin, module attribute): define it at module scope "
        "or pass it as an input"
    ),
    "TYPE_MATCH": (
        "refused only when the class is defined in local scope: the guard compares "
        "the class itself, which another process cannot find by name (raised as "
        "LocalScopeTypeError, a PackageError that is also a TypeError)"
    ),
    "NN_MODULE": (
        "refused only when the module instance is not reachable from a module by "
        "name: keep torch._dynamo.config.inline_inbuilt_nn_modules=True (the "
        "default) so modules are guarded by their attributes, not by identity"
    ),
    "TENSOR_MATCH": (
        "refused only for tensor subclasses defined in local scope and for tensors "
        "whose dispatch keys a stand-in tensor cannot reproduce (sparse, nested, ...)"
    ),
    "SHAPE_ENV": (
        "refused only with torch._dynamo.config.enable_cpp_symbolic_shape_guards on: "
        "those guards need a C++ compiler at load; turn the option off to save them"
    ),
}

# Dynamo installs these globals into the frame's module while compiling; a fresh
# process does not have them, so a load puts them back.
_DYNAMO_INSTALLED_GLOBAL_PREFIXES = ("__builtins_dict__", "__import_")
# ...and install_global_by_id's "<prefix>_<id>_c<compile id>"
_DYNAMO_GLOBAL_BY_ID = re.compile(r"_\d{6,}_c\d+$")


def is_dynamo_installed_global(name: str) -> bool:
    return name.startswith(_DYNAMO_INSTALLED_GLOBAL_PREFIXES) or bool(
        _DYNAMO_GLOBAL_BY_ID.search(name)
    )

# Modules a name may be imported from at load when it is not imported yet. Any
# other module must already be imported (the code being loaded imports its own).
_IMPORTABLE_AT_LOAD = frozenset(
    {
        "builtins",
        "math",
        "operator",
        "functools",
        "itertools",
        "collections",
        "enum",
        "typing",
        "types",
        "numbers",
        "copy",
        "abc",
    }
)


class LocalScopeTypeError(PackageError, TypeError):
    """A guard needs the identity of a class defined in local scope.

    Upstream raises a TypeError for this case (a class another process cannot
    find by name); it is also a PackageError here, so code catching either
    works.
    """


# NOTE: [Refusal messages]
# Every refusal starts with upstream's sentence "<GUARD_TYPE> guard cannot be
# serialized." so code and tests written against upstream keep matching; our
# detail follows: the guarded source, why, and what to do instead.


def refusal_message(guard_type: str, source_name: str, detail: str = "") -> str:
    reason = detail or SERIALIZATION_REFUSAL_REASONS.get(guard_type, "")
    parts = [f"{guard_type} guard cannot be serialized."]
    if source_name:
        parts.append(f"Guarded source: {source_name}.")
    if reason:
        reason = reason[0].upper() + reason[1:]
        parts.append(reason if reason.endswith(".") else f"{reason}.")
    return " ".join(parts)


def local_class_detail(cls: type) -> str:
    """Why a guard on ``cls`` (a class defined in local scope) cannot be saved."""
    # upstream's wording, so that code matching it keeps matching
    return (
        f"Type {cls!r} cannot be saved into torch.compile() package since it's "
        "defined in local scope. Please define the class at global scope (top "
        "level of a module): a class defined at module scope is found again by "
        "its name"
    )


def local_class_refusal(guard_type: str, source_name: str, cls: type) -> LocalScopeTypeError:
    return LocalScopeTypeError(
        refusal_message(guard_type, source_name, local_class_detail(cls))
    )



# ---------------------------------------------------------------------------
# What every stand-in shares: placeholders, names, constants
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Placeholder:
    """A value that is reachable from a guarded object but not guarded."""

    type_name: str


@dataclasses.dataclass(frozen=True)
class _NamedRef:
    """An object saved by name: ``path`` is an attribute path from ``module``.

    Frozen, so that it is also the stand-in of a named dict key or set item."""

    module: str
    path: str


# NOTE: [FSDP2 module classes]
# fully_shard(module) swaps the module's class for one it makes, FSDP<cls>
# (a subclass of FSDPModule and cls, kept in cls_to_fsdp_cls), which no module
# names, so a TYPE_MATCH on a sharded module had no stable name. It is saved as
# the name of the original class, marked as its FSDP class, and loads as the
# class fully_shard made for that class in the loading process (the model is
# sharded before it is loaded, as it is before it is compiled); where there is
# none, as an unresolved name, which matches no guard.
_FULLY_SHARD_MODULE = "torch.distributed.fsdp._fully_shard._fully_shard"


@dataclasses.dataclass(frozen=True)
class _FSDPClassRef(_NamedRef):
    """FSDP<cls> by the name of ``cls`` (see NOTE: [FSDP2 module classes])."""


def _fsdp_original_class(cls) -> Optional[type]:
    """The class fully_shard made ``cls`` from, if it made ``cls``."""
    fully_shard_module = sys.modules.get(_FULLY_SHARD_MODULE)
    made = getattr(fully_shard_module, "cls_to_fsdp_cls", None)
    if not made:
        return None
    return next((original for original, new in made.items() if new is cls), None)


def _resolve_fsdp_class(ref: _FSDPClassRef):
    original = resolve_name(_NamedRef(ref.module, ref.path))
    fully_shard_module = sys.modules.get(_FULLY_SHARD_MODULE)
    made = getattr(fully_shard_module, "cls_to_fsdp_cls", {})
    if isinstance(original, type) and original in made:
        return made[original]
    return UnresolvedName(ref.module, f"FSDP<{ref.path}>")


class UnresolvedName:
    """What a saved name that no longer resolves loads as: it matches no guard."""

    def __init__(self, module: str, path: str) -> None:
        self.module = module
        self.path = path

    def __repr__(self) -> str:
        return f"<unresolved {self.module}:{self.path}>"


_CONSTANT_TYPES = frozenset(
    (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))
)


def _is_constant(value) -> bool:
    return type(value) in _CONSTANT_TYPES or value is NotImplemented


# ---------------------------------------------------------------------------
# Stable names
# ---------------------------------------------------------------------------


_PATH_PART = re.compile(r"(\w+)((?:\[\d+\])*)$")
_PATH_INDEX = re.compile(r"\[(\d+)\]")


def _resolve_path(root, path: str):
    """``root`` followed along ``path``: dotted attributes, each optionally
    indexed by integers (``fn.__closure__[0].cell_contents``)."""
    obj = root
    for part in path.split(".") if path else ():
        match = _PATH_PART.match(part)
        if match is None:
            raise ValueError(f"not an attribute path: {path!r}")
        obj = getattr(obj, match.group(1))
        indices = match.group(2)
        for index in _PATH_INDEX.findall(indices) if indices else ():
            obj = obj[int(index)]
    return obj


# NOTE: [Functions reached through __wrapped__]
# A decorator built with functools.wraps binds the module-level name to the
# wrapper, whose ``__wrapped__`` is the original function (which keeps its own
# ``__module__`` and ``__qualname__``). A guard on the original (FUNCTION_MATCH
# on ``L['fn'].__code__`` when the wrapper is the compiled frame) names it by
# the wrapper's name plus ``.__wrapped__``, once per decorator. Likewise the
# function of a classmethod is its name plus ``.__func__``.
_MAX_WRAPPED_DEPTH = 8


def _wrapped_path(named, obj) -> Optional[str]:
    """``".__wrapped__"`` repeated as often as it takes to get from ``named`` to
    ``obj``, or None."""
    path = ""
    for _ in range(_MAX_WRAPPED_DEPTH):
        attrs = getattr(named, "__dict__", None)
        if not isinstance(attrs, dict) or "__wrapped__" not in attrs:
            return None
        named = attrs["__wrapped__"]
        path += ".__wrapped__"
        if named is obj:
            return path
    return None


# NOTE: [Classes renamed where they are exposed]
# A class bound in C++ keeps the qualname it was bound with, while the module
# that exposes it may rename it: torch.nn.attention imports torch._C's
# _SDPBackend as SDPBackend and sets its __module__ and __name__, not its
# __qualname__, so "torch.nn.attention._SDPBackend" names nothing. A top-level
# class whose qualname does not resolve in its module is therefore also looked
# up by its __name__ there.
def _renamed_class_name(cls, module: str, qualname: str) -> Optional[_NamedRef]:
    name = getattr(cls, "__name__", None)
    if (
        not isinstance(cls, type)
        or not isinstance(name, str)
        or name == qualname
        or "." in qualname
    ):
        return None
    if getattr(sys.modules[module], name, None) is cls:
        return _NamedRef(module, name)
    return None


_LAST_ACCESS = re.compile(r"(?:\.\w+|\[[^\[\]]*\]|\(\))$")


def _parent_source_name(name: str) -> Optional[str]:
    """``L['m']._modules['lin']`` -> ``L['m']._modules``; None at the root."""
    match = _LAST_ACCESS.search(name)
    if match is None or match.start() == 0:
        return None
    return name[: match.start()]


def find_stable_name(
    obj, source=None, global_module: Optional[str] = None, recorded_values=None
):
    """A (module, attribute path) that resolves to ``obj`` in any process, or None."""
    if isinstance(obj, types.ModuleType):
        name = getattr(obj, "__name__", None)
        if isinstance(name, str) and sys.modules.get(name) is obj:
            return _NamedRef(name, "")
        return None
    if obj is builtins.__dict__:
        return _NamedRef("builtins", "__dict__")
    if isinstance(obj, type):
        original = _fsdp_original_class(obj)
        if original is not None:
            ref = find_stable_name(original)
            return None if ref is None else _FSDPClassRef(ref.module, ref.path)
    if isinstance(obj, enum.Enum):
        owner = find_stable_name(type(obj))
        if owner is not None:
            return _NamedRef(owner.module, f"{owner.path}.{obj.name}")
        return None
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if isinstance(module, str) and isinstance(qualname, str) and "<" not in qualname:
        if module in sys.modules:
            try:
                named = _resolve_path(sys.modules[module], qualname)
            except Exception:
                named = None
            if named is obj:
                return _NamedRef(module, qualname)
            if isinstance(named, types.MethodType) and named.__func__ is obj:
                # the function of a classmethod, reached through its class
                return _NamedRef(module, f"{qualname}.__func__")
            wrapped_path = _wrapped_path(named, obj)
            if wrapped_path is not None:
                return _NamedRef(module, f"{qualname}{wrapped_path}")
            renamed = _renamed_class_name(obj, module, qualname)
            if renamed is not None:
                return renamed
    objclass = getattr(obj, "__objclass__", None)
    name = getattr(obj, "__name__", None)
    if isinstance(objclass, type) and isinstance(name, str):
        owner = find_stable_name(objclass)
        if owner is not None:
            path = f"{owner.path}.{name}" if owner.path else name
            try:
                if _resolve_path(sys.modules[owner.module], path) is obj:
                    return _NamedRef(owner.module, path)
            except Exception:
                pass
    # torch's C-level functions report a private module (torch._C._nn...); they are
    # usually exposed under the public one too.
    self_module = getattr(obj, "__self__", None)
    if isinstance(self_module, types.ModuleType) and isinstance(name, str):
        owner = find_stable_name(self_module)
        if owner is not None and getattr(self_module, name, None) is obj:
            return _NamedRef(owner.module, f"{owner.path}.{name}".lstrip("."))
    if source is not None:
        return _stable_name_from_source(obj, source, global_module, recorded_values)
    return None


def _stable_name_from_source(obj, source, global_module, recorded_values=None):
    """``G['x'].a.b`` resolves by the same path at load, and so does ``<base>.a.b``
    for the innermost ``<base>`` on the chain whose value has a stable name
    (``L['fn'].__code__`` of a module-level ``fn`` is ``module.fn.__code__``; the
    ``__torch_function__.__func__.__code__`` of a mode at module scope too)."""
    from torch._dynamo.source import AttrSource, GetItemSource, GlobalSource
    from torch._guards import ChainedSource

    def resolved(module, path):
        try:
            if _resolve_path(sys.modules[module], path) is obj:
                return _NamedRef(module, path)
        except Exception:
            return None
        return None

    # ``attrs`` are path parts, outermost last; an integer item access (a
    # closure cell, a default) is kept on the attribute it indexes: "__closure__[0]".
    attrs: list[str] = []
    pending_index = ""
    node = source
    while True:
        if (
            attrs
            and not pending_index
            and recorded_values is not None
            and node.name() in recorded_values
        ):
            base_ref = find_stable_name(recorded_values[node.name()])
            if base_ref is not None:
                ref = resolved(base_ref.module, ".".join(p for p in [base_ref.path, *attrs] if p))
                if ref is not None:
                    return ref
        if isinstance(node, GlobalSource):
            if global_module in sys.modules and not pending_index:
                return resolved(global_module, ".".join([node.global_name, *attrs]))
            return None
        if not isinstance(node, ChainedSource):
            return None
        if isinstance(node, AttrSource):
            if not _PATH_PART.match(node.member):
                return None
            attrs.insert(0, node.member + pending_index)
            pending_index = ""
        elif (
            isinstance(node, GetItemSource)
            and not node.index_is_slice
            and type(node.index) is int
            and node.index >= 0
            and isinstance(node.base, AttrSource)
        ):
            pending_index = f"[{node.index}]{pending_index}"
        elif node.name() != node.base.name():
            return None  # not an attribute path (item access by key, call...)
        node = node.base



_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class created by a class statement


def _is_local_class(obj, stable_name=find_stable_name) -> bool:
    """A Python class with no stable name (defined in local scope, or created
    with ``type()`` and never bound to its name), other than an Enum.
    ``stable_name``: find_stable_name, or a memo of it."""
    return (
        isinstance(obj, type)
        and bool(obj.__flags__ & _HEAPTYPE)
        and not issubclass(obj, enum.Enum)
        and stable_name(obj) is None
    )


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


class GuardSerializationRecorder:
    """Collects what the GuardBuilder reads while building guards in save mode."""

    def __init__(self, global_module: Optional[str]) -> None:
        self.global_module = global_module
        # name -> the value the builder read by that name first (which keeps it
        # alive, so ids stay unique while the guards are saved)
        self.values: dict[str, Any] = {}
        # record(name, value), which the builder calls for every value every
        # guard reads: the dict's own setdefault, no Python frame per call.
        self.record = self.values.setdefault
        # id(value) -> (guard type, source name, source) of identity guards
        self.identity: dict[int, tuple[str, str, Any]] = {}
        self.keep_alive: list[Any] = []

    @property
    def sources(self) -> dict[int, str]:
        """id(value) -> the first name the value was recorded by."""
        sources: dict[int, str] = {}
        for name, value in self.values.items():
            sources.setdefault(id(value), name)
        return sources

    def require_identity(self, value, guard) -> None:
        if value is None or isinstance(value, bool):
            return
        self.identity.setdefault(
            id(value), (guard_type_name(guard), guard.name, guard.originating_source)
        )
        self.keep_alive.append(value)


def guard_type_name(guard) -> str:
    """The guard's own type: the name of the GuardBuilder method that makes it
    (``create_fn``, with any ``functools.partial`` around it unwrapped), as
    guard_filter_fn's ``GuardFilterEntry.guard_type`` and refusals name it."""
    create_fn = guard.create_fn
    while isinstance(create_fn, functools.partial):
        create_fn = create_fn.func
    return create_fn.__name__


def guard_type_names(guard) -> list[str]:
    """The guard's own type and the ones its builder method ran (SEQUENCE_LENGTH
    runs TYPE_MATCH...), outermost first."""
    names = [guard_type_name(guard)]
    names.extend(n for n in (guard.guard_types or ()) if n not in names)
    return names


def has_guard_type(guard, guard_type: str) -> bool:
    """``guard_type in guard_type_names(guard)``, without making the list (asked
    of every guard of every saved frame)."""
    return guard_type_name(guard) == guard_type or guard_type in (guard.guard_types or ())


def _dispatch_key_set_from_raw(raw: int, start):
    """A DispatchKeySet whose ``raw_repr()`` is ``raw``, made from ``start`` (2.7.1
    has no ``from_raw_repr``, and a few keys, e.g. AutocastXLA, have no Python
    name): named keys are added and removed until the bits agree."""
    if start.raw_repr() == raw:
        # The usual case: loaded under the thread-local state it was saved in.
        return start
    DispatchKey, DispatchKeySet = torch._C.DispatchKey, torch._C.DispatchKeySet
    out = start
    for key in DispatchKey.__members__.values():
        try:
            bits = DispatchKeySet(key).raw_repr()
        except Exception:
            continue
        if not bits or out.raw_repr() == raw:
            continue
        if raw & bits == bits and out.raw_repr() & bits != bits:
            out = out | DispatchKeySet(key)
        elif raw & bits != bits and out.has(key):
            out = out.remove(key)
    if out.raw_repr() != raw:
        raise PackageError(
            f"the thread-local dispatch key set {raw:#x} live when the guards were "
            f"saved cannot be rebuilt from {start} ({out.raw_repr():#x})"
        )
    return out


def tensor_match_dispatch_state(check_fn_manager):
    """While a LOADED TENSOR_MATCH guard is built: the thread-local dispatch key
    sets live when the guards were saved (see NOTE: [Functorch-wrapped tensor
    stand-ins]); a no-op otherwise."""
    saved = check_fn_manager.saved_global_state
    if check_fn_manager.guards_serialization_mode != "load" or saved is None:
        return contextlib.nullcontext()
    include_raw, exclude_raw = saved.dispatch_tls
    return torch._C._ForceDispatchKeyGuard(
        _dispatch_key_set_from_raw(include_raw, torch._C._dispatch_tls_local_include_set()),
        _dispatch_key_set_from_raw(exclude_raw, torch._C._dispatch_tls_local_exclude_set()),
    )


@dataclasses.dataclass
class SavedGlobalState:
    """The process state Dynamo's global-state guard and friends compare against."""

    grad_enabled: bool
    deterministic: bool
    deterministic_warn_only: bool
    torch_function_enabled: bool
    torch_function_all_disabled: bool
    num_threads: int
    default_dtype: str
    cublas_allow_tf32: bool
    autocast: dict  # device type -> (enabled, dtype name)
    default_device: Optional[str]
    dual_level: int
    functorch_states: list
    # raw_repr() of the thread-local dispatch (include, exclude) key sets
    dispatch_tls: tuple

    @classmethod
    def capture(cls) -> SavedGlobalState:
        import torch.utils._device as device_mod
        from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

        autocast = {}
        for device_type in _autocast_device_types():
            autocast[device_type] = (
                torch.is_autocast_enabled(device_type),
                str(torch.get_autocast_dtype(device_type)).replace("torch.", ""),
            )
        current = device_mod.CURRENT_DEVICE
        return cls(
            grad_enabled=torch.is_grad_enabled(),
            deterministic=torch.are_deterministic_algorithms_enabled(),
            deterministic_warn_only=torch.is_deterministic_algorithms_warn_only_enabled(),
            torch_function_enabled=torch._C._is_torch_function_enabled(),
            torch_function_all_disabled=torch._C._is_torch_function_all_disabled(),
            num_threads=torch.get_num_threads(),
            default_dtype=str(torch.get_default_dtype()).replace("torch.", ""),
            cublas_allow_tf32=torch._C._get_cublas_allow_tf32(),
            autocast=autocast,
            default_device=None if current is None else str(current),
            dual_level=torch.autograd.forward_ad._current_level,
            functorch_states=[
                ci.get_state() for ci in retrieve_all_functorch_interpreters()
            ],
            dispatch_tls=(
                torch._C._dispatch_tls_local_include_set().raw_repr(),
                torch._C._dispatch_tls_local_exclude_set().raw_repr(),
            ),
        )

    @contextlib.contextmanager
    def applied(self):
        """Make this the live state while a guard manager is built, then restore."""
        previous = SavedGlobalState.capture()
        with contextlib.ExitStack() as stack:
            self._make_live()
            if self.torch_function_all_disabled:
                stack.enter_context(torch._C.DisableTorchFunction())
            elif not self.torch_function_enabled:
                stack.enter_context(torch._C.DisableTorchFunctionSubclass())
            try:
                yield
            finally:
                previous._make_live()

    def _make_live(self) -> None:
        """Set the process state this object records (torch function state aside:
        it only has context managers, entered by ``applied``)."""
        import torch.utils._device as device_mod

        torch._C._set_grad_enabled(self.grad_enabled)
        torch.use_deterministic_algorithms(
            self.deterministic, warn_only=self.deterministic_warn_only
        )
        torch.set_num_threads(self.num_threads)
        torch.set_default_dtype(getattr(torch, self.default_dtype))
        torch._C._set_cublas_allow_tf32(self.cublas_allow_tf32)
        for device_type, (enabled, dtype) in self.autocast.items():
            torch.set_autocast_enabled(device_type, enabled)
            torch.set_autocast_dtype(device_type, getattr(torch, dtype))
        device_mod.CURRENT_DEVICE = (
            None if self.default_device is None else torch.device(self.default_device)
        )
        torch.autograd.forward_ad._current_level = self.dual_level


def _autocast_device_types() -> list[str]:
    out = []
    for device_type in ("cpu", "cuda", "xpu", "hpu", "mps"):
        try:
            torch.is_autocast_enabled(device_type)
            torch.get_autocast_dtype(device_type)
        except Exception:
            continue
        out.append(device_type)
    return out


@dataclasses.dataclass
class _GuardsContextState:
    aotautograd_guards: list


@dataclasses.dataclass
class _TracingContextState:
    guards_context: _GuardsContextState


@dataclasses.dataclass
class OutputGraphGuardsState:
    """The part of an OutputGraph that guards read, in a form that can be saved.

    A loaded CheckFunctionManager reads it exactly where a compiling one reads the
    OutputGraph (``local_scope``, ``guards``, ``input_source_to_sizes_strides``...).
    ``values`` is the recorded ``name -> value`` table of the GuardBuilder.
    ``guards`` holds the guards' sources and create_fns as saved (two lists, see
    _saved_guards), and the Guards rebuilt from them once
    :func:`load_guards_state` read the state.
    """

    local_scope: dict
    global_scope: dict
    # a list of Guards once loaded; as saved, the pair _saved_guards makes
    guards: Union[list, tuple[list, list]]
    values: dict
    guard_on_key_order: set
    input_source_to_sizes_strides: dict
    torch_function_mode_stack: list
    tracing_context: _TracingContextState
    global_state: SavedGlobalState
    global_module: Optional[str]
    installed_globals: dict
    code_name: str
    framelocals_names: tuple
    torch_version: str
    format_version: int = GUARDS_STATE_FORMAT_VERSION
    export: bool = False
    export_constraints: Any = None


@dataclasses.dataclass
class GuardsState:
    """What ``CheckFunctionManager.guards_state`` pickles."""

    output_graph: OutputGraphGuardsState
    # (python exprs, verbose exprs, guard function body) or None; two parts
    # without the speed-ups (NOTE: [Loaded shape guards reuse the saved guard body])
    shape_code_parts: Optional[tuple]


def _saved_create_fn(guard):
    """The builder method a guard is saved with (see _saved_guards)."""
    create_fn = guard.create_fn
    if isinstance(create_fn, functools.partial) and isinstance(
        create_fn.keywords.get("value"), TensorWeakRef
    ):
        # The builder falls back to get(name) for the value: the recorded one.
        kwargs = {k: v for k, v in create_fn.keywords.items() if k != "value"}
        create_fn = functools.partial(create_fn.func, *create_fn.args, **kwargs)
    return create_fn


def _saved_guards(guards) -> tuple[list, list]:
    """The guards as they are saved: two lists, their originating sources and
    their builder methods (create_fn), what a Guard is rebuilt from (see
    _loaded_guards); every other field (export info, stacks, the cached hash)
    starts empty, as a new Guard's do. Lists, not Guards nor a pair per guard:
    this runs for every guard of every saved frame, a Guard costs ten times more
    to make and three times more to pickle, and every object made on the way
    brings Python's next garbage collection closer."""
    return (
        [g.originating_source for g in guards],
        [
            # (a builder method that is no partial is saved as it is)
            g.create_fn if type(g.create_fn) is not functools.partial else _saved_create_fn(g)
            for g in guards
        ],
    )


def _loaded_guards(saved) -> list:
    """The Guards of saved guards (_saved_guards); a list of Guards (already
    loaded) is kept as it is."""
    from torch._guards import Guard, Source

    if isinstance(saved, list) and all(isinstance(g, Guard) for g in saved):
        return saved
    if not (
        type(saved) is tuple
        and len(saved) == 2
        and all(type(part) is list for part in saved)
        and len(saved[0]) == len(saved[1])
    ):
        raise PackageError("guards state is damaged: its guards are not two lists of a length")
    guards = []
    for source, create_fn in zip(*saved):
        if not (isinstance(source, Source) and callable(create_fn)):
            raise PackageError(
                f"guards state is damaged: a saved guard is a {type(source).__qualname__} "
                f"with a {type(create_fn).__qualname__}"
            )
        guards.append(Guard(source, create_fn))
    return guards


_NOT_RECORDED = object()


def refuse_local_class_type_matches(
    guards, recorded_values: dict, stable_name=find_stable_name
) -> None:
    """TYPE_MATCH compares the class itself: refused for a class defined in local
    scope (see NOTE: [Classes defined in local scope]). Checked before any value
    is converted, so this is the error a user sees, as upstream raises it first.
    ``stable_name``: find_stable_name, or a memo of it."""
    classes = {id(type(v)): type(v) for v in recorded_values.values()}
    if not any(_is_local_class(cls, stable_name) for cls in classes.values()):
        # No recorded value is an instance of a local class: no guard to refuse,
        # and no guard's name (built from its source each time) is needed.
        return
    for guard in guards:
        # The type test first: a guard's name is built from its source each time.
        if not has_guard_type(guard, "TYPE_MATCH"):
            continue
        value = recorded_values.get(guard.name, _NOT_RECORDED)
        if value is _NOT_RECORDED:
            continue
        cls = type(value)
        if _is_local_class(cls):
            raise local_class_refusal("TYPE_MATCH", guard.name, cls)


def _saved_mode_stack(modes) -> list:
    """The torch-function mode stack, as stand-ins of the modes' classes (the
    mode stack check compares the class of each mode)."""
    from torch._dynamo import guard_serialization_codecs as codecs

    out = []
    for i, mode in enumerate(modes or ()):
        ref = find_stable_name(type(mode))
        if ref is None and _is_local_class(type(mode)):
            raise LocalScopeTypeError(
                f"The torch function mode stack guard cannot be serialized. Mode "
                f"stack entry {i}: {local_class_detail(type(mode))}."
            )
        if ref is None:
            raise PackageError(
                f"The torch function mode stack guard cannot be serialized. Mode "
                f"stack entry {i}: {type(mode).__qualname__} has no stable name; "
                "define the mode class at module scope."
            )
        out.append(codecs._ObjectStandIn(ref, {}))
    return out


def _saved_aotautograd_guards(output_graph) -> list:
    from torch._guards import DuplicateInputs, StorageOverlap

    aot_guards = list(output_graph.tracing_context.guards_context.aotautograd_guards)
    for g in aot_guards:
        if not isinstance(g, (DuplicateInputs, StorageOverlap)):
            raise PackageError(f"AOTAutograd guard {g!r:.80} cannot be serialized")
    return aot_guards


def _saved_sizes_strides(output_graph, guards) -> dict:
    """The sizes and strides TENSOR_MATCH takes, for the sources it guards (the
    only reader of input_source_to_sizes_strides)."""
    from torch._dynamo.guards import convert_to_concrete_values

    sizes_strides = output_graph.input_source_to_sizes_strides
    if not sizes_strides:
        return {}
    # Sources are matched by identity first: the builder keys the sizes by the
    # source object it then guards, and a source's hash is worked out again, down
    # its whole chain, each time it is asked (an equal source that is another
    # object is still found, by value).
    key_ids = {id(source) for source in sizes_strides}
    guarded_ids = {
        id(g.originating_source)
        for g in guards
        if id(g.originating_source) in key_ids and has_guard_type(g, "TENSOR_MATCH")
    }
    equal_sources: Optional[set] = None
    saved = {}
    for source, meta in sizes_strides.items():
        if id(source) not in guarded_ids:
            if equal_sources is None:
                equal_sources = {
                    g.originating_source for g in guards if has_guard_type(g, "TENSOR_MATCH")
                }
            if source not in equal_sources:
                continue
        saved[source] = {
            "size": convert_to_concrete_values(meta["size"]),
            "stride": convert_to_concrete_values(meta["stride"]),
        }
    return saved


def framelocals_names(f_code) -> tuple[str, ...]:
    """The names of ``f_code``'s fast locals in frame order (its localsplus)."""
    try:
        from torch._C._dynamo.eval_frame import code_framelocals_names
    except ImportError:
        # NOTE: torch 2.6.0 (a second supported base) binds no
        # code_framelocals_names; on Python 3.11+ its result is the localsplus
        # order: locals and arguments, then cells that are not arguments, then
        # free variables (a cell argument has one slot).
        cells = tuple(c for c in f_code.co_cellvars if c not in f_code.co_varnames)
        return f_code.co_varnames + cells + f_code.co_freevars
    return tuple(code_framelocals_names(f_code))


def build_guards_state(
    f_code,
    output_graph,
    guards,
    recorder: GuardSerializationRecorder,
    global_state: SavedGlobalState,
    shape_code_parts,
) -> GuardsState:
    from torch._dynamo.guard_serialization_codecs import _StandInConverter

    converter = _StandInConverter(recorder, guards)
    refuse_local_class_type_matches(guards, recorder.values, converter.class_name)
    values = {}
    for name, value in recorder.values.items():
        values[name] = converter.convert(value, name, True)

    def scope_view(prefix, scope):
        out = {}
        for key in scope:
            name = f"{prefix}[{key!r}]"
            if name in values:
                out[key] = values[name]
        return out

    local_scope = scope_view("L", output_graph.local_scope)
    global_scope = scope_view("G", output_graph.global_scope)
    installed = {
        k: v
        for k, v in global_scope.items()
        if isinstance(k, str) and is_dynamo_installed_global(k) and isinstance(v, _NamedRef)
    }
    sizes_strides = _saved_sizes_strides(output_graph, guards)
    modes = _saved_mode_stack(output_graph.torch_function_mode_stack)
    aot_guards = _saved_aotautograd_guards(output_graph)
    names = framelocals_names(f_code)
    og_state = OutputGraphGuardsState(
        local_scope=local_scope,
        global_scope=global_scope,
        guards=_saved_guards(guards),
        values=values,
        guard_on_key_order=set(output_graph.guard_on_key_order),
        input_source_to_sizes_strides=sizes_strides,
        torch_function_mode_stack=modes,
        tracing_context=_TracingContextState(_GuardsContextState(aot_guards)),
        global_state=global_state,
        global_module=recorder.global_module,
        installed_globals=installed,
        code_name=f_code.co_name,
        framelocals_names=tuple(names),
        torch_version=str(torch.__version__),
    )
    return GuardsState(og_state, shape_code_parts)


# NOTE: [Pickling OrderedDicts]
# A saved module holds a dozen OrderedDicts (its hook dicts, most of them empty),
# so a state holds dozens. The C pickler reduces an OrderedDict by asking copyreg
# for the slot names of its class, and OrderedDict, a built-in type, cannot cache
# the answer (``__slotnames__`` cannot be set on it): a Python call per dict, six
# times the cost of the dict itself. The pickler's dispatch table reduces it in
# one call to the same (class, (), state, None, items) the built-in reduce gives,
# so the bytes are identical. (The table is copyreg's, as a pickler without one
# uses, plus this entry.)
def _reduce_ordered_dict(od: collections.OrderedDict):
    # The state is object.__getstate__'s: None without instance attributes. It
    # asks copyreg for the slot names too, so an empty dict (most of them) is
    # asked for its instance dict first, the only object it refers to if it
    # has one (vars(od) would make one for every dict).
    state = od.__getstate__() if od or gc.get_referents(od) else None
    return (collections.OrderedDict, (), state, None, iter(od.items()) if od else None)


def pickle_guards_state(state: GuardsState) -> bytes:
    buf = io.BytesIO()
    try:
        pickler = pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL)
        # Exact types only: an OrderedDict subclass reduces as before.
        pickler.dispatch_table = {
            **copyreg.dispatch_table,
            collections.OrderedDict: _reduce_ordered_dict,
        }
        pickler.dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise PackageError(f"guards state could not be pickled: {e}") from e
    return buf.getvalue()


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


# The modules whose dataclasses a guards-state pickle is made of.
_STAND_IN_MODULES = (__name__, "torch._dynamo.guard_serialization_codecs")


def _allowed_global(module: str, name: str):
    """The only globals a guards-state pickle may reference (see GuardsStateUnpickler)."""
    from torch._guards import Source

    if module in _STAND_IN_MODULES:
        # The stand-ins and the state's own dataclasses, nothing else.
        obj = getattr(importlib.import_module(module), name, None)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module:
            return obj
        return None
    if module == "builtins" and name in ("set", "frozenset", "slice", "range", "complex"):
        return getattr(builtins, name)
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    if module == "functools" and name == "partial":
        return functools.partial
    if module == "torch._dynamo.guards" and name.startswith("GuardBuilder."):
        from torch._dynamo.guards import GuardBuilder

        attr = name.split(".", 1)[1]
        if attr.isupper() and hasattr(GuardBuilder, attr):
            return getattr(GuardBuilder, attr)
        return None
    if module in ("torch._dynamo.source", "torch._guards"):
        obj = getattr(sys.modules[module], name, None)
        if isinstance(obj, type) and (
            issubclass(obj, (Source, enum.Enum))
            or obj.__name__ in ("Guard", "DuplicateInputs", "StorageOverlap")
        ):
            return obj
        return None
    return None


class GuardsStateUnpickler(pickle.Unpickler):
    """Unpickles only the classes the guards-state format is made of.

    Everything else (``os.system``, ``subprocess.Popen``, any user class) is
    refused before it is even looked up. Objects saved by name travel as plain
    ``_NamedRef`` data and are resolved after unpickling (see :func:`hydrate`),
    so no pickled instruction ever calls them.
    """

    def find_class(self, module: str, name: str):
        obj = _allowed_global(module, name)
        if obj is None:
            raise PackageError(
                f"refusing to unpickle {module}.{name}: it is not part of the guards "
                "state format (a damaged or malicious file?)"
            )
        return obj


# NOTE: [One guard load path]
# Saved guards are built into a guard manager from what load_guards_state
# returns, and from nothing else: it reads the bytes with the restricted
# unpickler (GuardsStateUnpickler) and rebuilds the saved guards, so whatever
# hydrate() builds from has passed its allow-list. The states it returned are
# remembered by identity (a weak table: a copy or a re-pickle of one is not
# one of them). The earlier spelling also takes the GuardsState that plain
# ``pickle.loads(guards_state)`` returns (CheckFunctionManager(code, state,
# guards_serialization_mode="load")); as_loaded_guards_state() reads such a
# state again through load_guards_state, so the restricted unpickler runs on
# it too and hydrate() has one kind of input. Without a runtime global scope,
# hydrate() binds the globals of the module the guards were saved from only if
# that module is already imported: a module name read from the bytes is never
# imported (importing runs the module's code).
_READ_BY_LOAD_GUARDS_STATE: weakref.WeakValueDictionary[int, OutputGraphGuardsState] = (
    weakref.WeakValueDictionary()
)


def load_guards_state(data: bytes) -> GuardsState:
    """Read ``guards_state`` bytes with the restricted unpickler (see NOTE: [One
    guard load path])."""
    try:
        state = GuardsStateUnpickler(io.BytesIO(data)).load()
    except PackageError:
        raise
    except Exception as e:
        raise PackageError(f"guards state is damaged and cannot be read: {e!r}") from e
    if not isinstance(state, GuardsState):
        raise PackageError(
            f"guards state holds a {type(state).__qualname__}, not a GuardsState"
        )
    og = state.output_graph
    if isinstance(og, OutputGraphGuardsState):
        if og.format_version == GUARDS_STATE_FORMAT_VERSION:
            # (a state of another format is refused by its version, in hydrate)
            og.guards = _loaded_guards(og.guards)
        _READ_BY_LOAD_GUARDS_STATE[id(og)] = og
    return state


def read_by_load_guards_state(output_graph) -> bool:
    """Whether ``output_graph`` is the state of a GuardsState that
    :func:`load_guards_state` returned (NOTE: [One guard load path])."""
    return _READ_BY_LOAD_GUARDS_STATE.get(id(output_graph)) is output_graph


def as_loaded_guards_state(state: GuardsState) -> GuardsState:
    """``state`` if :func:`load_guards_state` returned its output graph state;
    otherwise (the earlier spelling's ``pickle.loads(guards_state)``) the same state
    read again through load_guards_state (NOTE: [One guard load path])."""
    if not isinstance(state, GuardsState):
        raise PackageError(
            f"cannot load guards from a {type(state).__qualname__}; read the "
            "guards_state bytes with load_guards_state"
        )
    if read_by_load_guards_state(state.output_graph):
        return state
    return load_guards_state(pickle_guards_state(state))


def check_state_compatible(og: OutputGraphGuardsState, f_code) -> None:
    if og.format_version != GUARDS_STATE_FORMAT_VERSION:
        raise PackageError(
            f"guards state format {og.format_version} is not supported (this torch "
            f"reads format {GUARDS_STATE_FORMAT_VERSION})"
        )
    if og.torch_version != str(torch.__version__):
        raise PackageError(
            f"guards were saved by torch {og.torch_version}, this is torch "
            f"{torch.__version__}"
        )
    names = framelocals_names(f_code)
    if og.code_name != f_code.co_name or og.framelocals_names != names:
        raise PackageError(
            f"guards were saved for code {og.code_name!r} with locals "
            f"{og.framelocals_names}, not for {f_code.co_name!r} with locals {names}"
        )


def check_shape_code_parts(parts) -> None:
    """Refuses shape code parts that are not what a save writes: None, or the
    python and verbose expressions (two lists of str) and, with the speed-ups,
    the guard function's body (a str), all of which the load turns into code
    (NOTE: [Loaded shape guards reuse the saved guard body])."""
    if parts is None:
        return
    if not (
        isinstance(parts, tuple)
        and len(parts) in (2, 3)
        and all(isinstance(exprs, (list, tuple)) and all(isinstance(e, str) for e in exprs) for exprs in parts[:2])
        and (len(parts) == 2 or isinstance(parts[2], str))
    ):
        raise PackageError(
            "guards state is damaged: its shape guards are not two lists of expressions "
            "and a guard body"
        )


def resolve_name(ref: _NamedRef):
    if isinstance(ref, _FSDPClassRef):
        return _resolve_fsdp_class(ref)
    module = sys.modules.get(ref.module)
    if module is None and (
        ref.module in _IMPORTABLE_AT_LOAD
        or ref.module == "torch"
        or ref.module.startswith("torch.")
    ):
        try:
            module = importlib.import_module(ref.module)
        except Exception:
            module = None
    if module is None:
        log.debug("guard serialization: module %s is not imported", ref.module)
        return UnresolvedName(ref.module, ref.path)
    try:
        return _resolve_path(module, ref.path)
    except Exception:
        log.debug("guard serialization: %s:%s does not resolve", ref.module, ref.path)
        return UnresolvedName(ref.module, ref.path)



@dataclasses.dataclass
class LoadedGuardsState:
    """A GuardsState with its stand-ins turned back into objects."""

    output_graph: OutputGraphGuardsState
    shape_code_parts: Optional[tuple]
    runtime_global_scope: dict
    # Objects only weak references in the values hold (NOTE: [Weak references
    # in guarded values]).
    keep_alive: list = dataclasses.field(default_factory=list)


# NOTE: [Names a loaded entry installs keep their numbers]
# A loaded entry installs the globals its bytecode and guards read under their
# saved names (the builtins dict as __builtins_dict___0, modules, named
# objects): its guards name them (G['__builtins_dict___0']['len']), so they
# cannot be renamed as its graphs and resume functions are. Dynamo numbers the
# globals it installs from one per-process counter (unique_id) and asserts that
# a name it installs is new; after a load, the next compile in the same module
# (a miss of a torch nn module's frame, whose globals are Dynamo's
# external_utils) would choose __builtins_dict___0 again and fail that assert.
# So a load moves the counter past every number the names it installed carry
# (hydrate() for the guards' installed globals, CompilePackage for the
# bytecode's).
_DYNAMO_NUMBERED_NAME = re.compile(r"_(\d+)$")


def reserve_dynamo_global_names(names) -> None:
    """See NOTE: [Names a loaded entry installs keep their numbers]."""
    numbers = [int(m.group(1)) for name in names if (m := _DYNAMO_NUMBERED_NAME.search(name))]
    if not numbers:
        return
    from torch._dynamo import bytecode_transformation

    following = next(bytecode_transformation._unique_id_counter)
    bytecode_transformation._unique_id_counter = itertools.count(
        max(following, max(numbers) + 1)
    )


def _saved_module_globals(module_name: Optional[str]) -> dict:
    """The globals of the module the guards were saved from, which must be
    imported already (NOTE: [One guard load path])."""
    if not module_name:
        return {}
    module = sys.modules.get(module_name)
    if module is None:
        raise PackageError(
            f"guards read globals of module {module_name!r}, which is not imported; "
            "import it first, or load with the globals of the code the guards are "
            "for (torch._dynamo.package.load_guard_manager(state, code, f_globals))"
        )
    return vars(module)


def hydrate(state: GuardsState, f_code, runtime_global_scope=None) -> LoadedGuardsState:
    """The state :func:`load_guards_state` read, with its stand-ins turned back
    into objects, for guards of ``f_code``. ``runtime_global_scope``: the
    globals the guards bind to (by default those of the module the guards were
    saved from, if it is imported; see NOTE: [One guard load path])."""
    from torch._dynamo.guard_serialization_codecs import _Hydrator

    state = as_loaded_guards_state(state)
    og = state.output_graph
    check_state_compatible(og, f_code)
    check_shape_code_parts(state.shape_code_parts)
    if runtime_global_scope is None:
        runtime_global_scope = _saved_module_globals(og.global_module)
    h = _Hydrator()
    values = {name: h(v) for name, v in og.values.items()}
    for name, ref in og.installed_globals.items():
        runtime_global_scope.setdefault(name, resolve_name(ref))
    reserve_dynamo_global_names(og.installed_globals)
    loaded = dataclasses.replace(
        og,
        local_scope={k: h(v) for k, v in og.local_scope.items()},
        global_scope={k: h(v) for k, v in og.global_scope.items()},
        values=values,
        torch_function_mode_stack=[h(m) for m in og.torch_function_mode_stack],
    )
    return LoadedGuardsState(loaded, state.shape_code_parts, runtime_global_scope, h.keep_alive)
