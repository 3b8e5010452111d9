"""Greedy decoding of a tiny model, spelled the three ways the sweep compiles.

Provides :data:`SPELLINGS` (letter -> what it is), :func:`prompt` (a seeded
prompt without special tokens), :func:`decode` (the greedy tokens of one
spelling, over an eager or a compiled model, with the logits they were chosen
from: a :class:`Decoded`), :func:`max_logit_difference` and :func:`compile_for` /
:func:`package_holder` (what each spelling compiles, and which object saves and
loads its package).
"""

# NOTE: [Sweep spellings]
# a. A greedy loop over torch.compile(model): the prefill passes
#    past_key_values=None, use_cache=True and the model builds its own cache;
#    each step passes the returned cache back with the one new token. An
#    encoder-decoder's prefill passes input_ids and the decoder start token,
#    its steps decoder_input_ids, encoder_outputs and the cache.
# b. The same loop, the prefill passing the model's default cache object:
#    DynamicCache(), or EncoderDecoderCache(DynamicCache(), DynamicCache()).
# c. model.generate() (greedy, exactly new_tokens tokens) over
#    model.forward = torch.compile(model.forward), as Hugging Face documents.
# A loop's k new tokens take k forward calls (a prefill and k - 1 steps).
# A model whose forward takes no past_key_values, or returns none, cannot be
# decoded by a and b; that is its eager failure, reported as such.

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

import torch

from shrink import special_token_ids

log = logging.getLogger(__name__)

SPELLINGS: dict[str, str] = {
    "a": "greedy loop over torch.compile(model), prefill with past_key_values=None",
    "b": "greedy loop over torch.compile(model), prefill with the default cache object",
    "c": "generate() over model.forward = torch.compile(model.forward)",
}


def prompt(config, length: int) -> torch.Tensor:
    """A (1, length) prompt, seeded by its length, of ids that are no special token."""
    vocab = config.get_text_config(decoder=True).vocab_size
    special = special_token_ids(config)
    allowed = torch.tensor([t for t in range(vocab) if t not in special])
    picks = torch.randint(0, len(allowed), (1, length), generator=torch.Generator().manual_seed(length))
    return allowed[picks]


def decoder_start(model) -> int:
    for source in (getattr(model, "generation_config", None), model.config):
        for name in ("decoder_start_token_id", "pad_token_id", "bos_token_id"):
            value = getattr(source, name, None)
            if isinstance(value, int):
                return value
    return 0


def is_encoder_decoder(model) -> bool:
    """Whether the loops feed ``model`` decoder inputs: what its config says
    (the seq2seq mapping holds decoder-only classes too, e.g. Qwen2Audio)."""
    return bool(getattr(model.config, "is_encoder_decoder", False))


def default_cache(model):
    from transformers import DynamicCache, EncoderDecoderCache

    if is_encoder_decoder(model):
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return DynamicCache()


@dataclasses.dataclass
class Decoded:
    """A decode's greedy tokens, and the logits each was chosen from (one row
    per token; None where generate() gives none back)."""

    tokens: list[int]
    logits: Optional[torch.Tensor]


def greedy_loop(fn: Callable, model, ids: torch.Tensor, new_tokens: int, cache=None) -> Decoded:
    """``new_tokens`` greedy tokens of ``fn`` (the model or its compiled form),
    a forward call each (NOTE: [Sweep spellings])."""
    from transformers.modeling_outputs import BaseModelOutput

    encoder_decoder = is_encoder_decoder(model)
    kwargs: dict[str, Any] = {"input_ids": ids, "past_key_values": cache, "use_cache": True}
    if encoder_decoder:
        kwargs["decoder_input_ids"] = torch.tensor([[decoder_start(model)]])
    tokens: list[int] = []
    logits: list[torch.Tensor] = []
    with torch.no_grad():
        out = fn(**kwargs)
        while True:
            logits.append(out.logits[0, -1].float())
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            if len(tokens) == new_tokens:
                return Decoded(tokens, torch.stack(logits))
            past = getattr(out, "past_key_values", None)
            if past is None:
                raise RuntimeError(f"{type(model).__name__} returned no past_key_values")
            kwargs = {"past_key_values": past, "use_cache": True}
            if encoder_decoder:
                encoder_outputs = BaseModelOutput(last_hidden_state=out.encoder_last_hidden_state)
                kwargs.update(decoder_input_ids=nxt, encoder_outputs=encoder_outputs)
            else:
                kwargs["input_ids"] = nxt
            out = fn(**kwargs)


def greedy_generate(model, ids: torch.Tensor, new_tokens: int) -> Decoded:
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
            min_new_tokens=new_tokens, do_sample=False, num_beams=1,
            pad_token_id=pad if isinstance(pad, int) else 0,
            output_logits=True, return_dict_in_generate=True,
        )
    sequences = getattr(out, "sequences", out)
    step_logits = getattr(out, "logits", None)
    # MusicGen returns (batch, codebooks, length).
    tokens = sequences[0].flatten()[-new_tokens:].tolist()
    if not step_logits:
        return Decoded(tokens, None)
    return Decoded(tokens, torch.stack([step[0].flatten().float() for step in step_logits]))


def decode(spelling: str, fn: Callable, model, ids: torch.Tensor, new_tokens: int) -> Decoded:
    """The greedy decode of ``spelling``. ``fn`` is what a and b call (the
    model or torch.compile of it); c calls ``model.generate``."""
    if spelling == "a":
        return greedy_loop(fn, model, ids, new_tokens)
    if spelling == "b":
        return greedy_loop(fn, model, ids, new_tokens, cache=default_cache(model))
    if spelling == "c":
        return greedy_generate(model, ids, new_tokens)
    raise ValueError(f"unknown spelling {spelling!r}; known: {sorted(SPELLINGS)}")


def max_logit_difference(a: Decoded, b: Decoded) -> Optional[float]:
    """The largest absolute difference of two decodes' logits, where both have
    them and their shapes agree."""
    if a.logits is None or b.logits is None or a.logits.shape != b.logits.shape:
        return None
    return float((a.logits - b.logits).abs().max())


def compile_for(spelling: str, model, **options) -> Callable:
    """Compiles what ``spelling`` runs with ``options``; returns what
    :func:`decode` calls as ``fn`` (c compiles model.forward in place)."""
    if spelling == "c":
        model.forward = torch.compile(model.forward, **options)
        return model
    return torch.compile(model, **options)


def package_holder(spelling: str, fn: Callable, model):
    """The compiled object whose save_package() / load_package() a spelling uses."""
    return model.forward if spelling == "c" else fn
