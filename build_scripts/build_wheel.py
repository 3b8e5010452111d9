"""Build the patched torch wheel: the base release's wheel with the patch set applied.

The base wheel (``torch==<base>`` from ``base_version.txt``) is downloaded with pip,
unpacked with ``python -m wheel unpack``, patched with the very function the overlay
uses to materialise its cache (:func:`torch_overlay._overlay.materialize.apply_series`),
given the mirrored new modules and the compat layer of ``torch_overlay/`` (with its
compiled extension), stamped ``<base>+overlay.<YYYYMMDD>.<series hash[:12]>``, and
repacked by :func:`repack`, which writes the archive and its RECORD reproducibly. The
result lands in ``dist/``; a wheel already built for the current version is reused,
unless ``--force`` is given or its added files no longer match ``torch_overlay/``.

# NOTE: [Patched wheel version]
# The version is ``<base>+overlay.<YYYYMMDD>.<series hash[:12]>`` in the wheel file
# name, the dist-info directory, METADATA and ``torch/version.py`` alike. The date is
# the UTC day of the build's source date (NOTE: [Reproducible patched wheel]), so
# nightlies sort by date under PEP 440 (local segments compare left to right, digits
# as numbers); the hash says which series a nightly was built from, and tells apart
# two builds of one day. The local label starts with ``overlay.``: that is what the
# overlay looks for to refuse activating on top of an already patched torch, and what
# ``torch._dynamo._backport_build`` reads the series hash back from (its last
# segment). The base wheel's own local label (``+cu126`` in ``torch.__version__``) is
# replaced, not kept: a version has only one.
#
# NOTE: [Reproducible patched wheel]
# The same base wheel, series and extension build give a byte-identical wheel, so
# that a nightly's sha256 changes exactly when what it ships does. Nothing of the
# build's clock, directories or file system order reaches the archive: every entry
# carries one timestamp, the source date (``SOURCE_DATE_EPOCH`` when set, else the
# committer date of the last commit touching ``patches/`` or ``torch_overlay/``);
# entries are written in sorted order (the dist-info last, RECORD at its end, as the
# wheel spec recommends); modes are 0644, or 0755 for a file with any execute bit;
# RECORD lists the files in archive order. Deflate runs at zlib's default level, so
# a different zlib could compress differently: reproducible on one builder image.
# The compiled extension is shipped as built, so the wheel is as reproducible as its
# build: setup.py compiles with -ffile-prefix-map=<checkout>=., so the source and
# torch header paths gcc records (__FILE__ in assertion messages) are relative to
# the checkout (the dev venv lies inside it), and it carries nothing else of the
# build (no debug sections; its GNU build ID is a hash of its contents): two
# checkouts in different directories built byte-identical extensions (measured).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import hashlib
import io
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING


REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from torch_overlay._overlay import materialize, rebase_check, series
from torch_overlay._overlay.errors import OverlayError


if TYPE_CHECKING:
    from collections.abc import Mapping


log = logging.getLogger(__name__)

DIST_NAME = "torch"


@contextlib.contextmanager
def _timed(name: str, timings: list[tuple[str, float]]):
    log.info("%s...", name)
    start = time.monotonic()
    yield
    elapsed = time.monotonic() - start
    timings.append((name, elapsed))
    log.info("%s: %.1fs", name, elapsed)


# What the source date is taken from when SOURCE_DATE_EPOCH is not set: the last
# commit that changed what the wheel ships (NOTE: [Reproducible patched wheel]).
SOURCE_DATE_PATHS = ("patches", "torch_overlay")
# Zip timestamps start at 1980-01-01 (in the zip's local-time fields, read as UTC).
_ZIP_EPOCH_MIN = 315532800
_COPY_CHUNK = 1 << 20


def source_date_epoch(repo_root: Path = REPO_ROOT, environ: Mapping[str, str] = os.environ) -> int:
    """The build's one timestamp (NOTE: [Reproducible patched wheel])."""
    override = environ.get("SOURCE_DATE_EPOCH")
    if override:
        try:
            return int(override)
        except ValueError:
            raise OverlayError(f"SOURCE_DATE_EPOCH={override!r} is not a number of seconds") from None
    proc = subprocess.run(
        ["git", "log", "-1", "--format=%ct", "--", *SOURCE_DATE_PATHS],
        cwd=repo_root,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        raise OverlayError(
            f"no commit touching {' or '.join(SOURCE_DATE_PATHS)} found in {repo_root} "
            f"({proc.stderr.strip() or 'no history'}); set SOURCE_DATE_EPOCH to build outside "
            f"a git checkout"
        )
    return int(proc.stdout.strip())


def overlay_version(base: str, series_hash: str, epoch: int) -> str:
    """``<base>+overlay.<YYYYMMDD>.<hash[:12]>`` (NOTE: [Patched wheel version])."""
    day = time.strftime("%Y%m%d", time.gmtime(epoch))
    return f"{base}+overlay.{day}.{series_hash[:12]}"


def find_built_wheel(dist_dir: Path, version: str) -> Path | None:
    matches = sorted(dist_dir.glob(f"{DIST_NAME}-{version}-*.whl"))
    return matches[0] if matches else None


def fetch_base_wheel(base: str, src_dir: Path) -> Path:
    """The base release's wheel for this interpreter, downloaded once into ``src_dir``."""
    return rebase_check.fetch_torch_wheel(base, src_dir)


def unpack(wheel: Path, dest: Path) -> Path:
    """``python -m wheel unpack``; returns the unpacked root (holding ``torch/``)."""
    subprocess.run(
        [sys.executable, "-m", "wheel", "unpack", str(wheel), "-d", str(dest)],
        check=True,
    )
    roots = [p for p in dest.iterdir() if p.is_dir()]
    if len(roots) != 1:
        raise OverlayError(f"expected one unpacked wheel under {dest}, found {roots}")
    return roots[0]


def _copy_new_file(src: Path, root: Path, rel: str) -> None:
    dest = root / rel
    if dest.exists():
        raise OverlayError(
            f"{src} mirrors {rel}, which the base wheel already has; an existing torch "
            f"file may only be changed by a patch"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest)
    log.info("added %s", rel)


def new_files() -> dict[str, Path]:
    """``torch/...`` path -> source, for every file the patch set adds to torch: the
    mirrored new modules and the compat layer (see NOTE: [The compat layer]), with
    the extensions built for this interpreter."""
    return {series.mirrored_relpath(p): p for p in series.served_new_modules().values()}


def add_new_files(root: Path, files: Mapping[str, Path]) -> None:
    """Copy the mirrored new modules and compiled extensions (``files``: their
    ``torch/...`` path -> source, as :func:`new_files` gives) to their torch/ paths."""
    for rel, src in sorted(files.items()):
        _copy_new_file(src, root, rel)


def outdated_new_files(wheel: Path, base_wheel: Path) -> list[str]:
    """Added files of a built ``wheel`` that no longer match ``torch_overlay/``.

    The series hash names the wheel but covers only the patches; the mirrored modules
    and extensions can change under the same name, so a reused wheel is checked here.
    """
    expected = new_files()
    with zipfile.ZipFile(base_wheel) as zf:
        base_names = set(zf.namelist())
    with zipfile.ZipFile(wheel) as zf:
        added = {
            name
            for name in zf.namelist()
            if name not in base_names and ".dist-info/" not in name and not name.endswith("/")
        }
        outdated = sorted(added ^ set(expected))
        for rel in sorted(added & set(expected)):
            if zf.read(rel) != expected[rel].read_bytes():
                outdated.append(rel)
    return outdated


def stamp_version(root: Path, version: str) -> None:
    """Give the unpacked wheel ``version`` (see NOTE: [Patched wheel version])."""
    dist_infos = list(root.glob("*.dist-info"))
    if len(dist_infos) != 1:
        raise OverlayError(f"expected one .dist-info in {root}, found {dist_infos}")
    new_dist_info = root / f"{DIST_NAME}-{version}.dist-info"
    dist_infos[0].rename(new_dist_info)
    # RECORD is rewritten by the pack step, and signatures of the base's RECORD no
    # longer hold.
    for name in ("RECORD", "RECORD.jws", "RECORD.p7s"):
        (new_dist_info / name).unlink(missing_ok=True)

    metadata = new_dist_info / "METADATA"
    headers, sep, body = metadata.read_text(encoding="utf-8").partition("\n\n")
    headers, count = re.subn(r"^Version: .*$", f"Version: {version}", headers, count=1, flags=re.MULTILINE)
    if count != 1:
        raise OverlayError(f"no Version header in {metadata}")
    metadata.write_text(headers + sep + body, encoding="utf-8")

    version_py = root / DIST_NAME / "version.py"
    text, count = re.subn(
        r"^__version__\s*=.*$", f"__version__ = {version!r}", version_py.read_text(), count=1, flags=re.MULTILINE
    )
    if count != 1:
        raise OverlayError(f"no __version__ in {version_py}")
    version_py.write_text(text)


def wheel_tags(wheel: Path) -> str:
    """``<python>-<abi>-<platform>`` of a wheel file name (and its build tag, if any)."""
    from wheel.wheelfile import WHEEL_INFO_RE

    match = WHEEL_INFO_RE.match(wheel.name)
    if match is None:
        raise OverlayError(f"not a wheel file name: {wheel.name}")
    tags = "-".join(match.group("pyver", "abi", "plat"))
    return f"{match.group('build')}-{tags}" if match.group("build") else tags


def _archive_key(name: str) -> tuple[bool, bool, str]:
    """Sort key of an archive entry: the dist-info last, its RECORD at the very end."""
    top = name.split("/", 1)[0]
    in_dist_info = top.endswith(".dist-info")
    return in_dist_info, in_dist_info and name == f"{top}/RECORD", name


def _tree_files(root: Path) -> list[str]:
    """Every file under ``root`` as an archive name, in archive order."""
    names = []
    for path in root.rglob("*"):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            raise OverlayError(f"{path}: a wheel holds regular files only")
        if path.is_file():
            names.append(path.relative_to(root).as_posix())
    return sorted(names, key=_archive_key)


def _record_hash(digest: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _write_entry(zf: zipfile.ZipFile, name: str, source, size: int, mode: int, date_time) -> bytes:
    """Deflate ``source`` (a binary file object) into ``zf`` as ``name``; its sha256."""
    info = zipfile.ZipInfo(name, date_time=date_time)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # Unix: external_attr holds the mode
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.file_size = size  # lets zipfile decide on zip64 up front
    digest = hashlib.sha256()
    with zf.open(info, "w") as out:
        while chunk := source.read(_COPY_CHUNK):
            digest.update(chunk)
            out.write(chunk)
    return digest.digest()


def repack(root: Path, wheel_path: Path, epoch: int) -> Path:
    """Pack the unpacked wheel ``root`` into ``wheel_path`` reproducibly, with a fresh
    RECORD (NOTE: [Reproducible patched wheel]).

    ``root`` holds one ``*.dist-info``; a RECORD there is replaced. The bytes depend
    only on the files' paths, contents and execute bits, and on ``epoch``.
    """
    dist_infos = [p.name for p in root.glob("*.dist-info") if p.is_dir()]
    if len(dist_infos) != 1:
        raise OverlayError(f"expected one .dist-info in {root}, found {dist_infos}")
    record_name = f"{dist_infos[0]}/RECORD"
    date_time = time.gmtime(max(epoch, _ZIP_EPOCH_MIN))[:6]
    rows = []
    wheel_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = wheel_path.with_name(wheel_path.name + ".part")
    with zipfile.ZipFile(tmp, "w") as zf:
        for name in _tree_files(root):
            if name == record_name:
                continue
            path = root / name
            st = path.stat()
            mode = 0o755 if st.st_mode & 0o111 else 0o644
            with open(path, "rb") as source:
                digest = _write_entry(zf, name, source, st.st_size, mode, date_time)
            rows.append((name, _record_hash(digest), str(st.st_size)))
        text = io.StringIO()
        writer = csv.writer(text, lineterminator="\n")
        writer.writerows([*rows, (record_name, "", "")])
        record = text.getvalue().encode()
        _write_entry(zf, record_name, io.BytesIO(record), len(record), 0o644, date_time)
    os.replace(tmp, wheel_path)
    return wheel_path


def build_from_base(
    base_wheel: Path,
    work_dir: Path,
    version: str,
    epoch: int,
    patches: list[series.Patch],
    added_files: Mapping[str, Path],
    timings: list[tuple[str, float]] | None = None,
) -> Path:
    """The patched wheel of ``base_wheel``, built in ``work_dir`` (emptied first):
    unpacked, ``patches`` applied, ``added_files`` (``torch/...`` path -> source)
    added, stamped ``version`` and repacked at ``epoch``. Returns the wheel, which
    lies under ``work_dir/out``."""
    timings = [] if timings is None else timings
    if work_dir.exists():
        shutil.rmtree(work_dir)
    with _timed("unpack", timings):
        root = unpack(base_wheel, work_dir / "unpacked")
    with _timed("apply", timings):
        materialize.apply_series(root, patches)
        log.info("applied %d patches", len(patches))
        add_new_files(root, added_files)
    stamp_version(root, version)
    with _timed("pack", timings):
        wheel_name = f"{DIST_NAME}-{version}-{wheel_tags(base_wheel)}.whl"
        return repack(root, work_dir / "out" / wheel_name, epoch)


def build(dist_dir: Path, src_dir: Path, work_dir: Path, force: bool = False) -> Path:
    base = series.base_version()
    epoch = source_date_epoch()
    series_hash = series.series_hash()
    version = overlay_version(base, series_hash, epoch)
    existing = find_built_wheel(dist_dir, version) if not force else None
    if existing is not None:
        outdated = outdated_new_files(existing, fetch_base_wheel(base, src_dir))
        if not outdated:
            log.info("patched wheel for this series already built")
            return existing
        log.info("%s is out of date with torch_overlay/ (%s); rebuilding", existing.name, ", ".join(outdated))

    timings: list[tuple[str, float]] = []
    with _timed("download", timings):
        base_wheel = fetch_base_wheel(base, src_dir)
    packed = build_from_base(
        base_wheel, work_dir, version, epoch, series.served_series(), new_files(), timings
    )
    if series.series_hash() != series_hash:
        # The files were read after the version was named: a wheel of an edit made
        # meanwhile would carry another series' name.
        shutil.rmtree(work_dir)
        raise OverlayError("the patch set changed during the build; build again")
    # Packed beside the tree and moved in whole, so that dist/ never holds a
    # half-written wheel that a later run would take as built.
    dist_dir.mkdir(parents=True, exist_ok=True)
    final = dist_dir / packed.name
    os.replace(packed, final)
    for stale in dist_dir.glob(f"{DIST_NAME}-{base}+overlay.*.whl"):
        if stale != final:
            log.info("removing patched wheel of another version: %s", stale)
            stale.unlink()
    shutil.rmtree(work_dir)
    log.info(
        "built %s (%.0f MB, sha256 %s) in %s",
        final,
        final.stat().st_size / 2**20,
        _file_sha256(final),
        ", ".join(f"{name} {secs:.1f}s" for name, secs in timings),
    )
    return final


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def write_pointer(pointer: Path, wheel: Path) -> None:
    """Record which wheel was built, touching ``pointer`` only when that changes.

    Make rebuilds the wheel venv when the pointer is newer than the venv's stamp, so
    an unchanged wheel must leave its mtime alone.
    """
    st = wheel.stat()
    content = f"{wheel.resolve()}\n{st.st_size} {st.st_mtime_ns}\n"
    try:
        if pointer.read_text() == content:
            return
    except OSError:
        pass
    pointer.parent.mkdir(parents=True, exist_ok=True)
    tmp = pointer.with_name(pointer.name + ".tmp")
    tmp.write_text(content)
    os.replace(tmp, pointer)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="rebuild even if the wheel exists")
    parser.add_argument("--dist-dir", type=Path, default=REPO_ROOT / "dist")
    parser.add_argument(
        "--src-dir", type=Path, default=REPO_ROOT / "build" / "wheel-src",
        help="where the base wheel is downloaded (kept between builds)",
    )
    parser.add_argument(
        "--work-dir", type=Path, default=REPO_ROOT / "build" / "wheel",
        help="scratch directory, removed after a successful build",
    )
    parser.add_argument(
        "--pointer", type=Path,
        help="file to record the built wheel's path in (rewritten only when it changes)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="build_wheel: %(message)s")
    try:
        wheel = build(args.dist_dir, args.src_dir, args.work_dir, args.force)
    except (OverlayError, subprocess.CalledProcessError) as e:
        print(f"build_wheel: error: {e}", file=sys.stderr)
        return 1
    if args.pointer:
        write_pointer(args.pointer, wheel)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
