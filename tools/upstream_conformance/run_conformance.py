"""Upstream conformance: torch 2.13's own precompile test files, run unchanged here.

``make upstream-conformance`` runs every test file under ``--tests-root``
(../shared/upstream-tests/2.13: upstream's files as 2.13 ships them, never copied
into this project) with pytest, once per environment:

=========  =========================  ================================================
label      python                     how
=========  =========================  ================================================
overlay    ``.venv``                  ``TORCH_OVERLAY=1``: stock 2.7.1 + the overlay
wheel      ``build/wheel-venv``       the patched wheel, ``-P`` (no torch_overlay)
upstream   ``.venv-upstream``         torch 2.13.0 itself (``--envs`` adds it; the
                                      reference is the recorded result file)
=========  =========================  ================================================

each file in its own process with an empty ``TORCHINDUCTOR_CACHE_DIR`` and a junit
XML read back per test. The plugin in ``plugin/`` supplies, at import, only names
2.13's files need that torch 2.7.1 lacks and that are not precompile (each with the
upstream PR that added it).

Every test gets its outcome per environment next to 2.13's own result on CPU
(``expected-2.13.0-cpu.json`` beside the files) and, where they differ, the reason
from ``keep_list.toml``. Written to ``<out>/report.md`` and ``<out>/report.json``.
Exit 1 when (a) a test 2.13 passes does not pass here and no keep-list entry names
it, (b) a keep-list entry names a test that now behaves as on 2.13 (the list must
stay exact), or (c) the overlay and the wheel disagree on a test.

# NOTE: [Conformance outcomes]
# An outcome is one of passed / failed / skipped; pytest's errors (setup errors,
# a file that does not import) count as failed, with the first line of the error
# kept as the detail. A test 2.13 reports that a run here does not report at all
# (its file did not import, or a parametrization that 2.7.1's test utilities do
# not produce) is failed too, with the reason "not collected". 2.13's
# expectedFailure tests are "skipped" in its result file (pytest's xfail), and
# so here.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path


log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
DEFAULT_TESTS_ROOT = REPO.parent / "shared" / "upstream-tests" / "2.13"
EXPECTED_FILE = "expected-2.13.0-cpu.json"
PLUGIN = "upstream_conformance_plugin"


@dataclasses.dataclass(frozen=True)
class Environment:
    label: str
    python: Path
    env: dict
    python_flags: tuple


def environments(names: list[str]) -> dict[str, Environment]:
    base = {k: v for k, v in os.environ.items() if k != "TORCH_OVERLAY"}
    known = {
        "overlay": Environment(
            "overlay",
            REPO / ".venv" / "bin" / "python",
            {**base, "TORCH_OVERLAY": "1", "TORCH_OVERLAY_EXPECT": "overlay"},
            (),
        ),
        "wheel": Environment(
            "wheel",
            REPO / "build" / "wheel-venv" / "bin" / "python",
            {**base, "TORCH_OVERLAY_EXPECT": "wheel"},
            ("-P",),
        ),
        "upstream": Environment("upstream", REPO / ".venv-upstream" / "bin" / "python", dict(base), ("-P",)),
    }
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown environment(s) {unknown}; known: {sorted(known)}")
    return {n: known[n] for n in names}


@dataclasses.dataclass
class KeepEntry:
    patterns: list[str]
    kind: str
    reason: str
    envs: list[str]
    used: int = 0

    def covers(self, test_id: str, env: str) -> bool:
        return env in self.envs and any(fnmatch.fnmatchcase(test_id, p) for p in self.patterns)


KEEP_KINDS = {
    "2.13-only": "exercises a torch 2.13 feature outside precompile that 2.7.1 lacks",
    "deliberate": "a deliberate difference of the backport from upstream",
    "not-yet": "the backport does not conform yet (issue 28 is open for it)",
    "flaky": "the upstream test races with itself: it passes or fails by timing on any torch",
}


def read_keep_list(path: Path) -> list[KeepEntry]:
    with open(path, "rb") as f:
        data = tomllib.load(f)
    entries = []
    for i, raw in enumerate(data.get("keep", [])):
        kind = raw.get("kind")
        if kind not in KEEP_KINDS or not raw.get("reason") or not raw.get("tests"):
            raise SystemExit(f"{path}: keep entry {i} needs tests, a reason and a kind in {sorted(KEEP_KINDS)}")
        entries.append(KeepEntry(list(raw["tests"]), kind, raw["reason"], list(raw.get("envs", ["overlay", "wheel"]))))
    return entries


def read_junit(path: Path, rel_file: str) -> dict[str, tuple[str, str]]:
    """test id -> (outcome, detail); see NOTE: [Conformance outcomes]."""
    results: dict[str, tuple[str, str]] = {}
    if not path.exists():
        return results
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        if not classname:
            # A collection error: the file did not import.
            node = case.find("error")
            message = (node.get("message") or node.text or "") if node is not None else ""
            results[f"{rel_file}::<collection>"] = ("failed", _first_line(message))
            continue
        test_id = f"{rel_file}::{classname.rsplit('.', 1)[-1]}::{name}"
        outcome, detail = "passed", ""
        for tag in ("failure", "error"):
            node = case.find(tag)
            if node is not None:
                outcome, detail = "failed", _first_line(node.get("message") or node.text or "")
        node = case.find("skipped")
        if node is not None and outcome == "passed":
            outcome, detail = "skipped", _first_line(node.get("message") or "")
        results[test_id] = (outcome, detail)
    return results


def _first_line(text: str) -> str:
    for line in text.strip().splitlines():
        if line.strip():
            return line.strip()[:300]
    return ""


def run_file(env: Environment, tests_root: Path, rel_file: str, out: Path, timeout: float) -> dict:
    junit = out / env.label / (rel_file.replace("/", "__") + ".xml")
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="conformance-inductor-cache-") as cache:
        child_env = dict(env.env)
        child_env["TORCHINDUCTOR_CACHE_DIR"] = cache
        child_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE / "plugin"), child_env.get("PYTHONPATH")]))
        cmd = [
            str(env.python), *env.python_flags, "-m", "pytest", str(tests_root / rel_file),
            "-c", str(HERE / "pytest.ini"), "--rootdir", str(tests_root),
            "-p", PLUGIN, "-q", "--junitxml", str(junit),
        ]
        started = time.monotonic()
        with tempfile.TemporaryFile("w+") as output:
            proc = subprocess.Popen(
                cmd, env=child_env, cwd=tests_root, stdout=output, stderr=subprocess.STDOUT, text=True
            )
            rc, note = _wait_for_pytest(proc, junit, started + timeout)
            output.seek(0)
            tail = note + output.read()[-4000:]
        seconds = time.monotonic() - started
    (out / env.label / (rel_file.replace("/", "__") + ".log")).write_text(tail)
    return {"results": read_junit(junit, rel_file), "rc": rc, "seconds": round(seconds, 1)}


# NOTE: [A test file that does not exit]
# pytest writes the junit file when its session finishes, then the interpreter
# exits, which waits for every non-daemon thread. A test that leaves one
# blocked (2.13's test_guard_serialization_fsdp_module, when its rank thread
# hangs in the threaded process group's broadcast, is reported failed after
# its own 300 s and its thread stays) kept the process alive until the file's
# timeout, 1500 s. The results are all in the junit file by then, so a process
# still alive EXIT_GRACE seconds after the file appeared is killed and its
# results are read as written; the log says so.
EXIT_GRACE = 60.0


def _wait_for_pytest(proc: subprocess.Popen, junit: Path, deadline: float) -> tuple[int, str]:
    """pytest's exit status and a note for the log (NOTE: [A test file that does not exit])."""
    finished_at = None
    while True:
        try:
            return proc.wait(timeout=1.0), ""
        except subprocess.TimeoutExpired:
            pass
        now = time.monotonic()
        if finished_at is None and junit.exists():
            finished_at = now
        if finished_at is not None and now - finished_at > EXIT_GRACE:
            proc.kill()
            proc.wait()
            return -2, f"session finished but the process did not exit in {EXIT_GRACE:.0f} s: killed\n"
        if now > deadline:
            proc.kill()
            proc.wait()
            return -1, "timed out: killed\n"


