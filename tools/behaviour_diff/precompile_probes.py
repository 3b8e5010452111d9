"""Precompile probes: small programs saved in one process and loaded in another.

The behaviour diff (``diff_upstream.py``) runs this module with the python of each
environment under test (torch 2.7.1 + torch_overlay, the patched wheel, upstream
torch 2.13). Every probe is a user program written only against API that all of
them provide natively:

* ``caching_precompile``: ``torch._dynamo.config.caching_precompile = True``, a
  plain ``torch.compile``, ``torch.compiler.save_cache_artifacts()``; a later
  process finds the compiled code in the dynamo part of the inductor cache dir.
  Upstream keeps backend artifacts there only for Inductor graphs (its bundled
  AOTAutograd entries), so these probes compile with Inductor.
* ``aot_compile``: ``torch.compile(f, fullgraph=True).aot_compile(((args), {}))``,
  ``save_compiled_function`` and ``torch.compiler.load_compiled_function``
  (with ``torch._dynamo.config.enable_aot_compile`` on: 2.13 has it on by
  default, the overlay off). These use the eager backend.

Each probe saves in one fresh process, then loads in another fresh process whose
``TORCHINDUCTOR_CACHE_DIR`` is empty except for what the API needs carried over
(the ``dynamo/`` folder of the saving process's cache dir, for caching_precompile),
and runs a battery of steps under ``set_stance("fail_on_recompile")`` (a step
may say otherwise: an explicit compile after ``torch._dynamo.reset()``). Per step
it records the outcome: ``ran`` (with whether Dynamo compiled a frame and whether
the result equals eager), ``recompile`` (the stance raised), ``guard_rejected``
(a loaded aot_compile'd function refused the inputs) or ``error`` (its type).

Provides :data:`PROBES` and the runner (``python precompile_probes.py --out DIR
--label L``) that writes ``DIR/precompile_probes.json``.

# NOTE: [Precompile probe design]
# Guard probes (guard_probes.py) trace one frame without graph breaks and compare
# guard decisions; what happens between save and load of a whole program
# (resume functions of graph breaks, several entries of one code object, state
# left behind by a load that torch._dynamo.reset() must clear, backends chosen
# after a load) needs real processes. So every phase of every probe is its own
# interpreter, started by the runner with the environment's own python, the probe
# functions live at module level of this file (both versions find compiled code
# of a function again by its qualified name and first line), and the runner
# re-imports this file under its module name so that they are never __main__'s.
# Results are facts (what ran, what compiled, what raised) rather than pass/fail,
# so that the harness can compare two versions step by step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, TYPE_CHECKING

import torch


if TYPE_CHECKING:
    from collections.abc import Iterator


log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
RESULT_FILE = "precompile_probes.json"
PHASES = ("save", "load")
# One phase of one probe may take this long (an Inductor compile on a busy machine).
PHASE_TIMEOUT_S = 300

CACHING_PRECOMPILE = "caching_precompile"
AOT_COMPILE = "aot_compile"


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return " ".join(line.split())[:300]
    return ""


# The work directory of the phase running (run_phase): messages name it as
# <work>, so that environments, each with its own, compare equal (the drift
# probes' model files live there: NOTE: [Drift probes]).
_phase_work_dir: Optional[str] = None


def describe_exception(e: BaseException) -> dict:
    message = str(e)
    if _phase_work_dir:
        message = message.replace(_phase_work_dir, "<work>")
    return {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": first_line(message)}


# ---------------------------------------------------------------------------
# The probe programs
# ---------------------------------------------------------------------------


def recursive_graph_breaks(x, depth):
    """Breaks the graph at every level of a recursion: each level's frame is a
    new entry of this code (depth is specialized) plus a resume function."""
    x = x + depth
    torch._dynamo.graph_break()
    if depth == 0:
        return x.cos()
    return recursive_graph_breaks(x * 2, depth - 1)


def reset_target(x):
    return x.sin() * 2 + 1


def aot_reset_target(x):
    return x.cos() - 1


def make_local_module():
    """A module whose class exists only inside this function."""

    class LocalScaleShift(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.full((4,), 0.5))
            self.register_buffer("shift", torch.arange(4.0))

        def forward(self, x):
            return x * self.scale + self.shift

    torch.manual_seed(0)
    return LocalScaleShift()


def double_plus_one(x):
    return x * 2 + 1


def weight_by_keys(x, keys):
    out = x * len(keys)
    if "bias" in keys:
        out = out + 1
    return out


def two_tensor(a, b):
    from torch.testing._internal.two_tensor import TwoTensor

    return TwoTensor(a, b)


@dataclasses.dataclass
class Step:
    """One step of a probe's battery, run in the loading process."""

    label: str
    # Calls the compiled program; returns its result.
    run: Callable[[], Any]
    # The same computation in eager mode (None: nothing to compare).
    eager: Optional[Callable[[], Any]]
    # Whether the step runs under set_stance("fail_on_recompile").
    fail_on_recompile: bool = True


