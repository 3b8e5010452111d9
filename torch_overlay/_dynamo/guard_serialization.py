"""Serialization of Dynamo guards: save a guard manager, rebuild it in another process.

``CheckFunctionManager(code, output_graph, guards_serialization_mode="save")``
records, while it builds the guards, every value the GuardBuilder reads; this
module turns those values and the rest of what the guards depend on (the guards
themselves, tensor metadata, shape-env guard code, the global state, the
torch-function mode stack, functorch and forward-AD levels) into a
:class:`GuardsState`, pickled into ``CheckFunctionManager.guards_state``.
``CheckFunctionManager(code, state, guards_serialization_mode="load")`` rebuilds
the same C++ GuardManager tree from it.

Provides :class:`GuardsState`, :class:`OutputGraphGuardsState`,
:func:`pickle_guards_state`, :func:`load_guards_state` (a restricted unpickler),
the refusal policy (:data:`UNSUPPORTED_SERIALIZATION_GUARD_TYPES`,
:data:`SERIALIZATION_REFUSAL_REASONS`, :func:`refusal_message`,
:class:`LocalScopeTypeError`) and the recorder the GuardBuilder reports to.

# NOTE: [Guard serialization by recorded values]
# The GuardBuilder decides everything from values it reads with ``self.get(name)``
# (a type id, a constant, a length, dict keys, a tensor's dtype/device/dispatch
# keys...) and binds accessors by SOURCE, not by value. So saving records
# ``name -> value`` for every name the builder evaluates, and loading answers
# ``get(name)`` from that table: the same builder code then makes the same
# decisions and builds the same tree, without the original objects.
#
# Recorded values are converted into stand-ins that are cheap and safe to pickle:
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
# # NOTE: [Runtime globals]
# The C++ globals accessor binds to a dict object when built. A loaded manager
# must bind to the RUNTIME globals of the module that owns the code (binding to
# a saved copy would silently check stale values), while the values it is built
# from are the SAVED ones. The GuardBuilder therefore keeps the two apart:
# ``scope["G"]`` for values, ``runtime_global_scope`` for binding.
"""

from __future__ import annotations

import builtins
import collections
import contextlib
import dataclasses
import enum
import functools
import importlib
import io
import logging
import pickle
import re
import sys
import types
import weakref
from typing import Any, Optional

import torch
from torch._dynamo.exc import PackageError


log = logging.getLogger(__name__)

# 2: tensor stand-ins carry their functorch wrapper; the global state carries
# the thread-local dispatch key sets.
# 3: stand-ins of local classes, tensor subclasses and dict views.
GUARDS_STATE_FORMAT_VERSION = 3

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

IDENTITY_GUARD_TYPES = frozenset(
    {
        "ID_MATCH",
        "FUNCTION_MATCH",
        "CLOSURE_MATCH",
        "BUILTIN_MATCH",
        "PYMODULE_MATCH",
        "NN_MODULE",
        "CONSTANT_MATCH",
        "TENSOR_MATCH",
    }
)

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
# Stand-ins: what a recorded value becomes in the pickle.
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Placeholder:
    """A value that is reachable from a guarded object but not guarded."""

    type_name: str


@dataclasses.dataclass
class _NamedRef:
    """An object saved by name: ``path`` is an attribute path from ``module``."""

    module: str
    path: str


@dataclasses.dataclass
class _LocalClassStandIn:
    """A class with no stable name (defined in local scope): rebuilt as a class of
    the same name over the same named bases, with the same attribute names (see
    NOTE: [Classes defined in local scope])."""

    module: str
    qualname: str
    name: str
    # _NamedRef or _LocalClassStandIn per base, in order
    bases: tuple
    attribute_names: tuple
    slots: Optional[tuple] = None


@dataclasses.dataclass
class _ObjectStandIn:
    """An instance of a class, rebuilt without running its ``__init__``."""

    cls: Any  # _NamedRef or _LocalClassStandIn
    state: dict
    slots: Optional[dict] = None


@dataclasses.dataclass(frozen=True)
class _FrozenObjectStandIn:
    """A hashable instance (a frozen dataclass, used as a dict key or set item)."""

    cls: tuple  # (module, path)
    state: tuple  # sorted (name, value) pairs


@dataclasses.dataclass
class _TensorStandIn:
    dtype: str
    device: str
    requires_grad: bool
    is_parameter: bool
    conj: bool
    neg: bool
    attrs: dict
    dispatch_keys: tuple
    # TENSOR_MATCH takes sizes and strides explicitly but the rank from the
    # tensor: the stand-in has the saved number of dims (and no elements).
    ndim: int = 1
    # The outermost functorch wrapper of a tensor seen inside vmap / grad / jvp /
    # functionalize ("batched", "grad" or "functional"), or None. See
    # NOTE: [Functorch-wrapped tensor stand-ins].
    functorch_wrapper: Optional[str] = None
    # made under inference_mode: no autograd dispatch keys
    is_inference: bool = False
    # A tensor subclass without __tensor_flatten__ (the stand-in is
    # ``as_subclass`` of a plain one): the class by name.
    subclass: Optional[_NamedRef] = None


@dataclasses.dataclass
class _WrapperSubclassStandIn:
    """A traceable wrapper tensor subclass (``__tensor_flatten__`` /
    ``__tensor_unflatten__``), see NOTE: [Tensor subclass stand-ins]."""

    cls: _NamedRef
    # inner attribute name -> _TensorStandIn / _WrapperSubclassStandIn
    inner: dict
    # the flatten context (what TENSOR_SUBCLASS_METADATA_MATCH compares)
    ctx: Any
    ndim: int
    attrs: dict


@dataclasses.dataclass
class _DictViewStandIn:
    """``d.keys()``, ``d.values()`` or ``d.items()`` (``kind``) of a rebuilt dict."""

    kind: str
    items: dict
    ordered: bool


@dataclasses.dataclass
class _FunctionStandIn:
    """A function with no stable name, read only as the base of guarded values
    (its ``__code__``, defaults...): a function object of its own with the saved
    defaults; identity guards on what it holds are recorded separately."""

    name: str
    defaults: Optional[tuple]
    kwdefaults: Optional[dict]


