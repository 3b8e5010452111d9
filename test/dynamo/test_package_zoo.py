# Owner(s): ["module: dynamo"]
"""Compile packages of real models: a model zoo saved in one process and loaded in
a fresh one.

Each model (torchvision resnet18 and mobilenet_v3_small, Hugging Face GPT-2 and
BERT built from tiny local configs, nn.TransformerEncoder, an LSTM, and one
training step) is compiled with a package and called once, the package is
saved, and a FRESH interpreter with an empty TORCHINDUCTOR_CACHE_DIR loads it
and calls it under torch.compiler.set_stance("fail_on_recompile"): nothing may
be traced or compiled (no Dynamo graph, no C++ binary), and outputs (and, for
the training step, input and parameter gradients) must equal eager's. The
processes are test_package's (see its RUNNER); sizes are tiny and most models
use backend="aot_eager" so that the zoo stays within CI's time on 2 CPU cores.
A model whose library is not installed is skipped, saying which.
"""

import importlib.util
import textwrap
import unittest

from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
    subtest,
)

from test_package import PackageTestCase


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


HAS_TORCHVISION = _has("torchvision")
HAS_TRANSFORMERS = _has("transformers")

# Every case module defines make() -> (model, calls, compile kwargs), like
# test_package's CASES; BACKEND is set by the test. CALL runs the model the way
# inference runs, under no_grad (one backend compile per graph, no backward);
# for Hugging Face models (which return a ModelOutput) it also picks the tensor
# that is compared and, in the training step, backpropagated through.
ZOO_CASES = {
    "resnet18": """
        import torch, torchvision
        def CALL(fn, args):
            with torch.no_grad():
                return fn(*args)
        def make():
            torch.manual_seed(0)
            model = torchvision.models.resnet18(weights=None, num_classes=10).eval()
            return model, [(torch.randn(1, 3, 32, 32),)], dict(backend=BACKEND)
    """,
    "mobilenet_v3_small": """
        import torch, torchvision
        def CALL(fn, args):
            with torch.no_grad():
                return fn(*args)
        def make():
            torch.manual_seed(0)
            model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=10).eval()
            return model, [(torch.randn(1, 3, 32, 32),)], dict(backend=BACKEND)
    """,
    "gpt2": """
        import os
        os.environ["HF_HUB_OFFLINE"] = "1"
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
        TRAIN = globals().get("TRAIN", False)
        def CALL(fn, args):
            if TRAIN:
                return fn(*args).logits
            with torch.no_grad():
                return fn(*args).logits
        def make():
            torch.manual_seed(0)
            config = GPT2Config(
                vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            )
            model = GPT2LMHeadModel(config)
            model = model.train() if TRAIN else model.eval()
            input_ids = torch.randint(0, 64, (1, 8))
            return model, [(input_ids,)], dict(backend=BACKEND)
    """,
    "bert": """
        import os
        os.environ["HF_HUB_OFFLINE"] = "1"
        import torch
        from transformers import BertConfig, BertModel
        def CALL(fn, args):
            with torch.no_grad():
                return fn(*args).last_hidden_state
        def make():
            torch.manual_seed(0)
            config = BertConfig(
                vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=16,
            )
            model = BertModel(config).eval()
            input_ids = torch.randint(0, 64, (1, 8))
            return model, [(input_ids, torch.ones(1, 8, dtype=torch.long))], dict(backend=BACKEND)
    """,
    "transformer_encoder": """
        import torch
        from torch import nn
        def CALL(fn, args):
            with torch.no_grad():
                return fn(*args)
        def make():
            torch.manual_seed(0)
            layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
            model = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
            return model, [(torch.randn(2, 6, 16),)], dict(backend=BACKEND)
    """,
    "lstm": """
        import torch
        from torch import nn
        def CALL(fn, args):
            with torch.no_grad():
                return fn(*args)
        def make():
            torch.manual_seed(0)
            # Dynamo traces nn.LSTM only with allow_rnn (otherwise it runs it eagerly)
            torch._dynamo.config.allow_rnn = True
            model = nn.LSTM(8, 16, num_layers=2, batch_first=True)
            return model, [(torch.randn(2, 5, 8),)], dict(backend=BACKEND)
    """,
}

REQUIRES = {
    "resnet18": ("torchvision", HAS_TORCHVISION),
    "mobilenet_v3_small": ("torchvision", HAS_TORCHVISION),
    "gpt2": ("transformers", HAS_TRANSFORMERS),
    "bert": ("transformers", HAS_TRANSFORMERS),
}


class TestPackageZoo(PackageTestCase):
    def write_case(self, name, backend, **constants):
        header = "".join(f"{k} = {v!r}\n" for k, v in {"BACKEND": backend, **constants}.items())
        path = self.tmp / f"zoo_{name}_{backend}.py"
        path.write_text(header + textwrap.dedent(ZOO_CASES[name]))
        return path

    def skip_without_library(self, model):
        library, installed = REQUIRES.get(model, (None, True))
        if not installed:
            raise unittest.SkipTest(f"{model} needs {library}, which is not installed")

    @parametrize(
        "model,backend",
        [
            ("resnet18", "aot_eager"),
            subtest(("mobilenet_v3_small", "aot_eager"), decorators=[slowTest]),
            subtest(("gpt2", "aot_eager"), decorators=[slowTest]),
            ("bert", "aot_eager"),
            subtest(("transformer_encoder", "inductor"), decorators=[slowTest]),
            ("lstm", "aot_eager"),
        ],
    )
    def test_inference(self, model, backend):
        self.skip_without_library(model)
        report = self.save_and_load(model, backend)
        self.assertGreaterEqual(report["saved_entries"], 1)
        self.assert_loaded_without_compiling(report, [{"same": True, "grads": 0}])

    def test_training_step(self):
        # One forward and backward of GPT-2: the loaded forward and backward
        # graphs give eager's logits and parameter gradients.
        self.skip_without_library("gpt2")
        report = self.save_and_load("gpt2", "aot_eager", {"TRAIN": True})
        self.assertGreaterEqual(report["saved_entries"], 1)
        results = report["results"]
        self.assertEqual(len(results), 1)
        self.assertEqual(results[0].get("same"), True, results)
        # every parameter of the model has a gradient compared with eager's
        self.assertGreater(results[0]["grads"], 10)
        self.assertEqual(report["traced_graphs"], 0)
        self.assertEqual(report["compiled_binaries"], [])


instantiate_parametrized_tests(TestPackageZoo)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