@dataclasses.dataclass
class Row:
    test_id: str
    expected: str
    outcomes: dict
    details: dict
    reason: str = ""
    kind: str = ""
    problem: str = ""


def compare(expected: dict[str, str], runs: dict[str, dict[str, dict]], keep: list[KeepEntry], env_labels: list[str]) -> list[Row]:
    rows = []
    for test_id in sorted(expected):
        rel_file = test_id.split("::")[0]
        outcomes, details = {}, {}
        for label in env_labels:
            file_run = runs[label].get(rel_file, {"results": {}})
            results = file_run["results"]
            if test_id in results:
                outcomes[label], details[label] = results[test_id]
            else:
                collection = results.get(f"{rel_file}::<collection>")
                outcomes[label] = "failed"
                details[label] = f"not collected: {collection[1]}" if collection else "not collected"
        row = Row(test_id, expected[test_id], outcomes, details)
        differing = [label for label in env_labels if label != "upstream" and outcomes[label] != row.expected]
        entry = next((k for k in keep if any(k.covers(test_id, label) for label in differing)), None)
        if entry is not None:
            entry.used += 1
            row.reason, row.kind = entry.reason, entry.kind
        elif any(row.expected == "passed" or outcomes[label] == "failed" for label in differing):
            row.problem = "differs from 2.13 and no keep-list entry names it"
        covering = [k for k in keep if k.covers(test_id, "overlay") or k.covers(test_id, "wheel")]
        # A flaky test may behave as on 2.13 in one run and not in the next, and
        # differently in the two environments of one run.
        flaky = any(k.kind == "flaky" for k in covering)
        if covering and not differing:
            if not flaky:
                row.problem = "keep-list entry is stale: the test behaves as on 2.13"
            row.reason, row.kind = covering[0].reason, covering[0].kind
        if (
            "overlay" in outcomes
            and "wheel" in outcomes
            and outcomes["overlay"] != outcomes["wheel"]
            and not flaky
        ):
            row.problem = "overlay and wheel disagree"
        rows.append(row)
    return rows


