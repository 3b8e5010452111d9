"""Recording what Dynamo compiles under a compile package.

The compile side of torch/_dynamo/package.py: the backend wrapper that records
each compiled graph (:class:`RecordingBackend`, with what AOTAutograd and
freezing produced for it), the entry a compiled frame adds (its globals, its
sources, the resume functions and module aliases of NOTE: [One recording
path]), frames Dynamo decided not to compile, which entries a fresh process can
find the code of, DDPOptimizer's split graphs, and the entries of other packages
that a package's model runs (NOTE: [Entries a package's model uses]). The
functions here take the :class:`~torch._dynamo.package.CompilePackage` they
record into; package.py re-exports the names other modules use.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
import os
import pickle
import types
import warnings
import weakref
from typing import Any, Callable, Optional, TYPE_CHECKING

import torch
from torch._dynamo.aot_compile_types import SerializableCallable
from torch._dynamo.exc import PackageError

from .package_artifacts import (
    _aot_config_fields,
    _CUSTOM_BACKEND,
    _FrozenCapture,
    _GraphRecord,
    _module_path,
    dump_code,
    load_code,
    random_calls_as_data,
)
from .package_entries import (
    _all_names,
    _describe_key,
    _Entry,
    _inline_wrapper_code,
    _is_resume_code,
    _nested_codes,
    _resolve_code,
    SKIP_CODE,
)
from .package_sources import code_fingerprint, config_records, frame_code_record
from .package_trust import prepare_signing_key


if TYPE_CHECKING:
    from .package import CompilePackage


# The package's logger: what its recording logs is the package's, as it was
# before this module was split out of torch/_dynamo/package.py.
log = logging.getLogger("torch._dynamo.package")


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


def exclude(package: CompilePackage, code, reason: str) -> None:
    """The entry of ``code`` stays out of ``package``, for ``reason``."""
    leave_out(
        package,
        f"torch.compile package: the entry for {code.co_qualname} "
        f"({code.co_filename}:{code.co_firstlineno}) is not saved: {reason}",
    )


def leave_out(package: CompilePackage, message: str) -> None:
    """An entry stays out of the package: a warning, or with
    strict precompile (:func:`strict_precompile`) an error."""
    if strict_precompile():
        raise PackageError(message)
    package._unsaveable.append(message)
    warnings.warn(message, stacklevel=3)


@contextlib.contextmanager
def _entry_recording(package, code: types.CodeType):
    """The recording of ``code``'s entry: the current one when Dynamo
    compiles ``code`` within code_context(code), else a new one."""
    if package._current_entry is not None and package._current_entry.code is code:
        yield package._current_entry
        return
    with package.code_context(code):
        yield package._current_entry


def record_compile(package, code, out_code, guards_state, f_globals) -> None:
    """Called by Dynamo once a frame compiled under this package."""
    if guards_state is None:
        return
    key = package._key_for(code, f_globals)
    try:
        with _entry_recording(package, code) as recording:
            global_refs = classify_globals(package, out_code, f_globals)
            global_refs.update(recording.global_refs(f_globals.get("__name__")))
        global_refs = dict(sorted(global_refs.items()))
        # See NOTE: [Constants of compiled bytecode]
        saved_code = dump_code(out_code)
        sources = entry_sources(package, key, code)
    except PackageError as e:
        exclude(package, code, str(e))
        return
    except Exception as e:
        # See NOTE: [A save never loses what it could save]
        log.debug("recording the entry of %s failed", code.co_qualname, exc_info=True)
        exclude(package, code, f"recording it raised {type(e).__name__}: {e}"[:800])
        return
    package.entries.append(
        _Entry(
            code_key=key,
            out_code=saved_code,
            guards_state=guards_state,
            global_module=f_globals.get("__name__"),
            globals=global_refs,
            sources=sources,
        )
    )


def entry_sources(package, key: tuple, code: types.CodeType) -> tuple:
    """The records of what an entry compiled now for ``code`` is derived from."""
    records = []
    if key[0] == "function":
        records.append(frame_code_record(code, key[1]))
    records.extend(sorted(set((package._frame_sources or {}).values())))
    records.extend(config_records(package.backend.kind if package.backend else None))
    return tuple(records)


def classify_globals(package, out_code, f_globals) -> dict:
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
            record = package.backend.record_for(value) if package.backend else None
            if record is None:
                raise PackageError(f"compiled graph {name} was not recorded")
            artifact = f"{name}_{package._uid}"
            package._graph_records[artifact] = record
            refs[name] = ("graph", artifact)
        elif name.startswith("__resume_at_") and isinstance(value, types.FunctionType):
            package.add_resume_function(value.__code__, f_globals.get("__name__"), name)
        elif isinstance(value, types.ModuleType):
            package.add_import_source(name, value.__name__)
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


def guards_refused(package, code, error: PackageError) -> None:
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
    exclude(package, code, reason)


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
def record_skip(package, frame, frame_action: str = SKIP_CODE) -> None:
    """Called after Dynamo decided not to compile ``frame``'s code
    (``frame_action`` SKIP_CODE) or hit its recompile limit (RUN_ONLY_CODE)."""
    from torch._dynamo import trace_rules
    from torch._dynamo.convert_frame import has_tensor_in_frame, output_codes

    code = frame.f_code
    if code in output_codes or trace_rules.check(code) or not has_tensor_in_frame(frame):
        return
    key = package._key_for(code, frame.f_globals)
    if any(skip.code_key == key for skip in package.skipped):
        return
    package.skipped.append(
        _Entry(
            code_key=key,
            out_code=b"",
            guards_state=b"",
            global_module=frame.f_globals.get("__name__"),
            globals={},
            frame_action=frame_action,
        )
    )


def keep_resolvable(package, entries: list[_Entry]) -> list[_Entry]:
    """The entries a fresh process can find the code of; the others are left
    out with a warning naming them (NOTE: [Keys of package entries])."""
    kept, reasons = resolvable(package, entries)
    for reason in reasons:
        leave_out(package, reason)
    return kept

def resolvable(package, entries: list[_Entry]) -> tuple[list[_Entry], list[str]]:
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
            reason = _unresolvable_reason(package, entry, carried)
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

def _unresolvable_reason(package, entry: _Entry, carried: set[str]) -> Optional[str]:
    if id(entry) in package._entries_from_packages:
        return None
    key = entry.code_key
    if key[0] == "resume":
        if key[2] in carried:
            return None
        return "no saved entry calls this resume function (its caller's entry is not saved)"
    if key[0] == "inline_wrapper":
        if package._inline_wrapped_class() == tuple(key[1:]):
            return None
        return (
            f"it was compiled through Dynamo's inline wrapper for a {key[1]}.{key[2]}, "
            f"not for this package's {type(package._fn).__qualname__}"
        )
    if _resolve_code(key, package._root_codes()) is not None:
        return None
    return (
        f"{key[2]} is neither the compiled callable nor reachable by name from "
        f"module {key[1]} (define it at module level)"
    )


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
        # torch.compile()'d callable (the package's mark is a hook of its own;
        # see NOTE: [Entries a package's model uses]).
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


def entry_origin(package, entry: _Entry) -> Optional[_EntryOrigin]:
    """What another package needs to hold ``entry`` too; None for an entry
    no other model may share (a frozen graph holds this model's weights) and
    for a frame decision."""
    if entry.frame_action or not entry.out_code:
        # A frame decision is not shared (NOTE: [Entries a package's model uses]).
        return None
    artifacts = [ref[1] for ref in entry.globals.values() if ref[0] == "graph"]
    records = {a: package._graph_records[a] for a in artifacts if a in package._graph_records}
    from_package = id(entry) in package._entries_from_packages
    if any(r.frozen is not None or r.frozen_under_no_grad for r in records.values()) or (
        from_package and package._loaded_frozen
    ):
        return None
    return _EntryOrigin(
        owner_uid=package._uid,
        entry=entry,
        graph_records=records,
        graph_blobs={a: package._loaded_graph_blobs[a] for a in artifacts if a in package._loaded_graph_blobs},
        kernels=package._loaded_kernels if from_package else {},
        devices=set(package._loaded_devices) if from_package else set(),
        frozen=False,
        from_package=from_package,
        sources=package.source_info.inlined_sources,
        cache_key=getattr(package.backend, "_torchdynamo_orig_callable", None),
    )


def adopt_shared_entries(package) -> None:
    """Take the entries of other packages that the C cache gives this
    package's model, from the live caches of the codes it runs (NOTE:
    [Entries a package's model uses])."""
    cache_key = getattr(package.backend, "_torchdynamo_orig_callable", None)
    if not (package._runs_a_model and package._adopts_entries) or cache_key is None:
        return
    try:
        shared = _shared_entries(package, cache_key)
    except Exception as e:
        # See NOTE: [A save never loses what it could save]
        log.debug("finding the entries package %s shares failed", package.path, exc_info=True)
        leave_out(
            package,
            f"torch.compile package {package.path}: entries of other packages that its model "
            f"may run are not saved: finding them raised {type(e).__name__}: {e}"[:800]
        )
        return
    held = {id(entry) for entry in package.entries}
    candidates: dict[int, _EntryOrigin] = {}
    for origin in shared:
        if id(origin.entry) not in held and id(origin.entry) not in package._adopted:
            candidates.setdefault(id(origin.entry), origin)
    if not candidates:
        return
    # An entry read from a package was checked when it was first saved.
    package._entries_from_packages |= {key for key, origin in candidates.items() if origin.from_package}
    candidate_entries = [origin.entry for origin in candidates.values()]
    kept, _ = resolvable(package, package.entries + candidate_entries + package.skipped)
    kept_ids = {id(entry) for entry in kept}
    for key, origin in candidates.items():
        if key in kept_ids:
            _adopt(package, origin)
        else:
            # Its code cannot be found in a fresh process; the model may
            # never have run it: not taken, and nothing warned.
            log.debug(
                "package %s does not take the entry of %s: a fresh process could not find its code",
                package.path,
                _describe_key(origin.entry.code_key),
            )


def _shared_entries(package, cache_key) -> list[_EntryOrigin]:
    """The noted entries of other packages, in the live caches of the codes
    this package's model runs, that the C cache gives its model."""
    codes_by_owner: dict[str, set[types.CodeType]] = {}
    for origin, code in list(_entry_origins.values()):
        codes_by_owner.setdefault(origin.owner_uid, set()).add(code)
    codes = set(package._root_codes()) | codes_by_owner.pop(package._uid, set())
    if package._inline_wrapped_class() is not None:
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
            if noted_entry is None or noted_entry[0].owner_uid == package._uid:
                continue
            origin = noted_entry[0]
            if origin.cache_key is None or not _same_cache_key(origin.cache_key, cache_key):
                continue
            if not package._entry_matches(origin.entry, code):
                continue
            shared.append(origin)
            # The other model's other frames (resume functions, nested
            # compiled functions) run under this model too.
            pending.extend(codes_by_owner.get(origin.owner_uid, ()))
    return shared


def _adopt(package, origin: _EntryOrigin) -> None:
    """Hold another package's entry too: this package's model runs its code
    (NOTE: [Entries a package's model uses])."""
    entry = origin.entry
    if id(entry) in package._adopted or any(held is entry for held in package.entries):
        return
    package._adopted.add(id(entry))
    package.entries.append(entry)
    package._graph_records.update(origin.graph_records)
    package._loaded_graph_blobs.update(origin.graph_blobs)
    if origin.from_package:
        package._entries_from_packages.add(id(entry))
        package._loaded_kernels.update(origin.kernels)
        package._loaded_devices |= origin.devices
    package.source_info.inlined_sources |= origin.sources
    log.debug("package %s holds entry of %s, which its model runs", package.path, _describe_key(entry.code_key))


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


# NOTE: [Split graph classes keep their module]
# A saved split graph names its class by module and qualname
# (torch._dynamo.package._DDPSplitGraph: package_artifacts records a
# SerializableCallable's class so), and pickles its pieces by class
# (torch._dynamo.package._DDPSplitPiece). Both were defined in
# torch/_dynamo/package.py before this module was split out of it; they keep
# that module, which re-exports them, so that packages read and write the same
# bytes whichever side of the split saved them.
_DDPSplitPiece.__module__ = "torch._dynamo.package"
_DDPSplitGraph.__module__ = "torch._dynamo.package"
