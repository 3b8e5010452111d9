# Owner(s): ["module: dynamo"]
"""Guards on a dict key that is absent when Dynamo traces.

A traced ``d[key]`` of an absent key raises KeyError in the traced program;
code that catches it (``collections.abc.Mapping.get`` and ``__contains__``, and
so ``os.environ.get`` and ``key in os.environ``) depends on the key's absence.
Dynamo must guard it, or a frame compiled while a key was absent keeps running
that branch once the key is set, and a compile package saved where an
environment variable was unset runs that branch in a process where it is set.
"""

import os
from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


ENV_NAME = "TORCH_TEST_ABSENT_KEY_MODE"
CONFIG: dict = {}


def read_environ_get(x):
    if os.environ.get(ENV_NAME) == "on":
        return x + 1
    return x - 1


def read_environ_contains(x):
    if ENV_NAME in os.environ:
        return x + 1
    return x - 1


def read_getenv(x):
    return x * float(os.getenv(ENV_NAME, "1") == "on") + 2


def read_dict_subscript(x):
    try:
        return x * CONFIG["scale"]
    except KeyError:
        return x - 1


READERS = {
    "environ_get": read_environ_get,
    "environ_contains": read_environ_contains,
    "getenv": read_getenv,
    "dict_subscript": read_dict_subscript,
}


class TestDictAbsentKeyGuards(torch._dynamo.test_case.TestCase):
    @parametrize("reader", list(READERS))
    def test_a_key_set_after_the_compile_recompiles(self, reader):
        fn = READERS[reader]
        counter = CompileCounter()
        compiled = torch.compile(fn, backend=counter)
        x = torch.ones(3)
        CONFIG.clear()
        with mock.patch.dict(os.environ, {ENV_NAME: "on"}):
            os.environ.pop(ENV_NAME)
            self.assertEqual(compiled(x), fn(x))
            self.assertEqual(counter.frame_count, 1)
            os.environ[ENV_NAME] = "on"
            CONFIG["scale"] = 3.0
            try:
                self.assertEqual(compiled(x), fn(x))
            finally:
                CONFIG.clear()
        self.assertEqual(counter.frame_count, 2)

    @parametrize("reader", list(READERS))
    def test_a_key_still_absent_reuses_the_compile(self, reader):
        fn = READERS[reader]
        counter = CompileCounter()
        compiled = torch.compile(fn, backend=counter)
        x = torch.ones(3)
        CONFIG.clear()
        with mock.patch.dict(os.environ, {ENV_NAME: "on"}):
            os.environ.pop(ENV_NAME)
            compiled(x)
            os.environ["TORCH_TEST_ABSENT_KEY_OTHER"] = "1"
            CONFIG["other"] = 1
            try:
                self.assertEqual(compiled(x), fn(x))
            finally:
                CONFIG.clear()
        self.assertEqual(counter.frame_count, 1)


instantiate_parametrized_tests(TestDictAbsentKeyGuards)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
