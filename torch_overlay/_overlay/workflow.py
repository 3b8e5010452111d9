"""Developer workflow: check the series out into a git tree, edit, refresh the patches.

``edit`` builds a git repository whose first commit is the installed torch's
pristine Python sources (tagged ``overlay-base``) and then ``git am``'s every patch
of the series, one commit per patch. A developer edits torch files there and
commits (a new commit is a new patch; ``git commit --amend`` or an interactive
rebase changes an existing one). ``refresh`` turns ``overlay-base..HEAD`` back into
the series with ``git format-patch``: this is quilt's push / refresh cycle with git
doing the work.
"""

# NOTE: [Stable patch files]
# refresh must be idempotent, so the patches are written with --zero-commit (no
# commit hash in the "From" line), --no-signature (no git version) and
# --no-numbered (the subject does not change when the series grows); the author
# date survives git am. Files are named after the subject as format-patch does,
# minus its "NNNN-" counter, so reordering the series renames nothing.

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from pathlib import Path

from .errors import OverlayError
from .series import (
    GROUPS,
    REPO_ROOT,
    base_version,
    format_series,
    installed_base,
    parse_series,
    patches_dir,
    read_series,
    series_names,
)


log = logging.getLogger(__name__)

BASE_TAG = "overlay-base"
_IDENTITY = {
    "GIT_AUTHOR_NAME": "torch_overlay",
    "GIT_AUTHOR_EMAIL": "torch_overlay@localhost",
    "GIT_COMMITTER_NAME": "torch_overlay",
    "GIT_COMMITTER_EMAIL": "torch_overlay@localhost",
    # A fixed date for the pristine commit keeps the base identical across edits.
    "GIT_AUTHOR_DATE": "2025-06-04T00:00:00+00:00",
    "GIT_COMMITTER_DATE": "2025-06-04T00:00:00+00:00",
}


def git(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    full_env = dict(os.environ)
    full_env["GIT_CEILING_DIRECTORIES"] = str(Path(cwd).resolve().parent)
    full_env.pop("GIT_DIR", None)
    full_env.pop("GIT_WORK_TREE", None)
    if env:
        full_env.update(env)
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=full_env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise OverlayError(
            f"`git {' '.join(args)}` failed in {cwd}:\n{proc.stderr.strip()}"
        )
    return proc.stdout


def copy_pristine_sources(torch_dir: Path, dest: Path, suffixes=(".py",)) -> int:
    """Copy the installed torch's Python sources to ``dest/torch``; return a count."""
    count = 0
    for root, dirs, files in os.walk(torch_dir):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel_root = Path(root).relative_to(torch_dir)
        for fname in files:
            if fname.endswith(suffixes):
                target = dest / "torch" / rel_root / fname
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(Path(root) / fname, target)
                count += 1
    return count


def copy_extra_files(extra_files: dict[str, Path], dest: Path) -> None:
    """Copy ``extra_files`` (path under ``dest`` -> source) into ``dest``."""
    for rel, src in extra_files.items():
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, target)


def init_pristine_repo(
    work_dir: Path,
    torch_dir: Path,
    torch_version: str,
    extra_files: dict[str, Path] | None = None,
) -> None:
    """A git repo holding torch's pristine Python sources, tagged ``overlay-base``;
    ``extra_files`` (repo path -> source) join them in that first commit."""
    work_dir.mkdir(parents=True, exist_ok=True)
    git(["init", "-q", "-b", "main"], work_dir)
    copy_pristine_sources(torch_dir, work_dir)
    copy_extra_files(extra_files or {}, work_dir)
    git(["add", "-A", "torch", *(extra_files or {})], work_dir)
    git(
        ["commit", "-q", "-m", f"torch {torch_version}: pristine Python sources"],
        work_dir,
        env=_IDENTITY,
    )
    git(["tag", BASE_TAG], work_dir)


def default_work_dir(base: str | None = None) -> Path:
    """``.overlay-work`` for the primary base, ``.overlay-work-<base>`` for another."""
    base = base or installed_base()
    suffix = "" if base == base_version() else f"-{base}"
    return REPO_ROOT / f".overlay-work{suffix}"


def _pristine_torch_dir(base: str, scratch: Path) -> tuple[Path, str]:
    """(torch/ directory, version) of torch ``base``'s pristine sources: the installed
    torch when it is that release, else the release's wheel (downloaded once into
    build/rebase/<base>/, as rebase-check does), unpacked into ``scratch``."""
    from .importer import check_torch_version, find_torch
    from .rebase_check import DEFAULT_CACHE_ROOT, fetch_torch_wheel

    try:
        torch_root, torch_version = find_torch()
    except OverlayError:
        torch_version = ""
    if torch_version.partition("+")[0] == base:
        check_torch_version(torch_version, str(torch_root / "torch"), base=base)
        return torch_root / "torch", torch_version
    wheel = fetch_torch_wheel(base, DEFAULT_CACHE_ROOT / base)
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith("torch/") and name.endswith(".py"):
                target = scratch / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(zf.read(name))
    return scratch / "torch", base


