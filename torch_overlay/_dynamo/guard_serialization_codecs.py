"""Stand-in codecs of guard serialization: one per kind of recorded value.

A guards state (see :mod:`torch._dynamo.guard_serialization` and its NOTE:
[Guard serialization by recorded values]) holds every value the GuardBuilder
read as a stand-in: a small picklable object that loads as something the
builder gets the same answers from. This module holds each kind's stand-in
type and its codec, the save side (value -> stand-in) next to the load side
(stand-in -> object), and the two drivers that dispatch to them:
:class:`_StandInConverter` at save and :class:`_Hydrator` at load (see NOTE:
[Stand-in codecs]).
"""

from __future__ import annotations

import ast
import builtins
import collections
import dataclasses
import enum
import functools
import itertools
import logging
import types
import weakref
from typing import Any, cast, Optional

import torch
from torch._dynamo.exc import PackageError
from torch._dynamo.guard_serialization import (
    _CONSTANT_TYPES,
    _FSDPClassRef,
    _HEAPTYPE,
    _is_constant,
    _is_local_class,
    _NamedRef,
    _parent_source_name,
    _Placeholder,
    find_stable_name,
    guard_type_names,
    GuardSerializationRecorder,
    local_class_refusal,
    refusal_message,
    resolve_name,
    UnresolvedName,
)


log = logging.getLogger(__name__)


# Returned by a codec's save side when the value is not its kind after all:
# the next codec is tried.
_DECLINED = object()


_NOT_FOUND = object()


def _placeholder_of(value: Any) -> _Placeholder:
    """What an unguarded value (or one only read as the base of others) becomes."""
    return _Placeholder(type(value).__qualname__)


class _StandInConverter:
    """Converts recorded values into stand-ins (see NOTE: [Guard serialization
    by recorded values]): the codec of each value's kind makes its stand-in
    (see NOTE: [Stand-in codecs]); this class holds what they share (the memo,
    the recorder, refusals)."""

    def __init__(self, recorder: GuardSerializationRecorder, guards=()) -> None:
        self.recorder = recorder
        self.memo: dict[int, Any] = {}
        # id(value) -> the first name it was recorded by; its keys are the ids
        # of the recorded values.
        self.sources = recorder.sources
        self.recorded_ids = self.sources.keys()
        self._guards = guards
        self._guard_types_by_name: Optional[dict[str, list[str]]] = None
        self._class_names: dict[type, Any] = {}
        # What TENSOR_MATCH reads from the tensor made of each kind of tensor
        # stand-in (see _check_tensor_stand_in).
        self.tensor_kinds_seen: dict[tuple, tuple] = {}

    @property
    def guard_types_by_name(self) -> dict[str, list[str]]:
        """source name -> the guard types built on it, to name them in refusals
        (worked out at the first refusal: a save that refuses nothing never
        needs it)."""
        if self._guard_types_by_name is None:
            self._guard_types_by_name = {}
            for guard in self._guards:
                types_here = self._guard_types_by_name.setdefault(guard.name, [])
                types_here.extend(
                    n for n in guard_type_names(guard) if n not in types_here
                )
        return self._guard_types_by_name

    def guard_type_at(self, path: str, prefer=()) -> str:
        """The guard type to name in a refusal for a value at ``path``: one built
        on ``path`` (``prefer``-red types first), else on the closest source that
        ``path`` is reached from."""
        name: Optional[str] = path
        while name is not None:
            types_here = self.guard_types_by_name.get(name)
            if types_here:
                return next((t for t in prefer if t in types_here), types_here[0])
            name = _parent_source_name(name)
        return prefer[0] if prefer else "TYPE_MATCH"

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
            ref = self._identity_name(obj)
            self.memo[key] = ref
            return ref
        if key in self.memo:
            return self.memo[key]
        guarded = guarded or key in self.recorded_ids
        path = self.sources.get(key, path)
        for codec, takes_its_type in _save_plan(type(obj)):
            if takes_its_type or codec.accepts(obj, guarded):
                stand_in = codec.save(self, obj, path, guarded)
                if stand_in is not _DECLINED:
                    return stand_in
        # Unguarded values became placeholders (_PlaceholderCodec).
        raise self.refusal(
            path,
            f"the guarded value (a {type(obj).__qualname__}) cannot be "
            "serialized; guard on something else or keep it out of the compiled region",
        )

    def _identity_name(self, obj) -> _NamedRef:
        """The name an identity guard (ID_MATCH, FUNCTION_MATCH...) on ``obj`` is
        saved as, or its refusal."""
        guard_type, source_name, source = self.recorder.identity[id(obj)]
        ref = find_stable_name(obj, source, self.recorder.global_module, self.recorder.values)
        if ref is not None:
            return ref
        if _is_local_class(obj):
            raise local_class_refusal(guard_type, source_name, obj)
        if getattr(obj, "_dynamo_static_input_type", None) == "guarded":
            # torch._dynamo.mark_static_address(t) (guard=True) in a frame
            # traced without a compile package: Dynamo 2.7.1 bakes the tensor
            # into the graph and guards its identity, so the entry only ever
            # serves that one tensor object. A compile for a package takes the
            # tensor as an input instead (See NOTE: [Static addresses under a
            # compile package] in variables/builder.py).
            raise PackageError(
                refusal_message(
                    guard_type,
                    source_name,
                    "it guards on the identity of a tensor marked with "
                    "torch._dynamo.mark_static_address(t) (guard=True), which Dynamo "
                    "2.7.1 bakes into a graph traced without a compile package: no other "
                    "process has that tensor. Compile the frame with torch.compile(..., "
                    "package=...) or aot_compile (either takes it as an input), or mark "
                    "it with torch._dynamo.mark_static_address(t, guard=False)",
                )
            )
        raise PackageError(
            refusal_message(
                guard_type,
                source_name,
                f"it guards on the identity of a {type(obj).__qualname__} that has "
                "no stable name in another process; define it at module scope (a "
                "class or function defined inside a function cannot be found "
                "again) or pass it as an input",
            )
        )

    def named(self, obj):
        """``obj`` (a module, class, function...) by its stable name, or None."""
        entry = self.recorder.identity.get(id(obj))
        source = entry[2] if entry else None
        return find_stable_name(
            obj, source, self.recorder.global_module, self.recorder.values
        )

    def class_name(self, cls: type):
        """find_stable_name(cls), worked out once per class in a save: many
        values share a class (every Linear of a model)."""
        ref = self._class_names.get(cls, _NOT_FOUND)
        if ref is _NOT_FOUND:
            ref = self._class_names[cls] = find_stable_name(cls)
        return ref

    def class_ref(self, cls, path: str):
        """A class by name, or the stand-in of a class defined in local scope."""
        ref = self.class_name(cls)
        if ref is None and _is_local_class(cls, self.class_name):
            return _LocalClassCodec.save(self, cls, path, True)
        return ref

    def unnamed(self, obj, path: str, guarded: bool):
        """The stand-in of a class, function or enum member with no stable name."""
        if _is_local_class(obj):
            # Read as a value (HASATTR on a class...), never compared by identity:
            # identity guards were refused in convert().
            return _LocalClassCodec.save(self, obj, path, guarded)
        if isinstance(obj, types.FunctionType):
            return _FunctionCodec.save(self, obj, path, guarded)
        if isinstance(obj, types.CodeType) or (
            # A method bound to an instance (L['x'].dim of a tensor): read as the
            # example value of an attribute accessor (HASATTR), never compared.
            isinstance(obj, types.BuiltinMethodType)
            and not isinstance(getattr(obj, "__self__", None), types.ModuleType)
        ):
            # Read only as the base of other guarded values (whose own values are
            # recorded); an identity guard on it is refused where it is required.
            return _placeholder_of(obj)
        if guarded:
            raise self.refusal(
                path,
                f"the guarded value ({obj!r:.80}) has no stable name in another "
                "process; define it at module scope",
            )
        return _placeholder_of(obj)

    def key(self, k, path: str):
        """The stand-in of a dict key or set item: hashable, or refused."""
        if _is_constant(k):
            return k
        if _FrozenObjectCodec.accepts_key(k):
            stand_in = _FrozenObjectCodec.save(self, k, path, True)
            if stand_in is not _DECLINED:
                return stand_in
        if _is_local_class(k):
            # Class keys are guarded by identity (ID_MATCH on the key).
            raise local_class_refusal("ID_MATCH", f"a key of {path}", k)
        converted = self.convert(k, path, True)
        if isinstance(converted, _KEY_STAND_IN_TYPES):
            return converted
        raise self.refusal(path, f"its dict key {k!r:.80} cannot be serialized")

    def child(self, value, path: str, parent_guarded: bool):
        """A value held by a container or object: faithful only where needed."""
        cls = type(value)
        if cls in _CONSTANT_TYPES or value is NotImplemented:  # _is_constant, inlined
            return value
        key = id(value)
        if key in self.recorded_ids or key in self.recorder.identity:
            return self.convert(value, path, True)
        if cls in (dict, collections.OrderedDict, list) and not value:
            # An empty container (a module holds a dozen empty hook dicts) is an
            # empty one of its type, once per object, as convert() would make it.
            stand_in = self.memo.get(key)
            if stand_in is None:
                stand_in = self.memo[key] = cls()
            return stand_in
        if cls in (dict, collections.OrderedDict, list, tuple, collections.defaultdict):
            return self.convert(value, path, False)
        if parent_guarded and (
            cls in (set, frozenset, slice, range, torch.Size)
            or isinstance(value, (torch.dtype, torch.device))
            or _is_enum_member(value)
            # a DTensor's spec, in its flatten context (NOTE: [DTensor stand-ins])
            or _is_dtensor_spec_type(cls)
        ):
            return self.convert(value, path, True)
        if key in self.memo:
            return self.memo[key]
        return _placeholder_of(value)


