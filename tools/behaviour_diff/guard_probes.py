"""Differential probe set for guard serialization: small functions and input batteries.

Each probe is a function Dynamo traces once with an example input; the guards
built for it are then checked against a battery of inputs, some of which the
guards must accept and some they must reject. The runner
(``guard_probe_runner.py``) computes, for every probe and input, the decision of
the reference guard manager and of the one rebuilt after save -> pickle -> load,
in torch 2.7.1 + torch_overlay and in upstream torch, both through upstream's API
(``save_guards=True``, ``load_guards_state`` + ``load_guard_manager``: the tests'
harness, test/dynamo/guard_round_trip.py), and ``diff_upstream.py`` compares them.

This module must import on every torch the runner runs on (2.7.1 and 2.13), and
is imported under the stable name ``guard_probes`` in both the saving and the
loading process, so that module-level objects (classes, functions, globals) are
found again by name after a load, as they would be in a real program.

Provides :data:`PROBES` (registered with :func:`probe`), :class:`Probe`,
:class:`Call` and :class:`A` (an argument list).

# NOTE: [Probe design]
# * Every probe must trace WITHOUT a graph break on both versions: the runner
#   drives InstructionTranslator directly, where a graph break is an error.
# * Battery inputs are built by callables, freshly in each process, so that the
#   loading process checks its own objects (as a real load would) and the
#   identity of module-level objects still means "the object with this name".
# * A battery entry may carry a context (global state, patched module globals)
#   that is active while the guards are checked; a probe may carry a compile
#   context that is active while it is traced and its guards are built.
# * ``covers`` names the guard types a probe is written to exercise; the report
#   lists the guard types each version actually emitted, so a probe that stops
#   exercising what it was written for shows up there.
# * ``keep_guard`` (a predicate on a GuardFilterEntry, the same in both
#   versions) narrows the guards further in every mode: what a user passes as
#   guard_filter_fn, e.g. to leave out the guard on a local class's identity.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import enum
import functools
import logging
import math
import types
import unittest.mock
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn


log = logging.getLogger(__name__)


class A:
    """The arguments of one call: ``A(x, n=2)``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs


@dataclasses.dataclass(frozen=True)
class Call:
    """One input of a battery: ``make`` builds the arguments; ``context`` (a
    factory of a context manager) is active while the guards are checked."""

    label: str
    make: Callable[[], A]
    context: Optional[Callable[[], contextlib.AbstractContextManager]] = None


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    fn: Callable
    example: Call
    battery: tuple[Call, ...]
    covers: tuple[str, ...]
    # Active while the probe is traced and its guards are built or loaded.
    compile_context: Optional[Callable[[], contextlib.AbstractContextManager]] = None
    # torch._dynamo.config values patched while tracing, building and loading.
    config: dict = dataclasses.field(default_factory=dict)
    # Guard serialization is expected to be refused by the overlay (a probe of the
    # refusal policy); documentation for the reader of the report.
    expect_refusal: bool = False
    # Keeps a guard (GuardFilterEntry -> bool) in every guard mode; None keeps all.
    keep_guard: Optional[Callable[[Any], bool]] = None


PROBES: list[Probe] = []


def probe(
    example: Call,
    *battery: Call,
    covers: tuple[str, ...] = (),
    compile_context: Optional[Callable[[], contextlib.AbstractContextManager]] = None,
    config: Optional[dict] = None,
    expect_refusal: bool = False,
    keep_guard: Optional[Callable[[Any], bool]] = None,
):
    """Register the decorated function as a probe traced with ``example``."""

    def register(fn):
        if any(p.name == fn.__name__ for p in PROBES):
            raise ValueError(f"duplicate probe name {fn.__name__}")
        PROBES.append(
            Probe(
                name=fn.__name__,
                fn=fn,
                example=example,
                battery=tuple(battery),
                covers=tuple(covers),
                compile_context=compile_context,
                config=dict(config or {}),
                expect_refusal=expect_refusal,
                keep_guard=keep_guard,
            )
        )
        return fn

    return register


def C(label: str, make: Callable[[], A], context=None) -> Call:
    return Call(label, make, context)


# ---------------------------------------------------------------------------
# Input and context helpers
# ---------------------------------------------------------------------------


def t(*shape: int, dtype=torch.float32, requires_grad: bool = False) -> torch.Tensor:
    if dtype.is_floating_point or dtype.is_complex:
        out = torch.randn(*shape, dtype=dtype)
    elif dtype == torch.bool:
        out = torch.zeros(*shape, dtype=dtype)
    else:
        out = torch.arange(math.prod(shape), dtype=dtype).reshape(shape)
    return out.requires_grad_(requires_grad)


def dyn(x: torch.Tensor, *dims: int) -> torch.Tensor:
    for d in dims:
        torch._dynamo.mark_dynamic(x, d)
    return x


def _same_tensor_twice(a: torch.Tensor) -> A:
    return A(a, a)


def _advanced_once(it) -> A:
    """A tensor and ``it`` after one ``next``."""
    next(it)
    return A(t(3), it)


def _with_forward_hook(module) -> A:
    """``module`` with a (no-op) forward hook registered, and a tensor."""
    module.register_forward_hook(lambda *args: None)
    return A(module, t(3))


def _with_extra(box) -> A:
    """``box`` with an ``extra`` attribute set, and a tensor."""
    box.extra = 1
    return A(box, t(3))


@contextlib.contextmanager
def patch_global(name: str, value: Any):
    """Rebind a global of this module while the guards are checked."""
    scope = globals()
    missing = object()
    old = scope.get(name, missing)
    scope[name] = value
    try:
        yield
    finally:
        if old is missing:
            del scope[name]
        else:
            scope[name] = old


@contextlib.contextmanager
def deterministic_algorithms():
    old = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old)


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@contextlib.contextmanager
def num_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def vmap_level():
    """A functorch vmap layer on the interpreter stack, as inside torch.vmap."""
    torch._C._functorch._vmap_increment_nesting(2, "error")
    try:
        yield
    finally:
        torch._C._functorch._vmap_decrement_nesting()


def no_grad():
    return torch.no_grad()


# ---------------------------------------------------------------------------
# Module-level types and objects the probes guard on
# ---------------------------------------------------------------------------


class Box:
    """A plain user object with attributes."""

    def __init__(self, scale=2.0, offset=1, child=None):
        self.scale = scale
        self.offset = offset
        self.child = child

    def apply(self, x):
        return x * self.scale


class SubBox(Box):
    def apply(self, x):
        return x * self.scale + 1


class Slotted:
    __slots__ = ("scale",)

    def __init__(self, scale):
        self.scale = scale


@dataclasses.dataclass
class Config:
    scale: float = 2.0
    bias: int = 1
    name: str = "cfg"


Point = collections.namedtuple("Point", ["x", "y"])


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class MLP(nn.Module):
    def __init__(self, hidden=4):
        super().__init__()
        self.fc1 = nn.Linear(3, hidden)
        self.fc2 = nn.Linear(hidden, 2)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


