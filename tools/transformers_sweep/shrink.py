"""Tiny configs for every text-generating architecture of transformers, from one shrink.

The transformers sweep (``sweep.py``) builds each architecture of transformers
4.52.4's ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and
``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES`` from a config small enough to
build, compile and decode in CPU seconds, never from the hub.

Provides :func:`tiny_config` (``model_type`` -> a shrunk ``PretrainedConfig``),
:func:`tiny_config_from` (the shrink of any config instance), :func:`default_config`,
:func:`architectures` (the sweep's architecture ids and their model classes),
:func:`build_model`, :func:`special_token_ids`, and the tables they read:
:data:`SHRUNK_SIZES`, :data:`SWITCHED_ON`, :data:`SWITCHED_OFF`, :data:`OVERRIDES`,
:data:`COMPOSED_OF`.
"""

# NOTE: [One shrink for every architecture]
# A config class's defaults describe the published checkpoint (thousands of
# hidden units, dozens of layers, a 32k-256k vocabulary). One generic function
# shrinks them all: every attribute the default config has that plays one of
# the roles in SHRUNK_SIZES (hidden size, layers, heads, key/value heads,
# head dim, intermediate size, vocabulary, positions, experts, windows, state
# sizes ...) is lowered to that role's value, never raised; attributes the
# class does not have are never added. The values are passed to the config
# class's own constructor, so that whatever it derives from them (layer-type
# lists, head dims, time-step ranks) is derived from the tiny sizes; a value
# the constructor ignores is set afterwards. Then the few constraints that tie
# sizes together are restored generically: key/value heads divide heads (and
# stay equal to them where the default has multi-head attention), explicit
# head dims become hidden // heads, rotary dims fit in a head, per-layer lists
# are cut to the new number of layers, special token ids past the new
# vocabulary are renumbered below it, an encoder-decoder without a decoder
# start token starts from its pad token (as T5's checkpoints do). Sub-configs
# (a text_config, a vision_config, dbrx's attn_config) are shrunk by the same
# function. Features off by default that the sweep should exercise are turned
# on (SWITCHED_ON: Qwen2's sliding window), those CPU torch cannot run off
# (SWITCHED_OFF). build_model adds one rule of use: a causal-LM class is built
# with is_decoder=True, as the causal-LM classes of encoder models need.
#
# Where the generic shrink cannot work, OVERRIDES gives values per model type,
# each with the reason; an architecture that still does not build, or whose
# eager decode fails, is reported as such by the sweep, not patched here until
# it passes.

from __future__ import annotations

import copy
import dataclasses
import logging
import os
from typing import Any


os.environ.setdefault("HF_HUB_OFFLINE", "1")

log = logging.getLogger(__name__)

HIDDEN = 32
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 64
VOCAB = 128
POSITIONS = 64
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
# Shorter than both prompts of the sweep (5 and 9 tokens), so that windowed
# attention really drops keys.
WINDOW = 4
STATE = 8

