"""Trust in compile packages: signatures, confinement, restricted unpickling, schema.

A compile package (a directory, or an aot_compile archive) is code: Dynamo
bytecode, graph pickles, generated Python and native CPU kernels, loaded by a
fleet from shared storage. This module decides what of it may be read and how:

* :func:`sign_manifest` / :func:`verify_manifest`: an Ed25519 signature of the
  manifest's bytes (the manifest holds every other file's sha256), made with
  ``config.package_signing_key`` and checked against
  ``config.package_trusted_keys`` before anything else of the package is read;
  ``config.package_require_signature`` refuses unsigned packages.
* :func:`check_name` / :func:`read_confined`: every file name is a plain
  relative path inside the package, read without following symlinks and only
  from regular files (a FIFO, a device or a symlink is refused, never opened
  for reading, so nothing blocks).
* :func:`read_package` / :func:`read_archive_files`: the two containers, read in
  the order above; :func:`extract_kernels` writes verified kernel binaries to a
  private directory, and :func:`check_kernel_binary` checks each ELF header
  before anything dlopens it.
* :class:`GraphUnpickler` / :func:`load_graph_pickle` / :func:`load_inductor_payload`:
  graph artifacts are unpickled with an allow-list of the classes compiled
  graphs are made of.
* :func:`check_manifest_schema`: every manifest field's type and allowed values.
* ``python -m torch._dynamo.package_trust sign|verify|inspect PATH`` (also
  ``python -m torch_overlay package ...``).
"""

# NOTE: [Trust model of compile packages]
# Signed (package_trusted_keys set, package_require_signature on): the manifest's
# bytes are verified against the trusted keys before any other file is opened;
# every file is then read from memory and checked against the sha256 the signed
# manifest lists, kernels are dlopened from a private copy of those verified
# bytes, so what runs is exactly what the key's holder saved. Nothing of an
# unsigned or wrongly signed package is unpickled, unmarshalled or dlopened.
# Unsigned: the same confinement, schema and restricted unpicklers apply (no
# pickle gadget such as os.system runs, no path outside the package is read, no
# module is imported by name, bytecode must belong to the live function), but a
# package is code: whoever can write an unsigned package can change its graph
# code, its bytecode or its kernels, and that code runs. Only a signature
# protects against a writer of the storage.

from __future__ import annotations

import argparse
import base64
import dataclasses
import errno
import functools
import hashlib
import io
import json
import logging
import os
import pickle
import shutil
import stat
import struct
import sys
import tempfile
import weakref
from pathlib import Path
from typing import Any, Optional


try:
    import fcntl
except ImportError:  # not a POSIX system: kernel copies are not locked
    fcntl = None  # type: ignore[assignment]

import torch
from torch._dynamo.exc import PackageError

from .package_format import (
    DYNAMO_FILE,
    GRAPH_PREFIX,
    KERNEL_PREFIX,
    KERNEL_SUFFIX,
    MANIFEST,
    SIGNATURE_FILE,
    SIGNATURE_FORMAT,
)


log = logging.getLogger(__name__)

# A name in a manifest or an archive: at most this many characters and parts.
MAX_NAME_LENGTH = 255
MAX_NAME_PARTS = 4
MAX_MANIFEST_BYTES = 16 << 20
MAX_SIGNATURE_BYTES = 4096
# One file of a package (graphs hold parameters; kernels are shared objects).
MAX_FILE_BYTES = 8 << 30
# Nesting of the manifest's JSON: ours is three deep.
MAX_MANIFEST_DEPTH = 8


class PackageSignatureError(PackageError):
    """A package's signature is missing, malformed, or not from a trusted key."""


# ---------------------------------------------------------------------------
# Names and confined reads
# ---------------------------------------------------------------------------


def check_name(name: Any, where, field: str = "files") -> str:
    """``name`` if it is a plain relative path inside a package, else PackageError."""
    if not isinstance(name, str):
        raise PackageError(f"package {where}: {field} holds a {type(name).__name__} name, not a str")
    shown = repr(name[:80])
    if not name or len(name) > MAX_NAME_LENGTH:
        raise PackageError(f"package {where}: {field} name {shown} is empty or longer than {MAX_NAME_LENGTH}")
    if "\0" in name or "\\" in name or name.startswith("/"):
        raise PackageError(f"package {where}: {field} name {shown} is not a plain relative path")
    parts = name.split("/")
    if len(parts) > MAX_NAME_PARTS or any(p in ("", ".", "..") for p in parts):
        raise PackageError(f"package {where}: {field} name {shown} leaves the package or is not plain")
    if not all(p.isprintable() for p in parts):
        raise PackageError(f"package {where}: {field} name {shown} has unprintable characters")
    return name


def _open_flags() -> int:
    return os.O_RDONLY | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0)


