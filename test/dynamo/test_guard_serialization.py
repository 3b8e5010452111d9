# Owner(s): ["module: dynamo"]
"""Guard serialization: every guard type of torch 2.7.1 saved and loaded, or refused.

Protocol: keep one guard type with guard_filter_fn, run InstructionTranslator
directly on an example function to get the OutputGraph and the reference
CheckFunctionManager (save_guards=True), rebuild a guard manager from its
``guards_state`` with torch._dynamo.package.load_guard_manager(load_guards_state(
guards_state), code, f_globals), then throw accepted and rejected inputs at both
and require equal decisions. Building, saving and loading, in this process or in
fresh ones, is guard_round_trip.py's, the harness the behaviour diff's probe
runner shares; every load goes through the restricted unpickler. The seed's
spelling (guards_serialization_mode="save" / "load") is an alias of the same:
TestGuardSerializationSpellings proves the two agree.
"""

import collections
import contextlib
import dataclasses
import enum
import fractions
import functools
import itertools
import math
import os
import pickle
import sys
import tempfile
import threading
import types
import unittest.mock

import torch
import torch._dynamo
import torch._dynamo.test_case
import torch.autograd.forward_ad as fwAD
import torch.utils._pytree as pytree
from torch._dynamo.exc import PackageError
from torch._dynamo.guard_serialization import guard_type_name, LocalScopeTypeError
from torch._dynamo.guards import CheckFunctionManager, GuardBuilder
from torch._dynamo.package import load_guard_manager, load_guards_state
from torch._dynamo.source import AttrSource, GlobalStateSource, LocalSource
from torch._guards import Guard
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.custom_tensor import ConstantExtraMetadataTensor
from torch.testing._internal.two_tensor import TwoTensor

from guard_round_trip import (
    build_check_fn_manager,
    load_built,
    save_and_load_in_fresh_processes,
)


# Module-level objects the example functions use: stable names across processes.
SCALE = 3
FLAG = True


class Foo:
    def __init__(self, a=1):
        self.a = a


class Bar:
    def __init__(self, a=1):
        self.a = a


class WithB:
    b = 2


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x):
        return self.lin(x)


MODEL = Small()


def plus_one(x):
    return x + 1


def minus_one(x):
    return x - 1


def uses_global_scale(x):
    return x * SCALE


def uses_global_class(x, o):
    return x + (1 if isinstance(o, Foo) else 2)


def uses_global_model(x):
    return MODEL(x)


def uses_builtins(x, n):
    return x * sum(range(n))


SCALE_FN = lambda x: x * 2  # noqa: E731 - a function with no stable name


def uses_global_lambda(x):
    return SCALE_FN(x)


Point = collections.namedtuple("Point", ["x", "y"])


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b


class Color(enum.Enum):
    RED = 1
    BLUE = 2


def helper(x, k):
    return x * k


def counts_with(x, counter):
    return x + (1 if isinstance(counter, itertools.count) else 2)


def by_sdp_backend(x, backend):
    # torch.nn.attention.SDPBackend is a C++ (pybind11) enum, not an enum.Enum.
    if backend == torch.nn.attention.SDPBackend.MATH:
        return x + 1
    return x + 2


PARTIAL = functools.partial(helper, k=5)


def uses_global_partial(x):
    return PARTIAL(x)


def passes_through(fn):
    # A decorator: the function it wraps lives only in the wrapper's closure.
    @functools.wraps(fn)
    def wrapper(*args):
        return fn(*args)

    return wrapper


@passes_through
def tripled(x):
    return x * 3


@passes_through
def quadrupled(x):
    return x * 4


def uses_decorated_global(x):
    return tripled(x)


def keeps_signature(fn):
    # A functools.wraps decorator whose wrapper takes the wrapped function's
    # argument: compiling the wrapper guards on the function it closes over.
    @functools.wraps(fn)
    def wrapper(x):
        return fn(x)

    return wrapper


@keeps_signature
def halved(x):
    return x / 2


@keeps_signature
def doubled(x):
    return x * 2


class TaggedTensor(torch.Tensor):
    """A tensor subclass with no __tensor_flatten__ (torch function only)."""


def make_local_module(out_features=2):
    # Most tests and notebooks define their module class inside a function.
    class LocalModule(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, out_features)
            self.register_buffer("offset", torch.ones(out_features))

        def forward(self, x):
            return self.lin(x) + self.offset

    return LocalModule()


def make_local_object(scale=2):
    class LocalConfig:
        shift = 1

        def __init__(self):
            self.scale = scale

    return LocalConfig()


def calls_module(m, x):
    return m(x)


def counts_keys(x, keys):
    return x * len(keys)


def without_type_match(entries):
    """Every guard but the ones on a class's identity (TYPE_MATCH, ID_MATCH)."""
    return [e.guard_type not in ("TYPE_MATCH", "ID_MATCH") for e in entries]


def without_type_match_only(entries):
    return [e.guard_type != "TYPE_MATCH" for e in entries]


@contextlib.contextmanager
def patched_global(name, value):
    module = sys.modules[__name__]
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


class GuardSerializationTestCase(torch._dynamo.test_case.TestCase):
    def roundtrip(self, fn, args, guard_types, **kwargs):
        if isinstance(guard_types, str):
            guard_types = (guard_types,)
        built = build_check_fn_manager(fn, args, guard_types=guard_types, **kwargs)
        self.assertIsInstance(built.ref.guards_state, bytes)
        return built, load_built(built)

    def assert_same_decisions(self, built, loaded, accepted, rejected):
        """Every input of ``accepted`` passes both the reference manager
        (``built.ref``) and the ``loaded`` guard manager, of ``rejected`` neither.

        An input is a dict of frame locals, or a (context manager, locals) pair to
        decide under some global state.
        """
        self.assertTrue(accepted and rejected, "need accepted and rejected inputs")
        for expected, inputs in ((True, accepted), (False, rejected)):
            for item in inputs:
                ctx, f_locals = item if isinstance(item, tuple) else (
                    contextlib.nullcontext(),
                    item,
                )
                with ctx:
                    ref = built.ref.guard_manager.check(f_locals)
                    got = loaded.check(f_locals)
                self.assertEqual(ref, expected, f"reference decided {ref} on {f_locals}")
                self.assertEqual(got, ref, f"loaded decided {got}, reference {ref} on {f_locals}")