@dataclasses.dataclass
class _TupleSubclassStandIn:
    """A namedtuple (or other tuple subclass) instance."""

    cls: _NamedRef
    items: tuple


@dataclasses.dataclass
class _PartialStandIn:
    func: Any
    args: tuple
    keywords: dict


@dataclasses.dataclass
class _BoundMethodStandIn:
    func: Any
    owner: Any


@dataclasses.dataclass
class _CellStandIn:
    contents: Any
    empty: bool


@dataclasses.dataclass
class _DeviceStandIn:
    spec: str


@dataclasses.dataclass
class _SizeStandIn:
    dims: tuple


@dataclasses.dataclass
class _DtypeStandIn:
    name: str


@dataclasses.dataclass
class _EnumStandIn:
    cls: _NamedRef
    member: str


@dataclasses.dataclass
class _MappingProxyStandIn:
    mapping: dict


@dataclasses.dataclass
class _TupleIteratorStandIn:
    remaining: tuple


@dataclasses.dataclass
class _RangeIteratorStandIn:
    start: int
    stop: int
    step: int
    index: int


@dataclasses.dataclass
class _DispatchKeySetStandIn:
    keys: tuple


# NOTE: [Weak references in guarded values]
# A weakref.ref is guarded by its type (nn.LSTM / GRU keep _flat_weight_refs,
# weak references to their parameters, and Dynamo's TYPE_MATCH on them compares
# the class weakref.ReferenceType, which has a stable name). The stand-in is a
# real weakref.ref to the stand-in of its referent (the same stand-in a guard on
# the referent itself gets, so identities agree), kept alive while the guards
# are built; a reference that was dead at save is dead again at load.
@dataclasses.dataclass
class _WeakrefStandIn:
    referent: Any
    dead: bool


@dataclasses.dataclass
class _DefaultDictStandIn:
    factory: Any
    items: dict


def _placeholder_function(*args, **kwargs):
    """The code of functions that stand in for functions with no stable name."""


class UnresolvedName:
    """What a saved name that no longer resolves loads as: it matches no guard."""

    def __init__(self, module: str, path: str) -> None:
        self.module = module
        self.path = path

    def __repr__(self) -> str:
        return f"<unresolved {self.module}:{self.path}>"


_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, bytes, type(Ellipsis))

# Classes whose own __new__ makes an empty instance without side effects.
_SAFE_NEW_TYPES = (types.SimpleNamespace,)
_SAFE_NEWS = tuple(t.__new__ for t in _SAFE_NEW_TYPES)


class _LocalClassAttribute:
    """The value of every attribute of a rebuilt local class (see NOTE: [Classes
    defined in local scope]): present, so ``hasattr`` agrees, and never read by
    a guard (the values guards read are recorded by their source)."""

    def __repr__(self) -> str:
        return "<attribute of a class defined in local scope>"


_LOCAL_CLASS_ATTRIBUTE = _LocalClassAttribute()


def _is_constant(value) -> bool:
    return type(value) in _CONSTANT_TYPES or value is NotImplemented


# ---------------------------------------------------------------------------
# Stable names
# ---------------------------------------------------------------------------


_PATH_PART = re.compile(r"(\w+)((?:\[\d+\])*)$")


def _resolve_path(root, path: str):
    """``root`` followed along ``path``: dotted attributes, each optionally
    indexed by integers (``fn.__closure__[0].cell_contents``)."""
    obj = root
    for part in path.split(".") if path else ():
        match = _PATH_PART.match(part)
        if match is None:
            raise ValueError(f"not an attribute path: {path!r}")
        obj = getattr(obj, match.group(1))
        for index in re.findall(r"\[(\d+)\]", match.group(2)):
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


# ---------------------------------------------------------------------------
# Saving
# ---------------------------------------------------------------------------


class GuardSerializationRecorder:
    """Collects what the GuardBuilder reads while building guards in save mode."""

    def __init__(self, global_module: Optional[str]) -> None:
        self.global_module = global_module
        self.values: dict[str, Any] = {}
        self.sources: dict[int, str] = {}
        # id(value) -> (guard type, source name, source) of identity guards
        self.identity: dict[int, tuple[str, str, Any]] = {}
        self.keep_alive: list[Any] = []

    def record(self, name: str, value) -> None:
        if name not in self.values:
            self.values[name] = value
            self.sources.setdefault(id(value), name)
            self.keep_alive.append(value)

    def require_identity(self, value, guard) -> None:
        if _is_constant(value) and (value is None or isinstance(value, bool)):
            return
        create_fn = guard.create_fn
        while hasattr(create_fn, "func"):
            create_fn = create_fn.func
        self.identity.setdefault(
            id(value), (create_fn.__name__, guard.name, guard.originating_source)
        )
        self.keep_alive.append(value)


def guard_type_names(guard) -> list[str]:
    """The guard's own type and the ones its builder method ran (SEQUENCE_LENGTH
    runs TYPE_MATCH...), outermost first."""
    create_fn = guard.create_fn
    while isinstance(create_fn, functools.partial):
        create_fn = create_fn.func
    names = [create_fn.__name__]
    names.extend(n for n in (guard.guard_types or ()) if n not in names)
    return names


