"""Export the patch set as a ``git am`` series for the pytorch repository at its base tag.

The export is what an upstream reviewer applies: ``git am`` on a pytorch checkout
at ``v<base>`` (``torch_overlay/_overlay/base_version.txt``). It is built in a
scratch git repository whose first commit is the installed torch's pristine Python
sources at ``torch/`` (tag ``overlay-base``), on top of which come

1. every patch of ``patches/v<base>/series``, ``git am``'d unchanged (they already
   use ``a/torch/...`` ``b/torch/...`` paths);
2. one commit adding the mirrored new modules (``torch_overlay/X/y.py`` becomes
   ``torch/X/y.py``), skipped when there are none;
3. one commit with the ATen half of the C++ (interpreter serialization), and the
   patch binding it in ``torch/csrc/functorch/init.cpp`` (see NOTE: [C++ in the
   upstream export]);
4. one commit adding the project's upstream-style tests at their upstream paths
   (``test/dynamo/...``), without the overlay machinery's own tests.

``overlay-base..HEAD`` is then written with ``git format-patch`` into ``--out`` as
numbered ``NNNN-*.patch`` files, with a ``series`` file and a ``README.txt``.

``--check`` (what CI runs after the export) applies the exported series to a plain
copy of the pristine sources with ``git apply``, one patch at a time, and then
``git am``'s it onto a fresh repository of the same sources, failing with a message
naming the first patch that does not apply.

# NOTE: [Upstream export base]
# The base is the installed torch wheel's Python sources (and the C++ headers the
# series changes, which the wheel ships verbatim), not a pytorch git tree (nothing
# here can fetch one). A patch that applies to the wheel's copy of a file applies
# to the checkout at the tag; new files (mirrored modules, tests, C++ sources) are
# additions and need no base at all. The one exception is the init.cpp binding
# patch, described in NOTE: [C++ in the upstream export].
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
    # Compiled extensions are build outputs; their C++ is exported by
    # export_csrc_commit() and binding_patch(), never the binary.
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
# The C++ of the series is built here as an extension (torch_overlay/csrc/):
#   * functorch/InterpreterSerialization.cpp is plain ATen code; upstream it is
#     aten/src/ATen/functorch/InterpreterSerialization.cpp, unchanged (ATen's build
#     globs functorch/*.cpp), and the declarations of its InterpreterSerialization.h
#     go into ATen/functorch/Interpreter.h. The wheel ships that header verbatim
#     (torch/include/ATen/functorch/Interpreter.h), so the export base has it and
#     this commit is generated and checked like the Python ones.
#   * functorch/interpreter_serialization_bindings.cpp is extension glue: it adds
#     the two methods to the CInterpreter class torch._C already bound. Upstream,
#     the same .def chain (between its BEGIN/END markers) extends the CInterpreter
#     binding in torch/csrc/functorch/init.cpp. The wheel ships no .cpp, so that
#     one patch is written from its known context (the 2.7.1 binding of
#     CInterpreter, whose methods --check compares with the installed torch's) and
#     is the only patch --check cannot apply; the README says so.
CSRC_SERIALIZATION = CSRC_DIR / "functorch" / "InterpreterSerialization.cpp"
CSRC_SERIALIZATION_HEADER = CSRC_DIR / "functorch" / "InterpreterSerialization.h"
CSRC_BINDINGS = CSRC_DIR / "functorch" / "interpreter_serialization_bindings.cpp"
INTERPRETER_H = "aten/src/ATen/functorch/Interpreter.h"
# upstream path -> path under the installed torch/ directory
PRISTINE_HEADERS = {INTERPRETER_H: "include/ATen/functorch/Interpreter.h"}
FUNCTORCH_INIT_CPP = "torch/csrc/functorch/init.cpp"
# The CInterpreter binding of torch 2.7.1's torch/csrc/functorch/init.cpp: the
# context of the binding patch, its last .def line replaced.
_INIT_CPP_BEFORE = [
    '      .value("Different", RandomnessType::Different);',
    '  py::class_<Interpreter>(m, "CInterpreter")',
    '      .def("key", &Interpreter::key)',
]
_INIT_CPP_REPLACED = '      .def("level", &Interpreter::level);'
_INIT_CPP_AFTER = [
    '  py::class_<GradInterpreterPtr>(m, "CGradInterpreterPtr")',
    "      .def(py::init<const Interpreter*>())",
    '      .def("key", &GradInterpreterPtr::key)',
]
# Where that block starts in 2.7.1's init.cpp, approximately: git apply finds a
# hunk by its context wherever it is.
_INIT_CPP_APPROXIMATE_LINE = 630
_BINDINGS_BEGIN = "// BEGIN CInterpreter serialization bindings"
_BINDINGS_END = "// END CInterpreter serialization bindings"


def pristine_headers(torch_dir: Path) -> dict[str, Path]:
    """The C++ files the series changes that the wheel ships verbatim."""
    return {rel: torch_dir / installed for rel, installed in PRISTINE_HEADERS.items()}


def _between(text: str, begin: str, end: str, what: str) -> list[str]:
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise OverlayError(f"{what}: expected one {begin!r} ... {end!r} block")
    return lines[starts[0] + 1 : ends[0]]


def interpreter_h_with_declarations(pristine: str) -> str:
    """Interpreter.h with InterpreterSerialization.h's declarations added at its end."""
    block = _between(
        CSRC_SERIALIZATION_HEADER.read_text(),
        "namespace at::functorch {",
        "} // namespace at::functorch",
        str(CSRC_SERIALIZATION_HEADER),
    )
    closing = "} // namespace at::functorch"
    head, sep, tail = pristine.rpartition(closing)
    if not sep:
        raise OverlayError(f"{INTERPRETER_H} has no {closing!r} line")
    return head + "\n".join(block).strip("\n") + "\n\n" + sep + tail


