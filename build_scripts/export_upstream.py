"""Export the patch set as a ``git am`` series for the pytorch repository at its base tag.

The export is what an upstream reviewer applies: ``git am`` on a pytorch checkout
at ``v<base>`` (``torch_overlay/_overlay/base_version.txt``). It is built in a
scratch git repository whose first commit is the installed torch's pristine Python
sources at ``torch/`` (tag ``overlay-base``), on top of which come

1. every patch of ``patches/v<base>/series``, ``git am``'d unchanged (they already
   use ``a/torch/...`` ``b/torch/...`` paths);
2. one commit adding the mirrored new modules (``torch_overlay/X/y.py`` becomes
   ``torch/X/y.py``), skipped when there are none;
3. one commit adding the new C++ files of ``torch_overlay/csrc/`` at their paths
   there (``torch_overlay/csrc/aten/src/...`` is ``aten/src/...``), followed by the
   changes to existing C++ files (``torch_overlay/csrc/<path>.patch``; see NOTE:
   [C++ in the upstream export]);
4. one commit adding the project's upstream-style tests at their upstream paths
   (``test/dynamo/...``), without the overlay machinery's own tests.

``overlay-base..HEAD`` is then written with ``git format-patch`` into ``--out`` as
numbered ``NNNN-*.patch`` files, with a ``series`` file and a ``README.txt``.

``--check`` (what CI runs after the export) applies the exported series to a plain
copy of the pristine sources with ``git apply``, one patch at a time, and then
``git am``'s it onto a fresh repository of the same sources, failing with a message
naming the first patch that does not apply.

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
import datetime
import logging
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

from torch_overlay._overlay import importer, series, workflow
from torch_overlay._overlay.errors import OverlayError


log = logging.getLogger(__name__)

DEFAULT_OUT = series.REPO_ROOT / "build" / "upstream-export"
TEST_DIR = series.REPO_ROOT / "test"
CSRC_DIR = series.PACKAGE_DIR / "csrc"
# Under test/ but not upstream material: the overlay machinery's tests (import
# hook, cache, this export) and the conftest that checks which torch is served.
TEST_EXCLUDED = ("overlay", "conftest.py")
# Who commits in the scratch repositories; authorship of the generated commits is
# taken from the series (see _generated_commit_env).
_COMMITTER = {
    "GIT_COMMITTER_NAME": "torch_overlay",
    "GIT_COMMITTER_EMAIL": "torch_overlay@localhost",
}
_FALLBACK_AUTHOR = ("torch_overlay maintainers", "torch_overlay@localhost")


def _export_date() -> datetime.datetime:
    # SOURCE_DATE_EPOCH makes the generated commits (and so the export) reproducible.
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    if epoch:
        return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc)
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def _pristine_torch() -> tuple[Path, str]:
    """(installed ``torch/`` directory, its version), refusing anything but the base."""
    torch_root, torch_version = importer.find_torch()
    importer.check_torch_version(torch_version, str(torch_root / "torch"))
    return torch_root / "torch", torch_version


def _git_am(repo: Path, patches: list[Path]) -> None:
    # --keep-non-patch: the subject keeps its "[dynamo]" tag; only "[PATCH n/m]" goes.
    workflow.git(
        ["am", "-q", "--keep-non-patch", "--committer-date-is-author-date", *map(str, patches)],
        repo,
        env=_COMMITTER,
    )


def _area_tags(relpaths: list[str]) -> str:
    """``[dynamo][functorch]`` from ``torch/_dynamo/x.py``, ``test/functorch/y.py``..."""
    tags = []
    for rel in relpaths:
        parts = Path(rel).parts
        if len(parts) > 2:
            tag = parts[1].lstrip("_")
            if tag not in tags:
                tags.append(tag)
    return "".join(f"[{t}]" for t in sorted(tags)) or "[torch]"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _message(subject: str, why: list[str], origin: str, date: datetime.datetime) -> str:
    return "\n".join(
        [
            subject,
            "",
            *why,
            "",
            f"Origin: {origin}",
            "Forwarded: no (this export is the submission)",
            f"Last-Update: {date:%Y-%m-%d}",
            "",
        ]
    )


def _generated_commit_env(repo: Path, date: datetime.datetime) -> dict[str, str]:
    """Author the generated commits as the series' last patch was authored."""
    who = workflow.git(
        ["log", "-1", "--format=%an%x00%ae", f"{workflow.BASE_TAG}..HEAD"], repo
    ).strip()
    name, email = who.split("\0") if who else _FALLBACK_AUTHOR
    stamp = date.isoformat()
    return {
        "GIT_AUTHOR_NAME": name,
        "GIT_AUTHOR_EMAIL": email,
        "GIT_AUTHOR_DATE": stamp,
        "GIT_COMMITTER_DATE": stamp,
        **_COMMITTER,
    }


