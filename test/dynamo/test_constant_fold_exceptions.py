# Owner(s): ["module: dynamo"]
"""A builtin that raises on constants raises in the traced program.

``None.shape``, ``None[:, None]`` or ``1 // 0`` raise in Python; Dynamo raises
the same exception in the program it traces, so that the user's ``except``
catches it, or, with no handler, the frame falls back to eager. torch 2.7.1
turned them into a graph break (or a deferred attribute that graph-broke at
its first use) after committing the graph before them: code that builds a
value only in eager (``if mask is None and not is_compiling()``, as LongT5's
and Switch Transformers' encoders build their attention mask) then failed
under torch.compile where eager runs.
"""

import json
import os
import shutil
import tempfile

import torch
import torch._dynamo.test_case
from torch._dynamo.testing import CompileCounter
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)
from torch.testing._internal.fresh_process import run_code


def _rows(mask):
    return mask.shape[0]


def _broadcast(mask):
    return mask[None, :]


def _use_attribute(x, mask):
    return x * _rows(mask)


def _use_subscript(x, mask):
    return x * _broadcast(mask)


USES = {"attribute": _use_attribute, "subscript": _use_subscript}


def _mask_built_in_eager_only(use):
    def fn(x, mask=None):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones_like(x)
        return use(x, mask)

    return fn


class Encoder(torch.nn.Module):
    """The pattern of LongT5's encoder: the mask is built only in eager, a
    submodule reads it."""

    def __init__(self):
        super().__init__()
        self.block = Block()

    def forward(self, x, mask=None):
        if mask is None and not torch.compiler.is_compiling():
            mask = torch.ones_like(x)
        return self.block(x, mask[None, :])


class Block(torch.nn.Module):
    def forward(self, x, mask):
        return (x * mask).sin() + x.cos()


LOAD_ENCODER = """
import sys, torch
from torch._dynamo.utils import counters
from torch.testing._internal.fresh_process import write_report
sys.path.insert(0, {test_dir!r})
from test_constant_fold_exceptions import Encoder
torch.manual_seed(0)
encoder = Encoder()
compiled = torch.compile(encoder, backend="eager", package={package!r})
compiled.load_package()
x = torch.randn(6)
with torch.compiler.set_stance("fail_on_recompile"):
    out = compiled(x)
write_report({{
    "same": bool(torch.equal(out, encoder(x))),
    "traced_graphs": counters["stats"]["unique_graphs"],
}})
"""


class TestConstantFoldExceptions(torch._dynamo.test_case.TestCase):
    @parametrize("use", sorted(USES))
    def test_value_built_only_in_eager(self, use):
        fn = _mask_built_in_eager_only(USES[use])
        x = torch.randn(3)
        expected = fn(x)
        counter = CompileCounter()
        self.assertEqual(torch.compile(fn, backend=counter)(x), expected)

    @parametrize("use", sorted(USES))
    def test_handler_catches_it_in_the_graph(self, use):
        error = AttributeError if use == "attribute" else TypeError

        def fn(x, mask=None):
            try:
                return USES[use](x, mask)
            except error:
                return x + 1

        x = torch.randn(3)
        counter = CompileCounter()
        self.assertEqual(torch.compile(fn, backend=counter, fullgraph=True)(x), x + 1)
        self.assertEqual(counter.frame_count, 1)

    def test_constant_arithmetic_raises_its_exception(self):
        def fn(x, n):
            try:
                return x * (10 // n)
            except ZeroDivisionError:
                return x - 1

        x = torch.randn(3)
        compiled = torch.compile(fn, backend="eager", fullgraph=True)
        self.assertEqual(compiled(x, 0), x - 1)
        self.assertEqual(compiled(x, 5), x * 2)

    def test_uncaught_exception_still_raises(self):
        def fn(x):
            return x * None.shape

        with self.assertRaisesRegex(AttributeError, "shape"):
            torch.compile(fn, backend="eager")(torch.randn(3))

    def test_package_saves_and_loads_in_a_fresh_process(self):
        # The encoder's frame falls back to eager (its mask is built there);
        # the block's frame is compiled, packaged and loaded.
        tmp = tempfile.mkdtemp(prefix="test_constant_fold_exceptions_")
        self.addCleanup(shutil.rmtree, tmp, True)
        package = os.path.join(tmp, "encoder")
        torch.manual_seed(0)
        encoder = Encoder()
        compiled = torch.compile(encoder, backend="eager", package=package)
        x = torch.randn(6)
        self.assertEqual(compiled(x), encoder(x))
        compiled.save_package()
        with open(os.path.join(package, "manifest.json")) as f:
            self.assertGreater(json.load(f)["entries"], 0)
        test_dir = os.path.dirname(os.path.abspath(__file__))
        report = run_code(LOAD_ENCODER.format(test_dir=test_dir, package=package))
        self.assertEqual(report, {"same": True, "traced_graphs": 0})


instantiate_parametrized_tests(TestConstantFoldExceptions)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