# role -> (its value, the attribute names that play it in some config class).
# An attribute is lowered to the value, never raised.
SHRUNK_SIZES: dict[str, tuple[int, tuple[str, ...]]] = {
    "hidden size": (HIDDEN, (
        "hidden_size", "d_model", "n_embd", "n_embed", "embed_dim", "d_embed", "emb_dim",
        "embedding_size", "word_embed_proj_dim", "input_embedding_size", "output_embedding_size",
        "lru_width", "hidden_dim",
    )),
    "layers": (LAYERS, (
        "num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
        "decoder_layers", "num_encoder_layers", "num_decoder_layers", "speech_encoder_layers",
        "num_switch_layers",
    )),
    "heads": (HEADS, (
        "num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
        "decoder_attention_heads", "num_encoder_attention_heads", "num_decoder_attention_heads",
        "attention_heads", "speech_encoder_attention_heads", "mamba_n_heads", "n_mamba_heads",
    )),
    "key/value heads": (KV_HEADS, (
        "num_key_value_heads", "num_kv_heads", "n_kv_heads", "kv_n_heads", "num_query_groups",
        "multi_query_group_num",
    )),
    "intermediate size": (INTERMEDIATE, (
        "intermediate_size", "ffn_dim", "d_ff", "n_inner", "encoder_ffn_dim", "decoder_ffn_dim",
        "moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
        "ffn_hidden_size", "d_inner", "dim_ff", "dff", "intermediate_size_mlp",
        "feed_forward_size", "nffn_hidden_size", "speech_encoder_intermediate_size",
    )),
    "vocabulary": (VOCAB, ("vocab_size", "src_vocab_size", "tgt_vocab_size", "decoder_vocab_size")),
    "positions": (POSITIONS, (
        "max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "max_sequence_length",
        "max_target_positions", "max_source_positions", "max_encoder_position_embeddings",
        "max_decoder_position_embeddings", "max_positions", "context_length",
        # Llama 4's attention chunks: as long as the longest sequence, not a
        # window (chunks shorter than the prompt fail eager decoding in 4.52.4:
        # a None attention mask sliced in the loop, a mask size mismatch in
        # generate()).
        "attention_chunk_size",
    )),
    "experts": (EXPERTS, ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")),
    "experts per token": (EXPERTS_PER_TOKEN, ("num_experts_per_tok", "moe_top_k", "moe_topk")),
    # DeepSeek's grouped routing: the groups must divide the (now 4) experts.
    "expert groups": (1, ("n_group", "topk_group")),
    # Layers before the first MoE layer: one, so that a two-layer model has one.
    "dense layers first": (1, ("first_k_dense_replace",)),
    "window": (WINDOW, (
        "sliding_window", "attention_window", "window_size", "attention_window_size",
        "local_radius",
    )),
    # Qwen2's windowed layers are those from max_window_layers on: the second.
    "unwindowed layers": (1, ("max_window_layers",)),
    "latent ranks": (16, ("kv_lora_rank", "q_lora_rank")),
    "latent head dims": (HIDDEN // HEADS, ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")),
    "state size": (STATE, ("state_size", "mamba_d_state", "time_step_rank", "mamba_dt_rank")),
    "SSM groups": (1, ("n_groups", "mamba_n_groups", "mamba_ngroups")),
}

# Derived from hidden // heads after the shrink, when the default is an int.
HEAD_DIM_ATTRIBUTES = (
    "head_dim", "d_kv", "d_head", "dim_head", "attention_head_dim", "attention_head_size",
    "kv_channels",
)
# Rotary dims cannot exceed a head.
ROTARY_DIM_ATTRIBUTES = ("rotary_dim", "rotary_emb_dim")
# Attributes whose names say they are special token ids.
TOKEN_ID_SUFFIXES = ("_token_id", "_token_ids", "_token_index")

# Features a config has, off by default, that the tiny model turns on so that
# the sweep exercises them (Qwen2/Qwen3's sliding window).
SWITCHED_ON: tuple[str, ...] = ("use_sliding_window",)
# Features on by default that CPU-only torch cannot run: the fused Mamba CUDA
# kernels (Jamba raises when they are requested and missing).
SWITCHED_OFF: tuple[str, ...] = ("use_mamba_kernels",)

# The config class's model_type -> values given to its constructor and set
# after the generic shrink, each with its reason.
OVERRIDES: dict[str, dict[str, Any]] = {
    # Mamba2 checks hidden_size * expand == num_heads * head_dim (2 * 32 = 4 * 16).
    "mamba2": {"head_dim": 16},
    # The axial position embedding's dims must add up to hidden_size, and its
    # shape must multiply to the longest sequence (8 * 8 = POSITIONS).
    "reformer": {"axial_pos_embds_dim": [16, 16], "axial_pos_shape": (8, 8)},
    # Zamba's layer pattern always starts mamba, mamba, hybrid: three layers
    # have one hybrid (attention) layer.
    "zamba": {"num_hidden_layers": 3},
    # Zamba2's Mamba mixer needs mamba_expand * hidden_size == n_mamba_heads *
    # mamba_headdim (2 * 32 = 4 * 16). Its default layer pattern is a literal
    # 54-layer list: two layers, the second hybrid (attention), as in every
    # checkpoint's pattern.
    "zamba2": {"mamba_headdim": 16, "layers_block_type": ["mamba", "hybrid"]},
    # Bamba's default has no attention layer (attn_layer_indices None), its
    # hybrid cache then fails; the checkpoints have some: the second layer.
    "bamba": {"attn_layer_indices": [1]},
    # Jamba's attention layers are every 8th from the 4th, MoE every 2nd from
    # the 1st: two layers would have no attention; the second has both.
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # The class default names no layer pattern (None), which the model indexes;
    # every checkpoint names one.
    "granitemoehybrid": {"layer_types": ["mamba", "attention"]},
    # The class default has no rope_scaling, which the model indexes; the
    # checkpoints' rope type is llama3, here the plain one.
    "mllama_text_model": {"rope_scaling": {"rope_type": "default"}},
    # The class default has no key/value head count (None), which the model
    # divides by; every checkpoint names one.
    "nemotron": {"num_key_value_heads": KV_HEADS},
    # GPT-Neo expands attention_types ([pattern, repeats]) into one entry per
    # layer, which must match num_layers.
    "gpt_neo": {"attention_types": [[["global", "local"], 1]], "attention_layers": ["global", "local"]},
    # Its input_ids hold one row per codebook: with one, a (1, n) prompt is valid.
    # generate() starts from decoder_start_token_id, which the checkpoints'
    # generation configs set to their bos/pad id (2048: renumbered to the last).
    "musicgen_decoder": {"num_codebooks": 1, "decoder_start_token_id": VOCAB - 1},
    "musicgen_melody_decoder": {"num_codebooks": 1, "decoder_start_token_id": VOCAB - 1},
    # The adaptive softmax's cutoffs must lie inside the (now 128-token) vocabulary.
    "transfo-xl": {"cutoffs": [32, 64]},
    # X-MOD routes through per-language adapters and refuses input without a
    # language; its first (default) one.
    "xmod": {"default_language": "en_XX"},
    # EncoderDecoderModel has no start or pad token of its own; its documentation
    # sets BERT's [CLS] and [PAD].
    "encoder-decoder": {"decoder_start_token_id": 101, "pad_token_id": 0},
}

# model_type -> the model types of the sub-configs its default is composed of,
# where its constructor has no default of its own.
COMPOSED_OF: dict[str, tuple[str, str]] = {
    # EncoderDecoderModel needs an encoder and a decoder config: BERT on both
    # sides, as in its documentation's example.
    "encoder-decoder": ("bert", "bert"),
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _size_values(default) -> dict[str, Any]:
    """The shrunk values of the size attributes ``default`` has."""
    from transformers import PretrainedConfig

    attributes = vars(default)
    values: dict[str, Any] = {}
    for value, names in SHRUNK_SIZES.values():
        for name in names:
            current = attributes.get(name)
            if _is_int(current) and current > value:
                values[name] = value
            elif isinstance(current, list) and current and all(_is_int(v) for v in current):
                # Per-layer sizes (Longformer-style attention windows).
                if name in SHRUNK_SIZES["window"][1]:
                    values[name] = [min(v, value) for v in current]
    for name in SWITCHED_ON:
        if attributes.get(name) is False:
            values[name] = True
    for name in SWITCHED_OFF:
        if attributes.get(name) is True:
            values[name] = False
    for name, current in attributes.items():
        if isinstance(current, PretrainedConfig):
            values[name] = tiny_config_from(current)
    return values


def _layer_count(attributes: dict[str, Any]) -> int | None:
    for name in SHRUNK_SIZES["layers"][1]:
        if _is_int(attributes.get(name)):
            return attributes[name]
    return None


def _restore_constraints(default, config) -> None:
    """Sizes that depend on each other, made consistent again (NOTE: [One
    shrink for every architecture])."""
    attributes = vars(config)
    heads = next(
        (attributes[n] for n in SHRUNK_SIZES["heads"][1] if _is_int(attributes.get(n))), None
    )
    hidden = next(
        (attributes[n] for n in SHRUNK_SIZES["hidden size"][1] if _is_int(attributes.get(n))), None
    )
    if heads:
        default_heads = next(
            (getattr(default, n) for n in SHRUNK_SIZES["heads"][1] if _is_int(getattr(default, n, None))),
            None,
        )
        for name in SHRUNK_SIZES["key/value heads"][1]:
            kv = attributes.get(name)
            if not _is_int(kv):
                continue
            if getattr(default, name) == default_heads:
                # Multi-head attention stays so (DeepSeek's latent attention
                # has no grouped form).
                setattr(config, name, heads)
            elif heads % kv:
                setattr(config, name, 1)
    if heads and hidden:
        head_dim = max(hidden // heads, 2)
        for name in HEAD_DIM_ATTRIBUTES:
            if _is_int(attributes.get(name)) and attributes[name] > head_dim:
                setattr(config, name, head_dim)
        for name in ROTARY_DIM_ATTRIBUTES:
            if _is_int(attributes.get(name)) and attributes[name] > head_dim:
                setattr(config, name, head_dim)
    old_layers, new_layers = _layer_count(vars(default)), _layer_count(attributes)
    if old_layers and new_layers and new_layers < old_layers:
        for name, value in list(attributes.items()):
            if isinstance(value, (list, tuple)) and len(value) == old_layers:
                setattr(config, name, type(value)(value[:new_layers]))
    vocab = attributes.get("vocab_size")
    if _is_int(vocab):
        _renumber_token_ids(config, vocab)
    if getattr(config, "is_encoder_decoder", False) and getattr(config, "decoder_start_token_id", 0) is None:
        # Published encoder-decoder checkpoints name their decoder start token
        # in config.json, the class defaults of some (T5, LongT5, Switch) do
        # not; T5's is its pad token.
        config.decoder_start_token_id = config.pad_token_id


def _renumber_token_ids(config, vocab: int) -> None:
    """Special token ids past ``vocab``, renumbered from the top of the
    vocabulary down (distinct ids stay distinct)."""
    renumbered: dict[int, int] = {}

    def below(token: int) -> int:
        if token < vocab:
            return token
        if token not in renumbered:
            renumbered[token] = vocab - 1 - len(renumbered)
        return renumbered[token]

    for name, value in list(vars(config).items()):
        if not name.endswith(TOKEN_ID_SUFFIXES):
            continue
        if _is_int(value):
            setattr(config, name, below(value))
        elif isinstance(value, list) and all(_is_int(v) for v in value):
            setattr(config, name, [below(v) for v in value])


def tiny_config_from(default):
    """``default`` (a config instance) shrunk: a new instance of its class."""
    from transformers import PretrainedConfig

    cls = type(default)
    model_type = getattr(cls, "model_type", "")
    values = _size_values(default)
    overrides = OVERRIDES.get(model_type, {})
    sizes = {k: v for k, v in values.items() if not isinstance(v, PretrainedConfig)}
    if model_type in COMPOSED_OF:
        # Its constructor wants its parts as dicts of their own kind.
        config = copy.deepcopy(default)
    else:
        config = cls(**{**_set_apart_from_defaults(default), **sizes, **overrides})
    for name, value in values.items():
        if getattr(config, name, None) != value:
            setattr(config, name, value)
    _restore_constraints(default, config)
    for name, value in overrides.items():
        setattr(config, name, value)
    return config


def _set_apart_from_defaults(config) -> dict[str, Any]:
    """What ``config`` sets differently from its class's defaults (a composed
    config's parts: an encoder-decoder's decoder has is_decoder=True)."""
    from transformers import PretrainedConfig

    defaults = vars(type(config)())
    return {
        name: value
        for name, value in vars(config).items()
        if name in defaults and defaults[name] != value and not isinstance(value, PretrainedConfig)
    }


def default_config(model_type: str, class_name: str | None = None):
    """The default config of ``model_type``, of the class that ``class_name``
    (a model class) is built from when given (MusicgenForCausalLM takes a
    MusicgenDecoderConfig, not the MusicgenConfig of its model type)."""
    import transformers
    from transformers import CONFIG_MAPPING

    cls = getattr(transformers, class_name).config_class if class_name else CONFIG_MAPPING[model_type]
    parts = COMPOSED_OF.get(model_type)
    if parts:
        encoder, decoder = (CONFIG_MAPPING[part]() for part in parts)
        return cls.from_encoder_decoder_configs(encoder, decoder)
    return cls()


def tiny_config(model_type: str, class_name: str | None = None):
    """The tiny config of ``model_type`` (NOTE: [One shrink for every
    architecture]); of ``class_name``'s config class when given."""
    return tiny_config_from(default_config(model_type, class_name))


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One model class of the sweep: ``id`` is its model type, with ``seq2seq:``
    in front for the seq2seq mapping's class of a model type the causal-LM
    mapping has too (bart has BartForCausalLM and BartForConditionalGeneration)."""

    id: str
    model_type: str
    class_name: str
    # Which mapping the class is from (its config says whether it is an
    # encoder-decoder: the seq2seq mapping holds decoder-only Qwen2Audio).
    mapping: str


def architectures() -> dict[str, Architecture]:
    """Every class of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and
    MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, by sweep id."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
    )

    found = {
        t: Architecture(t, t, c, "causal-lm") for t, c in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()
    }
    for t, c in MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES.items():
        arch_id = f"seq2seq:{t}" if t in found else t
        found[arch_id] = Architecture(arch_id, t, c, "seq2seq-lm")
    return found


def build_model(arch: Architecture, seed: int = 0):
    """``arch``'s model from its tiny config, seeded, in eval mode."""
    import torch
    import transformers

    config = tiny_config(arch.model_type, arch.class_name)
    if arch.mapping == "causal-lm":
        # The causal-LM classes of encoder models (BERT, RoBERTa, Reformer ...)
        # attend causally and return a cache only as decoders: their
        # documentation loads them with is_decoder=True.
        config.is_decoder = True
    torch.manual_seed(seed)
    return getattr(transformers, arch.class_name)(config).eval()


def special_token_ids(config) -> set[int]:
    """Every special token id ``config`` (and its sub-configs) names."""
    from transformers import PretrainedConfig

    found: set[int] = set()
    for name, value in vars(config).items():
        if isinstance(value, PretrainedConfig):
            found |= special_token_ids(value)
        elif name.endswith(TOKEN_ID_SUFFIXES):
            values = value if isinstance(value, list) else [value]
            found |= {v for v in values if _is_int(v)}
    return found
