# Owner(s): ["module: dynamo"]
"""The README and the docs/ pages against the repository they describe.

* README.md stays a page a newcomer reads: at most 150 lines.
* Every `make <target>` in their code (inline or fenced) names a target the
  Makefile has (VAR=value arguments and flags allowed).
* Every relative markdown link points at a file or folder of the repository, and
  at a heading of the page when it names one (GitHub's anchors).
* Every repository path they cite in code (a token with a '/' that ends with '/'
  or a file extension), and every bare path under a top-level folder of the
  repository, exists; `torch/...` paths are the mirrored modules, upstream C++
  under torch_overlay/csrc/, or the installed torch's own files.
* Every `NOTE: [X]` they cite is written somewhere in the code, and in the file
  the page says it is in ("NOTE: [X] in path").

No subprocess and no torch_overlay import: it runs in every environment of the
suite (overlay, patched wheel, another base) in a few milliseconds.
"""

import fnmatch
import itertools
import os
import re
from pathlib import Path

import torch
from torch._dynamo.test_case import run_tests, TestCase


REPO_ROOT = Path(__file__).resolve().parents[2]
TORCH_SITE = Path(torch.__file__).resolve().parent.parent
README_MAX_LINES = 150

# Where the pages' NOTEs live (the folders a NOTE is grepped in).
NOTE_FOLDERS = ("torch_overlay", "patches", "tools", "benchmarks", "build_scripts", "test")
TEXT_SUFFIXES = {".py", ".patch", ".toml", ".md", ".json", ".txt", ".h", ".cpp", ".yml", ".cfg"}
# Bare (unquoted) paths are checked when they start with one of these.
TOP_LEVEL = (
    "torch_overlay", "patches", "tools", "benchmarks", "build_scripts", "test",
    "nightly", "examples", "docs", ".github", ".ci",
)
# What `make` or a run creates (.gitignore'd) or what lives outside the checkout:
# cited as places, never checked.
GENERATED = ("build", "dist", ".venv", ".overlay-work", "__pycache__")
# Placeholders the pages use in paths, and the files inside a compile package.
PLACEHOLDER_PARTS = {"DIR", "X", "X.Y.Z", "x.py", "y.py", "N"}
PACKAGE_LAYOUT = {"graphs/", "kernels/", "manifest.json", "dynamo.bin"}

FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
MAKE_TARGET_LINE = re.compile(r"^([A-Za-z0-9_.\-]+(?:[ \t]+[A-Za-z0-9_.\-]+)*)[ \t]*:(?!=)", re.MULTILINE)
NOTE_CITE = re.compile(
    r"NOTE:\s*\[([^\]]+)\]((?:\s*(?:,|and)\s*\[[^\]]+\])*)\)?(?:\s+in\s+`?([\w./{}-]+\.\w+)`?)?"
)
TRAILING = "()[],;:.'\"`"


def _pages() -> dict[str, str]:
    pages = {"README.md": (REPO_ROOT / "README.md").read_text()}
    for path in sorted((REPO_ROOT / "docs").glob("*.md")):
        pages[f"docs/{path.name}"] = path.read_text()
    return pages


def _split(text: str) -> tuple[list[str], str]:
    """The page's code (fenced blocks, inline spans) and its prose without code."""
    code = [m.group(1) for m in FENCE.finditer(text)]
    rest = FENCE.sub("\n", text)
    code += [m.group(1) for m in INLINE.finditer(rest)]
    return code, INLINE.sub(" ", rest)


def _headings(text: str) -> set[str]:
    """GitHub's anchors of the page's headings (fenced code is no heading)."""
    anchors = set()
    for line in FENCE.sub("\n", text).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            title = re.sub(r"[`*]", "", m.group(1)).strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def _makefile_targets() -> set[str]:
    targets = set()
    for m in MAKE_TARGET_LINE.finditer((REPO_ROOT / "Makefile").read_text()):
        targets.update(m.group(1).split())
    return targets


def _make_targets_cited(code: str) -> list[str]:
    """The target of each `make` command in ``code``: the first word after it that
    is neither a flag nor a VAR=value argument."""
    cited = []
    for line in code.splitlines():
        tokens = line.split()
        for i, token in enumerate(tokens):
            if token.lstrip("(") != "make":
                continue
            for arg in tokens[i + 1 :]:
                if arg.startswith("#") or arg in ("&&", "||", "|", ";"):
                    break
                word = arg.rstrip(TRAILING)
                if word and not word.startswith("-") and "=" not in word:
                    cited.append(word)
                    break
    return cited


def _looks_like_path(token: str) -> bool:
    if "/" not in token or "://" in token:
        return False
    last = token.rstrip("/").rsplit("/", 1)[-1]
    return token.endswith("/") or re.search(r"\.(\w+|\{[\w,]+\})$", last) is not None


def _path_tokens(code: str) -> list[str]:
    tokens = []
    for token in re.split(r"[\s\"'(),=;`]+", code):
        token = token.rstrip(TRAILING)
        if _looks_like_path(token):
            tokens.append(token)
    return tokens