def _commit_files(
    repo: Path, files: dict[str, Path], message: str, env: dict[str, str]
) -> None:
    """Copy ``files`` (repo-relative path -> source) into ``repo`` and commit them."""
    for rel, src in files.items():
        dest = repo / rel
        if dest.exists():
            raise OverlayError(
                f"{src} would be added upstream as {rel}, but the base already has "
                "that file; change it through a patch instead"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
    workflow.git(["add", "--", *files], repo)
    with tempfile.NamedTemporaryFile("w", suffix=".msg", delete=False) as fh:
        fh.write(message)
    try:
        workflow.git(["commit", "-q", "-F", fh.name], repo, env=env)
    finally:
        os.unlink(fh.name)


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
# Nothing here names a destination.
#   * New files (aten/src/ATen/functorch/InterpreterSerialization.{h,cpp}) are one
#     generated commit, checked like the Python ones.
#   * A patch of a file the export base has is git am'd after that commit. One of
#     a file the base lacks (torch/csrc/functorch/init.cpp: the wheel ships no
#     .cpp) follows that commit unchanged and is the one kind of patch --check
#     cannot apply. What --check proves instead is that it adds upstream what the
#     compat layer adds to torch 2.7.1 (check_unapplied_csrc_patch), so the
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
        touched = re.findall(r"^diff --git a/(\S+) b/", path.read_text(), flags=re.M)
        if touched != [rel]:
            raise OverlayError(
                f"{path}: a csrc patch changes exactly the file it is named after "
                f"({rel}); it changes {touched}"
            )
        patches[rel] = path
    return patches


def _hunk_lines(patch_text: str) -> tuple[list[str], list[str]]:
    """(removed, added) lines of a one-file patch, without their +/- marks."""
    body = patch_text[patch_text.index("\n@@ ") :].splitlines()
    removed = [line[1:] for line in body if line.startswith("-") and not line.startswith("---")]
    added = [line[1:] for line in body if line.startswith("+") and not line.startswith("+++")]
    return removed, added


def _compat_csrc_lines() -> list[str]:
    lines = []
    for path in sorted(COMPAT_CSRC_DIR.rglob("*")):
        if path.suffix in (".cpp", ".h"):
            lines += [line.strip() for line in path.read_text().splitlines()]
    return lines


def check_unapplied_csrc_patch(patch: Path) -> None:
    """What can be checked of a csrc patch whose file the base lacks: every line it
    adds is, in the same order, a line of the compat layer's C++ (a removed line
    that comes back to continue a statement, e.g. a .def chain losing its ';',
    aside). The upstream change is then the one the backport builds and tests."""
    removed, added = _hunk_lines(patch.read_text())
    continued = {line.rstrip(";") for line in removed}
    compat = iter(_compat_csrc_lines())
    for line in added:
        if line in continued:
            continue
        if line.strip() and line.strip() not in compat:
            raise OverlayError(
                f"{patch.name}: it adds {line.strip()!r}, which the compat layer's C++ "
                f"({COMPAT_CSRC_DIR.relative_to(series.REPO_ROOT)}) does not add at that "
                "point: the exported change would not be the one the backport tests"
            )


def export_csrc_commit(repo: Path, date: datetime.datetime, env: dict[str, str]) -> bool:
    """Commit the new C++ files (see NOTE: [C++ in the upstream export])."""
    files = csrc_new_files()
    if not files:
        return False
    _commit_files(
        repo,
        files,
        _message(
            "[functorch] Serialize functorch interpreters (C++)",
            [
                "serializeInterpreter / deserializeInterpreter write an Interpreter's",
                "state (transform type, level, whether it is alive, its saved local",
                "dispatch key set, and the transform's own state: vmap batch size and",
                "randomness, grad / jvp previous mode, functionalize add-back-views)",
                "as JSON text with nlohmann::json and read it back. Guards on the",
                "functorch stack can then be saved with a compiled frame and rebuilt",
                "in another process (pytorch#152616). Bad text is a c10::ValueError",
                "naming the field.",
            ],
            "torch_overlay, torch_overlay/csrc/ (" + ", ".join(files) + ")",
            date,
        ),
        env,
    )
    return True


def _patch_file_name(subject: str) -> str:
    """The name git format-patch gives a patch with this subject."""
    return re.sub(r"[^A-Za-z0-9_.]+|\.{2,}", "-", subject).strip("-.")[:100] + ".patch"


def touches_text(patch_text: str, rel: str) -> bool:
    """Whether a patch changes ``rel``."""
    return f"\ndiff --git a/{rel} b/{rel}\n" in patch_text


def build_export_repo(repo: Path, date: datetime.datetime) -> tuple[list[str], list[Path]]:
    """Build the scratch repository; return what each generated commit adds, and
    the csrc patches of files the base lacks (they follow the C++ commit unapplied)."""
    torch_dir, torch_version = _pristine_torch()
    workflow.init_pristine_repo(repo, torch_dir, torch_version)
    patches = series.read_series()
    if patches:
        _git_am(repo, [p.path.resolve() for p in patches])
    env = _generated_commit_env(repo, date)
    added = []

    modules = mirrored_module_files()
    if modules:
        tags = _area_tags(list(modules))
        _commit_files(
            repo,
            modules,
            _message(
                f"{tags} Add the new modules of the precompile series",
                [
                    "The patches before this one import these modules; they are new",
                    "upstream files. torch_overlay develops them at torch_overlay/X/y.py",
                    "and serves them as torch/X/y.py, so they move to that path unchanged:",
                    "their module names were upstream's from the start.",
                ],
                "torch_overlay, mirrored new modules (torch_overlay/X/y.py -> torch/X/y.py)",
                date,
            ),
            env,
        )
        added.append(_count(len(modules), "new module"))

    unapplied = []
    if export_csrc_commit(repo, date, env):
        added.append(_count(len(csrc_new_files()), "new C++ file"))
    for rel, patch in csrc_patches().items():
        if (repo / rel).exists():
            _git_am(repo, [patch])
        else:
            unapplied.append(patch)
    if csrc_patches():
        added.append(_count(len(csrc_patches()), "C++ change") + " of existing files")

    tests = upstream_test_files()
    if tests:
        tags = _area_tags(list(tests))
        _commit_files(
            repo,
            tests,
            _message(
                f"{tags} Add tests for the precompile series",
                [
                    "These tests were written upstream-style (common_utils.TestCase,",
                    "run_tests()) at their upstream paths and pass on torch 2.7.1 with",
                    "the series applied, so they move in unchanged. The overlay",
                    "machinery's own tests (test/overlay/) and its conftest.py stay",
                    "behind: they test the import hook, not torch.",
                ],
                "torch_overlay test/ (run there against the overlay and the patched wheel)",
                date,
            ),
            env,
        )
        added.append(_count(len(tests), "test file"))

    return added, unapplied


def _readme(names: list[str], base: str, added: list[str], unchecked: list[str]) -> str:
    lines = [
        f"torch_overlay upstream export: the patch set as a git am series for pytorch v{base}.",
        "",
        f"Apply on a pytorch checkout at tag v{base}:",
        "",
        f"    git -C pytorch checkout v{base}",
        "    git -C pytorch am --keep-non-patch /path/to/upstream-export/[0-9]*.patch",
        "",
        "(`series` lists the same patches in order; --keep-non-patch keeps the subjects'",
        "[dynamo]-style tags.) The patches of torch_overlay's own series come first,",
        "unchanged; then generated commits add "
        + (" and ".join(added) if added else "nothing")
        + ".",
        "",
        "`make export-check` (build_scripts/export_upstream.py --check) proves it applies",
        f"to the torch {base} wheel's sources (its Python files and the C++ headers it",
        "ships verbatim): git apply patch by patch, then git am of the whole series.",
        "",
        "Patches:",
        *(f"    {name}" for name in names),
    ]
    if unchecked:
        lines += [
            "",
            "Not applied by --check (the wheel ships no C++ sources; see NOTE: [C++ in",
            "the upstream export] in build_scripts/export_upstream.py):",
            *(f"    {name}: its added lines compared with the compat layer's C++"
              for name in unchecked),
        ]
    return "\n".join(lines) + "\n"


def export(out: Path) -> list[Path]:
    """Write the series into ``out``; return the patch files in order."""
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="torch_overlay-export-") as scratch:
        repo = Path(scratch) / "pytorch"
        date = _export_date()
        added, unapplied = build_export_repo(repo, date)
        produced_dir = Path(scratch) / "patches"
        workflow.git(
            [
                "format-patch",
                "-q",
                "--zero-commit",
                "--no-signature",
                "--filename-max-length=100",
                "-o",
                str(produced_dir),
                f"{workflow.BASE_TAG}..HEAD",
            ],
            repo,
        )
        # (name without its number, text) in series order
        produced = [
            (p.name.split("-", 1)[1], p.read_text())
            for p in sorted(produced_dir.glob("*.patch"))
        ]
        # See NOTE: [C++ in the upstream export]: right after the new C++ files.
        new_cpp = list(csrc_new_files())
        unchecked_at = [
            1 + max(i for i, (_, text) in enumerate(produced) if any(touches_text(text, rel) for rel in new_cpp))
            + offset
            for offset in range(len(unapplied))
        ]
        for at, patch in zip(unchecked_at, unapplied):
            text = patch.read_text()
            produced.insert(at, (_patch_file_name(series.read_subject_text(text)), text))
        out.mkdir(parents=True, exist_ok=True)
        for stale in [*out.glob("*.patch"), out / "series", out / "README.txt"]:
            stale.unlink(missing_ok=True)
        names = []
        for number, (base_name, text) in enumerate(produced, 1):
            # numbered again: the binding patch joined the series
            text = re.sub(
                r"^Subject: \[PATCH[^\]]*\]",
                f"Subject: [PATCH {number}/{len(produced)}]",
                text,
                count=1,
                flags=re.M,
            )
            name = f"{number:04d}-{base_name}"
            (out / name).write_text(text)
            names.append(name)
    unchecked = [names[at] for at in unchecked_at]
    base = series.base_version()
    (out / "series").write_text(
        f"# git am series for pytorch v{base}, generated by export_upstream.py\n"
        + "".join(f"{name}\n" for name in names)
    )
    (out / "README.txt").write_text(_readme(names, base, added, unchecked))
    log.info("export_upstream: wrote %d patches to %s", len(names), out)
    return [out / name for name in names]


