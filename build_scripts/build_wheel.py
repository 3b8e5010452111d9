"""Build the patched torch wheel: the base release's wheel with the patch set applied.

The base wheel (``torch==<base>`` from ``base_version.txt``) is downloaded with pip,
unpacked with ``python -m wheel unpack``, patched with the very function the overlay
uses to materialise its cache (:func:`torch_overlay._overlay.materialize.apply_series`),
given the mirrored new modules and the compat layer of ``torch_overlay/`` (with its
compiled extension), stamped
``<base>+overlay.<series hash[:12]>``, and repacked with the ``wheel`` package, which
writes RECORD. The result lands in ``dist/``; a wheel already built for the current
series hash is reused, unless ``--force`` is given or its added files no longer match
``torch_overlay/``.

# NOTE: [Patched wheel version]
# The version is ``<base>+overlay.<series hash[:12]>`` in the wheel file name, the
# dist-info directory, METADATA and ``torch/version.py`` alike. The local label is what
# the overlay looks for to refuse activating on top of an already patched torch, and
# the hash says which series a nightly was built from. The base wheel's own local label
# (``+cu126`` in ``torch.__version__``) is replaced, not kept: a version has only one.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path


REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from torch_overlay._overlay import materialize, series
from torch_overlay._overlay.errors import OverlayError


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


def overlay_version(base: str, series_hash: str) -> str:
    return f"{base}+overlay.{series_hash[:12]}"


def find_built_wheel(dist_dir: Path, version: str) -> Path | None:
    matches = sorted(dist_dir.glob(f"{DIST_NAME}-{version}-*.whl"))
    return matches[0] if matches else None


def _pick_compatible(wheels: list[Path]) -> Path | None:
    """The wheel the running interpreter would install, preferring its best tag."""
    from packaging.tags import sys_tags
    from packaging.utils import parse_wheel_filename

    rank = {tag: i for i, tag in enumerate(sys_tags())}
    best = None
    for whl in wheels:
        tags = parse_wheel_filename(whl.name)[3]
        score = min((rank[t] for t in tags if t in rank), default=None)
        if score is not None and (best is None or score < best[0]):
            best = (score, whl)
    return best[1] if best else None


def fetch_base_wheel(base: str, src_dir: Path) -> Path:
    """The base release's wheel for this interpreter, downloaded once into ``src_dir``."""
    pattern = f"{DIST_NAME}-{base}-*.whl"
    found = _pick_compatible(sorted(src_dir.glob(pattern)))
    if found is not None:
        log.info("base wheel already downloaded: %s", found)
        return found
    src_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", f"{DIST_NAME}=={base}",
            "--no-deps", "--only-binary=:all:", "-d", str(src_dir),
        ],
        check=True,
    )
    found = _pick_compatible(sorted(src_dir.glob(pattern)))
    if found is None:
        raise OverlayError(f"pip download left no {pattern} for this interpreter in {src_dir}")
    return found


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


def add_new_files(root: Path) -> None:
    """Copy the mirrored new modules and compiled extensions to their torch/ paths."""
    for rel, src in sorted(new_files().items()):
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
    # RECORD is rewritten by the pack step; the base one would only be skipped.
    (new_dist_info / "RECORD").unlink(missing_ok=True)

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


def pack(root: Path, dest_dir: Path, name: str) -> Path:
    """``python -m wheel pack``, which writes RECORD; returns the wheel, named ``name``.

    ``wheel pack`` deflates at zlib's default level: ~65 s for torch on one core, where
    level 1 would save ~35 s for a wheel ~45 MB larger. Not worth leaving the tool.
    """
    dest_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, "-m", "wheel", "pack", str(root), "-d", str(dest_dir)],
        check=True,
    )
    packed = dest_dir / name
    if not packed.is_file():
        found = [p.name for p in dest_dir.glob("*.whl")]
        raise OverlayError(f"packing was to produce {name}, but {dest_dir} holds {found}")
    return packed


def build(dist_dir: Path, src_dir: Path, work_dir: Path, force: bool = False) -> Path:
    base = series.base_version()
    version = overlay_version(base, series.series_hash())
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
    if work_dir.exists():
        shutil.rmtree(work_dir)
    with _timed("unpack", timings):
        root = unpack(base_wheel, work_dir / "unpacked")
    with _timed("apply", timings):
        patches = series.read_series()
        materialize.apply_series(root, patches)
        log.info("applied %d patches", len(patches))
        add_new_files(root)
    stamp_version(root, version)
    with _timed("pack", timings):
        wheel_name = f"{DIST_NAME}-{version}-{wheel_tags(base_wheel)}.whl"
        packed = pack(root, work_dir / "out", wheel_name)
    # Packed beside the tree and moved in whole, so that dist/ never holds a
    # half-written wheel that a later run would take as built.
    dist_dir.mkdir(parents=True, exist_ok=True)
    final = dist_dir / packed.name
    os.replace(packed, final)
    for stale in dist_dir.glob(f"{DIST_NAME}-{base}+overlay.*.whl"):
        if stale != final:
            log.info("removing patched wheel of another series: %s", stale)
            stale.unlink()
    shutil.rmtree(work_dir)
    log.info(
        "built %s (%.0f MB) in %s",
        final,
        final.stat().st_size / 2**20,
        ", ".join(f"{name} {secs:.1f}s" for name, secs in timings),
    )
    return final


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
