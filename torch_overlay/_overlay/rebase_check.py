"""Carry the patch series onto another torch release and report how each patch fares.

``python -m torch_overlay rebase-check X.Y.Z`` (``make rebase-check BASE=X.Y.Z``)
takes torch X.Y.Z's Python sources from its wheel (downloaded once with pip into
``build/rebase/X.Y.Z/``; only the files the series touches and the mirrored modules'
paths are read out of it), carries every patch of the series onto them by a 3-way
merge against the base release's sources (NOTE: [Carrying the series by 3-way
merge]) and reports, per patch, one of:

* ``clean``: applies as it is, every hunk where the patch says;
* ``offset``: applies, but at other lines, or only through the 3-way merge because
  the context around a hunk changed;
* ``conflict``: the merge conflicts; the conflicting hunks are in the report, each
  marked ``same-lines`` (the patch and the release change a common line),
  ``adjacent`` (they change neighbouring lines) or ``insert-beside`` (the patch only
  adds lines next to the release's change: it could add them elsewhere);
* ``upstream``: the release already has the change (the patch reverse-applies there,
  or every line it adds is already present): a candidate to drop.

It also reports, for every mirrored new module (and compat module), whether the
release already has a module of that name (``torch_overlay/_dynamo/x.py`` is
``torch/_dynamo/x.py``): such a module must be merged with the release's, not added.
The report is JSON (:meth:`RebaseReport.to_json`) and a short table
(:meth:`RebaseReport.table`, :meth:`RebaseReport.markdown`).
"""

# NOTE: [Carrying the series by 3-way merge]
# The series applies in order to the base release: B0 = the base's file, Bk = Bk-1 +
# patch k (applied with materialize.apply_series, as the overlay and the wheel do).
# On the release the carried file starts as T0 = its file, and patch k is carried by
# `git merge-file` with Bk-1 as the merge base, Bk as one side and Tk-1 as the other:
# the change patch k makes is replayed onto whatever the release has. Later patches
# thus apply on top of earlier ones, as in the series. A patch already upstream is
# not carried (Tk = Tk-1: the release's version of the change stays). A conflicting
# patch is carried with its conflicts resolved to the patch's side (`--theirs`),
# as a maintainer keeping the patch would start, so that the patches after it see
# the lines they were written against and report their own state, not its echo.
# The classification looks at Tk-1 itself first: `git apply --check` tells clean
# (every hunk at its line) from offset (hunks moved), and a patch that git apply
# refuses but the merge carries is an offset too (its context changed).

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

from . import materialize, series
from .errors import OverlayError


if TYPE_CHECKING:
    from collections.abc import Iterable


log = logging.getLogger(__name__)

REPORT_FORMAT = 1
TORCH_DIST = "torch"
STATUSES = ("clean", "offset", "conflict", "upstream")
# The kinds of a conflicting hunk (see NOTE: [Which conflicts a patch could avoid]).
HUNK_KINDS = ("same-lines", "adjacent", "insert-beside")
# Where releases' wheels are downloaded (build/rebase/X.Y.Z/) and the base wheel
# that build_scripts/build_wheel.py downloads (build/wheel-src/).
DEFAULT_CACHE_ROOT = series.REPO_ROOT / "build" / "rebase"
DEFAULT_BASE_WHEEL_DIR = series.REPO_ROOT / "build" / "wheel-src"

_HUNK_OFFSET = re.compile(r"^Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)\.", re.MULTILINE)
_CHECKING = re.compile(r"^Checking patch (\S+)\.\.\.$", re.MULTILINE)
_DIFF_GIT = re.compile(r"^diff --git a/(\S+) b/(\S+)$")


class RebaseCheckError(OverlayError):
    """The rebase check cannot run (no wheel for the release, a broken series...)."""


# ---------------------------------------------------------------------------
# Wheels


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