def edit(
    work_dir: Path,
    directory: Path | None = None,
    force: bool = False,
    base: str | None = None,
) -> Path:
    """Check the series of ``base`` (the installed torch's by default) out into
    ``work_dir`` as one commit per patch, on torch ``base``'s pristine sources."""
    base = base or installed_base()
    directory = directory or patches_dir(base)
    work_dir = Path(work_dir).resolve()
    if work_dir.exists() and any(work_dir.iterdir()):
        if not force:
            raise OverlayError(
                f"{work_dir} already exists; refresh it, remove it, or pass --force"
            )
        shutil.rmtree(work_dir)
    with tempfile.TemporaryDirectory() as scratch:
        torch_dir, torch_version = _pristine_torch_dir(base, Path(scratch))
        init_pristine_repo(work_dir, torch_dir, torch_version)
    patches = read_series(directory)
    if patches:
        committer = {k: v for k, v in _IDENTITY.items() if k.startswith("GIT_COMMITTER_")}
        git(
            ["am", "-q", "--keep-cr", "--keep-non-patch", "--committer-date-is-author-date"]
            + [str(p.path.resolve()) for p in patches],
            work_dir,
            env={k: v for k, v in committer.items() if k != "GIT_COMMITTER_DATE"},
        )
    log.info("torch_overlay: %d patches checked out in %s", len(patches), work_dir)
    for group in GROUPS:
        numbers = [i for i, p in enumerate(patches, 1) if p.group == group]
        if numbers:
            log.info(
                "torch_overlay: group %s: commits %d-%d (see NOTE: [Series groups])",
                group,
                numbers[0],
                numbers[-1],
            )
    return work_dir


def regroup(
    names: list[str], old_entries: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """``(name, group)`` for the refreshed patches ``names`` (in order): a patch
    the series had keeps its group, a new one takes the group of the patch before
    it (the first group at the start). Raises OverlayError when the order mixes
    the groups (NOTE: [Series groups])."""
    old = dict(old_entries)
    entries: list[tuple[str, str]] = []
    for name in names:
        group = old.get(name, entries[-1][1] if entries else GROUPS[0])
        if entries and GROUPS.index(group) < GROUPS.index(entries[-1][1]):
            raise OverlayError(
                f"{name} ({group}) comes after {entries[-1][0]} ({entries[-1][1]}) in "
                f"the edit tree; the groups go in the order {', '.join(GROUPS)}: move "
                "its commit before the first commit of the later group "
                "(git rebase -i overlay-base) and refresh again"
            )
        entries.append((name, group))
    return entries


_COUNTER = re.compile(r"^\d{4}-")
SERIES_HEADER = """\
torch_overlay patch series against torch {base}; applied in order.
Two groups, each marked by a `# group:` line (NOTE: [Series groups] in
torch_overlay/_overlay/series.py): the features, then the optional speed-ups.
TORCH_OVERLAY_GROUPS=features serves the features alone."""


def refresh(work_dir: Path, directory: Path | None = None, base: str | None = None) -> list[str]:
    """Rewrite the series of ``base`` (the installed torch's by default) from
    ``overlay-base..HEAD`` of ``work_dir``."""
    base = base or installed_base()
    directory = Path(directory or patches_dir(base))
    work_dir = Path(work_dir).resolve()
    if not (work_dir / ".git").exists():
        raise OverlayError(f"{work_dir} is not an edit tree; run `python -m torch_overlay edit` first")
    status = git(["status", "--porcelain", "--untracked-files=no"], work_dir)
    if status.strip():
        raise OverlayError(
            f"{work_dir} has uncommitted changes; commit them (a new commit is a new "
            "patch, --amend changes the last one) before refresh:\n" + status
        )
    with tempfile.TemporaryDirectory() as out:
        git(
            [
                "format-patch",
                "-q",
                "--zero-commit",
                "--no-signature",
                "--no-numbered",
                "--filename-max-length=100",
                "-o",
                out,
                f"{BASE_TAG}..HEAD",
            ],
            work_dir,
        )
        produced = sorted(Path(out).iterdir())
        names = [_COUNTER.sub("", p.name) for p in produced]
        if len(set(names)) != len(names):
            raise OverlayError("two patches have the same subject; make the subjects unique")
        directory.mkdir(parents=True, exist_ok=True)
        series_file = directory / "series"
        old_entries = (
            parse_series(series_file.read_text(), str(series_file))
            if series_file.exists()
            else []
        )
        entries = regroup(names, old_entries)
        old = set(series_names(directory))
        for src, name in zip(produced, names):
            shutil.copyfile(src, directory / name)
        for stale in old - set(names):
            (directory / stale).unlink(missing_ok=True)
    (directory / "series").write_text(format_series(SERIES_HEADER.format(base=base), entries))
    return names