@dataclasses.dataclass
class PrecompileProbe:
    name: str
    api: str
    backend: str
    # What it checks, for the report.
    doc: str
    # Runs in the saving process: compiles and saves (into the inductor cache
    # dir for caching_precompile, into the given file for aot_compile).
    save: Callable[[Path], None]
    # Runs in the loading process: the steps of the battery, in order (a step
    # may depend on the ones before it).
    battery: Callable[[Path], Iterator[Step]]
    # Whether the battery calls torch._dynamo.reset() (it then runs after the
    # other probes that share its process).
    resets_dynamo: bool = False


PROBES: dict[str, PrecompileProbe] = {}


def probe(
    name: str,
    api: str,
    backend: str,
    doc: str,
    battery: Callable[[Path], Iterator[Step]],
    resets_dynamo: bool = False,
):
    """Registers the decorated function as the save phase of probe ``name``."""

    def register(save: Callable[[Path], None]):
        PROBES[name] = PrecompileProbe(name, api, backend, doc, save, battery, resets_dynamo)
        return save

    return register


# -- caching_precompile --------------------------------------------------------


@contextlib.contextmanager
def caching_precompile(enabled: bool = True):
    """The whole of a caching_precompile probe's phase runs under it, as a user
    would set the config once; a step compiling without the cache turns it off."""
    with torch._dynamo.config.patch(caching_precompile=enabled):
        yield


def compile_cached(fn, backend: str = "inductor"):
    return torch.compile(fn, backend=backend, dynamic=False)


def _recursion_battery(_: Path) -> Iterator[Step]:
    compiled = compile_cached(recursive_graph_breaks)
    saved = torch.linspace(-1, 1, 4)
    other_values = torch.linspace(2, 3, 4)
    for label, x, depth in (
        ("the saved input (depth 3)", saved, 3),
        ("new values, depth 3", other_values, 3),
        ("depth 2 (an inner level of the saved recursion)", other_values, 2),
        ("depth 0 (the innermost level)", other_values, 0),
        ("depth 4 (never compiled)", other_values, 4),
        ("another shape, depth 3", torch.linspace(0, 1, 6), 3),
    ):
        yield Step(
            label,
            lambda x=x, depth=depth: compiled(x.clone(), depth),
            lambda x=x, depth=depth: recursive_graph_breaks(x.clone(), depth),
        )


@probe(
    "recursion_graph_breaks",
    CACHING_PRECOMPILE,
    "inductor",
    "A function that graph-breaks at every level of a recursion (depth 3: four "
    "frames of one code object, each with a resume function); after a load every "
    "saved level runs without compiling.",
    battery=_recursion_battery,
)
def _recursion_save(_: Path) -> None:
    compile_cached(recursive_graph_breaks)(torch.linspace(-1, 1, 4), 3)
    torch.compiler.save_cache_artifacts()


