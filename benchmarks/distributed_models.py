"""The models of the distributed first-step benchmark (``distributed_first_step.py``).

Module level, so that a compiled frame's code and the classes its guards name
are the same in every process (a class made inside a function is another
object in each process, and a loaded package's guards would not match it):

* :class:`DDPNet`: four ``Linear(512, 512)`` + ReLU layers, the model of
  test/distributed/test_package_distributed.py, trained under DDP;
* :class:`FSDP2Net`: three residual MLP :class:`Block` s and a head, the model
  of test/distributed/test_package_fsdp2_training.py, each block compiled and
  ``fully_shard``ed on its own.
"""

import torch
import torch.nn.functional as F


class DDPNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


class Block(torch.nn.Module):
    """A residual MLP block: what torchtitan compiles and shards one by one."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(128, 256)
        self.fc2 = torch.nn.Linear(256, 128)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(x)))


class FSDP2Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(128, 16)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)