class WithBuffer(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.register_buffer("shift", torch.ones(n))

    def forward(self, x):
        return x + self.shift


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        if self.training:
            return self.lin(x) + 1
        return self.lin(x) - 1


class PassthroughMode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def helper(x, k=2):
    return x * k


def other_helper(x, k=2):
    return x * k + 1


def row_sum(row):
    return row.sum()


def make_adder(n):
    def add(x):
        return x + n

    return add


def make_local_object():
    class Local:
        def __init__(self):
            self.scale = 2

    return Local()


def make_local_module(hidden=4):
    # The usual notebook / test shape: the module class defined in a function.
    class LocalMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(3, hidden)
            self.register_buffer("shift", torch.zeros(2))
            self.fc2 = nn.Linear(hidden, 2)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x))) + self.shift

    return LocalMLP()


def make_local_config(scale=2):
    class LocalConfig:
        offset = 1

        def __init__(self):
            self.scale = scale

    return LocalConfig()


def is_local_class(cls) -> bool:
    return isinstance(cls, type) and "<locals>" in cls.__qualname__


def not_on_local_class_identity(entry) -> bool:
    """False for the guards that compare a class defined in local scope (TYPE_MATCH
    of an instance of one, ID_MATCH / CLASS_MATCH of one): what a user of either
    version leaves out with guard_filter_fn to save such a frame."""
    value = entry.value if entry.has_value else None
    if entry.guard_type == "TYPE_MATCH":
        return not is_local_class(type(value))
    if entry.guard_type in ("ID_MATCH", "CLASS_MATCH"):
        return not is_local_class(value)
    return True


def shadowed_forward(module):
    module.forward = lambda x: x
    return module


K = 3
OPT = None
W = torch.ones(3)
CFG = {"scale": 2, "mode": "add"}
CONF = Box(scale=3.0, offset=2)
MODEL = MLP()
SCALE_FN = lambda x: x * 2  # noqa: E731
PARTIAL = functools.partial(helper, k=5)
GLOBAL_ADDER = make_adder(7)


# ---------------------------------------------------------------------------
# Tensors
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(t(3))),
    C("same shape, other values", lambda: A(t(3) + 5)),
    C("other size", lambda: A(t(4))),
    C("2-d", lambda: A(t(1, 3))),
    C("float64", lambda: A(t(3, dtype=torch.float64))),
    C("int64", lambda: A(t(3, dtype=torch.int64))),
    C("requires_grad", lambda: A(t(3, requires_grad=True))),
    C("strided view", lambda: A(t(6)[::2])),
    C("nn.Parameter", lambda: A(nn.Parameter(t(3)))),
    C("python float", lambda: A(3.0)),
    covers=("TENSOR_MATCH",),
)
def tensor_float32(x):
    return x.sin() + 1


@probe(
    C("example", lambda: A(t(3, requires_grad=True))),
    C("requires_grad, other values", lambda: A(t(3, requires_grad=True) * 2)),
    C("no requires_grad", lambda: A(t(3))),
    C("non-leaf requiring grad", lambda: A(t(3, requires_grad=True) * 1)),
    covers=("TENSOR_MATCH",),
)
def tensor_requires_grad(x):
    return (x * x).sum()


@probe(
    C("example", lambda: A(t(4, dtype=torch.int64))),
    C("int64", lambda: A(t(4, dtype=torch.int64) + 3)),
    C("int32", lambda: A(t(4, dtype=torch.int32))),
    C("float32", lambda: A(t(4))),
    C("bool", lambda: A(t(4, dtype=torch.bool))),
    covers=("TENSOR_MATCH",),
)
def tensor_int64(x):
    return x + 1


@probe(
    C("example", lambda: A(t(2, 2, dtype=torch.bool))),
    C("bool", lambda: A(t(2, 2, dtype=torch.bool).logical_not())),
    C("uint8", lambda: A(t(2, 2, dtype=torch.uint8))),
    covers=("TENSOR_MATCH",),
)
def tensor_bool(x):
    return x.logical_not()


@probe(
    C("example", lambda: A(t(2, 3))),
    C("contiguous", lambda: A(t(2, 3))),
    C("transposed view, same sizes", lambda: A(t(3, 2).t())),
    C("3x2", lambda: A(t(3, 2))),
    C("expanded (stride 0)", lambda: A(t(1, 3).expand(2, 3))),
    covers=("TENSOR_MATCH",),
)
def tensor_2d_strides(x):
    return x.sum(0)


@probe(
    C("example", lambda: A(torch.tensor(1.5))),
    C("0-d", lambda: A(torch.tensor(-2.0))),
    C("1 element 1-d", lambda: A(torch.tensor([1.5]))),
    C("0-d float64", lambda: A(torch.tensor(1.5, dtype=torch.float64))),
    C("1-d empty", lambda: A(torch.empty(0))),
    covers=("TENSOR_MATCH",),
)
def tensor_0d(x):
    return x * 2


@probe(
    C("example", lambda: A(t(3, dtype=torch.float16))),
    C("float16", lambda: A(t(3, dtype=torch.float16))),
    C("bfloat16", lambda: A(t(3, dtype=torch.bfloat16))),
    C("float32", lambda: A(t(3))),
    covers=("TENSOR_MATCH",),
)
def tensor_half(x):
    return x.float() * 2


@probe(
    C("example", lambda: A(t(3, dtype=torch.complex64))),
    C("complex64", lambda: A(t(3, dtype=torch.complex64))),
    C("conjugated view", lambda: A(t(3, dtype=torch.complex64).conj())),
    C("complex128", lambda: A(t(3, dtype=torch.complex128))),
    covers=("TENSOR_MATCH",),
)
def tensor_complex(x):
    return x.abs()


@probe(
    C("example", lambda: A(t(3), t(3))),
    C("two tensors", lambda: A(t(3), t(3))),
    C("same tensor twice", lambda: _same_tensor_twice(t(3))),
    C("second is float64", lambda: A(t(3), t(3, dtype=torch.float64))),
    covers=("TENSOR_MATCH",),
)
def tensor_two_inputs(x, y):
    return x * y


@probe(
    C("example", lambda: _same_tensor_twice(t(3))),
    C("same tensor twice", lambda: _same_tensor_twice(t(3))),
    C("two tensors", lambda: A(t(3), t(3))),
    covers=("TENSOR_MATCH",),
)
def tensor_same_twice(x, y):
    return x + y


@probe(
    C("example", lambda: A(torch.empty(3, device="meta"))),
    C("meta", lambda: A(torch.empty(3, device="meta"))),
    C("cpu", lambda: A(t(3))),
    covers=("TENSOR_MATCH",),
)
def tensor_meta_device(x):
    return x * 2


@probe(
    C("example", lambda: A(nn.Parameter(t(3)))),
    C("Parameter", lambda: A(nn.Parameter(t(3)))),
    C("Parameter without grad", lambda: A(nn.Parameter(t(3), requires_grad=False))),
    C("plain tensor requiring grad", lambda: A(t(3, requires_grad=True))),
    covers=("TENSOR_MATCH",),
)
def tensor_parameter(x):
    return x * 2


