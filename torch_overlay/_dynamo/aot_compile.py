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

An nn.Module is compiled for several inputs with upstream's module entry
points: ``OptimizedModule._aot_compile([ModelInput(args, kwargs, contexts),
...])`` makes its ``forward`` an :class:`AOTCompiledModel` (one compiled
function per input, chosen on each call by their guards);
``_save_aot_compiled_module(path)`` returns (and writes) its bytes and
``_load_aot_compiled_module(data)`` reads them back.

Graphs of backends other than eager, aot_eager and inductor are saved when the
backend returns a ``torch._dynamo.aot_compile_types.SerializableCallable`` (see
NOTE: [Custom backend artifacts] in package.py).

A loaded function runs with the closure of the live function it belongs to:
the identity guards on a closure's unnamed functions are replaced by their
code (NOTE: [Guards on the closure of an aot_compile'd function]); the
nn.Modules a closure holds are upstream's ``external_data`` at save and load
(NOTE: [External data]); the globals the bytecode reads beyond Dynamo's own
and the graph inputs are upstream's ``f_globals`` (NOTE: [Globals of a loaded
function]).

Provides :class:`AOTCompiledFunction`, :func:`aot_compile_fullgraph`,
:func:`load_compiled_function`, :class:`ModelInput`, :class:`AOTCompiledModel`
and :func:`aot_compile_module`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import importlib
import inspect
import io
import logging
import os
import pickle
import sys
import types
import weakref
from typing import Any, Callable, Optional

import torch
# Upstream's aot_compile module exports the protocol of saveable backends too.
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._dynamo.exc import PackageError

# BundledAOTAutogradSerializableCallable: upstream's aot_compile exports it too.
from .aot_compile_types import (
    BundledAOTAutogradSerializableCallable,
    BundledGraph,
    GraphModuleSerializableCallable,
)
from .package_sources import code_fingerprint
from .package import (
    CompilePackage,
    SourceInfo,
    SystemInfo,
)
from .package_store import _BuiltinsOnlyUnpickler
from .package_artifacts import (
    _CUSTOM_BACKEND,
    check_frozen_parameters,
    load_code,
    note_guard_filter,
    read_archive,
    write_archive,
)


log = logging.getLogger(__name__)

# NOTE: [aot_compile is not a recompile]
# aot_compile compiles because the user asked for it, for inputs the user chose:
# whatever stance is active (fail_on_recompile included) does not apply to it, as
# upstream, whose aot_compile captures the graph without going through Dynamo's
# frame callback. Here the compile does go through the callback, so it runs
# under the default stance.

# Copies made by _fresh_function: never the function a saved one belongs to.
_COMPILE_COPIES: weakref.WeakSet = weakref.WeakSet()


def require_aot_compile_enabled() -> None:
    if not torch._dynamo.config.enable_aot_compile:
        raise RuntimeError(
            "AOT Compile is not enabled, please set "
            "torch._dynamo.config.enable_aot_compile=True (aot_compile is opt-in: run "
            'it under torch._dynamo.config.patch("enable_aot_compile", True))'
        )


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
    _COMPILE_COPIES.add(copy)
    return copy


def _code_record(code: types.CodeType) -> list:
    """A code object as the manifest's aot_compile field records it: where it
    is defined (for messages) and its code_fingerprint, which tells it from
    any other code with the same qualified name."""
    return [code.co_filename, code.co_firstlineno, code_fingerprint(code)]


@dataclasses.dataclass
class AOTCompileSaveResult:
    """What ``save_compiled_function`` wrote."""

    serialized_data: bytes


def _tensor_guards_name_the_scope() -> bool:
    """Whether this torch's tensor guards name a local as ``L['x']`` in their
    failure text (NOTE: torch 2.6.0, a second supported base, does; 2.7's say
    ``'x'``, and a rejected call reads the same on both)."""
    from torch.torch_version import TorchVersion

    return TorchVersion(torch.__version__) < "2.7"


# NOTE: [Runtime environment of compiled bytecode]
# Dynamo's bytecode runs as the compiled function's own code, but it reads more
# globals than the function: the compiled graph, the module aliases Dynamo
# made, the resume functions of graph breaks, and whatever the function itself
# reads. Upstream's GraphRuntimeEnv holds these (pickled into the file) and
# builds the function to run from them (forward_callable). Here the bytecode
# runs in the globals of the function's module, as the function does: a
# package load installs the graph, module aliases and resume functions there
# (CompilePackage), so ``used_globals`` is that module's dict, live, and
# forward_callable copies it only to bind what is not there yet (the graph, a
# missing alias, the f_globals a load is given). ``pycode`` stays empty: 2.7.1's
# Dynamo generates bytecode only, so use_python_codegen is refused.


def _imported_module(name: str) -> types.ModuleType:
    """A module an alias of the bytecode names: one already imported, or
    torch's own (a package never imports a module by name)."""
    module = sys.modules.get(name)
    if module is None and (name == "torch" or name.startswith("torch.")):
        module = importlib.import_module(name)
    if module is None:
        raise PackageError(
            f"the compiled bytecode reads module {name[:100]!r}, which is not imported "
            "(a package never imports a module by name)"
        )
    return module


