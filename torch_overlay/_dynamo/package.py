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
:func:`load_guard_manager`, and upstream's cache entries and stores. Around it:
what an entry is and how its code is found again (package_entries.py), what a
compile records (package_recording.py), the package directory and the disk
stores (package_store.py, whose names this module serves too), the graphs'
artifacts (package_artifacts.py, NOTE: [Package format]).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib
import inspect
import logging
import os
import sys
import threading
import time
import types
import warnings
import weakref
from typing import Any, Callable, Optional

import torch
from torch._dynamo.exc import PackageError

from .package_artifacts import (
    _GraphRecord,
    _KernelRedirect,
    _sha256,
    check_frozen_parameters,
    deserialize_graph,
    folded_parameters,
    graph_for_bytecode,
    random_values_function,
)
from .package_artifacts import SerializedCode  # noqa: F401 (upstream's name)
from .package_entries import (  # noqa: F401 (upstream's names, re-exported)
    _bypassed_codes,
    _codes_of_entries,
    _compiled_module,
    _DynamoCodeCacheEntry,
    _live_function_globals,
    _modules_named_by_live_function,
    _CODE_KEY_KINDS,
    _code_key,
    _compiled_through_inline_wrapper,
    _describe_key,
    _Entry,
    _inline_wrapper_code,
    _is_resume_code,
    _LoadedEntry,
    _rename_globals,
    _resolve_code,
    InlinedSource,
    RUN_ONLY_CODE,
    SKIP_CODE,
    SourceInfo,
    SystemInfo,
)
from . import package_recording
from .package_recording import (  # noqa: F401 (backend_kind, compile_options, _DDPSplit*: re-exported)
    _compile_ddp_split,
    _DDPSplitGraph,
    _EntryRecording,
    _DDPSplitPiece,
    _note_origin,
    _refused_option,
    _with_frozen_parameter_filter,
    adopt_shared_entries,
    backend_kind,
    strict_precompile,
    compile_options,
    entry_origin,
    keep_resolvable,
    RecordingBackend,
    resolvable,
)
from .package_format import (
    DYNAMO_FILE as _DYNAMO_FILE,
    graph_name,
    kernel_file,
    SIGNATURE_FILE,
)
from .package_format import PACKAGE_FORMAT_VERSION  # noqa: F401 (the module docstring's)
from .package_sources import (
    code_fingerprint,
    inlined_code_record,
)
from .package_trust import (
    extract_kernels,
    remove_kernel_copies,
    remove_kernel_copies_with,
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


_NOT_YET = object()


class CompilePackage:
    """The compiled entries of one ``torch.compile()``; see the module docstring."""

    def __init__(
        self,
        fn,
        dynamo: Optional[_DynamoCacheEntry] = None,
        ignore_inlined_sources: bool = False,
        *,
        path: Optional[str] = None,
        adopts_entries: bool = True,
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
        self._backend_ids: dict[str, list[str]] = {}
        self._cached_backends: dict[str, Any] = {}
        # Backend ids cache_entry() has recorded in the PrecompileContext, each
        # once (NOTE: [Recording a package's cache entry]).
        self._recorded_backend_ids: set[str] = set()
        self.backend: Optional[RecordingBackend] = None
        self.entries: list[_Entry] = []
        self._graph_records: dict[str, _GraphRecord] = {}
        self._unsaveable: list[str] = []
        # Entries of other packages this package's model ran (NOTE: [Entries
        # a package's model uses]), by id.
        self._adopted: set[int] = set()
        # A save takes the entries of other packages the model ran only where
        # torch.compile(..., package=self) runs a model (runs_under) and
        # adopts_entries is on (aot_compile's is off: it compiles a copy).
        self._runs_a_model = False
        self._adopts_entries = adopts_entries
        # Frames Dynamo decided not to compile (NOTE: [Frames Dynamo skips]):
        # entries with no bytecode and no guards.
        self.skipped: list[_Entry] = []
        self._inline_wrapped: Any = _NOT_YET
        self._uid = _sha256(os.urandom(16))[:10]
        self._init_load_state()
        if dynamo is not None:
            self.initialize(fn, dynamo, ignore_inlined_sources)

    def _init_load_state(self) -> None:
        """What loads add to the package (its own, or installed from a store)."""
        # What changed for the entries a load dropped (NOTE: [What an entry was
        # derived from]); refuse_stale makes such a load a PackageError.
        self.stale_entries: list[str] = []
        self.refuse_stale = False
        self._pending: Optional[_DynamoCacheEntry] = None
        self._store_key: Optional[str] = None
        # Entries read from a package: checked when they were first saved.
        self._entries_from_packages: set[int] = set()
        self._loaded_skips: list[_Entry] = []
        # The live codes a loaded skip records at their recompile limit, as
        # lookups meet them (NOTE: [Frames called under a code at its recompile limit]).
        self._run_only_codes: set[types.CodeType] = set()
        # None: a frozen graph is checked at load against the module the package
        # belongs to. A list: the load has no module (aot_compile, where it is
        # the first argument of each call), and (graph, name) of each frozen
        # graph is kept here for the caller to check (NOTE: [Parameters of frozen
        # packages]).
        self.frozen_checks_at_call: Optional[list[tuple[Any, str]]] = None
        self._loaded: list[_LoadedEntry] = []
        self._loaded_graph_blobs: dict[str, bytes] = {}
        self._loaded_kernels: dict[str, bytes] = {}
        self._loaded_devices: set[str] = set()
        self._loaded_frozen = False
        self.load_stats: dict[str, float] = {}  # the last load's counts and seconds

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
        assert self._current_entry is not None, "_current_entry is not set in add_import_source"
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

    def bypass_current_entry(self) -> None:
        """Leave the current code's entries out of the package."""
        package_recording.exclude(self, self._code_being_compiled(), "its compile bypassed the package")

    def validate(self) -> None:
        """RuntimeError unless every entry a save would keep can be found again
        in a fresh process (resume functions with their callers, functions by name)."""
        _, reasons = resolvable(self, self.entries + self.skipped)
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
        started, where = time.perf_counter(), self._store_key or "<cache entry>"
        files, manifest, entries = _store().installable_entries(PrecompileCacheEntry(self._pending, dict(backends)), where)
        _install_entries(self, files, manifest, self._pending.source_info, entries, where, started)
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
        self._run_only_codes.clear()

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
        fn = type(self._fn).forward if isinstance(self._fn, torch.nn.Module) else self._fn
        code = getattr(getattr(fn, "__func__", fn), "__code__", None)
        return [code] if code is not None else []

    def _inline_wrapped_class(self) -> Optional[tuple[str, str]]:
        """(module, qualname) of the root module's class when torch.compile runs
        it through Dynamo's inline wrapper; see NOTE: [Keys of package entries]."""
        module = self._fn
        if not isinstance(module, torch.nn.Module):
            return None
        if self._inline_wrapped is _NOT_YET:
            cls = type(module)
            wrapped = _compiled_through_inline_wrapper(module)
            self._inline_wrapped = (cls.__module__, cls.__qualname__) if wrapped else None
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
            return len(key) == 3 and _is_resume_code(code) and code_fingerprint(code) == key[2]
        if key[0] == "inline_wrapper":
            return code is _inline_wrapper_code() and self._inline_wrapped_class() == tuple(key[1:])
        return _resolve_code(key, self._root_codes()) is code

    def record_compile(self, code, out_code, guards_state, f_globals) -> None:
        """Called by Dynamo once a frame compiled under this package."""
        package_recording.record_compile(self, code, out_code, guards_state, f_globals)

    def record_skip(self, frame, frame_action: str = SKIP_CODE) -> None:
        """Called after Dynamo decided not to compile ``frame``'s code
        (``frame_action`` SKIP_CODE) or hit its recompile limit (RUN_ONLY_CODE):
        NOTE: [Frames Dynamo skips]."""
        package_recording.record_skip(self, frame, frame_action)

    def guards_refused(self, code, error: PackageError) -> None:
        package_recording.guards_refused(self, code, error)

    # -- save and load -------------------------------------------------------
    def save(self, path: Optional[str] = None) -> str:
        """Write the package as a directory (see NOTE: [Package format]); what
        cannot be saved is left out (NOTE: [A save never loses what it could save])."""
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
        _store().write_files(path, files, manifest)
        log.info("saved %d entries to %s", manifest["entries"], path)
        return str(path)

    def collect_files(self) -> tuple[dict[str, bytes], dict]:
        """The package's files and manifest, however they are then stored."""
        return _store().collect_files(self)

    def load(self, path: Optional[str] = None) -> list[_LoadedEntry]:
        """Read a package directory; its entries are then looked up on calls.

        The package is read with the configured trust (NOTE: [Trust model of
        compile packages]): its manifest's signature is verified before any
        other file is opened, and every file is read confined to the package
        and checked against the manifest's sha256 (the garbage collector is
        left as it is: NOTE: [Loads leave the garbage collector alone])."""
        given = path or self.path
        if given is None:
            raise PackageError("no package path: pass torch.compile(..., package=path)")
        files, manifest, where = _store().read_files(given)
        loaded = self.load_files(files, manifest, where, files_checked=True)
        # See NOTE: [Frames of loaded packages]
        _count_loaded_frames(int(self.load_stats["codes"]))
        return loaded

    def load_files(self, files, manifest, path, *, files_checked: bool = False):
        """Install entries from a package's verified files (directory or archive).

        Everything is checked before anything is installed: the manifest's
        fields, every file against its sha256 (unless ``files_checked``: the store
        read them so, NOTE: [One check per stage of a load]), the entries' structure, the
        graphs and kernels they name, their bytecode and guards against the
        live function; a failed load leaves nothing behind (no temp files).
        The garbage collector is left as it is (NOTE: [Loads leave the
        garbage collector alone])."""
        started = time.perf_counter()
        manifest, saved_sources, entries = _store().verified_entries(files, manifest, path, files_checked)
        return _install_entries(self, files, manifest, saved_sources, entries, path, started)

    def lookup(self, frame, cache_entry):
        """A saved entry whose guards accept this frame, installed; SKIP_FRAME
        for a code the package records as skipped; else None."""
        if not self._loaded and not self._loaded_skips:
            return None
        from torch._dynamo.convert_frame import input_codes

        code = frame.f_code
        skip = next((skip for skip in self._loaded_skips if self._entry_matches(skip, code)), None)
        if skip is not None and skip.frame_action == RUN_ONLY_CODE:
            self._run_only_codes.add(code)
        rejected = []
        for loaded in list(self._loaded):
            if not self._entry_matches(loaded.entry, code):
                continue
            if loaded.guard_manager is None and not _build_guard_manager(self, loaded, code, cache_entry):
                continue
            if not loaded.guard_manager.check(frame.f_locals):
                rejected.append(loaded)
                continue
            return _installed_hit(self, loaded, code)
        if skip is not None:
            input_codes.add(code)
            return RUN_ONLY_FRAME if skip.frame_action == RUN_ONLY_CODE else SKIP_FRAME
        if self._run_only_codes and _called_under(self._run_only_codes):
            # See NOTE: [Frames called under a code at its recompile limit]
            input_codes.add(code)
            return RUN_ONLY_FRAME
        if rejected:
            _explain_miss(frame, rejected)
        return None

    def explain(self, *args, **kwargs) -> str:
        """What each loaded entry of the compiled callable's own code says
        about a call with ``args`` and ``kwargs``: accepts, or its first failing
        guard (NOTE: [Explaining a loaded miss]). Checks guards only: nothing
        runs, compiles or is installed."""
        return _explain(self, args, kwargs)

# ---------------------------------------------------------------------------
# Installing what a load read, and looking it up
# ---------------------------------------------------------------------------


def _install_entries(package: CompilePackage, files, manifest, saved_sources: SourceInfo, entries: list[_Entry], path, started: float):
    """Install ``entries`` (checked to be well formed) with the package's
    ``files`` (graphs and kernels) and ``manifest``: stale ones dropped, graphs
    decoded, code checked against the live function, then installed. Sets
    ``package.load_stats``; the entries installed."""
    numbers = {id(entry): number for number, entry in enumerate(entries)}
    entries = _store().drop_stale(package, entries, path)
    kernel_dir, kernel_paths = extract_kernels(files, path)
    verified = time.perf_counter()
    graphs, checked = _decode_entries(package, files, entries, kernel_dir, kernel_paths, path)
    unpickled = time.perf_counter()
    _keep_loaded(package, files, manifest, saved_sources, entries, kernel_paths)
    installed = []
    for entry, codes in checked:
        loaded = _install_loaded(package, entry, graphs, codes)
        if loaded is not None:
            loaded.where = f"package {path}, entry {numbers[id(entry)]}"
            installed.append(loaded)
    package.entries.extend(entry for entry, _ in checked)
    finished = time.perf_counter()
    # Seconds per phase of the last load. Guard managers are built on a
    # frame's first lookup and kernel binaries load when a graph first runs.
    package.load_stats = {
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


# NOTE: [One check per stage of a load]
# A load reads, checks, decodes and installs, each once: the store reads
# the files and checks the manifest and every file's hash as it reads
# (package_store.read_files, read_package), so load_files, given files the
# store read (files_checked=True), reads the entries and checks what they name
# without hashing again; the artifacts module decodes the graphs; the
# package installs. load_files checks the hashes itself for files read
# elsewhere. A cache entry a DynamoStore returned is installed from the
# entries it holds (CompilePackage.install, package_store.installable_entries):
# no dynamo.bin is written for it and read back, no manifest hashed or signed.


def _decode_entries(package: CompilePackage, files, entries: list[_Entry], kernel_dir, kernel_paths, path):
    """The graphs ``entries`` call, decoded (torch/_dynamo/package_artifacts.py),
    and each compiled entry with its code objects, checked against the live
    function (package_store.checked_code). The kernels extracted to
    ``kernel_dir`` go with the last graph that may load them, or at once when
    this fails."""
    redirect = _KernelRedirect(kernel_paths)
    try:
        needed = {ref[1] for entry in entries for ref in entry.globals.values() if ref[0] == "graph"}
        graphs = _load_graphs(package, files, redirect, path, needed)
        checked = [(entry, _store().checked_code(package, entry, path)) for entry in entries if entry.out_code]
    except BaseException:
        if kernel_dir is not None:
            remove_kernel_copies(kernel_dir)
        raise
    if kernel_dir is not None:
        # Kernels load when a graph first runs; the copies go with the last
        # graph that may load them, or at exit.
        remove_kernel_copies_with(redirect, kernel_dir)
    return graphs, checked


def _load_graphs(package, files, redirect: _KernelRedirect, path, needed: set[str]) -> dict[str, Any]:
    """The package's graphs the ``needed`` artifacts name; a frozen one is
    checked against the module it is loaded for (NOTE: [Parameters of
    frozen packages])."""
    module = _compiled_module(package._fn)
    graphs = {}
    checks_at_call = package.frozen_checks_at_call
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


def _keep_loaded(package: CompilePackage, files, manifest: dict, saved_sources: SourceInfo, entries: list[_Entry], kernel_paths) -> None:
    """Keep what a load read in ``package``: a save of it holds the loaded
    entries, their graphs and kernels, devices and sources too."""
    package._loaded_devices |= set(manifest.get("device", "cpu").split(","))
    package._loaded_frozen = package._loaded_frozen or bool(manifest.get("frozen"))
    package._loaded_kernels.update({h: files[kernel_file(h)] for h in kernel_paths})
    package._loaded_graph_blobs.update(
        {artifact: data for name, data in files.items() if (artifact := graph_name(name)) is not None}
    )
    package._entries_from_packages |= {id(entry) for entry in entries}
    package.source_info.inlined_sources |= saved_sources.inlined_sources
    skips = [entry for entry in entries if not entry.out_code]
    package.skipped.extend(skips)
    package._loaded_skips.extend(skips)


def _install_loaded(package, entry: _Entry, graphs: dict, codes: dict) -> Optional[_LoadedEntry]:
    allowed = _modules_named_by_live_function(package._fn)
    module = sys.modules.get(entry.global_module)
    if module is None or (allowed is not None and entry.global_module not in allowed):
        # Never imported by name, never run in a module the function does not name.
        warnings.warn(
            f"torch.compile package: entry of {_describe_key(entry.code_key)} skipped: its "
            f"module {entry.global_module[:100]!r} is not one the compiled function's globals name"
            + ("" if module is not None else " (nor imported)")
        )
        return None
    f_globals = _live_function_globals(package._fn).get(entry.global_module, vars(module))
    renames = {}
    for name, ref in entry.globals.items():
        unique = f"{name}_pkg{package._uid}"
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
    package._loaded.append(loaded)
    return loaded


def _build_guard_manager(package: CompilePackage, loaded: _LoadedEntry, code: types.CodeType, cache_entry) -> bool:
    """Build ``loaded``'s guard manager for frames of ``code``; False (the
    entry dropped, with a warning) when its guards cannot be rebuilt here."""
    try:
        loaded.guard_manager = load_guard_manager(loaded.entry.guards_state, code, loaded.f_globals, cache_entry)
    except PackageError as e:
        # Its guards cannot be rebuilt in this process: the entry is
        # dropped and the frame compiles (or fail_on_recompile says so).
        package._loaded.remove(loaded)
        warnings.warn(
            f"compile package entry for {code.co_name} "
            f"({code.co_filename}:{code.co_firstlineno}) cannot be used: {e}",
            stacklevel=3,
        )
        return False
    return True


def _installed_hit(package: CompilePackage, loaded: _LoadedEntry, code: types.CodeType):
    """The cache entry of ``loaded``, whose guards accepted a frame of ``code``."""
    from torch._dynamo.convert_frame import input_codes, orig_code_map, output_codes
    from torch._dynamo.types import GuardedCode
    from torch._guards import CompileId

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
    origin = entry_origin(package, loaded.entry)
    if origin is not None:
        _note_origin(manager, origin, code)
    return GuardedCode(
        loaded.out_code,
        manager,
        CompileId(-1, 0),
        "Torch-Compiled Region: loaded from package",
    )


def _explain(package: CompilePackage, args: tuple, kwargs: dict) -> str:
    """What CompilePackage.explain says (see there)."""
    from torch._dynamo.guards import get_guard_fail_reason_helper
    from torch._guards import CompileId

    fn = package._fn
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
    for loaded in package._loaded:
        what = f"{loaded.where} ({_describe_key(loaded.entry.code_key)})"
        if not package._entry_matches(loaded.entry, code):
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
    lines.extend(f"dropped at load: {change}" for change in package.stale_entries)
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


# NOTE: [Frames called under a code at its recompile limit]
# Once a code hits its recompile limit, Dynamo runs it in run-only mode, and
# every frame called while it runs too (FrameExecStrategy's recursive action,
# on a hit of its cache as on a miss): a callee that no entry accepts runs
# eagerly instead of compiling. Zamba's Mamba layer does this: slow_forward
# reaches the limit (one entry per layer index), and the resume function of
# its data-dependent branch, which specializes on the sequence length, runs
# eagerly at every length the saving process had not compiled. A fresh
# process gets slow_forward's loaded entries through the package's lookup,
# whose hits run with Dynamo's default strategy, so that resume function
# would compile there (an error under fail_on_recompile) where the saving
# process ran it eagerly. So a lookup that finds no entry and no recorded
# decision for a frame answers run-only when the frame was called under a
# code the package records at its recompile limit: the Python stack holds
# that code, or the compiled code of one of its entries (orig_code_map), as
# Dynamo's recursive run-only would have it. The stack is read only on such
# a miss, where the alternative is a compile.
def _called_under(codes: set[types.CodeType]) -> bool:
    """Whether a frame on the Python stack runs one of ``codes`` or a
    compiled entry of one of them."""
    from torch._dynamo.convert_frame import orig_code_map

    frame: Optional[types.FrameType] = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code in codes or orig_code_map.get(code) in codes:
            return True
        frame = frame.f_back
    return False


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
            _store().DynamoCache.record_package(self.package)
        if len(entries) == before + 1:
            # The entry this frame's compile recorded: other packages whose
            # models run its code may take it (NOTE: [Entries a package's model uses]).
            guarded = getattr(result, "guarded_code", result)
            manager = getattr(guarded, "guard_manager", None) or getattr(guarded, "check_fn", None)
            origin = entry_origin(self.package, entries[-1])
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
        collected = _codes_of_entries(_store()._read_entries(files, package.path or "<package>"), package._root_qualnames())
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
def _compile_package_cache_entry(package: CompilePackage) -> _DynamoCacheEntry:
    """``package.cache_entry()``: its codes now, its files when it is written;
    each graph it has not recorded yet is recorded in the PrecompileContext as
    a backend artifact to be filled (NOTE: [Recording a package's cache entry])."""
    from torch._dynamo.eval_frame import innermost_fn
    from torch._dynamo.precompile_context import graph_artifact_type, PrecompileContext

    # See NOTE: [Entries a package's model uses]
    adopt_shared_entries(package)
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


def _store():
    """torch/_dynamo/package_store.py, the package directory format: it builds
    on this module, which imports it when a package is first saved or loaded."""
    from . import package_store

    return package_store


# What torch/_dynamo/package_store.py defines and this module serves too:
# upstream's names (DiskDynamoStore, the Dynamo cache) and those other modules
# import from here.
_STORE_NAMES = frozenset(
    {"DiskDynamoStore", "DiskDynamoCache", "DynamoCache", "cache_dir", "_BuiltinsOnlyUnpickler", "check_bytecode_belongs"}
)


def __getattr__(name: str) -> Any:
    if name in _STORE_NAMES:
        return getattr(_store(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