def fetch_torch_wheel(version: str, dest_dir: Path) -> Path:
    """torch ``version``'s wheel for this interpreter, downloaded once into ``dest_dir``
    (``pip download --no-deps --only-binary=:all:``) and reused after."""
    pattern = f"{TORCH_DIST}-{version}-*.whl"
    found = _pick_compatible(sorted(dest_dir.glob(pattern)))
    if found is not None:
        log.info("torch %s wheel already downloaded: %s", version, found)
        return found
    dest_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable, "-m", "pip", "download", f"{TORCH_DIST}=={version}",
            "--no-deps", "--only-binary=:all:", "-d", str(dest_dir),
        ],
        check=True,
    )
    found = _pick_compatible(sorted(dest_dir.glob(pattern)))
    if found is None:
        raise RebaseCheckError(f"pip download left no {pattern} for this interpreter in {dest_dir}")
    return found


def extract_members(wheel: Path, relpaths: set[str], dest: Path) -> set[str]:
    """Copy the members of ``wheel`` named in ``relpaths`` (those it has) under
    ``dest``; return every file name the wheel holds."""
    with zipfile.ZipFile(wheel) as zf:
        names = {n for n in zf.namelist() if not n.endswith("/")}
        for rel in sorted(relpaths & names):
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(rel))
    return names


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


# ---------------------------------------------------------------------------
# Report


@dataclasses.dataclass
class FileResult:
    path: str
    status: str  # one of STATUSES
    offsets: list[dict] = dataclasses.field(default_factory=list)  # {"hunk", "line", "offset"}
    conflicts: list[dict] = dataclasses.field(default_factory=list)  # {"line", "text", "kind"}
    note: str = ""


@dataclasses.dataclass
class PatchResult:
    name: str
    subject: str
    status: str  # one of STATUSES
    how: str
    files: list[FileResult]
    group: str = series.GROUPS[0]  # its series group (NOTE: [Series groups])


@dataclasses.dataclass
class ModuleResult:
    module: str
    path: str  # the module's path in torch: torch/X/y.py
    collides: bool
    existing: list[str]  # the release's files of that module
    identical: bool  # the release's file is byte for byte the mirrored one


