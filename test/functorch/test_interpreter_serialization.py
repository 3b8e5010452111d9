# Owner(s): ["module: functorch"]
"""Functorch interpreters serialize (pytorch#152616).

``torch._C._functorch.CInterpreter`` has ``serialize()`` -> JSON text and a static
``deserialize(text)``, and the Python interpreter classes of
``torch._functorch.pyfunctorch`` pickle through them. The text is the one upstream
writes for the same interpreter stack (exact-text expectations below).
"""

import contextlib
import pickle
import textwrap

import torch
import torch._dynamo.test_case
import torch.autograd.forward_ad as fwAD
from torch._C._functorch import (
    _func_decrement_nesting,
    _func_increment_nesting,
    CInterpreter,
    TransformType,
)
from torch._functorch import pyfunctorch
from torch._functorch.eager_transforms import (
    grad_increment_nesting,
    jvp_increment_nesting,
)
from torch._functorch.vmap import vmap_increment_nesting
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


@contextlib.contextmanager
def functionalize_nesting(add_back_views):
    level = _func_increment_nesting(add_back_views)
    try:
        yield level
    finally:
        _func_decrement_nesting()


@contextlib.contextmanager
def fwd_grad_disabled():
    with fwAD._set_fwd_grad_enabled(False):
        yield


# Each case pushes one functorch layer; the state the layer must keep is what
# the Python interpreter class reports about it.
LAYERS = {
    "vmap_error": (lambda: vmap_increment_nesting(3, "error"), None),
    "vmap_same": (lambda: vmap_increment_nesting(5, "same"), None),
    "vmap_different": (lambda: vmap_increment_nesting(1, "different"), None),
    "grad": (grad_increment_nesting, None),
    "grad_under_no_grad": (grad_increment_nesting, torch.no_grad),
    "jvp": (jvp_increment_nesting, None),
    "jvp_under_fwd_grad_disabled": (jvp_increment_nesting, fwd_grad_disabled),
    "functionalize": (lambda: functionalize_nesting(False), None),
    "functionalize_add_back_views": (lambda: functionalize_nesting(True), None),
}


def transform_state(interpreter):
    """Everything a Python interpreter says about its layer."""
    state = {"key": interpreter.key(), "level": interpreter.level()}
    if isinstance(interpreter, pyfunctorch.VmapInterpreter):
        state["batch_size"] = interpreter.batch_size()
        state["randomness"] = interpreter.randomness()
    elif isinstance(interpreter, pyfunctorch.GradInterpreter):
        state["prev_grad_mode"] = interpreter.prev_grad_mode()
    elif isinstance(interpreter, pyfunctorch.JvpInterpreter):
        state["prev_fwd_grad_mode"] = interpreter.prev_fwd_grad_mode()
    elif isinstance(interpreter, pyfunctorch.FunctionalizeInterpreter):
        state["add_back_views"] = interpreter.functionalize_add_back_views()
    return state


@contextlib.contextmanager
def live_interpreters(*layer_names):
    """Pushes the named layers; yields their Python interpreters, bottom first."""
    with contextlib.ExitStack() as stack:
        for name in layer_names:
            push, outer = LAYERS[name]
            if outer is not None:
                stack.enter_context(outer())
            stack.enter_context(push())
        yield pyfunctorch.retrieve_all_functorch_interpreters()


def interpreters_under(*layer_names):
    """The interpreters of the named layers, once the layers are popped again."""
    with live_interpreters(*layer_names) as interpreters:
        return interpreters


