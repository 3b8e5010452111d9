# Owner(s): ["module: dynamo"]
"""Compile packages for LLM serving: KV-cache decoding loads with zero recompiles.

A tiny Hugging Face model (GPT-2, Llama with GQA and rotary embeddings, built
from local configs) is compiled with ``dynamic=True`` and a package, runs a
prompt and greedy decode steps with a DynamicCache, and is saved with
``config.package_strict`` on (no entry may be left out: bytecode constants,
guards on ModelOutputs and on ``@torch.no_grad()`` decorators, resume
functions of graph breaks in library code). A FRESH interpreter with an empty
TORCHINDUCTOR_CACHE_DIR loads it and decodes a prompt of another length for
more steps under ``set_stance("fail_on_recompile")``; its tokens must equal
eager's. A legacy tuple cache makes GPT-2 graph-break in GPT2Model.forward
(a deprecation warning), so its package holds resume functions.
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None

RUNNER = r'''
import json, os, sys, warnings
os.environ["HF_HUB_OFFLINE"] = "1"
import torch, transformers
from transformers import DynamicCache

mode, model_name, cache_kind, package = sys.argv[1:5]
torch.manual_seed(0)
if model_name == "gpt2":
    config = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100)
    model = transformers.GPT2LMHeadModel(config).eval()
else:
    config = transformers.LlamaConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
    )
    model = transformers.LlamaForCausalLM(config).eval()


def decode(fn, prompt, steps):
    cache = None if cache_kind == "legacy" else DynamicCache()
    tokens = []
    with torch.no_grad():
        out = fn(input_ids=prompt, past_key_values=cache, use_cache=True)
        for _ in range(steps):
            nxt = out.logits[:, -1:].argmax(-1)
            tokens.append(int(nxt))
            out = fn(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
    return tokens


generator = torch.Generator().manual_seed(1)
compiled = torch.compile(model, dynamic=True, package=package, backend="aot_eager")
report = {}
if mode == "save":
    prompt = torch.randint(0, 100, (1, 5), generator=generator)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch._dynamo.config.patch(package_strict=True):
            report["tokens"] = decode(compiled, prompt, 6)
            compiled.save_package()
    report["warnings"] = [str(w.message) for w in caught if "package" in str(w.message)]
    report["eager"] = decode(model, prompt, 6)
    with open(os.path.join(package, "manifest.json")) as f:
        report["entries"] = json.load(f)["entries"]
else:
    prompt = torch.randint(0, 100, (1, 9), generator=generator)
    compiled.load_package()
    with torch.compiler.set_stance("fail_on_recompile"):
        report["tokens"] = decode(compiled, prompt, 10)
    report["eager"] = decode(model, prompt, 10)
print("REPORT" + json.dumps(report))
'''


@unittest.skipUnless(HAS_TRANSFORMERS, "transformers is not installed")
class TestPackageServing(torch._dynamo.test_case.TestCase):
    def run_process(self, mode, model, cache_kind, package):
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="serving-cache-"),
        }
        proc = subprocess.run(
            [sys.executable, "-c", RUNNER, mode, model, cache_kind, package],
            capture_output=True,
            text=True,
            env=env,
            cwd=tempfile.gettempdir(),
        )
        reports = [line for line in proc.stdout.splitlines() if line.startswith("REPORT")]
        if proc.returncode != 0 or not reports:
            self.fail(f"{mode} process failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
        return json.loads(reports[-1][len("REPORT") :])

    @parametrize(
        "model,cache_kind",
        [("gpt2", "dynamic"), ("gpt2", "legacy"), ("llama", "dynamic")],
    )
    def test_decode_loads_without_recompiling(self, model, cache_kind):
        with tempfile.TemporaryDirectory(prefix="serving-package-") as tmp:
            package = os.path.join(tmp, model)
            saved = self.run_process("save", model, cache_kind, package)
            self.assertEqual(saved["warnings"], [])
            self.assertEqual(saved["tokens"], saved["eager"])
            self.assertGreater(saved["entries"], 0)
            loaded = self.run_process("load", model, cache_kind, package)
            self.assertEqual(loaded["tokens"], loaded["eager"])


instantiate_parametrized_tests(TestPackageServing)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
