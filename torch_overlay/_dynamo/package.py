"""Compile packages: save what torch.compile built, load it in a fresh process.

A :class:`CompilePackage` lives with one ``torch.compile()`` (``torch.compile(f,
package="dir")``). Every frame Dynamo compiles under it adds an entry: the
transformed bytecode, the serialized guards (``guards_serialization_mode="save"``),
the globals the bytecode needs (compiled graphs, resume functions, module
aliases) and the backend's artifacts for each graph. ``save_package`` writes them
to a directory; ``load_package`` reads them back, and from then on a call whose
frame has no cache entry is first looked up in the package by its serialized
guards: a hit installs the saved bytecode as a normal Dynamo cache entry, with no
trace, no AOTAutograd, no Inductor codegen and no C++ compiler.

Provides :class:`CompilePackage`, :class:`PackageAwareConvertFrame` (the frame
callback wrapper), the package format (:data:`PACKAGE_FORMAT_VERSION`), and
upstream's entry points to saved guards, :func:`load_guards_state` and
:func:`load_guard_manager`. The graphs' artifacts and the package's files are
torch/_dynamo/package_artifacts.py (NOTE: [Package format]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import inspect
import io
import itertools
import logging
import os
import pickle
import shutil
import sys
import threading
import time
import types
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._dynamo.exc import PackageError

from .package_artifacts import (
    _aot_config_fields,
    _CUSTOM_BACKEND,
    _environment,
    _GraphRecord,
    _KernelRedirect,
    _module_path,
    _sha256,
    _write_atomically,
    _FrozenCapture,
    check_frozen_parameters,
    check_manifest,
    deserialize_graph,
    dump_code,
    folded_parameters,
    graph_for_bytecode,
    guard_filter_manifest_fields,
    load_code,
    overlay_series_hash,
    random_calls_as_data,
    random_values_function,
    serialize_graph,
)
from .package_artifacts import SerializedCode  # noqa: F401 (upstream's name)
from .package_format import (
    DYNAMO_FILE as _DYNAMO_FILE,
    graph_file,
    graph_name,
    kernel_file,
    PACKAGE_FORMAT_VERSION,
    SIGNATURE_FILE,
)
from .package_sources import (
    code_fingerprint,
    check_source_records,
    config_records,
    frame_code_record,
    generated_code_owner,
    inlined_code_record,
    LiveSources,
    read_module_lines,
)
from .package_trust import (
    check_files,
    check_manifest_schema,
    extract_kernels,
    manifest_bytes,
    prepare_signing_key,
    read_package,
    sign_manifest,
)


log = logging.getLogger(__name__)


_tls = threading.local()


def load_guards_state(guards_state: bytes):
    """Read the bytes of ``CheckFunctionManager(...).guards_state`` (saved guards).

    Returns the ``GuardsState`` (``.output_graph``, ``.shape_code_parts``) that
    :func:`load_guard_manager` builds a guard manager from. The bytes are read
    with a restricted unpickler; damaged or foreign bytes raise PackageError.
    """
    from torch._dynamo import guard_serialization

    return guard_serialization.load_guards_state(bytes(guards_state))


# NOTE: [Loads leave the garbage collector alone]
# A load neither turns Python's cyclic garbage collector off nor on: gc is
# one switch for the whole process, so a loader that turned it off would turn
# it off for every thread while it ran, and two loads at once (or one inside
# another) would turn it back on while the other still ran. The collections a
# load triggers walk objects the load allocated and the rest of the heap; in
# fresh processes (benchmarks/results/load_time_gc.md) a package load and an
# aot_compile load took as long, as ratios to eager, with the collector
# running as with it paused, within the spread of the runs. A process that
# loads once and then serves can call gc.freeze() after the load itself: that
# moves every object alive then (the loaded code, graphs and guards among
# them) to the permanent generation, which later collections skip; it is the
# caller's choice, because objects frozen are never collected (docs/packages.md).


def load_guard_manager(
    guards_state,
    target_code: types.CodeType,
    runtime_global_scope: dict,
    cache_entry=None,
):
    """The guard manager of saved guards, for frames of ``target_code``.

    ``guards_state`` is what :func:`load_guards_state` returned (or its bytes).
    Globals are read from ``runtime_global_scope`` (the globals of the module
    that owns ``target_code``) whenever the guards run, so a changed global
    fails them. ``.check(f_locals)`` of the result decides like the guards that
    were saved. Built as upstream builds it: the saved OutputGraphGuardsState in
    place of the OutputGraph, with its shape_code_parts.
    """
    from torch._dynamo.guards import CheckFunctionManager

    if isinstance(guards_state, (bytes, bytearray, memoryview)):
        guards_state = load_guards_state(guards_state)
    return CheckFunctionManager(
        target_code,
        guards_state.output_graph,
        cache_entry,
        shape_code_parts=guards_state.shape_code_parts,
        runtime_global_scope=runtime_global_scope,
    ).guard_manager


# NOTE: [One strict flag]
# Whether an entry precompile cannot save (or a stale entry at load) is an
# error rather than a warning is one choice, upstream's
# config.strict_precompile. The compile packages' earlier name for it,
# config.package_strict (env TORCH_DYNAMO_PACKAGE_STRICT), is kept as another
# spelling of that choice. A config alias would make it one flag in the config
# module itself, but torch 2.6.0 (a supported base) has no config aliases, so
# the two are read together in one place, strict_precompile(), and nowhere
# else. strict_precompile alone also makes an AOTAutograd cache bypass raise
# (in the patched AOTAutograd cache, which reads upstream's flag).


def strict_precompile() -> bool:
    """Whether precompile refuses what it would leave out with a warning
    (NOTE: [One strict flag])."""
    from torch._dynamo import config

    return bool(config.strict_precompile or config.package_strict)


def current_package() -> Optional[CompilePackage]:
    """The package recording the frame Dynamo is compiling on this thread, if any."""
    return getattr(_tls, "package", None)


@contextlib.contextmanager
def _recording(package: Optional[CompilePackage]):
    previous = getattr(_tls, "package", None)
    _tls.package = package
    try:
        yield
    finally:
        _tls.package = previous


# NOTE: [Entries a package's model uses]
# Dynamo's cache lives on code objects, not on torch.compile() wrappers: a model
# and its EMA copy (one class) compiled with two packages share their forward's
# cache entries, and 2.7.1 serves a frame from an entry compiled under the other
# package whenever that entry's guards accept the frame and the two backends are
# equal (eval_frame.c follows _torchdynamo_orig_callable to the raw backend, so
# the packages' RecordingBackends do not tell them apart). The frame callback,
# and so the package, never sees such a hit, yet the package must hold the entry
# to load alone in a fresh process. Guards stay pure (nothing runs on a hit
# beyond Dynamo's own checks); a package takes such entries when it is saved
# (CompilePackage._adopt_shared_entries):
# - every entry compiled under a package, or installed from one, is noted with
#   what another package needs to hold it (_EntryOrigin) and its code, keyed by
#   its guard manager (_note_origin), which the cache entry holds and drops with
#   it;
# - at save, a package whose callable Dynamo runs (runs_under) walks the live
#   cache entries of the codes its model runs: its root code (Dynamo's inline
#   wrapper for a module compiled through it), the codes of its own entries,
#   and the codes of every package whose entry it takes. It takes each noted
#   entry of another package that the C cache would give its model: the code
#   key is the one this package gives that code (so one module class's inline
#   wrapper entries do not go to another class's package), and the backends'
#   cache keys are equal.
# Nothing says which of those entries its model's calls hit (that took a guard
# with a side effect), so guards decide at load which of them serve: a model
# whose weights, config or inputs differ in what the guards read may carry the
# other model's entries, which its guards reject (a larger package, never
# another result: FSDP2 blocks of one class each hold the entry of the first
# block's input, which needs no grad, and that of the others'). A taken entry
# a fresh process could not find the code of (a resume function whose
# caller's entry is not taken) is dropped silently: the model may never have
# run it, and warning, or failing a strict save, would be wrong. Not adopted:
# entries compiled without a package (they have no saved guards), frozen
# graphs (their constants are the other model's weights), entries no longer
# in a code's cache when the package is saved (torch._dynamo.reset() dropped
# them), and frame decisions (NOTE: [Frames Dynamo skips]): the C cache keeps
# a code's skip or run-only action as state of the code, not as an entry, and
# has no way to read it back, so a reset would leave a taken decision stale; a
# model loaded without it makes it again by tracing (eager, or its own
# compile: nothing of the other model's).
_entry_origins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _note_origin(guard_manager, origin: _EntryOrigin, code: types.CodeType) -> None:
    """Note ``origin`` for the cache entry whose guards are ``guard_manager``
    (NOTE: [Entries a package's model uses])."""
    try:
        _entry_origins[guard_manager] = (origin, code)
    except TypeError:
        # A guard manager no weak reference reaches: no other package takes it.
        return


def _same_cache_key(key, other) -> bool:
    """Whether the C cache gives entries keyed by ``key`` to a callback keyed
    by ``other``: the same object, or equal objects of one type (extra_state.cpp's
    backend_match; two torch.compile()s with one backend and options)."""
    return key is other or (type(key) is type(other) and bool(key == other))


# ---------------------------------------------------------------------------
# Code objects across processes
# ---------------------------------------------------------------------------


# NOTE: [Keys of package entries]
# An entry is looked up by the code object of the frame being called, so the
# package keys each entry by something a fresh process can find that code by:
#   ("function", module, qualname)  a function reachable from its module by
#                                   name, or the code of the compiled callable
#                                   itself (the package's root), by qualname;
#   ("resume", name, fingerprint)   a resume function Dynamo generated at a
#                                   graph break. Its name is not unique (every
#                                   graph break on one line gives the same name,
#                                   and a recursive function re-enters the same
#                                   resume code from many entries), and a fresh
#                                   process holds as many copies of it as there
#                                   are saved entries that call it. The key is
#                                   a fingerprint of the code's contents, so
#                                   every copy (and the copy Dynamo generates
#                                   again if a caller recompiles) matches;
#   ("inline_wrapper", module, qualname of the module's class)
#                                   a built-in nn.Module (or one whose forward
#                                   Dynamo skips) compiled through Dynamo's
#                                   inline wrapper (external_utils.wrap_inline):
#                                   the frame is the wrapper's, whose code every
#                                   such module shares, so the key names the
#                                   class of the module really compiled and only
#                                   a package compiled for that class uses it.
# A key that cannot be found again in a fresh process (a nested function, a
# local class's method reached through a graph break) leaves its entry out at
# save, with a warning (an error with config.strict_precompile).


def _is_resume_code(code: types.CodeType) -> bool:
    return code.co_name.startswith(("torch_dynamo_resume_in_", "__resume_at_"))


@functools.cache
def _inline_wrapper_code() -> types.CodeType:
    """The code of the frame Dynamo compiles for a module whose forward it skips
    (OptimizedModule wraps such a module with external_utils.wrap_inline)."""
    from torch._dynamo import external_utils

    return external_utils.wrap_inline(_inline_wrapper_code).__code__


def _compiled_through_inline_wrapper(module) -> bool:
    """Whether torch.compile(module) runs ``module`` through the inline wrapper
    (the same test OptimizedModule makes)."""
    from torch._dynamo import trace_rules

    forward = getattr(module, "forward", None)
    return isinstance(forward, types.MethodType) and bool(trace_rules.check(forward))


def _code_key(code: types.CodeType, f_globals: dict) -> tuple:
    if _is_resume_code(code):
        return ("resume", code.co_name, code_fingerprint(code))
    if code.co_filename.startswith("<") and "<locals>" in code.co_qualname:
        # Compiled from a string (a dataclass's __init__): found by its function's name.
        owner = generated_code_owner(code)
        if owner is not None:
            return ("function", *owner)
    return ("function", f_globals.get("__name__"), code.co_qualname)


def _describe_key(key: tuple) -> str:
    """A package entry's key, for people."""
    if key[0] == "resume":
        return f"resume function {key[1]}"
    if key[0] == "inline_wrapper":
        return f"{key[1]}.{key[2]} (through Dynamo's inline wrapper)"
    return f"{key[2]} (module {key[1]})"


def _resolve_code(key: tuple, root_codes: list[types.CodeType]):
    if key[0] != "function":
        return None
    _, module_name, qualname = key
    for code in root_codes:
        if code.co_qualname == qualname:
            return code
    module = sys.modules.get(module_name)
    if module is None:
        return None
    # A function defined inside another one (contextlib.contextmanager's
    # helper, which runs under DDP's forward) is a code constant of the
    # enclosing function's code, found by its qualname when there is just one.
    outer, _, _ = qualname.partition(".<locals>.")
    if "<" in outer:
        return None
    obj = module
    try:
        for part in outer.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return None
    obj = getattr(obj, "__func__", obj)
    # A decorated function (functools.wraps: transformers' can_return_tuple on
    # forward) is found as its wrapper; its code is the wrapped one's.
    for _ in range(8):
        found_code = getattr(obj, "__code__", None)
        if found_code is None or found_code.co_qualname == outer or not hasattr(obj, "__wrapped__"):
            break
        obj = getattr(obj.__wrapped__, "__func__", obj.__wrapped__)
    outer_code = getattr(obj, "__code__", None)
    if outer_code is None or outer == qualname:
        return outer_code
    found = [c for c in _nested_codes(outer_code) if c.co_qualname == qualname]
    return found[0] if len(found) == 1 else None


def _rename_globals(code: types.CodeType, renames: dict[str, str]) -> types.CodeType:
    consts = tuple(
        _rename_globals(c, renames) if isinstance(c, types.CodeType) else c
        for c in code.co_consts
    )
    names = tuple(renames.get(n, n) for n in code.co_names)
    return code.replace(co_names=names, co_consts=consts)


def _nested_codes(code: types.CodeType):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _nested_codes(const)


def _all_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for nested in _nested_codes(code):
        names |= set(nested.co_names)
    return names


# ---------------------------------------------------------------------------
# Backend artifacts
# ---------------------------------------------------------------------------


class _AOTCompileListener:
    """What AOTAutograd produced for one packaged graph's compile: its cache key
    and entry, and for a frozen graph what freezing built (NOTE: [Frozen graphs
    in packages]). Installed for that compile only (NOTE: [AOTAutograd compile
    listeners] in torch/_functorch/_aot_autograd/autograd_cache.py)."""

    # DDPOptimizer's pieces compile with fakify_first_call, which AOTAutograd's
    # cache bypasses; the package saves their entries itself (NOTE: [Listeners
    # and fakify_first_call compiles] in autograd_cache.py; NOTE: [DDPOptimizer
    # graphs in packages]).
    record_fakified_compiles = True

    def __init__(self, record: _GraphRecord) -> None:
        self.record = record

    def on_cache_key(self, key, gm, aot_config) -> None:
        if key is None:
            return
        self.record.aot_cache_key = key
        self.record.aot_config = _aot_config_fields(aot_config)

    def on_cache_entry(self, key, entry) -> None:
        if key == self.record.aot_cache_key:
            self.record.aot_entry = entry

    def on_inference_compiled(self, compiled) -> None:
        capture = self.record.frozen
        if capture is None:
            return
        from torch._inductor import config as inductor_config

        capture.aot_config = compiled.aot_config
        capture.dispatch_wrappers = compiled.dispatch_wrappers
        capture.maybe_subclass_meta = compiled.maybe_subclass_meta
        capture.fw_metadata = compiled.fw_metadata
        # freeze() folded the constants into this very graph module.
        capture.frozen_gm = compiled.fw_module
        capture.freezing_wrapper = compiled.compiled_fw
        capture.weight_prepack = bool(inductor_config.cpp.weight_prepack)


# NOTE: [Compile options in packages]
# torch.compile's mode and options reach the backend, not Dynamo: Inductor's
# wrapper turns mode= into Inductor config (max-autotune, triton.cudagraphs...)
# and merges options=; any other backend gets mode= and options= as keyword
# arguments. A package saves what they produced: Dynamo's bytecode and guards
# (fullgraph= and dynamic= act there: the guards hold the shape decisions) and
# each compiled graph (Inductor's generated code and kernels, a custom
# backend's serialized callable), so an option that only steers compilation
# round-trips by construction. Refused at save, each with a warning naming the
# option (an error with config.strict_precompile), are the options whose effect
# is not in those artifacts or that leave no artifact to save
# (_refused_option). Every package records its options in the manifest.


def compile_options(backend) -> dict[str, Any]:
    """The options torch.compile passed to ``backend`` (Inductor config names for
    Inductor, mode/options keyword arguments for any other backend) and dynamic."""
    for obj in _unwrap_chain(backend):
        cls_name = type(obj).__name__
        if cls_name == "_TorchCompileInductorWrapper":
            return {**obj.config, "dynamic": obj.dynamic}
        if cls_name == "_TorchCompileWrapper":
            return {**obj.kwargs, "dynamic": obj.dynamic}
    return {}


def _refused_option(record: _GraphRecord) -> Optional[str]:
    """Why the graph's options keep it out of a package, naming the option."""
    options = record.options
    if record.freezing and not record.frozen_under_no_grad:
        # See NOTE: [Frozen graphs in packages]
        return (
            "options={'freezing': True} in grad mode: Inductor freezes only under "
            "torch.no_grad(), and 2.7.1's AOTAutograd cache keeps no entry for a graph "
            "compiled with freezing on, so there is no artifact to package; compile "
            "under torch.no_grad() (frozen inference) or without freezing to package it"
        )
    if record.backend == "inductor":
        if options.get("triton.cudagraphs") and "cuda" in record.devices:
            return (
                "mode='reduce-overhead' (Inductor option triton.cudagraphs): a loaded "
                "graph does not record CUDA graphs again; compile with "
                "mode='max-autotune-no-cudagraphs' or the default mode to package it"
            )
        if options.get("force_disable_caches") or options.get("fx_graph_cache") is False:
            name = "force_disable_caches" if options.get("force_disable_caches") else "fx_graph_cache"
            return (
                f"options={{{name!r}: {options[name]!r}}}: the package takes Inductor's "
                "compiled graph from its FX graph cache, which this option turns off"
            )
    return None


# NOTE: [AOTAutogradCache on torch 2.6.0]
# A packaged Inductor graph is saved from its AOTAutogradCache entry. torch 2.7
# turns that cache on by default; torch 2.6.0 (a second supported base) leaves
# it off unless TORCHINDUCTOR_AUTOGRAD_CACHE=1. There a package's graphs compile
# with the cache on, as they would on 2.7, when the environment does not set it.
def _autograd_cache_default() -> dict[str, Any]:
    from torch.torch_version import TorchVersion

    if TorchVersion(torch.__version__) >= "2.7" or "TORCHINDUCTOR_AUTOGRAD_CACHE" in os.environ:
        return {}
    return {"enable_autograd_cache": True}


# NOTE: [A package's backend links straight to the cache key]
# eval_frame.c keys cache entries on the end of the frame callback's
# _torchdynamo_orig_callable chain (get_backend), and walks that chain on every
# call of a compiled callable before it looks an entry up: one hasattr and one
# getattr per link, each of them a new string, hashed and looked up through the
# type's MRO. A plain torch.compile's chain is CatchErrorsWrapper ->
# ConvertFrame -> the backend (WrapBackendDebug -> Inductor's wrapper); a
# package's puts PackageAwareConvertFrame and RecordingBackend in front of the
# backend. RecordingBackend compiles through self.backend and links to the
# chain's end itself, so the walk is as long as a plain compile's, the key is
# the same object, and CatchErrorsWrapper (DDPOptimizer) and ConvertFrameAssert,
# which read the links above it, still find RecordingBackend there.


class RecordingBackend:
    """Wraps a torch.compile backend so that each compiled graph can be packaged."""

    def __init__(self, backend: Callable, kind: str) -> None:
        self.backend = backend
        self.kind = kind
        self.options = compile_options(backend)
        self.records: dict[int, tuple[Any, _GraphRecord]] = {}
        # Every frozen graph compiled so far, in order (the guard filter of a
        # frame reads those its compile added: NOTE: [Parameters of frozen packages]).
        self.frozen_records: list[_GraphRecord] = []
        # See NOTE: [A package's backend links straight to the cache key]
        from torch._dynamo.eval_frame import innermost_fn

        self._torchdynamo_orig_callable = innermost_fn(backend)
        # The compiler function Dynamo's own checks compare with: a frame that
        # runs inside vmap / grad / jvp is traced only for the eager backend
        # (InstructionTranslator._throw_if_in_functorch).
        self.compiler_fn = inspect.getattr_static(backend, "compiler_fn", backend)
        for attr in ("get_compiler_config", "compiler_name"):
            if hasattr(backend, attr):
                setattr(self, attr, getattr(backend, attr))
        # Dynamo enters the backend's own context around every call of the
        # torch.compile()'d callable (the package's mark is a hook of its own:
        # NOTE: [Entries a package's model uses]).
        if hasattr(backend, "backend_ctx_ctor"):
            self.backend_ctx_ctor = backend.backend_ctx_ctor
        self.package_uid: Optional[str] = None

    def __call__(self, gm, example_inputs, **kwargs):
        # A graph for a package: the save that follows signs it with this key
        # (NOTE: [Signing keys are prepared before the save]).
        prepare_signing_key()
        devices = {
            t.device.type
            for t in [*example_inputs, *gm.parameters(), *gm.buffers()]
            if isinstance(t, torch.Tensor)
        }
        record = _GraphRecord(
            self.kind, torch.fx.GraphModule(gm, gm.graph), tuple(sorted(devices))
        )
        record.options = self.options
        record.freezing = self.kind == "inductor" and bool(
            self.options.get("freezing", _inductor_config_value("freezing"))
        )
        record.frozen_under_no_grad = record.freezing and not torch.is_grad_enabled()
        if self.kind == "inductor":
            from torch._functorch._aot_autograd.autograd_cache import compile_listener
            from torch._inductor.codecache import prebuilt_cpp_kernels

            # The package saves both graphs: compile the backward now (its
            # cache entry is reported while the listener is installed, its
            # kernels as Inductor loads them: NOTE: [Kernels of a packaged graph]).
            with torch._functorch.config.patch(
                force_non_lazy_backward_lowering=True, **_autograd_cache_default()
            ), _frozen_compile(record), compile_listener(
                _AOTCompileListener(record)
            ), prebuilt_cpp_kernels(record.note_cpp_kernel):
                compiled = self.backend(gm, example_inputs, **kwargs)
            if record.frozen is not None:
                record.frozen.param_sources = {
                    name: source.name()
                    for name, source in (getattr(gm, "_param_name_to_source", None) or {}).items()
                }
                self.frozen_records.append(record)
        else:
            compiled = self.backend(gm, example_inputs, **kwargs)
        if self.kind.startswith(_CUSTOM_BACKEND):
            record.compiled = compiled
        # Dynamo installs the compiled fn re-wrapped (disable() unwraps to the
        # innermost callable), or another bound method of the same graph module:
        # know every object along the way.
        for obj in (*_unwrap_chain(compiled), gm):
            self.records[id(obj)] = (obj, record)
        return compiled

    def record_for(self, compiled_fn) -> Optional[_GraphRecord]:
        for obj in _unwrap_chain(compiled_fn):
            found = self.records.get(id(obj))
            if found is not None:
                return found[1]
        return None


def _freezing_parameters() -> bool:
    """Whether Dynamo is folding parameters for Inductor's freezing right now."""
    return bool(_inductor_config_value("freezing")) and not torch.is_grad_enabled()


# NOTE: [Weight prepacking in frozen packages]
# On CPU Inductor's cpp.weight_prepack (on by default) turns the frozen conv
# and linear weights into MKLDNN (opaque, unserializable) tensors made by
# packing ops at compile time. A frozen graph a package records is compiled
# with weight prepack off instead (one INFO line says so): the constants stay
# dense and the graph calls the plain ATen conv / addmm kernels. A performance,
# not a correctness, difference (measured in the README); a user who sets
# options={'cpp.weight_prepack': True} explicitly is refused at save, naming it.
@contextlib.contextmanager
def _frozen_compile(record: _GraphRecord):
    """While ``record``'s graph compiles: for a frozen graph, what freezing
    built is recorded and weight prepack is off; else nothing."""
    if not record.frozen_under_no_grad:
        yield
        return
    from torch._inductor import config as inductor_config

    prepack_off: Any = contextlib.nullcontext()
    if "cpp.weight_prepack" not in record.options and inductor_config.cpp.weight_prepack:
        log.info(
            "torch.compile package: compiling a frozen graph with Inductor's "
            "cpp.weight_prepack off (MKLDNN-packed weights cannot be saved)"
        )
        prepack_off = inductor_config.patch({"cpp.weight_prepack": False})
    # Filled by the compile's _AOTCompileListener.
    record.frozen = _FrozenCapture()
    with prepack_off:
        yield


def _with_frozen_parameter_filter(hooks, backend: Optional[RecordingBackend]):
    """``hooks`` for one frame compiled under a package, whose guard_filter_fn
    (after the user's) drops the ID_MATCH guards on the parameters the frame's
    frozen graphs folded (NOTE: [Parameters of frozen packages])."""
    if hooks is None or backend is None or backend.kind != "inductor":
        return hooks
    if not _freezing_parameters():
        # Dynamo folds (and guards by identity) no parameter in this frame.
        return hooks
    user_filter = getattr(hooks, "guard_filter_fn", None)
    first = len(backend.frozen_records)

    def guard_filter_fn(entries):
        keep = list(user_filter(entries)) if user_filter else [True] * len(entries)
        folded = {
            source
            for record in backend.frozen_records[first:]
            if record.frozen is not None
            for source in record.frozen.param_sources.values()
            if _module_path(source) is not None
        }
        if not folded or len(keep) != len(entries):
            return keep
        return [
            kept
            and not (
                entry.guard_type == "ID_MATCH"
                and isinstance(entry.value, torch.Tensor)
                and entry.orig_guard.name in folded
            )
            for kept, entry in zip(keep, entries)
        ]

    return dataclasses.replace(hooks, guard_filter_fn=guard_filter_fn)


def _inductor_config_value(name: str):
    from torch._inductor import config as inductor_config

    return getattr(inductor_config, name)


def _unwrap_chain(fn) -> list:
    chain: list[Any] = []
    while fn is not None and len(chain) < 16:
        chain.append(fn)
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            chain.append(owner)
        fn = getattr(fn, "_torchdynamo_orig_callable", None)
    return chain


def backend_kind(backend) -> str:
    """How a package saves the graphs ``backend`` compiles: ``eager``,
    ``aot_eager``, ``inductor``, or ``custom:<name>`` for any other backend."""
    if type(backend).__name__ == "_TorchCompileInductorWrapper":
        return "inductor"
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", "")
    if isinstance(backend, str):
        name = backend
    if name in ("eager", "aot_eager", "inductor"):
        return name
    return f"{_CUSTOM_BACKEND}{name or type(backend).__qualname__}"


# ---------------------------------------------------------------------------
# The package
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class _Entry:
    code_key: tuple
    out_code: bytes  # marshal
    guards_state: bytes
    global_module: str
    # global name -> ("graph", artifact name) | ("resume", code key)
    #              | ("module", module name) | ("named", module, path)
    #              | ("random_values", calls) (NOTE: [Replayed random calls])
    globals: dict
    # What the bytecode and graphs were derived from: records of
    # torch/_dynamo/package_sources.py (NOTE: [What an entry was derived from]).
    sources: tuple = ()
    # For a recorded decision about a code (no out_code): SKIP_CODE or
    # RUN_ONLY_CODE (NOTE: [Frames Dynamo skips]); "" for a compiled entry.
    frame_action: str = ""


# The frame_action of a code Dynamo decided not to compile, and of a code that
# hit its recompile limit (it runs its cache entries only, or eagerly).
SKIP_CODE, RUN_ONLY_CODE = "skip", "run_only"


@dataclasses.dataclass
class _EntryOrigin:
    """An entry of one package and what another package needs to hold it too
    (NOTE: [Entries a package's model uses]); no reference to the package."""

    owner_uid: str
    entry: _Entry
    graph_records: dict  # artifact -> _GraphRecord, for a graph compiled here
    graph_blobs: dict  # artifact -> bytes, for a graph loaded from a package
    kernels: dict  # the loaded package's kernels (not kept per graph)
    devices: set
    frozen: bool
    from_package: bool
    sources: set  # the owner's inlined sources (its live set)
    cache_key: Any  # the owner's backend as the C cache keys entries (None: unknown)


@dataclasses.dataclass
class _LoadedEntry:
    entry: _Entry
    out_code: types.CodeType
    f_globals: dict
    guard_manager: Any = None
    # Where it was loaded from, for people: the package and the entry's
    # position in it (NOTE: [Explaining a loaded miss]).
    where: str = ""


class _BuiltinsOnlyUnpickler(pickle.Unpickler):
    """Reads dynamo.bin: builtin containers, str, bytes and numbers only."""

    def find_class(self, module, name):
        raise PackageError(
            f"{_DYNAMO_FILE} may only hold builtin containers, not {str(module)[:80]}.{str(name)[:80]}"
        )


# What each kind of global reference in an entry holds after its tag.
_GLOBAL_REF_FIELDS = {
    "graph": (str,),
    "resume": (str, bytes),
    "module": (str,),
    "named": (str, str),
    "random_values": (tuple,),
}
_CODE_KEY_KINDS = ("function", "resume", "inline_wrapper")
_ARTIFACT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _read_entries(files: dict[str, bytes], path) -> list[_Entry]:
    """The entries of ``dynamo.bin``, each field checked to have its type."""
    try:
        raw_entries = _BuiltinsOnlyUnpickler(io.BytesIO(files[_DYNAMO_FILE])).load()
    except PackageError as e:
        raise PackageError(f"package {path}: {e}") from e
    except Exception as e:
        raise PackageError(f"package {path}: {_DYNAMO_FILE} is damaged: {e!r}"[:600]) from e
    if not isinstance(raw_entries, list):
        raise PackageError(f"package {path}: {_DYNAMO_FILE} is not a list of entries")
    entries = []
    for i, fields in enumerate(raw_entries):
        where = f"package {path}: {_DYNAMO_FILE} entry {i}"
        if not (isinstance(fields, tuple) and len(fields) == len(dataclasses.fields(_Entry))):
            raise PackageError(f"{where} is not an entry")
        entry = _Entry(*fields)
        key = entry.code_key
        if not (
            isinstance(key, tuple)
            and len(key) == 3
            and key[0] in _CODE_KEY_KINDS
            and all(isinstance(k, str) for k in key)
        ):
            raise PackageError(f"{where}: field code_key is malformed")
        for field, type_ in (("out_code", bytes), ("guards_state", bytes), ("global_module", str), ("globals", dict)):
            if not isinstance(getattr(entry, field), type_):
                raise PackageError(f"{where}: field {field} is a {type(getattr(entry, field)).__name__}")
        if not check_source_records(entry.sources):
            raise PackageError(f"{where}: field sources is malformed")
        if entry.frame_action not in (("",) if entry.out_code else (SKIP_CODE, RUN_ONLY_CODE)):
            raise PackageError(f"{where}: field frame_action is malformed")
        for name, ref in entry.globals.items():
            shape = _GLOBAL_REF_FIELDS.get(ref[0]) if isinstance(ref, tuple) and ref else None
            if not (
                isinstance(name, str)
                and name.isidentifier()
                and shape is not None
                and len(ref) == 1 + len(shape)
                and all(isinstance(v, t) for v, t in zip(ref[1:], shape))
            ):
                raise PackageError(f"{where}: global {str(name)[:80]!r} is malformed")
        entries.append(entry)
    return entries


def _check_package_contents(entries: list[_Entry], files: dict[str, bytes], path) -> None:
    """Every file is one a package holds, and every graph an entry names is there."""
    for name in files:
        if name == _DYNAMO_FILE:
            continue
        folder, _, base = name.partition("/")
        stem, dot, ext = base.rpartition(".")
        if not (
            (folder, dot + ext) in (("graphs", ".bin"), ("kernels", ".so"))
            and stem
            and set(stem) <= _ARTIFACT_CHARS
        ):
            raise PackageError(f"package {path}: {name[:80]!r} is not a file a package holds")
    for entry in entries:
        for name, ref in entry.globals.items():
            if ref[0] == "graph" and graph_file(ref[1]) not in files:
                raise PackageError(
                    f"package {path}: the entry of {_describe_key(entry.code_key)} calls graph "
                    f"{ref[1][:80]!r} (global {name}), which the package does not hold"
                )


def _unmarshal_code(data: bytes, what: str) -> types.CodeType:
    # See NOTE: [Constants of compiled bytecode]
    return load_code(data, what)


# NOTE: [Bytecode of loaded entries]
# Dynamo's transformed bytecode keeps the frame's identity: the same name,
# file, argument counts, argument names, free variables and kind (generator,
# coroutine, *args, **kwargs), because it runs in the original frame. A loaded
# entry's bytecode is checked against the live code it is installed for
# before it is used, so bytecode saved for another function (or written by
# hand into an unsigned package) is refused unless it has that function's
# shape. It is still code: only a signature says who wrote it.
_CODE_IDENTITY = ("co_name", "co_filename", "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_freevars")
_CODE_KIND_FLAGS = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_VARARGS | inspect.CO_VARKEYWORDS


def check_bytecode_belongs(code: types.CodeType, live: types.CodeType, what: str) -> None:
    """PackageError unless ``code`` (saved bytecode) has ``live``'s identity."""
    for field in _CODE_IDENTITY:
        if getattr(code, field) != getattr(live, field):
            raise PackageError(
                f"{what}: its bytecode is not of the live function {live.co_qualname} "
                f"({field} {str(getattr(code, field))[:80]!r}, the function's "
                f"{str(getattr(live, field))[:80]!r})"
            )
    nargs = live.co_argcount + live.co_kwonlyargcount
    nargs += bool(live.co_flags & inspect.CO_VARARGS) + bool(live.co_flags & inspect.CO_VARKEYWORDS)
    if code.co_varnames[:nargs] != live.co_varnames[:nargs] or (
        (code.co_flags ^ live.co_flags) & _CODE_KIND_FLAGS
    ):
        raise PackageError(
            f"{what}: its bytecode is not of the live function {live.co_qualname} "
            "(its arguments or kind differ)"
        )


def _check_guards_state(entry: _Entry, code: types.CodeType, what: str) -> None:
    """The entry's guards are a guards state for this code, read with the
    guards' restricted unpickler, each field of its type."""
    from torch._dynamo.guard_serialization import load_guards_state, OutputGraphGuardsState

    try:
        state = load_guards_state(entry.guards_state)
    except PackageError as e:
        raise PackageError(f"{what}: {e}") from e
    output_graph = state.output_graph
    if not isinstance(output_graph, OutputGraphGuardsState):
        raise PackageError(f"{what}: its guards state holds no output graph state")
    for field in dataclasses.fields(OutputGraphGuardsState):
        expected = {"dict": dict, "list": list, "set": set, "str": str, "tuple": tuple, "int": int, "bool": bool}.get(
            str(field.type)
        )
        value = getattr(output_graph, field.name, None)
        if expected is not None and not isinstance(value, expected):
            raise PackageError(f"{what}: its guards state field {field.name} is a {type(value).__name__}")
    if output_graph.code_name != code.co_name:
        raise PackageError(f"{what}: its guards were saved for {output_graph.code_name[:80]!r}, not {code.co_name!r}")


def _check_entry_module(entry: _Entry, module: Optional[types.ModuleType], code: types.CodeType) -> None:
    """The module an entry runs in is its function's: the one its key names, the
    inline wrapper's, or (a resume function) the one whose file the code is from."""
    kind, key_module = entry.code_key[0], entry.code_key[1]
    expected = {"function": key_module, "inline_wrapper": "torch._dynamo.external_utils"}.get(kind)
    module_file = getattr(module, "__file__", None)
    if (expected is not None and entry.global_module != expected) or (
        kind == "resume"
        and isinstance(module_file, str)
        and os.path.isabs(code.co_filename)
        and os.path.realpath(module_file) != os.path.realpath(code.co_filename)
    ):
        raise PackageError(
            f"the entry of {_describe_key(entry.code_key)} runs in module "
            f"{entry.global_module[:100]!r}, which is not its function's"
        )


# Builtins a saved global may never be bound to.
_UNSAFE_BUILTINS = frozenset(
    {"eval", "exec", "compile", "open", "__import__", "getattr", "setattr", "delattr",
     "globals", "locals", "vars", "input", "breakpoint", "exit", "quit", "help"}
)


def _check_global_refs(entry: _Entry, what: str, live_modules: Optional[set]) -> None:
    """Each global the bytecode reads is bound to what its name says: a compiled
    graph to a graph, a resume function to its code, a module alias to the module
    it is named after, and an object by name only to one of torch's, a standard
    module's or the live function's modules (never os.system for a graph)."""
    from torch._dynamo.guard_serialization import _IMPORTABLE_AT_LOAD

    for name, ref in entry.globals.items():
        kind = ref[0]
        wrong = (
            name.startswith("__compiled_fn") != (kind == "graph")
            or name.startswith("__resume_at_") != (kind == "resume")
            or name.startswith("__gen_rand_values") != (kind == "random_values")
            or (kind == "module" and name.startswith("__import_") and name != "__import_" + ref[1].replace(".", "_dot_"))
        )
        if kind == "random_values":
            # See NOTE: [Replayed random calls]: its calls are checked before anything runs.
            random_values_function(ref[1], f"{what}: global {name[:80]}")
        if kind == "named":
            module, path = ref[1], ref[2]
            wrong = wrong or not (
                module == "torch"
                or module.startswith("torch.")
                or module in _IMPORTABLE_AT_LOAD
                or (live_modules is not None and module in live_modules)
            ) or (module == "builtins" and path.split(".")[0] in _UNSAFE_BUILTINS)
        if wrong:
            raise PackageError(f"{what}: global {name[:80]} is bound to {str(ref[:3])[:120]}, not what its name says")


def _named_module(name: str, entry: _Entry) -> types.ModuleType:
    """A module alias the saved bytecode reads: one already imported, or torch's own."""
    module = sys.modules.get(name)
    if module is None and (name == "torch" or name.startswith("torch.")):
        try:
            module = importlib.import_module(name)
        except Exception as e:
            raise PackageError(
                f"the entry of {_describe_key(entry.code_key)} needs module {name[:100]}: {e!r}"
            ) from e
    if module is None:
        raise PackageError(
            f"the entry of {_describe_key(entry.code_key)} needs module {name[:100]!r}, which "
            "is not imported (a package never imports a module by name)"
        )
    return module


# NOTE: [One recording path]
# Upstream's Dynamo tells the package what each entry's bytecode needs as it
# traces: add_resume_function when it generates a resume function at a graph
# break, add_import_source when it aliases a module, both into the entry of the
# code in code_context(code). Here Dynamo hands the package the finished
# bytecode and its frame's globals (record_compile), and the package finds the
# resume functions and module aliases among the globals that bytecode reads and
# records them with the same two calls, into the same entry. Either way, what
# the entry saves of them comes from _EntryRecording.global_refs: one path.


@dataclasses.dataclass
class _EntryRecording:
    """What the add_* calls recorded for the entry of ``code`` being compiled."""

    code: types.CodeType
    # alias -> module name
    import_sources: dict = dataclasses.field(default_factory=dict)
    # global name -> (module it is installed in, code of the resume function)
    resume_functions: dict = dataclasses.field(default_factory=dict)

    def global_refs(self, module_name: Optional[str]) -> dict:
        """The entry's global references (see _Entry.globals) to the recorded
        module aliases and resume functions; PackageError for a resume function
        of another module than ``module_name``, the one the entry runs in, or
        one whose code cannot be saved."""
        refs: dict[str, tuple[Any, ...]] = {
            alias: ("module", module) for alias, module in self.import_sources.items()
        }
        for name, (module, code) in self.resume_functions.items():
            if module != module_name:
                raise PackageError(
                    f"resume function {name} is a global of module {module!r}, "
                    f"not of {module_name!r} where its caller runs"
                )
            refs[name] = ("resume", code.co_name, dump_code(code))
        return refs


_NOT_YET = object()


# A global container is read this far for the modules of what it holds.
_CONTAINER_ITEMS_READ = 256


def _modules_of_callables_in(container) -> set[str]:
    """The modules of the functions and classes a global dict, list or tuple
    holds (its first _CONTAINER_ITEMS_READ items)."""
    items = container.values() if isinstance(container, dict) else container
    return {
        item.__module__
        for item in itertools.islice(items, _CONTAINER_ITEMS_READ)
        if isinstance(item, (types.FunctionType, type)) and isinstance(item.__module__, str)
    }


class CompilePackage:
    """The compiled entries of one ``torch.compile()``; see the module docstring."""

    def __init__(
        self,
        fn,
        dynamo: Optional[_DynamoCacheEntry] = None,
        ignore_inlined_sources: bool = False,
        *,
        path: Optional[str] = None,
    ) -> None:
        if isinstance(dynamo, (str, os.PathLike)):
            # torch.compile(..., package=path): this project's spelling.
            path, dynamo = os.fspath(dynamo), None
        self._fn = fn
        self.path = path
        self.source_info = SourceInfo()
        self._ignore_inlined_sources = ignore_inlined_sources
        # upstream's recording API (code_context / add_*): what is being
        # recorded for the code being compiled (NOTE: [One recording path])
        self._current_entry: Optional[_EntryRecording] = None
        # Resume functions add_resume_function recorded: never inlined sources.
        self._resume_codes: weakref.WeakSet = weakref.WeakSet()
        # code -> record of each function inlined into the frame being compiled.
        self._frame_sources: Optional[dict] = None
        # What changed for the entries a load dropped (NOTE: [What an entry was
        # derived from]); refuse_stale makes such a load a PackageError.
        self.stale_entries: list[str] = []
        self.refuse_stale = False
        self._backend_ids: dict[str, list[str]] = {}
        self._cached_backends: dict[str, Any] = {}
        self._pending: Optional[_DynamoCacheEntry] = None
        self._store_key: Optional[str] = None
        # Backend ids cache_entry() has recorded in the PrecompileContext, each
        # once (NOTE: [Recording a package's cache entry]).
        self._recorded_backend_ids: set[str] = set()
        self.backend: Optional[RecordingBackend] = None
        self.entries: list[_Entry] = []
        self._graph_records: dict[str, _GraphRecord] = {}
        self._unsaveable: list[str] = []
        # Entries read from a package: checked when they were first saved.
        self._entries_from_packages: set[int] = set()
        # Entries of other packages this package's model ran (NOTE: [Entries
        # a package's model uses]), by id.
        self._adopted: set[int] = set()
        # Whether torch.compile(..., package=self) runs a model (runs_under):
        # only such a package takes other packages' entries (not aot_compile's,
        # whose compile runs a copy of its function: _compile_fullgraph).
        self._runs_a_model = False
        # Frames Dynamo decided not to compile (NOTE: [Frames Dynamo skips]):
        # entries with no bytecode and no guards.
        self.skipped: list[_Entry] = []
        self._loaded_skips: list[_Entry] = []
        # None: a frozen graph is checked at load against the module the package
        # belongs to. A list: the load has no module (aot_compile, where it is
        # the first argument of each call), and (graph, name) of each frozen
        # graph is kept here for the caller to check (NOTE: [Parameters of frozen
        # packages]).
        self.frozen_checks_at_call: Optional[list[tuple[Any, str]]] = None
        self._inline_wrapped: Any = _NOT_YET
        self._loaded: list[_LoadedEntry] = []
        self._loaded_graph_blobs: dict[str, bytes] = {}
        self._loaded_kernels: dict[str, bytes] = {}
        self._loaded_devices: set[str] = set()
        self._loaded_frozen = False
        self._uid = _sha256(os.urandom(16))[:10]
        if dynamo is not None:
            self.initialize(fn, dynamo, ignore_inlined_sources)

    # -- upstream's API (NOTE: [Packages in upstream's shape]) ---------------
    def is_initialized(self) -> bool:
        return self._fn is not None

    def initialize(self, fn, dynamo: Optional[_DynamoCacheEntry] = None, ignore_inlined_sources: bool = False) -> None:
        """Bind the package to ``fn``; with ``dynamo``, check the saved entry
        against this process (Python and torch versions, inlined sources) and
        keep it for :meth:`install`."""
        if self._pending is not None:
            raise AssertionError("CompilePackage is already initialized")
        self._fn = fn
        self._ignore_inlined_sources = ignore_inlined_sources
        if dynamo is None:
            return
        if not isinstance(dynamo, _DynamoCacheEntry):
            raise AssertionError(f"Expected _DynamoCacheEntry, got {type(dynamo)}")
        dynamo.check_versions()
        if not ignore_inlined_sources:
            dynamo.source_info.check_unchanged()
        self.source_info = dynamo.source_info
        self._pending = dynamo

    @property
    def source_id(self) -> str:
        return source_id_from_fn(self._fn)

    @staticmethod
    def source_id_from_fn(fn) -> str:
        return source_id_from_fn(fn)

    @contextlib.contextmanager
    def code_context(self, code: types.CodeType):
        """The code whose compile the add_* calls within record (its entry)."""
        previous, self._current_entry = self._current_entry, _EntryRecording(code)
        try:
            yield
        finally:
            self._current_entry = previous

    def _code_being_compiled(self) -> types.CodeType:
        if self._current_entry is None:
            raise AssertionError("no code_context(code) is active")
        return self._current_entry.code

    def add_resume_function(self, python_code: types.CodeType, python_module: str, function_name: str) -> None:
        """Record that the current entry's bytecode calls the resume function
        ``python_code`` (Dynamo generated it at a graph break) by the global
        ``function_name`` of module ``python_module``: a load installs it there.
        Its code is never an inlined source."""
        self._resume_codes.add(python_code)
        if self._current_entry is not None:
            self._current_entry.resume_functions[function_name] = (python_module, python_code)

    def add_import_source(self, alias: str, module_name: str) -> None:
        """Record that the current entry reads module ``module_name`` by the
        global ``alias``; a load binds it to the module already imported (or
        torch's own: a package never imports a module by name)."""
        if self._current_entry is None:
            raise AssertionError("_current_entry is not set in add_import_source")
        self._current_entry.import_sources[alias] = module_name

    def add_guarded_code(self, guards_state: bytes, dynamo_code: types.CodeType, f_globals: Optional[dict] = None) -> None:
        """Record the compile of the current code (upstream's spelling of
        :meth:`record_compile`, which Dynamo calls)."""
        code = self._code_being_compiled()
        if f_globals is None:
            f_globals = getattr(inspect.getmodule(code), "__dict__", None) or getattr(self._fn, "__globals__", {})
        self.record_compile(code, dynamo_code, guards_state, f_globals)

    def add_backend_id(self, backend_id: str, backend: Any = None) -> None:
        """Record that the current code calls the compiled graph ``backend_id``."""
        code = self._code_being_compiled()
        self._backend_ids.setdefault(code.co_name, []).append(backend_id)
        if backend is not None:
            self._cached_backends[backend_id] = backend

    @property
    def cached_backends(self) -> dict[str, Any]:
        """The compiled graphs of this package's entries, by backend id."""
        backends = dict(self._cached_backends)
        for artifact, record in self._graph_records.items():
            backends.setdefault(artifact, record.compiled if record.compiled is not None else record.gm)
        return backends

    def add_inlined_source(self, sources) -> None:
        """Record the code objects Dynamo inlined; a load checks their source."""
        if self._ignore_inlined_sources:
            return
        for code in sources:
            if code not in self._resume_codes:
                record = inlined_code_record(code)
                self.source_info.add_record(record)
                if self._frame_sources is not None:
                    self._frame_sources.setdefault(code, record)

    @contextlib.contextmanager
    def _compiling_frame(self):
        """Around one frame's compile: the functions Dynamo inlines meanwhile
        are that frame's entry's sources (NOTE: [What an entry was derived from])."""
        previous, self._frame_sources = self._frame_sources, {}
        try:
            yield
        finally:
            self._frame_sources = previous

    def _entry_sources(self, key: tuple, code: types.CodeType) -> tuple:
        """The records of what an entry compiled now for ``code`` is derived from."""
        records = []
        if key[0] == "function":
            records.append(frame_code_record(code, key[1]))
        records.extend(sorted(set((self._frame_sources or {}).values())))
        records.extend(config_records(self.backend.kind if self.backend else None))
        return tuple(records)

    def bypass_current_entry(self) -> None:
        """Leave the current code's entries out of the package."""
        self._exclude(self._code_being_compiled(), "its compile bypassed the package")

    def validate(self) -> None:
        """RuntimeError unless every entry a save would keep can be found again
        in a fresh process (resume functions with their callers, functions by name)."""
        _, reasons = self._resolvable(self.entries + self.skipped)
        if reasons:
            raise RuntimeError(
                f"compile package: {len(reasons)} entries cannot be loaded in a fresh process: {reasons[0]}"
            )

    def cache_entry(self) -> _DynamoCacheEntry:
        """The Dynamo half of this package (NOTE: [Packages in upstream's shape])."""
        return _compile_package_cache_entry(self)

    def install(self, backends: dict[str, Any]) -> None:
        """Make the entries this package was loaded with live, with ``backends``
        (the graphs they call, as the store returned them)."""
        if self._pending is None:
            raise AssertionError("install() needs a package made from a cache entry (DynamoStore.load_package)")
        entry = PrecompileCacheEntry(self._pending, dict(backends))
        files, manifest = entry.files_and_manifest()
        self.load_files(files, manifest, self._store_key or "<cache entry>")
        self._pending = None
        _installed_packages.add(self)
        # See NOTE: [Installed packages and torch._dynamo.reset()]
        _uninstall_on_reset()
        # See NOTE: [Frames of loaded packages]
        _count_loaded_frames(int(self.load_stats["codes"]))

    def uninstall(self) -> None:
        """Drop every entry loaded into this package."""
        _installed_packages.discard(self)
        self._loaded.clear()
        self._loaded_skips.clear()

    # -- compile side ------------------------------------------------------
    def wrap_backend(self, backend, kind: Optional[str] = None) -> RecordingBackend:
        self.backend = RecordingBackend(backend, kind or backend_kind(backend))
        self.backend.package_uid = self._uid
        return self.backend

    def runs_under(self, dynamo_ctx: Any) -> None:
        """torch.compile(..., package=self) made ``dynamo_ctx``: calls through it
        run this package's model, which may run other packages' entries that
        it takes when it is saved (NOTE: [Entries a package's model uses])."""
        self._runs_a_model = True

    def _root_qualnames(self) -> frozenset:
        return frozenset(code.co_qualname for code in self._root_codes())

    def _root_codes(self) -> list[types.CodeType]:
        fn = self._fn
        if isinstance(fn, torch.nn.Module):
            fn = type(fn).forward
        fn = getattr(fn, "__func__", fn)
        code = getattr(fn, "__code__", None)
        return [code] if code is not None else []

    def _inline_wrapped_class(self) -> Optional[tuple[str, str]]:
        """(module, qualname) of the root module's class when torch.compile runs
        it through Dynamo's inline wrapper; see NOTE: [Keys of package entries]."""
        module = self._fn
        if not isinstance(module, torch.nn.Module):
            return None
        if self._inline_wrapped is _NOT_YET:
            cls = type(module)
            self._inline_wrapped = (
                (cls.__module__, cls.__qualname__)
                if _compiled_through_inline_wrapper(module)
                else None
            )
        return self._inline_wrapped

    def _key_for(self, code, f_globals) -> tuple:
        if code is _inline_wrapper_code():
            wrapped = self._inline_wrapped_class()
            if wrapped is not None:
                return ("inline_wrapper", *wrapped)
        return _code_key(code, f_globals)

    def _entry_matches(self, entry: _Entry, code: types.CodeType) -> bool:
        """Whether ``entry`` was saved for frames of ``code``."""
        key = entry.code_key
        if key[0] == "resume":
            return (
                len(key) == 3 and _is_resume_code(code) and code_fingerprint(code) == key[2]
            )
        if key[0] == "inline_wrapper":
            return code is _inline_wrapper_code() and self._inline_wrapped_class() == tuple(key[1:])
        return _resolve_code(key, self._root_codes()) is code

    @contextlib.contextmanager
    def _entry_recording(self, code: types.CodeType):
        """The recording of ``code``'s entry: the current one when Dynamo
        compiles ``code`` within code_context(code), else a new one."""
        if self._current_entry is not None and self._current_entry.code is code:
            yield self._current_entry
            return
        with self.code_context(code):
            yield self._current_entry

    def record_compile(self, code, out_code, guards_state, f_globals) -> None:
        """Called by Dynamo once a frame compiled under this package."""
        if guards_state is None:
            return
        key = self._key_for(code, f_globals)
        try:
            with self._entry_recording(code) as recording:
                global_refs = self._classify_globals(out_code, f_globals)
                global_refs.update(recording.global_refs(f_globals.get("__name__")))
            global_refs = dict(sorted(global_refs.items()))
            # See NOTE: [Constants of compiled bytecode]
            saved_code = dump_code(out_code)
            sources = self._entry_sources(key, code)
        except PackageError as e:
            self._exclude(code, str(e))
            return
        except Exception as e:
            # See NOTE: [A save never loses what it could save]
            log.debug("recording the entry of %s failed", code.co_qualname, exc_info=True)
            self._exclude(code, f"recording it raised {type(e).__name__}: {e}"[:800])
            return
        self.entries.append(
            _Entry(
                code_key=key,
                out_code=saved_code,
                guards_state=guards_state,
                global_module=f_globals.get("__name__"),
                globals=global_refs,
                sources=sources,
            )
        )

    def _origin(self, entry: _Entry) -> Optional[_EntryOrigin]:
        """What another package needs to hold ``entry`` too; None for an entry
        no other model may share (a frozen graph holds this model's weights) and
        for a frame decision."""
        if entry.frame_action or not entry.out_code:
            # A frame decision is not shared (NOTE: [Entries a package's model uses]).
            return None
        artifacts = [ref[1] for ref in entry.globals.values() if ref[0] == "graph"]
        records = {a: self._graph_records[a] for a in artifacts if a in self._graph_records}
        from_package = id(entry) in self._entries_from_packages
        if any(r.frozen is not None or r.frozen_under_no_grad for r in records.values()) or (
            from_package and self._loaded_frozen
        ):
            return None
        return _EntryOrigin(
            owner_uid=self._uid,
            entry=entry,
            graph_records=records,
            graph_blobs={a: self._loaded_graph_blobs[a] for a in artifacts if a in self._loaded_graph_blobs},
            kernels=self._loaded_kernels if from_package else {},
            devices=set(self._loaded_devices) if from_package else set(),
            frozen=False,
            from_package=from_package,
            sources=self.source_info.inlined_sources,
            cache_key=getattr(self.backend, "_torchdynamo_orig_callable", None),
        )

    def _adopt_shared_entries(self) -> None:
        """Take the entries of other packages that the C cache gives this
        package's model, from the live caches of the codes it runs (NOTE:
        [Entries a package's model uses])."""
        cache_key = getattr(self.backend, "_torchdynamo_orig_callable", None)
        if not self._runs_a_model or cache_key is None:
            return
        try:
            shared = self._shared_entries(cache_key)
        except Exception as e:
            # See NOTE: [A save never loses what it could save]
            log.debug("finding the entries package %s shares failed", self.path, exc_info=True)
            self._leave_out(
                f"torch.compile package {self.path}: entries of other packages that its model "
                f"may run are not saved: finding them raised {type(e).__name__}: {e}"[:800]
            )
            return
        held = {id(entry) for entry in self.entries}
        candidates: dict[int, _EntryOrigin] = {}
        for origin in shared:
            if id(origin.entry) not in held and id(origin.entry) not in self._adopted:
                candidates.setdefault(id(origin.entry), origin)
        if not candidates:
            return
        # An entry read from a package was checked when it was first saved.
        self._entries_from_packages |= {key for key, origin in candidates.items() if origin.from_package}
        candidate_entries = [origin.entry for origin in candidates.values()]
        kept, _ = self._resolvable(self.entries + candidate_entries + self.skipped)
        kept_ids = {id(entry) for entry in kept}
        for key, origin in candidates.items():
            if key in kept_ids:
                self._adopt(origin)
            else:
                # Its code cannot be found in a fresh process; the model may
                # never have run it: not taken, and nothing warned.
                log.debug(
                    "package %s does not take the entry of %s: a fresh process could not find its code",
                    self.path,
                    _describe_key(origin.entry.code_key),
                )

    def _shared_entries(self, cache_key) -> list[_EntryOrigin]:
        """The noted entries of other packages, in the live caches of the codes
        this package's model runs, that the C cache gives its model."""
        codes_by_owner: dict[str, set[types.CodeType]] = {}
        for origin, code in list(_entry_origins.values()):
            codes_by_owner.setdefault(origin.owner_uid, set()).add(code)
        codes = set(self._root_codes()) | codes_by_owner.pop(self._uid, set())
        if self._inline_wrapped_class() is not None:
            codes.add(_inline_wrapper_code())
        from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list

        shared: list[_EntryOrigin] = []
        walked: set[types.CodeType] = set()
        pending = list(codes)
        while pending:
            code = pending.pop()
            if code in walked:
                continue
            walked.add(code)
            for cache_entry in _debug_get_cache_entry_list(code):
                noted_entry = _entry_origins.get(cache_entry.guard_manager)
                if noted_entry is None or noted_entry[0].owner_uid == self._uid:
                    continue
                origin = noted_entry[0]
                if origin.cache_key is None or not _same_cache_key(origin.cache_key, cache_key):
                    continue
                if not self._entry_matches(origin.entry, code):
                    continue
                shared.append(origin)
                # The other model's other frames (resume functions, nested
                # compiled functions) run under this model too.
                pending.extend(codes_by_owner.get(origin.owner_uid, ()))
        return shared

    def _adopt(self, origin: _EntryOrigin) -> None:
        """Hold another package's entry too: this package's model runs its code
        (NOTE: [Entries a package's model uses])."""
        entry = origin.entry
        if id(entry) in self._adopted or any(held is entry for held in self.entries):
            return
        self._adopted.add(id(entry))
        self.entries.append(entry)
        self._graph_records.update(origin.graph_records)
        self._loaded_graph_blobs.update(origin.graph_blobs)
        if origin.from_package:
            self._entries_from_packages.add(id(entry))
            self._loaded_kernels.update(origin.kernels)
            self._loaded_devices |= origin.devices
        self.source_info.inlined_sources |= origin.sources
        log.debug("package %s holds entry of %s, which its model runs", self.path, _describe_key(entry.code_key))

    # NOTE: [Frames Dynamo skips]
    # When Dynamo decides not to compile a frame (it compiled nothing: e.g. the
    # first call graph-breaks, as on nn.LSTM with config.allow_rnn off), it
    # marks the code to run eagerly from then on. A fresh process would make
    # that decision again, by tracing the frame: a recompile, and an error under
    # set_stance("fail_on_recompile"). The package records the decision (for
    # frames Dynamo could have compiled: user code with tensors) and replays
    # it, after the saved entries of that code.
    # A code that hit its recompile limit (config.recompile_limit: a MoE
    # layer's list of expert sizes specializes on each 0 and 1 it sees) is
    # set by Dynamo to run its cache entries only, eagerly where none accepts
    # the frame. The package records that too, and replays it for one frame at
    # a time (apply_to_code off): the code's other loaded entries, which the C
    # cache does not hold until one accepts a frame, stay reachable.
    def record_skip(self, frame, frame_action: str = SKIP_CODE) -> None:
        """Called after Dynamo decided not to compile ``frame``'s code
        (``frame_action`` SKIP_CODE) or hit its recompile limit (RUN_ONLY_CODE)."""
        from torch._dynamo import trace_rules
        from torch._dynamo.convert_frame import has_tensor_in_frame, output_codes

        code = frame.f_code
        if code in output_codes or trace_rules.check(code) or not has_tensor_in_frame(frame):
            return
        key = self._key_for(code, frame.f_globals)
        if any(skip.code_key == key for skip in self.skipped):
            return
        self.skipped.append(
            _Entry(
                code_key=key,
                out_code=b"",
                guards_state=b"",
                global_module=frame.f_globals.get("__name__"),
                globals={},
                frame_action=frame_action,
            )
        )

    def _exclude(self, code, reason: str) -> None:
        self._leave_out(
            f"torch.compile package: the entry for {code.co_qualname} "
            f"({code.co_filename}:{code.co_firstlineno}) is not saved: {reason}"
        )

    def _leave_out(self, message: str) -> None:
        """An entry stays out of the package: a warning, or with
        strict precompile (:func:`strict_precompile`) an error."""
        if strict_precompile():
            raise PackageError(message)
        self._unsaveable.append(message)
        warnings.warn(message, stacklevel=3)

    def guards_refused(self, code, error: PackageError) -> None:
        reason = str(error)
        if "ID_MATCH" in reason and _freezing_parameters():
            # See NOTE: [Parameters of frozen packages]
            reason += (
                "; with freezing (torch._inductor.config.freezing under torch.no_grad()) "
                "Dynamo guards the parameters it folds by identity, which another process "
                "cannot check; the package checks the values instead only for parameters "
                "and buffers of the compiled module (reached from self), so compile the "
                "module that owns the parameters"
            )
        self._exclude(code, reason)

    def _classify_globals(self, out_code, f_globals) -> dict:
        """The references of the globals ``out_code`` reads to the graphs and
        named objects they are bound to; its resume functions and module aliases
        are recorded into the current entry (add_resume_function,
        add_import_source)."""
        from torch._dynamo.guard_serialization import (
            find_stable_name,
            is_dynamo_installed_global,
        )

        refs: dict[str, tuple[Any, ...]] = {}
        for name in sorted(_all_names(out_code)):
            if name not in f_globals or not (
                name.startswith("__") or is_dynamo_installed_global(name)
            ):
                continue
            value = f_globals[name]
            if name.startswith("__compiled_fn"):
                record = self.backend.record_for(value) if self.backend else None
                if record is None:
                    raise PackageError(f"compiled graph {name} was not recorded")
                artifact = f"{name}_{self._uid}"
                self._graph_records[artifact] = record
                refs[name] = ("graph", artifact)
            elif name.startswith("__resume_at_") and isinstance(value, types.FunctionType):
                self.add_resume_function(value.__code__, f_globals.get("__name__"), name)
            elif isinstance(value, types.ModuleType):
                self.add_import_source(name, value.__name__)
            elif name.startswith("__gen_rand_values"):
                # See NOTE: [Replayed random calls]
                try:
                    refs[name] = ("random_values", random_calls_as_data(value))
                except PackageError as e:
                    raise PackageError(f"global {name}, Dynamo's replay of random calls: {e}") from e
            else:
                ref = find_stable_name(value)
                if ref is None:
                    if name in ("__builtins__", "__name__", "__file__", "__doc__"):
                        continue
                    raise PackageError(f"global {name} ({type(value).__name__}) has no stable name")
                refs[name] = ("named", ref.module, ref.path)
        return refs

    # -- save --------------------------------------------------------------
    # NOTE: [A save never loses what it could save]
    # A save writes every entry it can. An error while recording one entry
    # (its bytecode, globals or sources) or serializing one graph (pickling an
    # AOTAutograd cache entry, reading Inductor's output) leaves that entry out
    # with a warning naming it and the error, and the rest of the package is
    # written; with config.strict_precompile it is a PackageError instead. Only what concerns the whole package (its path,
    # signing key, the write itself) fails the save.
    def save(self, path: Optional[str] = None) -> str:
        """Write the package as a directory (see NOTE: [Package format])."""
        path = path or self.path
        if path is None:
            raise PackageError("no package path: pass torch.compile(..., package=path)")
        files, manifest = self.collect_files()
        if not (manifest["entries"] or manifest["skipped_frames"] or self._unsaveable):
            # (Entries left out have each warned already.)
            warnings.warn(
                f"torch.compile package {path} holds no entries: nothing was compiled "
                "under it (call the compiled function before save_package)",
                stacklevel=2,
            )
        from . import package_storage

        if package_storage.is_remote(path):
            # See NOTE: [Packages in object storage]
            package_storage.save_to_url(
                str(path), lambda local: _write_atomically(local, files, manifest)
            )
        else:
            _write_atomically(package_storage.local_path(path), files, manifest)
        log.info("saved %d entries to %s", manifest["entries"], path)
        return str(path)

    def collect_files(self) -> tuple[dict[str, bytes], dict]:
        """The package's files and manifest, however they are then stored."""
        # See NOTE: [Entries a package's model uses]
        self._adopt_shared_entries()
        files: dict[str, bytes] = {}
        graphs_needed: set[str] = set()
        for entry in self.entries:
            graphs_needed |= {ref[1] for ref in entry.globals.values() if ref[0] == "graph"}
        failed: dict[str, str] = {}
        kernels: dict[str, bytes] = dict(self._loaded_kernels)
        for artifact in sorted(graphs_needed):
            if artifact in self._loaded_graph_blobs:
                files[graph_file(artifact)] = self._loaded_graph_blobs[artifact]
                continue
            record = self._graph_records[artifact]
            refused = _refused_option(record)
            if refused is not None:
                failed[artifact] = refused
                continue
            try:
                blob, graph_kernels = serialize_graph(record)
            except PackageError as e:
                failed[artifact] = str(e)
                continue
            except Exception as e:
                # See NOTE: [A save never loses what it could save]
                log.debug("serializing graph %s failed", artifact, exc_info=True)
                failed[artifact] = f"serializing graph {artifact} raised {type(e).__name__}: {e}"[:800]
                continue
            files[graph_file(artifact)] = blob
            kernels.update(graph_kernels)
        kept = []
        for entry in self.entries:
            bad = [failed[ref[1]] for ref in entry.globals.values() if ref[0] == "graph" and ref[1] in failed]
            if bad:
                self._leave_out(
                    f"torch.compile package: an entry of {_describe_key(entry.code_key)} is not "
                    f"saved: its graph cannot be packaged: {bad[0]}"
                )
                continue
            kept.append(entry)
        kept = self._keep_resolvable(kept + self.skipped)
        graphs_kept = {
            ref[1] for entry in kept for ref in entry.globals.values() if ref[0] == "graph"
        }
        for artifact in graphs_needed - graphs_kept:
            files.pop(graph_file(artifact), None)
        for h, data in kernels.items():
            files[kernel_file(h)] = data
        files[_DYNAMO_FILE] = pickle.dumps(
            [dataclasses.astuple(e) for e in kept], protocol=pickle.HIGHEST_PROTOCOL
        )
        manifest = {
            "format_version": PACKAGE_FORMAT_VERSION,
            **_environment(),
            "overlay_series_hash": overlay_series_hash(),
            "device": ",".join(
                sorted(
                    {d for r in self._graph_records.values() for d in r.devices}
                    | set(self._loaded_devices)
                )
            )
            or "cpu",
            "backend": self.backend.kind if self.backend else None,
            # See NOTE: [Compile options in packages]
            "compile_options": {
                k: repr(v) for k, v in sorted((self.backend.options if self.backend else {}).items())
            },
            # NOTE: [Frozen graphs in packages]: its graphs compute with constants
            # folded from the parameters they were saved with.
            "frozen": self._loaded_frozen
            or any(
                self._graph_records[artifact].frozen_under_no_grad
                for artifact in graphs_kept
                if artifact in self._graph_records
            ),
            "entries": sum(1 for entry in kept if entry.out_code),
            "skipped_frames": sum(1 for entry in kept if not entry.out_code),
            "inlined_sources": self.source_info.as_fields(),
            # The guard filter the entries were compiled with (a preset by name).
            **guard_filter_manifest_fields(self),
            "files": {name: _sha256(data) for name, data in sorted(files.items())},
        }
        # NOTE: [Trust model of compile packages]: signed with
        # config.package_signing_key, the signature file next to the manifest.
        signature = sign_manifest(manifest_bytes(manifest))
        if signature is not None:
            files[SIGNATURE_FILE] = signature
        return files, manifest

    def _keep_resolvable(self, entries: list[_Entry]) -> list[_Entry]:
        """The entries a fresh process can find the code of; the others are left
        out with a warning naming them (NOTE: [Keys of package entries])."""
        kept, reasons = self._resolvable(entries)
        for reason in reasons:
            self._leave_out(reason)
        return kept

    def _resolvable(self, entries: list[_Entry]) -> tuple[list[_Entry], list[str]]:
        """The entries a fresh process can find the code of, and why each other
        one cannot be found (nothing recorded, nothing warned)."""
        kept = list(entries)
        reasons: list[str] = []
        while True:
            # Resume functions a fresh process gets from the package: those the
            # saved bytecode calls (installed globals) or builds (closures).
            carried = set()
            for entry in kept:
                for ref in entry.globals.values():
                    if ref[0] == "resume":
                        carried.add(code_fingerprint(load_code(ref[2], "a resume function")))
                nested_codes = _nested_codes(load_code(entry.out_code, "an entry")) if entry.out_code else ()
                for nested in nested_codes:
                    if _is_resume_code(nested):
                        carried.add(code_fingerprint(nested))
            still_kept = []
            for entry in kept:
                reason = self._unresolvable_reason(entry, carried)
                if reason is None:
                    still_kept.append(entry)
                else:
                    reasons.append(
                        f"torch.compile package: the entry for {_describe_key(entry.code_key)} "
                        f"is not saved: a fresh process could not find its code: {reason}"
                    )
            if len(still_kept) == len(kept):
                return kept, reasons
            # A dropped entry may have carried the code of a resume entry.
            kept = still_kept

    def _unresolvable_reason(self, entry: _Entry, carried: set[str]) -> Optional[str]:
        if id(entry) in self._entries_from_packages:
            return None
        key = entry.code_key
        if key[0] == "resume":
            if key[2] in carried:
                return None
            return "no saved entry calls this resume function (its caller's entry is not saved)"
        if key[0] == "inline_wrapper":
            if self._inline_wrapped_class() == tuple(key[1:]):
                return None
            return (
                f"it was compiled through Dynamo's inline wrapper for a {key[1]}.{key[2]}, "
                f"not for this package's {type(self._fn).__qualname__}"
            )
        if _resolve_code(key, self._root_codes()) is not None:
            return None
        return (
            f"{key[2]} is neither the compiled callable nor reachable by name from "
            f"module {key[1]} (define it at module level)"
        )

    # -- load --------------------------------------------------------------
    def load(self, path: Optional[str] = None) -> list[_LoadedEntry]:
        """Read a package directory; its entries are then looked up on calls.

        The package is read with the configured trust (NOTE: [Trust model of
        compile packages]): its manifest's signature is verified before any
        other file is opened, and every file is read confined to the package
        and checked against the manifest's sha256 (the garbage collector is
        left as it is: NOTE: [Loads leave the garbage collector alone])."""
        loaded = self._load(path)
        # See NOTE: [Frames of loaded packages]
        _count_loaded_frames(int(self.load_stats["codes"]))
        return loaded

    def _load(self, path: Optional[str]) -> list[_LoadedEntry]:
        given = path or self.path
        if given is None:
            raise PackageError("no package path: pass torch.compile(..., package=path)")
        from . import package_storage

        if package_storage.is_remote(given):
            # See NOTE: [Packages in object storage]
            with package_storage.fetched_package(str(given), check_manifest) as fetched:
                package = read_package(fetched, check_manifest)
            return self.load_files(package.files, package.manifest, given)
        where = package_storage.local_path(given)
        # See NOTE: [Replacing a package atomically]
        package = package_storage.read_consistently(
            where, lambda local: read_package(local, check_manifest)
        )
        return self.load_files(package.files, package.manifest, where)

    def load_files(self, files, manifest, path):
        """Install entries from a package's verified files (directory or archive).

        Everything is checked before anything is installed: the manifest's
        fields, every file against its sha256, the entries' structure, the
        graphs and kernels they name, their bytecode and guards against the
        live function; a failed load leaves nothing behind (no temp files).
        The garbage collector is left as it is (NOTE: [Loads leave the
        garbage collector alone])."""
        started = time.perf_counter()
        manifest = check_manifest_schema(manifest, path)
        check_files(files, manifest, path)
        saved_sources = SourceInfo.from_fields(manifest.get("inlined_sources", []), path)
        entries = _read_entries(files, path)
        _check_package_contents(entries, files, path)
        numbers = {id(entry): number for number, entry in enumerate(entries)}
        entries = self._drop_stale(entries, path)
        kernel_dir, kernel_paths = extract_kernels(files, path)
        verified = time.perf_counter()
        redirect = _KernelRedirect(kernel_paths)
        try:
            needed = {ref[1] for entry in entries for ref in entry.globals.values() if ref[0] == "graph"}
            graphs = self._load_graphs(files, redirect, path, needed)
            checked = [(entry, self._checked_code(entry, path)) for entry in entries if entry.out_code]
        except BaseException:
            if kernel_dir is not None:
                shutil.rmtree(kernel_dir, ignore_errors=True)
            raise
        if kernel_dir is not None:
            # Kernels load when a graph first runs; the copies go with the last
            # graph that may load them, or at exit.
            weakref.finalize(redirect, shutil.rmtree, str(kernel_dir), True)
        unpickled = time.perf_counter()
        self._loaded_devices |= set(manifest.get("device", "cpu").split(","))
        self._loaded_frozen = self._loaded_frozen or bool(manifest.get("frozen"))
        self._loaded_kernels.update({h: files[kernel_file(h)] for h in kernel_paths})
        self._loaded_graph_blobs.update(
            {artifact: data for name, data in files.items() if (artifact := graph_name(name)) is not None}
        )
        self._entries_from_packages |= {id(entry) for entry in entries}
        self.source_info.inlined_sources |= saved_sources.inlined_sources
        skips = [entry for entry in entries if not entry.out_code]
        self.skipped.extend(skips)
        self._loaded_skips.extend(skips)
        installed = []
        for entry, codes in checked:
            loaded = self._install_loaded(entry, graphs, codes)
            if loaded is not None:
                loaded.where = f"package {path}, entry {numbers[id(entry)]}"
                installed.append(loaded)
        self.entries.extend(entry for entry, _ in checked)
        finished = time.perf_counter()
        # Seconds per phase of the last load. Guard managers are built on a
        # frame's first lookup and kernel binaries load when a graph first runs.
        self.load_stats = {
            "entries": len(installed),
            # The codes Dynamo compiled under the package (NOTE: [Frames of
            # loaded packages]): those with entries and those saved without.
            "codes": len({tuple(entry.code_key) for entry in entries}) + len(_bypassed_codes(manifest, path)),
            "kernels": len(kernel_paths),
            "verify_s": verified - started,
            "unpickle_s": unpickled - verified,
            "install_s": finished - unpickled,
            "total_s": finished - started,
        }
        log.info(
            "loaded package %s: %d entries, %d kernels in %.3f s",
            path,
            len(installed),
            len(kernel_paths),
            finished - started,
        )
        return installed

    def _drop_stale(self, entries: list[_Entry], path) -> list[_Entry]:
        """The entries derived from the code and config this process runs. The
        others are dropped, with one warning naming what changed (a PackageError
        with strict_precompile() or refuse_stale): NOTE: [What an entry was
        derived from]."""
        live = LiveSources(lambda module, qualname: _resolve_code(("function", module, qualname), self._root_codes()))
        kept: list[_Entry] = []
        changes: dict[str, None] = {}
        for entry in entries:
            records = entry.sources
            if self._ignore_inlined_sources:
                records = tuple(r for r in records if r[0] != "inlined")
            changed = live.changes(records, entry.global_module) if entry.out_code else []
            for line in changed:
                changes.setdefault(line, None)
            if not changed:
                kept.append(entry)
        if not changes:
            return kept
        self.stale_entries.extend(changes)
        compiled = sum(1 for entry in entries if entry.out_code)
        message = (
            f"package {path}: {len(entries) - len(kept)} of its {compiled} entries were compiled "
            f"from code or config that differs in this process, and are not loaded: "
            + "; ".join(changes)
        )
        if self.refuse_stale or strict_precompile():
            raise PackageError(message)
        warnings.warn(message + ". The frames they ran will compile.", stacklevel=4)
        return kept

    def _load_graphs(self, files, redirect: _KernelRedirect, path, needed: set[str]) -> dict[str, Any]:
        """The package's graphs the ``needed`` artifacts name; a frozen one is
        checked against the module it is loaded for (NOTE: [Parameters of
        frozen packages])."""
        module = self._compiled_module()
        graphs = {}
        checks_at_call = self.frozen_checks_at_call
        for name, data in files.items():
            artifact = graph_name(name)
            if artifact is not None and artifact in needed:
                try:
                    graphs[artifact] = deserialize_graph(data, redirect, artifact)
                except PackageError as e:
                    raise PackageError(f"package {path}: {name}: {e}") from e
                except Exception as e:
                    raise PackageError(f"package {path}: graph {artifact} is damaged: {e!r}"[:600]) from e
                if not folded_parameters(graphs[artifact]):
                    continue
                if module is None and checks_at_call is not None:
                    # aot_compile: the module is the first argument of each call.
                    checks_at_call.append((graphs[artifact], f"{artifact} of {path}"))
                else:
                    check_frozen_parameters(graphs[artifact], module, f"{artifact} of {path}")
        return graphs

    def _checked_code(self, entry: _Entry, path) -> dict[str, types.CodeType]:
        """The entry's code objects (its bytecode under "", resume functions by
        global name), each checked to belong to the function it is installed for
        (NOTE: [Bytecode of loaded entries]); its guards state checked too."""
        what = f"package {path}: entry of {_describe_key(entry.code_key)}"
        codes = {"": _unmarshal_code(entry.out_code, what)}
        live = None
        if entry.code_key[0] == "inline_wrapper":
            live = _inline_wrapper_code()
        elif entry.code_key[0] == "function":
            live = _resolve_code(entry.code_key, self._root_codes())
        elif codes[""].co_name != entry.code_key[1]:
            raise PackageError(f"{what}: its bytecode is of {codes[''].co_name[:80]!r}")
        if live is not None:
            check_bytecode_belongs(codes[""], live, what)
        for name, ref in entry.globals.items():
            if ref[0] == "resume":
                code = _unmarshal_code(ref[2], f"{what}, resume function {name}")
                if not (_is_resume_code(code) and code.co_name == ref[1]):
                    raise PackageError(f"{what}: global {name} is not the resume function it names")
                codes[name] = code
        _check_guards_state(entry, codes[""], what)
        _check_entry_module(entry, sys.modules.get(entry.global_module), codes[""])
        _check_global_refs(entry, what, self._modules_named_by_live_function())
        return codes

    def _compiled_module(self) -> Optional[torch.nn.Module]:
        """The module this package compiles: torch.compile(module), or
        module.compile() / torch.compile(module.forward), which compile a bound
        method of the module (generate() then runs the compiled module)."""
        fn = self._fn
        if isinstance(fn, torch.nn.Module):
            return fn
        owner = getattr(fn, "__self__", None)
        return owner if isinstance(owner, torch.nn.Module) else None

    def _modules_named_by_live_function(self) -> Optional[set]:
        """The modules the compiled function's globals (and, for a module, its
        submodules' classes and the functions they hold) name: the only ones an
        entry may run in. A global container (transformers' ROPE_INIT_FUNCTIONS,
        a dict of functions a rotary embedding picks from) names the modules of
        the functions and classes it holds. None when the function is not known
        yet (aot_compile checks after the load)."""
        fn = self._fn
        if fn is None:
            return None
        names = {"torch._dynamo.external_utils"}  # the inline wrapper's frame
        holders = [fn]
        module = self._compiled_module()
        if module is not None:
            for m in module.modules():
                holders.append(type(m).forward)
                names.add(type(m).__module__)
                names |= {
                    value.__module__
                    for value in vars(m).values()
                    if isinstance(value, types.FunctionType) and isinstance(value.__module__, str)
                }
        seen_globals: set[int] = set()
        for holder in holders:
            holder = getattr(holder, "__func__", holder)
            f_globals = getattr(holder, "__globals__", None) or {}
            own = f_globals.get("__name__") or getattr(holder, "__module__", None)
            if isinstance(own, str):
                names.add(own)
            if id(f_globals) in seen_globals:
                # Submodules of one class (32 Linear layers) share one module's
                # globals: read each once (a load calls this for every entry).
                continue
            seen_globals.add(id(f_globals))
            for value in f_globals.values():
                owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
                if isinstance(owner, str):
                    names.add(owner)
                elif type(value) in (dict, list, tuple):
                    names |= _modules_of_callables_in(value)
        return names

    def _live_function_globals(self) -> dict[str, dict]:
        """The globals the compiled function (and, for a module, its submodules'
        forwards) run with, by module name. Usually the module's own dict; not
        under torch.multiprocessing.spawn, where the user's script runs in a
        namespace of runpy's that sys.modules["__mp_main__"] only copies: the
        bytecode's globals go where its frame reads them."""
        holders = [self._fn]
        module = self._compiled_module()
        if module is not None:
            holders += [type(m).forward for m in module.modules()]
        found: dict[str, dict] = {}
        for holder in holders:
            f_globals = getattr(getattr(holder, "__func__", holder), "__globals__", None)
            if isinstance(f_globals, dict) and isinstance(f_globals.get("__name__"), str):
                found.setdefault(f_globals["__name__"], f_globals)
        return found

    def _install_loaded(self, entry: _Entry, graphs: dict, codes: dict) -> Optional[_LoadedEntry]:
        allowed = self._modules_named_by_live_function()
        module = sys.modules.get(entry.global_module)
        if module is None or (allowed is not None and entry.global_module not in allowed):
            # Never imported by name, never run in a module the function does not name.
            warnings.warn(
                f"torch.compile package: entry of {_describe_key(entry.code_key)} skipped: its "
                f"module {entry.global_module[:100]!r} is not one the compiled function's globals name"
                + ("" if module is not None else " (nor imported)")
            )
            return None
        f_globals = self._live_function_globals().get(entry.global_module, vars(module))
        renames = {}
        for name, ref in entry.globals.items():
            unique = f"{name}_pkg{self._uid}"
            if ref[0] == "graph":
                f_globals[unique] = graph_for_bytecode(graphs[ref[1]])
                renames[name] = unique
            elif ref[0] == "resume":
                fn = types.FunctionType(codes[name], f_globals, ref[1])
                f_globals[unique] = fn
                renames[name] = unique
            elif ref[0] == "random_values":
                f_globals[unique] = random_values_function(ref[1], f"the entry of {_describe_key(entry.code_key)}")
                renames[name] = unique
            elif ref[0] == "module":
                f_globals.setdefault(name, _named_module(ref[1], entry))
            else:
                from torch._dynamo.guard_serialization import _NamedRef, resolve_name

                f_globals.setdefault(name, resolve_name(_NamedRef(ref[1], ref[2])))
        # See NOTE: [Names a loaded entry installs keep their numbers]
        from torch._dynamo.guard_serialization import reserve_dynamo_global_names

        reserve_dynamo_global_names(name for name in entry.globals if name not in renames)
        out_code = _rename_globals(codes[""], renames)
        loaded = _LoadedEntry(entry, out_code, f_globals)
        self._loaded.append(loaded)
        return loaded
    def lookup(self, frame, cache_entry):
        """A saved entry whose guards accept this frame, installed; SKIP_FRAME
        for a code the package records as skipped; else None."""
        if not self._loaded and not self._loaded_skips:
            return None
        from torch._dynamo.convert_frame import input_codes, orig_code_map, output_codes
        from torch._dynamo.types import GuardedCode
        from torch._guards import CompileId

        code = frame.f_code
        rejected = []
        for loaded in list(self._loaded):
            if not self._entry_matches(loaded.entry, code):
                continue
            if loaded.guard_manager is None:
                try:
                    loaded.guard_manager = load_guard_manager(
                        loaded.entry.guards_state, code, loaded.f_globals, cache_entry
                    )
                except PackageError as e:
                    # Its guards cannot be rebuilt in this process: the entry is
                    # dropped and the frame compiles (or fail_on_recompile says so).
                    self._loaded.remove(loaded)
                    warnings.warn(
                        f"compile package entry for {code.co_name} "
                        f"({code.co_filename}:{code.co_firstlineno}) cannot be used: {e}",
                        stacklevel=2,
                    )
                    continue
            if not loaded.guard_manager.check(frame.f_locals):
                rejected.append(loaded)
                continue
            # NOTE: [Bookkeeping of installed entries]
            # What _compile records for a cache entry it installs, recorded for
            # one installed from the package: torch._dynamo.reset() clears the
            # cache entries of the codes in input_codes (a code missing there
            # keeps a stale entry whose out_code orig_code_map no longer knows,
            # and the next guard failure on it raises KeyError in
            # get_guard_fail_reason), and Dynamo never compiles an out_code.
            input_codes.add(code)
            orig_code_map[loaded.out_code] = code
            output_codes.add(loaded.out_code)
            manager = loaded.guard_manager
            # A guard manager belongs to one cache entry; a later miss rebuilds.
            loaded.guard_manager = None
            origin = self._origin(loaded.entry)
            if origin is not None:
                _note_origin(manager, origin, code)
            return GuardedCode(
                loaded.out_code,
                manager,
                CompileId(-1, 0),
                "Torch-Compiled Region: loaded from package",
            )
        for skip in self._loaded_skips:
            if self._entry_matches(skip, code):
                input_codes.add(code)
                return RUN_ONLY_FRAME if skip.frame_action == RUN_ONLY_CODE else SKIP_FRAME
        if rejected:
            _explain_miss(frame, rejected)
        return None

    def explain(self, *args, **kwargs) -> str:
        """What each loaded entry of the compiled callable's own code says
        about a call with ``args`` and ``kwargs``: accepts, or its first failing
        guard (NOTE: [Explaining a loaded miss]). Checks guards only: nothing
        runs, compiles or is installed."""
        from torch._dynamo.guards import get_guard_fail_reason_helper
        from torch._guards import CompileId

        fn = self._fn
        module = fn if isinstance(fn, torch.nn.Module) else None
        target = type(fn).forward if module is not None else fn
        # The function whose frame Dynamo compiled: a decorator's wrapper if any.
        target = getattr(target, "__func__", target)
        if module is None and getattr(fn, "__self__", None) is not None:
            args = (fn.__self__, *args)
        elif module is not None:
            args = (module, *args)
        bound = inspect.signature(target, follow_wrapped=False).bind(*args, **kwargs)
        bound.apply_defaults()
        f_locals = dict(bound.arguments)
        code = target.__code__
        for name, cell in zip(code.co_freevars, target.__closure__ or ()):
            f_locals[name] = cell.cell_contents
        lines = []
        for loaded in self._loaded:
            what = f"{loaded.where} ({_describe_key(loaded.entry.code_key)})"
            if not self._entry_matches(loaded.entry, code):
                lines.append(f"{what}: not for this call's frame (checked when its frame runs)")
                continue
            try:
                manager = loaded.guard_manager or load_guard_manager(
                    loaded.entry.guards_state, code, loaded.f_globals, None
                )
                if manager.check(f_locals):
                    lines.append(f"{what}: accepts the call")
                    continue
                reason = get_guard_fail_reason_helper(manager, f_locals, CompileId(-1, 0))
            except Exception as e:
                reason = f"its guards cannot be checked: {type(e).__name__}: {e}"
            lines.append(f"{what}: rejects the call: {reason.strip().removeprefix('-1/0: ')}")
        lines.extend(f"dropped at load: {change}" for change in self.stale_entries)
        return "\n".join(lines) or "no entries are loaded"


def explain_entries(compiled, *args, **kwargs) -> str:
    """What each entry loaded into the package of ``compiled`` (the result of
    ``torch.compile(fn_or_module, package=...)``) says about
    ``compiled(*args, **kwargs)``: see :meth:`CompilePackage.explain`."""
    get_package = getattr(compiled, "_compile_package", None)
    package = get_package() if get_package is not None else getattr(compiled, "_package", None)
    if package is None:
        raise ValueError(f"{compiled!r} was not compiled with torch.compile(..., package=...)")
    return package.explain(*args, **kwargs)


# What CompilePackage.lookup returns for a frame whose code the package
# records as skipped (NOTE: [Frames Dynamo skips]).
SKIP_FRAME = object()
# What lookup returns for a code that hit its recompile limit when saved
# (NOTE: [Frames Dynamo skips]).
RUN_ONLY_FRAME = object()


class PackageAwareConvertFrame:
    """Dynamo's frame callback, consulting the package before compiling."""

    def __init__(self, convert_frame, package: CompilePackage) -> None:
        # The backend, as on the ConvertFrame this wraps: DDPOptimizer compiles
        # the pieces of a split graph with it (CatchErrorsWrapper reads it two
        # levels down), and eval_frame.c follows the chain to the same end.
        self._torchdynamo_orig_callable = getattr(
            convert_frame, "_torchdynamo_orig_callable", convert_frame
        )
        self.package = package
        self._inner = convert_frame

    @property
    def _clone_with_backend(self) -> Callable[[Callable], PackageAwareConvertFrame]:
        """Used by DDPOptimizer to swap in its own backend (NOTE: [DDPOptimizer
        graphs in packages]): the clone still consults and records the package."""
        inner_clone = self._inner._clone_with_backend

        def clone(ddp_compile_fn: Callable) -> PackageAwareConvertFrame:
            recording = functools.partial(_compile_ddp_split, self.package, ddp_compile_fn)
            return PackageAwareConvertFrame(inner_clone(recording), self.package)

        return clone

    def _records_cache_entries(self) -> bool:
        """Whether each compile records the package in the PrecompileContext:
        under config.caching_precompile, and always for a package of its own."""
        package = self.package
        return package.is_initialized() and (
            torch._dynamo.config.caching_precompile or getattr(package, "caching_precompile", False)
        )

    def lookup_precompiled(self, frame, cache_entry):
        guarded = self.package.lookup(frame, cache_entry)
        if guarded is None:
            guarded = installed_lookup(frame, cache_entry, exclude=self.package)
        if guarded is None:
            return None
        if not _callbacks_return_convert_frame_return():
            # See NOTE: [Frame callback results on torch 2.6.0]
            return guarded
        from torch._dynamo.convert_frame import ConvertFrameReturn
        from torch._dynamo.types import FrameAction, FrameExecStrategy

        if guarded is SKIP_FRAME:
            # What Dynamo returns for a frame it does not compile.
            return ConvertFrameReturn()
        if guarded is RUN_ONLY_FRAME:
            # What Dynamo returns at the recompile limit, for this frame only.
            return ConvertFrameReturn(
                frame_exec_strategy=FrameExecStrategy(FrameAction.RUN_ONLY, FrameAction.RUN_ONLY),
                apply_to_code=False,
            )
        return ConvertFrameReturn(
            frame_exec_strategy=FrameExecStrategy(FrameAction.DEFAULT, FrameAction.DEFAULT),
            guarded_code=guarded,
        )

    def __call__(self, frame, cache_entry, hooks, frame_state, **kwargs):
        hit = self.lookup_precompiled(frame, cache_entry)
        if hit is not None:
            return None if hit is SKIP_FRAME or hit is RUN_ONLY_FRAME else hit
        hooks = _with_frozen_parameter_filter(hooks, self.package.backend)
        entries = self.package.entries
        before = len(entries)
        skipped = len(self.package.skipped)
        with _recording(self.package), self.package._compiling_frame():
            result = self._inner(frame, cache_entry, hooks, frame_state, **kwargs)
        if (len(entries), len(self.package.skipped)) != (before, skipped) and self._records_cache_entries():
            # As upstream's ConvertFrameAssert: the package changed, record it
            # (NOTE: [Recording a package's cache entry]).
            DynamoCache.record_package(self.package)
        if len(entries) == before + 1:
            # The entry this frame's compile recorded: other packages whose
            # models run its code may take it (NOTE: [Entries a package's model uses]).
            guarded = getattr(result, "guarded_code", result)
            manager = getattr(guarded, "guard_manager", None) or getattr(guarded, "check_fn", None)
            origin = self.package._origin(entries[-1])
            if manager is not None and origin is not None:
                _note_origin(manager, origin, frame.f_code)
        frame_action = _code_frame_action(result)
        if frame_action:
            self.package.record_skip(frame, frame_action)
        return result


# NOTE: [Frame callback results on torch 2.6.0]
# On torch 2.7 a frame callback returns a ConvertFrameReturn (a GuardedCode, or
# what to do with the frame and its code). torch 2.6.0 (a second supported base)
# has none: its callbacks return the GuardedCode itself, or None for a frame
# Dynamo does not compile, which eval_frame.c then runs eagerly from now on
# (SKIP_CODE, what 2.7's default ConvertFrameReturn() asks for). There the
# lookup returns the GuardedCode or SKIP_FRAME, and its callers return None for
# SKIP_FRAME.
@functools.cache
def _callbacks_return_convert_frame_return() -> bool:
    from torch._dynamo import types

    return hasattr(types, "ConvertFrameReturn")


def _code_frame_action(result) -> str:
    """SKIP_CODE when a frame callback's result runs this code eagerly from
    now on, RUN_ONLY_CODE when it runs only its cache entries from now on (the
    recompile limit), else ""."""
    if not _callbacks_return_convert_frame_return():
        # See NOTE: [Frame callback results on torch 2.6.0]
        return SKIP_CODE if result is None else ""
    from torch._dynamo.types import FrameAction

    strategy = getattr(result, "frame_exec_strategy", None)
    if (
        result is None
        or getattr(result, "guarded_code", None) is not None
        or not getattr(result, "apply_to_code", False)
        or strategy is None
    ):
        return ""
    return {FrameAction.SKIP: SKIP_CODE, FrameAction.RUN_ONLY: RUN_ONLY_CODE}.get(strategy.cur_action, "")


# NOTE: [DDPOptimizer graphs in packages]
# Under DistributedDataParallel (config.optimize_ddp), Dynamo hands each frame's
# graph to DDPOptimizer, which splits it at DDP's gradient bucket boundaries,
# compiles every piece with the torch.compile backend and returns the split
# graph module that calls them, so that one bucket's gradients are allreduced
# while backward computes the next. CatchErrorsWrapper takes that backend from
# PackageAwareConvertFrame._torchdynamo_orig_callable (the package's
# RecordingBackend, which records each piece) and asks _clone_with_backend for
# a callback compiling with DDPOptimizer.compile_fn; the clone is package-aware
# too, and _compile_ddp_split records the split graph module as one graph of
# the package: a _DDPSplitGraph, the split graph's code plus each piece's own
# artifact (saved as the package saves any graph of its backend, Inductor
# kernels included). A loaded package runs the same pieces: the buckets, and
# the overlap of allreduce with backward, are those of the process that saved.
# DDPOptimizer compiles each piece with TracingContext.fakify_first_call set,
# which AOTAutograd's cache bypasses; an Inductor piece's entry (what the
# package saves it from) reaches its _AOTCompileListener because the listener
# sets record_fakified_compiles (NOTE: [Listeners and fakify_first_call
# compiles] in torch/_functorch/_aot_autograd/autograd_cache.py). Such a piece
# is therefore compiled by every compile under a package, never found in the
# on-disk cache, and its entry is not written there. At load, each piece runs
# the saved kernels for the strides the saving compile propagated between the
# pieces: nothing is fakified again. The loading process wraps the model in
# DDP itself, with the saving process's bucket_cap_mb: the pieces are fixed at
# save, and the same cap gives DDP's reducer the buckets they were cut for.


def _compile_ddp_split(package: CompilePackage, ddp_compile_fn: Callable, gm, example_inputs):
    """DDPOptimizer.compile_fn, with its split graph recorded in ``package``."""
    from .package_artifacts import _GraphRecord as GraphRecord

    compiled = ddp_compile_fn(gm, example_inputs)
    backend = package.backend
    if backend is None or backend.record_for(compiled) is not None:
        return compiled  # one bucket: the backend compiled (and recorded) it whole
    pieces = {}
    for node in compiled.graph.nodes:
        if node.op != "call_module":
            continue
        wrapper = compiled.get_submodule(node.target)
        piece = backend.record_for(getattr(wrapper, "submod", None))
        if piece is None:
            return compiled  # the entry is left out at save: no record of its graph
        pieces[node.target] = (piece, bool(wrapper.unwrap_singleton_tuple))
    devices = tuple(sorted({d for piece, _ in pieces.values() for d in piece.devices}))
    record = GraphRecord(f"{_CUSTOM_BACKEND}ddp_optimizer", gm, devices)
    record.compiled = _DDPSplitGraph(compiled, pieces)
    for obj in (*_unwrap_chain(compiled), compiled):
        backend.records[id(obj)] = (obj, record)
    return compiled


class _DDPSplitPiece(torch.nn.Module):
    """One bucket's compiled graph in a loaded split graph (as DDPOptimizer's
    WrapperModule: a single output comes back out of its tuple)."""

    def __init__(self, unwrap_singleton_tuple: bool) -> None:
        super().__init__()
        self.unwrap_singleton_tuple = unwrap_singleton_tuple
        self.compiled: Any = None  # the loaded graph, set after unpickling

    def __getstate__(self):
        state = dict(self.__dict__)
        state["compiled"] = None
        return state

    def forward(self, *args):
        out = self.compiled(*args)
        if self.unwrap_singleton_tuple and isinstance(out, (tuple, list)):
            return out[0]
        return out


class _DDPSplitGraph(SerializableCallable):
    """A DDPOptimizer split graph as a package saves it (NOTE: [DDPOptimizer
    graphs in packages]): the outer graph's code and each piece's artifact."""

    def __init__(self, split_gm, pieces: dict) -> None:
        self.split_gm = split_gm
        self.pieces = pieces  # call_module target -> (_GraphRecord, unwrap)

    def __call__(self, *args):
        return self.split_gm(*args)

    @classmethod
    def serialize_compile_artifacts(cls, fn: _DDPSplitGraph) -> bytes:
        from .package_artifacts import serialize_graph

        root = torch.nn.Module()
        blobs, kernels = {}, {}
        for target, (record, unwrap) in fn.pieces.items():
            refused = _refused_option(record)
            if refused is not None:
                raise PackageError(f"DDPOptimizer piece {target}: {refused}")
            blobs[target], piece_kernels = serialize_graph(record)
            kernels.update(piece_kernels)
            setattr(root, target, _DDPSplitPiece(unwrap))
        graph = torch.fx.Graph()
        graph.output(graph.graph_copy(fn.split_gm.graph, {}))
        outer = torch.fx.GraphModule(root, graph)
        return pickle.dumps({"outer": outer, "pieces": blobs, "kernels": kernels})

    @classmethod
    def deserialize_compile_artifacts(cls, data: bytes) -> Any:
        from .package_artifacts import deserialize_graph, redirect_to_kernel_binaries

        payload = pickle.loads(data)
        redirect = redirect_to_kernel_binaries(payload["kernels"], "torch_package_ddp_kernels_")
        outer = payload["outer"]
        for target, blob in payload["pieces"].items():
            piece = outer.get_submodule(target)
            piece.compiled = deserialize_graph(blob, redirect, target)
            piece._kernel_redirect = redirect
        return outer


def find_precompiled_lookup(callback):
    """The package lookup behind a (wrapped) Dynamo callback, if it has one.

    Stance fail_on_recompile calls it on a miss, then raises: a miss that
    loaded entries rejected raises here, with what rejected it (NOTE:
    [Explaining a loaded miss])."""
    seen = 0
    while callback is not None and seen < 8:
        lookup = getattr(callback, "lookup_precompiled", None)
        if lookup is not None:
            return functools.partial(_lookup_or_explain, lookup)
        callback = getattr(callback, "_torchdynamo_orig_callable", None)
        seen += 1
    return None


# NOTE: [Explaining a loaded miss]
# A frame whose loaded entries all reject it compiles. Dynamo explains a
# recompile with the guard failures of the frame's cache entries, but a loaded
# entry that never accepted a frame is in no cache, so its rejection would go
# unsaid, and a user could not tell whether the package or the call is at
# fault. The package's lookup explains it instead, the way Dynamo does for its
# own entries: with TORCH_LOGS=recompiles (recompiles_verbose) it logs the
# function, and for each loaded entry of that code the package, the entry's
# number and its first failing guard with the values seen
# (get_guard_fail_reason_helper); under stance fail_on_recompile the error
# names the same.
_recompiles_log = torch._logging.getArtifactLogger(__name__, "recompiles")
_recompiles_verbose_log = torch._logging.getArtifactLogger(__name__, "recompiles_verbose")


def _explain_miss(frame, rejected: list[_LoadedEntry]) -> None:
    from torch._dynamo.guards import get_guard_fail_reason_helper
    from torch._guards import CompileId

    code = frame.f_code
    failures = []
    for loaded in rejected:
        try:
            reason = get_guard_fail_reason_helper(loaded.guard_manager, frame.f_locals, CompileId(-1, 0))
        except Exception as e:  # a guard that raises says so
            reason = f"its guards raised {type(e).__name__}: {e}"
        reason = reason.strip().removeprefix("-1/0: ")  # the compile id of every loaded entry
        failures.append(f"{loaded.where} ({_describe_key(loaded.entry.code_key)}): {reason}")
    message = (
        f"{code.co_name} in {code.co_filename}:{code.co_firstlineno}: its entries loaded "
        "from packages reject the call:\n" + "\n".join(f"- {line}" for line in failures)
    )
    _tls.package_miss = (code, message)
    if _recompiles_verbose_log.isEnabledFor(logging.DEBUG):
        _recompiles_verbose_log.debug("Recompiling function %s", message)
    elif _recompiles_log.isEnabledFor(logging.DEBUG):
        _recompiles_log.debug("Recompiling function %s", message)


def _lookup_or_explain(lookup, frame, cache_entry):
    _tls.package_miss = None
    hit = lookup(frame, cache_entry)
    miss = getattr(_tls, "package_miss", None)
    if hit is None and miss is not None and miss[0] is frame.f_code:
        _tls.package_miss = None
        raise RuntimeError(
            "Detected recompile when torch.compile stance is 'fail_on_recompile'. "
            f"filename: '{frame.f_code.co_filename}', "
            f"function name: '{frame.f_code.co_name}', "
            f"line number: {getattr(frame, 'f_lineno', '?')}. {miss[1]}"
        )
    return hit


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------



# ---------------------------------------------------------------------------
# Upstream's shape: cache entries, stores, the Dynamo cache
# ---------------------------------------------------------------------------


# NOTE: [Packages in upstream's shape]
# Upstream (torch 2.8+) splits what a torch.compile() saves in two: a
# _DynamoCacheEntry (one _DynamoCodeCacheEntry per code Dynamo compiled: its
# bytecode and guards, the globals it needs, the graphs it calls) and backend
# artifacts, one per compiled graph, keyed by backend id and recorded in the
# PrecompileContext. A DynamoStore stitches them into a PrecompileCacheEntry
# and writes it; load_package reads one back into a CompilePackage, whose
# install(backends) makes its entries live. Here the same split sits on the
# package format this module writes (NOTE: [Package format]): the Dynamo half
# is dynamo.bin (the entries of every code not bypassed), the kernels and the
# manifest's fields (the codes saved bypassed among them); each graphs/<id>.bin
# is one backend artifact (a PackageGraphArtifact), its id the graph's artifact
# name, which is what package.cached_backends, debug info and the
# PrecompileContext key it by. A code is keyed as its entries are (NOTE: [Keys
# of package entries]). A DiskDynamoStore writes a PrecompileCacheEntry as a
# package directory (manifest re-hashed, re-signed with
# config.package_signing_key), so torch.compile(package=...), save_package /
# load_package, the Dynamo cache of caching_precompile and upstream's stores
# all read and write one format, through one trust check (read_package). What
# package.cache_entry() records, and when it becomes files: NOTE: [Recording a
# package's cache entry].


@dataclasses.dataclass(frozen=True)
class InlinedSource:
    """A function Dynamo inlined into a saved frame, and its source's hash."""

    module: str
    firstlineno: int
    lastlineno: int
    checksum: str


@dataclasses.dataclass
class SourceInfo:
    """The sources a package's entries were traced from (checked at load)."""

    inlined_sources: set[InlinedSource] = dataclasses.field(default_factory=set)

    def add_code(self, code: types.CodeType) -> None:
        self.add_record(inlined_code_record(code))

    def add_record(self, record: tuple) -> None:
        """Add an inlined function's record (torch/_dynamo/package_sources.py)
        when it holds the hash of its source lines, read the way a load reads
        them, so that an unchanged file always hashes the same."""
        _, module, _, _, first, last, digest = record
        if digest.startswith("lines:"):
            self.inlined_sources.add(
                InlinedSource(module=module, firstlineno=first, lastlineno=last, checksum=digest.removeprefix("lines:"))
            )

    def check_unchanged(self) -> None:
        """RuntimeError naming the first inlined source that changed since save."""
        for source in sorted(self.inlined_sources, key=dataclasses.astuple):
            module = sys.modules.get(source.module)
            current = _module_lines(module, source.firstlineno, source.lastlineno)
            if current is None or _sha256("".join(current).encode()) != source.checksum:
                raise RuntimeError(
                    f"Source code changes detected for {source.module} "
                    f"(line {source.firstlineno} - line {source.lastlineno})"
                )

    def as_fields(self) -> list[list]:
        return [list(dataclasses.astuple(s)) for s in sorted(self.inlined_sources, key=dataclasses.astuple)]

    @classmethod
    def from_fields(cls, fields, where) -> SourceInfo:
        if not isinstance(fields, list) or not all(
            isinstance(f, list)
            and len(f) == 4
            and isinstance(f[0], str)
            and isinstance(f[1], int)
            and isinstance(f[2], int)
            and isinstance(f[3], str)
            for f in fields
        ):
            raise PackageError(f"package {where}: its manifest's inlined_sources are malformed")
        return cls({InlinedSource(*f) for f in fields})


def _module_lines(module, first: int, last: int) -> Optional[list[str]]:
    """Lines first..last of ``module``'s source as it is now on disk."""
    lines = read_module_lines(getattr(module, "__file__", None))
    if lines is None or last > len(lines):
        return None
    return lines[first - 1 : last]


@dataclasses.dataclass(frozen=True)
class SystemInfo:
    """The Python, torch and accelerator a package was saved with."""

    python_version: str
    torch_version: str
    toolkit_version: Optional[str]
    gpu_name: Optional[str]
    CHECK_GPUS = ("cuda", "xpu")

    @classmethod
    def current(cls) -> SystemInfo:
        import platform

        gpu_name = toolkit_version = None
        for device_type in cls.CHECK_GPUS:
            device_module = getattr(torch, device_type, None)
            if device_module is not None and device_module.is_available():
                gpu_name = device_module.get_device_name()
                toolkit_version = getattr(torch.version, device_type, None)
                break
        # The release, as the manifest records it (_environment): the patched
        # wheel's local version (+overlay...) and CUDA tag do not change the format.
        return cls(platform.python_version(), str(torch.__version__).split("+")[0], toolkit_version, gpu_name)

    def check_compatibility(self, other: SystemInfo, device_type: str = "cpu") -> None:
        """RuntimeError (upstream's wording) when ``other`` cannot load what
        ``self`` saved on ``device_type``."""
        if self.python_version != other.python_version:
            raise RuntimeError(
                f"Compile package was created with a different Python version: {self.python_version}"
            )
        if self.torch_version != other.torch_version:
            raise RuntimeError(
                f"Compile package was created with a different PyTorch version: {self.torch_version}"
            )
        if device_type in self.CHECK_GPUS:
            if not getattr(torch, device_type).is_available():
                raise RuntimeError(f"{device_type} is not available")
            if self.toolkit_version != other.toolkit_version:
                raise RuntimeError(
                    f"Compile package was created with a different toolkit version: {self.toolkit_version}"
                )
            if self.gpu_name is not None and self.gpu_name != other.gpu_name:
                raise RuntimeError(
                    f"Compile package was created with different GPU: cached={self.gpu_name}, "
                    f"current={other.gpu_name}"
                )



@functools.lru_cache(maxsize=1024)
def _resume_ref_fingerprint(data: bytes) -> str:
    """The fingerprint of the resume function a global reference holds (the
    key of that function's own entries: NOTE: [Keys of package entries])."""
    return code_fingerprint(load_code(data, "a resume function"))


@dataclasses.dataclass
class _DynamoCodeCacheEntry:
    """One code Dynamo compiled under a package (upstream's name and fields):
    the module whose globals it runs in; the global names its callers reach it
    by (a resume function, which a load installs as a global of that module:
    install_to_global); its entries (guarded_codes: bytecode and guards, or
    Dynamo's decision to skip it, NOTE: [Frames Dynamo skips]); the modules its
    bytecode names and the graphs (backend ids) it calls. A bypassed code is
    saved without its entries: a fresh process compiles it again."""

    code_key: tuple
    python_module: str
    function_names: list[str]
    guarded_codes: list[_Entry]
    import_sources: dict[str, str]
    backend_ids: list[str]
    install_to_global: bool
    code_source: Optional[str] = None
    has_compile_id: bool = True
    bypassed: bool = False


def _codes_of_entries(entries: list[_Entry], root_qualnames: frozenset = frozenset()) -> list[_DynamoCodeCacheEntry]:
    """``entries`` grouped by the code they were compiled for, in order. A code
    of ``root_qualnames`` (the compiled callable's own) has no function name,
    as upstream's main code has none."""
    names_by_fingerprint: dict[str, list[str]] = {}
    for entry in entries:
        for name, ref in entry.globals.items():
            if ref[0] == "resume":
                names = names_by_fingerprint.setdefault(_resume_ref_fingerprint(ref[2]), [])
                if name not in names:
                    names.append(name)
    codes: dict[tuple, _DynamoCodeCacheEntry] = {}
    for entry in entries:
        key = tuple(entry.code_key)
        code = codes.get(key)
        if code is None:
            if key[0] == "resume":
                names = list(names_by_fingerprint.get(key[2], []))
            elif key[0] == "function" and key[2] not in root_qualnames:
                names = [key[2]]
            else:
                names = []
            code = codes[key] = _DynamoCodeCacheEntry(
                code_key=key,
                python_module=entry.global_module,
                function_names=names,
                guarded_codes=[],
                import_sources={},
                backend_ids=[],
                install_to_global=key[0] == "resume" and bool(names),
            )
        code.guarded_codes.append(entry)
        for name, ref in entry.globals.items():
            if ref[0] == "graph" and ref[1] not in code.backend_ids:
                code.backend_ids.append(ref[1])
            elif ref[0] == "module":
                code.import_sources[name] = ref[1]
    return list(codes.values())


def _bypassed_codes(manifest: dict, where) -> list[_DynamoCodeCacheEntry]:
    """The codes a package was saved without (its manifest's bypassed_codes)."""
    keys = manifest.get("bypassed_codes", [])
    if not (
        isinstance(keys, list)
        and all(
            isinstance(key, list)
            and len(key) == 3
            and key[0] in _CODE_KEY_KINDS
            and all(isinstance(part, str) for part in key)
            for key in keys
        )
    ):
        raise PackageError(f"package {where}: its manifest's bypassed_codes are malformed")
    return [
        _DynamoCodeCacheEntry(
            code_key=tuple(key),
            python_module=key[1] if key[0] != "resume" else "",
            function_names=[],
            guarded_codes=[],
            import_sources={},
            backend_ids=[],
            install_to_global=False,
            bypassed=True,
        )
        for key in keys
    ]


# NOTE: [Recording a package's cache entry]
# Upstream records a package's _DynamoCacheEntry in the PrecompileContext after
# every frame Dynamo compiles under it (with config.caching_precompile), and
# each backend records its compiled graph's artifact as it compiles it. Here a
# graph can be saved only once it is whole: Inductor's lazily compiled backward
# joins its AOTAutograd cache entry on the first backward. So the entry
# package.cache_entry() records is taken in two steps. At once: its codes (what
# was compiled, the graphs each calls), and for every graph the package has
# not recorded before, a PackageGraphArtifact with no content yet, under its
# backend id. When it is written (DynamoStore.save_cache_entry,
# PrecompileContext.save_to_dynamo_cache, install): PrecompileCacheEntry
# .materialize() collects the package's files then, fills each artifact the
# entry was given with its graph's bytes, and bypasses the codes whose graphs
# are not among them (an artifact deleted from the PrecompileContext, an entry
# the package left out), as upstream's from_cache_entry does.


@dataclasses.dataclass
class _DynamoCacheEntry:
    """The Dynamo half of a saved package (NOTE: [Packages in upstream's shape]):
    its codes, the sources they inlined and the system they were compiled on;
    once materialized, the kernels and the manifest's fields too (dynamo.bin is
    written from the codes)."""

    codes: list[_DynamoCodeCacheEntry]
    source_info: SourceInfo
    system_info: SystemInfo = dataclasses.field(default_factory=SystemInfo.current)
    fn_name: Optional[str] = None
    fn_first_lineno: Optional[int] = None
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    manifest: dict = dataclasses.field(default_factory=dict)
    # The package it was recorded from, until materialize() has collected its
    # files (NOTE: [Recording a package's cache entry]).
    _package: Optional[CompilePackage] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def backend_ids(self) -> set[str]:
        return {backend_id for code in self.codes for backend_id in code.backend_ids}

    def entries(self) -> list[_Entry]:
        """The entries a write keeps: those of every code not bypassed."""
        return [entry for code in self.codes if not code.bypassed for entry in code.guarded_codes]

    def check_versions(self) -> None:
        self.system_info.check_compatibility(SystemInfo.current())

    def debug_info(self) -> dict[str, Any]:
        return {
            "num_codes": str(len(self.codes)),
            "fn_name": self.fn_name,
            "fn_first_lineno": self.fn_first_lineno,
            "python_version": self.system_info.python_version,
            "torch_version": self.system_info.torch_version,
            "codes": [_describe_key(code.code_key) for code in self.codes],
            "bypassed": [_describe_key(code.code_key) for code in self.codes if code.bypassed],
            "backend_ids": sorted(self.backend_ids),
            "inlined_sources": sorted(s.module for s in self.source_info.inlined_sources),
        }

    def materialize(self) -> dict[str, bytes]:
        """Collect the files of the package this entry was recorded from: its
        codes as the package holds them now, bypass flags kept (a code whose
        entries the package left out is bypassed), and the graphs' bytes by
        backend id, which this returns (empty once materialized)."""
        package = self._package
        if package is None:
            return {}
        files, manifest = package.collect_files()
        graphs, kept = {}, {}
        for name, data in files.items():
            artifact = graph_name(name)
            if artifact is not None:
                graphs[artifact] = data
            elif name not in (SIGNATURE_FILE, _DYNAMO_FILE):
                kept[name] = data
        collected = _codes_of_entries(_read_entries(files, package.path or "<package>"), package._root_qualnames())
        by_key = {code.code_key: code for code in collected}
        codes = []
        for code in self.codes:
            now = by_key.pop(code.code_key, None)
            if now is None:
                codes.append(dataclasses.replace(code, guarded_codes=[], bypassed=True))
            else:
                now.bypassed = code.bypassed
                codes.append(now)
        self.codes = codes + list(by_key.values())
        self.files = kept
        self.manifest = {k: v for k, v in manifest.items() if k not in ("files", "bypassed_codes")}
        self._package = None
        return graphs


@dataclasses.dataclass
class PrecompileCacheEntry:
    """A whole saved torch.compile: its Dynamo entry and the backend artifacts
    (``precompile_context.BackendCacheArtifact``) of the graphs it calls."""

    dynamo: _DynamoCacheEntry
    backends: dict[str, Any]

    @staticmethod
    def from_cache_entry(cache_entry: _DynamoCacheEntry, backends: dict[str, Any]) -> PrecompileCacheEntry:
        """The entry with the backends its codes call; a code calling one that
        ``backends`` lacks is bypassed (logged), as upstream does."""
        content = {}
        for code in cache_entry.codes:
            missing = [backend_id for backend_id in code.backend_ids if backend_id not in backends]
            if missing:
                log.warning(
                    "precompile cache entry: %s is bypassed: backend %s not found",
                    _describe_key(code.code_key),
                    missing[0],
                )
                code.bypassed = True
                continue
            for backend_id in code.backend_ids:
                content[backend_id] = backends[backend_id]
        return PrecompileCacheEntry(dynamo=cache_entry, backends=content)

    def materialize(self) -> None:
        """Fill the backend artifacts with the graphs of the package the Dynamo
        entry was recorded from (NOTE: [Recording a package's cache entry])."""
        from torch._dynamo.precompile_context import PackageGraphArtifact

        graphs = self.dynamo.materialize()
        for backend_id in list(self.backends):
            if backend_id in graphs:
                # the kind recorded at compile time (graph_artifact_type) stays
                recorded = type(self.backends[backend_id])
                kind = recorded if issubclass(recorded, PackageGraphArtifact) else PackageGraphArtifact
                self.backends[backend_id] = kind(key=backend_id, content=graphs[backend_id])

    def files_and_manifest(self) -> tuple[dict[str, bytes], dict]:
        """The package files this entry is written as, and their manifest."""
        from torch._dynamo.precompile_context import BackendCacheArtifact

        self.materialize()
        files = dict(self.dynamo.files)
        entries, bypassed = [], []
        for code in self.dynamo.codes:
            graphs = {ref[1] for entry in code.guarded_codes for ref in entry.globals.values() if ref[0] == "graph"}
            missing = sorted(graphs - set(self.backends))
            if missing and not code.bypassed:
                log.warning(
                    "precompile cache entry: %s is bypassed: backend %s not found",
                    _describe_key(code.code_key),
                    missing[0],
                )
                code.bypassed = True
            if code.bypassed:
                bypassed.append(list(code.code_key))
            else:
                entries.extend(code.guarded_codes)
        files[_DYNAMO_FILE] = pickle.dumps([dataclasses.astuple(e) for e in entries], protocol=pickle.HIGHEST_PROTOCOL)
        for backend_id in sorted({ref[1] for e in entries for ref in e.globals.values() if ref[0] == "graph"}):
            artifact = self.backends[backend_id]
            if not isinstance(artifact, BackendCacheArtifact):
                raise PackageError(f"backend {backend_id} is a {type(artifact).__name__}, not a BackendCacheArtifact")
            files[graph_file(backend_id)] = artifact.package_bytes()
        manifest = dict(self.dynamo.manifest)
        manifest.update(
            {
                "entries": sum(1 for entry in entries if entry.out_code),
                "skipped_frames": sum(1 for entry in entries if not entry.out_code),
                "bypassed_codes": bypassed,
                "toolkit_version": self.dynamo.system_info.toolkit_version,
                "gpu_name": self.dynamo.system_info.gpu_name,
                "inlined_sources": self.dynamo.source_info.as_fields(),
            }
        )
        manifest["files"] = {name: _sha256(data) for name, data in sorted(files.items())}
        signature = sign_manifest(manifest_bytes(manifest))
        if signature is not None:
            files[SIGNATURE_FILE] = signature
        return files, manifest

    @classmethod
    def from_files(cls, files: dict[str, bytes], manifest: dict, where) -> PrecompileCacheEntry:
        """Split a verified package's files into the Dynamo entry and its backends."""
        from torch._dynamo.precompile_context import PackageGraphArtifact

        dynamo_files, backends = {}, {}
        for name, data in files.items():
            backend_id = graph_name(name)
            if backend_id is not None:
                backends[backend_id] = PackageGraphArtifact(key=backend_id, content=data)
            elif name not in (SIGNATURE_FILE, _DYNAMO_FILE):
                dynamo_files[name] = data
        codes = _codes_of_entries(_read_entries(files, where)) + _bypassed_codes(manifest, where)
        system = SystemInfo(
            python_version=str(manifest.get("python_version")),
            torch_version=str(manifest.get("torch_version")),
            toolkit_version=manifest.get("toolkit_version"),
            gpu_name=manifest.get("gpu_name"),
        )
        entry = _DynamoCacheEntry(
            codes=codes,
            source_info=SourceInfo.from_fields(manifest.get("inlined_sources", []), where),
            system_info=system,
            files=dynamo_files,
            manifest={k: v for k, v in manifest.items() if k not in ("files", "bypassed_codes")},
        )
        return cls(dynamo=entry, backends=backends)


def _compile_package_cache_entry(package: CompilePackage) -> _DynamoCacheEntry:
    """``package.cache_entry()``: its codes now, its files when it is written;
    each graph it has not recorded yet is recorded in the PrecompileContext as
    a backend artifact to be filled (NOTE: [Recording a package's cache entry])."""
    from torch._dynamo.eval_frame import innermost_fn
    from torch._dynamo.precompile_context import graph_artifact_type, PrecompileContext

    # See NOTE: [Entries a package's model uses]
    package._adopt_shared_entries()
    codes = _codes_of_entries(package.entries + package.skipped, package._root_qualnames())
    for code in codes:
        for backend_id in code.backend_ids:
            if backend_id not in package._recorded_backend_ids:
                package._recorded_backend_ids.add(backend_id)
                record = package._graph_records.get(backend_id)
                kind = graph_artifact_type(record.backend if record is not None else None)
                PrecompileContext.record_artifact(kind(key=backend_id, content=None))
    fn = innermost_fn(package._fn)
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    fn = getattr(fn, "__func__", fn)
    fn_code = getattr(fn, "__code__", None)
    return _DynamoCacheEntry(
        codes=codes,
        source_info=package.source_info,
        fn_name=getattr(fn, "__qualname__", None),
        fn_first_lineno=fn_code.co_firstlineno if fn_code is not None else None,
        _package=package,
    )


# NOTE: [Frames of loaded packages]
# Upstream's install counts every code of a package that Dynamo compiled as a
# frame, as if the process had compiled it (a new frame id in
# convert_frame.FRAME_COUNTER, bypassed codes included), so that a process
# loading what another one saved counts the frames that one did. A load here
# (install, load, the Dynamo cache) counts the same: every code it holds
# entries for and every code the package was saved without.
def _count_loaded_frames(codes: int) -> None:
    from torch._dynamo import convert_frame
    from torch._dynamo.utils import increment_frame

    for _ in range(codes):
        increment_frame()
        frame_id = convert_frame.FRAME_COUNTER
        convert_frame.FRAME_COUNTER += 1
        convert_frame.FRAME_COMPILE_COUNTER[frame_id] += 1


# Packages installed with CompilePackage.install: any package-aware Dynamo
# callback consults them for the codes they hold (upstream installs them as
# precompiled cache entries of the code in the C frame evaluator).
_installed_packages: weakref.WeakSet = weakref.WeakSet()


# NOTE: [Installed packages and torch._dynamo.reset()]
# torch._dynamo.reset() makes Dynamo behave as in a fresh process; upstream's
# reset clears the cache entries of every code Dynamo has seen, and so the
# precompiled entries a package installed there. Installed packages here live
# in _installed_packages, which any package-aware callback consults: left
# there, a package installed before a reset would serve frames after it, in
# place of the compile (or the fail_on_recompile error) a fresh process gets.
# reset() resets every backend of eval_frame.cached_backends (the registry it
# keeps for that), so install() registers _ResetInstalledPackages there, and its
# reset() uninstalls every installed package.
class _ResetInstalledPackages:
    """Uninstalls the installed packages when torch._dynamo.reset() runs."""

    def reset(self) -> None:
        for package in list(_installed_packages):
            package.uninstall()


_RESET_INSTALLED_PACKAGES = _ResetInstalledPackages()


def _uninstall_on_reset() -> None:
    from torch._dynamo import eval_frame

    backends = getattr(eval_frame, "cached_backends", None)
    if backends is not None:
        backends.setdefault(id(_RESET_INSTALLED_PACKAGES), _RESET_INSTALLED_PACKAGES)


def installed_lookup(frame, cache_entry, exclude=None):
    """The first installed package's hit for ``frame``, or None."""
    for package in list(_installed_packages):
        if package is exclude:
            continue
        hit = package.lookup(frame, cache_entry)
        if hit is not None:
            return hit
    return None


def source_id_from_fn(fn) -> str:
    """The key a function's packages are kept under in the Dynamo cache:
    sha256 of its module, qualified name and first line (NOTE: [Dynamo cache key])."""
    from torch._dynamo.eval_frame import innermost_fn

    function = innermost_fn(fn)
    if isinstance(function, torch.nn.Module):
        function = type(function).forward
    owner = getattr(function, "__self__", None)
    if isinstance(owner, torch.nn.Module):
        function = type(owner).forward
    function = getattr(function, "__func__", function)
    code = getattr(function, "__code__", None)
    if code is None:
        raise PackageError(f"{fn!r} has no Python code to key a package by")
    return hashlib.sha256(
        "\0".join([str(function.__module__), function.__qualname__, str(code.co_firstlineno)]).encode()
    ).hexdigest()


class DynamoStore:
    """Where compile packages are kept (upstream's torch._dynamo.package.DynamoStore)."""

    def record_package(self, package: CompilePackage) -> None:
        """Record ``package``'s cache entry in the PrecompileContext."""
        from torch._dynamo.precompile_context import PrecompileContext

        PrecompileContext.record_dynamo_cache_entry(package.cache_entry(), key=package.source_id)

    def record_eager_backend(self, backend_id: str, backend: Any) -> None:
        """Record an eager backend's graph in the PrecompileContext (upstream
        needs this for eager graphs; the package serializes every graph it
        calls, so a save replaces this record by the graph's package artifact)."""
        from torch._dynamo.precompile_context import EagerCacheArtifact, PrecompileContext

        PrecompileContext.record_artifact(EagerCacheArtifact(key=backend_id, content=backend))

    def clear(self) -> None:
        raise NotImplementedError

    def write(self, cache_entry: PrecompileCacheEntry, path: str) -> None:
        raise NotImplementedError

    def read(self, path: str) -> PrecompileCacheEntry:
        raise NotImplementedError

    def save_cache_entry(self, cache_entry: _DynamoCacheEntry, key: str) -> None:
        """Write ``cache_entry`` with its backends from the PrecompileContext."""
        from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

        backends = {}
        for backend_id in sorted(cache_entry.backend_ids):
            artifact = PrecompileContext.serialize_artifact_by_key(backend_id)
            if artifact is None:
                raise RuntimeError(f"Backend {backend_id} is not found in the given backends")
            if not isinstance(artifact, BackendCacheArtifact):
                raise AssertionError(f"Expected BackendCacheArtifact, got {type(artifact)}")
            backends[backend_id] = artifact
        entry = PrecompileCacheEntry(cache_entry, backends)
        entry.materialize()
        self.write(entry, key)

    def save_package(self, package: CompilePackage, key: str) -> None:
        """Record ``package`` in the PrecompileContext and write it under ``key``."""
        self.record_package(package)
        self.save_cache_entry(package.cache_entry(), key)

    def load_cache_entry(self, key: str) -> PrecompileCacheEntry:
        from torch._dynamo.precompile_context import BackendCacheArtifact, PrecompileContext

        entry = self.read(key)
        for backend in entry.backends.values():
            if not isinstance(backend, BackendCacheArtifact):
                raise AssertionError(f"Expected BackendCacheArtifact, got {type(backend)}")
            PrecompileContext.record_artifact(backend)
        return entry

    def load_package(self, fn, key: str) -> tuple[CompilePackage, dict[str, Any]]:
        """A package for ``fn`` holding what ``key`` saved, and its backends;
        ``package.install(backends)`` makes its entries live."""
        entry = self.load_cache_entry(key)
        package = CompilePackage(fn, entry.dynamo)
        package._store_key = key
        return package, entry.backends


class InMemoryDynamoStore(DynamoStore):
    """Packages kept in this process's memory."""

    def __init__(self) -> None:
        self.packages: dict[str, PrecompileCacheEntry] = {}

    def clear(self) -> None:
        self.packages.clear()

    def write(self, cache_entry: PrecompileCacheEntry, path: str) -> None:
        self.packages[path] = cache_entry

    def read(self, path: str) -> PrecompileCacheEntry:
        if path not in self.packages:
            raise RuntimeError(f"No package found with key {path}")
        return self.packages[path]


class DiskDynamoStore(DynamoStore):
    """Packages kept as package directories under a path prefix (or at the
    path given, when the prefix is empty); local paths and fsspec URLs."""

    def __init__(self, path_prefix: str = "") -> None:
        self._path_prefix = path_prefix

    def path_prefix(self) -> str:
        return self._path_prefix

    def _where(self, path: str) -> str:
        return os.path.join(self.path_prefix(), path) if self.path_prefix() else path

    def clear(self) -> None:
        if self.path_prefix():
            shutil.rmtree(self.path_prefix(), ignore_errors=True)

    def write(self, cache_entry: PrecompileCacheEntry, path: str) -> None:
        from . import package_storage

        where = self._where(path)
        try:
            files, manifest = cache_entry.files_and_manifest()
            if package_storage.is_remote(where):
                package_storage.save_to_url(where, lambda local: _write_atomically(local, files, manifest))
            else:
                _write_atomically(package_storage.local_path(where), files, manifest)
        except Exception as e:
            raise RuntimeError(f"Failed to save package to {where}: {e}") from e

    def read(self, path: str) -> PrecompileCacheEntry:
        from . import package_storage

        where = self._where(path)
        if package_storage.is_remote(where):
            with package_storage.fetched_package(where, check_manifest) as fetched:
                package = read_package(fetched, check_manifest)
        else:
            local = package_storage.local_path(where)
            package = package_storage.read_consistently(local, lambda p: read_package(p, check_manifest))
        manifest = check_manifest_schema(package.manifest, where)
        check_files(package.files, manifest, where)
        return PrecompileCacheEntry.from_files(package.files, manifest, where)


class DiskDynamoCache(DiskDynamoStore):
    """The Dynamo cache: packages keyed by their function (source_id_from_fn)."""

    def save(self, package: CompilePackage) -> None:
        self.save_package(package, package.source_id)

    def load(self, fn) -> Optional[PrecompileCacheEntry]:
        key = source_id_from_fn(fn)
        try:
            entry = self.load_cache_entry(key)
        except Exception as e:
            from torch._dynamo.utils import counters

            counters["dynamo_cache"]["dynamo_cache_miss"] += 1
            log.info("no Dynamo cache entry for %s: %s", fn, e)
            return None
        from torch._dynamo.utils import counters

        counters["dynamo_cache"]["dynamo_cache_hit"] += 1
        return entry

    def load_and_install_package(self, fn) -> Optional[CompilePackage]:
        entry = self.load(fn)
        if entry is None:
            return None
        package = CompilePackage(fn, entry.dynamo)
        package.install(entry.backends)
        return package

    def path_prefix(self) -> str:
        return self._path_prefix or os.path.join(cache_dir(), "dynamo")


def cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache_dir

    return inductor_cache_dir()


# The Dynamo cache (caching_precompile); its prefix follows the inductor cache dir.
DynamoCache = DiskDynamoCache()