def check(export_dir: Path) -> None:
    """Prove the exported series applies to the pristine base; raise on the first failure."""
    export_dir = Path(export_dir).resolve()
    patches = series.read_series(export_dir)
    if not patches:
        raise OverlayError(f"{export_dir} has no series (or an empty one); run the export first")
    torch_dir, torch_version = _pristine_torch()
    with tempfile.TemporaryDirectory(prefix="torch_overlay-export-check-") as scratch:
        # A plain directory: workflow.git sets GIT_CEILING_DIRECTORIES to its parent,
        # so git apply never mistakes an enclosing repository for this tree.
        tree = Path(scratch) / "pristine"
        workflow.copy_pristine_sources(torch_dir, tree)
        # See NOTE: [C++ in the upstream export]: a csrc patch of a file the base
        # lacks (the wheel ships no .cpp) is checked against the compat layer.
        missing = [rel for rel in csrc_patches() if not (tree / rel).exists()]
        unchecked = [
            p for p in patches if any(touches_text(p.path.read_text(), rel) for rel in missing)
        ]
        for patch in unchecked:
            check_unapplied_csrc_patch(patch.path)
            log.info(
                "export_upstream: %s: not applied (the base has no file it changes); "
                "it adds what the compat layer adds: ok",
                patch.name,
            )
        patches = [p for p in patches if p not in unchecked]
        for patch in patches:
            for args in (["apply", "--check"], ["apply"]):
                try:
                    workflow.git([*args, str(patch.path)], tree)
                except OverlayError as e:
                    raise OverlayError(
                        f"exported patch {patch.name} does not apply to torch "
                        f"{torch_version}'s pristine sources (git {' '.join(args)}):\n{e}"
                    ) from None
            log.info("export_upstream: git apply %s: ok", patch.name)

        repo = Path(scratch) / "pytorch"
        workflow.init_pristine_repo(repo, torch_dir, torch_version)
        try:
            _git_am(repo, [p.path for p in patches])
        except OverlayError as e:
            done = int(
                workflow.git(["rev-list", "--count", f"{workflow.BASE_TAG}..HEAD"], repo)
            )
            raise OverlayError(
                f"exported patch {patches[done].name} applies with git apply, but "
                f"`git am` of the series fails there:\n{e}"
            ) from None
        subjects = workflow.git(
            ["log", "--reverse", "--format=%s", f"{workflow.BASE_TAG}..HEAD"], repo
        ).splitlines()
        for patch, subject in zip(patches, subjects):
            if subject != patch.subject:
                raise OverlayError(
                    f"exported patch {patch.name}: git am made the subject {subject!r} "
                    f"out of {patch.subject!r}"
                )
    log.info(
        "export_upstream: %s: %d patches apply with git apply and git am; %d checked "
        "without applying",
        export_dir,
        len(patches),
        len(unchecked),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help="where the series is written"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="do not export: prove an exported series applies (git apply, then git am)",
    )
    parser.add_argument(
        "--export-dir",
        type=Path,
        default=None,
        help="with --check: the series to check (default: --out)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    # The export must not depend on whoever runs it: no user or system git config
    # (format.signature, diff.noprefix, core.abbrev, commit.gpgsign...).
    os.environ["GIT_CONFIG_GLOBAL"] = os.devnull
    os.environ["GIT_CONFIG_NOSYSTEM"] = "1"
    try:
        if args.check:
            check(args.export_dir or args.out)
        else:
            export(args.out)
    except OverlayError as e:
        log.error("export_upstream: FAILED: %s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