def _reset_battery(_: Path) -> Iterator[Step]:
    x = torch.linspace(-1, 1, 4)
    compiled = compile_cached(reset_target)
    yield Step("loaded, first call", lambda: compiled(x), lambda: reset_target(x))

    def eager_backend_after_reset():
        torch._dynamo.reset()
        with caching_precompile(False):
            return torch.compile(reset_target, backend="eager")(x)

    yield Step(
        "reset, then torch.compile(backend='eager') (an explicit compile)",
        eager_backend_after_reset,
        lambda: reset_target(x),
        fail_on_recompile=False,
    )

    def cached_again_after_reset():
        torch._dynamo.reset()
        return compile_cached(reset_target)(x)

    yield Step(
        "reset, then the cached compile again",
        cached_again_after_reset,
        lambda: reset_target(x),
    )

    def aot_eager_after_reset():
        torch._dynamo.reset()
        with caching_precompile(False):
            return torch.compile(reset_target, backend="aot_eager")(x * 3)

    yield Step(
        "reset, then torch.compile(backend='aot_eager') on other values",
        aot_eager_after_reset,
        lambda: reset_target(x * 3),
        fail_on_recompile=False,
    )


@probe(
    "reset_after_load",
    CACHING_PRECOMPILE,
    "inductor",
    "Load from the dynamo cache and call; torch._dynamo.reset(); compile the same "
    "function with another backend and call; reset; the cached compile loads again.",
    battery=_reset_battery,
    resets_dynamo=True,
)
def _reset_save(_: Path) -> None:
    compile_cached(reset_target)(torch.linspace(-1, 1, 4))
    torch.compiler.save_cache_artifacts()


def _local_module_battery(_: Path) -> Iterator[Step]:
    module = make_local_module()
    compiled = compile_cached(module)
    for label, x in (
        ("the saved input", torch.linspace(-1, 1, 4)),
        ("new values", torch.linspace(5, 6, 4)),
        ("float64", torch.linspace(-1, 1, 4, dtype=torch.float64)),
        ("another batch shape", torch.ones(2, 4)),
    ):
        yield Step(label, lambda x=x: compiled(x), lambda x=x: module(x))


@probe(
    "local_module_cached",
    CACHING_PRECOMPILE,
    "inductor",
    "An nn.Module whose class is defined inside a function, compiled with "
    "caching_precompile and loaded in a fresh process that defines the class again.",
    battery=_local_module_battery,
)
def _local_module_save(_: Path) -> None:
    compile_cached(make_local_module())(torch.linspace(-1, 1, 4))
    torch.compiler.save_cache_artifacts()


# -- serving: KV-cache decoding and generate() ----------------------------------

# NOTE: [Serving probes]
# The serving zoo of issue 27 (test/dynamo/test_package_serving.py) with the API
# both versions share: caching_precompile, Inductor, dynamic=True. A tiny
# Hugging Face model (transformers 4.52.4, the test's local configs and seed)
# is compiled and run on a 5-token prompt and 6 greedy decode steps with a
# DynamicCache, or generate() over a compiled forward, then
# save_cache_artifacts(); the fresh loading process runs a prompt length and a
# number of steps never seen at save (9 tokens, 10 steps) under
# fail_on_recompile. Steps return token ids (Inductor's logits differ from
# eager's in the last bits; the tokens must not). The decode steps start from
# an eager prefill's cache, so that they say whether the decode entries load
# whatever the prefill entry did.
SERVING_SAVE_PROMPT, SERVING_SAVE_STEPS = 5, 6
SERVING_LOAD_PROMPT, SERVING_LOAD_STEPS = 9, 10


def build_serving_model(name: str):
    """The serving zoo's tiny model ``name`` (gpt2 or llama), seed 0, eval mode."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
        return transformers.GPT2LMHeadModel(config).eval()
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
    )
    return transformers.LlamaForCausalLM(config).eval()


def serving_prompt(length: int) -> torch.Tensor:
    return torch.randint(0, 100, (1, length), generator=torch.Generator().manual_seed(length))


def prefill(fn, prompt: torch.Tensor):
    from transformers import DynamicCache

    with torch.no_grad():
        return fn(input_ids=prompt, past_key_values=DynamicCache(), use_cache=True)


def first_token(fn, prompt: torch.Tensor) -> int:
    """The token a prefill of ``prompt`` generates first."""
    return int(prefill(fn, prompt).logits[0, -1].argmax())


def greedy_decode(fn, out, steps: int) -> list[int]:
    """``steps`` greedy decode steps of ``fn`` from a forward's output ``out``."""
    tokens = []
    with torch.no_grad():
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            out = fn(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return tokens


def greedy_generate(model, prompt: torch.Tensor, steps: int, **options) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=steps,
            min_new_tokens=steps, pad_token_id=0, do_sample=False, **options,
        )
    return out[0, -steps:].tolist()