@dataclasses.dataclass(frozen=True)
class GraphRuntimeEnv:
    """What Dynamo's bytecode needs to run besides its graph (upstream's name
    and fields; NOTE: [Runtime environment of compiled bytecode]): the bytecode,
    its Python source (none here), the module aliases it reads (alias -> module
    name), the globals it runs in, the closure and defaults of the function it
    belongs to, and the globals a load must be given (external_refs: NOTE:
    [Globals of a loaded function])."""

    bytecode: types.CodeType
    pycode: list
    import_sources: dict[str, str]
    used_globals: dict[str, Any]
    closure: Optional[tuple]
    argdefs: Optional[tuple]
    kwdefaults: Optional[dict[str, Any]] = None
    external_refs: set[str] = dataclasses.field(default_factory=set)

    def forward_callable(
        self,
        backend_id: Optional[str],
        compiled_fn: Any,
        *,
        extra_globals: Optional[dict[str, Any]] = None,
        use_python_codegen: bool = False,
    ) -> types.FunctionType:
        """The function running the bytecode, with ``compiled_fn`` bound to the
        global ``backend_id`` it calls the graph by (None: it calls no graph)
        and ``extra_globals`` over ``used_globals``."""
        if use_python_codegen:
            raise RuntimeError(
                "No Python code generated from Dynamo (its 2.7.1 tracer generates "
                "bytecode only): run with use_python_codegen=False"
            )
        additions = {
            alias: _imported_module(module_name)
            for alias, module_name in self.import_sources.items()
            if alias not in self.used_globals
        }
        if backend_id is not None and self.used_globals.get(backend_id) is not compiled_fn:
            additions[backend_id] = compiled_fn
        additions.update(extra_globals or {})
        f_globals = {**self.used_globals, **additions} if additions else self.used_globals
        missing = sorted(ref for ref in self.external_refs if ref not in f_globals)
        if missing:
            raise RuntimeError(
                f"Missing required external references: {missing}. Please load AOT "
                "compiled function with `f_globals=<enclosing global scope>`"
            )
        fn = types.FunctionType(
            self.bytecode, f_globals, self.bytecode.co_name, self.argdefs, self.closure
        )
        fn.__kwdefaults__ = self.kwdefaults
        return fn


@dataclasses.dataclass
class CompileArtifacts:
    """What an aot_compile'd function is made of (upstream's names and fields):
    the function's signature and original code, its guards, the compiled graph
    (``compiled_fn``, a SerializableCallable) and its backend id, the runtime
    environment of the bytecode Dynamo generated (GraphRuntimeEnv), the sources
    it was traced from and the system it was compiled on."""

    signature: inspect.Signature
    guard_manager: Any
    guards_state: bytes
    backend_id: str
    compiled_fn: Any
    original_code: types.CodeType
    runtime_env: GraphRuntimeEnv
    source_info: SourceInfo
    device_type: str
    backend_name: str
    system_info: SystemInfo = dataclasses.field(default_factory=SystemInfo.current)

    def check_compatibility(self) -> None:
        """RuntimeError unless this process can run what was compiled."""
        SystemInfo.current().check_compatibility(self.system_info, self.device_type)


def _serializable_graph(package: CompilePackage, entry, f_globals: dict) -> tuple[str, Any]:
    """(backend id, the graph as a SerializableCallable) of an aot_compile entry."""
    graphs = [(name, ref[1]) for name, ref in entry.globals.items() if ref[0] == "graph"]
    if len(graphs) != 1:
        raise PackageError(f"an aot_compile entry calls {len(graphs)} compiled graphs, not one")
    name, backend_id = graphs[0]
    compiled = f_globals.get(name, f_globals.get(f"{name}_pkg{package._uid}"))
    compiled = getattr(compiled, "_torchdynamo_orig_callable", compiled)
    record = package._graph_records.get(backend_id)
    if record is not None and record.backend.startswith(_CUSTOM_BACKEND):
        return backend_id, record.compiled
    if record is not None and record.backend == "eager":
        return backend_id, GraphModuleSerializableCallable(record.gm)
    if record is not None:
        return backend_id, BundledAOTAutogradSerializableCallable(BundledGraph(compiled, record=record))
    data = BundledGraph.bundle(package._loaded_graph_blobs[backend_id], dict(package._loaded_kernels))
    return backend_id, BundledAOTAutogradSerializableCallable(BundledGraph(compiled, data=data))


