# Owner(s): ["module: dynamo"]
"""Compile packages for LLM serving: the serving zoo, loaded with zero recompiles.

Tiny Hugging Face models built from local configs (transformers 4.52.4): GPT-2,
Llama (GQA, rotary embeddings, ``@torch.no_grad()`` in its rotary embedding),
Qwen2 with sliding-window attention, T5 (encoder-decoder with a cross-attention
cache). Each is compiled with a package and run in one process: a prompt and
greedy decode steps with a KV cache, or ``generate()``; the package is saved
with ``config.package_strict`` on (no entry may be left out: bytecode constants,
guards on ModelOutputs and decorators, resume functions of graph breaks in
library code). A FRESH interpreter with an empty TORCHINDUCTOR_CACHE_DIR loads
it and runs a prompt of another length for more steps under
``set_stance("fail_on_recompile")``; its tokens must equal eager's.

Covered: DynamicCache (and GPT-2's legacy tuple cache, which graph-breaks in
GPT2Model.forward) with a decode loop over ``torch.compile(model)``;
``generate()`` over a compiled forward (``model.forward = torch.compile(
model.forward)``, as Hugging Face documents) and over a module compiled in place
(``model.compile()``), greedy and with a fixed-seed sampler; StaticCache; one
package for every length (``dynamic=True``, ``mark_dynamic`` with min/max,
automatic dynamic), with a length out of the saved range recompiling (not
silently served); a model and its EMA copy in two packages of one process, each
loaded alone; Inductor on Llama. `make test` runs one case of each kind
(a decode loop, generate(), a static cache); the others are @slowTest, run by
the nightly workflow (PYTORCH_TEST_WITH_SLOW=1).
"""

import importlib.util
import json
import tempfile
import unittest

import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
    subtest,
)
from torch.testing._internal.fresh_process import run_code


HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