def compile_serving(model, **options):
    return torch.compile(model, backend="inductor", dynamic=True, **options)


def _decode_battery(name: str) -> Callable[[Path], Iterator[Step]]:
    def battery(_: Path) -> Iterator[Step]:
        model = build_serving_model(name)
        compiled = compile_serving(model)
        prompt = serving_prompt(SERVING_LOAD_PROMPT)
        yield Step(
            f"prefill, a {SERVING_LOAD_PROMPT}-token prompt (saved: {SERVING_SAVE_PROMPT})",
            lambda: first_token(compiled, prompt),
            lambda: first_token(model, prompt),
        )
        yield Step(
            f"{SERVING_LOAD_STEPS} decode steps from an eager prefill (saved: {SERVING_SAVE_STEPS})",
            lambda: greedy_decode(compiled, prefill(model, prompt), SERVING_LOAD_STEPS),
            lambda: greedy_decode(model, prefill(model, prompt), SERVING_LOAD_STEPS),
        )

    return battery


def _decode_save(name: str) -> Callable[[Path], None]:
    def save(_: Path) -> None:
        compiled = compile_serving(build_serving_model(name))
        greedy_decode(compiled, prefill(compiled, serving_prompt(SERVING_SAVE_PROMPT)), SERVING_SAVE_STEPS)
        torch.compiler.save_cache_artifacts()

    return save


for _name, _what in (
    ("gpt2", "GPT-2"),
    ("llama", "Llama (GQA, rotary embeddings under @torch.no_grad())"),
):
    probe(
        f"serving_{_name}_decode",
        CACHING_PRECOMPILE,
        "inductor",
        f"{_what} with a DynamicCache, dynamic=True: saved after a {SERVING_SAVE_PROMPT}-token "
        f"prompt and {SERVING_SAVE_STEPS} decode steps, loaded and run on a "
        f"{SERVING_LOAD_PROMPT}-token prompt for {SERVING_LOAD_STEPS} steps (NOTE: [Serving probes]).",
        battery=_decode_battery(_name),
    )(_decode_save(_name))


def _generate_probe(
    probe_name: str, name: str, compile_options: dict, generate_options: dict, doc: str
) -> None:
    """A probe of generate() over model.forward = torch.compile(model.forward,
    **compile_options) with Inductor and dynamic=True, as Hugging Face
    documents: saved after SERVING_SAVE_STEPS new tokens of a short prompt,
    loaded and run longer on a longer one (NOTE: [Serving probes])."""
    label = "generate(" + "".join(f"{k}={v!r}" for k, v in generate_options.items()) + ")"

    def compiled_model():
        model = build_serving_model(name)
        model.forward = compile_serving(model.forward, **compile_options)
        return model

    def battery(_: Path) -> Iterator[Step]:
        model, eager = compiled_model(), build_serving_model(name)
        prompt = serving_prompt(SERVING_LOAD_PROMPT)
        yield Step(
            f"{label}, a {SERVING_LOAD_PROMPT}-token prompt, {SERVING_LOAD_STEPS} tokens",
            lambda: greedy_generate(model, prompt, SERVING_LOAD_STEPS, **generate_options),
            lambda: greedy_generate(eager, prompt, SERVING_LOAD_STEPS, **generate_options),
        )

    def save(_: Path) -> None:
        greedy_generate(
            compiled_model(), serving_prompt(SERVING_SAVE_PROMPT), SERVING_SAVE_STEPS, **generate_options
        )
        torch.compiler.save_cache_artifacts()

    saved_and_loaded = (
        f"saved after a {SERVING_SAVE_PROMPT}-token prompt and {SERVING_SAVE_STEPS} new tokens, "
        f"loaded and run on a {SERVING_LOAD_PROMPT}-token prompt for {SERVING_LOAD_STEPS} "
        "(NOTE: [Serving probes])."
    )
    probe(
        probe_name,
        CACHING_PRECOMPILE,
        "inductor",
        f"{doc}: {saved_and_loaded}",
        battery=battery,
    )(save)


