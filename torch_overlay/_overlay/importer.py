"""The import hook that serves patched and mirrored torch modules.

:func:`activate` installs :class:`OverlayFinder` at the front of ``sys.meta_path``.
The finder answers only for an explicit allow-list of module names (the modules the
series patches and the mirrored new modules) and bails out for everything else.
"""

# NOTE: [Serving patched modules under torch's own paths]
# torch locates resources and decides what Dynamo may trace by FILE PATH:
# ``_dynamo/config.py`` derives ``base_dir`` from ``__file__``, trace_rules skips
# files under torch's directory, inductor finds ``codegen/cpp_prefix.h`` next to
# ``codecache.py``. So a patched module keeps the ORIGINAL path as ``__file__`` and
# as the filename of its code objects, and a mirrored new module gets the path it
# will have upstream (``<torch dir>/X/y.py``) even though no such file exists. The
# patched or mirrored text is registered in ``linecache`` under that path (mtime
# None, so ``checkcache`` keeps it) and served by the loader's ``get_source``, so
# tracebacks and ``inspect`` show the lines that actually run.

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import linecache
import logging
import marshal
import os
import re
import sys
import threading
from pathlib import Path

from . import materialize as _materialize
from .errors import (
    ActivationTooLateError,
    AlreadyPatchedTorchError,
    OverlayError,
    TorchNotFoundError,
    UnsupportedTorchVersionError,
)
from .series import (
    base_version,
    patches_dir,
    served_new_modules,
    served_series,
    series_hash,
    supported_bases,
)


log = logging.getLogger(__name__)

_PYC_MAGIC = importlib.util.MAGIC_NUMBER + b"tovl"
_lock = threading.RLock()
_active_finder: OverlayFinder | None = None


def _module_relpath(fullname: str, is_package: bool) -> str:
    parts = fullname.split(".")
    if is_package:
        return "/".join(parts) + "/__init__.py"
    return "/".join(parts) + ".py"


def find_torch() -> tuple[Path, str]:
    """(directory holding ``torch/``, torch version) without importing torch."""
    spec = importlib.machinery.PathFinder.find_spec("torch")
    if spec is None or spec.origin is None:
        raise TorchNotFoundError(
            f"torch_overlay: no torch installation found on sys.path; install "
            f"torch=={base_version()}"
        )
    torch_dir = Path(spec.origin).parent
    version_file = torch_dir / "version.py"
    match = None
    if version_file.exists():
        match = re.search(
            r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", version_file.read_text(), re.MULTILINE
        )
    version = match.group(1) if match else "unknown"
    return torch_dir.parent, version


def check_torch_version(installed: str, location: str, base: str | None = None) -> str:
    """The base whose series serves torch ``installed``: ``base`` when given (any
    other release is refused), else any supported base (NOTE: [Supported bases])."""
    public, _, local = installed.partition("+")
    if local.startswith("overlay"):
        raise AlreadyPatchedTorchError(installed, location)
    if base is not None:
        if public != base:
            raise UnsupportedTorchVersionError(installed, base, location)
        return base
    supported = supported_bases()
    if public not in supported:
        raise UnsupportedTorchVersionError(installed, base_version(), location, supported)
    return public


