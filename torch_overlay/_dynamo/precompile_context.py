"""Automatic precompile caching: compile packages kept in the inductor cache dir.

With ``torch._dynamo.config.caching_precompile`` on, every ``torch.compile()``
given no ``package=`` gets a compile package of its own (see
torch/_dynamo/package.py). When the compiled callable wraps its function, the
package is bound to it and read back from ``<cache dir>/dynamo/<function key>``
if an earlier process saved one there, so the saved entries run without
compiling. ``torch.compiler.save_cache_artifacts()`` writes every such package
that holds entries (:meth:`PrecompileContext.save_to_dynamo_cache`).

Provides :class:`PrecompileContext` and :func:`dynamo_cache_path`.

# NOTE: [Dynamo cache key]
# A function's packages live under <inductor cache dir>/dynamo/<key>, the key
# being the sha256 of its module, qualified name and first line (an nn.Module:
# its class's forward). Whatever else could change (the code, torch, the
# machine) is checked by the package's own manifest and guards at load: a
# package that no longer fits is reported and ignored, and the function compiles.
"""

from __future__ import annotations

import hashlib
import logging
import os
from typing import Any, Optional

import torch
from torch._dynamo.exc import PackageError

from .package import CompilePackage


log = logging.getLogger(__name__)


def _function_of(fn: Any) -> Optional[Any]:
    """The Python function whose frames a compile of ``fn`` records."""
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        # OptimizedModule wraps the module's __call__; its frames are forward's.
        fn = type(owner).forward
    fn = getattr(fn, "__func__", fn)
    return fn if hasattr(fn, "__code__") else None


def dynamo_cache_path(fn: Any) -> Optional[str]:
    """Where the automatic package of ``fn`` is kept (see NOTE: [Dynamo cache key])."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    function = _function_of(fn)
    if function is None:
        return None
    key = hashlib.sha256(
        "\0".join(
            [
                str(function.__module__),
                function.__qualname__,
                str(function.__code__.co_firstlineno),
            ]
        ).encode()
    ).hexdigest()
    return os.path.join(cache_dir(), "dynamo", key)


class PrecompileContext:
    """The compile packages ``caching_precompile`` created in this process."""

    # NOTE: [Caching packages outlive their compiled callables]
    # save_cache_artifacts() writes what was compiled in this process even when
    # the torch.compile()'d callable that compiled it is gone (upstream records
    # each compile's cache entry as it happens), so the packages are held
    # strongly, in creation order, until the process saves or exits.
    _packages: list[CompilePackage] = []

    @classmethod
    def new_caching_package(cls) -> CompilePackage:
        """A package for a ``torch.compile()`` given none; bound to its function by
        :meth:`bind` once the function is known."""
        package = CompilePackage(None)
        package.caching_precompile = True  # type: ignore[attr-defined]
        cls._packages.append(package)
        return package

    @classmethod
    def bind(cls, package: CompilePackage, fn: Any) -> None:
        """Give ``package`` its function and load what the dynamo cache holds for it."""
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
    def save_to_dynamo_cache(cls) -> list[str]:
        """Write every bound package that holds entries; the paths written."""
        written = []
        for package in list(cls._packages):
            if package.path is not None and package.entries:
                written.append(package.save(package.path))
        return written