@probe(
    C("example", lambda: A(t(1, 3, 2, 2).to(memory_format=torch.channels_last))),
    C("channels_last", lambda: A(t(1, 3, 2, 2).to(memory_format=torch.channels_last))),
    C("contiguous", lambda: A(t(1, 3, 2, 2))),
    covers=("TENSOR_MATCH",),
)
def tensor_channels_last(x):
    return x.relu()


# ---------------------------------------------------------------------------
# Python constants
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(t(3), 2)),
    C("n=2", lambda: A(t(3), 2)),
    C("n=3", lambda: A(t(3), 3)),
    C("n=True", lambda: A(t(3), True)),
    C("n=2.0", lambda: A(t(3), 2.0)),
    C("n=None", lambda: A(t(3), None)),
    covers=("CONSTANT_MATCH", "EQUALS_MATCH", "TYPE_MATCH"),
)
def int_arg(x, n):
    return x + n


@probe(
    C("example", lambda: A(t(3), 0.5)),
    C("0.5", lambda: A(t(3), 0.5)),
    C("0.25", lambda: A(t(3), 0.25)),
    C("int 1", lambda: A(t(3), 1)),
    covers=("CONSTANT_MATCH", "EQUALS_MATCH", "TYPE_MATCH"),
)
def float_arg(x, s):
    return x * s


@probe(
    C("example", lambda: A(t(3), True)),
    C("True", lambda: A(t(3), True)),
    C("False", lambda: A(t(3), False)),
    C("1", lambda: A(t(3), 1)),
    covers=("CONSTANT_MATCH", "ID_MATCH"),
)
def bool_arg(x, flag):
    if flag:
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(t(3), None)),
    C("None", lambda: A(t(3), None)),
    C("tensor", lambda: A(t(3), t(3))),
    C("0", lambda: A(t(3), 0)),
    covers=("CONSTANT_MATCH", "ID_MATCH"),
)
def none_arg(x, y):
    if y is None:
        return x * 2
    return x + y


@probe(
    C("example", lambda: A(t(3), "add")),
    C("'add'", lambda: A(t(3), "add")),
    C("equal string built at runtime", lambda: A(t(3), "".join(["a", "dd"]))),
    C("'sub'", lambda: A(t(3), "sub")),
    C("bytes", lambda: A(t(3), b"add")),
    covers=("CONSTANT_MATCH", "EQUALS_MATCH"),
)
def str_arg(x, mode):
    if mode == "add":
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(t(3))),
    C("default n", lambda: A(t(3))),
    C("n=3 explicitly", lambda: A(t(3), n=3)),
    C("n=4", lambda: A(t(3), 4)),
    covers=("CONSTANT_MATCH", "EQUALS_MATCH"),
)
def default_arg(x, n=3):
    return x * n


@probe(
    C("example", lambda: A(t(3))),
    C("default scale", lambda: A(t(3))),
    C("scale=2.0 explicitly", lambda: A(t(3), scale=2.0)),
    C("scale=3.0", lambda: A(t(3), scale=3.0)),
    covers=("CONSTANT_MATCH", "EQUALS_MATCH"),
)
def kwonly_default(x, *, scale=2.0):
    return x * scale


@probe(
    C("example", lambda: A(t(3), t(3))),
    C("two tensors", lambda: A(t(3), t(3))),
    C("three tensors", lambda: A(t(3), t(3), t(3))),
    C("one tensor, one int", lambda: A(t(3), 1)),
    covers=("SEQUENCE_LENGTH", "TENSOR_MATCH"),
)
def varargs(*args):
    return args[0] + args[1]


@probe(
    C("example", lambda: A(t(3), a=2)),
    C("a=2", lambda: A(t(3), a=2)),
    C("a=3", lambda: A(t(3), a=3)),
    C("a=2, b=1", lambda: A(t(3), a=2, b=1)),
    covers=("DICT_KEYS_MATCH", "CONSTANT_MATCH"),
)
def varkwargs(x, **kw):
    return x * kw["a"]


# ---------------------------------------------------------------------------
# Containers
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A([t(3), t(3)])),
    C("list of 2 tensors", lambda: A([t(3), t(3)])),
    C("list of 3 tensors", lambda: A([t(3), t(3), t(3)])),
    C("tuple of 2 tensors", lambda: A((t(3), t(3)))),
    C("list, second float64", lambda: A([t(3), t(3, dtype=torch.float64)])),
    covers=("TYPE_MATCH", "SEQUENCE_LENGTH", "TENSOR_MATCH"),
)
def list_of_tensors(xs):
    return xs[0] + xs[1]


@probe(
    C("example", lambda: A(t(6), (2, 3))),
    C("(2, 3)", lambda: A(t(6), (2, 3))),
    C("(3, 2)", lambda: A(t(6), (3, 2))),
    C("[2, 3]", lambda: A(t(6), [2, 3])),
    C("(2, 3, 1)", lambda: A(t(6), (2, 3, 1))),
    covers=("TYPE_MATCH", "SEQUENCE_LENGTH", "EQUALS_MATCH"),
)
def tuple_of_ints(x, shape):
    return x.reshape(shape)


@probe(
    C("example", lambda: A({"a": t(3), "b": t(3)})),
    C("same keys", lambda: A({"a": t(3), "b": t(3)})),
    C("keys in other order", lambda: A({"b": t(3), "a": t(3)})),
    C("extra key", lambda: A({"a": t(3), "b": t(3), "c": 1})),
    C("OrderedDict", lambda: A(collections.OrderedDict(a=t(3), b=t(3)))),
    covers=("DICT_KEYS_MATCH", "TYPE_MATCH", "TENSOR_MATCH"),
)
def dict_lookup(d):
    return d["a"] + d["b"]


@probe(
    C("example", lambda: A({"a": 1, "b": 2}, t(3))),
    C("same keys and values", lambda: A({"a": 1, "b": 2}, t(3))),
    C("keys in other order", lambda: A({"b": 2, "a": 1}, t(3))),
    C("other value", lambda: A({"a": 1, "b": 3}, t(3))),
    covers=("DICT_KEYS_MATCH", "EQUALS_MATCH"),
)
def dict_iteration(d, x):
    out = x
    for k in d:
        out = out * d[k]
    return out


@probe(
    C("example", lambda: A({"k": 1}, t(3))),
    C("has 'k'", lambda: A({"k": 5, "j": 1}, t(3))),
    C("lacks 'k'", lambda: A({"j": 1}, t(3))),
    covers=("DICT_CONTAINS",),
)
def dict_contains(d, x):
    if "k" in d:
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A({"layers": [{"scale": 2}, {"scale": 3}], "name": "n"}, t(3))),
    C("same nesting", lambda: A({"layers": [{"scale": 2}, {"scale": 3}], "name": "m"}, t(3))),
    C("inner value changed", lambda: A({"layers": [{"scale": 2}, {"scale": 4}], "name": "n"}, t(3))),
    C("inner list longer", lambda: A({"layers": [{"scale": 2}, {"scale": 3}, {}], "name": "n"}, t(3))),
    C("inner dict is a tuple", lambda: A({"layers": ({"scale": 2}, {"scale": 3}), "name": "n"}, t(3))),
    covers=("DICT_KEYS_MATCH", "SEQUENCE_LENGTH", "EQUALS_MATCH"),
)
def nested_containers(cfg, x):
    return x * cfg["layers"][1]["scale"]


