"""The protocol a backend's compiled callable follows to be saved by precompile.

aot_compile (torch/_dynamo/aot_compile.py) and compile packages
(torch/_dynamo/package.py) save the graphs of the builtin backends (eager,
aot_eager, inductor) themselves. Any other backend's graphs are saved through
the class of the callable the backend returned: it subclasses
:class:`SerializableCallable`, whose two classmethods turn one compiled callable
into bytes and bytes back into a callable. The class is found again by module and
qualified name when loading, so it must be defined at module level.

Provides :class:`SerializableCallable` and :class:`GraphModuleSerializableCallable`
(a ready-made one that runs the Dynamo graph as it is).
"""

from __future__ import annotations

import abc
import logging
import pickle
from typing import Any

import torch


log = logging.getLogger(__name__)


class SerializableCallable(abc.ABC):
    """A backend's compiled graph that precompile can save and load.

    Saving calls ``type(fn).serialize_compile_artifacts(fn)``; loading calls
    ``deserialize_compile_artifacts(data)`` on the same class with those bytes and
    installs what it returns as the compiled graph.
    """

    @classmethod
    @abc.abstractmethod
    def serialize_compile_artifacts(cls, fn: Any) -> bytes:
        """The bytes from which ``deserialize_compile_artifacts`` rebuilds ``fn``."""

    @classmethod
    @abc.abstractmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        """A callable equivalent to the one ``data`` was serialized from."""

    @abc.abstractmethod
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the compiled graph."""


class GraphModuleSerializableCallable(SerializableCallable):
    """Runs a Dynamo graph module as it is; saved as the pickled graph module."""

    def __init__(self, graph_module: torch.fx.GraphModule) -> None:
        if not isinstance(graph_module, torch.fx.GraphModule):
            raise TypeError(
                f"GraphModuleSerializableCallable wraps a torch.fx.GraphModule, not "
                f"{type(graph_module).__name__}"
            )
        self.graph_module = graph_module

    @classmethod
    def serialize_compile_artifacts(cls, fn: GraphModuleSerializableCallable) -> bytes:
        # A GraphModule pickles as its generated code and its submodules,
        # parameters and buffers; the fake example values Dynamo left in the node
        # metadata stay behind (the code regenerated at load does not need them).
        return pickle.dumps(torch.fx.GraphModule(fn.graph_module, fn.graph_module.graph))

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> GraphModuleSerializableCallable:
        return cls(pickle.loads(data))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.graph_module(*args, **kwargs)
