"""mypy on the mirrored torch modules, as the torch modules they are (`make lint`).

A mirrored module (``torch_overlay/_dynamo/x.py``) is ``torch/_dynamo/x.py``: it
imports its siblings as ``torch._dynamo.y`` and uses what the patches add to
existing torch files (``torch._dynamo.exc.PackageError``, the new
``CheckFunctionManager`` arguments...). Checked in place, mypy would see neither.
So this builds a typing view of the patched torch under ``--view`` (default
``build/typing-view``): the installed torch's tree as symbolic links, each file the
series patches replaced by its materialised patched source, and every module the
overlay serves (mirrored and compat) copied in at its torch path. mypy (options in
pyproject.toml's ``[tool.mypy]``) then checks the mirrored modules there, and its
report names them by their paths in this repository.

    python build_scripts/typecheck.py [--view DIR] [-- extra mypy arguments]

Exits with mypy's status.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from torch_overlay._overlay import importer, materialize, series


def build_view(view: Path) -> dict[str, Path]:
    """Build the typing view; return ``torch/X/y.py`` -> repository file for each
    mirrored module (what mypy checks)."""
    torch_root, torch_version = importer.find_torch()
    importer.check_torch_version(torch_version, str(torch_root / "torch"))
    tree = materialize.materialize(torch_root, torch_version, series.series_hash())
    if view.exists():
        shutil.rmtree(view)
    view.mkdir(parents=True)
    # Symbolic links to every file of the installed torch (``cp -rs``), then the
    # patched and served files as real files over them.
    subprocess.run(["cp", "-rs", str(torch_root / "torch"), str(view)], check=True)
    for rel in tree.files:
        _place(tree.patched_path(rel), view / rel)
    for path in series.served_new_modules().values():
        if path.suffix == ".py":
            _place(path, view / series.mirrored_relpath(path))
    return {
        series.mirrored_relpath(path): path
        for path in series.mirrored_modules().values()
        if path.suffix == ".py"
    }


def _place(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    if dst.is_symlink() or dst.exists():
        dst.unlink()
    shutil.copyfile(src, dst)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--view", type=Path, default=REPO / "build" / "typing-view")
    parser.add_argument("mypy_args", nargs="*", help="extra mypy arguments (after --)")
    args = parser.parse_args(argv)
    view = args.view.resolve()
    checked = build_view(view)
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(REPO / "pyproject.toml"),
        "--cache-dir",
        str(view.parent / "mypy-cache"),
        *args.mypy_args,
        *sorted(checked),
    ]
    proc = subprocess.run(cmd, cwd=view, capture_output=True, text=True)
    # Name the checked modules by their paths in this repository.
    names = {rel: str(path.relative_to(REPO)) for rel, path in checked.items()}
    pattern = re.compile("|".join(re.escape(rel) for rel in sorted(names, key=len, reverse=True)))
    for stream, out in ((sys.stdout, proc.stdout), (sys.stderr, proc.stderr)):
        stream.write(pattern.sub(lambda m: names[m.group(0)], out) if names else out)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