def write_report(rows: list[Row], runs: dict, env_labels: list[str], out: Path, tests_root: Path, plugin_supplied: list[str]) -> None:
    summary = {}
    for label in env_labels:
        counts = {"passed": 0, "failed": 0, "skipped": 0}
        for row in rows:
            counts[row.outcomes[label]] += 1
        summary[label] = counts
    expected_counts = {"passed": 0, "failed": 0, "skipped": 0}
    for row in rows:
        expected_counts[row.expected] = expected_counts.get(row.expected, 0) + 1
    passes_on_213 = [r for r in rows if r.expected == "passed"]
    conforming = {
        label: sum(1 for r in passes_on_213 if r.outcomes[label] == "passed") for label in env_labels
    }
    problems = [r for r in rows if r.problem]
    report = {
        "tests_root": str(tests_root),
        "environments": env_labels,
        "expected_2_13": expected_counts,
        "summary": summary,
        "passing_on_2_13_that_pass_here": conforming,
        "files": {label: {f: {"rc": r["rc"], "seconds": r["seconds"]} for f, r in runs[label].items()} for label in env_labels},
        "rows": [dataclasses.asdict(r) for r in rows],
        "problems": [dataclasses.asdict(r) for r in problems],
    }
    (out / "report.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    lines = [
        "# Upstream conformance: torch 2.13's precompile tests, unchanged",
        "",
        f"Files: `{tests_root}`; 2.13's own results on CPU: {expected_counts['passed']} passed, "
        f"{expected_counts['skipped']} skipped.",
        "",
        "| environment | passed | failed | skipped | of 2.13's passing tests, pass here |",
        "|---|---|---|---|---|",
    ]
    for label in env_labels:
        c = summary[label]
        lines.append(f"| {label} | {c['passed']} | {c['failed']} | {c['skipped']} | {conforming[label]} / {len(passes_on_213)} |")
    lines += ["", "Names the conformance plugin supplies (not precompile): " + (", ".join(plugin_supplied) or "none"), ""]
    if problems:
        lines += ["## Problems", ""]
        lines += [f"- `{r.test_id}`: {r.problem}" for r in problems]
        lines.append("")
    lines += ["## Per test", "", "| test | 2.13 | " + " | ".join(env_labels) + " | kind | reason |", "|---|---|" + "---|" * len(env_labels) + "---|---|"]
    for r in rows:
        cells = []
        for label in env_labels:
            cell = r.outcomes[label]
            if cell != r.expected and r.details[label]:
                cell += f" ({r.details[label][:90]})".replace("|", "/")
            cells.append(cell)
        lines.append(f"| {r.test_id.split('/')[-1]} | {r.expected} | " + " | ".join(cells) + f" | {r.kind} | {r.reason.replace('|', '/')} |")
    (out / "report.md").write_text("\n".join(lines) + "\n")


