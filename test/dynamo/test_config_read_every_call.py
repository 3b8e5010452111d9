# Owner(s): ["module: dynamo"]
"""Config entries that compiled code reads on every call cost no Python call.

See NOTE: [Config entries read on every call] in torch/utils/_config_module.py:
torch._dynamo.config.enable_cpp_framelocals_guard_eval, which Dynamo's C++
frame evaluation reads on every call of a compiled frame, is also a class
attribute of the config module, and follows every change of the entry.
"""

import sys
import unittest.mock

import torch
import torch._dynamo.test_case
import torch._dynamo.testing
from torch._dynamo import config
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.utils._config_module import ConfigModule


KEY = "enable_cpp_framelocals_guard_eval"


def config_reads_through_getattr(fn):
    """The names ConfigModule.__getattr__ is called with while fn() runs."""
    names = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code is ConfigModule.__getattr__.__code__:
            names.append(frame.f_locals["name"])

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return names


def class_attribute():
    return type(config).__dict__.get(KEY, "absent")


def add_one(x):
    return torch.relu(x) + 1


class TestConfigReadEveryCall(torch._dynamo.test_case.TestCase):
    def test_a_compiled_call_reads_no_config_through_getattr(self):
        counter = torch._dynamo.testing.CompileCounter()
        compiled = torch.compile(add_one, backend=counter)
        x = torch.randn(4)
        compiled(x)
        # Stock 2.7.1: ["enable_cpp_framelocals_guard_eval"], from C++.
        self.assertEqual(config_reads_through_getattr(lambda: compiled(x)), [])
        self.assertEqual(counter.frame_count, 1)

    def test_the_entry_is_a_class_attribute_equal_to_its_value(self):
        self.assertIn(KEY, type(config)._class_attribute_keys)
        self.assertIs(class_attribute(), ConfigModule.__getattr__(config, KEY))
        self.assertIs(getattr(config, KEY), True)
        # Entries nobody reads on every call stay out of the class.
        self.assertNotIn("recompile_limit", type(config).__dict__)
        self.assertNotIn(KEY, type(torch._inductor.config).__dict__)

    @parametrize("how", ["setattr", "patch", "closure_patcher", "mock_patch"])
    def test_the_class_attribute_follows_a_change(self, how):
        def seen():
            return (class_attribute(), getattr(config, KEY))

        self.assertEqual(seen(), (True, True))
        if how == "setattr":
            prior = getattr(config, KEY)
            setattr(config, KEY, False)
            try:
                self.assertEqual(seen(), (False, False))
            finally:
                setattr(config, KEY, prior)
        elif how == "patch":
            with config.patch(KEY, False):
                self.assertEqual(seen(), (False, False))
        elif how == "closure_patcher":
            revert = config._make_closure_patcher(**{KEY: False})()
            try:
                self.assertEqual(seen(), (False, False))
            finally:
                revert()
        else:
            with unittest.mock.patch.object(config, KEY, False):
                self.assertEqual(seen(), (False, False))
        self.assertEqual(seen(), (True, True))
        self.assertFalse(config._config[KEY].hide)

    def test_a_deleted_entry_has_no_class_attribute(self):
        # unittest.mock deletes an attribute it did not find in the module's
        # __dict__; a deleted entry reads as missing, as before.
        delattr(config, KEY)
        try:
            self.assertEqual(class_attribute(), "absent")
            self.assertFalse(hasattr(config, KEY))
        finally:
            setattr(config, KEY, True)
        self.assertEqual((class_attribute(), getattr(config, KEY)), (True, True))

    def test_compiled_frames_follow_the_patched_flag(self):
        # With the flag off, guards read frame locals from a dict, and the
        # frame's calls find their entry without a recompile.
        counter = torch._dynamo.testing.CompileCounter()
        x = torch.randn(4)
        with config.patch(KEY, False):
            compiled = torch.compile(add_one, backend=counter)
            compiled(x)
            with torch.compiler.set_stance("fail_on_recompile"):
                self.assertEqual(compiled(x), add_one(x))
        guards = str(_debug_get_cache_entry_list(add_one.__code__)[0].guard_manager)
        self.assertIn("accessed_by=DictGetItemGuardAccessor('x')", guards)
        self.assertNotIn("FrameLocalsGuardAccessor", guards)
        self.assertEqual(counter.frame_count, 1)


instantiate_parametrized_tests(TestConfigReadEveryCall)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