class _Hydrator:
    """Turns stand-ins back into objects the GuardBuilder can read: each
    through the load side of its codec (see NOTE: [Stand-in codecs])."""

    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}
        # Referents of hydrated weak references (NOTE: [Weak references in
        # guarded values]): alive as long as the loaded state is.
        self.keep_alive: list = []

    def __call__(self, stand_in):
        if _is_constant(stand_in):
            return stand_in
        key = id(stand_in)
        if key in self.memo:
            return self.memo[key]
        codec = _LOAD_CODECS.get(type(stand_in))
        out = stand_in if codec is None else codec.load(self, stand_in)
        self.memo[key] = out
        return out


# ---------------------------------------------------------------------------
# Stand-in codecs: one per kind of value, its save side next to its load side
# ---------------------------------------------------------------------------

# NOTE: [Stand-in codecs]
# Each kind of recorded value has one codec, a class that says once which
# values are of its kind, and holds its save and load sides:
#   * ``value_types``: the types whose instances (subclasses' too) are of its
#     kind; ``exact_types``: those whose instances are, but not their
#     subclasses' (an instance of a dict or tuple subclass is an object of its
#     own class). A kind that is no tuple of types (an enum, a class known by
#     its name) overrides ``handles_type(value_type)`` instead. Whether the
#     codec takes ``obj`` at save, ``accepts(obj, guarded)``, follows from
#     ``type(obj)``; a codec that asks more (``guarded``, or the value itself)
#     overrides ``accepts`` and is then asked about each value of its types
#     (see NOTE: [Codec dispatch by type]);
#   * ``save(converter, obj, path, guarded)``: the stand-in (it converts what
#     ``obj`` holds through ``converter``), or _DECLINED to let a later codec
#     take it;
#   * ``load(hydrator, stand_in)``: the object the loaded guards read (it
#     hydrates what the stand-in holds through ``hydrator``).
# At save the codecs are asked in the order they are registered below (the
# order matters where kinds overlap: a tensor before an object with a
# ``__dict__``, unguarded values become placeholders before the kinds that need
# to be faithful); at load the stand-in's type picks its codec (``stand_ins``).
# A stand-in no codec loads (a constant, a ``range``) loads as itself. A codec
# that is only reached through another (a local class, a function with no
# stable name, a wrapper tensor subclass, a frozen dataclass used as a key)
# declares no types: it accepts nothing itself.


class StandInCodec:
    """The save and load sides of one kind of recorded value."""

    # The pickled types this codec loads.
    stand_ins: tuple[type, ...] = ()
    # The types of the values it saves (see NOTE: [Stand-in codecs]).
    value_types: tuple[type, ...] = ()
    exact_types: tuple[type, ...] = ()
    # Whether ``accepts`` asks more than a value's type: set for each codec
    # from whether it overrides ``accepts`` (so ``accepts_type`` cannot answer
    # for a value-dependent test by type).
    asks_each_value = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.asks_each_value = cls.asks_each_value or "accepts" in vars(cls)

    @classmethod
    def handles_type(cls, value_type: type) -> bool:
        """Whether values of type ``value_type`` are of this codec's kind."""
        return value_type in cls.exact_types or issubclass(value_type, cls.value_types)

    @classmethod
    def accepts(cls, obj, guarded: bool) -> bool:
        """Whether this codec saves ``obj`` (``guarded``: a guard reads it)."""
        return cls.handles_type(type(obj))

    @classmethod
    def accepts_type(cls, value_type: type) -> Optional[bool]:
        """Whether ``accepts`` takes every object of type ``value_type`` (True),
        none (False), or it depends on more than the type (None); see NOTE:
        [Codec dispatch by type]."""
        if not cls.handles_type(value_type):
            return False
        return None if cls.asks_each_value else True

    @staticmethod
    def save(converter: _StandInConverter, obj, path: str, guarded: bool) -> Any:
        raise NotImplementedError

    @staticmethod
    def load(hydrator: _Hydrator, stand_in) -> Any:
        return stand_in


_SAVE_CODECS: list[type[StandInCodec]] = []
_LOAD_CODECS: dict[type, type[StandInCodec]] = {}


# NOTE: [Codec dispatch by type]
# Saving converts every recorded value, and most of them reach one of the last
# codecs (a module is an _ObjectCodec value), so asking each codec in turn costs
# more than the conversion itself. What a codec's ``accepts`` makes of a type is
# ``accepts_type``, which follows from the types the codec declares: it takes
# none of the type's objects (a type not of its kind), all of them, or it
# depends on each object (a codec that overrides ``accepts``; _NamedCodec, which
# takes one dict by identity, says so itself). The codecs to ask about an object
# of a type are worked out once per type: those that take none of its objects
# are left out, those that take all of them are not asked again. The order and
# what is asked of the others are unchanged, so the dispatch decides exactly as
# asking every codec would.
# id(cls) -> (a weak reference to cls, its plan): a dict keyed by id, looked up
# in C (a WeakKeyDictionary costs a Python call and a new weak reference per
# lookup); an entry goes when its class does.
_save_plans: dict[int, tuple[weakref.ref, tuple]] = {}


def _save_plan(cls: type) -> tuple:
    """(codec, takes every object of ``cls``) for the codecs that may take one."""
    entry = _save_plans.get(id(cls))
    if entry is not None and entry[0]() is cls:
        return entry[1]
    plan = tuple(
        (codec, known)
        for codec in _SAVE_CODECS
        for known in (codec.accepts_type(cls),)
        if known is not False
    )
    key = id(cls)

    def forget(_: weakref.ref, key: int = key) -> None:
        _save_plans.pop(key, None)

    # The callback runs while cls is freed, before its id can be reused.
    _save_plans[key] = (weakref.ref(cls, forget), plan)
    return plan


