"""The compile package directory format, and the stores that keep packages as such.

A package directory holds ``manifest.json`` (every file's sha256, the
environment, the compile options), its signature when one was made,
``dynamo.bin`` (the entries), ``graphs/<artifact>.bin`` and ``kernels/<h>.so``
(NOTE: [Package format] in torch/_dynamo/package_artifacts.py). This module
collects a :class:`~torch._dynamo.package.CompilePackage`'s files, writes and
reads them (local paths and fsspec URLs: torch/_dynamo/package_storage.py),
and checks what it read: the manifest, each file against its hash
(torch/_dynamo/package_trust.py), ``dynamo.bin``'s entries and the files they
name, and each entry's bytecode, guards and globals against the live function
it is installed for. :class:`DiskDynamoStore` and the Dynamo cache
(:data:`DynamoCache`) keep upstream's store API on that format. Split out of
torch/_dynamo/package.py, which serves these names too.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import logging
import os
import pickle
import shutil
import sys
import warnings
from typing import Any, Optional, TYPE_CHECKING

from torch._dynamo.exc import PackageError

from .package import (
    _bypassed_codes,
    CompilePackage,
    _codes_of_entries,
    _DynamoCacheEntry,
    DynamoStore,
    PrecompileCacheEntry,
    SourceInfo,
    source_id_from_fn,
    SystemInfo,
)
from .package_artifacts import (
    _environment,
    _sha256,
    _write_atomically,
    check_manifest,
    guard_filter_manifest_fields,
    load_code,
    overlay_series_hash,
    random_values_function,
    serialize_graph,
)
from .package_entries import (
    _CODE_KEY_KINDS,
    _describe_key,
    _Entry,
    _inline_wrapper_code,
    _is_resume_code,
    _modules_named_by_live_function,
    _resolve_code,
    RUN_ONLY_CODE,
    SKIP_CODE,
)
from .package_format import (
    DYNAMO_FILE as _DYNAMO_FILE,
    graph_file,
    graph_name,
    kernel_file,
    PACKAGE_FORMAT_VERSION,
    SIGNATURE_FILE,
)
from .package_recording import (
    _refused_option,
    adopt_shared_entries,
    keep_resolvable,
    leave_out,
    strict_precompile,
)
from .package_sources import check_source_records, LiveSources
from .package_trust import (
    check_files,
    check_manifest_schema,
    manifest_bytes,
    read_package,
    sign_manifest,
)


if TYPE_CHECKING:
    import types


# The package's logger: what its store logs is the package's, as it was
# before this module was split out of torch/_dynamo/package.py.
log = logging.getLogger("torch._dynamo.package")


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


# NOTE: [A save never loses what it could save]
# A save writes every entry it can. An error while recording one entry
# (its bytecode, globals or sources) or serializing one graph (pickling an
# AOTAutograd cache entry, reading Inductor's output) leaves that entry out
# with a warning naming it and the error, and the rest of the package is
# written; with config.strict_precompile it is a PackageError instead. Only what concerns the whole package (its path,
# signing key, the write itself) fails the save.
def collect_files(package: CompilePackage) -> tuple[dict[str, bytes], dict]:
    """The package's files and manifest, however they are then stored."""
    # See NOTE: [Entries a package's model uses]
    adopt_shared_entries(package)
    graphs_needed: set[str] = set()
    for entry in package.entries:
        graphs_needed |= {ref[1] for ref in entry.globals.values() if ref[0] == "graph"}
    files, kernels, failed = _serialize_graphs(package, graphs_needed)
    kept = keep_resolvable(package, _entries_with_graphs(package, failed) + package.skipped)
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
    manifest = _manifest(package, files, kept, graphs_kept)
    # Signed with config.package_signing_key, the signature file next to the
    # manifest. See NOTE: [Trust model of compile packages].
    signature = sign_manifest(manifest_bytes(manifest))
    if signature is not None:
        files[SIGNATURE_FILE] = signature
    return files, manifest


def _serialize_graphs(package: CompilePackage, graphs_needed: set[str]) -> tuple[dict, dict, dict]:
    """The graph files of ``graphs_needed``, the kernels they (and the packages
    loaded into ``package``) use, and why each graph left out cannot be packaged."""
    files: dict[str, bytes] = {}
    failed: dict[str, str] = {}
    kernels: dict[str, bytes] = dict(package._loaded_kernels)
    for artifact in sorted(graphs_needed):
        if artifact in package._loaded_graph_blobs:
            files[graph_file(artifact)] = package._loaded_graph_blobs[artifact]
            continue
        record = package._graph_records[artifact]
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
    return files, kernels, failed


