"""Prove the upstream export bisectable: every prefix imports and passes its tests.

``export_upstream.py --check`` (``make export-check``) hands this module the
repository it ``git am``'d the exported series into. For every commit, in order,
the repository's work tree is checked out at that commit and made an importable
torch (see NOTE: [Bisecting the export]); then, in fresh processes with that tree
first on ``sys.path`` and torch_overlay neither active nor importable:

1. ``import torch`` and an import of every module the prefix has added so far
   must work, each served from the tree;
2. the tests the commit adds must pass (``python -m pytest <its test files>``).

The first prefix that fails is named, with the command that failed.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Optional

from torch_overlay._overlay import importer, series, workflow
from torch_overlay._overlay.errors import OverlayError


log = logging.getLogger(__name__)

# Which prefixes run the tests they add: every one, all but the last (see NOTE:
# [Bisecting the export]), or none (imports only).
PREFIX_TESTS = ("skip-last", "all", "none")
# C++ paths: a prefix adding any gets the compat layer's build of them.
CSRC_ROOTS = ("aten/", "torch/csrc/", "c10/")

# NOTE: [Bisecting the export]
# Each prefix's tree is the pristine torch 2.7.1 Python sources (the repository's
# base commit) with the prefix applied, plus the installed wheel's other files
# (torch._C and the other extension modules, lib/, include/ for Inductor's C++
# builds...) symlinked in: exactly what a 2.7.1 build of that pytorch commit
# would hold, except for C++ the prefix changes. A 2.7.1 torch._C cannot be
# rebuilt here, so from the first prefix that adds C++ on, the tree also gets the
# compat layer's build of that very C++ (torch_overlay/compat/: the extension
# compiled from torch_overlay/csrc/ and the loader binding it to CInterpreter),
# symlinked at the torch module names the overlay serves it under. That is the
# one piece of the backport in these trees, and only where the C++ it stands in
# for is applied.
#
# The processes never see the overlay: TORCH_OVERLAY* are removed from their
# environment (torch_overlay.pth activates only on TORCH_OVERLAY), and a
# sitecustomize on their PYTHONPATH (inherited by the tests' own subprocesses)
# puts None at sys.modules["torch_overlay"], so the editable install cannot
# import it either; the import check asserts both, and that torch and every new
# module come from the tree.
#
# Cost: a prefix's tests are its commit's test files, run once. The tests of the
# LAST prefix are by default not run here: that tree's content is exactly what
# `make test-overlay` serves and tests (the whole series and every new module and
# test), so running them again would only repeat it. Its imports are still
# checked. --prefix-tests=all runs them too.

_SITECUSTOMIZE = """\
# export_bisect.py: the upstream export's prefixes run without torch_overlay.
import sys
sys.modules["torch_overlay"] = None
"""

# The compat loader that binds the C++ a prefix adds (CInterpreter.serialize /
# deserialize), and the torch module after which upstream's torch._C would have
# them: in prefixes with that C++, the loader is imported right after that module
# (the series' compat patch does the same in the overlay, and is never exported).
COMPAT_CPP_BINDINGS = {
    "torch._functorch._interpreter_serialization": "torch._functorch.pyfunctorch",
}

_SITECUSTOMIZE_BIND_CPP = """\
# export_bisect.py: this prefix adds C++; the compat layer's build of it stands in
# for torch._C's bindings, bound right after the module that uses them.
import importlib.abc
import importlib.machinery


class _BindCompatCpp(importlib.abc.MetaPathFinder):
    def __init__(self, bindings):
        self.bindings = bindings

    def find_spec(self, name, path, target=None):
        loaders = [loader for loader, after in self.bindings.items() if after == name]
        if not loaders:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        exec_module = spec.loader.exec_module

        def exec_then_bind(module):
            exec_module(module)
            for loader in loaders:
                importlib.import_module(loader)

        spec.loader.exec_module = exec_then_bind
        return spec


