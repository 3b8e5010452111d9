"""The models the load-time benchmark and ``make demo`` compile.

Each ``make_<name>()`` returns ``(module, example_inputs)`` from a fixed seed, so
that every fresh process builds the same weights and inputs.
"""

import torch


class SeedMLP(torch.nn.Module):
    """The seed's Linear-ReLU-Linear module."""

    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(64, 256)
        self.relu = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(256, 64)

    def forward(self, x):
        return self.linear2(self.relu(self.linear1(x)))


class TransformerBlock(torch.nn.Module):
    """d=256, 4 heads, MLP 1024."""

    def __init__(self, d=256, heads=4, hidden=1024):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, hidden)
        self.fc2 = torch.nn.Linear(hidden, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class ConvNet(torch.nn.Module):
    """3 conv + batchnorm + ReLU + pooling, then a linear layer."""

    def __init__(self):
        super().__init__()
        layers = []
        channels = [3, 16, 32, 64]
        for cin, cout in zip(channels, channels[1:]):
            layers += [
                torch.nn.Conv2d(cin, cout, 3, padding=1),
                torch.nn.BatchNorm2d(cout),
                torch.nn.ReLU(),
                torch.nn.MaxPool2d(2),
            ]
        self.features = torch.nn.Sequential(*layers)
        self.head = torch.nn.Linear(64 * 8 * 8, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def make_mlp():
    torch.manual_seed(0)
    return SeedMLP().eval(), (torch.randn(8, 64),)


def make_transformer():
    torch.manual_seed(0)
    return TransformerBlock().eval(), (torch.randn(8, 64, 256),)


def make_convnet():
    torch.manual_seed(0)
    return ConvNet().eval(), (torch.randn(8, 3, 64, 64),)


class TransformerStack(torch.nn.Module):
    """``blocks`` TransformerBlocks in sequence (the load-time growth benchmark)."""

    def __init__(self, blocks):
        super().__init__()
        self.blocks = torch.nn.Sequential(*(TransformerBlock() for _ in range(blocks)))

    def forward(self, x):
        return self.blocks(x)


def make_transformer_stack(blocks):
    torch.manual_seed(0)
    return TransformerStack(blocks).eval(), (torch.randn(8, 64, 256),)


MODELS = {
    "mlp": make_mlp,
    "transformer": make_transformer,
    "convnet": make_convnet,
    "blocks1": lambda: make_transformer_stack(1),
    "blocks8": lambda: make_transformer_stack(8),
    "blocks32": lambda: make_transformer_stack(32),
}
