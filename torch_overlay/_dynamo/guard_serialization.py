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
:data:`SERIALIZATION_REFUSAL_REASONS`) and the recorder the GuardBuilder reports to.

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
#   * other guarded objects become instances of their (named) class created
#     without running ``__init__``, with a ``__dict__`` that has the same keys
#     and only the values the guards read;
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
from typing import Any, Optional

import torch
from torch._dynamo.exc import PackageError


log = logging.getLogger(__name__)

# 2: tensor stand-ins carry their functorch wrapper; the global state carries
# the thread-local dispatch key sets.
GUARDS_STATE_FORMAT_VERSION = 2

# Guard types refused whatever the guarded value: they have no meaning in another
# process. Every other guard type serializes, or is refused for a specific value
# (see SERIALIZATION_REFUSAL_REASONS).
UNSUPPORTED_SERIALIZATION_GUARD_TYPES: tuple[str, ...] = (
    "DATA_PTR_MATCH",
    "WEAKREF_ALIVE",
    "OBJECT_MUTATION",
    "TENSOR_SUBCLASS_METADATA_MATCH",
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
        "tensor subclass metadata is checked by a closure over the live subclass "
        "instance; pass plain tensors to the compiled region"
    ),
    "DICT_VERSION": (
        "it guards on a dict's version tag, which is per process (the dict of "
        "registered pytree nodes is the exception: it is saved as a keys match)"
    ),
    "ID_MATCH": (
        "when the object has no stable name (module, module-level function or "
        "class, builtin, module attribute): define it at module scope or pass it "
        "as an input"
    ),
    "NN_MODULE": (
        "when the module instance is not reachable from a module by name: keep "
        "torch._dynamo.config.inline_inbuilt_nn_modules=True (the default) so "
        "modules are guarded by their attributes, not by identity"
    ),
    "TENSOR_MATCH": (
        "for tensor subclasses other than nn.Parameter and for tensors whose "
        "dispatch keys a plain tensor cannot reproduce (sparse, nested, ...)"
    ),
    "SHAPE_ENV": (
        "with torch._dynamo.config.enable_cpp_symbolic_shape_guards, which needs "
        "a C++ compiler at load"
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


def refusal_message(guard_type: str, source_name: str, detail: str = "") -> str:
    reason = detail or SERIALIZATION_REFUSAL_REASONS.get(guard_type, "")
    return (
        f"{guard_type} guard on {source_name or '<global>'} cannot be serialized"
        + (f": {reason}" if reason else "")
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
class _ObjectStandIn:
    """An instance of a named class, rebuilt without running its ``__init__``."""

    cls: _NamedRef
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
                if _resolve_path(sys.modules[module], qualname) is obj:
                    return _NamedRef(module, qualname)
            except Exception:
                pass
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


class _StandInConverter:
    """Converts recorded values into stand-ins (see NOTE: [Guard serialization ...])."""

    def __init__(self, recorder: GuardSerializationRecorder) -> None:
        self.recorder = recorder
        self.memo: dict[int, Any] = {}
        self.recorded_ids = {id(v) for v in recorder.values.values()}

    def path_of(self, obj, fallback: str) -> str:
        return self.recorder.sources.get(id(obj), fallback)

    def convert(self, obj, path: str, guarded: bool):
        """``guarded``: the builder read this value, so it must be faithful."""
        if _is_constant(obj):
            return obj
        key = id(obj)
        if key in self.memo:
            return self.memo[key]
        guarded = guarded or key in self.recorded_ids
        path = self.path_of(obj, path)
        if key in self.recorder.identity:
            guard_type, source_name, source = self.recorder.identity[key]
            ref = find_stable_name(
                obj, source, self.recorder.global_module, self.recorder.values
            )
            if ref is None:
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
        result = self._convert_uncached(obj, path, guarded)
        return result

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
        if not guarded:
            return _Placeholder(type(obj).__qualname__)
        ref = find_stable_name(obj) if hasattr(obj, "__qualname__") else None
        if ref is not None:
            # e.g. an lru_cache-wrapped module-level function
            self.memo[key] = ref
            return ref
        if isinstance(obj, tuple):
            cls_ref = find_stable_name(type(obj))
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
            raise PackageError(
                f"guarded value {path} (a {type(obj).__qualname__}) cannot be "
                "serialized; guard on something else or keep it out of the compiled region"
            )
        return _Placeholder(type(obj).__qualname__)

    def _source_for(self, obj):
        entry = self.recorder.identity.get(id(obj))
        return entry[2] if entry else None

    def _unnamed(self, obj, path, guarded):
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
            raise PackageError(
                f"guarded value {path} ({obj!r:.80}) has no stable name in another "
                "process; define it at module scope"
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
        converted = self.convert(k, path, True)
        if isinstance(converted, (_NamedRef, _EnumStandIn, _DtypeStandIn, _DeviceStandIn, tuple, frozenset)):
            return converted if not isinstance(converted, _NamedRef) else ("__named__", converted.module, converted.path)
        raise PackageError(f"dict key {k!r:.80} under {path} cannot be serialized")

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
        if type(t) not in (torch.Tensor, torch.nn.Parameter) and not isinstance(
            t, torch.nn.parameter.Buffer
        ):
            raise PackageError(
                refusal_message(
                    "TENSOR_MATCH",
                    path,
                    f"tensor subclass {type(t).__qualname__} is not supported; pass "
                    "a plain tensor",
                )
            )
        stand_in = _TensorStandIn(
            dtype=str(t.dtype).replace("torch.", ""),
            device=str(t.device),
            requires_grad=bool(t.requires_grad),
            is_parameter=isinstance(t, torch.nn.Parameter),
            conj=bool(t.is_conj()),
            neg=bool(t.is_neg()),
            attrs={
                k: self.convert(v, f"{path}.{k}", True)
                for k, v in vars(t).items()
                if k.startswith("_dynamo_")
            },
            dispatch_keys=_dispatch_key_names(t),
            ndim=t.dim(),
            functorch_wrapper=_functorch_wrapper_kind(t),
            is_inference=bool(t.is_inference()),
        )
        proxy = _make_tensor(stand_in)
        reproduced = (_dispatch_key_names(proxy), bool(proxy.requires_grad))
        if reproduced != (stand_in.dispatch_keys, stand_in.requires_grad):
            raise PackageError(
                refusal_message(
                    "TENSOR_MATCH",
                    path,
                    f"its dispatch keys {stand_in.dispatch_keys} (requires_grad="
                    f"{stand_in.requires_grad}) cannot be reproduced by a stand-in "
                    f"tensor ({reproduced[0]}, requires_grad={reproduced[1]}); "
                    "sparse, nested and quantized inputs are not supported",
                )
            )
        self.memo[id(t)] = stand_in
        return stand_in

    def _object(self, obj, path):
        cls = type(obj)
        cls_ref = find_stable_name(cls)
        if cls_ref is None:
            raise PackageError(
                f"guarded value {path} is an instance of {cls.__qualname__}, a class "
                "with no stable name in another process; define the class at module scope"
            )
        if cls.__new__ is not object.__new__ and cls not in _SAFE_NEW_TYPES:
            raise PackageError(
                f"guarded value {path} is an instance of {cls.__qualname__}, whose "
                "custom __new__ cannot be replayed safely at load"
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
        return _make_tensor_here(s)


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


def build_guards_state(
    f_code,
    output_graph,
    guards,
    recorder: GuardSerializationRecorder,
    global_state: SavedGlobalState,
    shape_code_parts,
) -> GuardsState:
    from torch._dynamo.guards import convert_to_concrete_values

    converter = _StandInConverter(recorder)
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
        if ref is None:
            raise PackageError(
                f"torch function mode {type(mode).__qualname__} (mode stack entry {i}) "
                "has no stable name; define the mode class at module scope"
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
        if isinstance(obj, _ObjectStandIn):
            cls = resolve_name(obj.cls)
            if not isinstance(cls, type):
                return UnresolvedName(obj.cls.module, obj.cls.path)
            try:
                inst = cls.__new__(cls) if cls in _SAFE_NEW_TYPES else object.__new__(cls)
            except TypeError:
                return UnresolvedName(obj.cls.module, obj.cls.path)
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
            cls = resolve_name(obj.cls)
            if not (isinstance(cls, type) and issubclass(cls, tuple)):
                return UnresolvedName(obj.cls.module, obj.cls.path)
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


@dataclasses.dataclass
class LoadedGuardsState:
    """A GuardsState with its stand-ins turned back into objects."""

    output_graph: OutputGraphGuardsState
    shape_code_parts: Optional[tuple]
    runtime_global_scope: dict


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
    return LoadedGuardsState(loaded, state.shape_code_parts, runtime_global_scope)