sys.meta_path.insert(0, _BindCompatCpp(%r))
"""

_IMPORT_CHECK = textwrap.dedent(
    """\
    import importlib, importlib.util, os, sys
    tree = os.path.realpath(sys.argv[1])
    assert not any(k.startswith("TORCH_OVERLAY") for k in os.environ), "overlay env set"
    assert importlib.util.find_spec("torch_overlay") is None, "torch_overlay importable"
    import torch
    for name in ["torch", *sys.argv[2:]]:
        module = importlib.import_module(name)
        where = os.path.realpath(module.__file__)
        assert where.startswith(tree + os.sep), f"{name} imported from {where}, not {tree}"
    active = [k for k, v in sys.modules.items() if k.startswith("torch_overlay") and v]
    assert not active, f"torch_overlay modules imported: {active}"
    print(f"imported torch and {len(sys.argv) - 2} new modules from the tree")
    """
)


def _added_files(repo: Path, commit: str) -> list[str]:
    out = workflow.git(
        ["diff-tree", "--no-commit-id", "--name-only", "--diff-filter=A", "-r", commit],
        repo,
    )
    return out.split()


def _module_name(rel: str) -> str | None:
    """``torch.x.y`` for an added ``torch/x/y.py`` (``torch.x`` for its __init__)."""
    path = Path(rel)
    if path.parts[0] != "torch" or path.suffix != ".py":
        return None
    parts = list(path.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_test(rel: str) -> bool:
    """An added ``test/.../test_*.py``: a test file pytest runs."""
    return (
        rel.startswith("test/")
        and Path(rel).name.startswith("test_")
        and rel.endswith(".py")
    )


def link_binaries(torch_dir: Path, tree_torch: Path) -> None:
    """Symlink into ``tree_torch`` what the installed torch has besides its Python
    sources: whole directories the tree lacks (lib/, include/...), and every other
    non-.py file where the tree has none."""
    for root, dirs, files in os.walk(torch_dir):
        rel = Path(root).relative_to(torch_dir)
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for d in list(dirs):
            target = tree_torch / rel / d
            if not target.exists():
                target.symlink_to(Path(root) / d, target_is_directory=True)
                dirs.remove(d)
        for name in files:
            target = tree_torch / rel / name
            if (
                not name.endswith(".py")
                and not target.exists()
                and not target.is_symlink()
            ):
                target.symlink_to(Path(root) / name)


def link_compat_build(tree_torch: Path) -> list[str]:
    """Symlink the compat layer's modules (its C++ build and loader) into the tree
    at the names the overlay serves them under; see NOTE: [Bisecting the export]."""
    linked = []
    for name, path in series.compat_modules().items():
        target = tree_torch.parent / series.mirrored_relpath(path)
        if not target.exists():
            target.symlink_to(path)
            linked.append(name)
    return linked


def _checkout(repo: Path, commit: str, added: list[str]) -> None:
    for rel in added:
        for parent in Path(rel).parents:
            if (repo / parent).is_symlink():
                raise OverlayError(
                    f"{commit[:12]} adds {rel} under {parent}, which the bisect tree "
                    "links to the installed torch; it cannot be checked out there"
                )
    workflow.git(["checkout", "-q", "-f", "--detach", commit], repo)


def _child_env(
    repo: Path, scratch: Path, index: int, bind_cpp: bool = False
) -> dict[str, str]:
    blocker = scratch / ("no-torch-overlay-bind-cpp" if bind_cpp else "no-torch-overlay")
    blocker.mkdir(exist_ok=True)
    sitecustomize = _SITECUSTOMIZE
    if bind_cpp:
        sitecustomize += _SITECUSTOMIZE_BIND_CPP % (COMPAT_CPP_BINDINGS,)
    (blocker / "sitecustomize.py").write_text(sitecustomize)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env.pop("PYTHONHOME", None)
    env["PYTHONPATH"] = os.pathsep.join([str(repo), str(blocker)])
    env["PYTHONNOUSERSITE"] = "1"
    env["TORCHINDUCTOR_CACHE_DIR"] = str(scratch / f"inductor-cache-{index}")
    # Bytecode caches outside the tree, kept across prefixes (checked against each
    # source's mtime): without them every test subprocess compiles torch again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(scratch / "pycache")
    return env


def _run(cmd: list[str], repo: Path, env: dict[str, str], what: str) -> None:
    shown = " ".join("<import check>" if arg == _IMPORT_CHECK else arg for arg in cmd)
    log.info("export_bisect:   $ %s", shown)
    proc = subprocess.run(cmd, cwd=repo, env=env)
    if proc.returncode != 0:
        raise OverlayError(
            f"{what} failed (exit {proc.returncode}): {shown} (in {repo})"
        )


def check_prefix(
    repo: Path,
    scratch: Path,
    index: int,
    modules: list[str],
    tests: list[str],
    bind_cpp: bool = False,
) -> None:
    """The checks of one prefix, in its checked-out tree (``bind_cpp``: the prefix
    adds C++, whose compat build is bound as torch._C would bind it)."""
    env = _child_env(repo, scratch, index, bind_cpp)
    subject = workflow.git(["log", "-1", "--format=%s"], repo).strip()
    what = f"prefix {index + 1} ({subject})"
    _run(
        [sys.executable, "-c", _IMPORT_CHECK, str(repo), *modules],
        repo,
        env,
        f"{what}: import",
    )
    if tests:
        _run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests],
            repo,
            env,
            f"{what}: its tests",
        )


def check_prefixes(
    repo: Path,
    scratch: Path,
    prefix_tests: str = "skip-last",
    keep_going: bool = False,
    tests_matching: Optional[str] = None,
    groups: Optional[list[str]] = None,
) -> None:
    """Check every prefix of the series ``git am``'d in ``repo`` (NOTE: [Bisecting
    the export]); raise OverlayError naming the first that fails (with
    ``keep_going``, every one that fails, after checking them all). With
    ``tests_matching`` (a regex), only prefixes whose commit subject matches it
    run their tests; the others are import-checked. ``groups``: each commit's
    series group (NOTE: [Series groups]), reported per group."""
    torch_root, _ = importer.find_torch()
    commits = workflow.git(
        ["rev-list", "--reverse", f"{workflow.BASE_TAG}..HEAD"], repo
    ).split()
    if groups is not None and len(groups) != len(commits):
        raise OverlayError(
            f"the exported series lists {len(groups)} commits, the repository has "
            f"{len(commits)}"
        )
    group_of = groups or [series.GROUPS[0]] * len(commits)
    modules: list[str] = []
    failures: list[str] = []
    failed_groups: dict[str, int] = {}
    compat_linked = False
    for index, commit in enumerate(commits):
        started = time.monotonic()
        if index == 0 or group_of[index] != group_of[index - 1]:
            log.info(
                "export_bisect: group %s from prefix %d on", group_of[index], index + 1
            )
        added = _added_files(repo, commit)
        _checkout(repo, commit, added)
        link_binaries(torch_root / "torch", repo / "torch")
        if not compat_linked and any(rel.startswith(CSRC_ROOTS) for rel in added):
            linked = link_compat_build(repo / "torch")
            compat_linked = True
            log.info(
                "export_bisect: C++ from here on: the compat layer's build of it stands in (%s)",
                ", ".join(linked),
            )
        modules += [m for m in map(_module_name, added) if m]
        tests = [rel for rel in added if _is_test(rel)]
        skip_tests = prefix_tests == "none" or (
            prefix_tests == "skip-last" and index == len(commits) - 1
        )
        if tests_matching is not None:
            subject = workflow.git(["log", "-1", "--format=%s"], repo).strip()
            skip_tests = skip_tests or not re.search(tests_matching, subject)
        _log_prefix(index, len(commits), len(modules), tests, skip_tests, prefix_tests)
        try:
            check_prefix(
                repo,
                scratch,
                index,
                modules,
                [] if skip_tests else tests,
                bind_cpp=compat_linked,
            )
        except OverlayError as e:
            if not keep_going:
                raise
            failures.append(f"[{group_of[index]}] {e}")
            failed_groups[group_of[index]] = failed_groups.get(group_of[index], 0) + 1
            log.error("export_bisect: %s", e)
            continue
        log.info(
            "export_bisect: prefix %d: ok (%.0f s)",
            index + 1,
            time.monotonic() - started,
        )
    for group in dict.fromkeys(group_of):
        count = group_of.count(group)
        log.info(
            "export_bisect: group %s: %d of %d prefixes ok",
            group,
            count - failed_groups.get(group, 0),
            count,
        )
    if failures:
        raise OverlayError("prefixes that fail:\n  " + "\n  ".join(failures))
    log.info(
        "export_bisect: all %d prefixes import and pass the tests they add",
        len(commits),
    )


def _log_prefix(index, count, n_modules, tests, skip_tests, prefix_tests) -> None:
    ran = f"{len(tests)} test files" if not skip_tests else "its tests not run here"
    log.info(
        "export_bisect: prefix %d/%d: import torch + %d new modules; %s",
        index + 1,
        count,
        n_modules,
        ran,
    )
    if skip_tests and tests and prefix_tests == "skip-last":
        log.info(
            "export_bisect: NOTE: the last prefix's tests (%s) are not run here: "
            "its tree is what `make test-overlay` tests (see NOTE: [Bisecting the "
            "export]; EXPORT_PREFIX_TESTS=all / --prefix-tests=all runs them)",
            " ".join(tests),
        )