def _entries_with_graphs(package: CompilePackage, failed: dict[str, str]) -> list[_Entry]:
    """The package's entries whose graphs were all serialized; the others are
    left out with a warning naming why."""
    kept = []
    for entry in package.entries:
        bad = [failed[ref[1]] for ref in entry.globals.values() if ref[0] == "graph" and ref[1] in failed]
        if bad:
            leave_out(
                package,
                f"torch.compile package: an entry of {_describe_key(entry.code_key)} is not "
                f"saved: its graph cannot be packaged: {bad[0]}"
            )
            continue
        kept.append(entry)
    return kept


def _manifest(package: CompilePackage, files: dict[str, bytes], kept: list[_Entry], graphs_kept: set[str]) -> dict:
    """The manifest of a package of ``files``, which holds ``kept``."""
    return {
        "format_version": PACKAGE_FORMAT_VERSION,
        **_environment(),
        "overlay_series_hash": overlay_series_hash(),
        "device": ",".join(
            sorted(
                {d for r in package._graph_records.values() for d in r.devices}
                | set(package._loaded_devices)
            )
        )
        or "cpu",
        "backend": package.backend.kind if package.backend else None,
        # See NOTE: [Compile options in packages]
        "compile_options": {
            k: repr(v) for k, v in sorted((package.backend.options if package.backend else {}).items())
        },
        # Its graphs compute with constants folded from the parameters they
        # were saved with. See NOTE: [Frozen graphs in packages].
        "frozen": package._loaded_frozen
        or any(
            package._graph_records[artifact].frozen_under_no_grad
            for artifact in graphs_kept
            if artifact in package._graph_records
        ),
        "entries": sum(1 for entry in kept if entry.out_code),
        "skipped_frames": sum(1 for entry in kept if not entry.out_code),
        "inlined_sources": package.source_info.as_fields(),
        # The guard filter the entries were compiled with (a preset by name).
        **guard_filter_manifest_fields(package),
        "files": {name: _sha256(data) for name, data in sorted(files.items())},
    }


def write_files(path, files: dict[str, bytes], manifest: dict) -> None:
    """Write a package's files and manifest as the directory ``path`` (a local
    path or an fsspec URL), replacing what was there atomically."""
    from . import package_storage

    if package_storage.is_remote(path):
        # See NOTE: [Packages in object storage]
        package_storage.save_to_url(str(path), lambda local: _write_atomically(local, files, manifest))
    else:
        _write_atomically(package_storage.local_path(path), files, manifest)


def read_files(path) -> tuple[dict[str, bytes], dict, Any]:
    """The files and manifest of the package directory ``path`` (a local path
    or an fsspec URL), read with the configured trust, and where they were read."""
    from . import package_storage

    if package_storage.is_remote(path):
        # See NOTE: [Packages in object storage]
        with package_storage.fetched_package(str(path), check_manifest) as fetched:
            package = read_package(fetched, check_manifest)
        return package.files, package.manifest, path
    where = package_storage.local_path(path)
    # See NOTE: [Replacing a package atomically]
    package = package_storage.read_consistently(
        where, lambda local: read_package(local, check_manifest)
    )
    return package.files, package.manifest, where


def verified_entries(
    files: dict[str, bytes], manifest: dict, path, files_checked: bool = False
) -> tuple[dict, SourceInfo, list[_Entry]]:
    """A package's manifest and files checked (its fields, every file against
    its sha256) unless ``files_checked`` says they were (read_files checks both
    as it reads), the inlined sources it records and its entries, checked to be
    well formed and to name only graphs it holds."""
    if not files_checked:
        manifest = check_manifest_schema(manifest, path)
        check_files(files, manifest, path)
    saved_sources = SourceInfo.from_fields(manifest.get("inlined_sources", []), path)
    entries = _read_entries(files, path)
    _check_package_contents(entries, files, path)
    return manifest, saved_sources, entries


def drop_stale(package, entries: list[_Entry], path) -> list[_Entry]:
    """The entries derived from the code and config this process runs. The
    others are dropped, with one warning naming what changed (a PackageError
    with strict_precompile() or refuse_stale): NOTE: [What an entry was
    derived from]."""
    live = LiveSources(lambda module, qualname: _resolve_code(("function", module, qualname), package._root_codes()))
    kept: list[_Entry] = []
    changes: dict[str, None] = {}
    for entry in entries:
        records = entry.sources
        if package._ignore_inlined_sources:
            records = tuple(r for r in records if r[0] != "inlined")
        changed = live.changes(records, entry.global_module) if entry.out_code else []
        for line in changed:
            changes.setdefault(line, None)
        if not changed:
            kept.append(entry)
    if not changes:
        return kept
    package.stale_entries.extend(changes)
    compiled = sum(1 for entry in entries if entry.out_code)
    message = (
        f"package {path}: {len(entries) - len(kept)} of its {compiled} entries were compiled "
        f"from code or config that differs in this process, and are not loaded: "
        + "; ".join(changes)
    )
    if package.refuse_stale or strict_precompile():
        raise PackageError(message)
    warnings.warn(message + ". The frames they ran will compile.", stacklevel=4)
    return kept