class _OverlaySourceLoader(importlib.abc.InspectLoader):
    """Executes a module from text that lives somewhere other than its ``__file__``.

    ``origin`` is the path the module claims (see the NOTE above); the text and the
    bytecode cache come from elsewhere.
    """

    def __init__(self, fullname: str, origin: str, is_package: bool) -> None:
        self.name = fullname
        self.origin = origin
        self._is_package = is_package

    # Subclasses provide the source and where its bytecode is cached.
    def _source_bytes(self) -> bytes:
        raise NotImplementedError

    def _pyc_path(self) -> Path | None:
        raise NotImplementedError

    def is_package(self, fullname: str) -> bool:
        return self._is_package

    def get_filename(self, fullname: str | None = None) -> str:
        return self.origin

    def get_source(self, fullname: str) -> str:
        return importlib.util.decode_source(self._source_bytes())

    def get_code(self, fullname: str):
        source = self._source_bytes()
        # NOTE: [Cached overlay bytecode is keyed by source and path]
        # A code object carries the path it was compiled for (co_filename), which
        # Dynamo's skip rules and tracebacks read: torch's own frames are known
        # by their files. One overlay cache may serve torch at more than one path
        # (a venv reached through a symlink, a moved venv, two checkouts sharing
        # TORCH_OVERLAY_CACHE_DIR), so the key is the source AND the path: bytecode
        # compiled for /a/torch/_dynamo/eval_frame.py is never run as the module at
        # /b/torch/_dynamo/eval_frame.py (where Dynamo, not knowing the file for
        # torch's, compiled its own frames).
        digest = _materialize.sha256_bytes(source + b"\0" + self.origin.encode()).encode()
        pyc = self._pyc_path()
        if pyc is not None:
            try:
                data = pyc.read_bytes()
                header = _PYC_MAGIC + digest
                if data.startswith(header):
                    return marshal.loads(data[len(header) :])
            except (OSError, ValueError, EOFError, TypeError):
                pass
        code = compile(source, self.origin, "exec", dont_inherit=True)
        # NOTE: [Overlay bytecode under PYTHONDONTWRITEBYTECODE]
        # The flag keeps Python from writing .pyc files next to sources. The
        # overlay's bytecode lives in its own cache (NOTE: [Overlay cache
        # layout]), which is its installation: as pip compiles a wheel's modules
        # when it installs them, the overlay writes its bytecode there whatever
        # the flag says; otherwise every process under the flag compiled every
        # patched and mirrored module again, a cost on every start that the
        # patched wheel, compiled at install, never pays.
        if pyc is not None:
            try:
                pyc.parent.mkdir(parents=True, exist_ok=True)
                tmp = pyc.with_name(f"{pyc.name}.{os.getpid()}.tmp")
                tmp.write_bytes(_PYC_MAGIC + digest + marshal.dumps(code))
                os.replace(tmp, pyc)
            except OSError:
                log.debug("torch_overlay: could not write %s", pyc, exc_info=True)
        return code

    def exec_module(self, module) -> None:
        code = self.get_code(module.__name__)
        text = self.get_source(module.__name__)
        linecache.cache[self.origin] = (
            len(text),
            None,
            text.splitlines(keepends=True),
            self.origin,
        )
        exec(code, module.__dict__)


class PatchedSourceLoader(_OverlaySourceLoader):
    """Loads a torch module from its materialised patched source."""

    def __init__(self, fullname, origin, is_package, tree, relpath) -> None:
        super().__init__(fullname, origin, is_package)
        self._tree = tree
        self._relpath = relpath

    def _source_bytes(self) -> bytes:
        path = self._tree.patched_path(self._relpath)
        expected = self._tree.files[self._relpath]
        try:
            data = path.read_bytes()
        except OSError:
            data = b""
        if _materialize.sha256_bytes(data) != expected:
            log.warning(
                "torch_overlay: cached %s does not match its manifest; rebuilding "
                "the overlay cache",
                path,
            )
            fresh = _active_rebuild(self._tree)
            self._tree = fresh
            data = fresh.patched_path(self._relpath).read_bytes()
            if _materialize.sha256_bytes(data) != fresh.files[self._relpath]:
                raise OverlayError(f"torch_overlay: rebuilt {path} is still damaged")
        return data

    def _pyc_path(self) -> Path:
        rel = Path(self._relpath)
        tag = sys.implementation.cache_tag
        return self._tree.root / "__pycache__" / f"{'.'.join(rel.with_suffix('').parts)}.{tag}.pyc"


class MirroredSourceLoader(_OverlaySourceLoader):
    """Loads a new torch module from its mirrored file under torch_overlay/."""

    def __init__(self, fullname, origin, is_package, real_path: Path, tree) -> None:
        super().__init__(fullname, origin, is_package)
        self.real_path = real_path
        self._tree = tree

    def _source_bytes(self) -> bytes:
        return self.real_path.read_bytes()

    def _pyc_path(self) -> Path:
        # In the overlay cache, not next to the mirrored file (NOTE: [Overlay
        # bytecode under PYTHONDONTWRITEBYTECODE]); keyed by the source's sha256.
        tag = sys.implementation.cache_tag
        return self._tree.root / "__pycache__" / "mirrored" / f"{self.name}.{tag}.pyc"