@probe(
    C("example", lambda: A([t(3), 2, "s", None])),
    C("same kinds", lambda: A([t(3), 2, "s", None])),
    C("int changed", lambda: A([t(3), 5, "s", None])),
    C("None replaced", lambda: A([t(3), 2, "s", 0])),
    covers=("SEQUENCE_LENGTH", "TENSOR_MATCH", "EQUALS_MATCH", "ID_MATCH"),
)
def mixed_list(items):
    if items[3] is None and items[2] == "s":
        return items[0] * items[1]
    return items[0]


@probe(
    C("example", lambda: A(Point(t(3), 2))),
    C("Point", lambda: A(Point(t(3), 2))),
    C("Point, y=3", lambda: A(Point(t(3), 3))),
    C("plain tuple", lambda: A((t(3), 2))),
    covers=("TYPE_MATCH", "SEQUENCE_LENGTH", "EQUALS_MATCH"),
)
def namedtuple_arg(p):
    return p.x * p.y


@probe(
    C("example", lambda: A(t(3), range(3))),
    C("range(3)", lambda: A(t(3), range(3))),
    C("range(4)", lambda: A(t(3), range(4))),
    C("range(0, 3, 2)", lambda: A(t(3), range(0, 3, 2))),
    covers=("EQUALS_MATCH", "TYPE_MATCH"),
)
def range_arg(x, r):
    for i in r:
        x = x + i
    return x


@probe(
    C("example", lambda: A(t(3), iter(range(3)))),
    C("fresh iterator", lambda: A(t(3), iter(range(3)))),
    C("advanced iterator", lambda: _advanced_once(iter(range(3)))),
    C("iterator over range(4)", lambda: A(t(3), iter(range(4)))),
    covers=("RANGE_ITERATOR_MATCH",),
)
def range_iterator_arg(x, it):
    return x + next(it)


@probe(
    C("example", lambda: A(t(3), iter((1, 2, 3)))),
    C("fresh iterator", lambda: A(t(3), iter((1, 2, 3)))),
    C("shorter tuple", lambda: A(t(3), iter((1, 2)))),
    covers=("TUPLE_ITERATOR_LEN",),
)
def tuple_iterator_arg(x, it):
    return x + next(it)


@probe(
    C("example", lambda: A(t(5), slice(0, 2))),
    C("slice(0, 2)", lambda: A(t(5), slice(0, 2))),
    C("slice(1, 3)", lambda: A(t(5), slice(1, 3))),
    covers=("TYPE_MATCH", "EQUALS_MATCH"),
)
def slice_arg(x, s):
    return x[s] * 2


@probe(
    C("example", lambda: A(t(6), torch.Size([2, 3]))),
    C("Size([2, 3])", lambda: A(t(6), torch.Size([2, 3]))),
    C("Size([3, 2])", lambda: A(t(6), torch.Size([3, 2]))),
    covers=("TYPE_MATCH", "EQUALS_MATCH"),
)
def size_arg(x, size):
    return x.view(size)


@probe(
    C("example", lambda: A(t(3), torch.float64)),
    C("float64", lambda: A(t(3), torch.float64)),
    C("float16", lambda: A(t(3), torch.float16)),
    covers=("EQUALS_MATCH", "ID_MATCH"),
)
def dtype_arg(x, dt):
    return x.to(dt)


@probe(
    C("example", lambda: A(t(3), torch.device("cpu"))),
    C("cpu", lambda: A(t(3), torch.device("cpu"))),
    C("meta", lambda: A(t(3), torch.device("meta"))),
    covers=("EQUALS_MATCH", "TYPE_MATCH"),
)
def device_arg(x, dev):
    return x.to(dev) + 1


@probe(
    C("example", lambda: A(t(3), types.MappingProxyType({"a": 2}))),
    C("same keys", lambda: A(t(3), types.MappingProxyType({"a": 2}))),
    C("other keys", lambda: A(t(3), types.MappingProxyType({"b": 2}))),
    C("plain dict", lambda: A(t(3), {"a": 2})),
    covers=("MAPPING_KEYS_CHECK", "TYPE_MATCH"),
)
def mappingproxy_arg(x, mp):
    return x * mp["a"]


@probe(
    C("example", lambda: A(t(3), {"a": 1, "b": 2}.keys())),
    C("same keys, other values", lambda: A(t(3), {"a": 5, "b": 6}.keys())),
    C("keys in another order", lambda: A(t(3), {"b": 2, "a": 1}.keys())),
    C("other keys", lambda: A(t(3), {"a": 1, "c": 2}.keys())),
    C("fewer keys", lambda: A(t(3), {"a": 1}.keys())),
    C("the dict itself", lambda: A(t(3), {"a": 1, "b": 2})),
    C("a values view", lambda: A(t(3), {"a": 1, "b": 2}.values())),
    covers=("EQUALS_MATCH", "SEQUENCE_LENGTH", "TYPE_MATCH"),
)
def dict_keys_arg(x, keys):
    return x * len(keys) + ("a" in keys)


@probe(
    C("example", lambda: A(t(3), {"a": 1, "b": 2}.values())),
    C("same values", lambda: A(t(3), {"c": 1, "d": 2}.values())),
    C("other values", lambda: A(t(3), {"a": 3, "b": 4}.values())),
    C("fewer values", lambda: A(t(3), {"a": 1}.values())),
    C("a keys view", lambda: A(t(3), {"a": 1, "b": 2}.keys())),
    C("a list", lambda: A(t(3), [1, 2])),
    covers=("TYPE_MATCH",),
)
def dict_values_arg(x, values):
    return x * len(values)


@probe(
    C("example", lambda: A(t(3), {"a": 1, "b": 2}.items())),
    C("same items", lambda: A(t(3), {"a": 1, "b": 2}.items())),
    C("other items", lambda: A(t(3), {"c": 3}.items())),
    C("a keys view", lambda: A(t(3), {"a": 1, "b": 2}.keys())),
    C("x of 4", lambda: A(t(4), {"a": 1, "b": 2}.items())),
    covers=("TYPE_MATCH",),
)
def dict_items_arg(x, items):
    return x * len(items)


# ---------------------------------------------------------------------------
# User objects
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(Box(2.0, 1), t(3))),
    C("Box, same attrs", lambda: A(Box(2.0, 1), t(3))),
    C("Box, other scale", lambda: A(Box(3.0, 1), t(3))),
    C("SubBox", lambda: A(SubBox(2.0, 1), t(3))),
    C("Config with same fields", lambda: A(Config(2.0, 1), t(3))),
    covers=("TYPE_MATCH", "EQUALS_MATCH"),
)
def object_attrs(b, x):
    return x * b.scale + b.offset