def read_confined(root: Path, name: str, where, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of regular file ``name`` under ``root``, following no symlink
    (in any part of ``name``) and opening no FIFO or device for reading."""
    check_name(name, where)
    parts = name.split("/")
    fds = []
    try:
        dir_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))
        fds.append(dir_fd)
        for part in parts[:-1]:
            dir_fd = os.open(part, _open_flags() | os.O_DIRECTORY, dir_fd=dir_fd)
            fds.append(dir_fd)
        # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat refuses it.
        fd = os.open(parts[-1], _open_flags() | os.O_NONBLOCK, dir_fd=dir_fd)
        fds.append(fd)
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PackageError(f"package {where}: {name} is not a regular file")
        if st.st_size > limit:
            raise PackageError(f"package {where}: {name} is larger than {limit} bytes")
        data = _read_exactly(fd, st.st_size)
    except PackageError:
        raise
    except OSError as e:
        raise PackageError(f"package {where}: {name} cannot be read: {_os_reason(e)}") from e
    finally:
        for fd in reversed(fds):
            os.close(fd)
    if len(data) != st.st_size:
        raise PackageError(f"package {where}: {name} changed size while it was read")
    return data


def _read_exactly(fd: int, size: int) -> bytes:
    chunks, left = [], size
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _os_reason(e: OSError) -> str:
    if e.errno == errno.ELOOP:
        return "it is a symlink (packages are read without following links)"
    if e.errno == errno.ENOTDIR:
        return "a part of its path is not a directory (or is a symlink)"
    if e.errno == errno.ENOENT:
        return "it does not exist"
    return e.strerror or repr(e)


def _exists(root: Path, name: str) -> bool:
    try:
        os.lstat(root / name)
    except OSError:
        return False
    return True


# ---------------------------------------------------------------------------
# Signatures
# ---------------------------------------------------------------------------


def manifest_bytes(manifest: dict) -> bytes:
    """The bytes a manifest is written (and signed) as."""
    return json.dumps(manifest, indent=1, sort_keys=True).encode()


def _ed25519():
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as e:
        raise PackageError(
            "signed compile packages need the 'cryptography' package (pip install cryptography)"
        ) from e
    return ed25519


# NOTE: [Ed25519 through cryptography]
# Signatures are made and checked by the cryptography package, the one Ed25519
# implementation here. It is imported where a signature is made or checked (and
# where a key pair is generated or a key file in another PEM form is read),
# never at module import: loading an unsigned package, or saving without a key,
# does not import it (tested). That import is most of what signing costs a
# process; a signature or a verification is a small fraction of it (the
# figures are in benchmarks/results/package_signing.md). A save pays
# the import while the package's graph compiles (NOTE: [Signing keys are
# prepared before the save]); a signed load pays it once per process.
ED25519_KEY_BYTES = 32
ED25519_SIGNATURE_BYTES = 64


class _Signer:
    """An Ed25519 private key given as raw bytes, made a key object once to sign
    with many times, and its raw public key."""

    def __init__(self, private_raw: bytes) -> None:
        self._key = _ed25519().Ed25519PrivateKey.from_private_bytes(private_raw)
        self.public = self._key.public_key().public_bytes_raw()

    def sign(self, data: bytes) -> bytes:
        return self._key.sign(data)


def _verify(public_raw: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``data`` by ``public_raw``."""
    ed25519 = _ed25519()
    from cryptography.exceptions import InvalidSignature

    try:
        ed25519.Ed25519PublicKey.from_public_bytes(public_raw).verify(signature, data)
    except InvalidSignature:
        return False
    return True


def _read_key_file(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 16)
    except OSError as e:
        raise PackageError(f"{what} key file {path} cannot be read: {e}") from e


# The DER of an Ed25519 key in its usual PEM forms (PKCS#8 private key,
# SubjectPublicKeyInfo public key) is a fixed prefix and the 32 raw key bytes:
# read directly, without importing cryptography's serialization module.
_PKCS8_ED25519_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
_SPKI_ED25519_PREFIX = bytes.fromhex("302a300506032b6570032100")


def _pem_der(data: bytes) -> Optional[bytes]:
    lines = data.strip().splitlines()
    if len(lines) < 3 or not lines[0].startswith(b"-----BEGIN ") or not lines[-1].startswith(b"-----END "):
        return None
    try:
        return base64.b64decode(b"".join(lines[1:-1]), validate=True)
    except ValueError:
        return None


# What each kind of key file holds: the DER prefix of a raw Ed25519 key in it
# (read directly, without cryptography's slower PEM loader), the DER length,
# cryptography's class and loader for anything else, and what to call it.
_KEY_KINDS = {
    "signing": (_PKCS8_ED25519_PREFIX, 48, "Ed25519PrivateKey", "load_pem_private_key", "private"),
    "trusted": (_SPKI_ED25519_PREFIX, 44, "Ed25519PublicKey", "load_pem_public_key", "public"),
}


def _load_key(path: str, kind: str) -> bytes:
    """The raw Ed25519 key in the PEM file ``path`` (``kind``: "signing" or "trusted")."""
    prefix, der_length, class_name, loader_name, described = _KEY_KINDS[kind]
    data = _read_key_file(path, kind)
    der = _pem_der(data)
    if der is not None and len(der) == der_length and der.startswith(prefix):
        return der[-ED25519_KEY_BYTES:]
    key_class = getattr(_ed25519(), class_name)
    from cryptography.hazmat.primitives import serialization

    loader = getattr(serialization, loader_name)
    try:
        key = loader(data, password=None) if kind == "signing" else loader(data)
    except (ValueError, TypeError) as e:
        raise PackageError(f"{kind} key {path} is not a PEM {described} key: {e}") from e
    if not isinstance(key, key_class):
        raise PackageError(f"{kind} key {path} is not an Ed25519 key")
    return key.private_bytes_raw() if kind == "signing" else key.public_bytes_raw()


def load_private_key(path: str) -> bytes:
    """The raw 32 bytes of the Ed25519 private key in PEM file ``path``."""
    return _load_key(path, "signing")


def load_public_key(path: str) -> bytes:
    """The raw 32 bytes of the Ed25519 public key in PEM file ``path``."""
    return _load_key(path, "trusted")


def write_key_pair(private_path, public_path) -> None:
    """A new Ed25519 key pair: the private key (PKCS#8 PEM, written readable by
    its owner only) and its public key (SubjectPublicKeyInfo PEM)."""
    ed25519 = _ed25519()
    from cryptography.hazmat.primitives import serialization

    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(os.fspath(private_path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private_pem)
    Path(public_path).write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def key_fingerprint(public_raw: bytes) -> str:
    """``ed25519:<first 16 hex digits of the raw public key's sha256>``: names a signer."""
    return "ed25519:" + hashlib.sha256(public_raw).hexdigest()[:16]


# NOTE: [Signing keys are prepared before the save]
# Signing a manifest is quick; making the key ready for it takes much more,
# once per process: importing cryptography, then reading and decoding the PEM
# file and making the key object, longer than saving a small package
# (benchmarks/results/package_signing.md). So the signer of a key file is kept (per
# path, re-read when the file's inode, size or mtime changes, so a rotated key is
# used by the next save), and a compile that records a graph for a package
# prepares config.package_signing_key's signer while it compiles (seconds),
# so that save_package() and save_compiled_function() only sign. The private
# key stays in the process, as it would in any process that signs repeatedly;
# a bad key file is still reported by the save that needs it.
@functools.lru_cache(maxsize=8)
def _signer_of(path: str, inode: int, size: int, mtime_ns: int):
    return _Signer(load_private_key(path))


def _signer(key_file: str):
    try:
        stat = os.stat(key_file)
    except OSError as e:
        raise PackageError(f"signing key file {key_file} cannot be read: {e}") from e
    return _signer_of(os.fspath(key_file), stat.st_ino, stat.st_size, stat.st_mtime_ns)


def prepare_signing_key() -> None:
    """Make config.package_signing_key's signer ready now, ahead of the save that
    signs with it (NOTE: [Signing keys are prepared before the save]); a key
    that cannot be used is left for that save to report."""
    key_file = torch._dynamo.config.package_signing_key
    if key_file:
        try:
            _signer(key_file)
        except PackageError:
            pass


def sign_manifest(data: bytes, key_file: Optional[str] = None) -> Optional[bytes]:
    """The signature file for manifest bytes ``data``, with ``key_file`` (default:
    config.package_signing_key); None when no key is configured."""
    key_file = key_file or torch._dynamo.config.package_signing_key
    if not key_file:
        return None
    signer = _signer(key_file)
    signature, public = signer.sign(data), signer.public
    record = {
        "format": SIGNATURE_FORMAT,
        "algorithm": "ed25519",
        "signer": key_fingerprint(public),
        "signature": base64.b64encode(signature).decode(),
    }
    return json.dumps(record, sort_keys=True).encode()


def _parse_signature(signature: bytes, where) -> tuple[str, bytes]:
    try:
        record = json.loads(signature)
        if not isinstance(record, dict) or record.get("format") != SIGNATURE_FORMAT:
            raise ValueError("not a signature record of format 1")
        if record.get("algorithm") != "ed25519" or not isinstance(record.get("signer"), str):
            raise ValueError("not an ed25519 signature")
        raw = base64.b64decode(record["signature"], validate=True)
        if len(raw) != ED25519_SIGNATURE_BYTES:
            raise ValueError(f"{len(raw)} signature bytes, not 64")
    except (ValueError, TypeError, KeyError, RecursionError) as e:
        raise PackageSignatureError(f"package {where}: {SIGNATURE_FILE} is malformed: {e}") from None
    return record["signer"], raw


def verify_manifest(data: bytes, signature: Optional[bytes], where, trusted=None, require=None) -> Optional[str]:
    """Check manifest bytes ``data`` against ``signature`` (the signature file's
    bytes, None if absent); the trusted signer's fingerprint, or None for a
    package accepted unsigned (NOTE: [Trust model of compile packages])."""
    config = torch._dynamo.config
    trusted = config.package_trusted_keys if trusted is None else trusted
    require = config.package_require_signature if require is None else require
    if signature is None:
        if require:
            raise PackageSignatureError(
                f"package {where} is not signed and torch._dynamo.config."
                "package_require_signature is on: nothing of it is loaded"
            )
        return None
    claimed, raw = _parse_signature(signature, where)
    if not trusted:
        if require:
            raise PackageSignatureError(
                f"package {where}: package_require_signature is on but no "
                "package_trusted_keys are configured to verify its signature against"
            )
        log.info("package %s is signed by %s; no trusted keys configured to check it", where, claimed)
        return None
    for key_file in trusted:
        public = load_public_key(key_file)
        if _verify(public, raw, data):
            return key_fingerprint(public)
    raise PackageSignatureError(
        f"package {where}: the signature of {MANIFEST} (signer {claimed[:40]!r}) does not "
        f"verify against any of the {len(trusted)} trusted keys: the manifest was changed "
        "after signing, or it was signed by another key; nothing of it is loaded"
    )


# ---------------------------------------------------------------------------
# The manifest
# ---------------------------------------------------------------------------


# What `device` may name: torch's device types, never looked up by attribute.
DEVICE_TYPES = ("cpu", "meta", "cuda", "xpu", "mps", "mtia", "hpu")
_SHA256_HEX = frozenset("0123456789abcdef")


def parse_manifest(data: bytes, where) -> dict:
    """The manifest's JSON, bounded in size and nesting."""
    if len(data) > MAX_MANIFEST_BYTES:
        raise PackageError(f"package {where}: {MANIFEST} is larger than {MAX_MANIFEST_BYTES} bytes")
    depth = max_depth = 0
    in_string = escaped = False
    for byte in data:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):
            depth += 1
            max_depth = max(max_depth, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    if max_depth > MAX_MANIFEST_DEPTH:
        raise PackageError(f"package {where}: {MANIFEST} nests deeper than {MAX_MANIFEST_DEPTH}")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        raise PackageError(f"package {where}: {MANIFEST} is damaged: {e}") from None


_FIELD_TYPES: dict[str, Any] = {
    "format_version": int,
    "torch_version": str,
    "python_version": str,
    "cpu_capability": (str, type(None)),
    "machine": str,
    "overlay_series_hash": str,
    "device": str,
    "backend": (str, type(None)),
    "compile_options": dict,
    "frozen": bool,
    "entries": int,
    "skipped_frames": int,
    "files": dict,
    "aot_compile": dict,
}


def check_manifest_schema(manifest: Any, where) -> dict:
    """``manifest`` if every field has its type and an allowed value."""
    if not isinstance(manifest, dict):
        raise PackageError(f"package {where}: {MANIFEST} is not a JSON object")
    for field, types_ in _FIELD_TYPES.items():
        if field in manifest and (
            not isinstance(manifest[field], types_) or isinstance(manifest[field], bool) is not (types_ is bool)
        ):
            raise PackageError(
                f"package {where}: {MANIFEST} field {field!r} is a "
                f"{type(manifest[field]).__name__}, not what the format says"
            )
    for field in ("entries", "skipped_frames"):
        if manifest.get(field, 0) < 0:
            raise PackageError(f"package {where}: {MANIFEST} field {field!r} is negative")
    for device in manifest.get("device", "cpu").split(","):
        if device not in DEVICE_TYPES:
            raise PackageError(
                f"package {where}: {MANIFEST} field 'device' names {device[:40]!r}, which is "
                f"not a device type ({', '.join(DEVICE_TYPES)})"
            )
    files = manifest.get("files", {})
    for name, digest in files.items():
        check_name(name, where)
        if name in (MANIFEST, SIGNATURE_FILE):
            raise PackageError(f"package {where}: {MANIFEST} field 'files' lists {name}")
        if not (isinstance(digest, str) and len(digest) == 64 and set(digest) <= _SHA256_HEX):
            raise PackageError(f"package {where}: {MANIFEST} field 'files' has no sha256 for {name}")
    if not all(isinstance(v, str) for v in manifest.get("compile_options", {}).values()):
        raise PackageError(f"package {where}: {MANIFEST} field 'compile_options' holds a non-str value")
    _check_aot_compile_field(manifest.get("aot_compile"), where)
    return manifest


def _check_aot_compile_field(field, where) -> None:
    if field is None:
        return
    code = field.get("code")
    if not (
        isinstance(field.get("module"), str)
        and isinstance(field.get("qualname"), str)
        and (
            code is None
            or (
                isinstance(code, list)
                and len(code) == 3
                and isinstance(code[0], str)
                and isinstance(code[1], int)
                and isinstance(code[2], str)
            )
        )
    ):
        raise PackageError(f"package {where}: {MANIFEST} field 'aot_compile' is malformed")


def device_available(device: str) -> bool:
    """Whether this process has ``device`` (one of :data:`DEVICE_TYPES`)."""
    if device in ("cpu", "meta"):
        return True
    module = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch, "mps", None)}.get(device)
    if module is None:
        module = getattr(torch, device, None) if device in DEVICE_TYPES else None
    is_available = getattr(module, "is_available", None)
    return bool(is_available()) if callable(is_available) else False