def _active_rebuild(tree):
    torch_root, torch_version = find_torch()
    return _materialize.materialize(
        torch_root, torch_version, tree.series_hash, force=True
    )


class OverlayFinder(importlib.abc.MetaPathFinder):
    """Serves the allow-listed torch modules; returns None for every other name."""

    def __init__(self, torch_root: Path, tree, mirrored: dict[str, Path]) -> None:
        self.torch_root = torch_root
        self.tree = tree
        self.mirrored = mirrored
        self.patched: dict[str, tuple[str, bool]] = {}
        for rel in tree.files:
            if not rel.endswith(".py"):
                continue
            parts = rel[: -len(".py")].split("/")
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            self.patched[".".join(parts)] = (rel, is_package)
        self.served = frozenset(self.patched) | frozenset(self.mirrored)
        self.loaded: set[str] = set()
        self._finding = threading.local()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.served:
            return None
        if getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        try:
            return self._make_spec(fullname)
        finally:
            self._finding.active = False

    def _make_spec(self, fullname):
        if fullname in self.patched:
            rel, is_package = self.patched[fullname]
            origin = str(self.torch_root / rel)
            loader = PatchedSourceLoader(fullname, origin, is_package, self.tree, rel)
        elif self.mirrored[fullname].name.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)):
            # Compiled code is not traced by Dynamo whatever its path: load it
            # from where it was built.
            real = self.mirrored[fullname]
            loader = importlib.machinery.ExtensionFileLoader(fullname, str(real))
            self.loaded.add(fullname)
            return importlib.util.spec_from_file_location(fullname, str(real), loader=loader)
        else:
            real = self.mirrored[fullname]
            is_package = real.name == "__init__.py"
            rel = _module_relpath(fullname, is_package)
            origin = str(self.torch_root / rel)
            loader = MirroredSourceLoader(fullname, origin, is_package, real, self.tree)
        spec = importlib.machinery.ModuleSpec(
            fullname, loader, origin=origin, is_package=is_package
        )
        spec.has_location = True
        if is_package:
            spec.submodule_search_locations = [os.path.dirname(origin)]
        self.loaded.add(fullname)
        return spec


def _excepthook_with_linecache(exc_type, exc, tb) -> None:
    """The default hook reads source lines from disk, not from ``linecache``;
    ``traceback`` prints the same report with the lines that actually ran."""
    import traceback

    traceback.print_exception(exc_type, exc, tb)


def is_active() -> bool:
    return _active_finder is not None


def active_finder() -> OverlayFinder | None:
    return _active_finder


def activate() -> OverlayFinder:
    """Serve the patched torch modules from now on. Idempotent.

    Raises :class:`ActivationTooLateError` if a patched module was already imported
    unpatched, and :class:`UnsupportedTorchVersionError` if the installed torch is
    not a supported base (one with a series: NOTE: [Supported bases]).
    """
    global _active_finder
    with _lock:
        if _active_finder is not None:
            return _active_finder
        torch_root, torch_version = find_torch()
        base = check_torch_version(torch_version, str(torch_root / "torch"))
        patches = served_series(patches_dir(base))
        tree = _materialize.materialize(
            torch_root, torch_version, series_hash(base=base), patches=patches
        )
        finder = OverlayFinder(torch_root, tree, served_new_modules(base))
        too_late = [
            name
            for name in finder.served
            if name in sys.modules
            and not isinstance(
                getattr(sys.modules[name], "__loader__", None), _OverlaySourceLoader
            )
        ]
        if too_late:
            raise ActivationTooLateError(too_late)
        sys.meta_path.insert(0, finder)
        _active_finder = finder
        if sys.excepthook is sys.__excepthook__:
            sys.excepthook = _excepthook_with_linecache
        log.debug("torch_overlay: active, serving %d modules", len(finder.served))
        return finder


def deactivate() -> None:
    """Stop serving patched modules (already imported modules stay as they are)."""
    global _active_finder
    with _lock:
        if _active_finder is not None:
            try:
                sys.meta_path.remove(_active_finder)
            except ValueError:
                pass
            _active_finder = None
            if sys.excepthook is _excepthook_with_linecache:
                sys.excepthook = sys.__excepthook__