@probe(
    C("example", lambda: A(Box(), t(3))),
    C("without 'extra'", lambda: A(Box(), t(3))),
    C("with 'extra'", lambda: _with_extra(Box())),
    covers=("HASATTR", "TYPE_MATCH"),
)
def object_hasattr(o, x):
    if hasattr(o, "extra"):
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(Box(2.0), t(3))),
    C("Box", lambda: A(Box(2.0), t(3))),
    C("SubBox (overrides apply)", lambda: A(SubBox(2.0), t(3))),
    C("Box, apply patched on class", lambda: A(Box(2.0), t(3)),
      lambda: unittest.mock.patch.object(Box, "apply", SubBox.apply)),
    covers=("TYPE_MATCH", "ID_MATCH", "FUNCTION_MATCH"),
)
def object_method(o, x):
    return o.apply(x)


@probe(
    C("example", lambda: A(Box(child=Box(scale=t(3))), t(3))),
    C("same nesting", lambda: A(Box(child=Box(scale=t(3))), t(3))),
    C("inner tensor float64", lambda: A(Box(child=Box(scale=t(3, dtype=torch.float64))), t(3))),
    C("no child", lambda: A(Box(child=None), t(3))),
    covers=("TYPE_MATCH", "TENSOR_MATCH"),
)
def object_nested(o, x):
    return x * o.child.scale


@probe(
    C("example", lambda: A(Slotted(2), t(3))),
    C("Slotted(2)", lambda: A(Slotted(2), t(3))),
    C("Slotted(3)", lambda: A(Slotted(3), t(3))),
    covers=("TYPE_MATCH", "EQUALS_MATCH"),
)
def object_slots(o, x):
    return x * o.scale


@probe(
    C("example", lambda: A(Config(2.0, 1), t(3))),
    C("same fields", lambda: A(Config(2.0, 1), t(3))),
    C("bias 2", lambda: A(Config(2.0, 2), t(3))),
    C("name changed (not read)", lambda: A(Config(2.0, 1, "other"), t(3))),
    covers=("TYPE_MATCH", "EQUALS_MATCH"),
)
def dataclass_arg(cfg, x):
    return x * cfg.scale + cfg.bias


@probe(
    C("example", lambda: A(Color.RED, t(3))),
    C("RED", lambda: A(Color.RED, t(3))),
    C("GREEN", lambda: A(Color.GREEN, t(3))),
    C("int 1", lambda: A(1, t(3))),
    covers=("ID_MATCH", "TYPE_MATCH", "EQUALS_MATCH"),
)
def enum_arg(c, x):
    if c == Color.RED:
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(Box, t(3))),
    C("Box", lambda: A(Box, t(3))),
    C("SubBox", lambda: A(SubBox, t(3))),
    covers=("ID_MATCH",),
)
def class_arg(cls, x):
    if cls is Box:
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(Box(), t(3))),
    C("Box", lambda: A(Box(), t(3))),
    C("SubBox (still isinstance)", lambda: A(SubBox(), t(3))),
    C("Config", lambda: A(Config(), t(3))),
    covers=("TYPE_MATCH", "ID_MATCH"),
)
def isinstance_check(o, x):
    if isinstance(o, Box):
        return x + 1
    return x - 1


# ---------------------------------------------------------------------------
# nn.Module inputs
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(nn.Linear(3, 2), t(3))),
    C("another Linear(3, 2)", lambda: A(nn.Linear(3, 2), t(3))),
    C("Linear(3, 4)", lambda: A(nn.Linear(3, 4), t(3))),
    C("Linear(3, 2) without bias", lambda: A(nn.Linear(3, 2, bias=False), t(3))),
    C("Linear(3, 2) in eval mode", lambda: A(nn.Linear(3, 2).eval(), t(3))),
    C("input float64", lambda: A(nn.Linear(3, 2), t(3, dtype=torch.float64))),
    covers=("TENSOR_MATCH", "TYPE_MATCH", "EMPTY_NN_MODULE_HOOKS_DICT"),
)
def module_linear(m, x):
    return m(x)


@probe(
    C("example", lambda: A(MLP(), t(3))),
    C("another MLP()", lambda: A(MLP(), t(3))),
    C("MLP(hidden=5)", lambda: A(MLP(hidden=5), t(3))),
    C("MLP with a forward hook", lambda: _with_forward_hook(MLP())),
    covers=("TENSOR_MATCH", "TYPE_MATCH", "EMPTY_NN_MODULE_HOOKS_DICT"),
)
def module_mlp(m, x):
    return m(x)


@probe(
    C("example", lambda: A(Branchy(), t(3))),
    C("training", lambda: A(Branchy(), t(3))),
    C("eval", lambda: A(Branchy().eval(), t(3))),
    covers=("EQUALS_MATCH", "ID_MATCH"),
)
def module_training_flag(m, x):
    return m(x)


@probe(
    C("example", lambda: A(WithBuffer(), t(3))),
    C("same buffer shape", lambda: A(WithBuffer(), t(3))),
    C("buffer of 4", lambda: A(WithBuffer(4), t(4))),
    covers=("TENSOR_MATCH",),
)
def module_buffer(m, x):
    return m(x)


@probe(
    C("example", lambda: A(t(3))),
    C("as compiled", lambda: A(t(3))),
    C("MODEL rebound to another MLP", lambda: A(t(3)), lambda: patch_global("MODEL", MLP())),
    C("MODEL rebound to MLP(hidden=5)", lambda: A(t(3)),
      lambda: patch_global("MODEL", MLP(hidden=5))),
    covers=("TENSOR_MATCH", "ID_MATCH", "NN_MODULE"),
)
def module_global(x):
    return MODEL(x)


@probe(
    C("example", lambda: A(t(3))),
    C("as compiled", lambda: A(t(3))),
    C("MODEL rebound to another MLP", lambda: A(t(3)), lambda: patch_global("MODEL", MLP())),
    covers=("NN_MODULE",),
    config={"inline_inbuilt_nn_modules": False},
)
def module_global_not_inlined(x):
    return MODEL(x)


# ---------------------------------------------------------------------------
# Globals, builtins, torch functions
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(t(3))),
    C("K unchanged", lambda: A(t(3))),
    C("K = 4", lambda: A(t(3)), lambda: patch_global("K", 4)),
    C("K = 3.0", lambda: A(t(3)), lambda: patch_global("K", 3.0)),
    covers=("CONSTANT_MATCH", "EQUALS_MATCH"),
)
def global_int(x):
    return x * K


@probe(
    C("example", lambda: A(t(3))),
    C("W unchanged", lambda: A(t(3))),
    C("W rebound, same shape", lambda: A(t(3)), lambda: patch_global("W", torch.zeros(3))),
    C("W rebound, other shape", lambda: A(t(3)), lambda: patch_global("W", torch.zeros(1))),
    C("W rebound, float64", lambda: A(t(3)),
      lambda: patch_global("W", torch.zeros(3, dtype=torch.float64))),
    covers=("TENSOR_MATCH",),
)
def global_tensor(x):
    return x + W


