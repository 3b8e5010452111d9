"""The serving row of the load-time benchmark (``load_time.py --serving``).

The tiny Llama of test/dynamo/test_package_serving.py (GQA, rotary embeddings;
transformers 4.52.4, local config, seed 0, no Hugging Face hub download) and
what a serving worker does with it: a prefill of a prompt into a DynamicCache,
then greedy decode steps. The first generated token is the argmax of the
prefill's last logits.
"""

import os

import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")

# What the package (or upstream's cache) is saved after, and the prompt the
# measured process serves: a length never seen at save.
SAVE_PROMPT, SAVE_STEPS = 5, 6
SERVE_PROMPT = 9


def make_llama():
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
    )
    return transformers.LlamaForCausalLM(config).eval()


def prompt(length: int) -> torch.Tensor:
    return torch.randint(0, 100, (1, length), generator=torch.Generator().manual_seed(length))


def prefill(fn, input_ids: torch.Tensor):
    from transformers import DynamicCache

    with torch.no_grad():
        return fn(input_ids=input_ids, past_key_values=DynamicCache(), use_cache=True)


def first_token(fn, input_ids: torch.Tensor) -> int:
    """The first generated token: a prefill of ``input_ids``, greedy."""
    return int(prefill(fn, input_ids).logits[0, -1].argmax())


def serve(fn, input_ids: torch.Tensor, steps: int) -> list[int]:
    """A prefill and ``steps`` greedy decode steps, each a call of ``fn``."""
    out = prefill(fn, input_ids)
    tokens = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            out = fn(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return tokens


MODELS = {"llama": make_llama}