@dataclasses.dataclass
class RebaseReport:
    base: str
    target: str
    series_hash: str
    patches: list[PatchResult]
    modules: list[ModuleResult]
    target_wheel: str = ""
    target_wheel_sha256: str = ""

    def summary(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for p in self.patches:
            counts[p.status] += 1
        counts["module_collisions"] = sum(m.collides for m in self.modules)
        return counts

    def group_summary(self) -> dict[str, dict[str, int]]:
        """Per series group (NOTE: [Series groups]), in series order: how many
        patches it has and how many of them carry with each of STATUSES."""
        groups: dict[str, dict[str, int]] = {}
        for p in self.patches:
            counts = groups.setdefault(p.group, {"patches": 0, **dict.fromkeys(STATUSES, 0)})
            counts["patches"] += 1
            counts[p.status] += 1
        return groups

    def to_json(self) -> dict:
        return {
            "format": REPORT_FORMAT,
            "base": self.base,
            "target": self.target,
            "series_hash": self.series_hash,
            "target_wheel": self.target_wheel,
            "target_wheel_sha256": self.target_wheel_sha256,
            "summary": self.summary(),
            "groups": self.group_summary(),
            "patches": [dataclasses.asdict(p) for p in self.patches],
            "modules": [dataclasses.asdict(m) for m in self.modules],
        }

    def _rows(self, group_rows: bool = False) -> list[tuple[str, str, str]]:
        rows = []
        for i, p in enumerate(self.patches):
            if group_rows and (i == 0 or p.group != self.patches[i - 1].group):
                rows.append((f"**group {p.group}**", "", ""))
            rows.append((p.name, p.status, p.how))
        for m in self.modules:
            if m.collides:
                state = "identical" if m.identical else "differs"
                rows.append((m.path, "collides", f"torch {self.target} has it ({state})"))
        return rows

    def hunk_kinds(self) -> dict[str, int]:
        """How many conflicting hunks there are of each of HUNK_KINDS."""
        return count_hunk_kinds(h for p in self.patches for f in p.files for h in f.conflicts)

    def _headline(self) -> str:
        counts = self.summary()
        parts = ", ".join(f"{counts[s]} {s}" for s in STATUSES)
        kinds = self.hunk_kinds()
        return (
            f"torch {self.target} <- series of {self.base} ({len(self.patches)} patches, "
            f"{self.series_hash[:12]}): {parts}; {counts['module_collisions']} of "
            f"{len(self.modules)} mirrored modules collide; {sum(kinds.values())} conflicting "
            f"hunk(s): " + ", ".join(f"{kinds[k]} {k}" for k in HUNK_KINDS)
        )

    def _group_lines(self) -> list[str]:
        return [
            f"group {group} ({counts['patches']} patches): "
            + ", ".join(f"{counts[s]} {s}" for s in STATUSES)
            for group, counts in self.group_summary().items()
        ]

    def table(self) -> str:
        rows = self._rows()
        width = max([len(r[0]) for r in rows] + [5])
        lines = [self._headline(), *self._group_lines(), f"{'patch':<{width}}  {'status':<9}  detail"]
        lines += [f"{name:<{width}}  {status:<9}  {how}" for name, status, how in rows]
        return "\n".join(lines) + "\n"

    def markdown(self) -> str:
        lines = [self._headline(), ""]
        lines += [f"- {line}" for line in self._group_lines()]
        lines += ["", "| patch / module | status | detail |", "|---|---|---|"]
        lines += [
            f"| {name} | {status} | {how} |" if name.startswith("**") else f"| `{name}` | {status} | {how} |"
            for name, status, how in self._rows(group_rows=True)
        ]
        return "\n".join(lines) + "\n"


def _cell(patch: dict) -> str:
    """One patch's state in a release, briefly (for :func:`matrix_markdown`)."""
    if patch["status"] == "conflict":
        files = [f for f in patch["files"] if f["status"] == "conflict"]
        hunks = sum(len(f["conflicts"]) for f in files)
        missing = sum(f["note"] == "missing" for f in files)
        beside = count_hunk_kinds(h for f in files for h in f["conflicts"])["insert-beside"]
        text = f"conflict: {hunks} hunk(s) in {len(files) - missing} file(s)" if hunks else "conflict"
        text += f", {beside} insert-beside" if beside else ""
        return text + (f", {missing} file(s) missing" if missing else "")
    if patch["status"] == "offset":
        return f"offset: {patch['how']}"
    if patch["status"] == "upstream":
        return f"upstream ({patch['how']})"
    return patch["status"]


def matrix_markdown(reports: list[dict]) -> str:
    """One markdown table of several releases' JSON reports: a row per patch and per
    mirrored module that collides somewhere, a column per release."""
    reports = sorted(reports, key=lambda r: [int(x) if x.isdigit() else x for x in r["target"].split(".")])
    header = "| patch / mirrored module | " + " | ".join(f"torch {r['target']}" for r in reports) + " |"
    lines = [header, "|---" * (len(reports) + 1) + "|"]
    by_release = [{p["name"]: p for p in r["patches"]} for r in reports]
    # Reports before the series had groups carry none: their patches are features.
    group_of = {}
    for r in reports:
        for p in r["patches"]:
            group_of[p["name"]] = p.get("group", series.GROUPS[0])
    grouped = any("group" in p for r in reports for p in r["patches"])
    names = list(dict.fromkeys(p["name"] for r in reports for p in r["patches"]))
    names.sort(key=lambda n: series.GROUPS.index(group_of[n]))
    for i, name in enumerate(names):
        if grouped and (i == 0 or group_of[name] != group_of[names[i - 1]]):
            lines.append(f"| **group {group_of[name]}** |" + " |" * len(reports))
        cells = [_cell(patches[name]) if name in patches else "-" for patches in by_release]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    modules = [{m["path"]: m for m in r["modules"]} for r in reports]
    colliding = sorted({m["path"] for r in reports for m in r["modules"] if m["collides"]})
    for path in colliding:
        cells = []
        for release_modules in modules:
            m = release_modules.get(path)
            cells.append(("collides" + (" (identical)" if m["identical"] else "")) if m and m["collides"] else "new")
        lines.append(f"| `{path}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------
# Carrying one patch


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=cwd, capture_output=True, text=True, env=materialize._git_env(cwd)
    )


def _read(path: Path) -> str | None:
    return path.read_text(encoding="utf-8") if path.is_file() else None


def added_lines(patch: Path) -> dict[str, list[str]]:
    """Per file (its path after the patch), the non-blank lines the patch adds."""
    result: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in patch.read_text(encoding="utf-8", errors="replace").splitlines():
        header = _DIFF_GIT.match(line)
        if header:
            current = result.setdefault(header.group(2), [])
        elif current is not None and line.startswith("+") and not line.startswith("+++"):
            if line[1:].strip():
                current.append(line[1:].rstrip())
    return result


def _already_upstream(patch: Path, tree: Path) -> str | None:
    """Why ``patch`` is already in ``tree`` (the release, as carried so far), or None."""
    if _git(["apply", "--reverse", "--check", str(patch)], tree).returncode == 0:
        return "reverse-applies"
    added = added_lines(patch)
    if not any(added.values()):
        return None
    for rel, lines in added.items():
        text = _read(tree / rel)
        present = set(text.rstrip("\n").split("\n")) if text is not None else set()
        if not all(line in present for line in lines):
            return None
    return "every added line present"


def _direct_apply(patch: Path, tree: Path) -> tuple[bool, dict[str, list[dict]]]:
    """Whether ``git apply`` takes ``patch`` on ``tree`` as it is, and the hunks it
    placed at other lines, per file."""
    proc = _git(["apply", "--check", "--verbose", str(patch)], tree)
    offsets: dict[str, list[dict]] = {}
    current = ""
    for line in proc.stderr.splitlines():
        checking = _CHECKING.match(line)
        if checking:
            current = checking.group(1)
            continue
        moved = _HUNK_OFFSET.match(line)
        if moved:
            offsets.setdefault(current, []).append(
                {"hunk": int(moved.group(1)), "line": int(moved.group(2)), "offset": int(moved.group(3))}
            )
    return proc.returncode == 0, offsets


# NOTE: [Which conflicts a patch could avoid]
# A conflict block of `git merge-file --diff3` holds three versions of one region:
# the release's, the base's and the patch's. git calls it a conflict when the two
# changes overlap *or touch*, and those differ for whoever keeps the series:
# - same-lines: a line of the base is changed (replaced or deleted) by both, or one
#   side inserts inside a run of lines the other changes (the release adds a name to
#   an import list the patch deletes). The patch's own edit meets upstream's.
# - adjacent: each side changes lines of its own, next to each other. The patch
#   cannot move its lines either: they are the lines it has to change.
# - insert-beside: the patch only adds lines here, next to the release's change (a
#   function-local import above a line upstream re-annotated, a helper inserted above
#   a def upstream changed). Added elsewhere, the same lines would not meet it.
# Each hunk records its kind, so a port sees which conflicts are real edits to merge
# and which are where the series chose to put new lines.


def _base_edits(base: list[str], side: list[str]) -> tuple[set[int], set[int]]:
    """The lines of ``base`` that ``side`` replaces or deletes (by index), and the
    points where it inserts (index of the base line the insertion precedes)."""
    changed, inserted = set(), set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, base, side, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            changed.update(range(i1, i2))
        elif tag == "insert":
            inserted.add(i1)
    return changed, inserted


def hunk_kind(release: list[str], base: list[str], patch: list[str]) -> str:
    """One of HUNK_KINDS for a conflict block (see NOTE: [Which conflicts a patch could
    avoid])."""
    release_changed, release_inserted = _base_edits(base, release)
    patch_changed, patch_inserted = _base_edits(base, patch)

    def inside(points: set[int], changed: set[int]) -> bool:
        return any(p - 1 in changed and p in changed for p in points)

    if (
        release_changed & patch_changed
        or inside(release_inserted, patch_changed)
        or inside(patch_inserted, release_changed)
    ):
        return "same-lines"
    return "adjacent" if patch_changed else "insert-beside"


def count_hunk_kinds(hunks: Iterable[dict]) -> dict[str, int]:
    """How many of ``hunks`` are of each of HUNK_KINDS (a report written before
    hunks had kinds counts none)."""
    counts = dict.fromkeys(HUNK_KINDS, 0)
    for hunk in hunks:
        if hunk.get("kind") in counts:
            counts[hunk["kind"]] += 1
    return counts


def _conflict_hunks(merged: str) -> list[dict]:
    """The conflict blocks (markers included) of a ``git merge-file --diff3`` result,
    each with its :func:`hunk_kind`."""
    hunks, block, start = [], None, 0
    sections: list[list[str]] = []
    for number, line in enumerate(merged.split("\n"), start=1):
        if line.startswith("<<<<<<< ") and block is None:
            block, start, sections = [line], number, [[]]
        elif block is not None:
            block.append(line)
            if line.startswith(">>>>>>> "):
                release, base, patch = sections
                kind = hunk_kind(release, base, patch)
                hunks.append({"line": start, "text": "\n".join(block), "kind": kind})
                block = None
            elif (len(sections) == 1 and line.startswith("||||||| ")) or (len(sections) == 2 and line == "======="):
                sections.append([])  # a separator, once each: a file's own "=======" is text
            else:
                sections[-1].append(line)
    return hunks


def merge_file(theirs: str, base: str, ours: str, labels: tuple[str, str, str], work: Path):
    """3-way merge with ``git merge-file``: the change ``base`` -> ``ours`` replayed on
    ``theirs``. Returns (merged text favouring ``ours`` in conflicts, conflict hunks)."""
    paths = []
    for name, text in (("theirs", theirs), ("base", base), ("ours", ours)):
        path = work / name
        path.write_text(text, encoding="utf-8")
        paths.append(str(path))
    label_args = [arg for label in labels for arg in ("-L", label)]
    shown = _git(["merge-file", "-p", "--diff3", *label_args, *paths], work)
    if shown.returncode < 0 or shown.returncode > 127:
        raise RebaseCheckError(f"git merge-file failed: {shown.stderr.strip()}")
    if shown.returncode == 0:
        return shown.stdout, []
    resolved = _git(["merge-file", "-p", "--theirs", *label_args, *paths], work)
    return resolved.stdout, _conflict_hunks(shown.stdout)


def _hunks_note(hunks: list[dict]) -> str:
    """"N hunk(s)", and how many of them only insert beside the release's change (see
    NOTE: [Which conflicts a patch could avoid])."""
    beside = count_hunk_kinds(hunks)["insert-beside"]
    return f"{len(hunks)} hunk(s)" + (f", {beside} insert-beside" if beside else "")


def _carry_file(rel: str, before: str | None, after: str | None, target: Path, labels, work: Path):
    """Carry one file's change onto the release tree ``target``; its FileResult."""
    theirs = _read(target / rel)
    dest = target / rel
    if theirs is None and before is not None:
        if after is not None:
            return FileResult(rel, "conflict", note="missing")
        return FileResult(rel, "clean", note="deleted; already absent")
    merged, hunks = merge_file(theirs or "", before or "", after or "", labels, work)
    if after is None and not merged:
        dest.unlink(missing_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(merged, encoding="utf-8")
    if hunks:
        return FileResult(rel, "conflict", conflicts=hunks, note=_hunks_note(hunks))
    return FileResult(rel, "clean")


def carry_patch(patch: series.Patch, base_tree: Path, target_tree: Path, target: str, work: Path) -> PatchResult:
    """Apply ``patch`` to ``base_tree`` and carry it onto ``target_tree`` (NOTE:
    [Carrying the series by 3-way merge]); both trees are rooted where torch/ is."""
    files = materialize.patch_files(patch.path)
    before = {rel: _read(base_tree / rel) for rel in files}
    materialize.apply_series(base_tree, [patch])
    after = {rel: _read(base_tree / rel) for rel in files}
    patch_path = patch.path.resolve()

    upstream = _already_upstream(patch_path, target_tree)
    if upstream is not None:
        results = [FileResult(rel, "upstream") for rel in files]
        return PatchResult(patch.name, patch.subject, "upstream", upstream, results)

    applies, offsets = _direct_apply(patch_path, target_tree)
    labels = (f"torch {target}", "base + earlier patches", f"+ {patch.name}")
    results = [_carry_file(rel, before[rel], after[rel], target_tree, labels, work) for rel in files]
    for result in results:
        result.offsets = offsets.get(result.path, [])
        if result.status == "clean" and (result.offsets or not applies):
            result.status = "offset"
    conflicting = [r for r in results if r.status == "conflict"]
    if conflicting:
        how = ", ".join(f"{r.path} ({r.note})" for r in conflicting)
        return PatchResult(patch.name, patch.subject, "conflict", how, results)
    if not applies:
        return PatchResult(patch.name, patch.subject, "offset", "3-way merge (context changed)", results)
    moved = sum(len(v) for v in offsets.values())
    if moved:
        return PatchResult(patch.name, patch.subject, "offset", f"{moved} hunk(s) at other lines", results)
    return PatchResult(patch.name, patch.subject, "clean", "", results)


def carry_series(patches: list[series.Patch], base_tree: Path, target_tree: Path, target: str) -> list[PatchResult]:
    """Carry every patch, in order, from ``base_tree`` onto ``target_tree`` (both
    modified in place)."""
    with tempfile.TemporaryDirectory(prefix="rebase-merge-") as work:
        results = [carry_patch(p, base_tree, target_tree, target, Path(work)) for p in patches]
    for patch, result in zip(patches, results):
        result.group = patch.group
    return results


# ---------------------------------------------------------------------------
# Mirrored modules


def module_paths(module: str, source: Path) -> tuple[str, ...]:
    """The file names a release could hold module ``module`` (torch.X.y) under."""
    rel = "/".join(module.split("."))
    if source.name == "__init__.py":
        return (f"{rel}/__init__.py",)
    return (f"{rel}.py", f"{rel}/__init__.py")


def check_modules(modules: dict[str, Path], names: set[str], read_member) -> list[ModuleResult]:
    """For every mirrored module (``torch.X.y`` -> its file), whether a release holding
    the files ``names`` already has it; ``read_member(name)`` reads one of them."""
    results = []
    for module, source in sorted(modules.items()):
        if source.suffix == ".py":
            existing = [n for n in module_paths(module, source) if n in names]
        else:  # an extension: any build of it (torch/X/_n.<abi>.so)
            stem = "/".join(module.split("."))
            existing = sorted(n for n in names if n.startswith(stem + ".") and not n.endswith(".py"))
        identical = len(existing) == 1 and read_member(existing[0]) == source.read_bytes()
        if source.suffix == ".py":
            rel = module_paths(module, source)[0]
        else:
            rel = "/".join(module.split(".")[:-1] + [source.name])
        results.append(ModuleResult(module, rel, bool(existing), existing, identical))
    return results


# ---------------------------------------------------------------------------
# The whole check


def check_release(
    target: str,
    target_wheel: Path,
    base_wheel: Path,
    patches: list[series.Patch],
    modules: dict[str, Path],
    sources_dir: Path | None = None,
) -> RebaseReport:
    """Carry ``patches`` from ``base_wheel``'s sources onto ``target_wheel``'s and check
    ``modules`` against it. The carried files are left under ``sources_dir`` if given."""
    touched = {rel for p in patches for rel in materialize.patch_files(p.path)}
    with tempfile.TemporaryDirectory(prefix="rebase-check-") as tmp:
        base_tree, target_tree = Path(tmp) / "base", Path(tmp) / "target"
        base_tree.mkdir()
        target_tree.mkdir()
        extract_members(base_wheel, touched, base_tree)
        names = extract_members(target_wheel, touched, target_tree)
        results = carry_series(patches, base_tree, target_tree, target)
        if sources_dir is not None:
            shutil.rmtree(sources_dir, ignore_errors=True)
            shutil.copytree(target_tree, sources_dir)
    with zipfile.ZipFile(target_wheel) as zf:
        module_results = check_modules(modules, names, zf.read)
    return RebaseReport(
        base=series.base_version(),
        target=target,
        series_hash=series.series_hash(groups=series.GROUPS),
        patches=results,
        modules=module_results,
        target_wheel=target_wheel.name,
        target_wheel_sha256=_file_sha256(target_wheel),
    )


def run(target: str, cache_root: Path, base_wheel_dir: Path, json_path: Path | None, markdown_path: Path | None) -> RebaseReport:
    """Download what is missing, check ``target`` and write the reports."""
    base = series.base_version()
    if target == base:
        raise RebaseCheckError(f"torch {target} is the series' own base; nothing to carry")
    base_wheel = fetch_torch_wheel(base, base_wheel_dir)
    target_wheel = fetch_torch_wheel(target, cache_root / target)
    report = check_release(
        target,
        target_wheel,
        base_wheel,
        series.read_series(),
        series.served_new_modules(),
        sources_dir=cache_root / target / "carried",
    )
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report.to_json(), indent=1, sort_keys=True) + "\n")
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(report.markdown())
    return report
