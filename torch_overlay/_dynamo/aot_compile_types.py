"""The protocol a backend's compiled callable follows to be saved by precompile.

aot_compile (torch/_dynamo/aot_compile.py) and compile packages
(torch/_dynamo/package.py) save the graphs of the builtin backends (eager,
aot_eager, inductor) themselves. Any other backend's graphs are saved through
the class of the callable the backend returned: it subclasses
:class:`SerializableCallable`, whose two classmethods turn one compiled callable
into bytes and bytes back into a callable. The class is found again by module and
qualified name when loading, so it must be defined at module level.

Provides :class:`SerializableCallable`, :class:`GraphModuleSerializableCallable`
(a ready-made one that runs the Dynamo graph as it is),
:class:`BundledAOTAutogradSerializableCallable` (upstream's name for a graph
AOTAutograd compiled, saved with its compiled artifacts; here it wraps a
:class:`BundledGraph`, a builtin backend's graph in the package's graph format)
and :func:`_serialize_triton_kernel` / :func:`_deserialize_triton_kernel`
(upstream's: a user-defined triton kernel of the kernel side table by name).
"""

from __future__ import annotations

import abc
import io
import logging
import pickle
import sys
from typing import Any, Optional

import torch
from torch._dynamo.exc import PackageError


log = logging.getLogger(__name__)


# NOTE: [Triton kernels of the kernel side table]
# Dynamo puts a user-defined triton kernel it traces into
# torch._higher_order_ops.triton_kernel_wrap.kernel_side_table and writes its
# index, not the kernel, into the graph (triton_kernel_wrapper_mutation /
# _functional nodes). A graph Inductor compiles embeds the kernel's source, but
# one that runs as an FX graph (aot_eager, regional Inductor outside its
# regions) looks the kernel up by index when it runs: in a fresh process the
# table is empty. Upstream saves each kernel by the module and name of the
# function it wraps (a triton JITFunction holds locks and does not pickle) and
# puts it back at the same index before loading the graph.
# _serialize_triton_kernel / _deserialize_triton_kernel are those two halves,
# with upstream's names and tuples. Loading finds the kernel in a module this
# process has already imported (the compiled function's own imports bring the
# kernel's module in) and imports nothing by name (NOTE: [Trust model of
# compile packages]).


def _serialize_triton_kernel(kernel: Any) -> tuple[str, str]:
    """``(module, name)`` of the function a triton kernel wraps (``kernel.fn``),
    by which :func:`_deserialize_triton_kernel` finds the kernel again; a
    RuntimeError when it has none that another process can find."""
    fn = getattr(kernel, "fn", None)
    module = getattr(fn, "__module__", None) if fn is not None else None
    name = getattr(fn, "__name__", None) if fn is not None else None
    if not (isinstance(module, str) and isinstance(name, str)):
        raise RuntimeError(
            f"Kernel fn missing __module__ or __name__: module={module}, name={name}. "
            "Cannot serialize for precompilation."
        )
    qualname = getattr(fn, "__qualname__", "")
    if "<locals>" in qualname:
        raise RuntimeError(
            f"Kernel fn {qualname} is defined in a local scope and cannot be "
            "found by name in another process. Cannot serialize for precompilation: "
            "define the kernel at module level."
        )
    return (module, name)


def _deserialize_triton_kernel(kernel_info: tuple[str, str]) -> Any:
    """The kernel ``_serialize_triton_kernel`` described: attribute ``name`` of
    module ``module``, which this process must have imported (NOTE: [Triton
    kernels of the kernel side table])."""
    if not (
        isinstance(kernel_info, tuple)
        and len(kernel_info) == 2
        and all(isinstance(part, str) for part in kernel_info)
    ):
        raise PackageError(f"a triton kernel is described as {str(kernel_info)[:80]}, not (module, name)")
    module_name, name = kernel_info
    module = sys.modules.get(module_name)
    if module is None:
        raise PackageError(
            f"triton kernel {name} lives in module {module_name}, which is not imported: "
            "import it before loading"
        )
    try:
        return getattr(module, name)
    except AttributeError:
        raise PackageError(f"module {module_name} has no triton kernel {name}") from None


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


class BundledGraph:
    """A graph compiled through a builtin backend (eager, aot_eager, Inductor)
    with what saving it needs: its compile record, or the bytes it was loaded
    from (kept, so a loaded graph saves again as it was read)."""

    def __init__(self, compiled: Any, record: Any = None, data: Optional[bytes] = None) -> None:
        if record is None and data is None:
            raise AssertionError("a BundledGraph needs its compile record or its bytes")
        self.compiled = compiled
        self._record = record
        self._data = data

    def serialize(self) -> bytes:
        """The graph and the kernel binaries it runs, as bytes of builtins."""
        if self._data is None:
            from torch._dynamo.package_artifacts import serialize_graph

            self._data = self.bundle(*serialize_graph(self._record))
        return self._data

    @staticmethod
    def bundle(graph: bytes, kernels: dict[str, bytes]) -> bytes:
        """The bytes of a graph artifact and its kernel binaries (``from_bytes`` reads them)."""
        return pickle.dumps({"graph": graph, "kernels": kernels}, protocol=pickle.HIGHEST_PROTOCOL)

    @classmethod
    def from_bytes(cls, data: bytes, name: str = "<bundled graph>") -> BundledGraph:
        """The graph ``serialize`` wrote, read with the package's checks (the
        graph allow-list; kernels only from the bytes; PackageError on damage)."""
        from torch._dynamo.package_store import _BuiltinsOnlyUnpickler
        from torch._dynamo.package_artifacts import deserialize_graph, redirect_to_kernel_binaries

        try:
            payload = _BuiltinsOnlyUnpickler(io.BytesIO(data)).load()
        except PackageError:
            raise
        except Exception as e:
            raise PackageError(f"{name}: damaged bundled graph: {e!r}"[:400]) from e
        if not (
            isinstance(payload, dict)
            and isinstance(payload.get("graph"), bytes)
            and isinstance(payload.get("kernels"), dict)
            and all(isinstance(v, bytes) for v in payload["kernels"].values())
        ):
            raise PackageError(f"{name}: not a bundled graph (graph bytes and kernel binaries)")
        redirect = redirect_to_kernel_binaries(payload["kernels"], "torch_bundled_graph_kernels_")
        compiled = deserialize_graph(payload["graph"], redirect, name)
        graph = cls(compiled, data=data)
        # The kernels' files live as long as the graph that loads them.
        graph._kernel_redirect = redirect  # type: ignore[attr-defined]
        return graph

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled(*args, **kwargs)


class BundledAOTAutogradSerializableCallable(SerializableCallable):
    """A graph AOTAutograd compiled (aot_eager, Inductor), saved with its
    compiled forward, backward and kernels bundled (upstream's name: its
    ``compiled_fn`` has ``serialize()``)."""

    def __init__(self, compiled_fn: Any) -> None:
        if not hasattr(compiled_fn, "serialize"):
            raise AssertionError(f"compiled_fn must have a 'serialize' method, got {type(compiled_fn)}")
        self.compiled_fn = compiled_fn

    def __getattr__(self, attr: str) -> Any:
        if attr == "compiled_fn":
            raise AttributeError(attr)
        return getattr(self.compiled_fn, attr)

    @classmethod
    def serialize_compile_artifacts(cls, fn: BundledAOTAutogradSerializableCallable) -> bytes:
        return fn.compiled_fn.serialize()

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> BundledAOTAutogradSerializableCallable:
        return cls(BundledGraph.from_bytes(data))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.compiled_fn(*args, **kwargs)