class TestGuardSerialization(GuardSerializationTestCase):
    def test_tensor_match(self):
        def fn(x):
            return x + 1

        x = torch.randn(3, 4)
        built, loaded = self.roundtrip(fn, (x,), "TENSOR_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.randn(3, 4)}, {"x": x}],
            rejected=[
                {"x": torch.randn(4, 3)},
                {"x": torch.randn(3, 4, dtype=torch.float64)},
                {"x": torch.randn(3, 4, requires_grad=True)},
                {"x": torch.randn(4, 3).t()},
                {"x": torch.nn.Parameter(torch.randn(3, 4))},
                {"x": 3},
            ],
        )

    def test_tensor_match_parameter_and_requires_grad(self):
        def fn(x):
            return x * 2

        p = torch.nn.Parameter(torch.randn(2))
        built, loaded = self.roundtrip(fn, (p,), "TENSOR_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.nn.Parameter(torch.randn(2))}],
            rejected=[{"x": torch.randn(2, requires_grad=True)}, {"x": torch.randn(2)}],
        )

    @parametrize("load_under_inference_mode", [False, True])
    def test_tensor_match_saved_under_inference_mode(self, load_under_inference_mode):
        # An inference tensor has no autograd dispatch keys, and inference mode
        # excludes them thread-locally: both are part of what the guard compares,
        # whatever mode is live while the guards are loaded.
        def fn(x):
            return x + 1

        with torch.inference_mode():
            built = build_check_fn_manager(fn, (torch.randn(3),), guard_types=("TENSOR_MATCH",))
            inference_tensor = torch.randn(3)
        with torch.inference_mode(load_under_inference_mode):
            loaded = load_built(built)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[(torch.inference_mode(), {"x": inference_tensor})],
            rejected=[
                (torch.inference_mode(), {"x": torch.randn(4)}),
                # a normal tensor keeps its ADInplaceOrView key in inference mode
                (torch.inference_mode(), {"x": torch.randn(3)}),
                {"x": torch.randn(3)},
            ],
        )

    def test_two_tensor_input_round_trips(self):
        # Every guard of a TwoTensor input: TENSOR_MATCH on it and its inner
        # tensors, TENSOR_SUBCLASS_METADATA_MATCH, the inner attribute names.
        def fn(x):
            return x * 2

        built = build_check_fn_manager(fn, (TwoTensor(torch.randn(3), torch.randn(3)),))
        loaded = load_built(built)

        def two(*shape, **kwargs):
            return TwoTensor(torch.randn(*shape, **kwargs), torch.randn(*shape, **kwargs))

        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": two(3)}],
            rejected=[
                {"x": torch.randn(3)},
                {"x": two(4)},
                {"x": two(3, dtype=torch.float64)},
                {"x": two(3, requires_grad=True)},
                {"x": ConstantExtraMetadataTensor(torch.randn(3))},
            ],
        )

    @parametrize("guard_type", ["TENSOR_SUBCLASS_METADATA_MATCH", "TENSOR_MATCH"])
    def test_tensor_subclass_metadata(self, guard_type):
        # ConstantExtraMetadataTensor's flatten context is an int attribute: the
        # loaded metadata guard compares it with the saved one.
        def fn(x):
            return x + 1

        def tensor(constant, *shape):
            out = ConstantExtraMetadataTensor(torch.randn(*shape))
            out.constant_attribute = constant
            return out

        built, loaded = self.roundtrip(fn, (tensor(4, 2),), guard_type)
        accepted = [{"x": tensor(4, 2)}]
        rejected = {
            "TENSOR_SUBCLASS_METADATA_MATCH": [{"x": tensor(5, 2)}],
            "TENSOR_MATCH": [{"x": tensor(4, 3)}, {"x": TwoTensor(torch.randn(2), torch.randn(2))}],
        }[guard_type]
        self.assert_same_decisions(built, loaded, accepted, rejected)

    def test_tensor_subclass_without_flatten(self):
        # A torch-function subclass (no __tensor_flatten__): its stand-in is a
        # plain one viewed as_subclass; the guards on its inherited
        # __torch_function__ name it through torch.Tensor.
        def fn(x):
            return x + 1

        def tagged(*shape):
            return torch.randn(*shape).as_subclass(TaggedTensor)

        with torch._dynamo.config.patch(traceable_tensor_subclasses={TaggedTensor}):
            built = build_check_fn_manager(fn, (tagged(3),))
            loaded = load_built(built)
            self.assert_same_decisions(
                built,
                loaded,
                accepted=[{"x": tagged(3)}],
                rejected=[
                    {"x": torch.randn(3)},
                    {"x": tagged(4)},
                    {"x": TwoTensor(torch.randn(3), torch.randn(3))},
                ],
            )

    @parametrize("guard_type", ["TENSOR_SUBCLASS_METADATA_MATCH", "TENSOR_MATCH", "TYPE_MATCH"])
    def test_tensor_subclass_defined_in_local_scope_is_refused(self, guard_type):
        class LocalTwoTensor(TwoTensor):
            pass

        def fn(x):
            return x * 2

        with self.assertRaises(LocalScopeTypeError) as ctx:
            build_check_fn_manager(
                fn,
                (LocalTwoTensor(torch.randn(2), torch.randn(2)),),
                guard_types=(guard_type,),
            )
        self.assertIsInstance(ctx.exception, TypeError)
        self.assertTrue(
            str(ctx.exception).startswith(
                f"{guard_type} guard cannot be serialized. Guarded source: L['x']. "
            ),
            str(ctx.exception),
        )
        self.assertIn("LocalTwoTensor", str(ctx.exception))

    def test_type_match(self):
        def fn(x, o):
            return x * o.a

        built, loaded = self.roundtrip(fn, (torch.ones(2), Foo()), "TYPE_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "o": Foo(5)}],
            rejected=[{"x": torch.ones(2), "o": Bar()}, {"x": torch.ones(2), "o": 1}],
        )

    def test_type_match_on_weakrefs_of_an_rnn(self):
        # With allow_rnn, Dynamo traces nn.LSTM and guards the weak references
        # in its _flat_weight_refs by type (weakref.ReferenceType).
        torch.manual_seed(0)
        lstm = torch.nn.LSTM(3, 2)
        x = torch.randn(4, 1, 3)
        with torch._dynamo.config.patch(allow_rnn=True):
            built, loaded = self.roundtrip(calls_module, (lstm, x), None)
        # the reference rejects this one only by the TYPE_MATCH on the refs
        strong_refs = torch.nn.LSTM(3, 2)
        strong_refs._flat_weight_refs = [lambda p=p: p for p in strong_refs._flat_weights]
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"m": lstm, "x": x}, {"m": torch.nn.LSTM(3, 2), "x": torch.randn(4, 1, 3)}],
            rejected=[{"m": strong_refs, "x": x}, {"m": torch.nn.LSTM(3, 5), "x": x}],
        )

    def test_hasattr(self):
        def fn(x, o):
            return x + (1 if hasattr(o, "b") else 2)

        built, loaded = self.roundtrip(fn, (torch.ones(2), Foo()), "HASATTR")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "o": Foo()}],
            rejected=[{"x": torch.ones(2), "o": WithB()}],
        )

    def test_not_present_in_generic_dict(self):
        def fn(m, x):
            return m(x)

        built, loaded = self.roundtrip(
            fn, (Small(), torch.ones(2)), "NOT_PRESENT_IN_GENERIC_DICT"
        )
        shadowed = Small()
        shadowed.forward = lambda x: x
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"m": Small(), "x": torch.ones(2)}],
            rejected=[{"m": shadowed, "x": torch.ones(2)}],
        )

    def test_dict_contains(self):
        def fn(x, d):
            return x * (2 if "a" in d else 3)

        built, loaded = self.roundtrip(fn, (torch.ones(2), {"a": 1}), "DICT_CONTAINS")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "d": {"a": 7, "z": 0}}],
            rejected=[{"x": torch.ones(2), "d": {"b": 1}}],
        )

    def test_dict_keys_match(self):
        def fn(x, d):
            out = x
            for k in d:
                out = out + d[k]
            return out

        built, loaded = self.roundtrip(
            fn, (torch.ones(2), {"a": 1, "b": 2}), "DICT_KEYS_MATCH"
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "d": {"a": 5, "b": 6}}],
            rejected=[
                {"x": torch.ones(2), "d": {"a": 5}},
                {"x": torch.ones(2), "d": {"a": 1, "c": 2}},
            ],
        )

    def test_dict_version_of_pytree_registry_saves_as_keys_match(self):
        def fn(x):
            return pytree.tree_map(lambda t: t + 1, [x])[0]

        # torch 2.7 guards the registry with DICT_KEYS_MATCH; 2.6 with
        # DICT_VERSION, which a load turns into a check of the registry's keys
        # (NOTE: [Loading the pytree registry's DICT_VERSION on 2.6], 2.6.0 series).
        registry_guard = (
            "DICT_KEYS_MATCH" if hasattr(GuardBuilder, "DICT_KEYS_MATCH") else "DICT_VERSION"
        )
        built, loaded = self.roundtrip(fn, (torch.ones(2),), registry_guard)

        class Registered:
            pass

        accepted = [{"x": torch.ones(2)}]
        rejected = [
            (
                _registered_pytree_node(Registered),
                {"x": torch.ones(2)},
            )
        ]
        self.assert_same_decisions(built, loaded, accepted, rejected)

    def test_dict_version_of_other_dicts_is_refused(self):
        def fn(x, d):
            return x * d["a"]

        with self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(
                fn,
                (torch.ones(2), {"a": 1}),
                extra_guards=[(LocalSource("d"), GuardBuilder.DICT_VERSION)],
            )
        self.assertTrue(
            str(ctx.exception).startswith(
                "DICT_VERSION guard cannot be serialized. Guarded source: L['d']. "
            ),
            str(ctx.exception),
        )

    def test_id_match_on_module_level_class(self):
        built, loaded = self.roundtrip(
            uses_global_class, (torch.ones(2), Foo()), "ID_MATCH"
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "o": Foo()}],
            rejected=[(patched_global("Foo", Bar), {"x": torch.ones(2), "o": Foo()})],
        )

    def test_id_match_on_class_defined_in_a_function_is_refused(self):
        class Local:
            pass

        def fn(x, o):
            return x + (1 if isinstance(o, Local) else 2)

        # Upstream raises a TypeError here; ours is also a PackageError.
        with self.assertRaises(LocalScopeTypeError) as ctx:
            build_check_fn_manager(fn, (torch.ones(2), Local()), guard_types=("ID_MATCH",))
        self.assertIsInstance(ctx.exception, TypeError)
        self.assertIsInstance(ctx.exception, PackageError)
        message = str(ctx.exception)
        self.assertTrue(message.startswith("ID_MATCH guard cannot be serialized. "), message)
        # upstream's sentence, for code that matches it
        self.assertIn(
            "Local'> cannot be saved into torch.compile() package since it's defined "
            "in local scope. Please define the class at global scope (top level of a "
            "module)",
            message,
        )

    def test_id_match_on_static_address_tensor_is_refused_naming_why(self):
        # Traced without a package (a compile for one takes the tensor as an
        # input: NOTE: [Static addresses under a compile package]), the tensor
        # is a graph attribute under an identity guard no process can replay.
        cache = torch.zeros(4)
        torch._dynamo.mark_static_address(cache)

        def fn(x, cache):
            return x + cache

        with self.assertRaisesRegex(PackageError, "^ID_MATCH guard cannot be serialized") as ctx:
            build_check_fn_manager(fn, (torch.ones(4), cache), guard_types=("ID_MATCH",))
        self.assertIn("mark_static_address(t, guard=False)", str(ctx.exception))

    def test_id_match_on_local_class_whose_instance_is_also_guarded(self):
        # The instance is saved (its class rebuilt), the class's identity is not.
        class Local:
            scale = 2

        def fn(x, o):
            return x * (o.scale if isinstance(o, Local) else 1)

        with self.assertRaises(LocalScopeTypeError) as ctx:
            build_check_fn_manager(
                fn, (torch.ones(2), Local()), guard_filter_fn=without_type_match_only
            )
        self.assertTrue(
            str(ctx.exception).startswith(
                "ID_MATCH guard cannot be serialized. Guarded source: L['Local']. "
            ),
            str(ctx.exception),
        )

    def test_id_match_on_none_and_bool(self):
        def fn(x, flag, nothing):
            return x * 2 if flag and nothing is None else x

        built, loaded = self.roundtrip(
            fn, (torch.ones(2), True, None), ("CONSTANT_MATCH", "ID_MATCH")
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "flag": True, "nothing": None}],
            rejected=[
                {"x": torch.ones(2), "flag": False, "nothing": None},
                {"x": torch.ones(2), "flag": True, "nothing": 0},
            ],
        )

    def test_not_none_match(self):
        def fn(x):
            return x + 1

        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2),),
            "NOT_NONE_MATCH",
            extra_guards=[(LocalSource("x"), GuardBuilder.NOT_NONE_MATCH)],
        )
        self.assert_same_decisions(
            built, loaded, accepted=[{"x": torch.ones(3)}], rejected=[{"x": None}]
        )

    def test_dispatch_key_set_match(self):
        def fn(x, ks):
            return x + 1

        ks = torch._C._dispatch_keys(torch.ones(2))
        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2), ks),
            "DISPATCH_KEY_SET_MATCH",
            extra_guards=[(LocalSource("ks"), GuardBuilder.DISPATCH_KEY_SET_MATCH)],
        )
        other = torch._C._dispatch_keys(torch.ones(2, requires_grad=True).to_sparse())
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "ks": torch._C._dispatch_keys(torch.zeros(5))}],
            rejected=[{"x": torch.ones(2), "ks": other}],
        )

    def test_name_match(self):
        def fn(x, f):
            return x + 1

        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2), plus_one),
            "NAME_MATCH",
            extra_guards=[(LocalSource("f"), GuardBuilder.NAME_MATCH)],
        )
        renamed = types.FunctionType(minus_one.__code__, globals(), "plus_one")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "f": renamed}],
            rejected=[{"x": torch.ones(2), "f": minus_one}],
        )

    @parametrize(
        "guard_type",
        ["DATA_PTR_MATCH", "WEAKREF_ALIVE", "OBJECT_MUTATION"],
    )
    def test_unsupported_guard_types_are_refused(self, guard_type):
        def fn(x):
            return x + 1

        self.assertIn(guard_type, CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES)
        with self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(
                fn,
                (torch.ones(2),),
                extra_guards=[(LocalSource("x"), getattr(GuardBuilder, guard_type))],
            )
        self.assertTrue(
            str(ctx.exception).startswith(
                f"{guard_type} guard cannot be serialized. Guarded source: L['x']. "
            ),
            str(ctx.exception),
        )

    def test_refusal_message(self):
        def fn(x):
            return x + 1

        with self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(
                fn,
                (torch.ones(2),),
                extra_guards=[(LocalSource("x"), GuardBuilder.DATA_PTR_MATCH)],
            )
        self.assertExpectedInline(
            str(ctx.exception),
            """DATA_PTR_MATCH guard cannot be serialized. Guarded source: L['x']. It guards on a tensor's memory address, which has no meaning in another process; pass the tensor as an input instead of capturing it.""",
        )

    @parametrize(
        "case",
        ["local_closure", "unpicklable_value", "cpp_shape_guards", "local_class_identity"],
    )
    def test_every_refusal_begins_with_upstream_sentence(self, case):
        # Upstream's first sentence, then the guarded source and our reason.
        offset = 2

        def local_closure(x):
            return x + offset

        class Local:
            pass

        x = torch.ones(5, 2)
        torch._dynamo.mark_dynamic(x, 0)
        fn, args, guard_type, source, kwargs, config = {
            "local_closure": (
                lambda x, f: f(x), (torch.ones(2), local_closure),
                "FUNCTION_MATCH", "L['f'].__code__", {}, {},
            ),
            "unpicklable_value": (
                lambda x, h: x + 1,
                (torch.ones(2), types.SimpleNamespace(it=(i for i in range(3)))),
                "TYPE_MATCH", "L['h'].it",
                {"extra_guards": [(AttrSource(LocalSource("h"), "it"), GuardBuilder.TYPE_MATCH)]},
                {},
            ),
            "cpp_shape_guards": (
                lambda x: x * x.shape[0], (x,), "SHAPE_ENV", None, {},
                {"enable_cpp_symbolic_shape_guards": True},
            ),
            "local_class_identity": (
                lambda x, o: x + (1 if isinstance(o, Local) else 2), (torch.ones(2), Local()),
                "ID_MATCH", "L['Local']", {"guard_types": ("ID_MATCH",)}, {},
            ),
        }[case]
        with torch._dynamo.config.patch(config), self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(fn, args, **kwargs)
        message = str(ctx.exception)
        self.assertTrue(message.startswith(f"{guard_type} guard cannot be serialized. "), message)
        if source is not None:
            self.assertIn(f" Guarded source: {source}. ", message)

    def test_dual_level(self):
        def fn(x):
            return x + 1

        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2),),
            "DUAL_LEVEL",
            extra_guards=[(GlobalStateSource(), GuardBuilder.DUAL_LEVEL)],
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(fwAD.dual_level(), {"x": torch.ones(2)})],
        )

    def test_functorch_stack_match_without_layers(self):
        def fn(x):
            return x + 1

        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2),),
            "FUNCTORCH_STACK_MATCH",
            extra_guards=[(GlobalStateSource(), GuardBuilder.FUNCTORCH_STACK_MATCH)],
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(_inside_vmap(), {"x": torch.ones(2)})],
        )

    @parametrize("value,other", [(2.5, 3.0), ("mean", "sum"), ((1, 2), (1, 3))])
    def test_constant_and_equals_match(self, value, other):
        def fn(x, c):
            return x * len(str(c))

        built, loaded = self.roundtrip(
            fn, (torch.ones(2), value), ("CONSTANT_MATCH", "EQUALS_MATCH")
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "c": value}],
            rejected=[{"x": torch.ones(2), "c": other}],
        )

    def test_equals_match_on_global(self):
        built, loaded = self.roundtrip(uses_global_scale, (torch.ones(2),), "CONSTANT_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(patched_global("SCALE", 4), {"x": torch.ones(2)})],
        )

    def test_saved_value_not_current_value_decides(self):
        # The global changed between compile (save) and load: the loaded guards
        # must compare against the saved value, like the reference.
        with patched_global("SCALE", 7):
            built = build_check_fn_manager(
                uses_global_scale, (torch.ones(2),), guard_types=("CONSTANT_MATCH",)
            )
        loaded = load_built(built)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[(patched_global("SCALE", 7), {"x": torch.ones(2)})],
            rejected=[{"x": torch.ones(2)}],
        )

    def test_type_match_on_class_defined_in_a_function_is_refused(self):
        def fn(x, o):
            return x * o.scale

        with self.assertRaises(TypeError) as ctx:
            build_check_fn_manager(fn, (torch.ones(2), make_local_object()))
        self.assertIsInstance(ctx.exception, PackageError)
        self.assertExpectedInline(
            str(ctx.exception).replace(__name__, "<test module>"),
            """TYPE_MATCH guard cannot be serialized. Guarded source: L['o']. Type <class '<test module>.make_local_object.<locals>.LocalConfig'> cannot be saved into torch.compile() package since it's defined in local scope. Please define the class at global scope (top level of a module): a class defined at module scope is found again by its name.""",
        )

    @parametrize(
        "guard_type",
        [
            "HASATTR",
            "CONSTANT_MATCH",
            "NOT_PRESENT_IN_GENERIC_DICT",
            "EMPTY_NN_MODULE_HOOKS_DICT",
            "TENSOR_MATCH",
        ],
    )
    def test_guards_on_instances_of_a_class_defined_in_a_function(self, guard_type):
        # None of these guards compares the class itself: they save and load
        # although the class cannot be found by name.
        x = torch.ones(2)
        if guard_type in ("HASATTR", "CONSTANT_MATCH"):

            def fn(x, o):
                # `shift` is a class attribute of the local class, `scale` an
                # instance attribute, `b` absent.
                present = hasattr(o, "shift") and not hasattr(o, "b")
                return x * o.scale + (1 if present else 2)

            args = (x, make_local_object())
            accepted = [{"x": x, "o": make_local_object()}]
            rejected = {
                "HASATTR": [{"x": x, "o": Foo()}, {"x": x, "o": WithB()}],
                "CONSTANT_MATCH": [{"x": x, "o": make_local_object(scale=3)}],
            }[guard_type]
        else:
            fn = calls_module
            args = (make_local_module(), x)
            shadowed = make_local_module()
            shadowed.forward = lambda x: x
            hooked = make_local_module()
            hooked.register_forward_hook(lambda *a: None)
            accepted = [{"m": make_local_module(), "x": x}]
            rejected = {
                "NOT_PRESENT_IN_GENERIC_DICT": [{"m": shadowed, "x": x}],
                "EMPTY_NN_MODULE_HOOKS_DICT": [{"m": hooked, "x": x}],
                "TENSOR_MATCH": [
                    {"m": make_local_module(out_features=3), "x": x},
                    {"m": make_local_module(), "x": torch.ones(3)},
                ],
            }[guard_type]
        with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
            built, loaded = self.roundtrip(fn, args, guard_type)
            self.assert_same_decisions(built, loaded, accepted, rejected)

    @torch._dynamo.config.patch(skip_nnmodule_hook_guards=False)
    def test_module_defined_in_a_function_all_guards_but_its_type(self):
        built = build_check_fn_manager(
            calls_module,
            (make_local_module(), torch.ones(2)),
            guard_filter_fn=without_type_match,
        )
        loaded = load_built(built)
        hooked = make_local_module()
        hooked.register_forward_pre_hook(lambda *a: None)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"m": make_local_module(), "x": torch.ones(2)}],
            rejected=[
                {"m": make_local_module(out_features=3), "x": torch.ones(2)},
                {"m": hooked, "x": torch.ones(2)},
                {"m": make_local_module(), "x": torch.ones(2, dtype=torch.float64)},
            ],
        )

    def test_module_defined_in_a_function_cross_process(self):
        # The loading process has its own LocalModule class (another object
        # than the saving process's): the guards never compare classes.
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            torch._dynamo.config.skip_nnmodule_hook_guards = False
            save(
                t.build_check_fn_manager(
                    t.calls_module,
                    (t.make_local_module(), torch.ones(2)),
                    guard_filter_fn=t.without_type_match,
                )
            )
            """,
            """
            # (read again while the loaded guards are built)
            torch._dynamo.config.skip_nnmodule_hook_guards = False
            m = load(t.calls_module)
            hooked = t.make_local_module()
            hooked.register_forward_hook(lambda *a: None)
            report([
                m.check({"m": module, "x": x})
                for module, x in [
                    (t.make_local_module(), torch.ones(2)),
                    (t.make_local_module(out_features=3), torch.ones(2)),
                    (hooked, torch.ones(2)),
                    (t.make_local_module(), torch.ones(3)),
                ]
            ])
            """,
        )
        self.assertEqual(decisions, [True, False, False, False])

    @parametrize("kind", ["keys", "values", "items"])
    def test_dict_view_input(self, kind):
        def fn(x, view):
            return x * len(view)

        def view(d):
            return getattr(d, kind)()

        built = build_check_fn_manager(fn, (torch.ones(2), view({"a": 1, "b": 2})))
        loaded = load_built(built)
        rejected = [
            {"x": torch.ones(2), "view": {"a": 1, "b": 2}},
            {"x": torch.ones(2), "view": ["a", "b"]},
            {"x": torch.ones(3), "view": view({"a": 1, "b": 2})},
        ]
        if kind == "keys":
            # (torch 2.7.1 guards only the type of a values or items view)
            rejected.append({"x": torch.ones(2), "view": view({"a": 1})})
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "view": view({"a": 1, "b": 2})}],
            rejected=rejected,
        )

    def test_dict_keys_input_compared_by_value(self):
        # A keys view is guarded by equality with the saved keys (EQUALS_MATCH).
        def fn(x, keys):
            return x * list(keys)[0]  # noqa: RUF015 - the traced list() of a keys view

        built = build_check_fn_manager(fn, (torch.ones(2), {3: "a"}.keys()))
        loaded = load_built(built)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "keys": {3: "b"}.keys()}],
            rejected=[{"x": torch.ones(2), "keys": {4: "a"}.keys()}],
        )

    def test_dict_views_cross_process(self):
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            save(t.build_check_fn_manager(t.counts_keys, (torch.ones(2), {1: 0, 2: 0}.keys())))
            """,
            """
            m = load(t.counts_keys)
            report([
                m.check({"x": torch.ones(2), "keys": keys})
                for keys in [{1: 5, 2: 6}.keys(), {1: 0, 3: 0}.keys(), {1: 0}.keys(), {1: 0, 2: 0}.values()]
            ])
            """,
        )
        self.assertEqual(decisions, [True, False, False, False])

    def test_function_reached_through_wrapped(self):
        # Compiling a functools.wraps wrapper guards on the function it closes
        # over (FUNCTION_MATCH on L['fn'].__code__); that function's module-level
        # name is the wrapper's, so it is saved as halved.__wrapped__.
        built, loaded = self.roundtrip(halved, (torch.ones(2),), "CLOSURE_MATCH")
        self.assertIn(b"halved.__wrapped__.__code__", built.ref.guards_state)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "fn": halved.__wrapped__}],
            rejected=[{"x": torch.ones(2), "fn": doubled.__wrapped__}],
        )

    def test_function_reached_through_wrapped_cross_process(self):
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            save(t.build_check_fn_manager(t.halved, (torch.ones(2),)))
            """,
            """
            m = load(t.halved)
            report([
                m.check({"x": torch.ones(2), "fn": fn})
                for fn in (t.halved.__wrapped__, t.doubled.__wrapped__, t.halved)
            ])
            """,
        )
        self.assertEqual(decisions, [True, False, False])

    def test_two_tensor_cross_process(self):
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            from torch.testing._internal.two_tensor import TwoTensor
            save(t.build_check_fn_manager(t.plus_one, (TwoTensor(torch.randn(3), torch.randn(3)),)))
            """,
            """
            m = load(t.plus_one)
            from torch.testing._internal.two_tensor import TwoTensor
            report([
                m.check({"x": x})
                for x in [
                    TwoTensor(torch.randn(3), torch.randn(3)),
                    TwoTensor(torch.randn(4), torch.randn(4)),
                    torch.randn(3),
                ]
            ])
            """,
        )
        self.assertEqual(decisions, [True, False, False])

    def test_nn_module_by_stable_name(self):
        with torch._dynamo.config.patch(inline_inbuilt_nn_modules=False):
            built, loaded = self.roundtrip(uses_global_model, (torch.ones(2),), "NN_MODULE")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(patched_global("MODEL", Small()), {"x": torch.ones(2)})],
        )

    def test_guard_type_name_is_the_builder_method(self):
        # partials (a builder method with its arguments bound) are unwrapped
        source = LocalSource("x")
        for create_fn in (
            GuardBuilder.TYPE_MATCH,
            functools.partial(GuardBuilder.TYPE_MATCH),
            functools.partial(functools.partial(GuardBuilder.TYPE_MATCH)),
        ):
            self.assertEqual(guard_type_name(Guard(source, create_fn)), "TYPE_MATCH")

    def test_saved_guard_lists_round_trip_and_damage_is_refused(self):
        from torch._dynamo import guard_serialization

        def fn(x, y):
            return x * y + 1

        built = build_check_fn_manager(fn, (torch.ones(2), 3))
        guards = load_guards_state(built.ref.guards_state).output_graph.guards
        self.assertTrue(guards)
        sources, create_fns = guard_serialization._saved_guards(guards)
        rebuilt = guard_serialization._loaded_guards((sources, create_fns))
        self.assertEqual([g.name for g in rebuilt], [g.name for g in guards])
        self.assertEqual(
            [guard_serialization.guard_type_names(g) for g in rebuilt],
            [guard_serialization.guard_type_names(g) for g in guards],
        )
        for damaged in (
            (sources, create_fns[:-1]),
            (sources[:1] + [5] + sources[2:], create_fns),
            (sources, [None] * len(create_fns)),
            [sources, create_fns],
            {"sources": sources},
            (sources, create_fns, []),
        ):
            with self.assertRaises(PackageError, msg=repr(type(damaged))):
                guard_serialization._loaded_guards(damaged)

    def test_nn_module_local_instance_is_refused(self):
        def fn(m, x):
            return m(x)

        # (Whether Dynamo specializes a module also depends on when it was
        # created; install the guard explicitly.)
        with self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(
                fn,
                (Small(), torch.ones(2)),
                extra_guards=[(LocalSource("m"), GuardBuilder.NN_MODULE)],
            )
        self.assertTrue(
            str(ctx.exception).startswith(
                "NN_MODULE guard cannot be serialized. Guarded source: L['m']. "
            ),
            str(ctx.exception),
        )

    def test_function_match_on_module(self):
        def fn(x, m):
            return m.sin(x)

        built, loaded = self.roundtrip(fn, (torch.ones(2), torch), "FUNCTION_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "m": torch}],
            rejected=[{"x": torch.ones(2), "m": math}],
        )

    def test_function_match_on_torch_function(self):
        def fn(x):
            return torch.sin(x)

        built, loaded = self.roundtrip(fn, (torch.ones(2),), "FUNCTION_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(unittest.mock.patch.object(torch, "sin", torch.cos), {"x": torch.ones(2)})],
        )

    def test_closure_match_on_module_level_function(self):
        def fn(x, f):
            return f(x)

        built, loaded = self.roundtrip(fn, (torch.ones(2), plus_one), "CLOSURE_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "f": plus_one}],
            rejected=[{"x": torch.ones(2), "f": minus_one}],
        )

    def test_closure_match_on_local_closure_is_refused(self):
        offset = 2

        def local(x):
            return x + offset

        def fn(x, f):
            return f(x)

        with self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(fn, (torch.ones(2), local))
        self.assertIn("L['f'].__code__", str(ctx.exception))

    def test_builtin_match(self):
        def fn(x, f):
            return x * f([1, 2])

        built, loaded = self.roundtrip(fn, (torch.ones(2), len), "BUILTIN_MATCH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "f": len}],
            rejected=[{"x": torch.ones(2), "f": sum}],
        )

    def test_builtins_used_by_name(self):
        built, loaded = self.roundtrip(
            uses_builtins, (torch.ones(2), 3), ("BUILTIN_MATCH", "FUNCTION_MATCH", "ID_MATCH")
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "n": 3}],
            rejected=[(_patched_builtins_dict("sum", max), {"x": torch.ones(2), "n": 3})],
        )

    def test_pymodule_match(self):
        def fn(x, m):
            return x + 1

        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2), math),
            "PYMODULE_MATCH",
            extra_guards=[(LocalSource("m"), GuardBuilder.PYMODULE_MATCH)],
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "m": math}],
            rejected=[{"x": torch.ones(2), "m": os}],
        )

    def test_sequence_length(self):
        def fn(x, seq):
            return x * seq[0]

        built, loaded = self.roundtrip(fn, (torch.ones(2), [1, 2, 3]), "SEQUENCE_LENGTH")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "seq": [4, 5, 6]}],
            rejected=[{"x": torch.ones(2), "seq": [1, 2]}, {"x": torch.ones(2), "seq": (1, 2, 3)}],
        )

    def test_tuple_iterator_len(self):
        def fn(x, it):
            return x * next(it)

        built, loaded = self.roundtrip(fn, (torch.ones(2), iter((1, 2, 3))), "TUPLE_ITERATOR_LEN")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "it": iter((7, 8, 9))}],
            rejected=[{"x": torch.ones(2), "it": iter((1, 2))}],
        )

    def test_range_iterator_match(self):
        def fn(x, it):
            return x * next(it)

        built, loaded = self.roundtrip(
            fn, (torch.ones(2), iter(range(5))), "RANGE_ITERATOR_MATCH"
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "it": iter(range(5))}],
            rejected=[{"x": torch.ones(2), "it": iter(range(6))}],
        )

    def test_duplicate_input(self):
        def fn(x, y):
            return x + y

        x = torch.ones(2)
        built, loaded = self.roundtrip(fn, (x, x), "DUPLICATE_INPUT")
        z = torch.ones(2)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": z, "y": z}],
            rejected=[{"x": z, "y": torch.ones(2)}],
        )

    def test_mapping_keys_check(self):
        def fn(x, mp):
            return x * len(mp)

        built, loaded = self.roundtrip(
            fn, (torch.ones(2), types.MappingProxyType({"a": 1})), "MAPPING_KEYS_CHECK"
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "mp": types.MappingProxyType({"a": 2})}],
            rejected=[{"x": torch.ones(2), "mp": types.MappingProxyType({"b": 1})}],
        )

    def test_empty_nn_module_hooks_dict(self):
        def fn(m, x):
            return m(x)

        with torch._dynamo.config.patch(skip_nnmodule_hook_guards=False):
            built, loaded = self.roundtrip(
                fn, (Small(), torch.ones(2)), "EMPTY_NN_MODULE_HOOKS_DICT"
            )
            hooked = Small()
            hooked.register_forward_hook(lambda *a: None)
            self.assert_same_decisions(
                built,
                loaded,
                accepted=[{"m": Small(), "x": torch.ones(2)}],
                rejected=[{"m": hooked, "x": torch.ones(2)}],
            )

    @parametrize(
        "guard_type,state",
        [
            ("GRAD_MODE", "no_grad"),
            ("DETERMINISTIC_ALGORITHMS", "deterministic"),
            ("TORCH_FUNCTION_STATE", "torch_function_disabled"),
            ("FSDP_TRAINING_STATE", "num_threads"),
        ],
    )
    def test_global_state(self, guard_type, state):
        def fn(x):
            return x + 1

        built, loaded = self.roundtrip(
            fn,
            (torch.ones(2),),
            guard_type,
            extra_guards=[(GlobalStateSource(), getattr(GuardBuilder, guard_type))],
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(_GLOBAL_STATE_CHANGES[state](), {"x": torch.ones(2)})],
        )

    def test_global_state_saved_not_current(self):
        # Saved under no_grad, loaded under grad mode: the loaded guard must still
        # accept exactly under no_grad.
        def fn(x):
            return x + 1

        with torch.no_grad():
            built = build_check_fn_manager(fn, (torch.ones(2),), guard_types=("GRAD_MODE",))
        loaded = load_built(built)
        self.assertTrue(torch.is_grad_enabled())
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[(torch.no_grad(), {"x": torch.ones(2)})],
            rejected=[{"x": torch.ones(2)}],
        )

    def test_default_device(self):
        def fn(x):
            return x + 1

        # (a "cpu" default device is no device context at all in torch 2.7.1)
        with torch.device("meta"):
            built, loaded = self.roundtrip(
                fn,
                (torch.ones(2),),
                "DEFAULT_DEVICE",
                extra_guards=[(GlobalStateSource(), GuardBuilder.DEFAULT_DEVICE)],
            )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[(torch.device("meta"), {"x": torch.ones(2)})],
            rejected=[{"x": torch.ones(2)}],
        )

    def test_shape_env(self):
        def fn(x):
            return x * x.shape[0]

        x = torch.ones(5, 2)
        torch._dynamo.mark_dynamic(x, 0)
        built, loaded = self.roundtrip(fn, (x,), "SHAPE_ENV")
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(9, 2)}, {"x": torch.ones(2, 2)}],
            rejected=[{"x": torch.ones(1, 2)}],
        )

    def test_shape_env_with_tensor_match(self):
        def fn(x, y):
            return x[: y.shape[0]] + y

        x = torch.ones(6)
        y = torch.ones(3)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(y, 0)
        built, loaded = self.roundtrip(fn, (x, y), ("SHAPE_ENV", "TENSOR_MATCH"))
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(8), "y": torch.ones(4)}],
            rejected=[
                {"x": torch.ones(3), "y": torch.ones(4)},
                {"x": torch.ones(8, 2), "y": torch.ones(4)},
            ],
        )

    def test_all_guards_of_a_module_call(self):
        # No filter: every guard Dynamo installs for an nn.Module call.
        def fn(m, x):
            return m(x).relu()

        built = build_check_fn_manager(fn, (Small(), torch.ones(2)))
        loaded = load_built(built)
        other = Small()
        other.lin = torch.nn.Linear(2, 3)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"m": Small(), "x": torch.ones(2)}],
            rejected=[
                {"m": other, "x": torch.ones(2)},
                {"m": Small(), "x": torch.ones(3)},
                (torch.no_grad(), {"m": Small(), "x": torch.ones(2)}),
            ],
        )


    @parametrize("case", ["module_call", "globals_and_builtins", "dynamic_shapes"])
    def test_loaded_tree_is_the_reference_tree(self, case):
        if case == "module_call":
            built = build_check_fn_manager(lambda m, x: m(x), (Small(), torch.ones(2)))
        elif case == "globals_and_builtins":
            built = build_check_fn_manager(uses_builtins, (torch.ones(2), 4))
        else:
            x = torch.ones(5, 3)
            torch._dynamo.mark_dynamic(x, 0)
            built = build_check_fn_manager(lambda x: x * x.shape[0], (x,))
        loaded = load_built(built)

        def tree(manager):
            # Drop the provenance comments (file:line of the compile) only.
            return [line.split("#")[0].rstrip() for line in str(manager).splitlines()]

        self.assertEqual(tree(loaded), tree(built.ref.guard_manager))


