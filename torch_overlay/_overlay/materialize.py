"""Materialise the patched torch sources once per (torch version, series hash).

The installed torch's pristine files that the series touches are copied into a
fresh directory, the series is applied there with ``git apply`` one patch at a
time, and the result is renamed into place atomically with a manifest recording
the sha256 of every patched file. Loading verifies each file against the manifest;
a damaged cache is rebuilt, never trusted.
"""

# NOTE: [Overlay cache layout]
# <cache>/torch-<torch version>-<series hash[:16]>/
#     manifest.json            torch version, series hash, files -> sha256
#     torch/_dynamo/guards.py  patched source
#     __pycache__/<module>.<tag>.pyc
# The bytecode cache lives next to the patched sources (not in torch's tree), keyed
# by the sha256 of the source it was compiled from, so a stale or foreign .pyc is
# never executed.

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import OverlayError, PatchApplyError
from .series import Patch, served_series


if TYPE_CHECKING:
    from collections.abc import Iterator


log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def default_cache_root() -> Path:
    override = os.environ.get("TORCH_OVERLAY_CACHE_DIR")
    if override:
        return Path(override)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(xdg) / "torch_overlay"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _git_env(workdir: Path) -> dict[str, str]:
    # git must treat `workdir` as a plain directory even when it sits inside some
    # repository (a checkout under /tmp, the project itself...).
    env = dict(os.environ)
    env["GIT_CEILING_DIRECTORIES"] = str(workdir.parent)
    env.pop("GIT_DIR", None)
    env.pop("GIT_WORK_TREE", None)
    return env


def patch_files(patch: Path) -> list[str]:
    """Files a patch touches, as ``git apply --numstat`` reports them."""
    proc = subprocess.run(
        ["git", "apply", "--numstat", str(patch)],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
        env=_git_env(Path(tempfile.gettempdir())),
    )
    if proc.returncode != 0:
        raise PatchApplyError(patch.name, [], proc.stderr or "not a patch")
    return [line.split("\t", 2)[2] for line in proc.stdout.splitlines() if line]


_GIT_APPLY_FILE = re.compile(r"^error: (?:patch failed: )?([^:\s]+)(?::\d+)?", re.MULTILINE)


def apply_series(tree: Path, patches: list[Patch]) -> None:
    """Apply ``patches`` in order to ``tree`` (rooted where ``torch/`` is)."""
    env = _git_env(tree)
    for patch in patches:
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", str(patch.path.resolve())],
            capture_output=True,
            text=True,
            cwd=tree,
            env=env,
        )
        if proc.returncode != 0:
            files = sorted(
                {m.group(1) for m in _GIT_APPLY_FILE.finditer(proc.stderr)}
                - {"corrupt", "unrecognized"}
            )
            raise PatchApplyError(patch.name, files, proc.stderr)


@dataclasses.dataclass
class MaterializedTree:
    """A validated materialised cache directory."""

    root: Path
    torch_version: str
    series_hash: str
    files: dict[str, str]  # "torch/x/y.py" -> sha256 of the patched source

    def patched_path(self, relpath: str) -> Path:
        return self.root / relpath


def _read_manifest(root: Path, torch_version: str, series_hash: str):
    try:
        data = json.loads((root / MANIFEST).read_text())
        if (
            data["format"] != MANIFEST_FORMAT
            or data["torch_version"] != torch_version
            or data["series_hash"] != series_hash
            or not isinstance(data["files"], dict)
        ):
            return None
        for rel in data["files"]:
            if not (root / rel).is_file():
                return None
        return MaterializedTree(root, torch_version, series_hash, dict(data["files"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def materialize(
    torch_root: Path,
    torch_version: str,
    series_hash: str,
    patches: list[Patch] | None = None,
    cache_root: Path | None = None,
    force: bool = False,
) -> MaterializedTree:
    """Return the materialised tree for this (torch, series), building it if needed.

    ``torch_root`` is the directory holding the installed ``torch/`` package.
    """
    patches = served_series() if patches is None else patches
    cache_root = cache_root or default_cache_root()
    final = cache_root / f"torch-{torch_version}-{series_hash[:16]}"
    if not force:
        tree = _read_manifest(final, torch_version, series_hash)
        if tree is not None:
            return tree

    cache_root.mkdir(parents=True, exist_ok=True)
    with _build_lock(cache_root, final.name):
        if not force:
            # Another process may have built it while this one waited.
            tree = _read_manifest(final, torch_version, series_hash)
            if tree is not None:
                return tree
            if final.exists():
                log.warning("torch_overlay: cache at %s is damaged; rebuilding it", final)
        _build(torch_root, patches, final, torch_version, series_hash)
    tree = _read_manifest(final, torch_version, series_hash)
    if tree is None:
        raise OverlayError(f"torch_overlay: could not materialise patched sources at {final}")
    log.info("torch_overlay: materialised %d patched files at %s", len(tree.files), final)
    return tree


# NOTE: [One process builds a series' cache]
# Processes started together (pytest workers, a serving fleet's replicas on one
# host) may all find a new series' cache missing. Without coordination each
# built its own tree and renamed it over the previous winner's, deleting files
# that a process already serving from that tree had yet to import. A lock file
# per tree (fcntl.flock, released when the holder exits, however it exits)
# lets one process build while the others wait and then read its manifest; a
# valid tree is only replaced when it is damaged or when force=True.
@contextlib.contextmanager
def _build_lock(cache_root: Path, name: str) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock, the rename below stays atomic
        yield
        return
    with open(cache_root / f".{name}.lock", "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def _build(
    torch_root: Path,
    patches: list[Patch],
    final: Path,
    torch_version: str,
    series_hash: str,
) -> None:
    """Apply the series to copies of the files it touches, then move them to ``final``."""
    cache_root = final.parent
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache_root))
    try:
        touched: list[str] = []
        for patch in patches:
            for rel in patch_files(patch.path):
                if rel not in touched:
                    touched.append(rel)
        for rel in touched:
            src = torch_root / rel
            dst = staging / rel
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.exists():
                shutil.copyfile(src, dst)
        apply_series(staging, patches)
        files = {}
        for rel in touched:
            if (staging / rel).exists():
                files[rel] = sha256_bytes((staging / rel).read_bytes())
        manifest = {
            "format": MANIFEST_FORMAT,
            "torch_version": torch_version,
            "series_hash": series_hash,
            "patches": [p.name for p in patches],
            "files": files,
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))
        _replace_dir(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def _replace_dir(staging: Path, final: Path) -> None:
    """Move ``staging`` to ``final`` atomically, discarding any previous ``final``."""
    if final.exists():
        trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=final.parent))
        try:
            os.rename(final, trash / "old")
        except FileNotFoundError:
            pass
        shutil.rmtree(trash, ignore_errors=True)
    try:
        os.rename(staging, final)
    except OSError:
        # Another process won the race; its tree is as good as ours once validated.
        if not final.exists():
            raise