# argv: mode (save | load), the case (JSON), the package directory, and for a
# load the package to load ("model" or "copy").
RUNNER = r'''
import copy, json, os, sys, warnings
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
from torch.testing._internal.fresh_process import write_report
from transformers import DynamicCache, EncoderDecoderCache, StaticCache

mode, case, package, which = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
name = case["model"]
encoder_decoder = name == "t5"
SAVE_STEPS, LOAD_STEPS = 6, 10


def build(seed=0):
    torch.manual_seed(seed)
    if name == "gpt2":
        config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
        return transformers.GPT2LMHeadModel(config).eval()
    if name == "t5":
        config = transformers.T5Config(
            d_model=32, d_ff=64, d_kv=16, num_layers=2, num_decoder_layers=2,
            num_heads=2, vocab_size=100, decoder_start_token_id=0,
        )
        return transformers.T5ForConditionalGeneration(config).eval()
    common = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
    )
    if name == "qwen2":
        # Sliding-window attention (window 4, shorter than every prompt) in layer 0.
        config = transformers.Qwen2Config(
            **common, use_sliding_window=True, sliding_window=4, max_window_layers=1,
        )
        return transformers.Qwen2ForCausalLM(config).eval()
    if name == "mistral":
        config = transformers.MistralConfig(**common, sliding_window=4)
        return transformers.MistralForCausalLM(config).eval()
    if name == "mixtral":
        # Mixture of experts: 4 experts, top-2 routing (a graph break at the
        # routing's nonzero().tolist(), after a view).
        config = transformers.MixtralConfig(**common, num_local_experts=4, num_experts_per_tok=2)
        return transformers.MixtralForCausalLM(config).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**common)).eval()


def build_named(key):
    model = build()
    if key == "copy":
        # Same class and config, other weights (an EMA copy of the model).
        torch.manual_seed(2)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5).add_(torch.randn_like(p) * 0.5)
    return model


def new_cache():
    if case["cache"] == "legacy":
        return None
    if encoder_decoder:
        return EncoderDecoderCache(DynamicCache(), DynamicCache())
    return DynamicCache()


def decode(fn, prompt, steps):
    """A prefill and greedy decode steps, each a call of fn."""
    if case.get("mark_dynamic"):
        torch._dynamo.mark_dynamic(prompt, 1, min=2, max=64)
    kwargs = dict(input_ids=prompt, past_key_values=new_cache(), use_cache=True)
    if encoder_decoder:
        kwargs["decoder_input_ids"] = torch.zeros((1, 1), dtype=torch.long)
    tokens = []
    with torch.no_grad():
        out = fn(**kwargs)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            kwargs = dict(past_key_values=out.past_key_values, use_cache=True)
            if encoder_decoder:
                kwargs.update(decoder_input_ids=nxt, encoder_outputs=(out.encoder_last_hidden_state,))
            else:
                kwargs["input_ids"] = nxt
            out = fn(**kwargs)
    return tokens


def generate(model, prompt, steps):
    kwargs = dict(
        attention_mask=torch.ones_like(prompt), max_new_tokens=steps,
        min_new_tokens=steps, pad_token_id=0, do_sample=False,
    )
    if case["cache"] == "static":
        kwargs["cache_implementation"] = "static"
    elif case["cache"] == "static_unguarded":
        cache = StaticCache(model.config, max_batch_size=1, max_cache_len=prompt.shape[1] + steps)
        for t in [*cache.key_cache, *cache.value_cache]:
            torch._dynamo.mark_static_address(t, guard=False)
        kwargs["past_key_values"] = cache
    if case.get("sample"):
        torch.manual_seed(3)
        kwargs.update(do_sample=True, top_k=20)
    with torch.no_grad():
        out = model.generate(prompt, **kwargs)
    return out[0, -steps:].tolist()


def generate_padded(model, batches, steps):
    """generate() of left-padded batches, one per list of row lengths."""
    tokens = []
    for lengths in batches:
        width = max(lengths)
        ids = torch.zeros(len(lengths), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            ids[row, width - n:] = torch.randint(1, 100, (n,), generator=torch.Generator().manual_seed(n + row))
            mask[row, width - n:] = 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=steps,
                min_new_tokens=steps, pad_token_id=0, do_sample=False,
            )
        tokens.append(out[:, -steps:].tolist())
    return tokens


def run(fn, prompt, steps):
    if case.get("driver") == "generate":
        return generate(fn, prompt, steps)
    if case.get("driver") == "padded":
        return generate_padded(fn, prompt, steps)
    return decode(fn, prompt, steps)


def compile_model(model, path):
    """(what to run, what saves and loads the package)."""
    options = dict(backend=case.get("backend", "aot_eager"), package=path)
    if case.get("fullgraph"):
        options["fullgraph"] = True
    if case.get("dynamic", True):
        options["dynamic"] = True
    if case.get("target") == "forward":
        model.forward = torch.compile(model.forward, **options)
        return model, model.forward
    if case.get("target") == "inplace":
        model.compile(**options)
        return model, model._compiled_call_impl
    compiled = torch.compile(model, **options)
    return compiled, compiled


generator = torch.Generator().manual_seed(1)
save_prompts = [torch.randint(0, 100, (1, n), generator=generator) for n in case.get("save_lengths", [5])]
load_prompt = torch.randint(0, 100, (1, case.get("load_length", 9)), generator=generator)
if case.get("driver") == "padded":
    # Batches of left-padded rows, by row lengths: saved as one warm-up, loaded as another.
    save_prompts, load_prompt = [case["save_batches"]], case["load_batches"]
report = {}
if mode == "save":
    keys = ["model", "copy"] if case.get("copy") else ["model"]
    compiled = {key: compile_model(build_named(key), os.path.join(package, key)) for key in keys}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch._dynamo.config.patch(package_strict=case.get("strict", True)):
            # Interleaved: the copy's first call is served by the model's entries.
            report["tokens"] = {
                key: [run(compiled[key][0], prompt, SAVE_STEPS) for prompt in save_prompts]
                for key in keys
            }
            for key in keys:
                compiled[key][1].save_package()
    report["warnings"] = [str(w.message) for w in caught if "package" in str(w.message)]
    report["eager"] = {
        key: [run(build_named(key), prompt, SAVE_STEPS) for prompt in save_prompts] for key in keys
    }
    report["entries"] = {}
    for key in keys:
        with open(os.path.join(package, key, "manifest.json")) as f:
            report["entries"][key] = json.load(f)["entries"]
else:
    fn, saver = compile_model(build_named(which), os.path.join(package, which))
    saver.load_package()
    try:
        with torch.compiler.set_stance("fail_on_recompile"):
            report["tokens"] = run(fn, load_prompt, LOAD_STEPS)
    except RuntimeError as e:
        if "fail_on_recompile" not in str(e):
            raise
        report["recompile"] = str(e)
    report["eager"] = run(build_named(which), load_prompt, LOAD_STEPS)
write_report(report)
'''