class TestGuardSerializationValues(GuardSerializationTestCase):
    """Values the guards read that are neither constants nor named objects."""

    def roundtrip_all(self, fn, args):
        built = build_check_fn_manager(fn, args)
        return built, load_built(built)

    def test_zero_dim_tensor(self):
        built, loaded = self.roundtrip_all(lambda x: x * 2, (torch.tensor(1.5),))
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.tensor(2.5)}],
            rejected=[{"x": torch.empty(0)}, {"x": torch.tensor([1.5])}],
        )

    def test_function_with_no_stable_name(self):
        built, loaded = self.roundtrip_all(uses_global_lambda, (torch.ones(2),))
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(patched_global("SCALE_FN", lambda x: x * 3), {"x": torch.ones(2)})],
        )

    def test_namedtuple(self):
        built, loaded = self.roundtrip_all(lambda x, p: x * p.x + p.y, (torch.ones(2), Point(2, 3)))
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "p": Point(2, 3)}],
            rejected=[{"x": torch.ones(2), "p": Point(2, 4)}, {"x": torch.ones(2), "p": (2, 3)}],
        )

    def test_object_with_slots(self):
        built, loaded = self.roundtrip_all(lambda x, o: x * o.a, (torch.ones(2), Slotted(2, 3)))
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "o": Slotted(2, 9)}],
            rejected=[{"x": torch.ones(2), "o": Slotted(3, 3)}],
        )

    def test_enum_member(self):
        built, loaded = self.roundtrip_all(
            lambda x, c: x * (2 if c is Color.RED else 3), (torch.ones(2), Color.RED)
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "c": Color.RED}],
            rejected=[{"x": torch.ones(2), "c": Color.BLUE}],
        )

    @parametrize("guard_type", ["CONSTANT_MATCH", None])
    def test_cpp_enum_member(self, guard_type):
        # NOTE: [Members of C++ enums] in guard_serialization_codecs.py
        SDPBackend = torch.nn.attention.SDPBackend
        args = (torch.ones(2), SDPBackend.MATH)
        if guard_type is None:
            built, loaded = self.roundtrip_all(by_sdp_backend, args)
        else:
            built, loaded = self.roundtrip(by_sdp_backend, args, guard_type)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "backend": SDPBackend.MATH}],
            rejected=[
                {"x": torch.ones(2), "backend": SDPBackend.FLASH_ATTENTION},
                {"x": torch.ones(2), "backend": SDPBackend.CUDNN_ATTENTION},
                {"x": torch.ones(2), "backend": 0},
            ],
        )

    def test_cpp_enum_class_is_named_where_it_is_exposed(self):
        # NOTE: [Classes renamed where they are exposed]: its qualname is
        # _SDPBackend, which torch.nn.attention does not have.
        from torch._dynamo.guard_serialization import _NamedRef, find_stable_name

        SDPBackend = torch.nn.attention.SDPBackend
        self.assertEqual(
            find_stable_name(SDPBackend), _NamedRef("torch.nn.attention", "SDPBackend")
        )

    def test_cpp_enum_member_the_class_no_longer_has_is_refused_at_load(self):
        from torch._dynamo import guard_serialization_codecs as codecs

        built = build_check_fn_manager(
            by_sdp_backend, (torch.ones(2), torch.nn.attention.SDPBackend.MATH)
        )
        state = load_guards_state(built.ref.guards_state)
        values = state.output_graph.values
        stand_in = values["L['backend']"]
        self.assertIsInstance(stand_in, codecs._EnumStandIn)
        values["L['backend']"] = dataclasses.replace(stand_in, member="NO_SUCH_MEMBER")
        state.output_graph.local_scope["backend"] = values["L['backend']"]
        with self.assertRaisesRegex(PackageError, r"\.NO_SUCH_MEMBER, a member"):
            load_guard_manager(state, built.code, built.f_globals)
        # so is a member an enum.Enum no longer has
        gone = codecs._EnumStandIn(stand_in.cls.__class__(__name__, "Color"), "GREEN")
        with self.assertRaisesRegex(PackageError, r"Color\.GREEN, a member"):
            codecs._Hydrator()(gone)

    def test_cpp_enum_member_cross_process(self):
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            args = (torch.ones(2), torch.nn.attention.SDPBackend.MATH)
            save(t.build_check_fn_manager(t.by_sdp_backend, args))
            """,
            """
            m = load(t.by_sdp_backend)
            from torch.nn.attention import SDPBackend
            report([
                m.check({"x": torch.ones(2), "backend": backend})
                for backend in [SDPBackend.MATH, SDPBackend.FLASH_ATTENTION]
            ])
            """,
        )
        self.assertEqual(decisions, [True, False])

    def test_count_iterator(self):
        # NOTE: [Count iterators] in guard_serialization_codecs.py
        built, loaded = self.roundtrip(
            counts_with, (torch.ones(2), itertools.count(2, 3)), "TYPE_MATCH"
        )
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "counter": itertools.count(7)}],
            rejected=[{"x": torch.ones(2), "counter": iter([1, 2])}],
        )

    @parametrize("args", [(2, 3), (2,), (2.5,), (1, 0.5), (1j, 2)])
    def test_count_iterator_keeps_its_item_and_step(self, args):
        from torch._dynamo import guard_serialization_codecs as codecs

        counter = itertools.count(*args)
        next(counter)
        stand_in = codecs._CountIteratorCodec.save(None, counter, "L['counter']", True)
        loaded = codecs._Hydrator()(pickle.loads(pickle.dumps(stand_in)))
        self.assertIs(type(loaded), itertools.count)
        self.assertEqual(repr(loaded), repr(counter))

    def test_count_iterator_of_other_numbers(self):
        counter = itertools.count(fractions.Fraction(1, 2))
        with self.assertRaisesRegex(PackageError, r"TYPE_MATCH guard cannot be serialized.*Fraction"):
            build_check_fn_manager(counts_with, (torch.ones(2), counter), guard_types=("TYPE_MATCH",))
        # read by no guard, it is left out
        built = build_check_fn_manager(counts_with, (torch.ones(2), counter), guard_types=("TENSOR_MATCH",))
        loaded = load_built(built)
        self.assertTrue(loaded.check({"x": torch.ones(2), "counter": counter}))

    def test_partial(self):
        built, loaded = self.roundtrip_all(uses_global_partial, (torch.ones(2),))
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[
                (patched_global("PARTIAL", functools.partial(helper, k=6)), {"x": torch.ones(2)})
            ],
        )

    def test_function_in_the_closure_of_a_module_level_wrapper(self):
        # The wrapped function has no module-level name, but the guard's source
        # reaches it from one: G['tripled'].__closure__[0].cell_contents.
        built, loaded = self.roundtrip_all(uses_decorated_global, (torch.ones(2),))
        self.assertIn(b"__closure__[0]", built.ref.guards_state)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2)}],
            rejected=[(patched_global("tripled", quadrupled), {"x": torch.ones(2)})],
        )

    def test_closure_cells(self):
        def make(offset):
            def inner(x):
                return x + offset

            return inner

        def fn(x, f):
            return f(x)

        with self.assertRaises(PackageError) as ctx:
            # the closure's code has no stable name: refused, naming it
            build_check_fn_manager(fn, (torch.ones(2), make(1)))
        self.assertIn("L['f'].__code__", str(ctx.exception))


instantiate_parametrized_tests(TestGuardSerializationValues)


class TestGuardsStateFormat(GuardSerializationTestCase):
    def test_unguarded_bystanders_are_not_pickled(self):
        class Holder:  # never pickled: only its `a` is guarded, by value
            pass

        def fn(x, h):
            return x * h.cfg.a

        cfg = Foo(2)
        cfg.lock = threading.Lock()
        cfg.gen = (i for i in range(3))
        h = types.SimpleNamespace(cfg=cfg)
        built = build_check_fn_manager(fn, (torch.ones(2), h), guard_types=("CONSTANT_MATCH",))
        self.assertNotIn(b"threading", built.ref.guards_state)
        loaded = load_built(built)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "h": types.SimpleNamespace(cfg=Foo(2))}],
            rejected=[{"x": torch.ones(2), "h": types.SimpleNamespace(cfg=Foo(3))}],
        )

    def test_unpicklable_guarded_value_names_its_access_path(self):
        def fn(x, h):
            return x + 1

        h = types.SimpleNamespace(it=(i for i in range(3)))
        with self.assertRaises(PackageError) as ctx:
            build_check_fn_manager(
                fn,
                (torch.ones(2), h),
                extra_guards=[(AttrSource(LocalSource("h"), "it"), GuardBuilder.TYPE_MATCH)],
            )
        self.assertIn("L['h'].it", str(ctx.exception))

    def test_hostile_pickle_is_refused_before_it_runs(self):
        marker = os.path.join(tempfile.mkdtemp(), "pwned")

        class Exploit:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        data = pickle.dumps(Exploit())
        with self.assertRaisesRegex(PackageError, r"refusing to unpickle posix\.system|refusing to unpickle os\.system"):
            load_guards_state(data)
        self.assertFalse(os.path.exists(marker))

    def test_damaged_state_is_a_package_error(self):
        built = build_check_fn_manager(plus_one, (torch.ones(2),))
        for data in (built.ref.guards_state[: len(built.ref.guards_state) // 2], b"garbage"):
            with self.assertRaises(PackageError):
                load_guards_state(data)

    def test_wrong_code_or_version_is_refused(self):
        built = build_check_fn_manager(plus_one, (torch.ones(2),))
        state = load_guards_state(built.ref.guards_state)
        with self.assertRaisesRegex(PackageError, "saved for code 'plus_one'"):
            load_guard_manager(state, uses_global_scale.__code__, built.f_globals)
        state.output_graph.torch_version = "2.13.0"
        with self.assertRaisesRegex(PackageError, "saved by torch 2.13.0"):
            load_guard_manager(state, built.code, built.f_globals)
        state.output_graph.torch_version = str(torch.__version__)
        state.output_graph.format_version = 99
        with self.assertRaisesRegex(PackageError, "format 99 is not supported"):
            load_guard_manager(state, built.code, built.f_globals)

    def test_hydrate_never_imports_a_module_named_by_the_bytes(self):
        # Saved guards name the module whose globals they read. Without the
        # runtime globals, a load binds that module's only if it is imported:
        # importing a module named by the bytes would run its code.
        from torch._dynamo import guard_serialization

        tmp = tempfile.mkdtemp()
        marker = os.path.join(tmp, "imported")
        name = f"guards_state_names_me_{os.getpid()}"
        with open(os.path.join(tmp, f"{name}.py"), "w") as f:
            f.write(f"open({marker!r}, 'w').close()\n")
        built = build_check_fn_manager(plus_one, (torch.ones(2),))
        state = load_guards_state(built.ref.guards_state)
        state.output_graph.global_module = name
        data = guard_serialization.pickle_guards_state(state)
        sys.path.insert(0, tmp)
        try:
            with self.assertRaisesRegex(PackageError, f"module '{name}', which is not imported"):
                guard_serialization.hydrate(load_guards_state(data), built.code)
            # upstream's spelling without runtime_global_scope hydrates so too
            state = load_guards_state(data)
            with self.assertRaisesRegex(PackageError, "which is not imported"):
                CheckFunctionManager(
                    built.code, state.output_graph, shape_code_parts=state.shape_code_parts
                )
            # given the globals, the module's name is not needed
            loaded = load_guard_manager(load_guards_state(data), built.code, built.f_globals)
        finally:
            sys.path.remove(tmp)
        self.assertNotIn(name, sys.modules)
        self.assertFalse(os.path.exists(marker))
        self.assertTrue(loaded.check({"x": torch.ones(2)}))

    def test_unresolvable_name_fails_the_guard_not_the_load(self):
        built = build_check_fn_manager(
            uses_global_class, (torch.ones(2), Foo()), guard_types=("ID_MATCH",)
        )
        module = sys.modules[__name__]
        saved = module.Foo
        del module.Foo
        try:
            loaded = load_built(built)
        finally:
            module.Foo = saved
        self.assertTrue(built.ref.guard_manager.check({"x": torch.ones(2), "o": Foo()}))
        self.assertFalse(loaded.check({"x": torch.ones(2), "o": Foo()}))

    def test_upstream_spelling(self):
        built = build_check_fn_manager(uses_global_scale, (torch.ones(2),))
        # What load_guard_manager does: the saved state in place of the OutputGraph.
        state = load_guards_state(built.ref.guards_state)
        loaded = CheckFunctionManager(
            built.code,
            state.output_graph,
            shape_code_parts=state.shape_code_parts,
            runtime_global_scope=globals(),
        )
        self.assertIsNone(loaded.guards_state)
        self.assertTrue(loaded.guard_manager.check({"x": torch.ones(2)}))

    def test_cross_process(self):
        # Saved by one interpreter, loaded and checked by a fresh one.
        decisions = save_and_load_in_fresh_processes(
            __file__,
            """
            save(t.build_check_fn_manager(t.uses_global_model, (torch.ones(2),)))
            """,
            """
            m = load(t.uses_global_model)
            decisions = [m.check({"x": torch.ones(2)}), m.check({"x": torch.ones(3)})]
            t.MODEL.lin = torch.nn.Linear(2, 4)
            report(decisions + [m.check({"x": torch.ones(2)})])
            """,
        )
        self.assertEqual(decisions, [True, False, False])


@contextlib.contextmanager
def _patched_builtins_dict(name, value):
    # Dynamo reads builtins through a global alias of the builtins dict.
    import builtins

    with unittest.mock.patch.object(builtins, name, value):
        yield


@contextlib.contextmanager
def _registered_pytree_node(cls):
    pytree.register_pytree_node(cls, lambda o: ([], None), lambda c, ctx: cls())
    try:
        yield
    finally:
        pytree.SUPPORTED_NODES.pop(cls)


@contextlib.contextmanager
def _inside_vmap():
    from torch._C._functorch import _vmap_decrement_nesting, _vmap_increment_nesting

    _vmap_increment_nesting(2, "error")
    try:
        yield
    finally:
        _vmap_decrement_nesting()


@contextlib.contextmanager
def _deterministic():
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)


@contextlib.contextmanager
def _num_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(old + 1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


_GLOBAL_STATE_CHANGES = {
    "no_grad": torch.no_grad,
    "deterministic": _deterministic,
    "torch_function_disabled": torch._C.DisableTorchFunctionSubclass,
    "num_threads": _num_threads,
}


class TestGuardSerializationSpellings(GuardSerializationTestCase):
    """Upstream's API (save_guards=True, package.load_guard_manager) and the
    seed's guards_serialization_mode alias save the same bytes and decide alike."""

    accepted = ({"x": torch.ones(2)}, {"x": torch.zeros(2)})
    rejected = ({"x": torch.ones(3)}, {"x": torch.ones(2, dtype=torch.int64)})

    def test_save_guards_and_save_alias_save_the_same_bytes(self):
        alias = build_check_fn_manager(
            uses_global_scale,
            (torch.ones(2),),
            save_guards=False,
            guards_serialization_mode="save",
        )
        upstream = build_check_fn_manager(uses_global_scale, (torch.ones(2),))
        self.assertIsInstance(upstream.ref.guards_state, bytes)
        self.assertEqual(upstream.ref.guards_state, alias.ref.guards_state)
        plain = build_check_fn_manager(uses_global_scale, (torch.ones(2),), save_guards=False)
        self.assertIsNone(plain.ref.guards_state)

    def test_load_alias_decides_like_load_guard_manager(self):
        # The seed's spelling, CheckFunctionManager(code, pickle.loads(guards_state)
        # or the bytes, guards_serialization_mode="load"): the one test of it.
        # Every other load in these tests is load_guard_manager's (upstream's).
        built = build_check_fn_manager(uses_global_scale, (torch.ones(2),))
        data = built.ref.guards_state
        upstream = load_built(built)
        for state in (data, pickle.loads(data)):
            alias = CheckFunctionManager(
                built.code, state, guards_serialization_mode="load"
            ).guard_manager
            self.assert_same_decisions(built, alias, self.accepted, self.rejected)
        self.assert_same_decisions(built, upstream, self.accepted, self.rejected)
        with patched_global("SCALE", 4):
            self.assertFalse(upstream.check(self.accepted[0]))
            self.assertFalse(alias.check(self.accepted[0]))
        # What plain pickle.loads returned is read again by the restricted
        # unpickler (NOTE: [One guard load path]): no class outside the format.
        state = pickle.loads(data)
        state.output_graph.values["G['SCALE']"] = Foo()
        with self.assertRaisesRegex(PackageError, r"refusing to unpickle \w+\.Foo"):
            CheckFunctionManager(built.code, state, guards_serialization_mode="load")

    def test_bad_spellings_are_clear_errors(self):
        built = build_check_fn_manager(plus_one, (torch.ones(2),))
        data = built.ref.guards_state
        with self.assertRaisesRegex(
            ValueError, r"guards_serialization_mode must be 'save' or 'load', not 'saev'"
        ):
            CheckFunctionManager(built.code, data, guards_serialization_mode="saev")
        with self.assertRaisesRegex(TypeError, "load_guard_manager"):
            CheckFunctionManager(built.code, data)
        state = load_guards_state(data)
        for args, kwargs in (
            ((data,), {"guards_serialization_mode": "load", "save_guards": True}),
            ((state.output_graph,), {"shape_code_parts": state.shape_code_parts, "save_guards": True}),
        ):
            with self.assertRaisesRegex(ValueError, "loaded guards cannot be saved again"):
                CheckFunctionManager(built.code, *args, **kwargs)
        with self.assertRaisesRegex(PackageError, "cannot load guards from a dict"):
            CheckFunctionManager(built.code, {}, guards_serialization_mode="load")