# ---------------------------------------------------------------------------
# Containers: a directory, an archive
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class VerifiedPackage:
    """A package's manifest and files, read and checked; nothing unpickled yet."""

    manifest: dict
    files: dict[str, bytes]
    signer: Optional[str]
    manifest_raw: bytes


def check_files(files: dict[str, bytes], manifest: dict, where) -> None:
    """Every file the manifest lists is there with its sha256, and no other."""
    listed = manifest["files"]
    for name, digest in listed.items():
        if name not in files:
            raise PackageError(f"package {where} is missing {name}")
        if hashlib.sha256(files[name]).hexdigest() != digest:
            raise PackageError(f"package {where}: {name} is corrupted (sha256 does not match the manifest)")
    extra = sorted(set(files) - set(listed))
    if extra:
        raise PackageError(f"package {where}: {extra[0][:80]!r} is not listed in {MANIFEST}")


def read_package(path: Path, check_environment=None) -> VerifiedPackage:
    """Read a package directory: manifest and signature (both regular files),
    the signature verified, the manifest checked (``check_environment``), then
    every listed file, confined, checked against its sha256."""
    where = path
    if not _exists(path, MANIFEST):
        raise PackageError(f"{path} is not a torch.compile package (no {MANIFEST})")
    raw = read_confined(path, MANIFEST, where, MAX_MANIFEST_BYTES)
    signature = (
        read_confined(path, SIGNATURE_FILE, where, MAX_SIGNATURE_BYTES)
        if _exists(path, SIGNATURE_FILE)
        else None
    )
    signer = verify_manifest(raw, signature, where)
    manifest = check_manifest_schema(parse_manifest(raw, where), where)
    if check_environment is not None:
        manifest = check_environment(manifest, where)
    files = {name: read_confined(path, name, where) for name in manifest.get("files", {})}
    check_files(files, manifest, where)
    return VerifiedPackage(manifest, files, signer, raw)