class AOTCompiledFunction:
    """A function compiled ahead of time; see the module docstring."""

    def __init__(
        self,
        fn,
        out_code,
        f_globals,
        guards_state: bytes,
        package: CompilePackage,
        closure_codes: tuple = (),
        external_refs: tuple = (),
    ):
        self._fn = fn
        # Code of the closure's objects whose identity guards were left out
        # (NOTE: [Guards on the closure of an aot_compile'd function]).
        self._closure_codes = tuple(closure_codes)
        # Globals a load must be given (NOTE: [Globals of a loaded function]).
        self._external_refs = tuple(external_refs)
        # The frame's locals are those of fn's own code: a functools.wraps
        # wrapper's (*args, **kwargs), not the wrapped function's parameters.
        self._signature = inspect.signature(fn, follow_wrapped=False)
        self._package = package
        self._guards_state = guards_state
        entry_globals = package.entries[0].globals if package.entries else {}
        # See NOTE: [Runtime environment of compiled bytecode]
        self.runtime_env = GraphRuntimeEnv(
            bytecode=out_code,
            pycode=[],
            import_sources={name: ref[1] for name, ref in entry_globals.items() if ref[0] == "module"},
            used_globals=f_globals,
            closure=fn.__closure__,
            argdefs=fn.__defaults__,
            kwdefaults=fn.__kwdefaults__,
            external_refs=set(external_refs),
        )
        # The graph is bound in f_globals already (by Dynamo, or by the load
        # under the name it renamed the bytecode's global to).
        graph_global = next((n for n in out_code.co_names if n.startswith("__compiled_fn")), None)
        self._compiled = self.runtime_env.forward_callable(
            graph_global, f_globals.get(graph_global) if graph_global is not None else None
        )
        self._compiled.__name__ = fn.__name__
        # The saved bytecode calls the compiled graph itself: Dynamo must not
        # look at (or compile) its frame.
        self._run = torch._dynamo.disable(self._compiled)
        self._guard_manager: Optional[Any] = None
        self._check_guards = True
        # Frozen graphs of a loaded function, checked against the module each
        # call passes as its first argument (NOTE: [Parameters of frozen
        # packages]); the last module that passed, so it is checked once.
        self._frozen_checks = list(package.frozen_checks_at_call or ())
        self._frozen_checked_module: Optional[weakref.ref] = None

    @property
    def guard_manager(self):
        if self._guard_manager is None:
            from torch._dynamo.package import load_guard_manager

            self._guard_manager = load_guard_manager(
                self._guards_state, self._fn.__code__, self._compiled.__globals__
            )
        return self._guard_manager

    @functools.cached_property
    def _artifacts(self) -> CompileArtifacts:
        package = self._package
        entry = package.entries[0]
        backend_id, compiled_fn = _serializable_graph(package, entry, self._compiled.__globals__)
        record = package._graph_records.get(backend_id)
        return CompileArtifacts(
            signature=self._signature,
            guard_manager=self._guard_manager,
            guards_state=self._guards_state,
            backend_id=backend_id,
            compiled_fn=compiled_fn,
            original_code=self._fn.__code__,
            runtime_env=self.runtime_env,
            source_info=package.source_info,
            device_type=",".join(sorted(record.devices)) if record is not None and record.devices else "cpu",
            system_info=SystemInfo.current(),
            backend_name=package.backend.kind if package.backend is not None else "loaded",
        )

    def source_info(self) -> SourceInfo:
        """The sources the function was traced from (itself and what it inlined)."""
        return self._package.source_info

    def disable_guard_check(self) -> None:
        """Run without checking guards (inputs are trusted to match the example)."""
        self._check_guards = False

    def prepare_f_locals(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The frame locals the guards check for a call with these arguments:
        the arguments bound to the function's signature, defaults applied (a
        module's forward takes the module as ``self``), and the contents of its
        closure's cells by their free variable names."""
        bound = self._signature.bind(*args, **kwargs)
        bound.apply_defaults()
        f_locals = dict(bound.arguments)
        for name, cell in zip(self._fn.__code__.co_freevars, self._fn.__closure__ or ()):
            f_locals[name] = cell.cell_contents
        return f_locals

    def guard_check(self, *args, **kwargs) -> bool:
        """Whether the guards accept a call with these arguments."""
        return self.guard_manager.check(self.prepare_f_locals(*args, **kwargs))

    def _check_frozen_module(self, args) -> None:
        module = args[0] if args else None
        checked = self._frozen_checked_module
        if checked is not None and checked() is module:
            return
        if not isinstance(module, torch.nn.Module):
            raise PackageError(
                f"aot_compile'd {self._fn.__qualname__} holds frozen graphs (weights "
                "folded into constants) and must be called with its module as the "
                f"first argument, not a {type(module).__name__}"
            )
        for graph, name in self._frozen_checks:
            check_frozen_parameters(graph, module, name)
        self._frozen_checked_module = weakref.ref(module)

    def __call__(self, *args, **kwargs):
        if self._frozen_checks:
            self._check_frozen_module(args)
        if self._check_guards:
            f_locals = self.prepare_f_locals(*args, **kwargs)
            if not self.guard_manager.check(f_locals):
                from torch._dynamo.guards import get_guard_fail_reason_helper

                # No compile id: the reason's "<compile id>: " prefix is dropped below.
                reason = get_guard_fail_reason_helper(
                    self.guard_manager, f_locals, None  # type: ignore[arg-type]
                )
                reason = reason.removeprefix("None: ")
                if _tensor_guards_name_the_scope():
                    from torch._dynamo.guards import strip_local_scope

                    reason = strip_local_scope(reason)
                # Upstream's sentence first (code written for upstream matches
                # it), then what to do about it.
                raise RuntimeError(
                    f"GuardManager check failed, reason: {reason}. aot_compile'd "
                    f"{self._fn.__qualname__} was called with inputs its guards reject: "
                    "call it like the example it was compiled for, compile it again "
                    "for these inputs, or call disable_guard_check() to skip the check"
                )
        return self._run(*args, **kwargs)

    def save_compiled_function(self, path, external_data=None) -> AOTCompileSaveResult:
        """Write the compiled function (the compile package format, one file).

        ``external_data`` is upstream's table of objects to leave out of the file
        (see NOTE: [External data])."""
        result = type(self).serialize(self, external_data)
        path = os.fspath(path)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(result.serialized_data)
        os.replace(tmp, path)
        return result

    @classmethod
    def serialize(cls, fn: AOTCompiledFunction, external_data=None) -> AOTCompileSaveResult:
        """``fn`` as the bytes ``save_compiled_function`` writes."""
        _check_external_data(external_data)
        external_keys = _external_data_keys(fn._fn, external_data or {})
        files, manifest = fn._package.collect_files()
        if manifest["entries"] != 1:
            raise PackageError(
                f"aot_compile'd {fn._fn.__qualname__} could not be saved: its entry "
                f"is not serializable ({'; '.join(fn._package._unsaveable) or 'see warnings'})"
            )
        manifest["aot_compile"] = {
            "module": fn._fn.__module__,
            "qualname": fn._fn.__qualname__,
            "code": _code_record(fn._fn.__code__),
        }
        if fn._closure_codes:
            manifest["aot_compile"]["closure_code"] = [list(c) for c in fn._closure_codes]
        if external_keys:
            manifest["aot_compile"]["external_data"] = external_keys
        if fn._external_refs:
            manifest["aot_compile"]["external_refs"] = list(fn._external_refs)
        buf = io.BytesIO()
        write_archive(buf, files, manifest)
        return AOTCompileSaveResult(serialized_data=buf.getvalue())

    @classmethod
    def deserialize(
        cls, data: bytes, f_globals=None, external_closure_data=None
    ) -> AOTCompiledFunction:
        """The compiled function ``serialize`` turned into ``data``."""
        return load_compiled_function(
            io.BytesIO(data), f_globals=f_globals, external_data=external_closure_data
        )


# NOTE: [Guards on the closure of an aot_compile'd function]
# Upstream's aot_compile, given no guard_filter_fn, leaves out every guard on a
# global and every guard whose type checks an object's identity in this process
# (ID_MATCH, FUNCTION_MATCH, CLOSURE_MATCH, CLASS_MATCH, MODULE_MATCH, NN_MODULE,
# DICT_VERSION, WEAKREF_ALIVE): its compiled function carries the closure it was
# traced with (pickled into the file) and runs with it, so nothing checks that
# the closure is the one traced. Here a guard saved by name keeps its meaning in
# another process (the codecs resolve the name again), so the default leaves out
# only what has none: an identity guard on a function, method or code object
# that is reached through the compiled function's closure and has no stable
# name (the function a local decorator wraps, a bound method captured in a
# functools.partial). Such a guard would refuse the save; without it the
# compiled function runs with the closure of the function it belongs to (the
# live one, found again at load: NOTE: [Finding a local function again]), as
# upstream's runs with the closure saved with it. What survives a process of
# those objects is their code: the file records the fingerprint of each one's
# code, and a load accepts a function only if its closure still reaches code
# with those fingerprints (a wrapper around another function is not the one
# compiled). A guard on anything else is kept, and one the codecs cannot save
# refuses the aot_compile. A guard_filter_fn passed to torch.compile decides
# alone, as upstream's does; when it keeps an identity guard on a closure's
# local function, the refusal is upstream's ("CLOSURE_MATCH guard cannot be
# serialized.").
_IDENTITY_GUARD_TYPES = frozenset(
    {
        "ID_MATCH",
        "FUNCTION_MATCH",
        "CLOSURE_MATCH",
        "CLASS_MATCH",
        "MODULE_MATCH",
        "NN_MODULE",
        "DICT_VERSION",
        "WEAKREF_ALIVE",
    }
)


def _code_of(value) -> Optional[types.CodeType]:
    """The code of a function, a method of one, or a code object."""
    if isinstance(value, types.MethodType):
        value = value.__func__
    if isinstance(value, types.FunctionType):
        return value.__code__
    return value if isinstance(value, types.CodeType) else None


def _root_source(source):
    while getattr(source, "base", None) is not None:
        source = source.base
    return source


def _root_global_name(source) -> Optional[str]:
    """The global a guard's source starts from (None: a local, or none)."""
    name = getattr(_root_source(source), "global_name", None)
    return name if isinstance(name, str) else None


def _root_local_name(source) -> Optional[str]:
    """The frame local a guard's source starts from (None: a global, or none)."""
    name = getattr(_root_source(source), "local_name", None)
    return name if isinstance(name, str) else None


class _AOTGuardFilter:
    """The guard filter of an aot_compile (NOTE: [Guards on the closure of an
    aot_compile'd function]): ``user_filter`` when one is given, else every
    guard but the closure's identity guards that cannot be saved."""

    def __init__(self, fn: types.FunctionType, user_filter) -> None:
        self.freevars = frozenset(fn.__code__.co_freevars)
        self.user_filter = user_filter
        self.closure_codes: dict[tuple, None] = {}
        self.refusals: list[str] = []
        # Globals that are graph inputs (NOTE: [Globals of a loaded function]).
        self.tensor_globals: set[str] = set()

    def _unsaveable_closure_identity(self, entry) -> Optional[types.CodeType]:
        """The code of the object ``entry`` guards the identity of, when it is
        reached through the closure and has no stable name."""
        from torch._dynamo.guard_serialization import find_stable_name

        types_ = {entry.guard_type, *(entry.derived_guard_types or ())}
        if not (types_ & _IDENTITY_GUARD_TYPES and entry.has_value):
            return None
        if entry.is_global or _root_local_name(entry.source) not in self.freevars:
            return None
        code = _code_of(entry.value)
        if code is None or find_stable_name(entry.value) is not None:
            return None
        return code

    def __call__(self, entries) -> list[bool]:
        for entry in entries:
            if entry.guard_type == "TENSOR_MATCH" and entry.is_global:
                name = _root_global_name(entry.source)
                if name is not None:
                    self.tensor_globals.add(name)
        if self.user_filter is not None:
            keep = list(self.user_filter(entries))
            for entry, kept in zip(entries, keep):
                if kept and self._unsaveable_closure_identity(entry) is not None:
                    self.refusals.append(
                        f"{entry.guard_type} guard cannot be serialized. Guarded source: "
                        f"{entry.orig_guard.name}. It guards on the identity of "
                        f"{type(entry.value).__name__} {getattr(entry.value, '__qualname__', '')}, "
                        "which has no stable name in another process; leave it to "
                        "aot_compile's default guard filter (the compiled function runs "
                        "with the closure of the function it is loaded for) or define it "
                        "at module scope"
                    )
            return keep
        keep = []
        for entry in entries:
            code = self._unsaveable_closure_identity(entry)
            if code is not None:
                self.closure_codes[tuple(_code_record(code))] = None
            keep.append(code is None)
        return keep


def _compile_fullgraph(fn, backend, args, kwargs, guard_filter, dynamic=None) -> CompilePackage:
    # What runs is the copy, whose code holds this compile's entry alone: the
    # package takes no other package's entries of fn's code when saved (NOTE:
    # [Entries a package's model uses] in package_recording.py); it saves its one entry.
    package = CompilePackage(fn, adopts_entries=False)
    fresh = _fresh_function(fn)
    compiled = torch._dynamo.optimize(
        backend, nopython=True, package=package, guard_filter_fn=guard_filter, dynamic=dynamic
    )(fresh)
    # See NOTE: [aot_compile is not a recompile]
    with torch.compiler.set_stance("default"):
        compiled(*args, **kwargs)
    # The manifest names the filter the user gave (NOTE: [Guard filter of a
    # package]), not the one aot_compile wraps it in.
    note_guard_filter(package, guard_filter.user_filter)
    return package


def _check_custom_backend_output(package: CompilePackage) -> None:
    """Refuse, as upstream does at compile time, a backend whose compiled graph
    cannot be saved (see NOTE: [Custom backend artifacts] in package.py)."""
    recording = package.backend
    if recording is None or not recording.kind.startswith(_CUSTOM_BACKEND):
        return
    for _, record in recording.records.values():
        if not isinstance(record.compiled, SerializableCallable):
            raise RuntimeError(
                f"Compiled function type {type(record.compiled)} (produced from "
                f"backend {recording.compiler_fn}) does not implement "
                "SerializableCallable. aot_compile saves a custom backend's graphs "
                "through torch._dynamo.aot_compile_types.SerializableCallable: return "
                "an instance of a subclass of it from the backend"
            )


def aot_compile_fullgraph(
    fn, backend, example_inputs, guard_filter_fn=None, dynamic: Optional[bool] = None
) -> AOTCompiledFunction:
    """``torch.compile(fn, fullgraph=True).aot_compile((args, kwargs))``; the
    guards kept are those ``guard_filter_fn`` (torch.compile's option) selects,
    and ``dynamic`` is torch.compile's (None: its default; False: static
    shapes, automatic dynamic shapes off, as upstream's)."""
    require_aot_compile_enabled()
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
    guard_filter = _AOTGuardFilter(fn, guard_filter_fn)
    package = _compile_fullgraph(fn, backend, args, kwargs, guard_filter, dynamic)
    # The function's own source is one of those it was traced from.
    package.source_info.add_code(fn.__code__)
    _check_custom_backend_output(package)
    if len(package.entries) != 1:
        reasons = "; ".join(package._unsaveable) or "no entry was recorded"
        if guard_filter.refusals:
            # Upstream's sentence first (NOTE: [Guards on the closure of an
            # aot_compile'd function]).
            raise PackageError(f"{guard_filter.refusals[0]} (aot_compile of {fn.__qualname__})")
        raise PackageError(f"aot_compile of {fn.__qualname__} failed: {reasons}")
    entry = package.entries[0]
    out_code = load_code(entry.out_code, f"the aot_compile entry of {fn.__qualname__}")
    return AOTCompiledFunction(
        fn,
        out_code,
        fn.__globals__,
        entry.guards_state,
        package,
        closure_codes=tuple(guard_filter.closure_codes),
        external_refs=_external_refs(out_code, guard_filter.tensor_globals),
    )


# NOTE: [Globals of a loaded function]
# Upstream's file holds, of the globals its bytecode reads, only those that are
# graph inputs (by value) and the builtins; Dynamo's own (compiled graphs,
# module aliases, the builtins dict) are rebuilt at load. Any other global the
# bytecode reads (a class it builds its output with, say) is an external
# reference: a load must be given it in ``f_globals``, or fails with upstream's
# "Missing required external references". Here the compiled code could read
# them from the function's own module, found again at load; the file records
# them all the same and a load checks them as upstream's does, so that code
# written for either loads on both. A global is a graph input when a
# TENSOR_MATCH guard starts from it.


def _external_refs(code: types.CodeType, graph_input_globals) -> tuple[str, ...]:
    """The globals ``code`` reads that a load must be given (NOTE: [Globals of
    a loaded function])."""
    import builtins
    import dis

    from torch._dynamo.guard_serialization import is_dynamo_installed_global

    names = {
        ins.argval
        for ins in dis.get_instructions(code)
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str)
    }
    return tuple(
        sorted(
            name
            for name in names
            if not (
                name.startswith("__")
                or is_dynamo_installed_global(name)
                or hasattr(builtins, name)
                or name in graph_input_globals
            )
        )
    )