@unittest.skipUnless(HAS_TRANSFORMERS, "transformers is not installed")
class TestPackageServing(torch._dynamo.test_case.TestCase):
    def run_process(self, mode, case, package, which="model"):
        # Saves and loads alike start from an empty inductor cache.
        return run_code(RUNNER, mode, json.dumps(case), package, which, fresh_inductor_cache=True)

    def save(self, case, package):
        """Save in one process: nothing left out, tokens equal eager's."""
        saved = self.run_process("save", case, package)
        self.assertEqual(saved["warnings"], [])
        self.assertEqual(saved["tokens"], saved["eager"])
        for entries in saved["entries"].values():
            self.assertGreater(entries, 0)
        return saved

    def load(self, case, package, which="model"):
        """Load alone in a fresh process: no recompile, tokens equal eager's."""
        loaded = self.run_process("load", case, package, which)
        self.assertNotIn("recompile", loaded)
        self.assertEqual(loaded["tokens"], loaded["eager"])
        return loaded

    def round_trip(self, case):
        with tempfile.TemporaryDirectory(prefix="serving-package-") as tmp:
            self.save(case, tmp)
            self.load(case, tmp)

    @parametrize(
        "model,cache_kind",
        [
            ("gpt2", "dynamic"),
            subtest(("gpt2", "legacy"), decorators=[slowTest]),
            subtest(("llama", "dynamic"), decorators=[slowTest]),
            subtest(("qwen2", "dynamic"), decorators=[slowTest]),
            subtest(("t5", "dynamic"), decorators=[slowTest]),
        ],
    )
    def test_decode_loads_without_recompiling(self, model, cache_kind):
        self.round_trip({"model": model, "cache": cache_kind})

    @parametrize(
        "model,cache_kind,backend",
        [
            ("gpt2", "legacy", "inductor"),
            ("llama", "legacy", "aot_eager"),
            ("mixtral", "legacy", "aot_eager"),
            ("mixtral", "dynamic", "inductor"),
        ],
    )
    @slowTest
    def test_decode_model_built_cache(self, model, cache_kind, backend):
        # "legacy": the prefill passes past_key_values=None and the model builds
        # its own cache, the commonest spelling. With Inductor it used to crash
        # at save (NOTE: [View replay in packaged AOTAutograd entries]).
        self.round_trip({"model": model, "cache": cache_kind, "backend": backend})

    @slowTest
    def test_padded_batches_at_new_sizes(self):
        # docs/packages.md, "Batched serving": warmed with left-padded batches
        # of two sizes and two lengths, so that no batch size is tied to another
        # size; served at batch sizes and lengths never seen at save.
        self.round_trip(
            {
                "model": "llama", "cache": "dynamic", "target": "forward", "driver": "padded",
                "save_batches": [[5, 3], [7, 4, 6]],
                "load_batches": [[9, 4, 7, 2], [12, 3, 8, 5, 6]],
            }
        )

    @slowTest
    def test_decode_mistral_sliding_window(self):
        self.round_trip({"model": "mistral", "cache": "dynamic"})

    @slowTest
    def test_decode_inductor(self):
        self.round_trip({"model": "llama", "cache": "dynamic", "backend": "inductor"})

    @slowTest
    def test_mark_dynamic_serves_every_length_in_range(self):
        # Prompt dimension marked dynamic in [2, 64]; the KV cache's length
        # becomes dynamic automatically over the decode steps.
        case = {"model": "llama", "cache": "dynamic", "dynamic": False, "mark_dynamic": True}
        with tempfile.TemporaryDirectory(prefix="serving-package-") as tmp:
            self.save(case, tmp)
            self.load(case, tmp)
            # Beyond the saved range the guards reject the prompt: a recompile,
            # refused under fail_on_recompile, never a silently wrong entry.
            beyond = self.run_process("load", {**case, "load_length": 70}, tmp)
            self.assertIn("recompile", beyond)
            self.assertEqual(len(beyond["eager"]), 10)

    @slowTest
    def test_automatic_dynamic_serves_unseen_lengths(self):
        # Two prompt lengths at save: automatic dynamic makes the prompt and
        # cache lengths symbolic; the load's prompt length was never seen.
        self.round_trip(
            {"model": "llama", "cache": "dynamic", "dynamic": False, "save_lengths": [5, 7]}
        )

    @parametrize(
        "target,sample",
        [("forward", False)]
        + [subtest(case, decorators=[slowTest]) for case in [("inplace", True), ("forward", True), ("inplace", False)]],
    )
    def test_generate(self, target, sample):
        self.round_trip(
            {"model": "llama", "cache": "dynamic", "driver": "generate", "target": target, "sample": sample}
        )

    def test_static_cache_as_documented(self):
        # generate(cache_implementation="static") builds a StaticCache whose
        # tensors carry mark_static_address (guard=True); under a package
        # Dynamo takes them as graph inputs (NOTE: [Static addresses under a
        # compile package]), so the entries save, and the load serves another
        # prompt length and a longer cache.
        self.round_trip(
            {"model": "llama", "cache": "static", "driver": "generate", "target": "forward", "fullgraph": True}
        )

    @slowTest
    def test_static_cache_with_unguarded_addresses(self):
        # The same StaticCache, its tensors marked guard=False and passed to
        # generate(): lifted as graph inputs, any cache length, any prompt.
        self.round_trip(
            {
                "model": "llama", "cache": "static_unguarded", "driver": "generate",
                "target": "forward", "fullgraph": True,
            }
        )

    @slowTest
    def test_model_and_copy_in_two_packages(self):
        # One class, other weights, two packages: the copy's calls are served
        # by entries compiled for the model; each package must hold what its
        # own model ran and load alone.
        case = {"model": "llama", "cache": "dynamic", "copy": True}
        with tempfile.TemporaryDirectory(prefix="serving-package-") as tmp:
            saved = self.save(case, tmp)
            self.assertNotEqual(saved["tokens"]["model"], saved["tokens"]["copy"])
            for which in ("model", "copy"):
                self.load(case, tmp, which)


instantiate_parametrized_tests(TestPackageServing)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