def _bare_paths(prose: str) -> list[str]:
    starts = "|".join(re.escape(t) for t in TOP_LEVEL)
    found = re.findall(rf"(?<![\w./`-])((?:{starts})/[\w./{{}},*-]*)", prose)
    return [p.rstrip(TRAILING) for p in found if _looks_like_path(p.rstrip(TRAILING))]


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^}]*)\}", path)
    if not m:
        return [path]
    return list(
        itertools.chain.from_iterable(
            _expand(path[: m.start()] + alt + path[m.end() :]) for alt in m.group(1).split(",")
        )
    )


def _skipped(path: str) -> bool:
    if path.startswith(("/", "~", "./", "../", "$")) or "<" in path or ">" in path:
        return True
    parts = [p for p in path.split("/") if p]
    if parts[0] in GENERATED or parts[0].startswith((".venv-", ".overlay-work-")):
        return True
    if path in PACKAGE_LAYOUT:
        return True
    return any(p in PLACEHOLDER_PARTS for p in parts)


def _candidates(path: str) -> list[Path]:
    """Where a cited path may live: the repository, the mirrored modules
    (torch_overlay/X is torch/X), upstream C++ (torch_overlay/csrc/<path>, or its
    .patch), a name relative to torch_overlay/, or the installed torch."""
    out = [REPO_ROOT / path, REPO_ROOT / "torch_overlay" / path]
    if path.startswith("torch/"):
        out += [REPO_ROOT / "torch_overlay" / path[len("torch/") :], TORCH_SITE / path]
    out += [REPO_ROOT / "torch_overlay" / "csrc" / path, REPO_ROOT / "torch_overlay" / "csrc" / f"{path}.patch"]
    return out


def _exists(path: str) -> bool:
    for one in _expand(path):
        if "*" in one:
            if not any(any(c.parent.glob(c.name)) for c in _candidates(one)):
                return False
        elif not any(c.exists() for c in _candidates(one)):
            return False
    return True


def _code_files() -> dict[Path, str]:
    files = {}
    for folder in NOTE_FOLDERS:
        for dirpath, dirnames, filenames in os.walk(REPO_ROOT / folder):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in filenames:
                path = Path(dirpath) / name
                if path.suffix in TEXT_SUFFIXES or name == "series":
                    files[path] = path.read_text(errors="replace")
    return files


def _norm(text: str) -> str:
    return " ".join(text.split())


class TestDocs(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.pages = _pages()

    def _none(self, bad: list[str], what: str) -> None:
        if bad:
            self.fail(f"{what}:\n  " + "\n  ".join(bad))

    def test_readme_is_short(self):
        lines = len(self.pages["README.md"].splitlines())
        self.assertLessEqual(
            lines, README_MAX_LINES, f"README.md has {lines} lines; move topics to docs/"
        )

    def test_make_targets_exist(self):
        targets = _makefile_targets()
        bad = []
        for page, text in self.pages.items():
            for code in _split(text)[0]:
                for target in _make_targets_cited(code):
                    # `make bench-*`: a family of targets
                    if not fnmatch.filter(targets, target):
                        bad.append(f"{page}: make {target}")
        self._none(bad, "make targets the Makefile does not have")

    def test_links_resolve(self):
        bad = []
        for page, text in self.pages.items():
            here = (REPO_ROOT / page).parent
            for target in LINK.findall(FENCE.sub("\n", text)):
                if re.match(r"[a-z]+:", target):  # https:, mailto:
                    continue
                file, _, anchor = target.partition("#")
                path = (here / file).resolve() if file else REPO_ROOT / page
                if not path.exists():
                    bad.append(f"{page}: {target} (no such file)")
                elif anchor and path.suffix == ".md" and anchor not in _headings(path.read_text()):
                    bad.append(f"{page}: {target} (no such heading)")
        self._none(bad, "links that lead nowhere")

    def test_cited_paths_exist(self):
        bad = []
        for page, text in self.pages.items():
            code, prose = _split(text)
            cited = [p for c in code for p in _path_tokens(c)] + _bare_paths(prose)
            bad += [f"{page}: {p}" for p in cited if not _skipped(p) and not _exists(p)]
        self._none(bad, "paths the repository does not have")

    def test_cited_notes_exist(self):
        files = {path: _norm(text) for path, text in _code_files().items()}
        everywhere = " ".join(files.values())
        bad = []
        for page, text in self.pages.items():
            for m in NOTE_CITE.finditer(text):
                names = [m.group(1), *re.findall(r"\[([^\]]+)\]", m.group(2))]
                where = m.group(3)
                for name in map(_norm, names):
                    note = f"NOTE: [{name}]"
                    if note not in everywhere:
                        bad.append(f"{page}: {note} is nowhere in {', '.join(NOTE_FOLDERS)}")
                        continue
                    if where is None:
                        continue
                    # a path, or a bare file name: any file of that name holding it
                    if "/" in where:
                        holders = [c for c in _candidates(where) if c in files]
                    else:
                        holders = [p for p in files if p.name == where]
                    if not any(note in files[h] for h in holders):
                        bad.append(f"{page}: {note} is not in {where}")
        self._none(bad, "NOTEs the code does not have")


if __name__ == "__main__":
    run_tests()
