"""Publish wheels into a PEP 503 "simple" package index on disk.

``make publish INDEX=DIR`` (``python build_scripts/publish_index.py --index DIR
WHEEL...``) copies each wheel to ``DIR/simple/<project>/`` and rewrites the index
pages from what the directory then holds:

    DIR/simple/index.html               one link per project
    DIR/simple/<project>/index.html     one link per file, ``#sha256=<digest>``,
                                        newest version first
    DIR/simple/<project>/<file>.whl

so that ``pip install --index-url file://DIR/simple torch`` (or the same directory
served over HTTP) installs from it. Only the standard library and ``packaging``
are used: the script runs in any environment that has pip.

# NOTE: [Publishing is idempotent]
# A published file never changes: publishing a wheel whose file name is already in
# the index is a no-op when the bytes are the same (a reproducible rebuild, NOTE:
# [Reproducible patched wheel] in build_wheel.py) and an error when they differ,
# since pip and every cache downstream identify a distribution by its file name and
# the index's sha256. The pages are generated from the directory's contents alone,
# sorted, with no time stamps, so publishing the same wheels again leaves every byte
# of the index as it was, and several nightlies accumulate in one project page.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import html
import logging
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version


log = logging.getLogger(__name__)


class PublishError(RuntimeError):
    """A wheel cannot be published (not a wheel, or another file under its name)."""


def file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _requires_python(wheel: Path) -> str | None:
    """The wheel's ``Requires-Python`` (for the link's ``data-requires-python``)."""
    with zipfile.ZipFile(wheel) as zf:
        metadata = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1]
        if len(metadata) != 1:
            raise PublishError(f"{wheel.name}: expected one .dist-info/METADATA, found {metadata}")
        headers = email.parser.BytesHeaderParser().parsebytes(zf.read(metadata[0]))
    return headers.get("Requires-Python")


def _write_if_changed(path: Path, text: str) -> None:
    """Write ``text`` atomically, leaving an identical file (and its mtime) alone."""
    data = text.encode()
    if path.is_file() and path.read_bytes() == data:
        return
    fd, tmp = tempfile.mkstemp(prefix=".index-", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(f"    {link}<br/>" for link in links)
    return (
        "<!DOCTYPE html>\n<html>\n  <head>\n"
        '    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n"
        f"    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n"
    )


def _wheel_sort_key(wheel: Path):
    version = parse_wheel_filename(wheel.name)[1]
    return version, wheel.name


def write_project_page(project_dir: Path) -> None:
    """``project_dir/index.html``: every wheel there, newest version first."""
    wheels = sorted(project_dir.glob("*.whl"), key=_wheel_sort_key, reverse=True)
    links = []
    for wheel in wheels:
        href = f"{html.escape(wheel.name)}#sha256={file_sha256(wheel)}"
        requires = _requires_python(wheel)
        attr = f' data-requires-python="{html.escape(requires)}"' if requires else ""
        links.append(f'<a href="{href}"{attr}>{html.escape(wheel.name)}</a>')
    _write_if_changed(project_dir / "index.html", _page(f"Links for {project_dir.name}", links))


def write_root_page(simple: Path) -> None:
    """``simple/index.html``: one link per project directory."""
    projects = sorted(p.name for p in simple.iterdir() if p.is_dir() and (p / "index.html").is_file())
    links = [f'<a href="{html.escape(p)}/">{html.escape(p)}</a>' for p in projects]
    _write_if_changed(simple / "index.html", _page("Simple index", links))


def add_wheel(simple: Path, wheel: Path) -> Path:
    """Copy ``wheel`` into its project directory (NOTE: [Publishing is idempotent])."""
    try:
        name, version = parse_wheel_filename(wheel.name)[:2]
    except ValueError as e:
        raise PublishError(f"{wheel}: not a wheel file name ({e})") from None
    if not isinstance(version, Version):
        raise PublishError(f"{wheel.name}: no PEP 440 version")
    project_dir = simple / canonicalize_name(name)
    project_dir.mkdir(parents=True, exist_ok=True)
    dest = project_dir / wheel.name
    if dest.exists():
        if file_sha256(dest) != file_sha256(wheel):
            raise PublishError(
                f"{dest} is already published with other contents; a published file never "
                f"changes (build a new version instead)"
            )
        log.info("already published: %s", dest)
        return project_dir
    fd, tmp = tempfile.mkstemp(prefix=".wheel-", dir=project_dir)
    os.close(fd)
    shutil.copyfile(wheel, tmp)
    os.chmod(tmp, 0o644)
    os.replace(tmp, dest)
    log.info("published %s", dest)
    return project_dir


def publish(wheels: list[Path], index_dir: Path) -> Path:
    """Add ``wheels`` to the index at ``index_dir``; returns ``index_dir/simple``."""
    simple = index_dir / "simple"
    simple.mkdir(parents=True, exist_ok=True)
    projects = {add_wheel(simple, wheel) for wheel in wheels}
    for project_dir in sorted(projects):
        write_project_page(project_dir)
    write_root_page(simple)
    return simple


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--index", type=Path, required=True, help="the index directory (its simple/ is written)")
    parser.add_argument("wheels", type=Path, nargs="+", help="wheel files to publish")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="publish_index: %(message)s")
    try:
        simple = publish(args.wheels, args.index)
    except (PublishError, OSError) as e:
        print(f"publish_index: error: {e}", file=sys.stderr)
        return 1
    print(f"pip install --index-url {simple.resolve().as_uri()} <project>")
    return 0


if __name__ == "__main__":
    sys.exit(main())