def binding_chain() -> list[str]:
    """The .def chain of the extension glue, as it goes into init.cpp."""
    chain = _between(CSRC_BINDINGS.read_text(), _BINDINGS_BEGIN, _BINDINGS_END, str(CSRC_BINDINGS))
    if not chain or not chain[0].lstrip().startswith(".def"):
        raise OverlayError(f"{CSRC_BINDINGS}: no .def chain between the markers")
    return chain


def export_csrc_commit(repo: Path, date: datetime.datetime, env: dict[str, str]) -> bool:
    """Commit the ATen half of the C++ (see NOTE: [C++ in the upstream export])."""
    if not CSRC_SERIALIZATION.exists():
        return False
    header = repo / INTERPRETER_H
    header.write_text(interpreter_h_with_declarations(header.read_text()))
    workflow.git(["add", "--", INTERPRETER_H], repo)
    _commit_files(
        repo,
        {"aten/src/ATen/functorch/InterpreterSerialization.cpp": CSRC_SERIALIZATION},
        _message(
            "[functorch] Serialize functorch interpreters (C++)",
            [
                "serializeInterpreter / deserializeInterpreter write an Interpreter's",
                "state (transform type, level, whether it is alive, its saved local",
                "dispatch key set, and the transform's own state: vmap batch size and",
                "randomness, grad / jvp previous mode, functionalize add-back-views)",
                "as JSON text and read it back. Guards on the functorch stack can then",
                "be saved with a compiled frame and rebuilt in another process",
                "(pytorch#152616). Bad text is a c10::ValueError naming the field.",
            ],
            "torch_overlay, torch_overlay/csrc/functorch/InterpreterSerialization.{h,cpp}",
            date,
        ),
        env,
    )
    return True


def binding_patch(author: str, date: datetime.datetime) -> str:
    """The init.cpp patch binding CInterpreter.serialize / deserialize (mbox text)."""
    added = ['      .def("level", &Interpreter::level)', *binding_chain()]
    added[-1] += ";"
    old_len = len(_INIT_CPP_BEFORE) + 1 + len(_INIT_CPP_AFTER)
    new_len = len(_INIT_CPP_BEFORE) + len(added) + len(_INIT_CPP_AFTER)
    line = _INIT_CPP_APPROXIMATE_LINE
    message = _message(
        "[functorch] Bind CInterpreter.serialize and CInterpreter.deserialize",
        [
            "torch._C._functorch.CInterpreter gains serialize() -> str and the static",
            "deserialize(str), over at::functorch::serializeInterpreter and",
            "deserializeInterpreter. torch._functorch.pyfunctorch pickles its",
            "interpreters through them.",
            "",
            "This hunk was written from the known CInterpreter binding of v2.7.1",
            "(torch_overlay builds it as an extension on the wheel, which ships no",
            "C++ sources); its line numbers are approximate and git am places it by",
            "its context.",
        ],
        "torch_overlay, torch_overlay/csrc/functorch/interpreter_serialization_bindings.cpp",
        date,
    )
    subject, body = message.split("\n", 1)
    name, _, email = author.partition("\0")
    return "".join(
        f"{text}\n"
        for text in [
            "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001",
            f"From: {name} <{email}>",
            f"Date: {date:%a, %d %b %Y %H:%M:%S %z}",
            f"Subject: [PATCH] {subject}",
            body.rstrip("\n"),
            "---",
            f" {FUNCTORCH_INIT_CPP} | {len(added) + 1} {'+' * len(added)}-",
            f" 1 file changed, {len(added)} insertions(+), 1 deletion(-)",
            "",
            f"diff --git a/{FUNCTORCH_INIT_CPP} b/{FUNCTORCH_INIT_CPP}",
            f"--- a/{FUNCTORCH_INIT_CPP}",
            f"+++ b/{FUNCTORCH_INIT_CPP}",
            f"@@ -{line},{old_len} +{line},{new_len} @@ void initFuncTorchBindings(PyObject* module) {{",
            *(f" {c}" for c in _INIT_CPP_BEFORE),
            f"-{_INIT_CPP_REPLACED}",
            *(f"+{a}" for a in added),
            *(f" {c}" for c in _INIT_CPP_AFTER),
        ]
    )