# NOTE: [External data]
# Upstream pickles the compiled function's closure (and default arguments) into
# the file and refuses the nn.Modules it reaches unless they are named in
# ``external_data`` ({key: object}), which leaves them out of the file as their
# keys; a load must then give an object for every such key in its own
# ``external_data``. A file written here holds no closure: the compiled code
# runs with the closure of the live function, found again at load (NOTE:
# [Finding a local function again]). The contract is upstream's all the same,
# so that code written for upstream fails and succeeds as it does there: a save
# refuses a closure that reaches an nn.Module not named in ``external_data``,
# with upstream's error; the file records the keys of the named objects the
# closure reaches; a load without one of them fails with upstream's error. What
# the objects given at load mean here is which function the file belongs to: a
# function whose closure does not reach them (by identity) is not it.
# "Reaches" is what upstream's pickler would walk into: cells, default
# arguments, containers, functools.partial, bound methods, local functions'
# closures and defaults, and plain objects' attributes; not into nn.Modules,
# tensors, classes, modules or module-level functions (pickled by name).
_WALK_LIMIT = 100_000


def _check_external_data(external_data) -> None:
    if external_data is not None and not (
        isinstance(external_data, dict) and all(isinstance(k, str) for k in external_data)
    ):
        raise TypeError(
            f"external_data must be a dict with str keys, not {type(external_data).__name__}"
        )