def read_archive_files(fileobj, where, check_environment=None) -> VerifiedPackage:
    """An archive's members, read like a directory's files (read_package)."""
    import zipfile

    try:
        with zipfile.ZipFile(fileobj) as archive:
            members = _archive_members(archive, where)
            if MANIFEST not in members:
                raise PackageError(f"{where} is not a torch.compile package (no {MANIFEST})")
            raw = _read_member(archive, members[MANIFEST], MAX_MANIFEST_BYTES, where)
            signature = None
            if SIGNATURE_FILE in members:
                signature = _read_member(archive, members[SIGNATURE_FILE], MAX_SIGNATURE_BYTES, where)
            signer = verify_manifest(raw, signature, where)
            manifest = check_manifest_schema(parse_manifest(raw, where), where)
            if check_environment is not None:
                manifest = check_environment(manifest, where)
            files = {
                name: _read_member(archive, info, MAX_FILE_BYTES, where)
                for name, info in members.items()
                if name not in (MANIFEST, SIGNATURE_FILE)
            }
    except PackageError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError, NotImplementedError) as e:
        raise PackageError(f"{where} is damaged or truncated: {e!r}") from e
    check_files(files, manifest, where)
    return VerifiedPackage(manifest, files, signer, raw)


def _archive_members(archive, where) -> dict:
    import zipfile

    members = {}
    for info in archive.infolist():
        name = check_name(info.filename, where, "archive member")
        if name in members:
            raise PackageError(f"package {where}: archive member {name!r} appears twice")
        if info.is_dir() or stat.S_IFMT(info.external_attr >> 16) not in (0, stat.S_IFREG):
            raise PackageError(f"package {where}: archive member {name!r} is not a regular file")
        if info.compress_type != zipfile.ZIP_STORED:
            raise PackageError(f"package {where}: archive member {name!r} is compressed")
        members[name] = info
    return members


def _read_member(archive, info, limit: int, where) -> bytes:
    if info.file_size > limit:
        raise PackageError(f"package {where}: archive member {info.filename!r} is too large")
    return archive.read(info)


def extract_kernels(files: dict[str, bytes], where) -> tuple[Optional[Path], dict[str, str]]:
    """Write the package's verified kernel binaries to a private directory (so what
    is dlopened is what was verified); (directory, {hash: path}). Each binary's ELF
    header is checked first; a failure leaves no directory behind."""
    kernels = {name: data for name, data in files.items() if name.startswith(KERNEL_PREFIX)}
    if not kernels:
        return None, {}
    paths = {}
    for name, data in kernels.items():
        digest = name[len(KERNEL_PREFIX) :]
        if not (digest.endswith(KERNEL_SUFFIX) and "/" not in digest and len(digest) > len(KERNEL_SUFFIX)):
            raise PackageError(
                f"package {where}: kernel file name {name[:80]!r} is not {KERNEL_PREFIX}<hash>{KERNEL_SUFFIX}"
            )
        check_kernel_binary(data, name, where)
        paths[digest[: -len(KERNEL_SUFFIX)]] = digest
    directory = kernel_copies_dir("torch_package_kernels_")
    try:
        for key, filename in paths.items():
            target = directory / filename
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _open_flags(), 0o500)
            with os.fdopen(fd, "wb") as f:
                f.write(kernels[KERNEL_PREFIX + filename])
            paths[key] = str(target)
    except BaseException:
        remove_kernel_copies(directory)
        raise
    return directory, paths