def checked_code(package, entry: _Entry, path) -> dict[str, types.CodeType]:
    """The entry's code objects (its bytecode under "", resume functions by
    global name), each checked to belong to the function it is installed for
    (NOTE: [Bytecode of loaded entries]); its guards state checked too."""
    what = f"package {path}: entry of {_describe_key(entry.code_key)}"
    codes = {"": _unmarshal_code(entry.out_code, what)}
    live = None
    if entry.code_key[0] == "inline_wrapper":
        live = _inline_wrapper_code()
    elif entry.code_key[0] == "function":
        live = _resolve_code(entry.code_key, package._root_codes())
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
    _check_global_refs(entry, what, _modules_named_by_live_function(package._fn))
    return codes


def cache_entry_contents(cache_entry: PrecompileCacheEntry) -> tuple[dict[str, bytes], dict, list[_Entry]]:
    """What ``cache_entry`` holds as a package does: its files but dynamo.bin
    (kernels, and a graph file per backend its entries call), its manifest but
    the files' hashes, and the entries of the codes not bypassed."""
    from torch._dynamo.precompile_context import BackendCacheArtifact

    cache_entry.materialize()
    files = dict(cache_entry.dynamo.files)
    entries, bypassed = [], []
    for code in cache_entry.dynamo.codes:
        graphs = {ref[1] for entry in code.guarded_codes for ref in entry.globals.values() if ref[0] == "graph"}
        missing = sorted(graphs - set(cache_entry.backends))
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
    for backend_id in sorted({ref[1] for e in entries for ref in e.globals.values() if ref[0] == "graph"}):
        artifact = cache_entry.backends[backend_id]
        if not isinstance(artifact, BackendCacheArtifact):
            raise PackageError(f"backend {backend_id} is a {type(artifact).__name__}, not a BackendCacheArtifact")
        files[graph_file(backend_id)] = artifact.package_bytes()
    manifest = dict(cache_entry.dynamo.manifest)
    manifest.update(
        {
            "entries": sum(1 for entry in entries if entry.out_code),
            "skipped_frames": sum(1 for entry in entries if not entry.out_code),
            "bypassed_codes": bypassed,
            "toolkit_version": cache_entry.dynamo.system_info.toolkit_version,
            "gpu_name": cache_entry.dynamo.system_info.gpu_name,
            "inlined_sources": cache_entry.dynamo.source_info.as_fields(),
        }
    )
    return files, manifest, entries


def installable_entries(cache_entry: PrecompileCacheEntry, where) -> tuple[dict[str, bytes], dict, list[_Entry]]:
    """:func:`cache_entry_contents`, checked to hold only files a package
    holds and every graph its entries call: what CompilePackage.install
    installs, with no dynamo.bin written and read back (NOTE: [One check per
    stage of a load])."""
    files, manifest, entries = cache_entry_contents(cache_entry)
    _check_package_contents(entries, files, where)
    return files, manifest, entries


def cache_entry_files(cache_entry: PrecompileCacheEntry) -> tuple[dict[str, bytes], dict]:
    """The package files ``cache_entry`` is written as, and their manifest."""
    files, manifest, entries = cache_entry_contents(cache_entry)
    files[_DYNAMO_FILE] = pickle.dumps([dataclasses.astuple(e) for e in entries], protocol=pickle.HIGHEST_PROTOCOL)
    manifest["files"] = {name: _sha256(data) for name, data in sorted(files.items())}
    signature = sign_manifest(manifest_bytes(manifest))
    if signature is not None:
        files[SIGNATURE_FILE] = signature
    return files, manifest


def cache_entry_from_files(files: dict[str, bytes], manifest: dict, where) -> PrecompileCacheEntry:
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
    return PrecompileCacheEntry(dynamo=entry, backends=backends)


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
        where = self._where(path)
        try:
            files, manifest = cache_entry_files(cache_entry)
            write_files(where, files, manifest)
        except Exception as e:
            raise RuntimeError(f"Failed to save package to {where}: {e}") from e

    def read(self, path: str) -> PrecompileCacheEntry:
        where = self._where(path)
        # read_files checked the manifest and every file's hash.
        files, manifest, _ = read_files(where)
        return cache_entry_from_files(files, manifest, where)


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