def _closure_objects(fn: types.FunctionType, stop_ids=frozenset()) -> list:
    """What ``fn``'s closure and defaults reach (NOTE: [External data]); objects
    whose id is in ``stop_ids`` are listed, not walked into."""
    stack: list = []

    def push_function(f: types.FunctionType) -> None:
        for cell in f.__closure__ or ():
            try:
                stack.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        stack.extend(f.__defaults__ or ())
        stack.extend((f.__kwdefaults__ or {}).values())

    push_function(fn)
    stack.reverse()
    seen: set[int] = set()
    found: list = []
    leaves = (torch.nn.Module, torch.Tensor, type, types.ModuleType, types.CodeType)
    while stack and len(found) < _WALK_LIMIT:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        found.append(obj)
        if id(obj) in stop_ids or isinstance(obj, leaves):
            continue
        before = len(stack)
        if isinstance(obj, functools.partial):
            stack.extend((obj.func, *obj.args, *obj.keywords.values()))
        elif isinstance(obj, types.MethodType):
            stack.extend((obj.__func__, obj.__self__))
        elif isinstance(obj, types.FunctionType):
            if "<locals>" in obj.__qualname__:
                push_function(obj)
        elif isinstance(obj, (tuple, list, set, frozenset)):
            stack.extend(obj)
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(getattr(obj, "__dict__", None), dict):
            stack.extend(vars(obj).values())
        stack[before:] = stack[before:][::-1]
    return found