_generate_probe(
    "serving_gpt2_generate",
    "gpt2",
    {},
    {},
    "GPT-2 generate() over model.forward = torch.compile(model.forward, dynamic=True), "
    "as Hugging Face documents, greedy",
)
_generate_probe(
    "serving_llama_static_cache",
    "llama",
    {"fullgraph": True},
    {"cache_implementation": "static"},
    "Llama generate(..., cache_implementation='static') over model.forward = "
    "torch.compile(model.forward, fullgraph=True, dynamic=True), as Hugging Face documents: "
    "the StaticCache marks its tensors with mark_static_address (guard=True)",
)


# -- drift: the model's code or config changed between save and load ----------

# NOTE: [Drift probes]
# A model file edited between save and load (a new release of the model code)
# must never run the old code's graph. Each drift probe writes a small model
# module into the probe's directory, saves it, and the loading process edits
# one line of it (or a config value) before importing it; the steps then say
# whether the edited model recompiles (under fail_on_recompile: the stance
# raises) and, compiling allowed, whether its result is the edited code's.
# (An edited module global is a guard failure in both versions; the suite
# tests it: test/dynamo/test_package_sources.py.)
# Bytecode caching is off for the module, so an edit within one second of the
# save is never served from a stale .pyc.
DRIFT_MODEL = """\
import torch

SCALE = 2.0


def helper(x):
    return x * 3.0


class DriftNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return helper(self.linear(x)) * SCALE + 0.5
"""
DRIFT_EDITS = {
    "forward": ("* SCALE + 0.5", "* SCALE + 2.5"),
    "helper": ("x * 3.0", "x * 4.0"),
    "config": None,
}


def drift_model(work_dir: Path, edit: Optional[str] = None):
    """A DriftNet (seed 0) from the module written to ``work_dir``, edited by
    ``edit`` (a key of DRIFT_EDITS) first."""
    import importlib

    source_dir = work_dir / "drift_probe_src"
    source_dir.mkdir(exist_ok=True)
    source = DRIFT_MODEL
    if edit is not None and DRIFT_EDITS[edit] is not None:
        old, new = DRIFT_EDITS[edit]
        source = source.replace(old, new)
    (source_dir / "drift_probe_model.py").write_text(source)
    sys.dont_write_bytecode = True
    if str(source_dir) not in sys.path:
        sys.path.insert(0, str(source_dir))
    sys.modules.pop("drift_probe_model", None)
    module = importlib.import_module("drift_probe_model")
    torch.manual_seed(0)
    return module.DriftNet()


def _drift_probe(edit: str, doc: str) -> None:
    def save(artifact: Path) -> None:
        compile_cached(drift_model(artifact.parent))(torch.ones(2, 4))
        torch.compiler.save_cache_artifacts()

    def battery(artifact: Path) -> Iterator[Step]:
        model = drift_model(artifact.parent, edit)
        if edit == "config":
            torch._inductor.config.fallback_random = True
        compiled = compile_cached(model)
        x = torch.ones(2, 4)
        yield Step("the edited model, the saved input", lambda: compiled(x), lambda: model(x))
        yield Step(
            "the edited model, compiling allowed",
            lambda: compiled(x),
            lambda: model(x),
            fail_on_recompile=False,
        )

    probe(f"drift_{edit}", CACHING_PRECOMPILE, "inductor", doc + " (NOTE: [Drift probes])", battery=battery)(save)


_drift_probe("forward", "A constant in the compiled module's forward edited between save and load")
_drift_probe("helper", "A helper function the forward calls (Dynamo inlines it) edited between save and load")
_drift_probe(
    "config",
    "torch._inductor.config.fallback_random set in the loading process, default when saved",
)


def _aot_drift_battery(path: Path) -> Iterator[Step]:
    model = drift_model(path.parent, "forward")
    x = torch.ones(2, 4)
    loaded = load_aot_compiled(path)
    yield Step("the edited model's forward, loaded", lambda: loaded(model, x), lambda: model(x))


# -- aot_compile ---------------------------------------------------------------


@contextlib.contextmanager
def aot_compile_enabled():
    # 2.13 enables aot_compile by default; 2.7.1 + overlay behind this flag.
    with torch._dynamo.config.patch(enable_aot_compile=True):
        yield