class TestVerifySerializedGuards(GuardSerializationTestCase):
    """config.verify_serialized_guards: a debug flag, off by default, that
    rebuilds saved guards at save time and fails the save if they disagree."""

    @contextlib.contextmanager
    def saved_scale_corrupted(self):
        # The saved guards expect SCALE == 4 while the frame saw 3: rebuilt from
        # the bytes, they reject the very inputs they were built from.
        from torch._dynamo import guard_serialization

        real = guard_serialization.build_guards_state

        def corrupting(*args, **kwargs):
            state = real(*args, **kwargs)
            state.output_graph.values["G['SCALE']"] = SCALE + 1
            return state

        with unittest.mock.patch.object(
            guard_serialization, "build_guards_state", corrupting
        ):
            yield

    def test_off_by_default(self):
        self.assertFalse(torch._dynamo.config.verify_serialized_guards)
        with self.saved_scale_corrupted():
            built = build_check_fn_manager(uses_global_scale, (torch.ones(2),))
        self.assertTrue(built.ref.guard_manager.check({"x": torch.ones(2)}))
        self.assertFalse(load_built(built).check({"x": torch.ones(2)}))

    @torch._dynamo.config.patch(verify_serialized_guards=True)
    def test_on_it_fails_the_save_of_disagreeing_guards(self):
        with self.saved_scale_corrupted(), self.assertRaisesRegex(
            PackageError,
            r"serialized guards of uses_global_scale reject the inputs they were built from",
        ):
            build_check_fn_manager(uses_global_scale, (torch.ones(2),))
        built = build_check_fn_manager(uses_global_scale, (torch.ones(2),))
        self.assertTrue(load_built(built).check({"x": torch.ones(2)}))