@probe(
    C("example", lambda: A(t(3))),
    C("CFG unchanged", lambda: A(t(3))),
    C("CFG['scale'] = 5", lambda: A(t(3)), lambda: patch_global("CFG", {"scale": 5, "mode": "add"})),
    C("CFG['mode'] = 'sub'", lambda: A(t(3)),
      lambda: patch_global("CFG", {"scale": 2, "mode": "sub"})),
    covers=("DICT_KEYS_MATCH", "EQUALS_MATCH", "TYPE_MATCH"),
)
def global_dict(x):
    if CFG["mode"] == "add":
        return x * CFG["scale"]
    return x


@probe(
    C("example", lambda: A(t(3))),
    C("CONF unchanged", lambda: A(t(3))),
    C("CONF.scale = 4.0", lambda: A(t(3)), lambda: unittest.mock.patch.object(CONF, "scale", 4.0)),
    C("CONF rebound to an equal Box", lambda: A(t(3)),
      lambda: patch_global("CONF", Box(scale=3.0, offset=2))),
    covers=("TYPE_MATCH", "EQUALS_MATCH"),
)
def global_object(x):
    return x * CONF.scale + CONF.offset


@probe(
    C("example", lambda: A(t(3))),
    C("OPT is None", lambda: A(t(3))),
    C("OPT = tensor", lambda: A(t(3)), lambda: patch_global("OPT", torch.ones(3))),
    covers=("ID_MATCH", "CONSTANT_MATCH"),
)
def global_none(x):
    if OPT is None:
        return x * 2
    return x + OPT


@probe(
    C("example", lambda: A(t(3))),
    C("helper unchanged", lambda: A(t(3))),
    C("helper rebound", lambda: A(t(3)), lambda: patch_global("helper", other_helper)),
    C("helper default changed", lambda: A(t(3)), lambda: unittest.mock.patch.object(helper, "__defaults__", (5,))),
    covers=("FUNCTION_MATCH", "ID_MATCH", "CONSTANT_MATCH"),
)
def global_function(x):
    return helper(x)


@probe(
    C("example", lambda: A(t(3))),
    C("SCALE_FN unchanged", lambda: A(t(3))),
    C("SCALE_FN rebound", lambda: A(t(3)), lambda: patch_global("SCALE_FN", lambda x: x * 3)),
    covers=("FUNCTION_MATCH", "ID_MATCH"),
)
def global_lambda(x):
    return SCALE_FN(x)


@probe(
    C("example", lambda: A(t(3))),
    C("PARTIAL unchanged", lambda: A(t(3))),
    C("PARTIAL rebound, other k", lambda: A(t(3)),
      lambda: patch_global("PARTIAL", functools.partial(helper, k=6))),
    covers=("TYPE_MATCH", "FUNCTION_MATCH", "EQUALS_MATCH"),
)
def global_partial(x):
    return PARTIAL(x)


@probe(
    C("example", lambda: A(t(3))),
    C("unchanged", lambda: A(t(3))),
    C("math.pi patched", lambda: A(t(3)), lambda: unittest.mock.patch.object(math, "pi", 3.0)),
    covers=("ID_MATCH", "PYMODULE_MATCH", "EQUALS_MATCH"),
)
def global_module_constant(x):
    return x * math.pi


@probe(
    C("example", lambda: A(t(3))),
    C("unchanged", lambda: A(t(3))),
    C("x float64", lambda: A(t(3, dtype=torch.float64))),
    covers=("ID_MATCH", "FUNCTION_MATCH"),
)
def torch_function(x):
    return torch.sin(x) + torch.cos(x)


@probe(
    C("example", lambda: A(t(3))),
    C("unchanged", lambda: A(t(3))),
    C("x 2-d", lambda: A(t(1, 3))),
    covers=("ID_MATCH", "FUNCTION_MATCH"),
)
def torch_functional(x):
    return F.relu(x) + F.gelu(x)


@probe(
    C("example", lambda: A(t(3))),
    C("unchanged", lambda: A(t(3))),
    C("x int64", lambda: A(t(3, dtype=torch.int64))),
    covers=("ID_MATCH",),
)
def torch_ops_overload(x):
    return torch.ops.aten.add.Tensor(x, x)


@probe(
    C("example", lambda: A([t(3), t(3), t(3)])),
    C("3 tensors", lambda: A([t(3), t(3), t(3)])),
    C("2 tensors", lambda: A([t(3), t(3)])),
    C("sum shadowed in module", lambda: A([t(3), t(3), t(3)]),
      lambda: patch_global("sum", lambda xs: xs[0])),
    covers=("BUILTIN_MATCH", "SEQUENCE_LENGTH"),
)
def builtin_sum(xs):
    return sum(xs)


@probe(
    C("example", lambda: A([t(3), t(3)])),
    C("2 tensors", lambda: A([t(3), t(3)])),
    C("3 tensors", lambda: A([t(3), t(3), t(3)])),
    covers=("BUILTIN_MATCH", "SEQUENCE_LENGTH"),
)
def builtin_len_range(xs):
    out = xs[0]
    for i in range(len(xs)):
        out = out + xs[i]
    return out


@probe(
    C("example", lambda: A(t(3), 2, 5)),
    C("max is 5", lambda: A(t(3), 2, 5)),
    C("max is 6", lambda: A(t(3), 6, 5)),
    covers=("BUILTIN_MATCH", "EQUALS_MATCH"),
)
def builtin_max_abs(x, a, b):
    return x * max(a, b) + abs(a - b)


@probe(
    C("example", lambda: A(t(3), 4)),
    C("int", lambda: A(t(3), 4)),
    C("float", lambda: A(t(3), 4.0)),
    covers=("BUILTIN_MATCH", "TYPE_MATCH"),
)
def builtin_isinstance(x, y):
    if isinstance(y, int):
        return x + 1
    return x - 1


# ---------------------------------------------------------------------------
# Global state
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(t(3))),
    C("grad enabled", lambda: A(t(3))),
    C("no_grad", lambda: A(t(3)), no_grad),
    C("inference_mode", lambda: A(t(3)), lambda: torch.inference_mode()),
    C("deterministic algorithms", lambda: A(t(3)), deterministic_algorithms),
    C("default dtype float64", lambda: A(t(3)), lambda: default_dtype(torch.float64)),
    C("autocast cpu", lambda: A(t(3)), lambda: torch.autocast("cpu")),
    C("1 thread", lambda: A(t(3)), lambda: num_threads(1)),
    C("torch function disabled", lambda: A(t(3)),
      lambda: torch._C.DisableTorchFunctionSubclass()),
    C("default device meta", lambda: A(t(3)), lambda: torch.device("meta")),
    C("inside a vmap layer", lambda: A(t(3)), vmap_level),
    covers=("GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "DEFAULT_DEVICE", "TORCH_FUNCTION_STATE"),
)
def global_state_default(x):
    return x * 2


@probe(
    C("example", lambda: A(t(3)), no_grad),
    C("no_grad", lambda: A(t(3)), no_grad),
    C("grad enabled", lambda: A(t(3))),
    covers=("GRAD_MODE",),
    compile_context=no_grad,
)
def compiled_under_no_grad(x):
    return x * 2


