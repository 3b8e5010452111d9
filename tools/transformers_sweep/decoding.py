"""Greedy decoding of a tiny model, spelled the five ways the sweep compiles.

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
# d. The same generate() of left-padded batches (PADDED_BATCHES: at the save's
#    prompt length batches of 2 and 3 rows, at the load's batches of 4 and 5:
#    batch sizes never seen at save), the tokens of every row compared.
#    Batch 1 is a size of its own (0/1 specialization), so neither phase has it.
# e. generate() with a static cache, as c, where the model supports one
#    (_supports_static_cache; eager fails where it does not). The model gets
#    a StaticCache of STATIC_CACHE_LENGTH positions passed in, the same size
#    in both phases, as a server sizes it once: generate's own
#    cache_implementation="static" sizes the cache by each call's prompt and
#    new tokens, and a static cache's tensors keep their shapes (Dynamo takes
#    them as static inputs), so every new length recompiles without any
#    package too. An encoder-decoder gets that cache for its decoder's
#    self-attention, in an EncoderDecoderCache beside a cross-attention
#    StaticCache as long as the encoder's input (the encoder's output fills
#    it), which is what generate() builds there. Both caches are built from
#    config.get_text_config(), as generate() builds them.
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
    "d": "generate() of left-padded batches over the compiled forward, batch sizes never seen at save",
    "e": "generate() with a static cache over the compiled forward",
}
STATIC_CACHE_LENGTH = 32
# The spellings that call generate() over model.forward = torch.compile(model.forward).
GENERATE_SPELLINGS = ("c", "d", "e")
# Row lengths of the padded batches spelling d generates, by the phase's prompt
# length (tools/transformers_sweep/sweep_phase.py: 5 at save, 9 at load).
PADDED_BATCHES: dict[int, tuple[tuple[int, ...], ...]] = {
    5: ((5, 3), (7, 4, 6)),
    9: ((9, 6, 4, 8), (8, 2, 7, 5, 3)),
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


def _pad_id(model) -> int:
    pad = getattr(getattr(model, "generation_config", None), "pad_token_id", None)
    return pad if isinstance(pad, int) else 0


def greedy_generate(
    model, ids: torch.Tensor, new_tokens: int, attention_mask: Optional[torch.Tensor] = None, **options
) -> Decoded:
    """generate()'s greedy tokens of every row of ``ids`` (one list), and
    the logits of the first row."""
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids) if attention_mask is None else attention_mask,
            max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, num_beams=1,
            pad_token_id=_pad_id(model), output_logits=True, return_dict_in_generate=True, **options,
        )
    sequences = getattr(out, "sequences", out)
    step_logits = getattr(out, "logits", None)
    # MusicGen returns (batch, codebooks, length).
    tokens = [t for row in sequences for t in row.flatten()[-new_tokens:].tolist()]
    if not step_logits:
        return Decoded(tokens, None)
    return Decoded(tokens, torch.stack([step[0].flatten().float() for step in step_logits]))


def left_padded(model, lengths: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of prompts of ``lengths``, left-padded, and its attention mask."""
    width = max(lengths)
    ids = torch.full((len(lengths), width), _pad_id(model), dtype=torch.long)
    mask = torch.zeros((len(lengths), width), dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = prompt(model.config, length)[0]
        mask[row, width - length :] = 1
    return ids, mask


def static_cache_generate(model, ids: torch.Tensor, new_tokens: int) -> Decoded:
    """Spelling e: generate() with a static cache (NOTE: [Sweep spellings])."""
    if not getattr(model, "_supports_static_cache", False):
        raise ValueError(f"{type(model).__name__} does not support a static cache (_supports_static_cache)")
    from transformers import EncoderDecoderCache, StaticCache

    def static_cache(length: int) -> StaticCache:
        return StaticCache(
            config=model.config.get_text_config(), max_batch_size=ids.shape[0],
            max_cache_len=length, device=ids.device, dtype=model.dtype,
        )

    cache = static_cache(STATIC_CACHE_LENGTH)
    if is_encoder_decoder(model):
        cache = EncoderDecoderCache(cache, static_cache(ids.shape[-1]))
    return greedy_generate(model, ids, new_tokens, past_key_values=cache)


def padded_generate(model, length: int, new_tokens: int) -> Decoded:
    """Spelling d: generate() of PADDED_BATCHES[length], one batch after the other."""
    tokens: list[int] = []
    logits = []
    for lengths in PADDED_BATCHES[length]:
        ids, mask = left_padded(model, lengths)
        decoded = greedy_generate(model, ids, new_tokens, attention_mask=mask)
        tokens += decoded.tokens
        logits.append(decoded.logits)
    if any(part is None for part in logits):
        return Decoded(tokens, None)
    return Decoded(tokens, torch.cat(logits))


def decode(spelling: str, fn: Callable, model, ids: torch.Tensor, new_tokens: int) -> Decoded:
    """The greedy decode of ``spelling``. ``fn`` is what a and b call (the
    model or torch.compile of it); c calls ``model.generate``."""
    if spelling == "a":
        return greedy_loop(fn, model, ids, new_tokens)
    if spelling == "b":
        return greedy_loop(fn, model, ids, new_tokens, cache=default_cache(model))
    if spelling == "c":
        return greedy_generate(model, ids, new_tokens)
    if spelling == "d":
        return padded_generate(model, ids.shape[-1], new_tokens)
    if spelling == "e":
        return static_cache_generate(model, ids, new_tokens)
    raise ValueError(f"unknown spelling {spelling!r}; known: {sorted(SPELLINGS)}")


def max_logit_difference(a: Decoded, b: Decoded) -> Optional[float]:
    """The largest absolute difference of two decodes' logits, where both have
    them and their shapes agree."""
    if a.logits is None or b.logits is None or a.logits.shape != b.logits.shape:
        return None
    return float((a.logits - b.logits).abs().max())


def compile_for(spelling: str, model, **options) -> Callable:
    """Compiles what ``spelling`` runs with ``options``; returns what
    :func:`decode` calls as ``fn`` (c, d and e compile model.forward in place)."""
    if spelling in GENERATE_SPELLINGS:
        model.forward = torch.compile(model.forward, **options)
        return model
    return torch.compile(model, **options)


def package_holder(spelling: str, fn: Callable, model):
    """The compiled object whose save_package() / load_package() a spelling uses."""
    return model.forward if spelling in GENERATE_SPELLINGS else fn
