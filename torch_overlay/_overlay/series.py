"""The patch set: where it lives, what it contains, and its identity (hash).

The patch set is two things (see ../shared/DESIGN.md, beside the checkout): an
ordered series of ``git format-patch`` files under ``patches/v<base>/`` that
change EXISTING torch files, and mirrored NEW torch modules under
``torch_overlay/`` (``torch/X/y.py`` lives at ``torch_overlay/X/y.py``). This
module reads both without importing torch and without running any tool, so that
activation stays cheap.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.machinery
import logging
import os
import re
from pathlib import Path

from .errors import OverlayError


log = logging.getLogger(__name__)

PACKAGE_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = PACKAGE_DIR.parent

# NOTE: [The compat layer]
# torch_overlay/compat/ holds what only the backport needs: code that makes torch
# 2.7.1 offer an API upstream has in torch itself (today: the extension that adds
# CInterpreter.serialize / deserialize to the class torch._C bound, and the module
# that loads it). It is laid out like torch_overlay/ (compat/X/y.py is served as
# torch.X.y, so the patches that import it need no other name), served by the
# overlay and shipped in the patched wheel with the mirrored modules, and never
# exported upstream: there, torch._C binds the methods itself.
COMPAT_DIR = PACKAGE_DIR / "compat"
# Directories of torch_overlay/ (and of compat/) that hold machinery or C++, not
# mirrored torch modules.
MACHINERY_DIRS = frozenset({"_overlay", "compat", "csrc", "__pycache__"})
MACHINERY_FILES = frozenset({"__init__.py", "__main__.py"})
# Only extensions built for this interpreter are mirrored modules.
EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def base_version() -> str:
    """The torch release the patch set is written against (pinned in one file).

    The primary base: ``.venv``, ``make test``, the patched wheel and the upstream
    export are built on it. The overlay also serves the other supported bases
    (:func:`supported_bases`), each with its own series.
    """
    return (Path(__file__).parent / "base_version.txt").read_text().strip()


# NOTE: [Supported bases]
# The patch set is written against the primary base (base_version.txt) and carried
# to other torch releases (`python -m torch_overlay rebase-check`, then resolved by
# hand in `edit --base X.Y.Z`). A release is a supported base when it has a series,
# patches/vX.Y.Z/series; the overlay serves the series of the installed torch's
# release, and refuses a torch that has none. The mirrored modules and the compat
# layer are shared by all bases: where a base lacks an internal API they use, they
# branch on the version at that one point, with a NOTE saying why.
def _version_key(version: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.+]", version))


def supported_bases() -> list[str]:
    """The torch releases with a series (``patches/v<X.Y.Z>/series``), oldest first."""
    bases = [p.parent.name[1:] for p in (REPO_ROOT / "patches").glob("v*/series")]
    return sorted(bases, key=_version_key)


def installed_base() -> str:
    """The base whose series serves the installed torch: its release when that is a
    supported base, else the primary base (which activation then refuses)."""
    from .importer import find_torch

    try:
        _, version = find_torch()
    except OverlayError:
        return base_version()
    public = version.partition("+")[0]
    return public if public in supported_bases() else base_version()


def patches_dir(base: str | None = None) -> Path:
    """``patches/v<base>``; the installed torch's base by default."""
    override = os.environ.get("TORCH_OVERLAY_PATCHES_DIR")
    if override:
        return Path(override)
    return REPO_ROOT / "patches" / f"v{base or installed_base()}"


# NOTE: [One extension build per base]
# The C++ extension is compiled against one torch's headers and ABI, and every
# build of it has the same file name. The primary base's build lives in place in
# the compat layer (`make ext`, the editable install of .venv); another base's is
# built by `make venv BASE=X.Y.Z` into build/ext/torch-X.Y.Z/ (laid out the same,
# torch_overlay/compat/_functorch/...) and served from there when torch X.Y.Z is
# installed. So neither build overwrites the other and a venv never loads the
# other base's.
def extension_build_dir(base: str) -> Path:
    """Where the compat layer's C++ extension for torch ``base`` is built."""
    if base == base_version():
        return COMPAT_DIR
    return REPO_ROOT / "build" / "ext" / f"torch-{base}" / "torch_overlay" / "compat"