instantiate_parametrized_tests(TestGuardSerialization)


def _codec_dispatch_samples() -> list:
    """One object of each kind a guard may read."""

    def function():
        pass

    cell = (lambda: function).__closure__[0]
    return [
        1, "s", None, torch.float32, torch.device("cpu"), torch.Size([2]),
        torch.strided, torch.contiguous_format, torch, Small, Small(), function,
        len, str.join, Color.RED, torch.nn.attention.SDPBackend.MATH, torch.ones(2), torch.nn.Parameter(torch.ones(2)),
        TwoTensor(torch.ones(2), torch.ones(2)), {"a": 1}, collections.OrderedDict(),
        collections.defaultdict(list), [1], (1,), collections.namedtuple("P", "x")(1),
        {1}, frozenset(), slice(1, 2), range(3), types.MappingProxyType({}),
        iter((1, 2)), iter(range(2)), itertools.count(1, 2), itertools.count(fractions.Fraction(1)),
        torch._C._dispatch_tls_local_include_set(),
        pytree.tree_flatten, functools.partial(function), Small().forward, cell,
        object(), vars(__builtins__) if isinstance(__builtins__, types.ModuleType)
        else __builtins__, {}.keys(), Foo(),
    ]


class TestCodecDispatch(GuardSerializationTestCase):
    """The save side asks only the codecs that may take an object's type (NOTE:
    [Codec dispatch by type] in guard_serialization_codecs.py)."""

    def test_accepts_type_agrees_with_accepts(self):
        from torch._dynamo import guard_serialization_codecs as codecs

        for obj in _codec_dispatch_samples():
            for codec in codecs._SAVE_CODECS:
                by_type = codec.accepts_type(type(obj))
                if by_type is None:
                    continue
                for guarded in (True, False):
                    self.assertEqual(
                        codec.accepts(obj, guarded),
                        by_type,
                        f"{codec.__name__} on a {type(obj).__qualname__}",
                    )

    def test_the_plan_asks_the_codecs_asking_all_would_take(self):
        from torch._dynamo import guard_serialization_codecs as codecs

        for obj in _codec_dispatch_samples():
            for guarded in (True, False):
                every = [c for c in codecs._SAVE_CODECS if c.accepts(obj, guarded)]
                planned = [
                    c
                    for c, takes in codecs._save_plan(type(obj))
                    if takes or c.accepts(obj, guarded)
                ]
                self.assertEqual(planned, every, type(obj).__qualname__)