def plugin_supplied_names(python: Path, env: dict) -> list[str]:
    code = (
        "import upstream_conformance_plugin as p\n"
        "class C:\n    stash = {}\n"
        "p.pytest_configure(C())\n"
        "print('\\n'.join(f'{m}.{n} (pytorch#{pr})' for (m, n), pr in sorted(p.SUPPLIED.items())))\n"
    )
    child_env = dict(env)
    child_env["PYTHONPATH"] = str(HERE / "plugin")
    proc = subprocess.run([str(python), "-c", code], env=child_env, capture_output=True, text=True, timeout=300)
    return [line for line in proc.stdout.splitlines() if line.strip()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tests-root", type=Path, default=DEFAULT_TESTS_ROOT)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "upstream-conformance")
    parser.add_argument("--envs", default="overlay,wheel")
    parser.add_argument("--keep-list", type=Path, default=HERE / "keep_list.toml")
    parser.add_argument("--files", default="", help="comma-separated files (relative to --tests-root); default all")
    parser.add_argument("--timeout", type=float, default=1500.0, help="seconds per file")
    parser.add_argument("--reuse", action="store_true", help="rebuild the report from the junit files in --out")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    tests_root = args.tests_root.resolve()
    # pytest runs in the tests' folder: its junit path must not be relative.
    args.out = args.out.resolve()
    expected_all: dict[str, dict[str, str]] = json.loads((tests_root / EXPECTED_FILE).read_text())
    files = [f for f in args.files.split(",") if f] or sorted(expected_all)
    expected = {f"{f}::{t}": outcome for f in files for t, outcome in expected_all[f].items()}
    envs = environments([e for e in args.envs.split(",") if e])
    keep = read_keep_list(args.keep_list)
    args.out.mkdir(parents=True, exist_ok=True)

    runs: dict[str, dict[str, dict]] = {}
    for label, env in envs.items():
        runs[label] = {}
        for rel_file in files:
            if args.reuse:
                junit = args.out / label / (rel_file.replace("/", "__") + ".xml")
                runs[label][rel_file] = {"results": read_junit(junit, rel_file), "rc": None, "seconds": None}
                continue
            if not env.python.exists():
                raise SystemExit(f"{label}: {env.python} is missing (make venv / wheel-venv / upstream-venv)")
            log.info("%s: %s ...", label, rel_file)
            runs[label][rel_file] = run_file(env, tests_root, rel_file, args.out, args.timeout)
            r = runs[label][rel_file]
            log.info("%s: %s: rc %s in %s s", label, rel_file, r["rc"], r["seconds"])

    rows = compare(expected, runs, keep, list(envs))
    first = next(iter(envs.values()))
    supplied = plugin_supplied_names(first.python, first.env) if first.python.exists() else []
    write_report(rows, runs, list(envs), args.out, tests_root, supplied)
    problems = [r for r in rows if r.problem]
    unused = [
        k
        for k in keep
        if not k.used and k.kind != "flaky" and any(fnmatch.filter(expected, p) for p in k.patterns)
    ]
    print((args.out / "report.md").read_text().split("## Per test")[0])
    for k in unused:
        print(f"note: keep-list entry matched no difference: {k.patterns[:3]}")
    print(f"report: {args.out / 'report.md'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