@probe(
    C("example", lambda: A(t(3))),
    C("enabled", lambda: A(t(3))),
    C("no_grad", lambda: A(t(3)), no_grad),
    covers=("GRAD_MODE",),
)
def is_grad_enabled_branch(x):
    if torch.is_grad_enabled():
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(t(3))),
    C("off", lambda: A(t(3))),
    C("on", lambda: A(t(3)), deterministic_algorithms),
    covers=("DETERMINISTIC_ALGORITHMS",),
)
def deterministic_branch(x):
    if torch.are_deterministic_algorithms_enabled():
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(t(3))),
    C("float32", lambda: A(t(3))),
    C("float64", lambda: A(t(3)), lambda: default_dtype(torch.float64)),
    covers=("TENSOR_MATCH",),
)
def default_dtype_factory(x):
    return torch.ones(3) + x


@probe(
    C("example", lambda: A(t(3)), lambda: torch.device("cpu")),
    C("inside torch.device('cpu')", lambda: A(t(3)), lambda: torch.device("cpu")),
    C("no device context", lambda: A(t(3))),
    C("inside torch.device('meta')", lambda: A(t(3)), lambda: torch.device("meta")),
    covers=("DEFAULT_DEVICE",),
    compile_context=lambda: torch.device("cpu"),
)
def compiled_under_default_device(x):
    return torch.zeros(3) + x


@probe(
    C("example", lambda: A(t(3))),
    C("enabled", lambda: A(t(3))),
    C("subclass torch function disabled", lambda: A(t(3)),
      lambda: torch._C.DisableTorchFunctionSubclass()),
    covers=("TORCH_FUNCTION_STATE",),
)
def torch_function_state_branch(x):
    if torch._C._is_torch_function_enabled():
        return x + 1
    return x - 1


@probe(
    C("example", lambda: A(t(3)), PassthroughMode),
    C("inside PassthroughMode", lambda: A(t(3)), PassthroughMode),
    C("no mode", lambda: A(t(3))),
    covers=("TORCH_FUNCTION_STATE",),
    compile_context=PassthroughMode,
)
def compiled_under_function_mode(x):
    return x * 2


@probe(
    C("example", lambda: A(t(2, 3))),
    C("no functorch layer", lambda: A(t(2, 3))),
    C("inside a vmap layer", lambda: A(t(2, 3)), vmap_level),
    C("3x3", lambda: A(t(3, 3))),
    covers=("FUNCTORCH_STACK_MATCH",),
)
def vmap_inside(x):
    return torch.vmap(row_sum)(x)


def batched_at_level_1(*shape: int) -> torch.Tensor:
    """What a frame running inside the vmap of ``vmap_level`` (level 1) sees: a
    BatchedTensor over a batch of 2 (made without randomness, which that vmap
    layer refuses)."""
    return torch._C._functorch._add_batch_dim(torch.ones(2, *shape), 0, 1)


@probe(
    C("example", lambda: A(batched_at_level_1(3)), vmap_level),
    C("same shape", lambda: A(batched_at_level_1(3)), vmap_level),
    C("other shape", lambda: A(batched_at_level_1(4)), vmap_level),
    C("not batched", lambda: A(torch.ones(3)), vmap_level),
    C("outside the layer", lambda: A(batched_at_level_1(3))),
    covers=("TENSOR_MATCH", "FUNCTORCH_STACK_MATCH"),
    compile_context=vmap_level,
)
def compiled_inside_vmap(x):
    return x.sum() * 2


@probe(
    C("example", lambda: A(t(3), torch._C._dispatch_keys(t(3)))),
    C("keys of a cpu tensor", lambda: A(t(3), torch._C._dispatch_keys(t(3)))),
    C("keys of a meta tensor", lambda: A(t(3), torch._C._dispatch_keys(torch.empty(3, device="meta")))),
    covers=("DISPATCH_KEY_SET_MATCH",),
)
def dispatch_key_set_arg(x, ks):
    if ks.has(torch._C.DispatchKey.CPU):
        return x + 1
    return x - 1


# ---------------------------------------------------------------------------
# Dynamic shapes
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(dyn(t(4, 3), 0))),
    C("(5, 3)", lambda: A(t(5, 3))),
    C("(64, 3)", lambda: A(t(64, 3))),
    C("(1, 3): 0/1 specialization", lambda: A(t(1, 3))),
    C("(4, 4): static dim changed", lambda: A(t(4, 4))),
    C("1-d", lambda: A(t(4))),
    covers=("SHAPE_ENV", "TENSOR_MATCH"),
)
def dynamic_dim0(x):
    return x * 2