def aot_compile_and_save(fn, args: tuple, path: Path, backend: str = "eager") -> None:
    compiled = torch.compile(fn, fullgraph=True, backend=backend).aot_compile((args, {}))
    compiled.save_compiled_function(str(path))


def load_aot_compiled(path: Path):
    with open(path, "rb") as f:
        return torch.compiler.load_compiled_function(f)


def _aot_steps(path: Path, fn, cases) -> Iterator[Step]:
    loaded = load_aot_compiled(path)
    for label, args in cases:
        yield Step(label, lambda args=args: loaded(*args), lambda args=args: fn(*args))


@probe(
    "aot_drift_forward",
    AOT_COMPILE,
    "eager",
    "aot_compile of a module's forward, a constant in it edited between save and "
    "load_compiled_function (NOTE: [Drift probes]).",
    battery=_aot_drift_battery,
)
def _aot_drift_save(path: Path) -> None:
    model = drift_model(path.parent)
    compiled = torch.compile(model, fullgraph=True, backend="eager").forward.aot_compile(
        ((torch.ones(2, 4),), {})
    )
    compiled.save_compiled_function(str(path))


def _aot_reset_battery(path: Path) -> Iterator[Step]:
    x = torch.linspace(-1, 1, 4)
    loaded = load_aot_compiled(path)
    yield Step("loaded, first call", lambda: loaded(x), lambda: aot_reset_target(x))

    def loaded_after_reset():
        torch._dynamo.reset()
        return loaded(x * 2)

    yield Step(
        "reset, then the loaded function again",
        loaded_after_reset,
        lambda: aot_reset_target(x * 2),
    )

    def compile_after_reset():
        torch._dynamo.reset()
        return torch.compile(aot_reset_target, backend="aot_eager")(x)

    yield Step(
        "reset, then torch.compile(backend='aot_eager') of the same function",
        compile_after_reset,
        lambda: aot_reset_target(x),
        fail_on_recompile=False,
    )


@probe(
    "aot_reset_after_load",
    AOT_COMPILE,
    "eager",
    "load_compiled_function, call; torch._dynamo.reset(), the loaded function "
    "still runs; reset, torch.compile of the same function with another backend.",
    battery=_aot_reset_battery,
    resets_dynamo=True,
)
def _aot_reset_save(path: Path) -> None:
    aot_compile_and_save(aot_reset_target, (torch.linspace(-1, 1, 4),), path)


def _two_tensor_battery(path: Path) -> Iterator[Step]:
    return _aot_steps(
        path,
        double_plus_one,
        (
            ("the saved TwoTensor", (two_tensor(torch.ones(4), torch.zeros(4)),)),
            ("a TwoTensor of new values", (two_tensor(torch.arange(4.0), torch.ones(4)),)),
            ("a plain tensor", (torch.ones(4),)),
            ("a TwoTensor of another shape", (two_tensor(torch.ones(6), torch.zeros(6)),)),
        ),
    )


@probe(
    "aot_two_tensor",
    AOT_COMPILE,
    "eager",
    "A TwoTensor input (a traceable tensor subclass at module level): its "
    "subclass metadata guard saves and decides after a load.",
    battery=_two_tensor_battery,
)
def _two_tensor_save(path: Path) -> None:
    aot_compile_and_save(double_plus_one, (two_tensor(torch.ones(4), torch.zeros(4)),), path)


def _keys_battery(path: Path) -> Iterator[Step]:
    x = torch.ones(3)
    return _aot_steps(
        path,
        weight_by_keys,
        (
            ("the saved keys", (x, {"weight": 1, "bias": 2}.keys())),
            ("the same keys of another dict", (x * 2, {"weight": 7, "bias": 8}.keys())),
            ("without 'bias'", (x, {"weight": 1, "gain": 2}.keys())),
            ("one key more", (x, {"weight": 1, "bias": 2, "gain": 3}.keys())),
        ),
    )


@probe(
    "aot_dict_keys",
    AOT_COMPILE,
    "eager",
    "A dict_keys view as an input (its length and membership are guarded).",
    battery=_keys_battery,
)
def _keys_save(path: Path) -> None:
    aot_compile_and_save(weight_by_keys, (torch.ones(3), {"weight": 1, "bias": 2}.keys()), path)