# NOTE: [Series groups]
# A series is two groups, in this order, each marked by a `# group: NAME` line
# before its first patch:
#   features:  what the precompile features need to be correct (guard
#              serialization, packages, aot_compile, functorch interpreter
#              serialization, the AOTAutograd listener...) and the bug fixes they
#              bring; the part bound for upstream, and the part a port to the next
#              torch release must carry.
#   speed-ups: what only makes import, load or a compiled call faster (lazy
#              imports, one-wrapper runtime graphs, per-call shortcuts); optional,
#              applied on top of the features and never needed by them.
# Patches before any marker are features. Each group builds and passes its tests
# at every prefix (the upstream export's bisect), so the features alone are a
# working torch: TORCH_OVERLAY_GROUPS=features makes the overlay, the patched
# wheel and the export serve only them. `refresh` keeps each patch in its group
# and puts a new patch in the group of the patch before it in the edit tree, so a
# new feature commit goes before the first speed-up commit there.
GROUPS = ("features", "speed-ups")
GROUP_DESCRIPTIONS = {
    "features": "what the precompile features need, and bug fixes: bound for upstream",
    "speed-ups": "only faster import, load or calls: optional, after the features",
}
GROUPS_ENV = "TORCH_OVERLAY_GROUPS"
_GROUP_MARKER = re.compile(r"^#\s*group:\s*(\S+)")


@dataclasses.dataclass(frozen=True)
class Patch:
    name: str
    path: Path
    subject: str
    group: str = GROUPS[0]


def _read_subject(path: Path) -> str:
    """The Subject header of a format-patch file, unfolded, without ``[PATCH]``."""
    return read_subject_text(path.read_text(errors="replace"))