# Text that does not describe an interpreter, and what deserialize says about it.
MALFORMED = {
    "empty": ("", "not JSON"),
    "not_an_object": ("[1]", "expected a JSON object"),
    "no_type": ("{}", 'no "type"'),
    "torch_type": ('{"type":0,"level":1}', '"type" of the interpreter is out of range'),
    "level_zero": ('{"type":1,"level":0}', '"level" of the interpreter is out of range'),
    "level_not_int": ('{"type":1,"level":true}', '"level" of the interpreter must be an integer'),
    "meta_of_other_transform": (
        '{"type":2,"level":1,"meta":{"Vmap":{}}}',
        '"meta" has no "Grad"',
    ),
    "bad_randomness": (
        '{"type":1,"level":1,"meta":{"Vmap":{"batchSize":2,"randomness":3}}}',
        '"randomness" of Vmap is out of range',
    ),
    "flag_not_bool": (
        '{"type":4,"level":1,"meta":{"Functionalize":{"functionalizeAddBackViews":1}}}',
        "must be true or false",
    ),
    "trailing_text": ('{"type":1}x', "not JSON"),
    "unterminated": ('{"type":1', "not JSON"),
    "single_quotes": ("{'type':1}", "not JSON"),
    "nested_arrays": ("[" * 100 + "]" * 100, "expected a JSON object"),
    "level_float": ('{"type":1,"level":1.0}', '"level" of the interpreter must be an integer'),
    "level_above_int64": (
        '{"type":1,"level":9223372036854775808}',
        '"level" of the interpreter is out of range',
    ),
    "level_above_uint64": (
        '{"type":1,"level":99999999999999999999999}',
        '"level" of the interpreter must be an integer',
    ),
    "negative_key_set": (
        '{"type":1,"level":1,"meta":{"Vmap":{"batchSize":2,"randomness":0}},'
        '"savedLocalDispatchKeySet":{"included":-1,"excluded":0},"is_alive":true}',
        "not a 64-bit key set",
    ),
}