# No probe passes a dict_values or dict_items view: neither 2.7.1's nor 2.13's
# Dynamo traces one as a fullgraph input (not even len() of it), so aot_compile
# cannot save any program taking one. Their guards are guard probes
# (guard_probes.dict_values_arg / dict_items_arg).


# ---------------------------------------------------------------------------
# Running one phase (inside the environment under test)
# ---------------------------------------------------------------------------


def _is_recompile(e: BaseException) -> bool:
    return "Detected recompile" in str(e)


def _is_guard_rejection(e: BaseException) -> bool:
    return isinstance(e, RuntimeError) and "guard" in str(e).lower()


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def _same(actual: Any, expected: Any) -> bool:
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        if type(actual) is not type(expected) or actual.shape != expected.shape:
            return False
        attrs, _ = (
            actual.__tensor_flatten__() if hasattr(actual, "__tensor_flatten__") else (None, None)
        )
        if attrs:
            return all(_same(getattr(actual, a), getattr(expected, a)) for a in attrs)
        return bool(torch.allclose(actual, expected))
    if isinstance(actual, (tuple, list)) and isinstance(expected, (tuple, list)):
        return len(actual) == len(expected) and all(map(_same, actual, expected))
    return actual == expected


def run_step(step: Step) -> dict:
    row: dict[str, Any] = {"label": step.label, "fail_on_recompile": step.fail_on_recompile}
    stance = (
        torch.compiler.set_stance("fail_on_recompile")
        if step.fail_on_recompile
        else contextlib.nullcontext()
    )
    frames_before = _frames_compiled()
    try:
        with stance:
            result = step.run()
    except Exception as e:
        row["outcome"] = (
            "recompile" if _is_recompile(e) else "guard_rejected" if _is_guard_rejection(e) else "error"
        )
        row["error"] = describe_exception(e)
        log.info("%s: %s", step.label, row["error"])
        return row
    row["outcome"] = "ran"
    row["compiled"] = _frames_compiled() > frames_before
    if step.eager is not None:
        row["matches_eager"] = _same(result, step.eager())
    return row


def run_phase(name: str, phase: str, work_dir: Path) -> dict:
    """One phase of one probe in this process; returns what happened."""
    global _phase_work_dir
    probe = PROBES[name]
    artifact = work_dir / f"{name}.pt"
    _phase_work_dir = str(work_dir)
    api_enabled = caching_precompile() if probe.api == CACHING_PRECOMPILE else aot_compile_enabled()
    started = time.perf_counter()
    result: dict[str, Any] = {"phase": phase, "status": "ok"}
    steps: list[dict] = []
    try:
        with api_enabled:
            if phase == "save":
                probe.save(artifact)
            else:
                for step in probe.battery(artifact):
                    steps.append(run_step(step))
    except Exception as e:
        log.info("%s %s failed", name, phase, exc_info=True)
        result["status"] = "error"
        result["error"] = describe_exception(e)
    if phase == "load":
        result["steps"] = steps
    result["seconds"] = round(time.perf_counter() - started, 2)
    return result


# ---------------------------------------------------------------------------
# The runner (one process per phase and process group)
# ---------------------------------------------------------------------------


def process_groups(names: list[str]) -> list[list[str]]:
    """The probes that share a saving and a loading process.

    A caching_precompile probe has processes (and an inductor cache dir) of its
    own: everything a process compiles goes into the dynamo cache it saves. The
    aot_compile probes write one file each and share one pair of processes, the
    one that resets Dynamo last.
    """
    groups = [[n] for n in names if PROBES[n].api == CACHING_PRECOMPILE]
    aot = sorted((n for n in names if PROBES[n].api == AOT_COMPILE), key=lambda n: PROBES[n].resets_dynamo)
    if aot:
        groups.append(aot)
    return groups