class _StandInConverter:
    """Converts recorded values into stand-ins (see NOTE: [Guard serialization ...])."""

    def __init__(self, recorder: GuardSerializationRecorder, guards=()) -> None:
        self.recorder = recorder
        self.memo: dict[int, Any] = {}
        self.recorded_ids = {id(v) for v in recorder.values.values()}
        # source name -> the guard types built on it, to name them in refusals
        self.guard_types_by_name: dict[str, list[str]] = {}
        for guard in guards:
            types_here = self.guard_types_by_name.setdefault(guard.name, [])
            types_here.extend(n for n in guard_type_names(guard) if n not in types_here)

    def path_of(self, obj, fallback: str) -> str:
        return self.recorder.sources.get(id(obj), fallback)

    def guard_type_at(self, path: str, prefer=()) -> str:
        """The guard type to name in a refusal for a value at ``path``: one built
        on ``path`` (``prefer``-red types first), else on the closest source that
        ``path`` is reached from."""
        name = path
        while True:
            types_here = self.guard_types_by_name.get(name)
            if types_here:
                return next((t for t in prefer if t in types_here), types_here[0])
            parent = _parent_source_name(name)
            if parent is None:
                return prefer[0] if prefer else "TYPE_MATCH"
            name = parent

    def refusal(self, path: str, detail: str, prefer=()) -> PackageError:
        return PackageError(refusal_message(self.guard_type_at(path, prefer), path, detail))

    def convert(self, obj, path: str, guarded: bool):
        """``guarded``: the builder read this value, so it must be faithful."""
        if _is_constant(obj):
            return obj
        key = id(obj)
        # An identity guard decides before the memo: the object may have been
        # converted already as a value (a local class as the class of an
        # instance), which would not be found again by identity.
        if key in self.recorder.identity and not isinstance(self.memo.get(key), _NamedRef):
            guard_type, source_name, source = self.recorder.identity[key]
            ref = find_stable_name(
                obj, source, self.recorder.global_module, self.recorder.values
            )
            if ref is None:
                if _is_local_class(obj):
                    raise local_class_refusal(guard_type, source_name, obj)
                what = type(obj).__qualname__
                raise PackageError(
                    refusal_message(
                        guard_type,
                        source_name,
                        f"it guards on the identity of a {what} that has no stable "
                        "name in another process; define it at module scope (a "
                        "class or function defined inside a function cannot be "
                        "found again) or pass it as an input",
                    )
                )
            self.memo[key] = ref
            return ref
        if key in self.memo:
            return self.memo[key]
        guarded = guarded or key in self.recorded_ids
        path = self.path_of(obj, path)
        return self._convert_uncached(obj, path, guarded)

    def _convert_uncached(self, obj, path, guarded):
        key = id(obj)
        if isinstance(obj, torch.dtype):
            return _DtypeStandIn(str(obj).replace("torch.", ""))
        if isinstance(obj, torch.device):
            return _DeviceStandIn(str(obj))
        if isinstance(obj, torch.Size):
            return _SizeStandIn(tuple(int(d) for d in obj))
        if isinstance(obj, (torch.layout, torch.memory_format)):
            return _NamedRef("torch", str(obj).replace("torch.", ""))
        if isinstance(obj, enum.Enum):
            cls_ref = find_stable_name(type(obj))
            if cls_ref is None:
                return self._unnamed(obj, path, guarded)
            return _EnumStandIn(cls_ref, obj.name)
        if isinstance(obj, (types.ModuleType, type, types.FunctionType,
                            types.BuiltinFunctionType, types.MethodDescriptorType,
                            types.WrapperDescriptorType, types.CodeType)) or (
            obj is builtins.__dict__
        ):
            ref = find_stable_name(
                obj,
                self._source_for(obj),
                self.recorder.global_module,
                self.recorder.values,
            )
            if ref is None:
                return self._unnamed(obj, path, guarded)
            self.memo[key] = ref
            return ref
        if isinstance(obj, torch.Tensor):
            if not guarded:
                return _Placeholder(type(obj).__qualname__)
            return self._tensor(obj, path)
        if type(obj) in (dict, collections.OrderedDict):
            out = type(obj)()
            self.memo[key] = out
            for k, v in obj.items():
                out[self._key(k, path)] = self._child(v, f"{path}[{k!r}]", guarded)
            return out
        if type(obj) is collections.defaultdict:
            out = _DefaultDictStandIn(None, {})
            self.memo[key] = out
            out.factory = self._child(obj.default_factory, f"{path}.default_factory", guarded)
            for k, v in obj.items():
                out.items[self._key(k, path)] = self._child(v, f"{path}[{k!r}]", guarded)
            return out
        if type(obj) is list:
            out_list: list = []
            self.memo[key] = out_list
            out_list.extend(
                self._child(v, f"{path}[{i}]", guarded) for i, v in enumerate(obj)
            )
            return out_list
        if type(obj) is tuple:
            return tuple(self._child(v, f"{path}[{i}]", guarded) for i, v in enumerate(obj))
        if type(obj) in (set, frozenset):
            return type(obj)(self._key(v, path) for v in obj)
        if type(obj) is slice:
            return slice(
                *(self.convert(x, path, True) for x in (obj.start, obj.stop, obj.step))
            )
        if type(obj) is range:
            return obj
        if isinstance(obj, types.MappingProxyType):
            return _MappingProxyStandIn(self.convert(dict(obj), path, guarded))
        if type(obj).__name__ == "tuple_iterator":
            _, (seq,), index = obj.__reduce__()
            return _TupleIteratorStandIn(
                tuple(self._child(v, path, guarded) for v in seq[index:])
            )
        if type(obj).__name__ == "range_iterator":
            _, (rng,), index = obj.__reduce__()
            return _RangeIteratorStandIn(rng.start, rng.stop, rng.step, index)
        if isinstance(obj, torch._C.DispatchKeySet):
            return _DispatchKeySetStandIn(_key_set_names(obj))
        if type(obj) is weakref.ReferenceType:
            # See NOTE: [Weak references in guarded values]
            referent = obj()
            if referent is None:
                return _WeakrefStandIn(None, True)
            return _WeakrefStandIn(self._child(referent, f"{path}()", guarded), False)
        if type(obj) in _DICT_VIEW_KINDS and guarded:
            kind, ordered = _DICT_VIEW_KINDS[type(obj)]
            view = _DictViewStandIn(kind, {}, ordered)
            self.memo[key] = view
            for k, v in obj.mapping.items():
                view.items[self._key(k, path)] = self._child(v, f"{path}[{k!r}]", True)
            return view
        if not guarded:
            return _Placeholder(type(obj).__qualname__)
        ref = find_stable_name(obj) if hasattr(obj, "__qualname__") else None
        if ref is not None:
            # e.g. an lru_cache-wrapped module-level function
            self.memo[key] = ref
            return ref
        if isinstance(obj, tuple):
            cls_ref = self._class_ref(type(obj), path)
            if cls_ref is None:
                return self._unnamed(obj, path, guarded)
            out_t = _TupleSubclassStandIn(cls_ref, ())
            self.memo[key] = out_t
            out_t.items = tuple(self._child(v, f"{path}[{i}]", True) for i, v in enumerate(obj))
            return out_t
        if type(obj) is functools.partial:
            return _PartialStandIn(
                self.convert(obj.func, f"{path}.func", True),
                tuple(self._child(a, f"{path}.args", True) for a in obj.args),
                {k: self._child(v, f"{path}.keywords", True) for k, v in obj.keywords.items()},
            )
        if isinstance(obj, types.MethodType):
            return _BoundMethodStandIn(
                self.convert(obj.__func__, f"{path}.__func__", True),
                self.convert(obj.__self__, f"{path}.__self__", True),
            )
        if isinstance(obj, types.CellType):
            try:
                return _CellStandIn(self._child(obj.cell_contents, f"{path}.cell_contents", True), False)
            except ValueError:
                return _CellStandIn(None, True)
        if (hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__")) and not isinstance(obj, type):
            return self._object(obj, path)
        if guarded:
            raise self.refusal(
                path,
                f"the guarded value (a {type(obj).__qualname__}) cannot be "
                "serialized; guard on something else or keep it out of the compiled region",
            )
        return _Placeholder(type(obj).__qualname__)

    def _class_ref(self, cls, path: str):
        """A class by name, or the stand-in of a class defined in local scope."""
        ref = find_stable_name(cls)
        if ref is None and _is_local_class(cls):
            return self._local_class(cls, path)
        return ref

    def _local_class(self, cls, path: str):
        """See NOTE: [Classes defined in local scope]."""
        if id(cls) in self.memo:
            return self.memo[id(cls)]
        own = vars(cls)
        slots = own.get("__slots__")
        if slots is not None:
            slots = (slots,) if isinstance(slots, str) else tuple(slots)
        stand_in = _LocalClassStandIn(
            module=cls.__module__,
            qualname=cls.__qualname__,
            name=cls.__name__,
            bases=(),
            attribute_names=tuple(
                sorted(
                    name
                    for name in own
                    if not (name.startswith("__") and name.endswith("__"))
                    and name not in (slots or ())
                )
            ),
            slots=slots,
        )
        self.memo[id(cls)] = stand_in
        bases = []
        for base in cls.__bases__:
            base_ref = self._class_ref(base, path)
            if base_ref is None:
                raise self.refusal(
                    path,
                    f"its class {cls.__qualname__}, defined in local scope, cannot be "
                    f"rebuilt in another process: its base {base!r} has no stable name",
                )
            bases.append(base_ref)
        stand_in.bases = tuple(bases)
        return stand_in

    def _source_for(self, obj):
        entry = self.recorder.identity.get(id(obj))
        return entry[2] if entry else None

    def _unnamed(self, obj, path, guarded):
        if _is_local_class(obj):
            # Read as a value (HASATTR on a class...), never compared by identity:
            # identity guards were refused in convert().
            return self._local_class(obj, path)
        if isinstance(obj, types.FunctionType):
            return _FunctionStandIn(
                obj.__name__,
                None if obj.__defaults__ is None else self._child(obj.__defaults__, f"{path}.__defaults__", True),
                None if obj.__kwdefaults__ is None else self._child(obj.__kwdefaults__, f"{path}.__kwdefaults__", True),
            )
        if isinstance(obj, types.CodeType) or (
            # A method bound to an instance (L['x'].dim of a tensor): read as the
            # example value of an attribute accessor (HASATTR), never compared.
            isinstance(obj, types.BuiltinMethodType)
            and not isinstance(getattr(obj, "__self__", None), types.ModuleType)
        ):
            # Read only as the base of other guarded values (whose own values are
            # recorded); an identity guard on it is refused where it is required.
            return _Placeholder(type(obj).__qualname__)
        if guarded:
            raise self.refusal(
                path,
                f"the guarded value ({obj!r:.80}) has no stable name in another "
                "process; define it at module scope",
            )
        return _Placeholder(type(obj).__qualname__)

    def _key(self, k, path):
        if _is_constant(k):
            return k
        if (
            dataclasses.is_dataclass(k)
            and not isinstance(k, type)
            and type(k).__dataclass_params__.frozen
        ):
            cls_ref = find_stable_name(type(k))
            if cls_ref is not None:
                return _FrozenObjectStandIn(
                    (cls_ref.module, cls_ref.path),
                    tuple(
                        sorted(
                            (f.name, self._key(getattr(k, f.name), path))
                            for f in dataclasses.fields(k)
                        )
                    ),
                )
        if _is_local_class(k):
            # Class keys are guarded by identity (ID_MATCH on the key).
            raise local_class_refusal("ID_MATCH", f"a key of {path}", k)
        converted = self.convert(k, path, True)
        if isinstance(converted, (_NamedRef, _EnumStandIn, _DtypeStandIn, _DeviceStandIn, tuple, frozenset)):
            return converted if not isinstance(converted, _NamedRef) else ("__named__", converted.module, converted.path)
        raise self.refusal(path, f"its dict key {k!r:.80} cannot be serialized")

    def _child(self, value, path, parent_guarded):
        """A value held by a container or object: faithful only where needed."""
        if _is_constant(value):
            return value
        if id(value) in self.recorded_ids or id(value) in self.recorder.identity:
            return self.convert(value, path, True)
        if type(value) in (dict, collections.OrderedDict, list, tuple, collections.defaultdict):
            return self.convert(value, path, False)
        if parent_guarded and type(value) in (set, frozenset, slice, range, torch.Size):
            return self.convert(value, path, True)
        if isinstance(value, (torch.dtype, torch.device, enum.Enum)) and parent_guarded:
            return self.convert(value, path, True)
        if id(value) in self.memo:
            return self.memo[id(value)]
        return _Placeholder(type(value).__qualname__)

    def _tensor(self, t: torch.Tensor, path: str):
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        cls = type(t)
        subclass_ref = None
        if cls not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
            t, torch.nn.parameter.Buffer
        ):
            subclass_guards = ("TENSOR_SUBCLASS_METADATA_MATCH", "TENSOR_MATCH")
            subclass_ref = find_stable_name(cls)
            if subclass_ref is None and _is_local_class(cls):
                raise local_class_refusal(
                    self.guard_type_at(path, subclass_guards), path, cls
                )
            if subclass_ref is None:
                raise self.refusal(
                    path,
                    f"tensor subclass {cls.__qualname__} has no stable name in "
                    "another process",
                    subclass_guards,
                )
            if is_traceable_wrapper_subclass(t):
                return self._wrapper_subclass(t, path, subclass_ref)
        stand_in = _TensorStandIn(
            dtype=str(t.dtype).replace("torch.", ""),
            device=str(t.device),
            requires_grad=bool(t.requires_grad),
            is_parameter=isinstance(t, torch.nn.Parameter),
            conj=bool(t.is_conj()),
            neg=bool(t.is_neg()),
            attrs=self._tensor_attrs(t, path),
            dispatch_keys=_dispatch_key_names(t),
            ndim=t.dim(),
            functorch_wrapper=_functorch_wrapper_kind(t),
            is_inference=bool(t.is_inference()),
            subclass=subclass_ref,
        )
        self._check_reproduced(t, _make_tensor(stand_in), path)
        self.memo[id(t)] = stand_in
        return stand_in

    def _tensor_attrs(self, t: torch.Tensor, path: str) -> dict:
        return {
            k: self.convert(v, f"{path}.{k}", True)
            for k, v in vars(t).items()
            if k.startswith("_dynamo_")
        }

    def _wrapper_subclass(self, t: torch.Tensor, path: str, cls_ref: _NamedRef):
        """See NOTE: [Tensor subclass stand-ins]."""
        inner_names, ctx = t.__tensor_flatten__()
        stand_in = _WrapperSubclassStandIn(cls_ref, {}, None, t.dim(), {})
        self.memo[id(t)] = stand_in
        for name in inner_names:
            stand_in.inner[name] = self.convert(getattr(t, name), f"{path}.{name}", True)
        stand_in.ctx = self.convert(ctx, f"{path}.__tensor_flatten__()[1]", True)
        stand_in.attrs = self._tensor_attrs(t, path)
        try:
            proxy = _Hydrator()(stand_in)
        except Exception as e:
            raise self.refusal(
                path,
                f"tensor subclass {type(t).__qualname__} cannot be rebuilt with "
                f"__tensor_unflatten__ from stand-ins of its inner tensors ({e!r:.200})",
                ("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
            ) from e
        self._check_reproduced(t, proxy, path)
        return stand_in

    def _check_reproduced(self, t: torch.Tensor, proxy: torch.Tensor, path: str) -> None:
        """TENSOR_MATCH compares what it reads from the stand-in: it must agree."""

        def seen(x):
            return (
                type(x).__qualname__,
                _dispatch_key_names(x),
                bool(x.requires_grad),
                x.dtype,
                x.device,
            )

        if seen(proxy) != seen(t):
            raise self.refusal(
                path,
                f"a stand-in tensor cannot reproduce what the guard reads from it "
                f"(type, dispatch keys, requires_grad, dtype, device): {seen(t)} "
                f"became {seen(proxy)}; sparse, nested and quantized inputs are not "
                "supported",
                ("TENSOR_MATCH",),
            )

    def _object(self, obj, path):
        cls = type(obj)
        cls_ref = self._class_ref(cls, path)
        if cls_ref is None:
            raise self.refusal(
                path,
                f"it is an instance of {cls.__qualname__}, a class with no stable "
                "name in another process; define the class at module scope",
            )
        if cls.__new__ is not object.__new__ and cls.__new__ not in _SAFE_NEWS:
            raise self.refusal(
                path,
                f"it is an instance of {cls.__qualname__}, whose custom __new__ "
                "cannot be replayed safely at load",
            )
        stand_in = _ObjectStandIn(cls_ref, {})
        self.memo[id(obj)] = stand_in
        for k, v in getattr(obj, "__dict__", {}).items():
            stand_in.state[k] = self._child(v, f"{path}.{k}", True)
        slot_names = [
            name
            for klass in type(obj).__mro__
            for name in (klass.__dict__.get("__slots__", ()) if isinstance(klass.__dict__.get("__slots__", ()), (tuple, list)) else (klass.__dict__["__slots__"],))
            if name not in ("__dict__", "__weakref__")
        ]
        if slot_names:
            stand_in.slots = {
                name: self._child(getattr(obj, name), f"{path}.{name}", True)
                for name in slot_names
                if hasattr(obj, name)
            }
        return stand_in


# NOTE: [Classes defined in local scope]
# A class defined inside a function (most tests and notebooks define their
# nn.Module that way) has no name another process can resolve. Most guards on
# its instances never need the class itself: HASATTR, NOT_PRESENT_IN_GENERIC_DICT,
# EMPTY_NN_MODULE_HOOKS_DICT and the TENSOR_MATCH guards on a module's parameters
# read the instance's attributes, and the builder only asks the instance
# ``hasattr`` / ``__dict__`` / ``isinstance(.., nn.Module)`` questions. So the
# class is saved as its name, its named bases and the names of its own class
# attributes (and ``__slots__``), and rebuilt at load as a class with the same
# bases whose attributes are placeholders: those questions get the same answers.
# Guards that compare the class itself (TYPE_MATCH, ID_MATCH on the class, the
# Python type TENSOR_MATCH checks) would compare against the rebuilt class: they
# are refused with LocalScopeTypeError (upstream's TypeError, also a PackageError)
# telling the user to define the class at global scope.
#
# NOTE: [Tensor subclass stand-ins]
# A traceable wrapper subclass (``__tensor_flatten__`` / ``__tensor_unflatten__``,
# e.g. TwoTensor) is guarded by TENSOR_MATCH on itself and on its inner tensors,
# by an EQUALS_MATCH on its inner attribute names, and by
# TENSOR_SUBCLASS_METADATA_MATCH, which compares the flatten context (through the
# class's ``__metadata_guard__`` where it has one). All of these read the
# subclass instance, not its data, so the stand-in is the class (by name)
# unflattened from stand-ins of the inner tensors and the saved context, with
# empty sizes: TENSOR_MATCH takes sizes and strides explicitly. A subclass
# without ``__tensor_flatten__`` is a plain stand-in viewed ``as_subclass``.
# The class must have a stable name: the guards run its own methods.


_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class created by a class statement


def _is_local_class(obj) -> bool:
    """A Python class with no stable name (defined in local scope, or created
    with ``type()`` and never bound to its name), other than an Enum."""
    return (
        isinstance(obj, type)
        and bool(obj.__flags__ & _HEAPTYPE)
        and not issubclass(obj, enum.Enum)
        and find_stable_name(obj) is None
    )


def _dict_view_kinds() -> dict:
    kinds = {}
    for mapping, ordered in (({}, False), (collections.OrderedDict(), True)):
        for kind in ("keys", "values", "items"):
            kinds[type(getattr(mapping, kind)())] = (kind, ordered)
    return kinds


_DICT_VIEW_KINDS = _dict_view_kinds()


def _key_set_names(key_set) -> tuple:
    text = str(key_set)
    inner = text[len("DispatchKeySet(") : -1] if text.startswith("DispatchKeySet(") else text
    return tuple(name for name in inner.split(", ") if name)


def _dispatch_key_names(t: torch.Tensor) -> tuple:
    return _key_set_names(torch._C._dispatch_keys(t))


# NOTE: [Functorch-wrapped tensor stand-ins]
# A frame compiled inside vmap / grad / jvp / functionalize sees its tensors
# wrapped (BatchedTensor, the grad/jvp TensorWrapper, FunctionalTensorWrapper).
# TENSOR_MATCH reads the Python type, dtype, device, requires_grad and dispatch
# keys of the value; a wrapper reports the keys of a plain tensor plus its own
# (FuncTorchBatched, FuncTorchGradWrapper, Functionalize), whatever it wraps and
# at whatever level. So a stand-in is the same kind of wrapper around an empty
# plain tensor: the level it was made at does not reach the guard (the
# FUNCTORCH_STACK_MATCH guard checks levels), and a grad wrapper, which needs
# its level on the functorch stack while it is made, is made under a grad layer
# pushed for that moment. The dispatch keys the guard stores also depend on the
# thread-local include/exclude sets live while it is built (inside any functorch
# layer, the DynamicLayer keys are included): those are saved with the global
# state and made live again while a loaded TENSOR_MATCH is built
# (tensor_match_dispatch_state).


def _functorch_wrapper_kind(t: torch.Tensor) -> Optional[str]:
    functorch = torch._C._functorch
    if functorch.is_batchedtensor(t):
        return "batched"
    if functorch.is_gradtrackingtensor(t):
        return "grad"
    if torch._is_functional_tensor(t):
        return "functional"
    return None


def _make_tensor(s: _TensorStandIn) -> torch.Tensor:
    # Made outside any live functorch layer (under one, factory functions return
    # wrapped tensors) and in the saved inference mode, wherever it is called.
    with torch._C._DisableFuncTorch(), torch.inference_mode(s.is_inference):
        t = _make_tensor_here(s)
        if s.subclass is not None:
            cls = resolve_name(s.subclass)
            if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
                raise PackageError(
                    f"tensor subclass {s.subclass.module}.{s.subclass.path}, which "
                    "the saved guards check, cannot be found in this process"
                )
            t = t.as_subclass(cls)
        return t


def _make_tensor_here(s: _TensorStandIn) -> torch.Tensor:
    from torch._functorch.eager_transforms import enable_inplace_requires_grad

    dtype = getattr(torch, s.dtype)
    functorch = torch._C._functorch
    # 0-d has one element; any other rank gets zero-sized dims: no storage. A
    # BatchedTensor hides its batch dim, so its base has one more.
    base_ndim = s.ndim + (s.functorch_wrapper == "batched")
    t = torch.empty((0,) * base_ndim, dtype=dtype, device=s.device)
    if s.conj:
        t = torch._C._conj(t) if hasattr(torch._C, "_conj") else t.conj()
    if s.neg:
        torch._C._set_neg(t, True)
    if s.functorch_wrapper == "batched":
        t = functorch._add_batch_dim(t, 0, 1)
    elif s.functorch_wrapper == "functional":
        t = torch._to_functional_tensor(t)
    elif s.functorch_wrapper == "grad":
        level = functorch._grad_increment_nesting()
        try:
            t = functorch._wrap_for_grad(t, level)
            if s.requires_grad:
                with enable_inplace_requires_grad(True):
                    t.requires_grad_(True)
        finally:
            functorch._grad_decrement_nesting()
        return t
    elif s.functorch_wrapper is not None:
        raise PackageError(f"unknown functorch wrapper {s.functorch_wrapper!r}")
    if s.is_parameter:
        t = torch.nn.Parameter(t, requires_grad=s.requires_grad)
    elif s.requires_grad:
        t.requires_grad_(True)
    return t


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
    """

    local_scope: dict
    global_scope: dict
    guards: list
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
    shape_code_parts: Optional[tuple]  # (python exprs, verbose exprs) or None


def _strip_guard(guard):
    import functools

    from torch.utils.weak import TensorWeakRef

    create_fn = guard.create_fn
    if isinstance(create_fn, functools.partial) and isinstance(
        create_fn.keywords.get("value"), TensorWeakRef
    ):
        # The builder falls back to get(name) for the value: the recorded one.
        kwargs = {k: v for k, v in create_fn.keywords.items() if k != "value"}
        create_fn = functools.partial(create_fn.func, *create_fn.args, **kwargs)
    return dataclasses.replace(
        guard,
        create_fn=create_fn,
        guard_types=None,
        code_list=None,
        obj_weakref=None,
        guarded_class_weakref=None,
        stack=None,
        user_stack=None,
        _hash=None,
    )


def refuse_local_class_type_matches(guards, recorded_values: dict) -> None:
    """TYPE_MATCH compares the class itself: refused for a class defined in local
    scope (see NOTE: [Classes defined in local scope]). Checked before any value
    is converted, so this is the error a user sees, as upstream raises it first."""
    for guard in guards:
        if "TYPE_MATCH" not in guard_type_names(guard) or guard.name not in recorded_values:
            continue
        cls = type(recorded_values[guard.name])
        if _is_local_class(cls):
            raise local_class_refusal("TYPE_MATCH", guard.name, cls)


def build_guards_state(
    f_code,
    output_graph,
    guards,
    recorder: GuardSerializationRecorder,
    global_state: SavedGlobalState,
    shape_code_parts,
) -> GuardsState:
    from torch._dynamo.guards import convert_to_concrete_values

    refuse_local_class_type_matches(guards, recorder.values)
    converter = _StandInConverter(recorder, guards)
    values = {}
    for name, value in recorder.values.items():
        values[name] = converter.convert(value, name, True)

    def scope_view(prefix, scope):
        out = {}
        for key, value in scope.items():
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
    guard_sources = {g.originating_source for g in guards}
    sizes_strides = {
        source: {
            "size": convert_to_concrete_values(meta["size"]),
            "stride": convert_to_concrete_values(meta["stride"]),
        }
        for source, meta in output_graph.input_source_to_sizes_strides.items()
        if source in guard_sources
    }
    modes = []
    for i, mode in enumerate(output_graph.torch_function_mode_stack or ()):
        ref = find_stable_name(type(mode))
        if ref is None and _is_local_class(type(mode)):
            # The mode stack check compares the class of each mode.
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
        modes.append(_ObjectStandIn(ref, {}))
    aot_guards = list(output_graph.tracing_context.guards_context.aotautograd_guards)
    from torch._guards import DuplicateInputs, StorageOverlap

    for g in aot_guards:
        if not isinstance(g, (DuplicateInputs, StorageOverlap)):
            raise PackageError(f"AOTAutograd guard {g!r:.80} cannot be serialized")
    names = torch._C._dynamo.eval_frame.code_framelocals_names(f_code)
    og_state = OutputGraphGuardsState(
        local_scope=local_scope,
        global_scope=global_scope,
        guards=[_strip_guard(g) for g in guards],
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


def pickle_guards_state(state: GuardsState) -> bytes:
    buf = io.BytesIO()
    try:
        pickle.Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(state)
    except (pickle.PicklingError, TypeError, AttributeError) as e:
        raise PackageError(f"guards state could not be pickled: {e}") from e
    return buf.getvalue()


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


def _allowed_global(module: str, name: str):
    """The only globals a guards-state pickle may reference (see GuardsStateUnpickler)."""
    from torch._guards import Source

    this = sys.modules[__name__]
    if module == __name__:
        obj = getattr(this, name, None)
        if isinstance(obj, type) and (
            dataclasses.is_dataclass(obj) and obj.__module__ == __name__
        ):
            return obj
        return None
    if module == "builtins" and name in ("set", "frozenset", "slice", "range", "complex"):
        return getattr(builtins, name)
    if module == "collections" and name == "OrderedDict":
        return collections.OrderedDict
    if module == "functools" and name == "partial":
        import functools

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


def load_guards_state(data: bytes) -> GuardsState:
    """Read ``guards_state`` bytes with the restricted unpickler."""
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
    return state


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
    names = tuple(torch._C._dynamo.eval_frame.code_framelocals_names(f_code))
    if og.code_name != f_code.co_name or og.framelocals_names != names:
        raise PackageError(
            f"guards were saved for code {og.code_name!r} with locals "
            f"{og.framelocals_names}, not for {f_code.co_name!r} with locals {names}"
        )


def resolve_name(ref: _NamedRef):
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


class _Hydrator:
    """Turns stand-ins back into objects the GuardBuilder can read."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}
        # Referents of hydrated weak references (NOTE: [Weak references in
        # guarded values]): alive as long as the loaded state is.
        self.keep_alive: list = []

    def __call__(self, obj):
        if _is_constant(obj):
            return obj
        key = id(obj)
        if key in self.memo:
            return self.memo[key]
        out = self._hydrate(obj)
        self.memo[key] = out
        return out

    def _key(self, k):
        if isinstance(k, tuple) and len(k) == 3 and k[0] == "__named__":
            return resolve_name(_NamedRef(k[1], k[2]))
        return self(k)

    def _hydrate(self, obj):
        key = id(obj)
        if isinstance(obj, _NamedRef):
            return resolve_name(obj)
        if isinstance(obj, _Placeholder):
            return obj
        if isinstance(obj, _DtypeStandIn):
            return getattr(torch, obj.name)
        if isinstance(obj, _DeviceStandIn):
            return torch.device(obj.spec)
        if isinstance(obj, _SizeStandIn):
            return torch.Size(obj.dims)
        if isinstance(obj, _EnumStandIn):
            cls = resolve_name(obj.cls)
            if isinstance(cls, type) and issubclass(cls, enum.Enum):
                return cls[obj.member]
            return UnresolvedName(obj.cls.module, f"{obj.cls.path}.{obj.member}")
        if isinstance(obj, _TensorStandIn):
            t = _make_tensor(obj)
            for k, v in obj.attrs.items():
                setattr(t, k, self(v))
            return t
        if isinstance(obj, _WrapperSubclassStandIn):
            return self._wrapper_subclass(obj)
        if isinstance(obj, _LocalClassStandIn):
            return self._local_class(obj)
        if isinstance(obj, _DictViewStandIn):
            mapping = collections.OrderedDict() if obj.ordered else {}
            for k, v in obj.items.items():
                mapping[self._key(k)] = self(v)
            return getattr(mapping, obj.kind)()
        if isinstance(obj, _ObjectStandIn):
            cls = self(obj.cls)
            if not isinstance(cls, type):
                return cls if isinstance(cls, UnresolvedName) else UnresolvedName(
                    obj.cls.module, getattr(obj.cls, "path", "")
                )
            new = next(
                (t.__new__ for t in cls.__mro__ if t in _SAFE_NEW_TYPES), object.__new__
            )
            try:
                inst = new(cls)
            except TypeError:
                return UnresolvedName(cls.__module__, cls.__qualname__)
            self.memo[key] = inst
            if obj.state:
                inst.__dict__.update({k: self(v) for k, v in obj.state.items()})
            for name, value in (obj.slots or {}).items():
                object.__setattr__(inst, name, self(value))
            return inst
        if isinstance(obj, _FunctionStandIn):
            fn = types.FunctionType(_placeholder_function.__code__, {}, obj.name)
            fn.__defaults__ = self(obj.defaults)
            fn.__kwdefaults__ = self(obj.kwdefaults)
            return fn
        if isinstance(obj, _TupleSubclassStandIn):
            cls = self(obj.cls)
            if not (isinstance(cls, type) and issubclass(cls, tuple)):
                return UnresolvedName(obj.cls.module, getattr(obj.cls, "path", ""))
            return tuple.__new__(cls, tuple(self(v) for v in obj.items))
        if isinstance(obj, _PartialStandIn):
            func = self(obj.func)
            if not callable(func):
                return UnresolvedName("functools", "partial")
            return functools.partial(func, *(self(a) for a in obj.args), **{k: self(v) for k, v in obj.keywords.items()})
        if isinstance(obj, _BoundMethodStandIn):
            func = self(obj.func)
            if not callable(func):
                return UnresolvedName("types", "MethodType")
            return types.MethodType(func, self(obj.owner))
        if isinstance(obj, _CellStandIn):
            return types.CellType() if obj.empty else types.CellType(self(obj.contents))
        if isinstance(obj, _FrozenObjectStandIn):
            cls = resolve_name(_NamedRef(*obj.cls))
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                return UnresolvedName(*obj.cls)
            inst = object.__new__(cls)
            for name, value in obj.state:
                object.__setattr__(inst, name, self._key(value))
            return inst
        if isinstance(obj, _MappingProxyStandIn):
            return types.MappingProxyType(self(obj.mapping))
        if isinstance(obj, _TupleIteratorStandIn):
            return iter(tuple(self(v) for v in obj.remaining))
        if isinstance(obj, _RangeIteratorStandIn):
            it = iter(range(obj.start, obj.stop, obj.step))
            for _ in range(obj.index):
                next(it)
            return it
        if isinstance(obj, _WeakrefStandIn):
            if obj.dead:
                return weakref.ref(_Placeholder("dead weakref referent"))
            referent = self(obj.referent)
            self.keep_alive.append(referent)
            return weakref.ref(referent)
        if isinstance(obj, _DispatchKeySetStandIn):
            ks = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
            for name in obj.keys:
                ks = ks | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
            return ks
        if isinstance(obj, _DefaultDictStandIn):
            out_dd = collections.defaultdict(None)
            self.memo[key] = out_dd
            out_dd.default_factory = self(obj.factory) if callable(self(obj.factory)) else None
            for k, v in obj.items.items():
                out_dd[self._key(k)] = self(v)
            return out_dd
        if type(obj) in (dict, collections.OrderedDict):
            out = type(obj)()
            self.memo[key] = out
            for k, v in obj.items():
                out[self._key(k)] = self(v)
            return out
        if type(obj) is list:
            out_list: list = []
            self.memo[key] = out_list
            out_list.extend(self(v) for v in obj)
            return out_list
        if type(obj) is tuple:
            return tuple(self(v) for v in obj)
        if type(obj) in (set, frozenset):
            return type(obj)(self._key(v) for v in obj)
        if type(obj) is slice:
            return slice(self(obj.start), self(obj.stop), self(obj.step))
        return obj

    def _local_class(self, stand_in: _LocalClassStandIn):
        """See NOTE: [Classes defined in local scope]."""
        bases = tuple(self(base) for base in stand_in.bases)
        if not all(isinstance(base, type) for base in bases):
            return UnresolvedName(stand_in.module, stand_in.qualname)

        def fill(namespace):
            namespace["__module__"] = stand_in.module
            namespace["__qualname__"] = stand_in.qualname
            namespace.update(dict.fromkeys(stand_in.attribute_names, _LOCAL_CLASS_ATTRIBUTE))
            if stand_in.slots is not None:
                namespace["__slots__"] = stand_in.slots

        try:
            return types.new_class(stand_in.name, bases, exec_body=fill)
        except Exception:
            log.debug("guard serialization: cannot rebuild class %s", stand_in.qualname, exc_info=True)
            return UnresolvedName(stand_in.module, stand_in.qualname)

    def _wrapper_subclass(self, stand_in: _WrapperSubclassStandIn) -> torch.Tensor:
        """See NOTE: [Tensor subclass stand-ins]."""
        cls = self(stand_in.cls)
        if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
            raise PackageError(
                f"tensor subclass {stand_in.cls.module}.{stand_in.cls.path}, which "
                "the saved guards check, cannot be found in this process"
            )
        inner = {name: self(value) for name, value in stand_in.inner.items()}
        size = (0,) * stand_in.ndim
        with torch._C._DisableFuncTorch():
            stride = torch.empty(size, device="meta").stride()
            out = cls.__tensor_unflatten__(inner, self(stand_in.ctx), size, stride)
        for k, v in stand_in.attrs.items():
            setattr(out, k, self(v))
        return out


@dataclasses.dataclass
class LoadedGuardsState:
    """A GuardsState with its stand-ins turned back into objects."""

    output_graph: OutputGraphGuardsState
    shape_code_parts: Optional[tuple]
    runtime_global_scope: dict
    # Objects only weak references in the values hold (NOTE: [Weak references
    # in guarded values]).
    keep_alive: list = dataclasses.field(default_factory=list)


def hydrate(state: GuardsState, f_code, runtime_global_scope=None) -> LoadedGuardsState:
    og = state.output_graph
    check_state_compatible(og, f_code)
    h = _Hydrator()
    values = {name: h(v) for name, v in og.values.items()}
    if runtime_global_scope is None:
        module = sys.modules.get(og.global_module) if og.global_module else None
        if module is None and og.global_module:
            try:
                module = importlib.import_module(og.global_module)
            except Exception as e:
                raise PackageError(
                    f"guards read globals of module {og.global_module!r}, which "
                    f"cannot be imported here: {e!r}"
                ) from e
        runtime_global_scope = vars(module) if module is not None else {}
    for name, ref in og.installed_globals.items():
        runtime_global_scope.setdefault(name, resolve_name(ref))
    loaded = dataclasses.replace(
        og,
        local_scope={k: h(v) for k, v in og.local_scope.items()},
        global_scope={k: h(v) for k, v in og.global_scope.items()},
        values=values,
        torch_function_mode_stack=[h(m) for m in og.torch_function_mode_stack],
    )
    return LoadedGuardsState(loaded, state.shape_code_parts, runtime_global_scope, h.keep_alive)