class TestCInterpreterSerialization(torch._dynamo.test_case.TestCase):
    @parametrize("layer", list(LAYERS))
    def test_round_trip(self, layer):
        with live_interpreters(layer) as (interpreter,):
            text = interpreter._cdata.serialize()
        self.assertIsInstance(text, str)
        self.assertIn('"is_alive":true', text)
        restored = CInterpreter.deserialize(text)
        self.assertIs(type(restored), CInterpreter)
        self.assertEqual(restored.key(), interpreter.key())
        self.assertEqual(restored.level(), interpreter.level())
        self.assertEqual(
            transform_state(pyfunctorch.coerce_cinterpreter(restored)),
            transform_state(interpreter),
        )
        self.assertEqual(restored.serialize(), text)

    def test_nested_layers_keep_their_levels(self):
        interpreters = interpreters_under("vmap_same", "grad", "jvp", "functionalize")
        restored = [
            CInterpreter.deserialize(i._cdata.serialize()) for i in interpreters
        ]
        self.assertEqual(
            [(c.key(), c.level()) for c in restored],
            [
                (TransformType.Vmap, 1),
                (TransformType.Grad, 2),
                (TransformType.Jvp, 3),
                (TransformType.Functionalize, 4),
            ],
        )

    def test_format(self):
        # Compact JSON with sorted keys, as nlohmann::json's dump() writes it:
        # upstream (torch 2.13) writes exactly this text for the same stacks.
        def texts(*layer_names):
            with live_interpreters(*layer_names) as interpreters:
                return "\n".join(i._cdata.serialize() for i in interpreters)

        self.assertExpectedInline(
            texts("vmap_same", "vmap_error", "vmap_different"),
            """\
{"is_alive":true,"level":1,"meta":{"Vmap":{"batchSize":5,"randomness":1}},"savedLocalDispatchKeySet":null,"type":1}
{"is_alive":true,"level":2,"meta":{"Vmap":{"batchSize":3,"randomness":0}},"savedLocalDispatchKeySet":null,"type":1}
{"is_alive":true,"level":3,"meta":{"Vmap":{"batchSize":1,"randomness":2}},"savedLocalDispatchKeySet":null,"type":1}""",
        )
        self.assertExpectedInline(
            texts("grad", "grad_under_no_grad"),
            """\
{"is_alive":true,"level":1,"meta":{"Grad":{"prevGradMode":true,"prevInferenceMode":false}},"savedLocalDispatchKeySet":null,"type":2}
{"is_alive":true,"level":2,"meta":{"Grad":{"prevGradMode":false,"prevInferenceMode":false}},"savedLocalDispatchKeySet":null,"type":2}""",
        )
        self.assertExpectedInline(
            texts("jvp", "jvp_under_fwd_grad_disabled"),
            """\
{"is_alive":true,"level":1,"meta":{"Jvp":{"prevFwdGradMode":true,"prevInferenceMode":false}},"savedLocalDispatchKeySet":null,"type":3}
{"is_alive":true,"level":2,"meta":{"Jvp":{"prevFwdGradMode":false,"prevInferenceMode":false}},"savedLocalDispatchKeySet":null,"type":3}""",
        )
        self.assertExpectedInline(
            texts("functionalize", "functionalize_add_back_views"),
            """\
{"is_alive":true,"level":1,"meta":{"Functionalize":{"functionalizeAddBackViews":false}},"savedLocalDispatchKeySet":null,"type":4}
{"is_alive":true,"level":2,"meta":{"Functionalize":{"functionalizeAddBackViews":true}},"savedLocalDispatchKeySet":null,"type":4}""",
        )

    def test_format_of_a_transform_in_progress(self):
        # The stack a function sees inside vmap(grad(f)).
        seen = []

        def f(x):
            seen.extend(
                i._cdata.serialize()
                for i in pyfunctorch.retrieve_all_functorch_interpreters()
            )
            return x.sin().sum()

        torch.vmap(torch.func.grad(f), randomness="same")(torch.randn(3, 2))
        self.assertExpectedInline(
            "\n".join(seen),
            """\
{"is_alive":true,"level":1,"meta":{"Vmap":{"batchSize":3,"randomness":1}},"savedLocalDispatchKeySet":null,"type":1}
{"is_alive":true,"level":2,"meta":{"Grad":{"prevGradMode":true,"prevInferenceMode":false}},"savedLocalDispatchKeySet":null,"type":2}""",
        )

    def test_interpreter_outside_its_transform_is_not_alive(self):
        (interpreter,) = interpreters_under("grad")
        text = interpreter._cdata.serialize()
        self.assertIn('"is_alive":false', text)
        self.assertEqual(CInterpreter.deserialize(text).serialize(), text)

    def test_saved_local_dispatch_key_set(self):
        # Only an interpreter caught while processing an operator holds one;
        # the text form carries it either way.
        included = torch._C.DispatchKeySet(torch._C.DispatchKey.FuncTorchBatched)
        excluded = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU)
        text = (
            '{"is_alive":true,"level":2,"meta":{"Jvp":{"prevFwdGradMode":true,'
            '"prevInferenceMode":false}},'
            f'"savedLocalDispatchKeySet":{{"excluded":{excluded.raw_repr()},'
            f'"included":{included.raw_repr()}}},"type":3}}'
        )
        self.assertEqual(CInterpreter.deserialize(text).serialize(), text)

    def test_prev_inference_mode(self):
        # These grad and jvp interpreters keep no inference mode: they write
        # false, read text without it, and refuse true rather than drop it.
        text = (
            '{"is_alive":false,"level":2,"meta":{"Grad":{"prevGradMode":true,'
            '"prevInferenceMode":false}},"savedLocalDispatchKeySet":null,"type":2}'
        )
        restored = CInterpreter.deserialize(text)
        self.assertEqual((restored.key(), restored.level()), (TransformType.Grad, 2))
        self.assertTrue(pyfunctorch.GradInterpreter(restored).prev_grad_mode())
        self.assertEqual(restored.serialize(), text)
        without = CInterpreter.deserialize(text.replace(',"prevInferenceMode":false', ""))
        self.assertEqual(without.serialize(), text)
        with self.assertRaisesRegex(ValueError, "prevInferenceMode"):
            CInterpreter.deserialize(text.replace('"prevInferenceMode":false', '"prevInferenceMode":true'))

    def test_reads_any_json_spelling_of_the_schema(self):
        # Whitespace, key order, escapes and members the schema does not know
        # (later torch versions may add some) do not matter.
        text = (
            '{\n  "type": 1,\n  "meta": {"Vmap": {"randomness": 2, "batchSize": 5,'
            ' "note\\u00e9": [1.5e3, null, {"x": "\\"y\\""}]}},\n  "level": 3,'
            ' "savedLocalDispatchKeySet": null, "is_alive": false }'
        )
        restored = CInterpreter.deserialize(text)
        self.assertEqual(
            restored.serialize(),
            '{"is_alive":false,"level":3,"meta":{"Vmap":{"batchSize":5,"randomness":2}},'
            '"savedLocalDispatchKeySet":null,"type":1}',
        )

    @parametrize("case", list(MALFORMED))
    def test_malformed_text_is_a_value_error(self, case):
        text, message = MALFORMED[case]
        with self.assertRaisesRegex(ValueError, message):
            CInterpreter.deserialize(text)

    def test_present_right_after_import_torch(self):
        # A fresh interpreter that imports nothing private before it looks: the
        # methods are there, as upstream binds them in torch._C.
        report = run_code(
            textwrap.dedent(
                """
                import torch
                from torch._C._functorch import CInterpreter
                present = [hasattr(CInterpreter, "serialize"), hasattr(CInterpreter, "deserialize")]
                torch._C._functorch._vmap_increment_nesting(4, "same")
                try:
                    text = torch._C._functorch.peek_interpreter_stack().serialize()
                finally:
                    torch._C._functorch._vmap_decrement_nesting()
                restored = CInterpreter.deserialize(text)

                from torch.testing._internal.fresh_process import write_report
                write_report(
                    [*present, str(restored.key()), restored.level(), restored.serialize() == text]
                )
                """
            )
        )
        self.assertEqual(report, [True, True, "TransformType.Vmap", 1, True])


