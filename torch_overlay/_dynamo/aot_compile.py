"""aot_compile: compile a function ahead of time into a saveable compiled function.

Under ``torch._dynamo.config.patch("enable_aot_compile", True)``::

    compiled = torch.compile(m, fullgraph=True).forward.aot_compile((args, kwargs))
    compiled.save_compiled_function(path)
    loaded = torch.compiler.load_compiled_function(open(path, "rb"))
    loaded(m, *args)

A compiled function is one fullgraph entry of a compile package (see
torch/_dynamo/package.py: same bytecode, guards, artifacts and file format, in one
archive). Calling it checks its guards (a call they reject raises, naming the
failed guard; :meth:`AOTCompiledFunction.disable_guard_check` turns checking off)
and runs the saved Dynamo bytecode directly: no Dynamo cache is involved.

Provides :class:`AOTCompiledFunction`, :func:`aot_compile_fullgraph` and
:func:`load_compiled_function`.
"""

from __future__ import annotations

import inspect
import logging
import marshal
import os
import types
from typing import Any, Callable, Optional

import torch
from torch._dynamo.exc import PackageError

from .package import (
    _resolve_code,
    CompilePackage,
    read_archive,
    write_archive,
)


log = logging.getLogger(__name__)


def _module_call_target(fn) -> Optional[tuple[Callable, torch.nn.Module]]:
    """``mod.__call__`` (what OptimizedModule.forward wraps) -> (type(mod).forward, mod)."""
    owner = getattr(fn, "__self__", None)
    if isinstance(owner, torch.nn.Module) and getattr(fn, "__name__", "") in (
        "__call__",
        "_wrapped_call_impl",
        "_call_impl",
        "forward",
    ):
        return type(owner).forward, owner
    return None


def _fresh_function(fn: types.FunctionType) -> types.FunctionType:
    """A copy of ``fn`` with its own code object, so Dynamo compiles it anew
    whatever is already cached for ``fn``."""
    copy = types.FunctionType(
        fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    return copy


class AOTCompiledFunction:
    """A function compiled ahead of time; see the module docstring."""

    def __init__(self, fn, out_code, f_globals, guards_state: bytes, package: CompilePackage):
        self._fn = fn
        self._signature = inspect.signature(fn)
        self._package = package
        self._guards_state = guards_state
        self._compiled = types.FunctionType(
            out_code, f_globals, fn.__name__, fn.__defaults__, fn.__closure__
        )
        self._compiled.__kwdefaults__ = fn.__kwdefaults__
        # The saved bytecode calls the compiled graph itself: Dynamo must not
        # look at (or compile) its frame.
        self._run = torch._dynamo.disable(self._compiled)
        self._guard_manager = None
        self._check_guards = True

    @property
    def guard_manager(self):
        if self._guard_manager is None:
            from torch._dynamo.guards import CheckFunctionManager

            self._guard_manager = CheckFunctionManager(
                self._fn.__code__,
                self._guards_state,
                guards_serialization_mode="load",
                runtime_global_scope=self._compiled.__globals__,
            ).guard_manager
        return self._guard_manager

    def disable_guard_check(self) -> None:
        """Run without checking guards (inputs are trusted to match the example)."""
        self._check_guards = False

    def __call__(self, *args, **kwargs):
        if self._check_guards:
            bound = self._signature.bind(*args, **kwargs)
            bound.apply_defaults()
            f_locals = dict(bound.arguments)
            for name, cell in zip(self._fn.__code__.co_freevars, self._fn.__closure__ or ()):
                f_locals[name] = cell.cell_contents
            if not self.guard_manager.check(f_locals):
                from torch._dynamo.guards import get_guard_fail_reason_helper

                reason = get_guard_fail_reason_helper(self.guard_manager, f_locals, None)
                reason = reason.removeprefix("None: ")
                raise RuntimeError(
                    f"aot_compile'd {self._fn.__qualname__} was called with inputs its "
                    f"guards reject: {reason}. Call it like the example it was compiled "
                    "for, compile it again for these inputs, or call "
                    "disable_guard_check() to skip the check"
                )
        return self._run(*args, **kwargs)

    def save_compiled_function(self, path) -> None:
        """Write the compiled function (the compile package format, one file)."""
        files, manifest = self._package.collect_files()
        if manifest["entries"] != 1:
            raise PackageError(
                f"aot_compile'd {self._fn.__qualname__} could not be saved: its entry "
                f"is not serializable ({'; '.join(self._package._unsaveable) or 'see warnings'})"
            )
        manifest["aot_compile"] = {"qualname": self._fn.__qualname__}
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            write_archive(f, files, manifest)
        os.replace(tmp, path)


def aot_compile_fullgraph(fn, backend, example_inputs) -> AOTCompiledFunction:
    """``torch.compile(fn, fullgraph=True).aot_compile((args, kwargs))``."""
    if not torch._dynamo.config.enable_aot_compile:
        raise RuntimeError(
            "aot_compile is opt-in: run it under "
            'torch._dynamo.config.patch("enable_aot_compile", True)'
        )
    try:
        args, kwargs = example_inputs
    except (TypeError, ValueError):
        raise TypeError(
            "aot_compile takes ((args...), {kwargs...}): a tuple of the positional "
            "example inputs and a dict of the keyword ones"
        ) from None
    args = tuple(args)
    target = _module_call_target(fn)
    if target is not None:
        fn, module = target
        args = (module, *args)
    fn = getattr(fn, "__func__", fn)
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"aot_compile needs a Python function or an nn.Module, not {fn!r}")
    package = CompilePackage(fn)
    fresh = _fresh_function(fn)
    compiled = torch._dynamo.optimize(backend, nopython=True, package=package)(fresh)
    compiled(*args, **kwargs)
    if len(package.entries) != 1:
        reasons = "; ".join(package._unsaveable) or "no entry was recorded"
        raise PackageError(f"aot_compile of {fn.__qualname__} failed: {reasons}")
    entry = package.entries[0]
    out_code = marshal.loads(entry.out_code)
    return AOTCompiledFunction(fn, out_code, fn.__globals__, entry.guards_state, package)


def load_compiled_function(file) -> AOTCompiledFunction:
    """Read a compiled function written by ``save_compiled_function``.

    ``file`` is a binary file object or a path. The function it was compiled from
    must be importable by its module and qualified name.
    """
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb") as f:
            return load_compiled_function(f)
    where = getattr(file, "name", "<file>")
    files, manifest = read_archive(file, where)
    if "aot_compile" not in manifest:
        raise PackageError(f"{where} is a compile package, not an aot_compile'd function")
    package = CompilePackage(None)
    loaded = package.load_files(files, manifest, where)
    if len(loaded) != 1:
        raise PackageError(f"{where} holds {len(loaded)} entries, not one")
    entry = loaded[0]
    code = _resolve_code(entry.entry.code_key, [])
    if code is None:
        raise PackageError(
            f"{where} was compiled from {entry.entry.code_key[2]} in module "
            f"{entry.entry.code_key[1]}, which cannot be found in this process"
        )
    fn = _function_of(entry.entry.code_key)
    return AOTCompiledFunction(
        fn, entry.out_code, entry.f_globals, entry.entry.guards_state, package
    )


def _function_of(code_key):
    import sys

    _, module_name, qualname = code_key
    obj: Any = sys.modules[module_name]
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return getattr(obj, "__func__", obj)