def check_binding_patch(patch: Path) -> None:
    """What can be checked of the init.cpp patch without init.cpp: its context is
    the CInterpreter binding of the installed torch (same methods), and the chain
    it adds is the extension's."""
    import torch

    text = patch.read_text()
    hunk = text[text.index("\n@@ ") :].splitlines()[2:]
    old = [line[1:] for line in hunk if line[:1] in (" ", "-")]
    new = [line[1:] for line in hunk if line[:1] in (" ", "+")]
    bound = set(re.findall(r'\.def\("(\w+)"', "\n".join(old[len(_INIT_CPP_BEFORE) - 2 : -len(_INIT_CPP_AFTER)])))
    installed = {
        n for n in vars(torch._C._functorch.CInterpreter) if not n.startswith("_")
    } - {"serialize", "deserialize"}
    if bound != installed:
        raise OverlayError(
            f"{patch.name}: its context binds CInterpreter methods {sorted(bound)}, "
            f"torch {torch.__version__} has {sorted(installed)}"
        )
    if old != [*_INIT_CPP_BEFORE, _INIT_CPP_REPLACED, *_INIT_CPP_AFTER]:
        raise OverlayError(f"{patch.name}: its context is not 2.7.1's CInterpreter binding")
    chain = binding_chain()
    chain[-1] += ";"
    if new[len(_INIT_CPP_BEFORE) + 1 : -len(_INIT_CPP_AFTER)] != chain:
        raise OverlayError(
            f"{patch.name}: the chain it adds is not the one of {CSRC_BINDINGS.name}; "
            "export again"
        )


def touches_text(patch_text: str, rel: str) -> bool:
    """Whether a patch changes ``rel``."""
    return f"\ndiff --git a/{rel} b/{rel}\n" in patch_text


def build_export_repo(repo: Path, date: datetime.datetime) -> list[str]:
    """Build the scratch repository; return what each generated commit adds."""
    torch_dir, torch_version = _pristine_torch()
    workflow.init_pristine_repo(repo, torch_dir, torch_version, pristine_headers(torch_dir))
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

    if export_csrc_commit(repo, date, env):
        added.append("the C++ of interpreter serialization (ATen, and its binding)")

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

    return added


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
            *(f"    {name}: {FUNCTORCH_INIT_CPP}, its context and added lines compared"
              " with the installed torch's CInterpreter and the extension's bindings"
              for name in unchecked),
        ]
    return "\n".join(lines) + "\n"


def export(out: Path) -> list[Path]:
    """Write the series into ``out``; return the patch files in order."""
    out = Path(out).resolve()
    with tempfile.TemporaryDirectory(prefix="torch_overlay-export-") as scratch:
        repo = Path(scratch) / "pytorch"
        date = _export_date()
        added = build_export_repo(repo, date)
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
        unchecked_at = None
        if CSRC_SERIALIZATION.exists():
            # The binding follows the ATen commit (see NOTE: [C++ in the upstream export]).
            who = workflow.git(["log", "-1", "--format=%an%x00%ae", "HEAD"], repo).strip()
            unchecked_at = 1 + next(
                i for i, (_, text) in enumerate(produced) if touches_text(text, INTERPRETER_H)
            )
            produced.insert(
                unchecked_at,
                (
                    "functorch-Bind-CInterpreter.serialize-and-CInterpreter.deserialize.patch",
                    binding_patch(who, date),
                ),
            )
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
    unchecked = [names[unchecked_at]] if unchecked_at is not None else []
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
        workflow.copy_extra_files(pristine_headers(torch_dir), tree)
        # See NOTE: [C++ in the upstream export]: init.cpp is not in the wheel.
        unchecked = [p for p in patches if touches_text(p.path.read_text(), FUNCTORCH_INIT_CPP)]
        for patch in unchecked:
            check_binding_patch(patch.path)
            log.info(
                "export_upstream: %s: not applied (no %s here); its context is the "
                "installed torch's CInterpreter binding: ok",
                patch.name,
                FUNCTORCH_INIT_CPP,
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
        workflow.init_pristine_repo(repo, torch_dir, torch_version, pristine_headers(torch_dir))
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