def read_subject_text(text: str) -> str:
    """The Subject header of format-patch text, unfolded, without ``[PATCH]``."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Subject:"):
            subject = line[len("Subject:") :].strip()
            for cont in lines[i + 1 :]:
                if not cont.startswith((" ", "\t")):
                    break
                subject += " " + cont.strip()
            return re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
        if not line.strip():
            break
    return "(no subject)"


def parse_series(text: str, where: str = "series") -> list[tuple[str, str]]:
    """``(name, group)`` of every patch of series text, in order (quilt format: one
    a line, ``#`` comments; NOTE: [Series groups] for the ``# group:`` lines)."""
    entries = []
    group, seen = GROUPS[0], []
    for raw in text.splitlines():
        marker = _GROUP_MARKER.match(raw.strip())
        if marker:
            group = marker.group(1)
            if group not in GROUPS:
                raise OverlayError(
                    f"{where}: unknown group {group!r} (groups: {', '.join(GROUPS)})"
                )
            if seen and GROUPS.index(group) <= GROUPS.index(seen[-1]):
                raise OverlayError(
                    f"{where}: group {group!r} comes after {seen[-1]!r}; each group is "
                    f"marked once, in the order {', '.join(GROUPS)}"
                )
            seen.append(group)
            continue
        name = raw.split("#", 1)[0].strip()
        if name:
            entries.append((name, group))
    return entries


def format_series(header: str, entries: list[tuple[str, str]]) -> str:
    """Series text: ``header`` (comment lines), then each group's marker (with its
    description) and patches; the inverse of :func:`parse_series`."""
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    group = None
    for name, entry_group in entries:
        if entry_group != group:
            group = entry_group
            lines += [f"# group: {group}", f"#   {GROUP_DESCRIPTIONS[group]}"]
        lines.append(name)
    return "\n".join(lines) + "\n"


def _series_entries(directory: Path | None = None) -> list[tuple[str, str]]:
    series_file = (directory or patches_dir()) / "series"
    if not series_file.exists():
        return []
    return parse_series(series_file.read_text(), where=str(series_file))


def series_names(directory: Path | None = None) -> list[str]:
    """Patch names in ``series`` order, every group."""
    return [name for name, _ in _series_entries(directory)]


def series_groups(directory: Path | None = None) -> dict[str, list[str]]:
    """Group -> its patch names, in series order (groups without patches left out)."""
    groups: dict[str, list[str]] = {}
    for name, group in _series_entries(directory):
        groups.setdefault(group, []).append(name)
    return groups


def selected_groups() -> tuple[str, ...]:
    """The groups the overlay, the patched wheel and the export serve: every group,
    or the first ones that ``TORCH_OVERLAY_GROUPS`` names (comma-separated; a later
    group needs the earlier ones, so only a leading run of GROUPS is accepted)."""
    raw = os.environ.get(GROUPS_ENV, "").strip()
    if not raw:
        return GROUPS
    wanted = tuple(g.strip() for g in raw.split(",") if g.strip())
    if wanted != GROUPS[: len(wanted)]:
        raise OverlayError(
            f"{GROUPS_ENV}={raw!r}: name the groups from the first on, in order "
            f"({', '.join(GROUPS)}): each group is applied on top of the ones before it"
        )
    return wanted


def read_series(
    directory: Path | None = None, groups: tuple[str, ...] | None = None
) -> list[Patch]:
    """The patches of ``series``, in order; a listed patch that is missing is an
    error. ``groups``: only the patches of these groups (default: every group)."""
    directory = directory or patches_dir()
    patches = []
    for name, group in _series_entries(directory):
        if groups is not None and group not in groups:
            continue
        path = directory / name
        if not path.is_file():
            raise OverlayError(
                f"{directory / 'series'} lists {name}, but {path} does not exist"
            )
        patches.append(Patch(name, path, _read_subject(path), group))
    return patches


def served_series(directory: Path | None = None) -> list[Patch]:
    """The patches the overlay serves and the wheel and export are built from: those
    of :func:`selected_groups`."""
    return read_series(directory, selected_groups())


def mirrored_modules(package_dir: Path | None = None) -> dict[str, Path]:
    """Map ``torch.X.y`` -> ``torch_overlay/X/y.py`` for every mirrored new module."""
    package_dir = package_dir or PACKAGE_DIR
    result: dict[str, Path] = {}
    for root, dirs, files in os.walk(package_dir):
        rel_root = Path(root).relative_to(package_dir)
        if rel_root == Path("."):
            dirs[:] = sorted(d for d in dirs if d not in MACHINERY_DIRS)
        else:
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for fname in sorted(files):
            if fname.endswith(EXTENSION_SUFFIXES):
                # A compiled extension: torch_overlay/X/_n.<abi>.so is torch.X._n
                stem = fname.split(".", 1)[0]
                parts = [*rel_root.parts, stem]
                result[".".join(["torch", *parts])] = Path(root) / fname
                continue
            if not fname.endswith(".py"):
                continue
            if rel_root == Path(".") and fname in MACHINERY_FILES:
                continue
            rel = rel_root / fname
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            result[".".join(["torch", *parts])] = Path(root) / fname
    return result


def compat_modules(base: str | None = None) -> dict[str, Path]:
    """Map ``torch.X.y`` -> ``torch_overlay/compat/X/y.py`` (or its built extension)
    for every backport-only module (see NOTE: [The compat layer]); the extension
    is the build for ``base`` (the installed torch's by default; NOTE: [One
    extension build per base])."""
    if not COMPAT_DIR.is_dir():
        return {}
    ext_dir = extension_build_dir(base or installed_base())
    if ext_dir == COMPAT_DIR:
        return mirrored_modules(COMPAT_DIR)
    modules = {
        name: path
        for name, path in mirrored_modules(COMPAT_DIR).items()
        if not path.name.endswith(EXTENSION_SUFFIXES)
    }
    if ext_dir.is_dir():
        modules.update(
            (name, path)
            for name, path in mirrored_modules(ext_dir).items()
            if path.name.endswith(EXTENSION_SUFFIXES)
        )
    return modules


def served_new_modules(base: str | None = None) -> dict[str, Path]:
    """What the overlay serves and the wheel ships besides the patched files: the
    mirrored new modules and the compat layer's modules."""
    mirrored, compat = mirrored_modules(), compat_modules(base)
    both = sorted(set(mirrored) & set(compat))
    if both:
        raise OverlayError(
            f"{', '.join(both)}: both a mirrored module and a compat module; "
            "a torch module lives in one place"
        )
    return {**mirrored, **compat}


def mirrored_relpath(module_file: Path, package_dir: Path | None = None) -> str:
    """``torch_overlay/X/y.py`` (or ``torch_overlay/compat/X/y.py``) -> ``torch/X/y.py``,
    the path the module has in torch."""
    if package_dir is None:
        package_dir = COMPAT_DIR if module_file.is_relative_to(COMPAT_DIR) else PACKAGE_DIR
    return str(Path("torch") / module_file.relative_to(package_dir))


def _hash_files(paths: tuple[tuple[str, str], ...], base: str) -> str:
    digest = hashlib.sha256(f"base={base}\n".encode())
    for label, path in paths:
        digest.update(label.encode() + b"\0")
        digest.update(Path(path).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


def series_hash(
    directory: Path | None = None,
    base: str | None = None,
    groups: tuple[str, ...] | None = None,
) -> str:
    """Identity of the patch set: the base release, ``series``, every patch served,
    the mirrored new modules, the compat layer and the C++ sources.

    Keys the materialised cache, names the patched wheel and stamps compile
    packages: anything that changes what torch runs changes it. ``base``: the
    release the series is for (the installed torch's base by default); ``groups``:
    the groups served (default :func:`selected_groups`; a subset is hashed apart).
    """
    base = base or installed_base()
    directory = directory or patches_dir(base)
    groups = selected_groups() if groups is None else groups
    series_file = directory / "series"
    entries = []
    if series_file.exists():
        entries.append(("series", str(series_file)))
    entries += [(p.name, str(p.path)) for p in read_series(directory, groups)]
    if groups != GROUPS:
        base = f"{base}\ngroups={','.join(groups)}"
    for name, path in sorted(served_new_modules(base).items()):
        if path.suffix == ".py":
            entries.append((name, str(path)))
    for csrc in (PACKAGE_DIR / "csrc", COMPAT_DIR / "csrc"):
        if csrc.is_dir():
            for path in sorted(csrc.rglob("*")):
                if path.is_file() and path.suffix in (".cpp", ".h", ".patch"):
                    entries.append((str(path.relative_to(PACKAGE_DIR)), str(path)))
    return _hash_files(tuple(entries), base)