# Classes whose own __new__ must never run at load (NOTE: [Instances of classes
# with a custom __new__]): each counts its calls.
class CountsNew:
    made = 0

    def __new__(cls, *args, **kwargs):
        CountsNew.made += 1
        return super().__new__(cls)

    def __init__(self, a=1):
        self.a = a


class CountsNewOutput(collections.OrderedDict):
    """Shaped like a Hugging Face ModelOutput: an OrderedDict subclass whose
    fields are items and attributes."""

    made = 0

    def __new__(cls, *args, **kwargs):
        CountsNewOutput.made += 1
        return super().__new__(cls)

    def __init__(self, hidden):
        super().__init__(hidden=hidden)
        self.hidden = hidden


class NoGradRotary(torch.nn.Module):
    """Llama's rotary embedding: forward decorated with @torch.no_grad()."""

    def __init__(self):
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(2))

    @torch.no_grad()
    def forward(self, x):
        return x * self.inv_freq


def calls_rotary(m, x):
    return m(x) + 1


def scale_by(k, x):
    return x * k


class TestGuardsOnLibraryObjects(GuardSerializationTestCase):
    def test_type_match_on_class_with_custom_new(self):
        def fn(x, o):
            return x * o.a

        CountsNew.made = 0
        built, loaded = self.roundtrip(fn, (torch.ones(2), CountsNew(3)), "TYPE_MATCH")
        self.assertEqual(CountsNew.made, 1)  # the loaded guards made none
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "o": CountsNew(3)}],
            rejected=[{"x": torch.ones(2), "o": Foo(3)}, {"x": torch.ones(2), "o": 1}],
        )

    def test_type_match_on_ordered_dict_subclass_with_custom_new(self):
        def fn(out):
            return out.hidden + 1

        CountsNewOutput.made = 0
        built, loaded = self.roundtrip(fn, (CountsNewOutput(torch.ones(2)),), "TYPE_MATCH")
        self.assertEqual(CountsNewOutput.made, 1)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"out": CountsNewOutput(torch.ones(2))}],
            rejected=[{"out": collections.OrderedDict(hidden=torch.ones(2))}, {"out": Foo()}],
        )

    def test_no_grad_decorator_reached_through_the_model(self):
        # The guards read the torch.no_grad instance in forward's closure by
        # identity and by type: reached from the module-level class at load.
        built, loaded = self.roundtrip(calls_rotary, (NoGradRotary(), torch.ones(2)), None)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"m": NoGradRotary(), "x": torch.ones(2)}],
            rejected=[{"m": torch.nn.Linear(2, 2), "x": torch.ones(2)}],
        )

    def test_functools_partial_of_module_level_function(self):
        def fn(x, p):
            return p(x)

        built, loaded = self.roundtrip(fn, (torch.ones(2), functools.partial(scale_by, 2)), None)
        self.assert_same_decisions(
            built,
            loaded,
            accepted=[{"x": torch.ones(2), "p": functools.partial(scale_by, 2)}],
            rejected=[{"x": torch.ones(2), "p": functools.partial(scale_by, 3)}],
        )

    def test_bound_method_passed_as_input_is_refused_naming_why(self):
        # Dynamo guards a bound method input by identity: a new method object at
        # every attribute access, so no other process can reach it again.
        def fn(x, f):
            return f(x)

        with self.assertRaisesRegex(PackageError, "^FUNCTION_MATCH guard cannot be serialized") as ctx:
            self.roundtrip(fn, (torch.ones(2), NoGradRotary().forward), None)
        self.assertIn("no stable name in another process", str(ctx.exception))