def _external_data_keys(fn: types.FunctionType, external_data: dict) -> list[str]:
    """The keys of the ``external_data`` objects ``fn``'s closure reaches;
    upstream's RuntimeError if it reaches an nn.Module that is not one of them."""
    keys = {id(v): k for k, v in external_data.items()}
    reached = _closure_objects(fn, frozenset(keys))
    unnamed = [o for o in reached if isinstance(o, torch.nn.Module) and id(o) not in keys]
    if unnamed:
        raise RuntimeError(
            f"Failed to serialize the following objects: {unnamed}\n"
            "Please mark these as external data by using `external_data={'key': ...}` "
            f"(the closure of {fn.__qualname__} holds them; a load gives them again "
            "with the same keys)"
        )
    return sorted({keys[id(o)] for o in reached if id(o) in keys})


def load_compiled_function(file, *, f_globals=None, external_data=None) -> AOTCompiledFunction:
    """Read a compiled function written by ``save_compiled_function``.

    ``file`` is a binary file object or a path. The function it was compiled from
    must exist in this process: importable by its module and qualified name, or,
    for a function defined in a local scope, alive (see
    NOTE: [Finding a local function again]). ``f_globals``: globals the compiled
    code (and its guards) read, over those of the function's module, as
    upstream's ``f_globals``; ``external_data``: see NOTE: [External data].
    The garbage collector is left as it is (NOTE: [Loads leave the garbage
    collector alone]).
    """
    return _load_compiled_function(file, f_globals, external_data)


def _load_compiled_function(file, f_globals, external_data) -> AOTCompiledFunction:
    _check_external_data(external_data)
    if f_globals is not None and not isinstance(f_globals, dict):
        raise TypeError(f"f_globals must be a dict, not {type(f_globals).__name__}")
    if isinstance(file, (str, os.PathLike)):
        with open(file, "rb") as f:
            return _load_compiled_function(f, f_globals, external_data)
    where = getattr(file, "name", "<file>")
    files, manifest = read_archive(file, where)
    if "aot_compile" not in manifest:
        raise PackageError(f"{where} is a compile package, not an aot_compile'd function")
    # The function first: the entry is checked against it (its bytecode, the
    # module it runs in) before anything is installed.
    saved = manifest["aot_compile"]
    closure_codes, external_keys, external_refs = _saved_closure_fields(saved, where)
    # See NOTE: [Globals of a loaded function]
    missing_refs = [r for r in external_refs if r not in (f_globals or {})]
    if missing_refs:
        raise RuntimeError(
            f"Missing required external references: {missing_refs}. Please load AOT "
            "compiled function with `f_globals=<enclosing global scope>` (the compiled "
            f"code of {saved.get('qualname')} reads them)"
        )
    # See NOTE: [External data]
    for key in external_keys:
        if key not in (external_data or {}):
            raise RuntimeError(
                f"Missing required external reference to data: {key}. Please load AOT "
                "compiled function with `external_data=<external data dictionary>` "
                f"({where} was saved with external_data keys {external_keys})"
            )
    external = [(key, (external_data or {})[key]) for key in external_keys]

    def belongs(candidate) -> Optional[str]:
        return _closure_mismatch(candidate, closure_codes, external)

    fn = _function_of(
        ("function", saved.get("module"), saved.get("qualname")), saved, where, belongs
    )
    package = CompilePackage(fn)
    package.frozen_checks_at_call = []
    # A loaded function cannot compile again: compiled from other code or
    # config, it is an error (NOTE: [What an entry was derived from]).
    package.refuse_stale = True
    loaded = package.load_files(files, manifest, where)
    if len(loaded) != 1:
        raise PackageError(f"{where} holds {len(loaded)} entries, not one")
    entry = loaded[0]
    _check_belongs(entry, fn, where)
    runtime_globals = entry.f_globals
    if f_globals is not None:
        runtime_globals = {**entry.f_globals, **f_globals}
    return AOTCompiledFunction(
        fn,
        entry.out_code,
        runtime_globals,
        entry.entry.guards_state,
        package,
        closure_codes=closure_codes,
        external_refs=external_refs,
    )


def _saved_closure_fields(saved: Any, where) -> tuple[tuple, list[str], tuple]:
    """The manifest's closure code fingerprints, external data keys and
    external references, checked."""
    if not isinstance(saved, dict):
        raise PackageError(f"{where}: the manifest's aot_compile field is not an object")
    codes = saved.get("closure_code", [])
    keys = saved.get("external_data", [])
    refs = saved.get("external_refs", [])
    if not (
        isinstance(codes, list)
        and all(
            isinstance(c, list)
            and len(c) == 3
            and isinstance(c[0], str)
            and type(c[1]) is int
            and isinstance(c[2], str)
            for c in codes
        )
        and isinstance(keys, list)
        and all(isinstance(k, str) for k in keys)
        and isinstance(refs, list)
        and all(isinstance(r, str) for r in refs)
    ):
        raise PackageError(f"{where}: the manifest's aot_compile closure fields are malformed")
    return tuple(tuple(c) for c in codes), keys, tuple(refs)


def _closure_mismatch(fn, closure_codes, external) -> Optional[str]:
    """Why ``fn``'s closure is not the one a file was compiled with (NOTE:
    [Guards on the closure of an aot_compile'd function], NOTE: [External
    data]), or None."""
    if not closure_codes and not external:
        return None
    reached = _closure_objects(fn)
    ids = {id(o) for o in reached}
    for key, obj in external:
        if id(obj) not in ids:
            return f"its closure does not hold external_data[{key!r}]"
    codes = {tuple(_code_record(c)) for c in map(_code_of, reached) if c is not None}
    for code in closure_codes:
        if code not in codes:
            return (
                f"its closure holds no function with the code it was compiled with "
                f"({code[0]}:{code[1]})"
            )
    return None


