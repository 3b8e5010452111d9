"""The model zoo of the load-time benchmark's zoo row (``load_time.py --zoo``).

The same models, sizes and backends as test/dynamo/test_package_zoo.py: each
``ZOO[name]()`` returns ``(module, example_inputs, backend)`` from a fixed seed,
built locally (no weights, no Hugging Face hub download), so every fresh process
builds the same model.
"""

import os

import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")


def make_resnet18():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10).eval()
    return model, (torch.randn(1, 3, 32, 32),), "aot_eager"


def make_mobilenet_v3_small():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small(weights=None, num_classes=10).eval()
    return model, (torch.randn(1, 3, 32, 32),), "aot_eager"


def make_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(config).eval(), (torch.randint(0, 64, (1, 8)),), "aot_eager"


def make_bert():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=16,
    )
    inputs = (torch.randint(0, 64, (1, 8)), torch.ones(1, 8, dtype=torch.long))
    return BertModel(config).eval(), inputs, "aot_eager"


def make_transformer_encoder():
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).eval()
    return model, (torch.randn(2, 6, 16),), "inductor"


def make_lstm():
    torch.manual_seed(0)
    torch._dynamo.config.allow_rnn = True
    model = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    return model, (torch.randn(2, 5, 8),), "aot_eager"


ZOO = {
    "resnet18": make_resnet18,
    "mobilenet_v3_small": make_mobilenet_v3_small,
    "gpt2": make_gpt2,
    "bert": make_bert,
    "transformer_encoder": make_transformer_encoder,
    "lstm": make_lstm,
}
