"""The serving row of the load-time benchmark (``load_time.py --serving``).

The tiny Llama of test/dynamo/test_package_serving.py (GQA, rotary embeddings;
transformers 4.52.4, local config, seed 0, no Hugging Face hub download) and
what a serving worker does with it: a prefill of a prompt into a DynamicCache,
then greedy decode steps. The first generated token is the argmax of the
prefill's last logits. The model, the prompts and the decode loop are the
behaviour diff's serving probes' (tools/behaviour_diff/precompile_probes.py),
so the benchmark measures what the probes check.
"""

import functools
import os
import sys
from pathlib import Path

import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "behaviour_diff"))

from precompile_probes import (
    build_serving_model,
    first_token,
    greedy_decode,
    prefill,
    serving_prompt as prompt,
)


# What the package (or upstream's cache) is saved after, and the prompt the
# measured process serves: a length never seen at save.
SAVE_PROMPT, SAVE_STEPS = 5, 6
SERVE_PROMPT = 9


def serve(fn, input_ids: torch.Tensor, steps: int) -> list[int]:
    """A prefill and ``steps`` greedy decode steps, each a call of ``fn``."""
    return greedy_decode(fn, prefill(fn, input_ids), steps)


MODELS = {"llama": functools.partial(build_serving_model, "llama")}
__all__ = ["MODELS", "SAVE_PROMPT", "SAVE_STEPS", "SERVE_PROMPT", "first_token", "prompt", "serve"]
