# Owner(s): ["module: dynamo"]
"""A slice with its end omitted guards nothing about sys.maxsize.

slice_forward stands an omitted end in as sys.maxsize. torch 2.7.1 compared it
with the start before deciding it is the size, so ``x[:, w:]`` with a dynamic
``w`` guarded ``w <= 9223372036854775807``: a finite upper bound on ``w``, from
which later solving (an equality such as ``n == 2*w + 1``) rounded its way into
"tgt_bound ... not a subset of src_bound" (LED's sliding-window attention under
dynamic=True, the transformers sweep). The omitted end is decided first.
"""

import sys

import torch
import torch._dynamo.test_case
from torch._guards import TracingContext


class ShapeGuardRecorder:
    """A backend that keeps the shape guards of each graph it compiles."""

    def __init__(self):
        self.guards = []

    def __call__(self, gm, example_inputs):
        shape_env = TracingContext.get().fake_mode.shape_env
        self.guards += [str(guard.expr) for guard in shape_env.guards]
        return gm.forward


def copy_diagonals(out, scores, w):
    # LED's _sliding_chunks_query_key_matmul, whose compile crashed.
    out[:, :-1, :, w:] = scores[:, :, :w, : w + 1]
    out[:, -1, :, w:] = scores[:, -1, w:, : w + 1]
    out[:, 1:, :, :w] = scores[:, :, -(w + 1) : -1, w + 1 :]
    out[:, 0, 1:w, 1:w] = scores[:, 0, : w - 1, 1 - w :]
    return out


class TestSliceOmittedEnd(torch._dynamo.test_case.TestCase):
    def test_no_guard_on_sys_maxsize(self):
        recorder = ShapeGuardRecorder()

        @torch.compile(backend=recorder, dynamic=True)
        def tail(x, w):
            return x[:, w:] * 2

        x = torch.randn(3, 8)
        self.assertEqual(tail(x, 3), x[:, 3:] * 2)
        self.assertTrue(recorder.guards)
        # Ne(size, sys.maxsize) bounds nothing; an inequality would.
        bounds = [
            g
            for g in recorder.guards
            if str(sys.maxsize) in g and not g.startswith("Ne(")
        ]
        self.assertEqual(bounds, [])

    def test_sliding_window_copies_compile(self):
        out = torch.zeros(4, 4, 2, 5)
        scores = torch.randn(4, 3, 4, 5)
        expected = copy_diagonals(out.clone(), scores, 2)
        compiled = torch.compile(copy_diagonals, backend="aot_eager", dynamic=True)
        self.assertEqual(compiled(out.clone(), scores, 2), expected)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
