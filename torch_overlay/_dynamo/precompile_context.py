"""The precompile context: what this process compiled, for the Dynamo cache.

Upstream's ``torch._dynamo.precompile_context``: :class:`PrecompileContext`
records the Dynamo cache entries of compile packages (by key) and the backend
artifacts their graphs are saved as (by backend id), and
:meth:`PrecompileContext.save_to_dynamo_cache` stitches them into
``PrecompileCacheEntry`` s written to the Dynamo cache
(``torch._dynamo.package_store.DynamoCache``). :class:`BackendCacheArtifact` is one
backend's saved graph: :class:`PackageGraphArtifact` (a graph as a compile
package holds it) or :class:`EagerCacheArtifact` (a live eager graph).

With ``torch._dynamo.config.caching_precompile`` on, every ``torch.compile()``
given no ``package=`` gets a compile package of its own
(:meth:`PrecompileContext.new_caching_package`). When the compiled callable
wraps its function, the package is bound to it and read back from the Dynamo
cache if an earlier process saved one there, so the saved entries run without
compiling. Each frame compiled under the package records its cache entry here
(as upstream's ConvertFrameAssert does), and
``torch.compiler.save_cache_artifacts()`` writes every entry recorded.
"""

# NOTE: [Dynamo cache key]
# A function's package lives under <inductor cache dir>/dynamo/<key>, the key
# (torch._dynamo.package.source_id_from_fn) being the sha256 of its module,
# qualified name and first line (an nn.Module: its class's forward). Whatever
# else could change (the code, torch, the machine) is checked by the package's
# own manifest and guards at load: a package that no longer fits is reported
# and ignored, and the function compiles.

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os
from collections import defaultdict
from typing import Any, Callable, Generic, Optional, TypeVar

from torch._dynamo.exc import PackageError

from .package import (
    _DynamoCacheEntry,
    CompilePackage,
    PrecompileCacheEntry,
    source_id_from_fn,
)
from .package_store import DynamoCache


log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass
class BackendCacheArtifact(Generic[T]):
    """One backend's saved graph: a key (its backend id) and its content."""

    key: str
    content: Any

    def after_deserialization(self) -> T:
        """The content as its backend uses it, after it was read back."""
        raise NotImplementedError

    def edit_contents(self, edit_fn: Callable[..., Any]) -> None:
        self.content = edit_fn(self.content)

    def package_bytes(self) -> bytes:
        """The graph file a compile package holds for this backend."""
        raise PackageError(
            f"backend artifact {self.key} ({type(self).__name__}) has no form a compile package can hold"
        )


class EagerCacheArtifact(BackendCacheArtifact[Any]):
    """A live eager graph (upstream records these for eager backends; a
    package save replaces it by the graph's :class:`PackageGraphArtifact`)."""

    def after_deserialization(self) -> Any:
        return self.content


class PackageGraphArtifact(BackendCacheArtifact[Any]):
    """A graph as a compile package holds it: the bytes of ``graphs/<id>.bin``
    (any backend: eager, aot_eager, Inductor with its kernels' sources). Its
    content is None until the entry that calls it is written (NOTE: [Recording
    a package's cache entry] in torch/_dynamo/package.py)."""

    def after_deserialization(self) -> Any:
        from torch._dynamo.package_artifacts import _KernelRedirect, deserialize_graph

        return deserialize_graph(self.content, _KernelRedirect({}), self.key)

    def package_bytes(self) -> bytes:
        if not isinstance(self.content, bytes):
            raise PackageError(f"backend artifact {self.key}: its content is a {type(self.content).__name__}, not bytes")
        return self.content


def graph_artifact_type(backend: Optional[str]) -> type[PackageGraphArtifact]:
    """The artifact kind a graph compiled by ``backend`` is recorded as: an
    Inductor graph is bundled with its AOTAutogradCacheEntry, which upstream
    names BundledAOTAutogradCacheArtifact. A graph read back from a package
    directory is a PackageGraphArtifact: the kind is known where the graph was
    compiled, and reading it from the bytes would mean unpickling the graph."""
    if backend == "inductor":
        from torch._functorch._aot_autograd.autograd_cache import BundledAOTAutogradCacheArtifact

        return BundledAOTAutogradCacheArtifact
    return PackageGraphArtifact


class BypassDynamoCacheEntry(Exception):
    """Raised by a backend that cannot save what it compiled: the Dynamo cache
    entry being recorded is left out."""


def dynamo_cache_path(fn: Any) -> Optional[str]:
    """Where the Dynamo cache keeps ``fn``'s package (NOTE: [Dynamo cache key])."""
    try:
        key = source_id_from_fn(fn)
    except PackageError:
        return None
    return os.path.join(DynamoCache.path_prefix(), key)