def _check_belongs(entry, fn, where) -> None:
    """The loaded bytecode runs in ``fn``'s module and has ``fn``'s code's identity
    (NOTE: [Bytecode of loaded entries])."""
    from .package_store import check_bytecode_belongs

    if entry.entry.global_module != fn.__globals__.get("__name__"):
        raise PackageError(
            f"{where}: its entry runs in module {entry.entry.global_module[:100]!r}, not in "
            f"{fn.__globals__.get('__name__')!r} where {fn.__qualname__} lives"
        )
    check_bytecode_belongs(entry.out_code, fn.__code__, f"{where}: entry of {fn.__qualname__}")


# NOTE: [Finding a local function again]
# A saved function is found again by its module and qualified name. A function
# defined in a local scope (``<locals>`` in its qualified name) has no such path:
# it is looked up among the functions alive in this process, by module,
# qualified name and code (its code_fingerprint, saved with it). A
# process where it does not exist (a fresh one, typically) cannot load it: a
# PackageError says so. A candidate whose closure does not reach the code the
# file recorded (NOTE: [Guards on the closure of an aot_compile'd function]) or
# the objects given as external_data (NOTE: [External data]) is not it; that
# tells apart the wrappers one decorator made. If several live functions are
# left and differ in closure or defaults, they are looked for again after a
# garbage collection (a finished scope's cycles keep functions alive); if they
# still differ, which one was meant is unknowable: a PackageError too.
#
# The live functions are found by scanning the heap (gc.get_objects()), not
# by following references from somewhere narrower, because the refusal above
# needs every candidate: a local function may be held by anything (an
# attribute of a model, a list, another function's closure, a local of
# another thread's frame, a module global a decorator assigned). A search
# from the loading frames and the function's module would see a subset, and
# where the subset held one of two functions that differ only in closure
# values (make(2) and make(3)) it would load for the one it saw with no way
# to know the caller meant the other. The scan reads the heap and changes
# nothing; the one collection it may run is a plain gc.collect(), only when
# candidates are left that differ.
#
# Upstream does without a search: its file holds the function's code and the
# pickled contents of its closure and defaults, and a load builds the function
# from them, in any process. That function runs the saving process's closure
# values (a scale, a flag, a tensor a factory captured), not the loading
# process's, and nothing at load compares the two: its guards read the closure
# they were loaded with. A package here never runs code, weights or config
# other than the loading process's, so a local function is the live one or
# none, and finding the live one takes the scan.


def _function_of(code_key, saved: Any, where, belongs=None):
    """The live function an aot_compile'd entry belongs to: by the function's own
    module and qualified name as saved (a functools.wraps wrapper carries the
    wrapped function's, not its code's), else by its code's; ``belongs(fn)``
    says why a function's closure is not the one compiled (None: it is)."""
    if belongs is None:
        def belongs(fn):
            return None

    if not isinstance(saved, dict):
        raise PackageError(f"{where}: the manifest's aot_compile field is not an object")
    _, code_module, code_qualname = code_key
    module_name = saved.get("module", code_module)
    qualname = saved.get("qualname", code_qualname)
    saved_code = saved.get("code")
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        raise PackageError(f"{where}: the manifest names no function to load into")
    if "<locals>" in qualname:
        return _live_local_function(module_name, qualname, saved_code, where, belongs)
    obj: Any = sys.modules.get(module_name)
    try:
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        obj = None
    fn = getattr(obj, "__func__", obj)
    if not isinstance(fn, types.FunctionType):
        raise PackageError(
            f"{where} was compiled from {qualname} in module {module_name}, which "
            "cannot be found in this process"
        )
    mismatch = belongs(fn)
    if mismatch is not None:
        raise PackageError(
            f"{where} was compiled from {qualname} in module {module_name}, but "
            f"{mismatch}: it is not the function the file was compiled from"
        )
    return fn


def _same_function(a: types.FunctionType, b: types.FunctionType) -> bool:
    """Whether two functions of one code run alike: same defaults, same closure
    contents (by identity)."""

    def contents(f):
        out = []
        for cell in f.__closure__ or ():
            try:
                out.append(cell.cell_contents)
            except ValueError:  # an empty cell
                out.append(_EMPTY_CELL)
        return out

    return (
        a.__code__ is b.__code__
        and a.__defaults__ == b.__defaults__
        and a.__kwdefaults__ == b.__kwdefaults__
        and len(contents(a)) == len(contents(b))
        and all(x is y for x, y in zip(contents(a), contents(b)))
    )


_EMPTY_CELL = object()


def _live_local_function(module_name, qualname, saved_code, where, belongs):
    def select() -> tuple[list, list, list]:
        candidates = [
            obj
            for obj in gc.get_objects()
            if type(obj) is types.FunctionType
            and obj.__qualname__ == qualname
            and obj.__module__ == module_name
            and obj not in _COMPILE_COPIES
            and (saved_code is None or _code_record(obj.__code__) == saved_code)
        ]
        mismatches = [belongs(c) for c in candidates]
        matching = [c for c, reason in zip(candidates, mismatches) if reason is None]
        return candidates, mismatches, matching

    def ambiguous(matching) -> bool:
        return not all(_same_function(other, matching[0]) for other in matching[1:])

    candidates, mismatches, matching = select()
    if ambiguous(matching):
        # Functions only garbage keeps alive (a cycle through a module that
        # holds its own compiled forward, say) are no candidates.
        gc.collect()
        candidates, mismatches, matching = select()
    if not candidates:
        raise PackageError(
            f"{where} was compiled from {qualname} in module {module_name}, which "
            "cannot be found in this process: it is defined in a local scope, so it "
            "loads only where that function exists (define it at module level to "
            "load it anywhere)"
        )
    if not matching:
        raise PackageError(
            f"{where} was compiled from {qualname} in module {module_name}: "
            f"{len(candidates)} live function(s) of that name exist in this process, "
            f"but none is the one compiled ({next(m for m in mismatches if m)})"
        )
    if ambiguous(matching):
        raise PackageError(
            f"{where} was compiled from {qualname} in module {module_name}: "
            f"{len(matching)} live functions of that name exist in this process and "
            "differ in their closures or defaults, so which one it belongs to is unknown"
        )
    return matching[0]


