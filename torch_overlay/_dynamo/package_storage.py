"""Where compile packages are stored: local directories and fsspec URLs.

``save_package(prefix=...)`` and ``load_package(prefix=...)`` take a local
directory or any fsspec URL (``file://``, ``memory://``, ``s3://``, ``gs://``,
...). A package in object storage is the same files as a package directory,
one object each under the package's URL. This module moves them between the
two (NOTE: [Packages in object storage]) and makes reading a local package
consistent while another process replaces it (NOTE: [Replacing a package
atomically] in torch/_dynamo/package_artifacts.py).

Provides :func:`is_remote`, :func:`local_path`, :func:`fetched_package`,
:func:`upload_package` and :func:`read_consistently`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, TYPE_CHECKING, TypeVar

from torch._dynamo.exc import PackageError

from .package_format import MANIFEST, SIGNATURE_FILE


if TYPE_CHECKING:
    from collections.abc import Iterator


log = logging.getLogger(__name__)

_T = TypeVar("_T")

# How many times a loader reads a local package again when a save replaced it
# while it was being read.
READ_ATTEMPTS = 10


# NOTE: [Packages in object storage]
# A package at a URL is its directory's files, one object each
# (<url>/manifest.json, <url>/dynamo.bin, <url>/graphs/..., <url>/kernels/...).
# Saving writes the package to a local directory first (the normal, atomic
# save), then uploads every file, the signature after them and the manifest
# last: until the manifest is there, there is no package at the URL, and a
# loader of a package being replaced reads the new manifest only once every
# file it lists is there (an object store replaces each object atomically, but
# not several at once: a loader that read the old manifest before the upload
# and a file after it finds its sha256 wrong, a PackageError, never a mix).
# Loading reads the manifest (and its signature) first and checks it against
# this process, then fetches only the files the manifest lists, each checked
# against its sha256 as it arrives, into a private local directory that the
# normal local loader then reads (signature, confinement and all); the
# directory is deleted afterwards, whatever happened. A missing or damaged
# object is a PackageError naming it, and nothing is left behind.


def is_remote(path: Any) -> bool:
    """Whether ``path`` is a URL other than ``file://`` (fsspec handles it)."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme not in ("", "file") and "/" not in scheme


def local_path(path: Any) -> Path:
    """A local package path: a plain path, or a ``file://`` URL's path."""
    text = os.fspath(path) if isinstance(path, os.PathLike) else str(path)
    text = text.removeprefix("file://")
    return Path(text)


def _filesystem(url: str):
    try:
        import fsspec
    except ImportError as e:
        raise PackageError(f"package {url}: a URL prefix needs fsspec ({e})") from e
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as e:
        raise PackageError(f"package {url}: no fsspec filesystem for this URL: {e}") from e
    return fs, root.rstrip("/")


def _fetch(fs, remote: str, url: str, name: str) -> bytes:
    try:
        return fs.cat_file(remote)
    except FileNotFoundError as e:
        raise PackageError(f"package {url} is missing {name}") from e
    except Exception as e:
        raise PackageError(f"package {url}: {name} cannot be read: {e!r}") from e


def _checked_manifest(raw: bytes, url: str, check_manifest: Callable) -> dict:
    from torch._dynamo.package_trust import check_name

    try:
        manifest = json.loads(raw)
    except ValueError as e:
        raise PackageError(f"package {url}: {MANIFEST} is damaged: {e}") from e
    manifest = check_manifest(manifest, url)
    for name in manifest["files"]:
        check_name(name, url)
    return manifest


@contextlib.contextmanager
def fetched_package(url: str, check_manifest: Callable) -> Iterator[Path]:
    """The package at ``url`` fetched into a private local directory, for the
    time of the ``with`` block (NOTE: [Packages in object storage])."""
    fs, root = _filesystem(url)
    raw_manifest = _fetch(fs, f"{root}/{MANIFEST}", url, MANIFEST)
    manifest = _checked_manifest(raw_manifest, url, check_manifest)
    workdir = Path(tempfile.mkdtemp(prefix="torch_package_fetch_"))
    try:
        local = workdir / "package"
        local.mkdir()
        (local / MANIFEST).write_bytes(raw_manifest)
        if fs.exists(f"{root}/{SIGNATURE_FILE}"):
            signature = _fetch(fs, f"{root}/{SIGNATURE_FILE}", url, SIGNATURE_FILE)
            (local / SIGNATURE_FILE).write_bytes(signature)
        for name, digest in manifest["files"].items():
            data = _fetch(fs, f"{root}/{name}", url, name)
            if hashlib.sha256(data).hexdigest() != digest:
                raise PackageError(
                    f"package {url}: {name} is corrupted or truncated (sha256 does not "
                    "match the manifest)"
                )
            target = local / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        log.info("fetched package %s: %d files", url, len(manifest["files"]))
        yield local
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def upload_package(local: Path, url: str) -> None:
    """Upload the package directory ``local`` to ``url``, the manifest last."""
    fs, root = _filesystem(url)
    names = sorted(
        str(p.relative_to(local)).replace(os.sep, "/")
        for p in local.rglob("*")
        if p.is_file()
    )
    last = [n for n in (SIGNATURE_FILE, MANIFEST) if n in names]
    try:
        for name in [n for n in names if n not in last] + last:
            fs.pipe_file(f"{root}/{name}", (local / name).read_bytes())
    except Exception as e:
        raise PackageError(f"package {url}: upload failed: {e!r}") from e
    log.info("uploaded package %s: %d files", url, len(names))


def save_to_url(url: str, write_local: Callable[[Path], None]) -> None:
    """Save through a private local directory, then upload it to ``url``."""
    workdir = Path(tempfile.mkdtemp(prefix="torch_package_upload_"))
    try:
        local = workdir / "package"
        write_local(local)
        upload_package(local, url)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _pin(path: Path):
    """A descriptor holding ``path``'s directory (its inode is not reused while
    it is open, even once a save deleted it), or None where there is none."""
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return None


def _replaced(pinned, path: Path) -> bool:
    """Whether ``path`` names another directory than the one ``pinned`` holds."""
    try:
        now = os.stat(path)
    except OSError:
        return False
    if pinned is None:
        return True  # there was none, there is one now
    then = os.fstat(pinned)
    return (then.st_dev, then.st_ino) != (now.st_dev, now.st_ino)


def read_consistently(where: Path, read: Callable[[Path], _T]) -> _T:
    """``read(where)``, read again if a save replaced the directory meanwhile.

    Loaders take no lock and write nothing. A save swaps a complete new
    directory in under the package's name and deletes the old one, so a
    loader whose read overlapped a swap may have read files of both packages,
    or found the old one's files gone: the sha256 and file checks refuse that
    (a PackageError), and the directory the loader started on, held open
    meanwhile, tells a swap from damage, so the whole read starts again on the
    new package."""
    for attempt in range(1, READ_ATTEMPTS + 1):
        pinned = _pin(where)
        try:
            return read(where)
        except PackageError:
            if attempt == READ_ATTEMPTS or not _replaced(pinned, where):
                raise
            log.info("package %s was replaced while it was read: reading it again", where)
        finally:
            if pinned is not None:
                os.close(pinned)
    raise AssertionError("unreachable")
