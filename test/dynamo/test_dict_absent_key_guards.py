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
import shutil
import tempfile
import textwrap
from pathlib import Path
from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


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


# The package tests save and load this module's readers in fresh processes,
# which import it by its file name.
SAVE_OR_LOAD = """
import logging, sys
import torch
import test_dict_absent_key_guards as readers

phase, reader, path = sys.argv[1:4]
fn = getattr(readers, reader)
messages = []


class Keep(logging.Handler):
    def emit(self, record):
        messages.append(record.getMessage())


logging.getLogger("torch._dynamo.package").addHandler(Keep())
logging.getLogger("torch._dynamo.package").setLevel(logging.INFO)
compiled = torch.compile(fn, backend="eager", package=path)
x = torch.ones(3)
report = {"eager": fn(x).tolist()}
if phase == "save":
    report["out"] = compiled(x).tolist()
    report["graphs"] = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    compiled.save_package()
else:
    compiled.load_package()
    report["loaded"] = [m for m in messages if m.startswith("loaded package")]
    with torch.compiler.set_stance("fail_on_recompile"):
        try:
            report["out"] = compiled(x).tolist()
        except RuntimeError as e:
            report["recompile"] = "Detected recompile" in str(e)
            report["reason"] = str(e)
from torch.testing._internal.fresh_process import write_report
write_report(report)
"""


class TestDictAbsentKeyGuards(torch._dynamo.test_case.TestCase):
    def compile_then_set(self, reader, env_name, config_key):
        """Frames compiled when ``reader`` runs with ENV_NAME unset and CONFIG
        empty, then again after setting ``env_name`` and ``config_key``; each
        result equals eager's."""
        fn = READERS[reader]
        counter = CompileCounter()
        compiled = torch.compile(fn, backend=counter)
        x = torch.ones(3)
        CONFIG.clear()
        self.addCleanup(CONFIG.clear)
        with mock.patch.dict(os.environ, {ENV_NAME: "on"}):
            os.environ.pop(ENV_NAME)
            self.assertEqual(compiled(x), fn(x))
            self.assertEqual(counter.frame_count, 1)
            os.environ[env_name] = "on"
            CONFIG[config_key] = 3.0
            self.assertEqual(compiled(x), fn(x))
        return counter.frame_count

    @parametrize("reader", list(READERS))
    def test_a_key_set_after_the_compile_recompiles(self, reader):
        self.assertEqual(self.compile_then_set(reader, ENV_NAME, "scale"), 2)

    @parametrize("reader", list(READERS))
    def test_a_key_still_absent_reuses_the_compile(self, reader):
        frames = self.compile_then_set(reader, "TORCH_TEST_ABSENT_KEY_OTHER", "other")
        self.assertEqual(frames, 1)


class TestPackagedEnvironmentReads(torch._dynamo.test_case.TestCase):
    """A package of code that reads os.environ, saved in one process and loaded
    in fresh ones whose environment differs or not."""

    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="absent-key-test-"))
        self.addCleanup(shutil.rmtree, self.tmp, ignore_errors=True)

    def run_phase(self, phase, reader, value):
        return run_code(
            textwrap.dedent(SAVE_OR_LOAD),
            phase,
            reader,
            str(self.tmp / f"package-{reader}"),
            cwd=self.tmp,  # not the repo: a wheel run must not import torch_overlay
            pythonpath=[Path(__file__).resolve().parent],
            env={ENV_NAME: value},
            fresh_inductor_cache=True,
        )

    @parametrize("reader", ["read_environ_get", "read_environ_contains"])
    def test_saved_unset_loads_unset_and_recompiles_set(self, reader):
        saved = self.run_phase("save", reader, None)
        self.assertEqual(saved["out"], saved["eager"])
        self.assertGreaterEqual(saved["graphs"], 1)
        # The same environment: the entry loads (the frozen os module's local
        # functions that encode os.environ's keys are found and match) and
        # serves the call.
        same = self.run_phase("load", reader, None)
        self.assertEqual(len(same["loaded"]), 1, same["loaded"])
        self.assertRegex(same["loaded"][0], r": 1 entries")
        self.assertEqual(same["out"], same["eager"])
        # The variable set: a guard on os.environ's dict rejects the entry
        # (the key's absence, a DICT_CONTAINS; on torch 2.6.0 the dict's
        # whole key set) and the call compiles (here: fail_on_recompile raises).
        differs = self.run_phase("load", reader, "on")
        self.assertTrue(differs.get("recompile"), differs)
        self.assertIn("G['os'].environ._data", differs["reason"])

    def test_saved_set_recompiles_with_another_value(self):
        reader = "read_environ_get"
        saved = self.run_phase("save", reader, "on")
        self.assertEqual(saved["out"], saved["eager"])
        same = self.run_phase("load", reader, "on")
        self.assertEqual(same["out"], same["eager"])
        differs = self.run_phase("load", reader, "off")
        self.assertTrue(differs.get("recompile"), differs)


instantiate_parametrized_tests(TestDictAbsentKeyGuards)
instantiate_parametrized_tests(TestPackagedEnvironmentReads)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