# NOTE: [Kernel copies are removed at exit]
# A load writes the package's kernel binaries to a private temporary directory
# (dlopen needs files). It is removed when the last graph that may load them is
# collected, or when the process exits (weakref.finalize's exit hook). A
# process that ends without running exit hooks (killed, as a scheduler or
# torchrun stops a job; ended by os._exit, as a forked multiprocessing child
# and some distributed jobs end) leaves its copies behind: the next load on the
# machine removes them. Each directory holds a lock file its process
# keeps locked (flock) while it lives; the kernel takes the lock away when the
# process ends, however it ends, so a directory whose lock can be taken is an
# orphan. A pid would not tell that across pid namespaces (containers sharing
# /tmp), where a live process's pid can be free in another. The lock file is
# locked before it gets its name, so no directory is ever seen unlocked while
# its process lives; a directory without one (being made, or older) is left.
KERNEL_COPY_PREFIXES = ("torch_package_kernels_", "torch_package_ddp_kernels_", "torch_bundled_graph_kernels_")
_OWNER_LOCK = ".owner.lock"
# kernel copies directory -> the descriptor holding its lock
_owner_locks: dict[str, int] = {}
_orphans_removed = False


def kernel_copies_dir(prefix: str) -> Path:
    """A new private temporary directory for a load's kernel copies, locked by
    this process (NOTE: [Kernel copies are removed at exit]); the first one a
    process makes removes the orphans of processes that are gone."""
    global _orphans_removed
    if not _orphans_removed:
        _orphans_removed = True
        remove_orphaned_kernel_copies(Path(tempfile.gettempdir()))
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    if fcntl is not None:
        unnamed = directory / f"{_OWNER_LOCK}.{os.getpid()}"
        fd = os.open(unnamed, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _open_flags(), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.rename(unnamed, directory / _OWNER_LOCK)
        except OSError as e:
            # A file system without flock: the copies are not locked, so no
            # other process removes them, and exit hooks still do.
            log.debug("package: kernel copies in %s are not locked: %s", directory, e)
            os.close(fd)
            unnamed.unlink(missing_ok=True)
        else:
            _owner_locks[str(directory)] = fd
    return directory


def remove_kernel_copies(directory) -> None:
    """Remove a directory kernel_copies_dir made, and release its lock."""
    shutil.rmtree(directory, ignore_errors=True)
    fd = _owner_locks.pop(str(directory), None)
    if fd is not None:
        os.close(fd)


def remove_kernel_copies_with(owner: object, directory) -> None:
    """Remove ``directory`` when ``owner`` is collected, or at exit."""
    weakref.finalize(owner, remove_kernel_copies, str(directory))


def remove_orphaned_kernel_copies(tmp: Path) -> list[str]:
    """Remove the kernel copies in ``tmp`` that no live process holds; their names."""
    if fcntl is None:
        return []
    removed = []
    try:
        names = [n for n in os.listdir(tmp) if n.startswith(KERNEL_COPY_PREFIXES)]
    except OSError:
        return []
    for name in names:
        path = tmp / name
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            fd = os.open(path / _OWNER_LOCK, os.O_RDONLY | _open_flags())
        except OSError:  # not ours, not a directory, or no lock file
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # its process lives
            os.close(fd)
            continue
        shutil.rmtree(path, ignore_errors=True)
        os.close(fd)
        removed.append(name)
    if removed:
        log.info("package: removed %d kernel copies left by processes that are gone", len(removed))
    return removed


# ---------------------------------------------------------------------------
# Kernel binaries
# ---------------------------------------------------------------------------


# ELF e_machine of this host's architecture.
_ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "s390x": 22, "riscv64": 243}