@probe(
    C("example", lambda: A(dyn(t(6), 0))),
    C("(8,)", lambda: A(t(8))),
    C("(5,)", lambda: A(t(5))),
    C("(3,)", lambda: A(t(3))),
    C("(4,)", lambda: A(t(4))),
    covers=("SHAPE_ENV",),
)
def dynamic_branch_on_size(x):
    if x.shape[0] > 4:
        return x[: x.shape[0] // 2] * 2
    return x


@probe(
    C("example", lambda: A(dyn(t(4), 0), dyn(t(4), 0))),
    C("equal sizes", lambda: A(t(7), t(7))),
    C("unequal sizes", lambda: A(t(7), t(5))),
    covers=("SHAPE_ENV",),
)
def dynamic_two_tensors(x, y):
    return x + y


@probe(
    C("example", lambda: A(t(3), 5)),
    C("n=5", lambda: A(t(3), 5)),
    C("n=9", lambda: A(t(3), 9)),
    C("n=1", lambda: A(t(3), 1)),
    C("n=5.0", lambda: A(t(3), 5.0)),
    covers=("SHAPE_ENV", "TYPE_MATCH"),
    config={"assume_static_by_default": False},
)
def dynamic_int(x, n):
    return x * n


@probe(
    C("example", lambda: A(dyn(t(4, 6), 0, 1))),
    C("(8, 12)", lambda: A(t(8, 12))),
    C("(8, 9)", lambda: A(t(8, 9))),
    C("(2, 6)", lambda: A(t(2, 6))),
    covers=("SHAPE_ENV",),
)
def dynamic_reshape(x):
    return x.reshape(x.shape[0] * 2, x.shape[1] // 2)


# ---------------------------------------------------------------------------
# What cannot be saved everywhere: refusals and identity by name
# ---------------------------------------------------------------------------


@probe(
    C("example", lambda: A(make_adder(1), t(3))),
    C("another closure of the same code", lambda: A(make_adder(1), t(3))),
    C("closure over another value", lambda: A(make_adder(2), t(3))),
    C("module-level function", lambda: A(helper, t(3))),
    covers=("CLOSURE_MATCH",),
    expect_refusal=True,
)
def closure_arg(fn, x):
    return fn(x)


@probe(
    C("example", lambda: A(t(3))),
    C("unchanged", lambda: A(t(3))),
    C("GLOBAL_ADDER rebound", lambda: A(t(3)), lambda: patch_global("GLOBAL_ADDER", make_adder(7))),
    covers=("CLOSURE_MATCH", "FUNCTION_MATCH"),
)
def global_closure(x):
    return GLOBAL_ADDER(x)


def keeps_signature(fn):
    """A functools.wraps decorator: the module-level name is bound to the
    wrapper, the decorated function lives on in its closure (and __wrapped__)."""

    @functools.wraps(fn)
    def wrapper(x):
        return fn(x)

    return wrapper


@probe(
    C("example", lambda: A(t(3))),
    C("same shape", lambda: A(t(3))),
    C("other shape", lambda: A(t(4))),
    covers=("CLOSURE_MATCH", "FUNCTION_MATCH"),
)
@keeps_signature
def wrapped_by_decorator(x):
    return x * 3


@probe(
    C("example", lambda: A(make_local_object(), t(3))),
    C("another instance of the local class", lambda: A(make_local_object(), t(3))),
    C("Box with the same attrs", lambda: A(Box(scale=2), t(3))),
    covers=("TYPE_MATCH",),
    expect_refusal=True,
)
def local_class_object(o, x):
    return x * o.scale


@probe(
    C("example", lambda: A(make_local_module(), t(3))),
    C("another instance of the local module class", lambda: A(make_local_module(), t(3))),
    C("hidden 5 (other parameter shapes)", lambda: A(make_local_module(hidden=5), t(3))),
    C("forward shadowed on the instance", lambda: A(shadowed_forward(make_local_module()), t(3))),
    C("x float64", lambda: A(make_local_module(), t(3, dtype=torch.float64))),
    C("module-level MLP", lambda: A(MLP(), t(3))),
    covers=("TYPE_MATCH",),
    expect_refusal=True,
)
def local_module_call(m, x):
    return m(x)


@probe(
    C("example", lambda: A(make_local_module(), t(3))),
    C("another instance of the local module class", lambda: A(make_local_module(), t(3))),
    C("hidden 5 (other parameter shapes)", lambda: A(make_local_module(hidden=5), t(3))),
    C("forward shadowed on the instance", lambda: A(shadowed_forward(make_local_module()), t(3))),
    C("x float64", lambda: A(make_local_module(), t(3, dtype=torch.float64))),
    C("x of 4 features", lambda: A(make_local_module(), t(4))),
    covers=("NOT_PRESENT_IN_GENERIC_DICT", "EMPTY_NN_MODULE_HOOKS_DICT", "TENSOR_MATCH"),
    keep_guard=not_on_local_class_identity,
)
def local_module_call_filtered(m, x):
    return m(x)


@probe(
    C("example", lambda: A(make_local_config(), t(3))),
    C("another instance of the local class", lambda: A(make_local_config(), t(3))),
    C("scale 3", lambda: A(make_local_config(scale=3), t(3))),
    C("an object without offset", lambda: A(types.SimpleNamespace(scale=2), t(3))),
    C("Box with the same attributes (its class is not guarded)", lambda: A(Box(scale=2), t(3))),
    covers=("HASATTR", "CONSTANT_MATCH"),
    keep_guard=not_on_local_class_identity,
)
def local_object_attrs_filtered(o, x):
    return x * o.scale + (o.offset if hasattr(o, "offset") else 0)


def _two_tensor(*shape, dtype=torch.float32, requires_grad=False):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(
        t(*shape, dtype=dtype, requires_grad=requires_grad),
        t(*shape, dtype=dtype, requires_grad=requires_grad),
    )


@probe(
    C("example", lambda: A(_two_tensor(3))),
    C("TwoTensor", lambda: A(_two_tensor(3))),
    C("plain tensor", lambda: A(t(3))),
    C("TwoTensor of 4", lambda: A(_two_tensor(4))),
    C("TwoTensor float64", lambda: A(_two_tensor(3, dtype=torch.float64))),
    C("TwoTensor requires_grad", lambda: A(_two_tensor(3, requires_grad=True))),
    C("TwoTensor 2-d", lambda: A(_two_tensor(1, 3))),
    C("another subclass", lambda: A(_extra_metadata_tensor(3))),
    covers=("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
)
def tensor_subclass(x):
    return x * 2


def _extra_metadata_tensor(*shape, constant=4):
    from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor

    out = ConstantExtraMetadataTensor(t(*shape))
    out.constant_attribute = constant
    return out


@probe(
    C("example", lambda: A(_extra_metadata_tensor(3))),
    C("same metadata", lambda: A(_extra_metadata_tensor(3))),
    C("other metadata (constant 5)", lambda: A(_extra_metadata_tensor(3, constant=5))),
    C("other size", lambda: A(_extra_metadata_tensor(4))),
    C("plain tensor", lambda: A(t(3))),
    covers=("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
)
def tensor_subclass_metadata(x):
    return x + 1


def _local_two_tensor(*shape):
    from torch.testing._internal.two_tensor import TwoTensor

    class LocalTwoTensor(TwoTensor):
        pass

    return LocalTwoTensor(t(*shape), t(*shape))


@probe(
    C("example", lambda: A(_local_two_tensor(3))),
    C("another local subclass instance", lambda: A(_local_two_tensor(3))),
    C("TwoTensor", lambda: A(_two_tensor(3))),
    covers=("TENSOR_MATCH", "TENSOR_SUBCLASS_METADATA_MATCH"),
    expect_refusal=True,
)
def tensor_subclass_defined_locally(x):
    return x * 2


def double(x):
    return x * 2


def _sgd_with_grads():
    params = [nn.Parameter(t(3)), nn.Parameter(t(3))]
    for p in params:
        p.grad = torch.ones_like(p)
    return torch.optim.SGD(params, lr=0.1)


@probe(
    C("example", lambda: A(_sgd_with_grads())),
    C("another SGD with grads", lambda: A(_sgd_with_grads())),
    covers=("NOT_NONE_MATCH", "WEAKREF_ALIVE", "ID_MATCH"),
    expect_refusal=True,
)
def optimizer_step(opt):
    opt.step()


@probe(
    C("example", lambda: A(t(3), t(3))),
    C("same shapes", lambda: A(t(3), t(3))),
    C("inside an outer dual level", lambda: A(t(3), t(3)), lambda: torch.autograd.forward_ad.dual_level()),
    C("tangent float64", lambda: A(t(3), t(3, dtype=torch.float64))),
    covers=("DUAL_LEVEL",),
)
def forward_ad_dual(x, tangent):
    with torch.autograd.forward_ad.dual_level():
        dual = torch.autograd.forward_ad.make_dual(x, tangent)
        return torch.autograd.forward_ad.unpack_dual(dual * 2).tangent


@probe(
    C("example", lambda: A(t(3))),
    C("unchanged", lambda: A(t(3))),
    C("x float64", lambda: A(t(3, dtype=torch.float64))),
    covers=("TYPE_MATCH", "NAME_MATCH", "FUNCTION_MATCH"),
)
def hop_wrap(x):
    return torch._higher_order_ops.wrap.wrap(double, x)