class PrecompileContext:
    """Dynamo cache entries and backend artifacts recorded in this process."""

    _backend_artifacts_by_key: dict[str, BackendCacheArtifact[Any]] = {}
    # NOTE: [Caching packages outlive their compiled callables]
    # save_cache_artifacts() writes what was compiled in this process even when
    # the torch.compile()'d callable that compiled it is gone: each entry
    # recorded here holds its package until it is written (materialized) or
    # clear() is called.
    _dynamo_cache_entries: dict[str, _DynamoCacheEntry] = {}

    @classmethod
    def clear(cls) -> None:
        cls._backend_artifacts_by_key.clear()
        cls._dynamo_cache_entries.clear()

    @classmethod
    def record_artifact(cls, artifact: BackendCacheArtifact[Any]) -> None:
        """Record a backend artifact (a copy) under its key."""
        from torch.utils._mode_utils import no_dispatch

        with no_dispatch():
            cls._backend_artifacts_by_key[artifact.key] = copy.deepcopy(artifact)

    @classmethod
    def record_dynamo_cache_entry(cls, cache_entry: _DynamoCacheEntry, key: str) -> None:
        cls._dynamo_cache_entries[key] = cache_entry

    @classmethod
    def edit_artifact(cls, key: str, edit_fn: Callable[..., Any]) -> None:
        if key not in cls._backend_artifacts_by_key:
            raise AssertionError(f"Key {key} not found in artifacts")
        cls._backend_artifacts_by_key[key].edit_contents(edit_fn)

    @classmethod
    def serialize_artifact_by_key(cls, key: str) -> Optional[BackendCacheArtifact[Any]]:
        return cls._backend_artifacts_by_key.get(key)

    @staticmethod
    def dump_debug_info(
        dynamo_entries: dict[str, _DynamoCacheEntry],
        backend_artifacts: dict[str, BackendCacheArtifact[Any]],
    ) -> dict[str, Any]:
        debug_info: defaultdict[str, list[Any]] = defaultdict(list)
        for key, cache_entry in dynamo_entries.items():
            info = cache_entry.debug_info()
            info["key"] = key
            debug_info["dynamo"].append(info)
        for artifact in backend_artifacts.values():
            debug_info["backends"].append(artifact.key)
        return debug_info

    @classmethod
    def new_caching_package(cls) -> CompilePackage:
        """A package for a ``torch.compile()`` given none; bound to its function
        by :meth:`bind` once the function is known."""
        package = CompilePackage(None)
        package.caching_precompile = True  # type: ignore[attr-defined]
        return package

    @classmethod
    def bind(cls, package: CompilePackage, fn: Any) -> None:
        """Give ``package`` its function and load what the Dynamo cache holds for it."""
        from torch._dynamo.utils import counters

        if package.path is not None:
            return
        path = dynamo_cache_path(fn)
        if path is None:
            return
        package._fn = fn
        package.path = path
        if not os.path.isdir(path):
            counters["dynamo_cache"]["dynamo_cache_miss"] += 1
            log.info("no precompile cache entry for %s at %s", fn, path)
            return
        try:
            loaded = package.load(path)
        except PackageError as e:
            counters["dynamo_cache"]["dynamo_cache_error"] += 1
            log.warning("precompile cache entry %s cannot be loaded, compiling: %s", path, e)
            return
        counters["dynamo_cache"]["dynamo_cache_hit"] += 1
        log.info("loaded %d precompiled entries for %s from %s", len(loaded), fn, path)

    @classmethod
    def create_cache_entries(cls) -> tuple[dict[str, PrecompileCacheEntry], dict[str, Any]]:
        """Every recorded Dynamo cache entry with its backends, and debug info.

        A code whose backends are not all recorded is bypassed (saved without
        its entries); an entry that cannot be written is left out with a
        warning, as upstream does."""
        debug_info = cls.dump_debug_info(cls._dynamo_cache_entries, cls._backend_artifacts_by_key)
        log.debug("dynamo cache entries: %s", json.dumps({"num_entries": len(cls._dynamo_cache_entries)}))
        entries = {}
        for key, cache_entry in cls._dynamo_cache_entries.items():
            try:
                entry = PrecompileCacheEntry.from_cache_entry(cache_entry, cls._backend_artifacts_by_key)
                entry.materialize()
            except Exception:
                log.warning("precompile cache entry %s cannot be written", key, exc_info=True)
                continue
            entries[key] = entry
        return entries, debug_info

    @classmethod
    def save_to_dynamo_cache(cls) -> dict[str, Any]:
        """Write every recorded entry to the Dynamo cache; the debug info."""
        entries, debug_info = cls.create_cache_entries()
        for key, entry in entries.items():
            DynamoCache.write(entry, key)
        return debug_info


__all__ = [
    "BackendCacheArtifact",
    "BypassDynamoCacheEntry",
    "EagerCacheArtifact",
    "PackageGraphArtifact",
    "PrecompileContext",
    "dynamo_cache_path",
]