def check_kernel_binary(data: bytes, name: str, where) -> None:
    """Refuse a kernel binary that dlopen would choke on: not an ELF shared object
    for this machine, or shorter than its own program and section headers say
    (a truncated .so is a PackageError here, not a SIGBUS in dlopen)."""
    import platform

    def bad(why: str) -> PackageError:
        return PackageError(f"package {where}: kernel {name} is not a loadable shared object: {why}")

    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise bad("no ELF header")
    if data[4] != 2 or data[5] != (1 if sys.byteorder == "little" else 2) or data[6] != 1:
        raise bad("not a 64-bit ELF of this byte order")
    end = "<" if data[5] == 1 else ">"
    e_type, e_machine = struct.unpack_from(end + "HH", data, 16)
    expected = _ELF_MACHINES.get(platform.machine().lower())
    if e_type != 3 or (expected is not None and e_machine != expected):
        raise bad(f"type {e_type} machine {e_machine}, not a shared object for {platform.machine()}")
    e_phoff, e_shoff = struct.unpack_from(end + "QQ", data, 32)
    e_ehsize, e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from(end + "HHHHH", data, 52)
    if e_phnum == 0 or e_phentsize < 56 or e_phoff + e_phnum * e_phentsize > len(data):
        raise bad("program headers outside the file")
    for i in range(e_phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(end + "IIQQQQ", data, e_phoff + i * e_phentsize)
        if p_offset + p_filesz > len(data):
            raise bad(f"segment {i} (type {p_type}) ends past the end of the file (truncated?)")
    if e_shnum:
        if e_shentsize < 64 or e_shoff + e_shnum * e_shentsize > len(data):
            raise bad("section headers outside the file (truncated?)")
        for i in range(e_shnum):
            sh_type, _, _, sh_offset, sh_size = struct.unpack_from(end + "IQQQQ", data, e_shoff + i * e_shentsize + 4)
            if sh_type != 8 and sh_offset + sh_size > len(data):  # 8: SHT_NOBITS
                raise bad(f"section {i} ends past the end of the file (truncated?)")


# ---------------------------------------------------------------------------
# Graph artifacts
# ---------------------------------------------------------------------------


# NOTE: [Classes of graph artifacts]
# What the pickles of compiled graphs are made of, found by pickling the test
# suite's graphs (eager, aot_eager, Inductor forward/backward, dynamic shapes,
# frozen graphs, tensor subclasses): data classes of AOTAutograd's cache entry
# and runtime wrappers, Inductor's CompiledFxGraph and its boxes, FX graph
# modules (rebuilt from their own generated code: a graph's code is code;
# see NOTE: [Trust model of compile packages]), tensors, dtypes and sympy
# expressions. Functions are allowed by exact name only; classes by module, where
# the module holds nothing but data classes and wrappers. Never allowed: any
# callable that imports, evaluates, opens or loads (torch.load, eval, exec,
# getattr, os.*, subprocess.*, importlib.*, torch.storage._load_from_bytes).
_ALLOWED_FUNCTIONS = {
    ("torch.fx.graph_module", "reduce_graph_module"),
    ("torch._utils", "_rebuild_tensor_v2"),
    ("torch._utils", "_rebuild_parameter"),
    ("torch._utils", "_rebuild_parameter_with_state"),
    ("torch._utils", "_rebuild_tensor"),
    ("torch._utils", "_rebuild_meta_tensor_no_storage"),
    ("torch._utils", "_rebuild_wrapper_subclass"),
    ("torch._utils", "_rebuild_from_type_v2"),
    ("torch._utils", "_rebuild_qtensor"),
    ("torch._tensor", "_rebuild_from_type_v2"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("collections", "Counter"),
    ("collections", "defaultdict"),
    ("collections", "deque"),
    ("copyreg", "_reconstructor"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("builtins", "slice"),
    ("builtins", "range"),
    ("builtins", "complex"),
    ("builtins", "bytearray"),
    ("builtins", "object"),
    ("builtins", "NoneType"),
    ("builtins", "Ellipsis"),
    ("builtins", "NotImplemented"),
    ("builtins", "int"),
    ("builtins", "float"),
    ("builtins", "bool"),
    ("builtins", "str"),
    ("builtins", "tuple"),
    ("builtins", "list"),
    ("builtins", "dict"),
    ("builtins", "bytes"),
    ("builtins", "type"),
    ("functools", "partial"),
    ("torch", "Size"),
    ("torch", "device"),
    ("torch", "Tensor"),
    ("torch", "SymInt"),
    ("torch", "SymFloat"),
    ("torch", "SymBool"),
    ("torch", "Generator"),
    ("torch.nn.parameter", "Parameter"),
    ("torch.storage", "UntypedStorage"),
    ("torch._C", "_VariableFunctionsClass"),
    # DDPOptimizer's split graph (a custom-backend artifact of torch's own).
    ("torch._dynamo.package", "_DDPSplitPiece"),
}
# Modules all of whose classes (types only) may be built from a graph pickle.
_ALLOWED_CLASS_MODULES = (
    "torch._functorch._aot_autograd.",
    "torch._functorch.aot_autograd",
    "torch._inductor.output_code",
    "torch._inductor.utils",
    "torch._inductor.cudagraph_utils",
    "torch._inductor.metrics",
    "torch._inductor.ir",
    "torch._inductor.codecache",
    "torch._subclasses.",
    "torch.utils._ordered_set",
    "torch.utils._sympy.",
    "torch.fx.",
    "torch._guards",
    "torch._ops",
    "torch._higher_order_ops.",
    "torch.testing._internal.two_tensor",
    "torch.nn.modules.",
    "torch.autograd.",
    "torch.types",
    "sympy.",
    "enum",
)
_STORAGE_TYPES = ("Storage",)


# NOTE: [Globals found through another module]
# The C pickler names an object that has no __module__ (a dtype, a layout, a
# memory format) by the first module in sys.modules that reaches it, skipping
# only __main__: under torch.multiprocessing.spawn the user's script is the
# module __mp_main__, imported before torch, so torch.contiguous_format is
# pickled as __mp_main__.torch.contiguous_format (and so it is from any user
# module imported before torch). Such a name is read as the torch name it
# ends in, with torch's rules: only data (dtypes, layouts, memory formats),
# never a callable.
def allowed_global(module: str, name: str):
    """The object a graph pickle may name as ``module.name``, or None."""
    if not (isinstance(module, str) and isinstance(name, str)) or "__" in name:
        return None
    obj: Any
    module = {"__builtin__": "builtins", "copy_reg": "copyreg"}.get(module, module)
    if name.startswith("torch.") and not (module == "torch" or module.startswith("torch.")):
        # See NOTE: [Globals found through another module]
        module, name = "torch", name[len("torch."):]
        obj = getattr(torch, name, None) if "." not in name else None
        return obj if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)) else None
    exact = (module, name) in _ALLOWED_FUNCTIONS
    by_module = module.startswith(_ALLOWED_CLASS_MODULES) or module + "." in _ALLOWED_CLASS_MODULES
    if module in ("torch", "torch._utils") and not exact:
        # dtypes, layouts, memory formats (pickled by name, also as
        # torch._utils.torch.contiguous_format): data, not callables.
        obj = sys.modules[module]
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if isinstance(obj, (torch.dtype, torch.layout, torch.memory_format)) or (
            module == "torch" and name.endswith(_STORAGE_TYPES) and isinstance(obj, type)
        ):
            return obj
        return None
    if not (exact or by_module):
        return None
    owner = sys.modules.get(module)
    if owner is None:
        if not module.startswith(("torch.", "sympy")):
            return None
        try:
            owner = __import__(module, fromlist=["_"])
        except Exception:
            return None
    obj = owner
    for part in name.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    if exact or isinstance(obj, type):
        return obj
    return None


class GraphUnpickler(pickle.Unpickler):
    """Unpickles only what graph artifacts are made of (NOTE: [Classes of graph
    artifacts]); any other global is refused before it is looked up."""

    where: Any = "<graph>"

    def find_class(self, module, name):
        obj = allowed_global(module, name)
        if obj is None:
            raise PackageError(
                f"package {self.where}: refusing to unpickle {str(module)[:80]}.{str(name)[:80]}: "
                "it is not part of a compiled graph (a damaged or malicious file?)"
            )
        return obj


def load_graph_pickle(data: bytes, where) -> Any:
    """``data`` unpickled with :class:`GraphUnpickler`; any failure a PackageError."""
    unpickler = GraphUnpickler(io.BytesIO(data))
    unpickler.where = where
    try:
        return unpickler.load()
    except PackageError:
        raise
    except RecursionError:
        raise PackageError(f"package {where}: pickle nests too deeply") from None
    except Exception as e:
        raise PackageError(f"package {where}: damaged pickle: {e!r}"[:400]) from e


def check_dataclasses_complete(obj: Any, where, depth: int = 0) -> None:
    """Every dataclass instance in ``obj`` (AOTAutograd's entry and metadata) has
    all of its fields: a damaged pickle that set other attribute names is a
    PackageError here, not an AttributeError on the first call."""
    if depth > 12:
        return
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        state = getattr(obj, "__dict__", None)
        for field in dataclasses.fields(obj):
            if state is not None and field.name not in state and not hasattr(type(obj), field.name):
                raise PackageError(
                    f"package {where}: {type(obj).__name__} has no field {field.name} (damaged)"
                )
            check_dataclasses_complete(getattr(obj, field.name, None), where, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for item in obj[:1000]:
            check_dataclasses_complete(item, where, depth + 1)
    elif isinstance(obj, dict):
        for item in list(obj.values())[:1000]:
            check_dataclasses_complete(item, where, depth + 1)


class _GraphPickleModule:
    """torch.load's ``pickle_module``: its unpickler is :class:`GraphUnpickler`."""

    Unpickler = GraphUnpickler
    __name__ = "torch._dynamo.package_trust._GraphPickleModule"

    @staticmethod
    def load(f, **kwargs):
        return GraphUnpickler(f, **kwargs).load()


def load_inductor_payload(blob: bytes, where) -> dict:
    """An Inductor artifact (a torch.save zip) with weights_only loading, the
    graph classes allowed, the nested pickles checked and the extern kernels
    checked to be torch's own."""
    try:
        with torch.serialization.safe_globals(_weights_only_globals()):
            payload = torch.load(io.BytesIO(blob), weights_only=True, map_location="cpu")
    except PackageError:
        raise
    except Exception as e:
        raise PackageError(f"package {where}: damaged Inductor artifact: {e!r}"[:600]) from e
    if not isinstance(payload, dict) or payload.get("backend") != "inductor":
        raise PackageError(f"package {where}: the Inductor artifact is not a dict of an Inductor graph")
    for field, types_ in (("entry", bytes), ("fw_graph", bytes), ("bw_graph", (bytes, type(None))),
                          ("aot_config", dict), ("params", dict), ("extern_kernels", dict)):
        if not isinstance(payload.get(field), types_):
            raise PackageError(f"package {where}: Inductor artifact field {field!r} is malformed")
    for field in ("entry", "fw_graph", "bw_graph"):
        if payload[field] is not None:
            check_dataclasses_complete(load_graph_pickle(payload[field], f"{where} ({field})"), f"{where} ({field})")
    for name, kernel in payload["extern_kernels"].items():
        if not (
            isinstance(name, str)
            and name.isidentifier()
            and not name.startswith("_")
            and kernel is getattr(torch._C._VariableFunctionsClass, name, None)  # type: ignore[attr-defined]
        ):
            raise PackageError(f"package {where}: extern kernel {str(name)[:40]!r} is not a torch operator")
    return payload


_weights_only_cache: list = []


def _weights_only_globals() -> list:
    if not _weights_only_cache:
        import builtins

        found = [getattr, torch._C._VariableFunctionsClass]  # type: ignore[attr-defined]
        for module_name in (
            "torch._functorch._aot_autograd.schemas",
            "torch._functorch._aot_autograd.runtime_wrappers",
            "torch._functorch._aot_autograd.autograd_cache",
            "torch._functorch._aot_autograd.subclass_utils",
            "torch._inductor.output_code",
            "torch._inductor.utils",
            "torch._subclasses.functional_tensor",
            "torch.utils._ordered_set",
        ):
            module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
            found += [
                obj
                for obj in vars(module).values()
                if isinstance(obj, type) and obj.__module__ == module_name
            ]
        found += [builtins.set, builtins.frozenset, builtins.slice]
        _weights_only_cache.extend(found)
    return _weights_only_cache


# ---------------------------------------------------------------------------
# Inspection and the command line
# ---------------------------------------------------------------------------


def _open_any(path: Path, check_environment=None) -> VerifiedPackage:
    if path.is_dir():
        return read_package(path, check_environment)
    if not path.is_file():
        raise PackageError(f"{path}: not a package directory or archive")
    with open(path, "rb") as f:
        return read_archive_files(f, path, check_environment)


def describe(path: Path) -> dict:
    """What a package holds, read with the configured trust (for ``inspect``)."""
    package = _open_any(path)
    manifest = package.manifest
    files = package.files
    entries = []
    dynamo_blob = files.get(DYNAMO_FILE)
    if dynamo_blob is not None:
        from torch._dynamo.package_store import _BuiltinsOnlyUnpickler

        try:
            raw_entries = _BuiltinsOnlyUnpickler(io.BytesIO(dynamo_blob)).load()
            for fields in raw_entries:
                entries.append(_describe_entry(fields))
        except PackageError:
            raise
        except Exception as e:
            raise PackageError(f"package {path}: {DYNAMO_FILE} is damaged: {e!r}") from e
    signed = _signer_claim(path)
    return {
        "path": str(path),
        "signed": signed is not None,
        "signer_claimed": signed,
        "signer_verified": package.signer,
        "environment": {
            k: manifest.get(k)
            for k in ("format_version", "torch_version", "python_version", "cpu_capability",
                      "machine", "overlay_series_hash", "device", "backend", "frozen")
        },
        "compile_options": manifest.get("compile_options", {}),
        "aot_compile": manifest.get("aot_compile"),
        "entries": entries,
        "files": {name: len(data) for name, data in sorted(files.items())},
        "kernels": sorted(n for n in files if n.startswith(KERNEL_PREFIX)),
        "graphs": sorted(n for n in files if n.startswith(GRAPH_PREFIX)),
        "total_bytes": sum(len(d) for d in files.values()) + len(package.manifest_raw),
    }


def _describe_entry(fields) -> dict:
    from torch._dynamo.guard_serialization import guard_type_name, load_guards_state

    from torch._dynamo.package_sources import check_source_records, describe_record

    code_key, out_code, guards_state, global_module, globals_, sources, frame_action = fields
    guards: list[str] = []
    if guards_state:
        state = load_guards_state(guards_state)
        for guard in getattr(state.output_graph, "guards", ()):
            guards.append(f"{guard.name}: {guard_type_name(guard)}"[:200])
    return {
        "key": [str(k)[:200] for k in code_key],
        "module": str(global_module)[:200],
        "bytecode_bytes": len(out_code),
        "guards": guards,
        "globals": {str(k): str(v[:2])[:200] for k, v in globals_.items()},
        # See NOTE: [What an entry was derived from]
        "derived_from": [describe_record(r)[:300] for r in sources] if check_source_records(sources) else "malformed",
        # A recorded decision about the code, not a compiled entry (NOTE: [Frames
        # Dynamo skips] in torch/_dynamo/package_recording.py).
        **({"frame_action": str(frame_action)[:40]} if frame_action else {}),
    }


def _signer_claim(path: Path) -> Optional[str]:
    try:
        if path.is_dir():
            if not _exists(path, SIGNATURE_FILE):
                return None
            raw = read_confined(path, SIGNATURE_FILE, path, MAX_SIGNATURE_BYTES)
        else:
            import zipfile

            with zipfile.ZipFile(path) as archive:
                if SIGNATURE_FILE not in archive.namelist():
                    return None
                raw = archive.read(SIGNATURE_FILE)
        return _parse_signature(raw, path)[0]
    except PackageError:
        return "malformed"


def sign_path(path: Path, key_file: str) -> str:
    """Sign an existing package (directory or archive) in place; the signer."""
    package = _open_any(path)
    signature = sign_manifest(package.manifest_raw, key_file)
    assert signature is not None
    if path.is_dir():
        tmp = path / f".{SIGNATURE_FILE}.tmp-{os.getpid()}"
        tmp.write_bytes(signature)
        os.replace(tmp, path / SIGNATURE_FILE)
    else:
        buf = io.BytesIO()
        write_signed_archive(buf, package.files, package.manifest_raw, signature)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(buf.getvalue())
        os.replace(tmp, path)
    return json.loads(signature)["signer"]


def write_signed_archive(fileobj, files: dict[str, bytes], raw_manifest: bytes, signature: Optional[bytes]) -> None:
    """An archive of ``files``, the manifest's bytes and its signature (if any)."""
    import zipfile

    with zipfile.ZipFile(fileobj, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in sorted(files.items()):
            archive.writestr(check_name(name, "<archive being written>"), data)
        archive.writestr(MANIFEST, raw_manifest)
        if signature is not None:
            archive.writestr(SIGNATURE_FILE, signature)


def main(argv: Optional[list[str]] = None) -> int:
    """``sign|verify|inspect PATH``: 0 on success, 1 (and why, on stderr) if not."""
    parser = argparse.ArgumentParser(
        prog="python -m torch._dynamo.package_trust",
        description="Sign, verify and inspect torch.compile packages and aot_compile archives.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="package_command", required=True)
    p = sub.add_parser("sign", help="sign a package's manifest (Ed25519)")
    p.add_argument("path")
    p.add_argument("--key", help="PEM Ed25519 private key (default: config.package_signing_key)")
    p = sub.add_parser("verify", help="verify a package's signature and every file's sha256")
    p.add_argument("path")
    p.add_argument("--trusted-key", action="append", help="PEM public key (repeatable; default: config.package_trusted_keys)")
    p = sub.add_parser("inspect", help="entries, guards, kernels, sizes, environment, signer")
    p.add_argument("path")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("keygen", help="write a new Ed25519 key pair: PATH and PATH.pub")
    p.add_argument("path", help="the private key file to create (PEM); the public key goes to PATH.pub")


def run(args) -> int:
    config = torch._dynamo.config
    path = Path(args.path)
    try:
        if args.package_command == "keygen":
            try:
                write_key_pair(path, f"{path}.pub")
            except FileExistsError as e:
                raise PackageError(f"{path} exists: keygen never overwrites a key") from e
            print(f"wrote {path} (private, mode 0600) and {path}.pub (public)")
        elif args.package_command == "sign":
            key = args.key or config.package_signing_key
            if not key:
                raise PackageError("no signing key: pass --key or set TORCH_COMPILE_PACKAGE_SIGNING_KEY")
            print(f"signed {path} as {sign_path(path, key)}")
        elif args.package_command == "verify":
            trusted = args.trusted_key or config.package_trusted_keys
            if not trusted:
                raise PackageError("no trusted keys: pass --trusted-key or set TORCH_COMPILE_PACKAGE_TRUSTED_KEYS")
            with config.patch(package_trusted_keys=list(trusted), package_require_signature=True):
                package = _open_any(path)
            print(f"{path}: signature by {package.signer} verified; {len(package.files)} files match their sha256")
        else:
            _print_description(describe(path), args.json)
    except PackageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


def _print_description(info: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(info, indent=1, sort_keys=True))
        return
    print(f"package {info['path']}")
    signer = info["signer_verified"] or (
        f"{info['signer_claimed']} (not verified: no trusted key matches or none configured)"
        if info["signed"]
        else "unsigned"
    )
    print(f"  signer: {signer}")
    for key, value in info["environment"].items():
        print(f"  {key}: {value}")
    print(f"  entries: {len(info['entries'])}")
    for entry in info["entries"]:
        print(f"    {' '.join(entry['key'])} (module {entry['module']}, bytecode {entry['bytecode_bytes']} B)")
        for guard in entry["guards"]:
            print(f"      guard {guard}")
    print(f"  files ({info['total_bytes']} bytes with the manifest):")
    for name, size in info["files"].items():
        print(f"    {size:>10}  {name}")
    print(f"  kernels: {len(info['kernels'])}, graphs: {len(info['graphs'])}")


if __name__ == "__main__":
    sys.exit(main())
