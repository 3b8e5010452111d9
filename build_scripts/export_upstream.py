"""Export the patch set as a ``git am`` series for the pytorch repository at its base tag.

The export is what an upstream reviewer applies: ``git am`` on a pytorch checkout
at ``v<base>`` (``torch_overlay/_overlay/base_version.txt``), one commit per
upstream pull request. It is built in a scratch git repository whose first commit
is the installed torch's pristine Python sources at ``torch/`` (tag
``overlay-base``). The patches of ``patches/v<base>/series`` are grouped into
commits by the pull request their DEP-3 Origin line cites (see NOTE: [One commit
per upstream PR]); each commit also adds the new files the ownership file
``patches/v<base>/export.toml`` declares for its patches: mirrored new modules
(``torch_overlay/X/y.py`` becomes ``torch/X/y.py``), upstream-style tests
(``test/dynamo/...``) and C++ (``torch_overlay/csrc/<path>`` is ``<path>``,
``torch_overlay/csrc/<path>.patch`` changes ``<path>``; see NOTE: [C++ in the
upstream export]). The message of each commit is upstream PR style: a tagged
title, the summary, and a Test Plan naming the tests it adds; the DEP-3 headers
stay in patches/.

``overlay-base..HEAD`` is then written with ``git format-patch`` into ``--out`` as
numbered ``NNNN-*.patch`` files, with a ``series`` file and a ``README.txt``.

``--check`` (what CI runs after the export) applies the exported series to a plain
copy of the pristine sources with ``git apply``, one patch at a time, then ``git
am``'s it onto a fresh repository of the same sources, and then proves every prefix
of it bisectable (build_scripts/export_bisect.py): torch imports with it, so do the
modules it adds, and the tests it adds pass.

# NOTE: [Upstream export base]
# The base is the installed torch wheel's Python sources, not a pytorch git tree
# (nothing here can fetch one). A patch that applies to the wheel's copy of a file
# applies to the checkout at the tag; new files (mirrored modules, tests, C++
# sources) are additions and need no base at all. The exception is a change to a
# C++ file the wheel does not ship (the init.cpp binding), described in NOTE: [C++
# in the upstream export]. The compat layer (torch_overlay/compat/) is never part
# of the export.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from torch_overlay._overlay import importer, series, workflow
from torch_overlay._overlay.errors import OverlayError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_bisect


log = logging.getLogger(__name__)

DEFAULT_OUT = series.REPO_ROOT / "build" / "upstream-export"
TEST_DIR = series.REPO_ROOT / "test"
CSRC_DIR = series.PACKAGE_DIR / "csrc"
# The ownership file, next to the series it describes.
OWNERSHIP_FILE = "export.toml"
# Under test/ but not upstream material: the overlay machinery's tests (import
# hook, cache, this export) and the conftest that checks which torch is served.
TEST_EXCLUDED = ("overlay", "conftest.py")
# What the ownership file may declare per patch, and per pull request.
FILE_KINDS = ("modules", "tests", "csrc")
PR_FIELDS = ("title", "summary")
# `compat = true` on a patch: backport-only glue (NOTE: [Compat patches]).
COMPAT_FIELD = "compat"
# Upstream's subsystem tags; every exported title starts with one.
TITLE_TAGS = ("[dynamo]", "[functorch]", "[aotautograd]", "[inductor]", "[decomp]", "[fx]")
# DEP-3 (https://dep-team.pages.debian.net/deps/dep3/) header fields: the patch
# bookkeeping of patches/, never part of an exported message.
DEP3_LINE = re.compile(
    r"^(Description|Subject|Origin|Bug(-[A-Za-z]+)?|Forwarded|Author|From|"
    r"Reviewed-by|Acked-by|Last-Update|Applied-Upstream):"
)
# A pull request an Origin line cites: ".../pytorch/pytorch/pull/NNN" or "pytorch#NNN"
# (issues, ".../issues/NNN", are not pull requests).
ORIGIN_PR = re.compile(r"github\.com/pytorch/pytorch/pull/(\d+)|\bpytorch#(\d+)")
# Who commits in the scratch repositories; authorship comes from the patches.
_COMMITTER = {
    "GIT_COMMITTER_NAME": "torch_overlay",
    "GIT_COMMITTER_EMAIL": "torch_overlay@localhost",
}


def _pristine_torch() -> tuple[Path, str]:
    """(installed ``torch/`` directory, its version), refusing anything but the base."""
    torch_root, torch_version = importer.find_torch()
    importer.check_torch_version(torch_version, str(torch_root / "torch"))
    return torch_root / "torch", torch_version


def _git_am(repo: Path, patches: list[Path], exclude: list[str] = ()) -> None:
    # --keep-non-patch: the subject keeps its "[dynamo]" tag; only "[PATCH n/m]" goes.
    workflow.git(
        [
            "am",
            "-q",
            "--keep-non-patch",
            "--committer-date-is-author-date",
            *(f"--exclude={rel}" for rel in exclude),
            *map(str, patches),
        ],
        repo,
        env=_COMMITTER,
    )


def mirrored_module_files() -> dict[str, Path]:
    """``torch/X/y.py`` -> ``torch_overlay/X/y.py`` for every mirrored new module."""
    # Compiled extensions are build outputs; the C++ is exported from csrc/ (see
    # NOTE: [C++ in the upstream export]), never the binary. The compat layer is
    # not mirrored and never exported (NOTE: [The compat layer]).
    files = {
        series.mirrored_relpath(path): path
        for path in series.mirrored_modules().values()
        if path.suffix == ".py"
    }
    return dict(sorted(files.items()))


def upstream_test_files(test_dir: Path | None = None) -> dict[str, Path]:
    """``test/dynamo/test_x.py`` -> its file, for every test that goes upstream."""
    test_dir = test_dir or TEST_DIR
    files = {}
    for root, dirs, names in os.walk(test_dir):
        rel_root = Path(root).relative_to(test_dir)
        dirs[:] = sorted(
            d
            for d in dirs
            if d != "__pycache__"
            and not d.startswith(".")
            and not (rel_root == Path(".") and d in TEST_EXCLUDED)
        )
        for name in sorted(names):
            if name.startswith(".") or name.endswith((".pyc", ".pyo")):
                continue
            if rel_root == Path(".") and name in TEST_EXCLUDED:
                continue
            files[str(Path("test") / rel_root / name)] = Path(root) / name
    return dict(sorted(files.items()))


# NOTE: [C++ in the upstream export]
# C++ follows the rule of the Python modules: a file under torch_overlay/csrc/ sits
# at its upstream path and is exported there, and a change to an existing
# upstream file is a patch, torch_overlay/csrc/<path>.patch (a git format-patch
# of <path> against the base release, written with git from that file's text).
# Nothing here names a destination; export.toml says which commit each belongs to
# (the C++ of the functorch interpreters goes with pytorch#152616, whose Python
# half calls the binding).
#   * New files (aten/src/ATen/functorch/InterpreterSerialization.{h,cpp}) are
#     added by their commit like the Python ones.
#   * A patch of a file the export base has is applied into its commit. One of a
#     file the base lacks (torch/csrc/functorch/init.cpp: the wheel ships no .cpp)
#     cannot be applied in the scratch repository: its diff is appended to its
#     commit's exported patch text (with the diffstat redone), so the exported
#     commit is still one commit. --check applies everything else of that commit
#     (git apply/am --exclude) and proves of the rest that it adds upstream what
#     the compat layer adds to torch 2.7.1 (check_unapplied_csrc_diff), so the
#     exported binding is the one the tests ran against.
CSRC_PATCH_SUFFIX = ".patch"
COMPAT_CSRC_DIR = series.COMPAT_DIR / "csrc"


def csrc_new_files() -> dict[str, Path]:
    """Upstream path -> file, for every new C++ file under torch_overlay/csrc/."""
    if not CSRC_DIR.is_dir():
        return {}
    return {
        str(path.relative_to(CSRC_DIR)): path
        for path in sorted(CSRC_DIR.rglob("*"))
        if path.is_file()
        and path.suffix != CSRC_PATCH_SUFFIX
        and "__pycache__" not in path.parts
    }


def csrc_patches() -> dict[str, Path]:
    """Upstream path -> the patch changing it, for every torch_overlay/csrc/<path>.patch."""
    if not CSRC_DIR.is_dir():
        return {}
    patches = {}
    for path in sorted(CSRC_DIR.rglob(f"*{CSRC_PATCH_SUFFIX}")):
        rel = str(path.relative_to(CSRC_DIR))[: -len(CSRC_PATCH_SUFFIX)]
        touched = re.findall(
            r"^diff --git a/(\S+) b/", path.read_text(), flags=re.MULTILINE
        )
        if touched != [rel]:
            raise OverlayError(
                f"{path}: a csrc patch changes exactly the file it is named after "
                f"({rel}); it changes {touched}"
            )
        patches[rel] = path
    return patches


def file_diffs(patch_text: str) -> dict[str, str]:
    """Path -> its ``diff --git`` section, for every file a patch text changes."""
    body = patch_text[patch_text.index("\ndiff --git ") + 1 :]
    # format-patch's signature ("-- " then the git version) ends the last section.
    body = re.split(r"^-- \n", body, maxsplit=1, flags=re.MULTILINE)[0]
    sections = re.split(r"^(?=diff --git )", body, flags=re.MULTILINE)
    return {re.match(r"diff --git a/\S+ b/(\S+)", s).group(1): s for s in sections if s}


def _hunk_lines(diff_text: str) -> tuple[list[str], list[str]]:
    """(removed, added) lines of a one-file diff, without their +/- marks."""
    body = diff_text[diff_text.index("\n@@ ") :].splitlines()
    removed = [
        line[1:] for line in body if line.startswith("-") and not line.startswith("---")
    ]
    added = [
        line[1:] for line in body if line.startswith("+") and not line.startswith("+++")
    ]
    return removed, added


def _compat_csrc_lines() -> list[str]:
    lines = []
    for path in sorted(COMPAT_CSRC_DIR.rglob("*")):
        if path.suffix in (".cpp", ".h"):
            lines += [line.strip() for line in path.read_text().splitlines()]
    return lines


def check_unapplied_csrc_diff(name: str, diff_text: str) -> None:
    """What can be checked of a C++ diff whose file the base lacks: every line it
    adds is, in the same order, a line of the compat layer's C++ (a removed line
    that comes back to continue a statement, e.g. a .def chain losing its ';',
    aside). The upstream change is then the one the backport builds and tests."""
    removed, added = _hunk_lines(diff_text)
    continued = {line.rstrip(";") for line in removed}
    compat = iter(_compat_csrc_lines())
    for line in added:
        if line in continued:
            continue
        if line.strip() and line.strip() not in compat:
            raise OverlayError(
                f"{name}: it adds {line.strip()!r}, which the compat layer's C++ "
                f"({COMPAT_CSRC_DIR.relative_to(series.REPO_ROOT)}) does not add at that "
                "point: the exported change would not be the one the backport tests"
            )


# NOTE: [One commit per upstream PR]
# A reviewer takes the export as the pull requests it backports, each one commit
# that imports and passes its own tests on its own (`make export-check` proves it
# for every prefix). The grouping comes from the patches' DEP-3 Origin lines: a
# patch belongs to the first pull request its Origin cites; a patch citing none
# (our own changes, such as the load-time lazy imports) is a commit by itself.
# The new files a commit needs (modules, tests, C++) come from export.toml,
# declared per patch: every file is owned exactly once, so a new module nobody
# declares fails the export instead of going missing from it. Messages are
# upstream PR style (tagged title, summary, "Test Plan:"); the DEP-3 lines that
# keep patches/ honest about provenance are not part of them.


@dataclasses.dataclass
class PatchInfo:
    """A series patch as the export reads it."""

    patch: series.Patch
    description: str  # the message body without its DEP-3 lines
    pr: int | None  # the first pull request its Origin line cites


@dataclasses.dataclass
class ExportCommit:
    """One exported commit: the patches of one pull request (or one patch of
    ours) and the new files they own, by kind (see FILE_KINDS)."""

    pr: int | None
    patches: list[PatchInfo]
    files: dict[str, dict[str, Path]]
    title: str
    summary: str

    @property
    def group(self) -> str:
        """The series group of its patches (NOTE: [Series groups])."""
        return self.patches[0].patch.group

    @property
    def tests(self) -> list[str]:
        return sorted(rel for rel in self.files["tests"] if rel.endswith(".py"))

    def message(self) -> str:
        if self.tests:
            plan = ["python -m pytest " + " ".join(self.tests)]
        else:
            plan = [
                "No tests of its own: the existing tests of the code it changes cover it."
            ]
        return "\n".join(
            [self.title, "", self.summary.strip(), "", "Test Plan:", *plan, ""]
        )


def read_patch_info(patch: series.Patch) -> PatchInfo:
    """The description and pull request of a series patch (its message body)."""
    text = patch.path.read_text()
    header_end = text.index("\n\n")
    body = text[header_end + 2 : text.index("\n---\n", header_end)]
    description = [line for line in body.splitlines() if not DEP3_LINE.match(line)]
    origin = " ".join(line for line in body.splitlines() if line.startswith("Origin:"))
    cited = [int(a or b) for a, b in ORIGIN_PR.findall(origin)]
    return PatchInfo(patch, "\n".join(description).strip(), cited[0] if cited else None)


def ownership_file(directory: Path | None = None) -> Path:
    return (directory or series.patches_dir()) / OWNERSHIP_FILE


def load_ownership(
    path: Path,
) -> tuple[dict[str, dict[str, list[str]]], dict[int, dict[str, str]]]:
    """(patch name -> kind -> upstream paths, pull request -> title/summary)."""
    if not path.is_file():
        return {}, {}
    data = tomllib.loads(path.read_text())
    unknown = set(data) - {"patches", "pr"}
    if unknown:
        raise OverlayError(
            f'{path}: unknown tables {sorted(unknown)}; use [patches."<name>"] and [pr.NNN]'
        )
    owned = {}
    for name, fields in data.get("patches", {}).items():
        bad = set(fields) - set(FILE_KINDS) - {COMPAT_FIELD}
        if bad:
            raise OverlayError(
                f"{path}: patch {name} declares {sorted(bad)}; the kinds are "
                f"{FILE_KINDS}, plus {COMPAT_FIELD} = true"
            )
        if COMPAT_FIELD in fields:
            _check_compat_declaration(path, name, fields)
            continue
        owned[name] = {kind: list(fields.get(kind, [])) for kind in FILE_KINDS}
    prs = {}
    for number, fields in data.get("pr", {}).items():
        bad = set(fields) - set(PR_FIELDS)
        if bad or not str(number).isdigit():
            raise OverlayError(
                f"{path}: [pr.{number}] must be a PR number with {PR_FIELDS}"
            )
        prs[int(number)] = dict(fields)
    return owned, prs


# NOTE: [Compat patches]
# A patch marked `compat = true` in export.toml is backport-only glue that
# torch 2.7.1 needs and upstream never will (e.g. importing the companion
# extension that attaches CInterpreter.serialize at import torch). The overlay
# and the wheel apply it like any patch; the export leaves it out, so neither
# the exported commits nor export-check's prefix bisection ever see it. It owns
# no new files, and it comes after every exported patch of its series group
# (NOTE: [Series groups]), so that each exported prefix of a group is what the
# overlay tested up to that point; a later group's prefixes get the compat
# layer's C++ bindings from export_bisect.py (NOTE: [Bisecting the export]).
def _check_compat_declaration(path: Path, name: str, fields: dict) -> None:
    if fields[COMPAT_FIELD] is not True:
        raise OverlayError(
            f"{path}: patch {name}: {COMPAT_FIELD} must be true (or left out), "
            f"not {fields[COMPAT_FIELD]!r}"
        )
    kinds = sorted(kind for kind in FILE_KINDS if fields.get(kind))
    if kinds:
        raise OverlayError(
            f"{path}: compat patch {name} declares {kinds}; a compat patch is never "
            "exported, so it owns no new files"
        )


def compat_patch_names(path: Path) -> set[str]:
    """The patches export.toml marks ``compat = true`` (never exported)."""
    if not path.is_file():
        return set()
    patches = tomllib.loads(path.read_text()).get("patches", {})
    return {name for name, fields in patches.items() if fields.get(COMPAT_FIELD)}


def exported_patches(
    patches: list[series.Patch], compat: set[str], all_names: set[str] | None = None
) -> list[series.Patch]:
    """``patches`` without the compat ones, which must come last in their group.
    ``all_names``: every patch of the series (``patches`` may be some groups)."""
    unknown = sorted(compat - (all_names or {p.name for p in patches}))
    if unknown:
        raise OverlayError(
            f"{OWNERSHIP_FILE} marks {unknown} compat, which the series does not list"
        )
    for group in series.GROUPS:
        names = [p.name for p in patches if p.group == group]
        first_compat = min((names.index(n) for n in compat if n in names), default=len(names))
        late = [n for n in names[first_compat:] if n not in compat]
        if late:
            raise OverlayError(
                f"{late} come after the compat patch {names[first_compat]} in the "
                f"series group {group}; compat patches (never exported) must be the "
                "last ones of their group"
            )
    return [p for p in patches if p.name not in compat]


def exportable_files() -> dict[str, dict[str, Path]]:
    """Every new file the export carries, by kind: upstream path -> source."""
    csrc = {**csrc_new_files(), **csrc_patches()}
    return {
        "modules": mirrored_module_files(),
        "tests": upstream_test_files(),
        "csrc": csrc,
    }


def assign_files(
    declared: dict[str, dict[str, list[str]]],
    patch_names: list[str],
    available: dict[str, dict[str, Path]],
    where: str = OWNERSHIP_FILE,
) -> dict[str, dict[str, dict[str, Path]]]:
    """Patch name -> kind -> {upstream path: source}; every available file owned
    exactly once, every declaration naming a patch of the series and a file that
    exists. Raises OverlayError naming what is wrong."""
    unknown_patches = sorted(set(declared) - set(patch_names))
    if unknown_patches:
        raise OverlayError(
            f"{where} declares files for {unknown_patches}, which the series does not list"
        )
    owner: dict[tuple[str, str], str] = {}
    owned = {name: {kind: {} for kind in FILE_KINDS} for name in patch_names}
    for name, kinds in declared.items():
        for kind, paths in kinds.items():
            for rel in paths:
                if rel not in available[kind]:
                    raise OverlayError(
                        f"{where}: {name} declares {kind} {rel}, which is not a new file "
                        f"of the project (known {kind}: {sorted(available[kind])})"
                    )
                if (kind, rel) in owner:
                    raise OverlayError(
                        f"{where}: {rel} is owned twice, by {owner[kind, rel]} and by "
                        f"{name}; a new file belongs to exactly one patch"
                    )
                owner[kind, rel] = name
                owned[name][kind][rel] = available[kind][rel]
    undeclared = sorted(
        rel
        for kind, files in available.items()
        for rel in files
        if (kind, rel) not in owner
    )
    if undeclared:
        raise OverlayError(
            f"new files that no patch owns: {undeclared}; declare each under the patch "
            f"that needs it in {where} (see NOTE: [One commit per upstream PR])"
        )
    return owned


def group_commits(
    infos: list[PatchInfo],
    owned: dict[str, dict[str, dict[str, Path]]],
    pr_fields: dict[int, dict[str, str]],
) -> list[ExportCommit]:
    """The export's commits in series order: consecutive patches of one pull
    request together, a patch citing no pull request alone."""
    commits: list[ExportCommit] = []
    for info in infos:
        if (
            info.pr is not None
            and commits
            and commits[-1].pr == info.pr
            and commits[-1].group == info.patch.group
        ):
            commits[-1].patches.append(info)
        else:
            if info.pr is not None and any(c.pr == info.pr for c in commits):
                raise OverlayError(
                    f"{info.patch.name} belongs to pytorch#{info.pr}, whose other patches "
                    "are not right before it in the series (or are in another group): a "
                    "pull request is one commit, so its patches must be consecutive"
                )
            commits.append(
                ExportCommit(info.pr, [info], {k: {} for k in FILE_KINDS}, "", "")
            )
        for kind in FILE_KINDS:
            commits[-1].files[kind].update(owned[info.patch.name][kind])
    for commit in commits:
        fields = pr_fields.get(commit.pr, {})
        commit.title = fields.get("title", commit.patches[0].patch.subject)
        commit.summary = fields.get(
            "summary", "\n\n".join(info.description for info in commit.patches)
        )
        if not commit.title.startswith(TITLE_TAGS):
            raise OverlayError(
                f"exported title {commit.title!r} has none of upstream's tags {TITLE_TAGS}"
            )
    unused = sorted(set(pr_fields) - {c.pr for c in commits})
    if unused:
        raise OverlayError(
            f"{OWNERSHIP_FILE} has [pr.N] for {unused}, which no patch cites"
        )
    return commits


def plan_export(directory: Path | None = None) -> list[ExportCommit]:
    """The export's commits, from the series (the groups it serves: NOTE: [Series
    groups]), its ownership file and the new files."""
    path = ownership_file(directory)
    every = {p.name for p in series.read_series(directory)}
    served = series.served_series(directory)
    patches = exported_patches(served, compat_patch_names(path), every)
    declared, pr_fields = load_ownership(path)
    # A group left out (TORCH_OVERLAY_GROUPS) takes its patches' new files with it.
    left_out = every - {p.name for p in served}
    dropped = _files_of(declared, left_out)
    declared = {name: kinds for name, kinds in declared.items() if name not in left_out}
    available = {
        kind: {rel: src for rel, src in files.items() if (kind, rel) not in dropped}
        for kind, files in exportable_files().items()
    }
    pr_fields = {
        pr: fields
        for pr, fields in pr_fields.items()
        if any(read_patch_info(p).pr == pr for p in patches) or not left_out
    }
    owned = assign_files(declared, [p.name for p in patches], available)
    return group_commits([read_patch_info(p) for p in patches], owned, pr_fields)


def _files_of(declared: dict[str, dict[str, list[str]]], names: set[str]) -> set[tuple[str, str]]:
    """``(kind, path)`` of every new file export.toml gives the patches ``names``."""
    return {
        (kind, rel)
        for name in names
        for kind, paths in declared.get(name, {}).items()
        for rel in paths
    }


def _copy_new_files(repo: Path, files: dict[str, Path]) -> None:
    for rel, src in files.items():
        dest = repo / rel
        if dest.exists():
            raise OverlayError(
                f"{src} would be added upstream as {rel}, but the base already has "
                "that file; change it through a patch instead"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)


def _author_env(repo: Path, first: str, last: str) -> dict[str, str]:
    """The first patch's author, at the last patch's date."""
    name, email = (
        workflow.git(["log", "-1", "--format=%an%x00%ae", first], repo)
        .strip()
        .split("\0")
    )
    date = workflow.git(["log", "-1", "--format=%aI", last], repo).strip()
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_DATE": date,
        **_COMMITTER,
    }


def commit_export(repo: Path, commit: ExportCommit) -> dict[str, Path]:
    """Make ``commit`` in ``repo``: its patches, its new files and the C++ changes
    the base can take, squashed with its message. Returns the C++ patches left
    unapplied (of files the base lacks; see NOTE: [C++ in the upstream export])."""
    start = workflow.git(["rev-parse", "HEAD"], repo).strip()
    _git_am(repo, [info.patch.path.resolve() for info in commit.patches])
    applied = workflow.git(["rev-list", "--reverse", f"{start}..HEAD"], repo).split()
    env = _author_env(repo, applied[0], applied[-1])
    new = {
        rel: src
        for kind, files in commit.files.items()
        for rel, src in files.items()
        if not (kind == "csrc" and src.suffix == CSRC_PATCH_SUFFIX)
    }
    _copy_new_files(repo, new)
    unapplied = {}
    for rel, src in commit.files["csrc"].items():
        if src.suffix != CSRC_PATCH_SUFFIX:
            continue
        if (repo / rel).exists():
            workflow.git(["apply", str(src)], repo)
            new[rel] = src
        else:
            unapplied[rel] = src
    workflow.git(["reset", "-q", "--soft", start], repo)
    if new:
        workflow.git(["add", "--", *new], repo)
    with tempfile.NamedTemporaryFile("w", suffix=".msg", delete=False) as fh:
        fh.write(commit.message())
    try:
        workflow.git(["commit", "-q", "-F", fh.name], repo, env=env)
    finally:
        os.unlink(fh.name)
    return unapplied


def build_export_repo(
    repo: Path, commits: list[ExportCommit]
) -> dict[int, dict[str, Path]]:
    """Build the scratch repository; return, per commit index, its C++ patches of
    files the base lacks (they join that commit's exported text)."""
    torch_dir, torch_version = _pristine_torch()
    workflow.init_pristine_repo(repo, torch_dir, torch_version)
    unapplied = {}
    for index, commit in enumerate(commits):
        left = commit_export(repo, commit)
        if left:
            unapplied[index] = left
    return unapplied


def append_diffs(repo: Path, patch_text: str, diffs: list[str]) -> str:
    """``patch_text`` with ``diffs`` appended and its diffstat redone."""
    head, rest = patch_text.split("\n---\n", 1)
    body = rest[rest.index("diff --git ") :].rstrip("\n") + "\n" + "".join(diffs)
    proc = subprocess.run(
        ["git", "apply", "--stat", "--summary", "-"],
        cwd=repo,
        input=body,
        capture_output=True,
        text=True,
        check=True,
    )
    stat = proc.stdout
    return f"{head}\n---\n{stat}\n{body}"


def _readme(names: list[str], base: str, commits: list[ExportCommit]) -> str:
    lines = [
        f"torch_overlay upstream export: the patch set as a git am series for pytorch v{base},",
        "one commit per upstream pull request it backports (and one per change of ours",
        "that has none), each with the new modules, tests and C++ it owns",
        f"(patches/v{base}/export.toml in torch_overlay).",
        "",
        f"Apply on a pytorch checkout at tag v{base}:",
        "",
        f"    git -C pytorch checkout v{base}",
        "    git -C pytorch am --keep-non-patch /path/to/upstream-export/[0-9]*.patch",
        "",
        "(`series` lists the same patches in order; --keep-non-patch keeps the subjects'",
        "[dynamo]-style tags.)",
        "",
        "`make export-check` (build_scripts/export_upstream.py --check) proves it applies",
        f"to the torch {base} wheel's sources (git apply patch by patch, then git am) and",
        "that every prefix imports and passes the tests it adds (export_bisect.py).",
        "",
        "Commits:",
    ]
    group = None
    for name, commit in zip(names, commits):
        if commit.group != group:
            group = commit.group
            lines.append(f"  group {group}: {series.GROUP_DESCRIPTIONS[group]}")
        pr = f"pytorch#{commit.pr}" if commit.pr else "no upstream PR"
        lines.append(f"    {name}  ({pr})")
    return "\n".join(lines) + "\n"


def _format_patches(repo: Path, out_dir: Path) -> list[str]:
    workflow.git(
        [
            "format-patch",
            "-q",
            "--zero-commit",
            "--no-signature",
            "--filename-max-length=100",
            "-o",
            str(out_dir),
            f"{workflow.BASE_TAG}..HEAD",
        ],
        repo,
    )
    return [p.name for p in sorted(out_dir.glob("*.patch"))]


def export(out: Path) -> list[Path]:
    """Write the series into ``out``; return the patch files in order."""
    out = Path(out).resolve()
    commits = plan_export()
    with tempfile.TemporaryDirectory(prefix="torch_overlay-export-") as scratch:
        repo = Path(scratch) / "pytorch"
        unapplied = build_export_repo(repo, commits)
        produced_dir = Path(scratch) / "patches"
        names = _format_patches(repo, produced_dir)
        out.mkdir(parents=True, exist_ok=True)
        for stale in [*out.glob("*.patch"), out / "series", out / "README.txt"]:
            stale.unlink(missing_ok=True)
        for index, name in enumerate(names):
            text = (produced_dir / name).read_text()
            left = unapplied.get(index, {})
            if left:
                diffs = [file_diffs(p.read_text())[rel] for rel, p in left.items()]
                text = append_diffs(repo, text, diffs)
            (out / name).write_text(text)
    base = series.base_version()
    (out / "series").write_text(
        series.format_series(
            f"git am series for pytorch v{base}, generated by export_upstream.py",
            [(name, commit.group) for name, commit in zip(names, commits)],
        )
    )
    (out / "README.txt").write_text(_readme(names, base, commits))
    log.info("export_upstream: wrote %d commits to %s", len(names), out)
    return [out / name for name in names]


def _unapplied_diffs(
    patches: list[series.Patch], tree: Path
) -> dict[str, dict[str, str]]:
    """Patch name -> {path: diff} for the C++ changes of files the base lacks
    (see NOTE: [C++ in the upstream export]), each checked against the compat layer."""
    missing = [rel for rel in csrc_patches() if not (tree / rel).exists()]
    found = {}
    for patch in patches:
        diffs = file_diffs(patch.path.read_text())
        left = {rel: diffs[rel] for rel in missing if rel in diffs}
        for rel, diff in left.items():
            check_unapplied_csrc_diff(patch.name, diff)
            log.info(
                "export_upstream: %s: %s not applied (the base has no such file); it "
                "adds what the compat layer adds: ok",
                patch.name,
                rel,
            )
        if left:
            found[patch.name] = left
    return found


def _apply_each(
    patches: list[series.Patch], tree: Path, excluded: dict, version: str
) -> None:
    for patch in patches:
        exclude = [f"--exclude={rel}" for rel in excluded.get(patch.name, {})]
        for args in (["apply", "--check", *exclude], ["apply", *exclude]):
            try:
                workflow.git([*args, str(patch.path)], tree)
            except OverlayError as e:
                raise OverlayError(
                    f"exported patch {patch.name} does not apply to torch "
                    f"{version}'s pristine sources (git {' '.join(args)}):\n{e}"
                ) from None
        log.info("export_upstream: git apply %s: ok", patch.name)


def _am_each(patches: list[series.Patch], repo: Path, excluded: dict) -> None:
    for patch in patches:
        try:
            _git_am(repo, [patch.path], exclude=list(excluded.get(patch.name, {})))
        except OverlayError as e:
            raise OverlayError(
                f"exported patch {patch.name} applies with git apply, but "
                f"`git am` of the series fails there:\n{e}"
            ) from None
        subject = workflow.git(["log", "-1", "--format=%s"], repo).strip()
        if subject != patch.subject:
            raise OverlayError(
                f"exported patch {patch.name}: git am made the subject {subject!r} "
                f"out of {patch.subject!r}"
            )


def check(export_dir: Path, scratch: Path) -> Path:
    """Prove the exported series applies to the pristine base; raise on the first
    failure. Returns the repository in ``scratch`` holding it as commits."""
    export_dir = Path(export_dir).resolve()
    patches = series.read_series(export_dir)
    if not patches:
        raise OverlayError(
            f"{export_dir} has no series (or an empty one); run the export first"
        )
    torch_dir, torch_version = _pristine_torch()
    # A plain directory: workflow.git sets GIT_CEILING_DIRECTORIES to its parent,
    # so git apply never mistakes an enclosing repository for this tree.
    tree = scratch / "pristine"
    workflow.copy_pristine_sources(torch_dir, tree)
    excluded = _unapplied_diffs(patches, tree)
    _apply_each(patches, tree, excluded, torch_version)
    repo = scratch / "pytorch"
    workflow.init_pristine_repo(repo, torch_dir, torch_version)
    _am_each(patches, repo, excluded)
    log.info(
        "export_upstream: %s: %d commits apply with git apply and git am (%d C++ "
        "changes of files the base lacks checked without applying)",
        export_dir,
        len(patches),
        sum(map(len, excluded.values())),
    )
    return repo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where the series is written"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not export: prove an exported series applies and bisects",
    )
    parser.add_argument(
        "--export-dir",
        type=Path,
        default=None,
        help="with --check: the series to check (default: --out)",
    )
    parser.add_argument(
        "--prefix-tests",
        choices=export_bisect.PREFIX_TESTS,
        default="skip-last",
        help="with --check: which prefixes run the tests they add (see NOTE: "
        "[Bisecting the export] in export_bisect.py; default: all but the last)",
    )
    parser.add_argument(
        "--prefix-tests-matching",
        metavar="REGEX",
        default=None,
        help="with --check: of the prefixes --prefix-tests selects, run the tests "
        "only of those whose commit subject matches REGEX (the others: imports)",
    )
    parser.add_argument(
        "--keep-going",
        action="store_true",
        help="with --check: check every prefix, then report all that fail",
    )
    parser.add_argument(
        "--no-bisect",
        action="store_true",
        help="with --check: only prove the series applies",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The export must not depend on whoever runs it: no user or system git config
    # (format.signature, diff.noprefix, core.abbrev, commit.gpgsign...).
    os.environ["GIT_CONFIG_GLOBAL"] = os.devnull
    os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
    try:
        if not args.check:
            export(args.out)
            return 0
        with tempfile.TemporaryDirectory(
            prefix="torch_overlay-export-check-"
        ) as scratch:
            repo = check(args.export_dir or args.out, Path(scratch))
            if not args.no_bisect:
                export_bisect.check_prefixes(
                    repo,
                    Path(scratch),
                    args.prefix_tests,
                    args.keep_going,
                    tests_matching=args.prefix_tests_matching,
                    groups=[
                        p.group
                        for p in series.read_series(
                            (args.export_dir or args.out).resolve()
                        )
                    ],
                )
    except OverlayError as e:
        log.error("export_upstream: FAILED: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