# ---------------------------------------------------------------------------
# nn.Module entry points (OptimizedModule._aot_compile and friends)
# ---------------------------------------------------------------------------


# NOTE: [Pickles of compiled functions]
# Upstream pickles a compiled function's CompileArtifacts whole with
# AOTCompilePickler and reads them back with AOTCompileUnpickler, which builds
# whatever classes the bytes name. Here one compiled function is a package
# archive (files checked against a manifest, graphs read with the package's
# graph allow-list: NOTE: [Trust model of compile packages]), so what is left
# to pickle are the records that hold such archives, as the bytes of builtins:
# the compiled functions of a module (AOTCompiledModel.serialize). The pickler
# has upstream's external data contract: an object of ``external_data`` is
# written as its key, an nn.Module that is not one is collected in ``errors``
# for the caller to refuse. The unpickler builds no class at all (a pickle
# naming one is refused with a PackageError, before anything runs) and gives
# back ``external_data``'s object for each key, upstream's RuntimeError for a
# key it was not given.


class AOTCompilePickler(pickle.Pickler):
    """Pickles the records of compiled functions (NOTE: [Pickles of compiled
    functions]); the objects of ``external_data`` as their keys."""

    def __init__(self, external_data: dict[str, object], buf: io.BytesIO) -> None:
        super().__init__(buf, protocol=pickle.HIGHEST_PROTOCOL)
        self.external_data = external_data
        self.id_map: dict[int, str] = {id(value): key for key, value in external_data.items()}
        # nn.Modules met that are not external data, by id: the caller refuses them.
        self.errors: dict[int, object] = {}

    def persistent_id(self, obj: object) -> Optional[object]:
        key = self.id_map.get(id(obj))
        if key is not None:
            return key
        if isinstance(obj, torch.nn.Module):
            self.errors[id(obj)] = obj
            return id(obj)
        return None


class AOTCompileUnpickler(_BuiltinsOnlyUnpickler):
    """Reads what :class:`AOTCompilePickler` wrote: builtin containers, str,
    bytes and numbers, and the objects of ``external_data`` by key; a pickle
    naming any class or function is refused (NOTE: [Pickles of compiled
    functions])."""

    def __init__(self, external_data: dict[str, object], file: io.BytesIO) -> None:
        super().__init__(file)
        self.external_data = external_data

    def persistent_load(self, key: object) -> object:
        if not isinstance(key, str) or key not in self.external_data:
            raise RuntimeError(
                f"Missing required external reference to data: {str(key)[:80]}. "
                "Please load AOT compiled function with "
                "`external_data=<external data dictionary>`"
            )
        return self.external_data[key]


@dataclasses.dataclass
class ModelInput:
    """One input a module is compiled ahead of time for: positional and keyword
    example arguments, and context managers entered while compiling for them
    (e.g. ``torch.no_grad()``)."""

    args: tuple
    kwargs: dict
    contexts: list


class AOTCompiledModel:
    """A module's forward compiled ahead of time for several inputs. A call runs
    the first compiled function whose guards accept it; when none does, the first
    one raises its guard failure."""

    def __init__(self, model: torch.nn.Module, compiled_results: list[AOTCompiledFunction]):
        if not compiled_results:
            raise ValueError("AOTCompiledModel needs at least one compiled function")
        self.model = model
        self.compiled_results = compiled_results

    def __call__(self, *args, **kwargs):
        for result in self.compiled_results:
            if result.guard_check(self.model, *args, **kwargs):
                return result(self.model, *args, **kwargs)
        return self.compiled_results[0](self.model, *args, **kwargs)

    def serialize(self) -> bytes:
        """Every compiled function, each as ``save_compiled_function`` writes it."""
        buf = io.BytesIO()
        AOTCompilePickler({}, buf).dump(
            [AOTCompiledFunction.serialize(r).serialized_data for r in self.compiled_results]
        )
        return buf.getvalue()

    @classmethod
    def deserialize(cls, model: torch.nn.Module, data: bytes) -> AOTCompiledModel:
        """The compiled forward ``serialize`` wrote, bound to ``model``."""
        try:
            archives = AOTCompileUnpickler({}, io.BytesIO(data)).load()
        except Exception as e:
            raise PackageError(f"aot_compile'd module data is damaged: {e!r}") from e
        if not isinstance(archives, list) or not all(
            isinstance(a, bytes) for a in archives
        ):
            raise PackageError("aot_compile'd module data is damaged: not a list of bytes")
        return cls(model, [AOTCompiledFunction.deserialize(a) for a in archives])


def aot_compile_module(
    model: torch.nn.Module,
    inputs: list[ModelInput],
    backend,
    guard_filter_fn=None,
    dynamic: Optional[bool] = None,
) -> AOTCompiledModel:
    """Compile ``model``'s forward ahead of time once per :class:`ModelInput`."""
    require_aot_compile_enabled()
    results = []
    for model_input in inputs:
        log.info("aot_compile of %s for %s", type(model).__qualname__, model_input)
        with contextlib.ExitStack() as stack:
            for ctx in model_input.contexts:
                stack.enter_context(ctx)
            results.append(
                aot_compile_fullgraph(
                    model.forward,
                    backend,
                    (model_input.args, model_input.kwargs),
                    guard_filter_fn=guard_filter_fn,
                    dynamic=dynamic,
                )
            )
    return AOTCompiledModel(model, results)