def _register_codec(codec: type[StandInCodec]) -> type[StandInCodec]:
    _SAVE_CODECS.append(codec)
    for stand_in_type in codec.stand_ins:
        if stand_in_type in _LOAD_CODECS:
            raise AssertionError(f"two codecs load {stand_in_type.__qualname__}")
        _LOAD_CODECS[stand_in_type] = codec
    return codec


@dataclasses.dataclass
class _DtypeStandIn:
    name: str


@_register_codec
class _DtypeCodec(StandInCodec):
    stand_ins = (_DtypeStandIn,)
    value_types = (torch.dtype,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _DtypeStandIn(str(obj).replace("torch.", ""))

    @staticmethod
    def load(hydrator, stand_in):
        return getattr(torch, stand_in.name)


@dataclasses.dataclass
class _DeviceStandIn:
    spec: str


@_register_codec
class _DeviceCodec(StandInCodec):
    stand_ins = (_DeviceStandIn,)
    value_types = (torch.device,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _DeviceStandIn(str(obj))

    @staticmethod
    def load(hydrator, stand_in):
        return torch.device(stand_in.spec)


@dataclasses.dataclass
class _SizeStandIn:
    dims: tuple


@_register_codec
class _SizeCodec(StandInCodec):
    stand_ins = (_SizeStandIn,)
    value_types = (torch.Size,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _SizeStandIn(tuple(int(d) for d in obj))

    @staticmethod
    def load(hydrator, stand_in):
        return torch.Size(stand_in.dims)


# What is saved by name (find_stable_name) when it has one.
_NAMED_KINDS = (
    types.ModuleType,
    type,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodDescriptorType,
    types.WrapperDescriptorType,
    types.CodeType,
)


@_register_codec
class _NamedCodec(StandInCodec):
    """Modules, classes, functions, builtins, code objects, layouts and memory
    formats, by name (see NOTE: [Guard serialization by recorded values])."""

    stand_ins = (_NamedRef, _FSDPClassRef)
    value_types = (torch.layout, torch.memory_format, *_NAMED_KINDS)

    @classmethod
    def accepts(cls, obj, guarded):
        # builtins.__dict__ too, by identity: other dicts are not.
        return cls.handles_type(type(obj)) or obj is builtins.__dict__

    @classmethod
    def accepts_type(cls, value_type):
        if cls.handles_type(value_type):
            return True
        return None if value_type is dict else False

    @staticmethod
    def save(converter, obj, path, guarded):
        if isinstance(obj, (torch.layout, torch.memory_format)):
            return _NamedRef("torch", str(obj).replace("torch.", ""))
        ref = converter.named(obj)
        if ref is None:
            return converter.unnamed(obj, path, guarded)
        converter.memo[id(obj)] = ref
        return ref

    @staticmethod
    def load(hydrator, stand_in):
        return resolve_name(stand_in)


# NOTE: [Members of C++ enums]
# An enum bound with pybind11 (torch.nn.attention.SDPBackend, torch._C's
# _SDPBackend) is no enum.Enum: its class is made by pybind11's metaclass and
# lists its members in ``__members__``, name -> member, and each member knows
# its ``name``. Dynamo compares one with CONSTANT_MATCH (an equality check),
# which holds only for the member of the same class with the same value. So a
# member is saved like an enum.Enum member, as its class by name (see NOTE:
# [Classes renamed where they are exposed]) and its member name, and loads as
# the member of that name of the class the name resolves to. A member its
# class no longer has is refused at load (as it is for an enum.Enum): the
# equality guard has no value that matches nothing.
def _is_cpp_enum_type(cls: type) -> bool:
    """A class of enum members bound with pybind11 (NOTE: [Members of C++ enums])."""
    return type(cls).__name__ == "pybind11_type" and isinstance(
        getattr(cls, "__members__", None), dict
    )


def _is_enum_type(cls: type) -> bool:
    return issubclass(cls, enum.Enum) or _is_cpp_enum_type(cls)


def _is_enum_member(obj) -> bool:
    return isinstance(obj, enum.Enum) or _is_cpp_enum_type(type(obj))


@dataclasses.dataclass
class _EnumStandIn:
    cls: _NamedRef
    member: str


@_register_codec
class _EnumCodec(StandInCodec):
    """A member of an enum.Enum or of a C++ enum (NOTE: [Members of C++
    enums]), by its class's name and its own."""

    stand_ins = (_EnumStandIn,)

    @classmethod
    def handles_type(cls, value_type):
        return _is_enum_type(value_type)

    @staticmethod
    def save(converter, obj, path, guarded):
        cls_ref = find_stable_name(type(obj))
        if cls_ref is None:
            return converter.unnamed(obj, path, guarded)
        return _EnumStandIn(cls_ref, obj.name)

    @staticmethod
    def load(hydrator, stand_in):
        cls = resolve_name(stand_in.cls)
        if isinstance(cls, type) and _is_enum_type(cls):
            # Enum classes and pybind11 enums both map member names in __members__.
            members: dict = getattr(cls, "__members__", {})
            member = members.get(stand_in.member)
            if member is None:
                # The equality guards that compare a member take no stand-in
                # that matches nothing: the load is refused instead.
                raise PackageError(
                    f"guards compare with {stand_in.cls.module}.{stand_in.cls.path}."
                    f"{stand_in.member}, a member that enum no longer has"
                )
            return member
        return UnresolvedName(stand_in.cls.module, f"{stand_in.cls.path}.{stand_in.member}")


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
    # functionalize ("batched", "grad" or "functional"), or None.
    # See NOTE: [Functorch-wrapped tensor stand-ins].
    functorch_wrapper: Optional[str] = None
    # made under inference_mode: no autograd dispatch keys
    is_inference: bool = False
    # A tensor subclass without __tensor_flatten__ (the stand-in is
    # ``as_subclass`` of a plain one): the class by name.
    subclass: Optional[_NamedRef] = None


@_register_codec
class _TensorCodec(StandInCodec):
    """A tensor: an empty one that answers what TENSOR_MATCH reads (see NOTE:
    [Functorch-wrapped tensor stand-ins]); a traceable wrapper subclass goes to
    _WrapperSubclassCodec."""

    stand_ins = (_TensorStandIn,)
    value_types = (torch.Tensor,)

    @staticmethod
    def save(converter, obj, path, guarded):
        from torch.utils._python_dispatch import is_traceable_wrapper_subclass

        if not guarded:
            return _placeholder_of(obj)
        subclass_ref = _tensor_subclass_name(converter, obj, path)
        if subclass_ref is not None and is_traceable_wrapper_subclass(obj):
            return _WrapperSubclassCodec.save_subclass(converter, obj, path, subclass_ref)
        stand_in = _TensorStandIn(
            dtype=str(obj.dtype).replace("torch.", ""),
            device=str(obj.device),
            requires_grad=bool(obj.requires_grad),
            is_parameter=isinstance(obj, torch.nn.Parameter),
            conj=bool(obj.is_conj()),
            neg=bool(obj.is_neg()),
            attrs=_tensor_attrs(converter, obj, path),
            dispatch_keys=_dispatch_key_names(obj),
            ndim=obj.dim(),
            functorch_wrapper=_functorch_wrapper_kind(obj),
            is_inference=bool(obj.is_inference()),
            subclass=subclass_ref,
        )
        _check_tensor_stand_in(converter, obj, stand_in, path)
        converter.memo[id(obj)] = stand_in
        return stand_in

    @staticmethod
    def load(hydrator, stand_in):
        t = _make_tensor(stand_in)
        _load_tensor_attrs(hydrator, t, stand_in.attrs)
        return t


_TENSOR_SUBCLASS_GUARDS = ("TENSOR_SUBCLASS_METADATA_MATCH", "TENSOR_MATCH")


def _tensor_subclass_name(converter, t: torch.Tensor, path: str) -> Optional[_NamedRef]:
    """The name of ``t``'s class when it is a tensor subclass (a refusal when it
    has none), None for a plain tensor, parameter or buffer."""
    cls = type(t)
    if cls in (torch.Tensor, torch.nn.Parameter) or isinstance(t, torch.nn.parameter.Buffer):
        return None
    subclass_ref = find_stable_name(cls)
    if subclass_ref is None and _is_local_class(cls):
        raise local_class_refusal(
            converter.guard_type_at(path, _TENSOR_SUBCLASS_GUARDS), path, cls
        )
    if subclass_ref is None:
        raise converter.refusal(
            path,
            f"tensor subclass {cls.__qualname__} has no stable name in another process",
            _TENSOR_SUBCLASS_GUARDS,
        )
    return subclass_ref


def _tensor_attrs(converter, t: torch.Tensor, path: str) -> dict:
    return {
        k: converter.convert(v, f"{path}.{k}", True)
        for k, v in vars(t).items()
        if k.startswith("_dynamo_")
    }


def _load_tensor_attrs(hydrator, t: torch.Tensor, attrs: dict) -> None:
    for k, v in attrs.items():
        setattr(t, k, hydrator(v))


def _seen_by_tensor_match(x: torch.Tensor, dispatch_keys=None) -> tuple:
    """What TENSOR_MATCH reads from a tensor that a stand-in must reproduce."""
    if dispatch_keys is None:
        dispatch_keys = _dispatch_key_names(x)
    return (type(x).__qualname__, dispatch_keys, bool(x.requires_grad), x.dtype, x.device)


def _check_tensor_stand_in(
    converter, t: torch.Tensor, stand_in: _TensorStandIn, path: str
) -> None:
    """_check_reproduced of a plain stand-in. What the check reads from the
    tensor made of a stand-in depends only on the fields _make_tensor reads, so
    it is made once per kind of stand-in in a save (the parameters of a model are
    one or two kinds), and the keys of ``t`` are the ones the stand-in holds."""
    kind = (
        stand_in.dtype, stand_in.device, stand_in.requires_grad, stand_in.is_parameter,
        stand_in.conj, stand_in.neg, stand_in.functorch_wrapper, stand_in.is_inference,
        stand_in.subclass,
        # The rank of a plain stand-in (no elements) changes nothing the check
        # reads (a model's weights and biases are one kind); a functorch wrapper
        # is made around a rank, so there it counts.
        stand_in.ndim if stand_in.functorch_wrapper is not None else None,
    )
    seen_proxy = converter.tensor_kinds_seen.get(kind)
    if seen_proxy is None:
        seen_proxy = _seen_by_tensor_match(_make_tensor(stand_in))
        converter.tensor_kinds_seen[kind] = seen_proxy
    _check_reproduced(
        converter, _seen_by_tensor_match(t, stand_in.dispatch_keys), seen_proxy, path
    )


def _check_reproduced(converter, seen_t: tuple, seen_proxy: tuple, path: str) -> None:
    """TENSOR_MATCH compares what it reads from the stand-in: it must agree
    (``seen_*``: _seen_by_tensor_match of the tensor and of its stand-in)."""
    if seen_proxy != seen_t:
        raise converter.refusal(
            path,
            f"a stand-in tensor cannot reproduce what the guard reads from it "
            f"(type, dispatch keys, requires_grad, dtype, device): {seen_t} "
            f"became {seen_proxy}; sparse, nested and quantized inputs are not "
            "supported",
            ("TENSOR_MATCH",),
        )


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
    # The outer size and stride, which __tensor_unflatten__ may put in the
    # flatten context it rebuilds (DTensor's TensorMeta: NOTE: [DTensor stand-ins]).
    size: Optional[tuple] = None
    stride: Optional[tuple] = None


def _static_ints(values) -> Optional[tuple]:
    """``values`` as a tuple of ints, or None where one is symbolic."""
    return tuple(values) if all(type(v) is int for v in values) else None


@_register_codec
class _WrapperSubclassCodec(StandInCodec):
    """See NOTE: [Tensor subclass stand-ins]. Reached through _TensorCodec."""

    stand_ins = (_WrapperSubclassStandIn,)

    @staticmethod
    def save_subclass(converter, t: Any, path: str, cls_ref: _NamedRef):
        """``t``: a traceable wrapper subclass instance."""
        inner_names, ctx = t.__tensor_flatten__()
        stand_in = _WrapperSubclassStandIn(
            cls_ref, {}, None, t.dim(), {}, _static_ints(t.shape), _static_ints(t.stride())
        )
        converter.memo[id(t)] = stand_in
        for name in inner_names:
            stand_in.inner[name] = converter.convert(getattr(t, name), f"{path}.{name}", True)
        stand_in.ctx = converter.convert(ctx, f"{path}.__tensor_flatten__()[1]", True)
        stand_in.attrs = _tensor_attrs(converter, t, path)
        try:
            proxy = _Hydrator()(stand_in)
        except Exception as e:
            raise converter.refusal(
                path,
                f"tensor subclass {type(t).__qualname__} cannot be rebuilt with "
                f"__tensor_unflatten__ from stand-ins of its inner tensors ({e!r:.200})",
                ("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
            ) from e
        _check_reproduced(
            converter, _seen_by_tensor_match(t), _seen_by_tensor_match(proxy), path
        )
        return stand_in

    @staticmethod
    def load(hydrator, stand_in):
        cls = _tensor_subclass(hydrator(stand_in.cls), stand_in.cls)
        inner = {name: hydrator(value) for name, value in stand_in.inner.items()}
        size = stand_in.size if stand_in.size is not None else (0,) * stand_in.ndim
        with torch._C._DisableFuncTorch():
            stride = stand_in.stride
            if stride is None:
                stride = torch.empty(size, device="meta").stride()
            unflatten = cast(Any, cls).__tensor_unflatten__
            out = unflatten(inner, hydrator(stand_in.ctx), size, stride)
        _load_tensor_attrs(hydrator, out, stand_in.attrs)
        return out


# NOTE: [DTensor stand-ins]
# A DTensor's flatten context is its DTensorSpec: the device mesh, the
# placements and the global shape, stride and dtype (TensorMeta), which
# TENSOR_SUBCLASS_METADATA_MATCH compares with the live DTensor's
# (DTensor.__metadata_guard__: spec equality, a mesh by value). The spec is
# saved by value: the mesh as its device type, rank layout and dimension names;
# each placement as its class in torch.distributed.tensor.placement_types and
# its fields. At load the mesh is rebuilt without creating process groups (no
# collective runs while guards load) and each dimension is re-bound to the live
# process group of this rank over the same ranks (the default group for a mesh
# over the whole world); a dimension with no such live group stays unbound,
# which the guards, comparing meshes by value, do not need.
# On the threaded process group backend (every rank a thread of one process,
# as in FSDPTestMultiThread), a mesh also compares the thread that made it
# (DeviceMesh._thread_id), which means nothing in another process or thread
# and is not saved: the rebuilt mesh takes the thread it is built in, as any
# mesh made there does, so the loaded guards accept that thread's meshes and
# reject another rank's.


@dataclasses.dataclass(frozen=True)
class _DeviceMeshStandIn:
    device_type: str
    shape: tuple
    ranks: tuple
    dim_names: Optional[tuple]


@dataclasses.dataclass(frozen=True)
class _PlacementStandIn:
    kind: str
    fields: tuple  # ((name, value), ...)


@dataclasses.dataclass
class _DTensorSpecStandIn:
    mesh: _DeviceMeshStandIn
    placements: tuple
    # TensorMeta: None, or (shape, stride, dtype name)
    tensor_meta: Optional[tuple]


def _is_dtensor_spec_type(cls: type) -> bool:
    return cls.__name__ == "DTensorSpec" and cls.__module__ == "torch.distributed.tensor._dtensor_spec"


def _is_device_mesh_type(cls: type) -> bool:
    return cls.__name__ == "DeviceMesh" and cls.__module__ == "torch.distributed.device_mesh"


def _mesh_stand_in(mesh) -> _DeviceMeshStandIn:
    # (a mesh's thread is not saved: NOTE: [DTensor stand-ins])
    return _DeviceMeshStandIn(
        mesh.device_type,
        tuple(mesh.mesh.shape),
        tuple(mesh.mesh.flatten().tolist()),
        tuple(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
    )


def _save_placement(converter, placement, path: str) -> _PlacementStandIn:
    from torch.distributed.tensor import placement_types

    kind = type(placement).__name__
    if getattr(placement_types, kind, None) is not type(placement):
        raise converter.refusal(
            path,
            f"placement {type(placement).__qualname__} is not one of "
            "torch.distributed.tensor.placement_types",
            ("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
        )
    fields = tuple(
        (f.name, getattr(placement, f.name)) for f in dataclasses.fields(placement)
    )
    if not all(_is_constant(v) for _, v in fields):
        raise converter.refusal(
            path,
            f"placement {placement!r:.80} holds values that are not constants",
            ("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
        )
    return _PlacementStandIn(kind, fields)


def _live_dim_group(ranks: list[int]):
    """The live process group of this rank over exactly ``ranks``, or None."""
    import torch.distributed.distributed_c10d as c10d

    world = c10d._world
    for group, group_ranks in world.pg_group_ranks.items():
        if sorted(group_ranks) == sorted(ranks):
            return group
    return None


def _rebound_mesh(stand_in: _DeviceMeshStandIn):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.distributed_c10d import _get_group_tag, get_rank

    mesh = torch.tensor(stand_in.ranks, dtype=torch.int).view(stand_in.shape)
    out = DeviceMesh(stand_in.device_type, mesh, mesh_dim_names=stand_in.dim_names, _init_backend=False)
    infos: list[Any] = []
    rank = get_rank()
    for dim in range(mesh.ndim):
        # The ranks along ``dim`` through this rank's coordinates.
        rows = mesh.swapdims(-1, dim).reshape(-1, mesh.size(dim))
        subgroup = next((r.tolist() for r in rows if rank in r.tolist()), None)
        group = _live_dim_group(subgroup) if subgroup is not None else None
        if group is None:
            log.debug("DTensor guard: mesh dim %d over %s has no live process group", dim, subgroup)
            return out
        infos.append((_get_group_tag(group), subgroup, group.group_name))
    out._dim_group_infos = infos
    return out


@_register_codec
class _DTensorSpecCodec(StandInCodec):
    """A DTensor's spec by value (NOTE: [DTensor stand-ins]). Reached as the
    flatten context of a DTensor (_WrapperSubclassCodec), or a DeviceMesh
    passed to the compiled function itself."""

    stand_ins = (_DTensorSpecStandIn, _DeviceMeshStandIn, _PlacementStandIn)

    @classmethod
    def handles_type(cls, value_type):
        return _is_dtensor_spec_type(value_type) or _is_device_mesh_type(value_type)

    @staticmethod
    def save(converter, obj, path, guarded):
        if _is_device_mesh_type(type(obj)):
            return _mesh_stand_in(obj)
        mesh_stand_in = _mesh_stand_in(obj.mesh)
        placements = tuple(
            _save_placement(converter, p, f"{path}.placements[{i}]")
            for i, p in enumerate(obj.placements)
        )
        meta = obj.tensor_meta
        tensor_meta = (
            None if meta is None else (tuple(meta.shape), tuple(meta.stride), str(meta.dtype))
        )
        return _DTensorSpecStandIn(mesh_stand_in, placements, tensor_meta)

    @staticmethod
    def load(hydrator, stand_in):
        from torch.distributed.tensor import placement_types
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        if isinstance(stand_in, _DeviceMeshStandIn):
            return _rebound_mesh(stand_in)
        if isinstance(stand_in, _PlacementStandIn):
            cls = getattr(placement_types, stand_in.kind, None)
            if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
                raise PackageError(f"DTensor placement {stand_in.kind!r} does not exist in this torch")
            return cls(**dict(stand_in.fields))
        meta = None
        if stand_in.tensor_meta is not None:
            shape, stride, dtype = stand_in.tensor_meta
            meta = TensorMeta(torch.Size(shape), tuple(stride), getattr(torch, dtype.split(".")[-1]))
        return DTensorSpec(
            hydrator(stand_in.mesh),
            tuple(hydrator(p) for p in stand_in.placements),
            tensor_meta=meta,
        )


def _save_items(converter, mapping, out: dict, path: str, guarded: bool) -> None:
    """The items of ``mapping`` into ``out``, as stand-ins."""
    for k, v in mapping.items():
        # A constant is itself (child's first test), without its path made.
        out[converter.key(k, path)] = (
            v if type(v) in _CONSTANT_TYPES else converter.child(v, f"{path}[{k!r}]", guarded)
        )


def _load_items(hydrator, stand_ins: dict, out: dict) -> None:
    for k, v in stand_ins.items():
        out[hydrator(k)] = hydrator(v)


@_register_codec
class _DictCodec(StandInCodec):
    """A dict or OrderedDict: its own type, holding stand-ins."""

    stand_ins = (dict, collections.OrderedDict)
    exact_types = (dict, collections.OrderedDict)

    @staticmethod
    def save(converter, obj, path, guarded):
        out = type(obj)()
        converter.memo[id(obj)] = out
        _save_items(converter, obj, out, path, guarded)
        return out

    @staticmethod
    def load(hydrator, stand_in):
        out = type(stand_in)()
        hydrator.memo[id(stand_in)] = out
        _load_items(hydrator, stand_in, out)
        return out


@dataclasses.dataclass
class _DefaultDictStandIn:
    factory: Any
    items: dict


@_register_codec
class _DefaultDictCodec(StandInCodec):
    stand_ins = (_DefaultDictStandIn,)
    exact_types = (collections.defaultdict,)

    @staticmethod
    def save(converter, obj, path, guarded):
        out = _DefaultDictStandIn(None, {})
        converter.memo[id(obj)] = out
        out.factory = converter.child(obj.default_factory, f"{path}.default_factory", guarded)
        _save_items(converter, obj, out.items, path, guarded)
        return out

    @staticmethod
    def load(hydrator, stand_in):
        out: collections.defaultdict = collections.defaultdict(None)
        hydrator.memo[id(stand_in)] = out
        factory = hydrator(stand_in.factory)
        out.default_factory = factory if callable(factory) else None
        _load_items(hydrator, stand_in.items, out)
        return out


@_register_codec
class _ListCodec(StandInCodec):
    stand_ins = (list,)
    exact_types = (list,)

    @staticmethod
    def save(converter, obj, path, guarded):
        out: list = []
        converter.memo[id(obj)] = out
        out.extend(converter.child(v, f"{path}[{i}]", guarded) for i, v in enumerate(obj))
        return out

    @staticmethod
    def load(hydrator, stand_in):
        out: list = []
        hydrator.memo[id(stand_in)] = out
        out.extend(hydrator(v) for v in stand_in)
        return out


@_register_codec
class _TupleCodec(StandInCodec):
    stand_ins = (tuple,)
    exact_types = (tuple,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return tuple(converter.child(v, f"{path}[{i}]", guarded) for i, v in enumerate(obj))

    @staticmethod
    def load(hydrator, stand_in):
        return tuple(hydrator(v) for v in stand_in)


@_register_codec
class _SetCodec(StandInCodec):
    stand_ins = (set, frozenset)
    exact_types = (set, frozenset)

    @staticmethod
    def save(converter, obj, path, guarded):
        return type(obj)(converter.key(v, path) for v in obj)

    @staticmethod
    def load(hydrator, stand_in):
        return type(stand_in)(hydrator(v) for v in stand_in)


@_register_codec
class _SliceCodec(StandInCodec):
    stand_ins = (slice,)
    exact_types = (slice,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return slice(*(converter.convert(x, path, True) for x in (obj.start, obj.stop, obj.step)))

    @staticmethod
    def load(hydrator, stand_in):
        return slice(hydrator(stand_in.start), hydrator(stand_in.stop), hydrator(stand_in.step))


@_register_codec
class _RangeCodec(StandInCodec):
    """A range holds only ints: it is its own stand-in (and loads as itself)."""

    exact_types = (range,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return obj


@dataclasses.dataclass
class _MappingProxyStandIn:
    mapping: dict


@_register_codec
class _MappingProxyCodec(StandInCodec):
    stand_ins = (_MappingProxyStandIn,)
    value_types = (types.MappingProxyType,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _MappingProxyStandIn(converter.convert(dict(obj), path, guarded))

    @staticmethod
    def load(hydrator, stand_in):
        return types.MappingProxyType(hydrator(stand_in.mapping))


@dataclasses.dataclass
class _TupleIteratorStandIn:
    remaining: tuple


@_register_codec
class _TupleIteratorCodec(StandInCodec):
    stand_ins = (_TupleIteratorStandIn,)

    @classmethod
    def handles_type(cls, value_type):
        return value_type.__name__ == "tuple_iterator"

    @staticmethod
    def save(converter, obj, path, guarded):
        _, (seq,), index = obj.__reduce__()
        return _TupleIteratorStandIn(
            tuple(converter.child(v, path, guarded) for v in seq[index:])
        )

    @staticmethod
    def load(hydrator, stand_in):
        return iter(tuple(hydrator(v) for v in stand_in.remaining))


@dataclasses.dataclass
class _RangeIteratorStandIn:
    start: int
    stop: int
    step: int
    index: int


@_register_codec
class _RangeIteratorCodec(StandInCodec):
    stand_ins = (_RangeIteratorStandIn,)

    @classmethod
    def handles_type(cls, value_type):
        return value_type.__name__ == "range_iterator"

    @staticmethod
    def save(converter, obj, path, guarded):
        _, (rng,), index = obj.__reduce__()
        return _RangeIteratorStandIn(rng.start, rng.stop, rng.step, index)

    @staticmethod
    def load(hydrator, stand_in):
        it = iter(range(stand_in.start, stand_in.stop, stand_in.step))
        for _ in range(stand_in.index):
            next(it)
        return it


# NOTE: [Count iterators]
# An itertools.count holds its next item and its step, which its repr shows:
# "count(2)" (step 1) or "count(2, 3)". (Its __reduce__ says the same but is
# deprecated from Python 3.12 and gone in 3.14.) A count whose item and step
# are literals (ints, floats, complex) is saved as the two and loads as a new
# count from them, which guards read as they read the original (its type,
# its next item and step); any other count (of Fractions, Decimals...) is
# refused when a guard reads it.
_COUNT_ITERATOR_TYPE = type(itertools.count())


def _count_item_and_step(counter) -> Optional[tuple]:
    text = repr(counter)
    if not (text.startswith("count(") and text.endswith(")")):
        return None
    try:
        args = ast.literal_eval(f"({text[len('count('):-1]},)")
    except (SyntaxError, ValueError):
        return None
    if not (isinstance(args, tuple) and 1 <= len(args) <= 2):
        return None
    if not all(type(a) in (int, float, complex) for a in args):
        return None
    return (args[0], args[1] if len(args) == 2 else 1)


@dataclasses.dataclass
class _CountIteratorStandIn:
    item: Any
    step: Any


@_register_codec
class _CountIteratorCodec(StandInCodec):
    """An itertools.count by its next item and step (NOTE: [Count iterators])."""

    stand_ins = (_CountIteratorStandIn,)
    exact_types = (_COUNT_ITERATOR_TYPE,)

    @staticmethod
    def save(converter, obj, path, guarded):
        item_and_step = _count_item_and_step(obj)
        if item_and_step is not None:
            return _CountIteratorStandIn(*item_and_step)
        if not guarded:
            return _DECLINED
        raise converter.refusal(
            path,
            f"the guarded {obj!r:.80} counts other numbers than ints, floats or "
            "complex numbers, which cannot be saved",
        )

    @staticmethod
    def load(hydrator, stand_in):
        return itertools.count(stand_in.item, stand_in.step)


@dataclasses.dataclass
class _DispatchKeySetStandIn:
    keys: tuple


@_register_codec
class _DispatchKeySetCodec(StandInCodec):
    stand_ins = (_DispatchKeySetStandIn,)
    value_types = (torch._C.DispatchKeySet,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _DispatchKeySetStandIn(_key_set_names(obj))

    @staticmethod
    def load(hydrator, stand_in):
        key_set = torch._C.DispatchKeySet(torch._C.DispatchKey.Undefined)
        for name in stand_in.keys:
            key_set = key_set | torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, name))
        return key_set


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


@_register_codec
class _WeakrefCodec(StandInCodec):
    stand_ins = (_WeakrefStandIn,)
    exact_types = (weakref.ReferenceType,)

    @staticmethod
    def save(converter, obj, path, guarded):
        referent = obj()
        if referent is None:
            return _WeakrefStandIn(None, True)
        return _WeakrefStandIn(converter.child(referent, f"{path}()", guarded), False)

    @staticmethod
    def load(hydrator, stand_in):
        if stand_in.dead:
            return weakref.ref(_Placeholder("dead weakref referent"))
        referent = hydrator(stand_in.referent)
        hydrator.keep_alive.append(referent)
        return weakref.ref(referent)


@dataclasses.dataclass
class _DictViewStandIn:
    """``d.keys()``, ``d.values()`` or ``d.items()`` (``kind``) of a rebuilt dict."""

    kind: str
    items: dict
    ordered: bool


def _dict_view_kinds() -> dict:
    kinds = {}
    mapping: dict
    for mapping, ordered in (({}, False), (collections.OrderedDict(), True)):
        for kind in ("keys", "values", "items"):
            kinds[type(getattr(mapping, kind)())] = (kind, ordered)
    return kinds


_DICT_VIEW_KINDS = _dict_view_kinds()


@_register_codec
class _DictViewCodec(StandInCodec):
    """A guarded dict view; an unguarded one is a placeholder."""

    stand_ins = (_DictViewStandIn,)
    exact_types = tuple(_DICT_VIEW_KINDS)

    @classmethod
    def accepts(cls, obj, guarded):
        return guarded and cls.handles_type(type(obj))

    @staticmethod
    def save(converter, obj, path, guarded):
        kind, ordered = _DICT_VIEW_KINDS[type(obj)]
        view = _DictViewStandIn(kind, {}, ordered)
        converter.memo[id(obj)] = view
        _save_items(converter, obj.mapping, view.items, path, True)
        return view

    @staticmethod
    def load(hydrator, stand_in):
        mapping: dict = collections.OrderedDict() if stand_in.ordered else {}
        _load_items(hydrator, stand_in.items, mapping)
        return getattr(mapping, stand_in.kind)()


@_register_codec
class _PlaceholderCodec(StandInCodec):
    """Whatever is left that no guard read: a placeholder naming its type.
    Every codec after this one sees guarded values only."""

    stand_ins = (_Placeholder,)
    value_types = (object,)

    @classmethod
    def accepts(cls, obj, guarded):
        return not guarded

    @staticmethod
    def save(converter, obj, path, guarded):
        return _placeholder_of(obj)


@_register_codec
class _StableNameCodec(StandInCodec):
    """Any other object that has a stable name (an lru_cache-wrapped
    module-level function...): saved by name, loaded by _NamedCodec."""

    value_types = (object,)

    @classmethod
    def accepts(cls, obj, guarded):
        return hasattr(obj, "__qualname__")

    @staticmethod
    def save(converter, obj, path, guarded):
        ref = find_stable_name(obj)
        if ref is None:
            return _DECLINED
        converter.memo[id(obj)] = ref
        return ref


@dataclasses.dataclass
class _TupleSubclassStandIn:
    """A namedtuple (or other tuple subclass) instance."""

    cls: _NamedRef
    items: tuple


@_register_codec
class _TupleSubclassCodec(StandInCodec):
    stand_ins = (_TupleSubclassStandIn,)
    value_types = (tuple,)

    @staticmethod
    def save(converter, obj, path, guarded):
        cls_ref = converter.class_ref(type(obj), path)
        if cls_ref is None:
            return converter.unnamed(obj, path, guarded)
        out = _TupleSubclassStandIn(cls_ref, ())
        converter.memo[id(obj)] = out
        out.items = tuple(converter.child(v, f"{path}[{i}]", True) for i, v in enumerate(obj))
        return out

    @staticmethod
    def load(hydrator, stand_in):
        cls = hydrator(stand_in.cls)
        if not (isinstance(cls, type) and issubclass(cls, tuple)):
            return UnresolvedName(stand_in.cls.module, getattr(stand_in.cls, "path", ""))
        return tuple.__new__(cls, tuple(hydrator(v) for v in stand_in.items))


@dataclasses.dataclass
class _PartialStandIn:
    func: Any
    args: tuple
    keywords: dict


@_register_codec
class _PartialCodec(StandInCodec):
    stand_ins = (_PartialStandIn,)
    exact_types = (functools.partial,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _PartialStandIn(
            converter.convert(obj.func, f"{path}.func", True),
            tuple(converter.child(a, f"{path}.args", True) for a in obj.args),
            {k: converter.child(v, f"{path}.keywords", True) for k, v in obj.keywords.items()},
        )

    @staticmethod
    def load(hydrator, stand_in):
        func = hydrator(stand_in.func)
        if not callable(func):
            return UnresolvedName("functools", "partial")
        args = (hydrator(a) for a in stand_in.args)
        return functools.partial(
            func, *args, **{k: hydrator(v) for k, v in stand_in.keywords.items()}
        )


@dataclasses.dataclass
class _BoundMethodStandIn:
    func: Any
    owner: Any


@_register_codec
class _BoundMethodCodec(StandInCodec):
    stand_ins = (_BoundMethodStandIn,)
    value_types = (types.MethodType,)

    @staticmethod
    def save(converter, obj, path, guarded):
        return _BoundMethodStandIn(
            converter.convert(obj.__func__, f"{path}.__func__", True),
            converter.convert(obj.__self__, f"{path}.__self__", True),
        )

    @staticmethod
    def load(hydrator, stand_in):
        func = hydrator(stand_in.func)
        if not callable(func):
            return UnresolvedName("types", "MethodType")
        return types.MethodType(func, hydrator(stand_in.owner))


@dataclasses.dataclass
class _CellStandIn:
    contents: Any
    empty: bool


@_register_codec
class _CellCodec(StandInCodec):
    stand_ins = (_CellStandIn,)
    value_types = (types.CellType,)

    @staticmethod
    def save(converter, obj, path, guarded):
        try:
            contents = obj.cell_contents
        except ValueError:
            return _CellStandIn(None, True)
        return _CellStandIn(converter.child(contents, f"{path}.cell_contents", True), False)

    @staticmethod
    def load(hydrator, stand_in):
        if stand_in.empty:
            return types.CellType()
        return types.CellType(hydrator(stand_in.contents))


@dataclasses.dataclass
class _ObjectStandIn:
    """An instance of a class, rebuilt without running its ``__init__``."""

    cls: Any  # _NamedRef or _LocalClassStandIn
    state: dict
    slots: Optional[dict] = None
    # The items of an instance of a dict subclass (a Hugging Face ModelOutput).
    items: Optional[dict] = None


# NOTE: [Instances of classes with a custom __new__]
# A guarded instance is rebuilt at load so that the builder reads from it what
# it read at save: its class (TYPE_MATCH compares only ``type(value)``), the
# attributes and items other guards read. Its class's own ``__new__`` (and
# ``__init__``) never run: torch.no_grad's ``__new__`` decides between a context
# manager and a decorated function from its arguments, a user's may count
# instances or open files. The instance is allocated by the ``__new__`` of the
# class's nearest built-in base, which makes an empty object with no side
# effects, when that base is one of _SAFE_BASE_TYPES (object for an ordinary
# class, dict/OrderedDict for a ModelOutput, ...); a class over any other
# built-in base (a C extension type whose allocation may do anything) is
# refused, naming the base. The class's ``__new__`` being custom no longer
# matters: the class is found by name, and only attributes some guard reads
# hold their values (the others are placeholders, never rebuilt objects).
_SAFE_BASE_TYPES = (
    object,
    dict,
    collections.OrderedDict,
    list,
    set,
    types.SimpleNamespace,
)


def _safe_base(cls: type) -> Optional[type]:
    """The nearest built-in base of ``cls`` when its ``__new__`` makes an
    instance of ``cls`` without side effects (NOTE: [Instances of classes with a
    custom __new__]), else None."""
    for klass in cls.__mro__:
        if not klass.__flags__ & _HEAPTYPE:
            return klass if klass in _SAFE_BASE_TYPES else None
    return None


def _nearest_builtin_base(cls: type) -> type:
    return next(k for k in cls.__mro__ if not k.__flags__ & _HEAPTYPE)


def _slot_names(cls: type) -> list[str]:
    """The ``__slots__`` of ``cls`` and its bases that hold values."""
    names = []
    for klass in cls.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in slots if isinstance(slots, (tuple, list)) else (slots,):
            if name not in ("__dict__", "__weakref__"):
                names.append(name)
    return names


@_register_codec
class _ObjectCodec(StandInCodec):
    """An instance of a class with a ``__dict__`` or ``__slots__``."""

    stand_ins = (_ObjectStandIn,)
    value_types = (object,)

    @classmethod
    def accepts(cls, obj, guarded):
        return (hasattr(obj, "__dict__") or hasattr(type(obj), "__slots__")) and not isinstance(
            obj, type
        )

    @staticmethod
    def save(converter, obj, path, guarded):
        cls = type(obj)
        cls_ref = converter.class_ref(cls, path)
        if cls_ref is None:
            raise converter.refusal(
                path,
                f"it is an instance of {cls.__qualname__}, a class with no stable "
                "name in another process; define the class at module scope",
            )
        # Allocated at load by a built-in base's __new__, the class's own never
        # run (NOTE: [Instances of classes with a custom __new__]; FSDPModule's
        # only redirects construction: NOTE: [FSDP2 module classes]).
        if _safe_base(cls) is None:
            raise converter.refusal(
                path,
                f"it is an instance of {cls.__qualname__}, which derives from the "
                f"built-in {_nearest_builtin_base(cls).__qualname__}: an instance "
                "cannot be made at load without running its constructor",
            )
        stand_in = _ObjectStandIn(cls_ref, {})
        converter.memo[id(obj)] = stand_in
        state = stand_in.state
        for k, v in getattr(obj, "__dict__", {}).items():
            # A constant is itself (child's first test), without its path made.
            state[k] = v if type(v) in _CONSTANT_TYPES else converter.child(v, f"{path}.{k}", True)
        slot_names = _slot_names(cls)
        if slot_names:
            stand_in.slots = {
                name: converter.child(getattr(obj, name), f"{path}.{name}", True)
                for name in slot_names
                if hasattr(obj, name)
            }
        if isinstance(obj, dict) and obj:
            stand_in.items = {
                converter.key(k, path): converter.child(v, f"{path}[{k!r}]", True)
                for k, v in dict.items(obj)
            }
        return stand_in

    @staticmethod
    def load(hydrator, stand_in):
        cls = hydrator(stand_in.cls)
        if not isinstance(cls, type):
            if isinstance(cls, UnresolvedName):
                return cls
            return UnresolvedName(stand_in.cls.module, getattr(stand_in.cls, "path", ""))
        base: Any = _safe_base(cls)
        if base is None:
            return UnresolvedName(cls.__module__, cls.__qualname__)
        try:
            inst = base.__new__(cls)
        except TypeError:
            return UnresolvedName(cls.__module__, cls.__qualname__)
        hydrator.memo[id(stand_in)] = inst
        if stand_in.state:
            inst.__dict__.update({k: hydrator(v) for k, v in stand_in.state.items()})
        for name, value in (stand_in.slots or {}).items():
            object.__setattr__(inst, name, hydrator(value))
        if stand_in.items and base in (dict, collections.OrderedDict):
            # The base's own __setitem__ (a ModelOutput's also sets an attribute).
            for k, v in stand_in.items.items():
                base.__setitem__(inst, hydrator(k), hydrator(v))
        return inst


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


class _LocalClassAttribute:
    """The value of every attribute of a rebuilt local class (see NOTE: [Classes
    defined in local scope]): present, so ``hasattr`` agrees, and never read by
    a guard (the values guards read are recorded by their source)."""

    def __repr__(self) -> str:
        return "<attribute of a class defined in local scope>"


_LOCAL_CLASS_ATTRIBUTE = _LocalClassAttribute()


@_register_codec
class _LocalClassCodec(StandInCodec):
    """See NOTE: [Classes defined in local scope]. Reached through
    _StandInConverter.class_ref / unnamed."""

    stand_ins = (_LocalClassStandIn,)

    @staticmethod
    def save(converter, obj, path, guarded):
        if id(obj) in converter.memo:
            return converter.memo[id(obj)]
        own = vars(obj)
        slots = own.get("__slots__")
        if slots is not None:
            slots = (slots,) if isinstance(slots, str) else tuple(slots)
        stand_in = _LocalClassStandIn(
            module=obj.__module__,
            qualname=obj.__qualname__,
            name=obj.__name__,
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
        converter.memo[id(obj)] = stand_in
        bases = []
        for base in obj.__bases__:
            base_ref = converter.class_ref(base, path)
            if base_ref is None:
                raise converter.refusal(
                    path,
                    f"its class {obj.__qualname__}, defined in local scope, cannot be "
                    f"rebuilt in another process: its base {base!r} has no stable name",
                )
            bases.append(base_ref)
        stand_in.bases = tuple(bases)
        return stand_in

    @staticmethod
    def load(hydrator, stand_in):
        bases = tuple(hydrator(base) for base in stand_in.bases)
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
            log.debug(
                "guard serialization: cannot rebuild class %s", stand_in.qualname, exc_info=True
            )
            return UnresolvedName(stand_in.module, stand_in.qualname)


@dataclasses.dataclass
class _FunctionStandIn:
    """A function with no stable name, read only as the base of guarded values
    (its ``__code__``, defaults...): a function object of its own with the saved
    defaults; identity guards on what it holds are recorded separately."""

    name: str
    defaults: Optional[tuple]
    kwdefaults: Optional[dict]


def _placeholder_function(*args, **kwargs):
    """The code of functions that stand in for functions with no stable name."""


@_register_codec
class _FunctionCodec(StandInCodec):
    """Reached through _StandInConverter.unnamed."""

    stand_ins = (_FunctionStandIn,)

    @staticmethod
    def save(converter, obj, path, guarded):
        defaults, kwdefaults = obj.__defaults__, obj.__kwdefaults__
        return _FunctionStandIn(
            obj.__name__,
            None if defaults is None else converter.child(defaults, f"{path}.__defaults__", True),
            None
            if kwdefaults is None
            else converter.child(kwdefaults, f"{path}.__kwdefaults__", True),
        )

    @staticmethod
    def load(hydrator, stand_in):
        fn = types.FunctionType(_placeholder_function.__code__, {}, stand_in.name)
        fn.__defaults__ = hydrator(stand_in.defaults)
        fn.__kwdefaults__ = hydrator(stand_in.kwdefaults)
        return fn


@dataclasses.dataclass(frozen=True)
class _FrozenObjectStandIn:
    """A hashable instance (a frozen dataclass, used as a dict key or set item)."""

    cls: _NamedRef
    state: tuple  # sorted (name, key stand-in) pairs


@_register_codec
class _FrozenObjectCodec(StandInCodec):
    """Reached through _StandInConverter.key: a frozen dataclass whose class has
    a stable name (declined otherwise)."""

    stand_ins = (_FrozenObjectStandIn,)

    @staticmethod
    def accepts_key(obj) -> bool:
        return (
            dataclasses.is_dataclass(obj)
            and not isinstance(obj, type)
            and type(obj).__dataclass_params__.frozen  # type: ignore[attr-defined]
        )

    @staticmethod
    def save(converter, obj, path, guarded):
        cls_ref = find_stable_name(type(obj))
        if cls_ref is None:
            return _DECLINED
        state = sorted(
            (f.name, converter.key(getattr(obj, f.name), path))
            for f in dataclasses.fields(obj)
        )
        return _FrozenObjectStandIn(cls_ref, tuple(state))

    @staticmethod
    def load(hydrator, stand_in):
        cls = resolve_name(stand_in.cls)
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            return UnresolvedName(stand_in.cls.module, stand_in.cls.path)
        inst = object.__new__(cast(Any, cls))
        for name, value in stand_in.state:
            object.__setattr__(inst, name, hydrator(value))
        return inst


# What a dict key or set item may be saved as: hashable stand-ins.
_KEY_STAND_IN_TYPES = (
    _NamedRef,
    _EnumStandIn,
    _DtypeStandIn,
    _DeviceStandIn,
    tuple,
    frozenset,
)


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



def _key_set_names(key_set) -> tuple:
    text = str(key_set)
    inner = text[len("DispatchKeySet(") : -1] if text.startswith("DispatchKeySet(") else text
    return tuple(name for name in inner.split(", ") if name)


# raw bits of a dispatch key set -> its key names (a set's names follow from
# its bits; a process sees a handful of sets, and a save reads one per tensor)
_KEY_SET_NAMES: dict[int, tuple] = {}


def _dispatch_key_names(t: torch.Tensor) -> tuple:
    key_set = torch._C._dispatch_keys(t)
    raw = key_set.raw_repr()
    names = _KEY_SET_NAMES.get(raw)
    if names is None:
        names = _KEY_SET_NAMES[raw] = _key_set_names(key_set)
    return names


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


def _tensor_subclass(cls: Any, ref: _NamedRef) -> type:
    """``cls``, what ``ref`` (a tensor subclass the saved guards check)
    resolved to here, or the refusal of the load when it is none."""
    if not (isinstance(cls, type) and issubclass(cls, torch.Tensor)):
        raise PackageError(
            f"tensor subclass {ref.module}.{ref.path}, which the saved guards "
            "check, cannot be found in this process"
        )
    return cls


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
    # (torch.inference_mode's own guard: the Python context manager around it
    # costs more than the tensor)
    with torch._C._DisableFuncTorch(), torch._C._InferenceMode(s.is_inference):
        t = _make_tensor_here(s)
        if s.subclass is not None:
            t = t.as_subclass(_tensor_subclass(resolve_name(s.subclass), s.subclass))
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
        t = t.conj()
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