def _run_phase_process(names: list[str], phase: str, work_dir: Path, cache_dir: Path) -> dict:
    result_file = work_dir / f"{phase}.json"
    env = dict(os.environ)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    cmd = [
        sys.executable,
        "-P",
        str(Path(__file__).resolve()),
        "--phase",
        phase,
        "--probes",
        ",".join(names),
        "--work",
        str(work_dir),
    ]
    log.info("%s", " ".join(cmd))
    crash: Optional[dict] = None
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=PHASE_TIMEOUT_S)
        (work_dir / f"{phase}.log").write_text(
            f"$ {' '.join(cmd)}\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
        )
        if proc.returncode != 0 or not result_file.exists():
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            crash = {"type": f"exit {proc.returncode}", "message": lines[-1][:300] if lines else ""}
    except subprocess.TimeoutExpired:
        crash = {"type": "timeout", "message": f"the {phase} process ran over {PHASE_TIMEOUT_S} s"}
    results = {} if crash else json.loads(result_file.read_text())
    return {
        name: results.get(name) or {"phase": phase, "status": "crashed", "error": crash}
        for name in names
    }


def run_group(names: list[str], out_dir: Path) -> dict[str, dict]:
    """Save in one fresh process, load in another whose cache dir holds only what
    the API carries (see NOTE: [Precompile probe design])."""
    work_dir = out_dir / "+".join(names) if len(names) == 1 else out_dir / AOT_COMPILE
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    save_cache, load_cache = work_dir / "save-cache", work_dir / "load-cache"
    saved = _run_phase_process(names, "save", work_dir, save_cache)
    load_cache.mkdir()
    if any(PROBES[n].api == CACHING_PRECOMPILE for n in names) and (save_cache / "dynamo").is_dir():
        shutil.copytree(save_cache / "dynamo", load_cache / "dynamo")
    carried = sorted(str(p.relative_to(load_cache)) for p in load_cache.rglob("*") if p.is_file())
    to_load = [n for n in names if saved[n]["status"] == "ok"]
    loaded = _run_phase_process(to_load, "load", work_dir, load_cache) if to_load else {}
    cases = {}
    for name in names:
        probe = PROBES[name]
        load = loaded.get(name) or {"phase": "load", "status": "skipped"}
        cases[name] = {
            "probe": name,
            "api": probe.api,
            "backend": probe.backend,
            "doc": probe.doc,
            "save": saved[name],
            "load": {k: v for k, v in load.items() if k != "steps"},
            "carried_files": len(carried),
            "steps": load.get("steps", []),
        }
    return cases


def run_all(out_dir: Path, label: str, names: list[str]) -> dict:
    # Absolute: Inductor compiles its kernels from elsewhere than this cwd, so a
    # relative TORCHINDUCTOR_CACHE_DIR breaks the C++ build.
    out_dir = out_dir.resolve()
    started = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    cases = {}
    for group in process_groups(names):
        cases.update(run_group(group, out_dir))
        for name in group:
            case = cases[name]
            summary = ", ".join(row["outcome"] for row in case["steps"]) or case["load"]["status"]
            print(f"[{label}] {name}: save {case['save']['status']}; {summary}", flush=True)
    result = {
        "label": label,
        "torch": str(torch.__version__),
        "cases": {name: cases[name] for name in names},
        "seconds": round(time.perf_counter() - started, 1),
    }
    (out_dir / RESULT_FILE).write_text(json.dumps(result, indent=1))
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="runner: where to write the results")
    parser.add_argument("--label", default="", help="runner: the environment's name")
    parser.add_argument("--probes", default="", help="comma-separated subset (default: all)")
    parser.add_argument("--phase", choices=PHASES, help="run one phase of --probes in this process")
    parser.add_argument("--work", type=Path, help="--phase: the probes' work dir")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    names = [n for n in args.probes.split(",") if n] or list(PROBES)
    unknown = [n for n in names if n not in PROBES]
    if unknown:
        parser.error(f"unknown probes {unknown}; known: {list(PROBES)}")
    if args.phase:
        results = {name: run_phase(name, args.phase, args.work) for name in names}
        (args.work / f"{args.phase}.json").write_text(json.dumps(results, indent=1))
        return 0
    if args.out is None:
        parser.error("--out is required to run the probes")
    run_all(args.out, args.label, names)
    return 0


if __name__ == "__main__":
    # Run as the module precompile_probes, not __main__, so the probe functions'
    # names are the same in every process (see NOTE: [Precompile probe design]).
    sys.path.insert(0, str(HERE))
    import precompile_probes

    sys.exit(precompile_probes.main())