class ScaledByParam(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.p = torch.nn.Parameter(torch.randn(4, 2))

    def forward(self, x):
        return x + self.p


if torch.distributed.is_available():
    from torch.testing._internal.common_distributed import MultiThreadedTestCase

    class TestGuardSerializationThreadedProcessGroup(
        GuardSerializationTestCase, MultiThreadedTestCase
    ):
        """DTensor guards on the threaded process group backend, each rank a
        thread of this process (NOTE: [DTensor stand-ins] in
        guard_serialization_codecs.py)."""

        @property
        def world_size(self):
            # One rank: Dynamo's compile state is the process's, which ranks
            # tracing at once in their threads would share.
            return 1

        def setUp(self):
            # (MultiThreadedTestCase.setUp runs through the MRO; the threads
            # start once, after Dynamo's TestCase reset the compile state)
            super().setUp()
            self._spawn_threads()

        def perThreadSetUp(self):
            torch._dynamo.reset()

        def perThreadTearDown(self):
            torch._dynamo.reset()

        def mesh_and_dtensor(self):
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.tensor import distribute_tensor, Replicate

            mesh = init_device_mesh("cpu", (self.world_size,))
            return mesh, distribute_tensor(torch.randn(4, 2), mesh, [Replicate()])

        def test_dtensor_input(self):
            from torch.distributed.device_mesh import DeviceMesh
            from torch.distributed.tensor import distribute_tensor, DTensor, Replicate, Shard

            mesh, x = self.mesh_and_dtensor()
            built = build_check_fn_manager(plus_one, (x,))
            loaded = load_built(built)
            # a mesh over the same ranks made by another thread (another rank)
            foreign_mesh = DeviceMesh("cpu", mesh.mesh, _init_backend=False)
            foreign_mesh._thread_id = mesh._thread_id + 1
            self.assert_same_decisions(
                built,
                loaded,
                accepted=[{"x": distribute_tensor(torch.randn(4, 2), mesh, [Replicate()])}],
                rejected=[
                    {"x": distribute_tensor(torch.randn(4, 2), mesh, [Shard(0)])},
                    {"x": DTensor.from_local(x.to_local(), foreign_mesh, [Replicate()])},
                    {"x": torch.randn(4, 2)},
                ],
            )

        def test_device_mesh_input(self):
            # A DeviceMesh passed to the function itself (as to a DTensor
            # redistribute) is saved by value, as a DTensor's mesh is.
            from torch.distributed.device_mesh import init_device_mesh

            def fn(x, mesh):
                return x * mesh.size(0)

            mesh, _ = self.mesh_and_dtensor()
            built = build_check_fn_manager(fn, (torch.ones(2), mesh))
            loaded = load_built(built)
            self.assert_same_decisions(
                built,
                loaded,
                accepted=[{"x": torch.ones(2), "mesh": init_device_mesh("cpu", (self.world_size,))}],
                rejected=[
                    {"x": torch.ones(2), "mesh": init_device_mesh("cpu", (self.world_size,), mesh_dim_names=("dp",))},
                ],
            )

        def test_fsdp2_module_parameters(self):
            from torch.distributed.fsdp import fully_shard

            mesh, x = self.mesh_and_dtensor()
            m = fully_shard(ScaledByParam(), mesh=mesh)
            built = build_check_fn_manager(
                ScaledByParam.forward, (m, x), guard_types=("TENSOR_MATCH",)
            )
            loaded = load_built(built)
            other_m = fully_shard(ScaledByParam(), mesh=mesh)
            unsharded = ScaledByParam()
            self.assert_same_decisions(
                built,
                loaded,
                accepted=[{"self": m, "x": x}, {"self": other_m, "x": x}],
                rejected=[{"self": unsharded, "x": x}],
            )


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