class TestPythonInterpreterPickling(torch._dynamo.test_case.TestCase):
    @parametrize("layer", list(LAYERS))
    def test_pickle_round_trip(self, layer):
        (interpreter,) = interpreters_under(layer)
        restored = pickle.loads(pickle.dumps(interpreter))
        self.assertIs(type(restored), type(interpreter))
        self.assertIs(type(restored._cdata), CInterpreter)
        self.assertEqual(transform_state(restored), transform_state(interpreter))
        self.assertEqual(restored.get_state(), interpreter.get_state())
        self.assertTrue(restored.check_state(interpreter.get_state()))

    def test_pickle_while_the_layer_is_live(self):
        restored = []

        def f(x):
            restored.extend(
                pickle.loads(
                    pickle.dumps(pyfunctorch.retrieve_all_functorch_interpreters())
                )
            )
            return x.sin().sum()

        torch.vmap(torch.func.grad(f), randomness="same")(torch.randn(3, 2))
        self.assertEqual(
            [i.get_state() for i in restored],
            [("Vmap", 1, "same"), ("Grad", 2, True)],
        )
        # An unpickled layer describes the stack; it is not pushed on it.
        self.assertIsNone(torch._C._functorch.peek_interpreter_stack())

    def test_unpickled_layer_matches_a_live_stack(self):
        saved = pickle.dumps(interpreters_under("vmap_error", "grad"))
        states = [i.get_state() for i in pickle.loads(saved)]
        with vmap_increment_nesting(7, "error"), grad_increment_nesting():
            self.assertTrue(pyfunctorch.compare_functorch_state(states))
        with grad_increment_nesting(), vmap_increment_nesting(7, "error"):
            self.assertFalse(pyfunctorch.compare_functorch_state(states))

    def test_pickle_has_no_cptr(self):
        (interpreter,) = interpreters_under("jvp")
        interpreter.prev_fwd_grad_mode()  # creates the cached _cptr
        self.assertNotIn("_cptr", interpreter.__getstate__())
        self.assertIsInstance(interpreter.__getstate__()["_cdata"], str)


instantiate_parametrized_tests(TestCInterpreterSerialization)
instantiate_parametrized_tests(TestPythonInterpreterPickling)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
