"""Behaviour diff: the test suite and the guard probe set across torch environments.

Runs the suite under ``test/`` (pytest, one ``--junitxml`` per environment, so that
outcomes are read from a machine format, never from console text) in up to four
environments:

=============  ============================  ==========================================
label          python                        how
=============  ============================  ==========================================
stock-2.7.1    ``.venv``                     ``TORCH_OVERLAY`` unset: the base release
overlay        ``.venv``                     ``TORCH_OVERLAY=1``: the import-time overlay
wheel          ``build/wheel-venv``          the patched wheel, nothing of torch_overlay
upstream-2.13  ``.venv-upstream``            torch 2.13.0, which has the features
=============  ============================  ==========================================

and, in every environment that can serialize guards, the guard probe set
(``guard_probe_runner.py`` over ``guard_probes.py``). It writes
``<out>/report.md`` and ``<out>/report.json``: a test x environment table, the
tests whose outcome differs with the first line of each failure, and the probe
comparison: overlay against the patched wheel (must be identical), overlay
against upstream (every difference marked intended, with the reason recorded in
``guard_probe_expected_differences.json``, or UNEXPECTED), and, per
environment, every input where a loaded guard manager decides differently from
the reference one it was saved from, which is a bug.

In the same environments it runs the precompile probe set
(``precompile_probes.py``): small programs saved in one fresh process and loaded
in another (caching_precompile, aot_compile), each step's outcome compared
between overlay and upstream (intended differences recorded in
``precompile_probe_expected_differences.json``, any other UNEXPECTED) and
between overlay and wheel (must be identical, messages included).

In the overlay and upstream-2.13 environments it runs the distributed jobs
(``distributed_jobs.py``): DDP with Inductor and FSDP2 per block on 2 gloo
ranks, a cold job that saves, then a fresh job where every rank loads rank 0's
artifacts (packages on the overlay; Mega-Cache, with and without
caching_precompile, on 2.13); per job and environment, whether the fresh job
recompiles, whether its losses are bitwise the cold job's, and whether rank
0's artifacts serve every rank (NOTE: [Distributed jobs in the behaviour
diff]).

``--require-agreement overlay,wheel`` (what ``make agree-overlay-wheel`` runs, and
``make test`` with it) exits 1 when the two environments disagree on any test or
probe decision. ``--junit overlay=PATH`` reads an environment's test outcomes
from a junit XML an earlier pytest run wrote (``make test``'s own runs) instead
of running the suite again; the same rule (NOTE: [What counts as a
disagreement]) decides.
An environment whose python is missing is reported as absent; it fails the run
only when ``--require-agreement`` names it. Environments run ``--jobs`` at a time
(separate processes); ``--reuse`` rebuilds the report from the results already
in ``--out`` (after editing the expected differences, say) without running.

# NOTE: [What counts as a disagreement]
# Outcomes differ when the two environments report different outcomes for a
# test. A test that passes in one environment and is skipped in the other is
# listed but is not a disagreement: tests of the overlay machinery skip where
# there is no overlay by design. Every other difference (pass/fail, skip/fail,
# fail/error, present/absent when one side fails) is.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Optional


log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
HARNESS_PATH = Path(__file__).resolve().parent / "harness_path"
HERE = Path(__file__).resolve().parent
DEFAULT_OUT = REPO_ROOT / "build" / "diff-upstream"
EXPECTED_DIFFERENCES = HERE / "guard_probe_expected_differences.json"
PROBE_RUNNER = HERE / "guard_probe_runner.py"
PRECOMPILE_PROBES = HERE / "precompile_probes.py"
PRECOMPILE_EXPECTED_DIFFERENCES = HERE / "precompile_probe_expected_differences.json"
DISTRIBUTED_JOBS = HERE / "distributed_jobs.py"

ABSENT = "—"
# Environments are scheduled in this order (--jobs at a time): the long suites first.
SLOWEST_FIRST = ("overlay", "wheel", "upstream-2.13", "stock-2.7.1")
_PRINT_LOCK = threading.Lock()


def say(text: str) -> None:
    with _PRINT_LOCK:
        print(text, flush=True)


@dataclasses.dataclass(frozen=True)
class Environment:
    label: str
    python: Path
    # Environment variables set (value) or removed (None) for this environment.
    env: dict
    # What it is, for the report.
    description: str
    # Whether the guard probe set runs there (it needs guard serialization).
    probes: bool
    # Whether the distributed jobs run there (NOTE: [Distributed jobs in the
    # behaviour diff]).
    distributed: bool = False


def default_environments() -> list[Environment]:
    overlay_off = {"TORCH_OVERLAY": None, "TORCH_OVERLAY_EXPECT": None}
    return [
        Environment(
            "stock-2.7.1",
            REPO_ROOT / ".venv" / "bin" / "python",
            overlay_off,
            "torch 2.7.1 as released (.venv, TORCH_OVERLAY unset)",
            probes=False,
        ),
        Environment(
            "overlay",
            REPO_ROOT / ".venv" / "bin" / "python",
            {"TORCH_OVERLAY": "1", "TORCH_OVERLAY_EXPECT": "overlay"},
            "torch 2.7.1 + torch_overlay (.venv, TORCH_OVERLAY=1)",
            probes=True,
            distributed=True,
        ),
        Environment(
            "wheel",
            REPO_ROOT / "build" / "wheel-venv" / "bin" / "python",
            {"TORCH_OVERLAY": None, "TORCH_OVERLAY_EXPECT": "wheel"},
            "the patched torch wheel (build/wheel-venv)",
            probes=True,
        ),
        Environment(
            "upstream-2.13",
            REPO_ROOT / ".venv-upstream" / "bin" / "python",
            overlay_off,
            "upstream torch 2.13.0 CPU (.venv-upstream)",
            probes=True,
            distributed=True,
        ),
    ]


def process_env(environment: Environment) -> dict:
    env = dict(os.environ)
    for key, value in environment.env.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    # A stale cache of pytest or Python bytecode must not decide anything.
    env.pop("PYTEST_ADDOPTS", None)
    if environment.label in ("stock-2.7.1", "upstream-2.13"):
        # The suite's fresh-process harness, which only our torch ships
        # (harness_path/sitecustomize.py says why and how).
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HARNESS_PATH), env.get("PYTHONPATH")) if p
        )
    return env


def first_line(text: Optional[str]) -> str:
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:240]
    return ""


# ---------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------


def describe_environment(environment: Environment) -> dict:
    """Which torch the environment really imports (or why it cannot run)."""
    if not environment.python.exists():
        return {"status": "absent", "detail": f"{environment.python} does not exist"}
    script = (
        "import json, sys, torch, torch._dynamo.guards as g\n"
        "info = {'torch': str(torch.__version__), 'python': sys.version.split()[0],"
        " 'guards_loader': type(getattr(g, '__loader__', None)).__name__}\n"
        "try:\n"
        "    from torch_overlay._overlay import series\n"
        "    info['series_hash'] = series.series_hash()[:12]\n"
        "except Exception:\n"
        "    pass\n"
        "print(json.dumps(info))\n"
    )
    proc = subprocess.run(
        [str(environment.python), "-P", "-c", script],
        capture_output=True,
        text=True,
        env=process_env(environment),
        cwd=REPO_ROOT,
        timeout=300,
    )
    if proc.returncode != 0:
        return {"status": "broken", "detail": last_line(proc.stderr)}
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    info["status"] = "ok"
    return info


def last_line(text: str) -> str:
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else ""


def run_logged(environment: Environment, cmd: list, timeout: int, log_file: Path):
    """Run ``cmd`` in ``environment``; log its output to ``log_file``.

    Returns (returncode, or None on a timeout; stdout; stderr; seconds).
    """
    log.info("%s: %s", environment.label, " ".join(cmd))
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=process_env(environment),
            cwd=REPO_ROOT,
            timeout=timeout,
        )
        returncode, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as e:
        returncode = None
        stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = f"timed out after {timeout} s"
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(f"$ {' '.join(cmd)}\n{stdout}\n--- stderr ---\n{stderr}")
    return returncode, stdout, stderr, round(time.perf_counter() - started, 1)


def run_pytest(environment: Environment, out_dir: Path, timeout: int, pytest_args) -> dict:
    junit = out_dir / "junit" / f"{environment.label}.xml"
    junit.parent.mkdir(parents=True, exist_ok=True)
    junit.unlink(missing_ok=True)
    cmd = [
        str(environment.python),
        "-P",
        "-m",
        "pytest",
        "test",
        "-p",
        "no:cacheprovider",
        "-q",
        # A file that cannot import on this torch (one that tests a module only
        # the backport has) is one error in the report, not the end of the run.
        "--continue-on-collection-errors",
        f"--junitxml={junit}",
        *pytest_args,
    ]
    returncode, stdout, stderr, seconds = run_logged(
        environment, cmd, timeout, out_dir / "logs" / f"pytest-{environment.label}.log"
    )
    result: dict[str, Any] = {"returncode": returncode, "seconds": seconds}
    if returncode is None:
        result["status"] = "timeout"
        result["detail"] = stderr
        return result
    if not junit.exists():
        result["status"] = "did not run"
        result["detail"] = last_line(stderr) or last_line(stdout)
        return result
    result["status"] = "ran"
    result["summary"] = last_line(stdout)
    junit.with_suffix(".run.json").write_text(json.dumps(result))
    result["tests"] = parse_junit(junit)
    return result


def reuse_pytest(environment: Environment, out_dir: Path) -> dict:
    """The results of an earlier run in ``out_dir`` (``--reuse``)."""
    junit = out_dir / "junit" / f"{environment.label}.xml"
    meta = junit.with_suffix(".run.json")
    if not junit.exists() or not meta.exists():
        return {"status": "did not run", "detail": f"--reuse: no earlier run in {junit.parent}", "seconds": 0}
    result = json.loads(meta.read_text())
    result["tests"] = parse_junit(junit)
    return result


def read_junit_run(junit: Path) -> dict:
    """The test outcomes of a pytest run that wrote ``junit`` (``--junit``)."""
    if not junit.exists():
        return {"status": "did not run", "detail": f"--junit: no {junit}", "seconds": 0}
    tests = parse_junit(junit)
    return {
        "status": "ran",
        "summary": f"{len(tests)} tests read from {junit}",
        "seconds": 0,
        "tests": tests,
    }


def parse_junit_args(values: list[str]) -> dict[str, Path]:
    """``LABEL=PATH`` pairs of ``--junit``."""
    out = {}
    for value in values:
        label, sep, path = value.partition("=")
        if not sep or not label or not path:
            raise argparse.ArgumentTypeError(f"--junit {value!r}: expected LABEL=PATH")
        out[label] = Path(path)
    return out


def reuse_probes(environment: Environment, out_dir: Path) -> dict:
    result_file = out_dir / "probes" / environment.label / "probes.json"
    if not result_file.exists():
        return {"status": "failed", "detail": f"--reuse: no {result_file}"}
    result = json.loads(result_file.read_text())
    result["status"] = "ran"
    return result


_SEVERITY = {"pass": 0, "skip": 1, "error": 2, "fail": 3}


def child_text(case) -> str:
    for child in case:
        if child.tag in ("failure", "error") and child.text:
            return child.text
    return ""


def failure_line(message: Optional[str], text: str) -> str:
    """The first line of a failure; for pytest's bare "collection failure", the
    exception line of the collection traceback instead."""
    line = first_line(message)
    if line in ("collection failure", "") and text:
        exception_lines = [
            ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ") and ln[1:].strip()
        ]
        if exception_lines:
            return ("collection: " if line else "") + exception_lines[-1][:240]
    return line


def parse_junit(path: Path) -> dict[str, dict]:
    """test id -> {"outcome", "message"}; a test reported twice (a failing call and
    an erroring teardown) keeps its most severe outcome."""
    tests: dict[str, dict] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        name = case.get("name", "")
        test_id = f"{classname}::{name}" if classname else f"{name} [collection]"
        outcome, message = "pass", ""
        for child in case:
            if child.tag == "failure":
                outcome, message = "fail", child.get("message") or child.text
            elif child.tag == "error":
                outcome, message = "error", child.get("message") or child.text
            elif child.tag == "skipped":
                outcome, message = "skip", child.get("message") or child.text
            else:
                continue
            break
        entry = {"outcome": outcome, "message": failure_line(message, child_text(case))}
        previous = tests.get(test_id)
        if previous is None or _SEVERITY[outcome] > _SEVERITY[previous["outcome"]]:
            tests[test_id] = entry
    return tests


def _run_result_script(environment: Environment, script: Path, kind: str, out_dir: Path, timeout: int, reuse: bool) -> dict:
    """Run ``script`` in ``environment``, writing its results to
    <out>/<kind>/<label>/<script's stem>.json (``reuse``: read the last run's),
    and the results with their status and, if it ran, its seconds."""
    run_dir = out_dir / kind / environment.label
    result_file = run_dir / f"{script.stem}.json"
    seconds = None
    if not reuse:
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [str(environment.python), "-P", str(script), "--out", str(run_dir), "--label", environment.label]
        returncode, _, stderr, seconds = run_logged(
            environment, cmd, timeout, out_dir / "logs" / f"{kind}-{environment.label}.log"
        )
        if returncode is None:
            return {"status": "timeout", "detail": stderr, "seconds": seconds}
        if returncode != 0:
            return {"status": "failed", "detail": last_line(stderr), "seconds": seconds}
    if not result_file.exists():
        return {"status": "failed", "detail": f"no {result_file}"}
    result = json.loads(result_file.read_text())
    result["status"] = "ran"
    if seconds is not None:
        result["seconds"] = seconds
    return result


def run_precompile_probes(environment: Environment, out_dir: Path, timeout: int, reuse: bool) -> dict:
    """The precompile probe set (precompile_probes.py) in ``environment``."""
    return _run_result_script(environment, PRECOMPILE_PROBES, "precompile", out_dir, timeout, reuse)


def precompile_step_decision(step: dict) -> dict:
    """What a precompile probe step did, as compared across versions: the outcome,
    whether Dynamo compiled, whether the result equals eager, an error's type."""
    decision = {"outcome": step.get("outcome")}
    if step.get("outcome") == "ran":
        decision["compiled"] = step.get("compiled")
        decision["matches_eager"] = step.get("matches_eager")
    elif step.get("outcome") == "error":
        decision["error"] = (step.get("error") or {}).get("type")
    return decision


def fmt_precompile_decision(decision: Any) -> str:
    if not isinstance(decision, dict):
        return str(decision)
    text = str(decision.get("outcome"))
    if text == "ran":
        text += (", compiled" if decision.get("compiled") else ", no compile") + (
            "" if decision.get("matches_eager") in (True, None) else ", WRONG RESULT"
        )
    elif text == "error":
        text += f" ({decision.get('error')})"
    if decision.get("message"):
        text += f": {decision['message']}"
    return text


def precompile_phase_decision(phase: dict) -> str:
    error = phase.get("error") or {}
    return f"{phase.get('status')}" + (f" ({error.get('type')})" if error else "")


def compare_precompile(ours: dict, theirs: dict, expected: dict[str, str], exact: bool) -> list[dict]:
    """Precompile probes of two environments, phase by phase and step by step.
    ``exact`` (two builds of the same patches) also compares error messages."""
    out = []
    ours_cases, theirs_cases = ours.get("cases", {}), theirs.get("cases", {})
    for name in sorted(set(ours_cases) | set(theirs_cases), key=case_sort_key(ours_cases, theirs_cases)):
        a, b = ours_cases.get(name), theirs_cases.get(name)
        if a is None or b is None:
            out.append({"case": name, "what": "missing", "ours": a is not None, "theirs": b is not None})
            continue
        for phase in ("save", "load"):
            da, db = precompile_phase_decision(a[phase]), precompile_phase_decision(b[phase])
            if exact:
                da += normalize(str((a[phase].get("error") or {}).get("message", "")))
                db += normalize(str((b[phase].get("error") or {}).get("message", "")))
            if da != db:
                out.append({"case": name, "what": phase, "ours": da, "theirs": db})
        steps_a, steps_b = a.get("steps", []), b.get("steps", [])
        if not steps_a or not steps_b:
            # One side never reached its battery: the phase difference says why.
            continue
        for index in range(max(len(steps_a), len(steps_b))):
            sa = steps_a[index] if index < len(steps_a) else {}
            sb = steps_b[index] if index < len(steps_b) else {}
            da, db = precompile_step_decision(sa), precompile_step_decision(sb)
            if exact:
                da["message"] = normalize((sa.get("error") or {}).get("message"))
                db["message"] = normalize((sb.get("error") or {}).get("message"))
            if da != db:
                out.append(
                    {
                        "case": name,
                        "what": "step",
                        "input": sa.get("label") or sb.get("label"),
                        "ours": da,
                        "theirs": db,
                    }
                )
    for diff in out:
        reason = expected.get(diff["case"]) or expected.get(f"{diff['case']}@{diff.get('input', diff['what'])}")
        diff["intended"] = reason is not None
        diff["reason"] = reason
    return out


def run_distributed_jobs(environment: Environment, out_dir: Path, timeout: int, reuse: bool) -> dict:
    """The distributed jobs (distributed_jobs.py) in ``environment``."""
    return _run_result_script(environment, DISTRIBUTED_JOBS, "distributed", out_dir, timeout, reuse)


def run_probes(environment: Environment, out_dir: Path, timeout: int) -> dict:
    probe_dir = out_dir / "probes" / environment.label
    if probe_dir.exists():
        shutil.rmtree(probe_dir)
    cmd = [
        str(environment.python),
        "-P",
        str(PROBE_RUNNER),
        "--out",
        str(probe_dir),
        "--label",
        environment.label,
    ]
    returncode, _, stderr, seconds = run_logged(
        environment, cmd, timeout, out_dir / "logs" / f"probes-{environment.label}.log"
    )
    if returncode is None:
        return {"status": "timeout", "detail": stderr}
    result_file = probe_dir / "probes.json"
    if returncode != 0 or not result_file.exists():
        return {"status": "failed", "detail": last_line(stderr)}
    result = json.loads(result_file.read_text())
    result["status"] = "ran"
    result["wall_seconds"] = seconds
    return result


# ---------------------------------------------------------------------------
# Comparing tests
# ---------------------------------------------------------------------------


def outcome_of(runs: dict, label: str, test_id: str) -> str:
    run = runs.get(label) or {}
    test = (run.get("tests") or {}).get(test_id)
    return test["outcome"] if test else ABSENT


def message_of(runs: dict, label: str, test_id: str) -> str:
    run = runs.get(label) or {}
    test = (run.get("tests") or {}).get(test_id)
    return test["message"] if test else ""


def disagree(a: str, b: str) -> bool:
    """See NOTE: [What counts as a disagreement]."""
    if a == b:
        return False
    return {a, b} not in ({"pass", "skip"}, {"pass", ABSENT}, {"skip", ABSENT})


def expand_collection_errors(runs: dict) -> None:
    """A module that failed to collect in one environment: its tests (known from the
    other environments) are errors there, with the collection error's message."""
    every_id = {t for run in runs.values() for t in (run.get("tests") or {})}
    for run in runs.values():
        tests = run.get("tests")
        if not tests:
            continue
        for test_id in [t for t in tests if t.endswith(" [collection]")]:
            module = test_id[: -len(" [collection]")]
            members = [t for t in every_id if t.startswith(module + ".") and t not in tests]
            for member in members:
                tests[member] = dict(tests[test_id])
            if members:
                del tests[test_id]


def compare_tests(runs: dict, labels: list[str]) -> dict:
    ran = [label for label in labels if (runs.get(label) or {}).get("status") == "ran"]
    all_ids = sorted({t for label in ran for t in runs[label]["tests"]})
    differing = []
    for test_id in all_ids:
        outcomes = {label: outcome_of(runs, label, test_id) for label in ran}
        if len(set(outcomes.values())) > 1:
            differing.append(
                {
                    "test": test_id,
                    "outcomes": outcomes,
                    "messages": {
                        label: message_of(runs, label, test_id)
                        for label in ran
                        if outcomes[label] in ("fail", "error")
                    },
                }
            )
    return {"environments": ran, "tests": all_ids, "differing": differing}


def test_disagreements(runs: dict, a: str, b: str) -> list[dict]:
    ids = sorted(set(runs[a].get("tests") or {}) | set(runs[b].get("tests") or {}))
    out = []
    for test_id in ids:
        oa, ob = outcome_of(runs, a, test_id), outcome_of(runs, b, test_id)
        if disagree(oa, ob):
            out.append(
                {
                    "test": test_id,
                    a: oa,
                    b: ob,
                    "messages": {
                        label: message_of(runs, label, test_id)
                        for label in (a, b)
                        if outcome_of(runs, label, test_id) in ("fail", "error")
                    },
                }
            )
    return out


# ---------------------------------------------------------------------------
# Comparing probes
# ---------------------------------------------------------------------------

_ADDRESS = re.compile(r"0x[0-9a-fA-F]+|\b\d{9,}\b")


def normalize(value: Any) -> Any:
    """Process-specific numbers (addresses, ids) out of messages."""
    if isinstance(value, str):
        return _ADDRESS.sub("<addr>", value)
    return value


def loaded_columns(row: dict) -> list[str]:
    return [k for k in row if k.startswith(("loaded_", "fresh_"))]


def final_decision(row: dict) -> Any:
    """The decision of the guards as a real load makes them: in a fresh process."""
    for column in ("fresh_load_guard_manager", "loaded_load_guard_manager"):
        if column in row:
            return row[column]
    return None


_SELF_REPORTED_BUG = "this is a bug in guard serialization"


def self_consistency(label: str, probes: dict) -> list[dict]:
    """Every place where a version's loaded guards decide unlike its reference ones."""
    bugs = []
    if probes.get("fresh_process_error"):
        bugs.append(
            {
                "environment": label,
                "case": "(fresh process)",
                "kind": "fresh-process load failed",
                "detail": probes["fresh_process_error"],
            }
        )
    for case_id, case in probes.get("cases", {}).items():
        refusal = (case.get("refusal") or {}).get("message", "")
        if case["status"] == "refused" and _SELF_REPORTED_BUG in refusal:
            bugs.append(
                {
                    "environment": label,
                    "case": case_id,
                    "kind": "save-time self-check failed (loaded guards reject the example)",
                    "detail": refusal,
                }
            )
        if case["status"] == "reference_error":
            bugs.append(
                {
                    "environment": label,
                    "case": case_id,
                    "kind": "reference guards could not be built",
                    "detail": case["error"]["message"],
                }
            )
        for where in ("load_errors", "fresh_load_errors"):
            for loader, error in (case.get(where) or {}).items():
                bugs.append(
                    {
                        "environment": label,
                        "case": case_id,
                        "kind": f"{'fresh-process ' if where.startswith('fresh') else ''}"
                        f"load ({loader}) raised",
                        "detail": f"{error['type']}: {error['message']}",
                    }
                )
        for row in case.get("inputs", []):
            wrong = {c: row[c] for c in loaded_columns(row) if row[c] != row["reference"]}
            if wrong:
                why = row.get("why") or {}
                bugs.append(
                    {
                        "environment": label,
                        "case": case_id,
                        "kind": "loaded decision differs from reference",
                        "input": row["label"],
                        "reference": row["reference"],
                        "loaded": wrong,
                        "why": {c: why[c] for c in (*wrong, "reference") if c in why},
                    }
                )
    return bugs


def load_expected_differences(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {k: v for k, v in data.items() if not k.startswith("_")}


def intended_reason(expected: dict[str, str], case_id: str) -> Optional[str]:
    probe = case_id.split("@", 1)[0]
    return expected.get(case_id) or expected.get(probe)


def compare_probe_versions(ours: dict, theirs: dict, expected: dict[str, str]) -> list[dict]:
    """Overlay (``ours``) against upstream (``theirs``): every differing case, input
    by input, marked intended (with the recorded reason) or UNEXPECTED."""
    out = []
    ours_cases, theirs_cases = ours.get("cases", {}), theirs.get("cases", {})
    for case_id in sorted(set(ours_cases) | set(theirs_cases), key=case_sort_key(ours_cases, theirs_cases)):
        a, b = ours_cases.get(case_id), theirs_cases.get(case_id)
        if a is None or b is None:
            continue
        diff: dict[str, Any] = {
            "case": case_id,
            "probe": a["probe"],
            "mode": a["mode"],
            "ours_status": a["status"],
            "theirs_status": b["status"],
        }
        if a["status"] != b["status"]:
            diff["kind"] = "status"
            diff["ours_refusal"] = a.get("refusal") or a.get("error")
            diff["theirs_refusal"] = b.get("refusal") or b.get("error")
        elif a["status"] == "ok":
            inputs = []
            for ra, rb in zip(a.get("inputs", []), b.get("inputs", [])):
                la, lb = final_decision(ra), final_decision(rb)
                if la != lb:
                    inputs.append(
                        {
                            "input": ra["label"],
                            "ours_reference": ra["reference"],
                            "ours_loaded": la,
                            "theirs_reference": rb["reference"],
                            "theirs_loaded": lb,
                            "references_differ": ra["reference"] != rb["reference"],
                            "ours_why": first_why(ra),
                            "theirs_why": first_why(rb),
                        }
                    )
            if not inputs:
                continue
            diff["kind"] = "decision"
            diff["inputs"] = inputs
        else:
            continue
        diff["ours_self_mismatch"] = case_has_mismatch(a)
        diff["theirs_self_mismatch"] = case_has_mismatch(b)
        reason = intended_reason(expected, case_id)
        diff["intended"] = reason is not None
        diff["reason"] = reason
        out.append(diff)
    return out


def case_has_mismatch(case: dict) -> bool:
    """Whether the case's loaded guards ever decide unlike its reference ones."""
    if case.get("load_errors") or case.get("fresh_load_errors"):
        return True
    return any(
        row[c] != row["reference"] for row in case.get("inputs", []) for c in loaded_columns(row)
    )


def case_sort_key(*case_maps):
    order: dict[str, int] = {}
    for cases in case_maps:
        for case_id in cases:
            order.setdefault(case_id, len(order))
    return lambda case_id: order[case_id]


def first_why(row: dict) -> str:
    why = row.get("why") or {}
    for column in ("fresh_load_guard_manager", "loaded_load_guard_manager", "reference"):
        if column in why:
            return why[column]
    return ""


def compare_probe_builds(a_label: str, a: dict, b_label: str, b: dict) -> list[dict]:
    """Two builds of the same patches (overlay, wheel): everything must match."""
    out = []
    a_cases, b_cases = a.get("cases", {}), b.get("cases", {})
    for case_id in sorted(set(a_cases) | set(b_cases), key=case_sort_key(a_cases, b_cases)):
        ca, cb = a_cases.get(case_id), b_cases.get(case_id)
        if ca is None or cb is None:
            out.append({"case": case_id, "what": "missing", a_label: ca is not None, b_label: cb is not None})
            continue
        if ca.get("status") != cb.get("status"):
            out.append(
                {
                    "case": case_id,
                    "what": "status",
                    a_label: status_text(ca),
                    b_label: status_text(cb),
                }
            )
            continue
        for field in ("guard_types", "derived_guard_types"):
            if ca.get(field) != cb.get(field):
                out.append({"case": case_id, "what": field, a_label: ca.get(field), b_label: cb.get(field)})
        if normalize(status_text(ca)) != normalize(status_text(cb)):
            out.append({"case": case_id, "what": "refusal", a_label: status_text(ca), b_label: status_text(cb)})
        for ra, rb in zip(ca.get("inputs", []), cb.get("inputs", [])):
            for column in sorted(set(ra) | set(rb)):
                if column in ("label", "why", "context"):
                    continue
                if normalize(ra.get(column)) != normalize(rb.get(column)):
                    out.append(
                        {
                            "case": case_id,
                            "what": f"decision {column}",
                            "input": ra["label"],
                            a_label: ra.get(column),
                            b_label: rb.get(column),
                        }
                    )
    return out


def status_text(case: dict) -> str:
    detail = case.get("refusal") or case.get("error") or {}
    message = detail.get("message")
    return f"{case.get('status')}: {message}" if message else str(case.get("status"))


def guard_type_coverage(probe_runs: dict) -> dict[str, dict[str, list[str]]]:
    """guard type -> environment -> probes whose guards contain it (mode "all")."""
    coverage: dict[str, dict[str, list[str]]] = {}
    for label, probes in probe_runs.items():
        for case in probes.get("cases", {}).values():
            if case["mode"] != "all":
                continue
            for guard_type in set(case.get("guard_types", [])) | set(case.get("derived_guard_types", [])):
                coverage.setdefault(guard_type, {}).setdefault(label, []).append(case["probe"])
    return dict(sorted(coverage.items()))


def weak_probes(probes: dict) -> list[str]:
    """Cases whose battery does not separate: the reference accepts all or rejects all."""
    out = []
    for case_id, case in probes.get("cases", {}).items():
        decisions = {row["reference"] for row in case.get("inputs", [])}
        if case.get("inputs") and len(decisions) < 2:
            out.append(f"{case_id} (reference always {decisions.pop()})")
    return out


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------


def md(value: Any) -> str:
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def fmt_decision(value: Any) -> str:
    if value is True:
        return "accept"
    if value is False:
        return "reject"
    if value is None:
        return ABSENT
    return str(value)


def git_state() -> dict:
    def git(*args):
        proc = subprocess.run(["git", *args], capture_output=True, text=True, cwd=REPO_ROOT)
        return proc.stdout.strip() if proc.returncode == 0 else ""

    tracked = [
        REPO_ROOT / "torch_overlay" / "_dynamo" / "guard_serialization.py",
        REPO_ROOT / "torch_overlay" / "_dynamo" / "guard_serialization_codecs.py",
        *sorted((REPO_ROOT / "patches").rglob("*.patch")),
    ]
    return {
        "head": git("rev-parse", "HEAD"),
        "dirty_files": len([line for line in git("status", "--porcelain").splitlines() if line]),
        "sha256": {
            str(p.relative_to(REPO_ROOT)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for p in tracked
            if p.exists()
        },
    }


def build_report(args, environments, infos, test_runs, probe_runs, started) -> dict:
    labels = [e.label for e in environments]
    expected = load_expected_differences(args.expected)
    report: dict[str, Any] = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "seconds": None,
        "git": git_state(),
        "environments": {
            e.label: {
                "description": e.description,
                "python": str(e.python.relative_to(REPO_ROOT)) if e.python.is_relative_to(REPO_ROOT) else str(e.python),
                **infos[e.label],
                "pytest": {k: v for k, v in (test_runs.get(e.label) or {}).items() if k != "tests"},
                "probes": {
                    k: v
                    for k, v in (probe_runs.get(e.label) or {}).items()
                    if k in ("status", "detail", "seconds", "wall_seconds", "fresh_process_error")
                },
            }
            for e in environments
        },
    }
    expand_collection_errors(test_runs)
    report["tests"] = {label: (test_runs.get(label) or {}).get("tests", {}) for label in labels}
    report["test_comparison"] = compare_tests(test_runs, labels)
    report["notes"] = environment_notes(infos)

    ran_probes = {label: p for label, p in probe_runs.items() if p.get("status") == "ran"}
    report["probe_bugs"] = [bug for label, p in ran_probes.items() for bug in self_consistency(label, p)]
    ours = "overlay" if "overlay" in ran_probes else ("wheel" if "wheel" in ran_probes else None)
    if ours and "upstream-2.13" in ran_probes:
        report["probe_vs_upstream"] = {
            "ours": ours,
            "differences": compare_probe_versions(ran_probes[ours], ran_probes["upstream-2.13"], expected),
        }
        used = {d["case"] for d in report["probe_vs_upstream"]["differences"] if d["intended"]}
        report["unused_expected_differences"] = sorted(
            key
            for key in expected
            if not any(c == key or c.split("@", 1)[0] == key for c in used)
        )
    report["probe_statuses"] = {
        case_id: {label: p["cases"].get(case_id, {}).get("status", ABSENT) for label, p in ran_probes.items()}
        for case_id in ordered_case_ids(ran_probes)
    }
    report["probe_cases"] = {label: p.get("cases", {}) for label, p in ran_probes.items()}
    report["guard_type_coverage"] = guard_type_coverage(ran_probes)
    report["weak_probes"] = {label: weak_probes(p) for label, p in ran_probes.items()}

    agreement = []
    pairs = [(pair, True) for pair in args.require_agreement]
    if ("overlay", "wheel") not in args.require_agreement and all(
        (test_runs.get(x) or {}).get("status") == "ran" or x in ran_probes
        for x in ("overlay", "wheel")
    ):
        pairs.append((("overlay", "wheel"), False))
    for (a, b), required in pairs:
        entry: dict[str, Any] = {"pair": [a, b], "required": required}
        # With --no-tests only the probes are compared.
        missing = [
            x for x in (a, b) if args.tests and (test_runs.get(x) or {}).get("status") != "ran"
        ]
        if missing:
            entry["error"] = f"did not run the suite: {', '.join(missing)}"
        elif args.tests:
            entry["tests"] = test_disagreements(test_runs, a, b)
        if a in ran_probes and b in ran_probes:
            entry["probes"] = compare_probe_builds(a, ran_probes[a], b, ran_probes[b])
        elif args.probes and (required or any(x in ran_probes for x in (a, b))):
            missing_p = [x for x in (a, b) if x not in ran_probes]
            entry.setdefault("error", "")
            entry["error"] += f" probes did not run: {', '.join(missing_p)}"
        entry["agree"] = not entry.get("error") and not entry.get("tests") and not entry.get("probes")
        agreement.append(entry)
    report["agreement"] = agreement
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def add_precompile_report(report: dict, args, precompile_runs: dict) -> None:
    """The precompile probes' part of the report: every environment's results,
    overlay (or wheel) against upstream with intended/UNEXPECTED marks, and the
    overlay-vs-wheel agreement, which --require-agreement gates on too."""
    expected = load_expected_differences(args.precompile_expected)
    ran = {label: run for label, run in precompile_runs.items() if run.get("status") == "ran"}
    report["precompile_runs"] = {
        label: {k: v for k, v in run.items() if k in ("status", "detail", "seconds", "torch")}
        for label, run in precompile_runs.items()
    }
    report["precompile_cases"] = {
        label: ran[label].get("cases", {}) for label in report["environments"] if label in ran
    }
    ours = "overlay" if "overlay" in ran else ("wheel" if "wheel" in ran else None)
    if ours and "upstream-2.13" in ran:
        differences = compare_precompile(ran[ours], ran["upstream-2.13"], expected, exact=False)
        report["precompile_vs_upstream"] = {"ours": ours, "differences": differences}
        used = {d["case"] for d in differences if d["intended"]} | {
            f"{d['case']}@{d.get('input', d['what'])}" for d in differences if d["intended"]
        }
        report["unused_precompile_expected_differences"] = sorted(k for k in expected if k not in used)
    for entry in report["agreement"]:
        a, b = entry["pair"]
        if a in ran and b in ran:
            entry["precompile"] = [
                {
                    **{k: v for k, v in d.items() if k not in ("ours", "theirs", "intended", "reason")},
                    a: d.get("ours"),
                    b: d.get("theirs"),
                }
                for d in compare_precompile(ran[a], ran[b], {}, exact=True)
            ]
        elif args.probes and args.precompile_probes and (entry["required"] or any(x in ran for x in (a, b))):
            missing = [x for x in (a, b) if x not in ran]
            entry["error"] = (entry.get("error") or "") + f" precompile probes did not run: {', '.join(missing)}"
        entry["agree"] = entry["agree"] and not entry.get("precompile") and not entry.get("error")


def render_versus_upstream(add, title, intro, vs, unused, describe) -> None:
    """One "<ours> vs upstream-2.13" section of the report: the UNEXPECTED then the
    intended differences, each written by ``describe(difference, tag)`` with the
    recorded reason under an intended one, then the recorded differences that no
    longer occur (``unused``)."""
    add(f"## {title}: {vs['ours']} vs upstream-2.13")
    add("")
    add(intro)
    add("")
    unexpected = [d for d in vs["differences"] if not d["intended"]]
    intended = [d for d in vs["differences"] if d["intended"]]
    for heading, group in (("UNEXPECTED differences", unexpected), ("Intended differences", intended)):
        add(f"### {heading} ({len(group)})")
        add("")
        for d in group:
            describe(d, "intended" if d["intended"] else "**UNEXPECTED**")
            if d["intended"]:
                add(f"    - reason: {md(d['reason'])}")
        add("")
    if unused:
        add("Recorded expected differences that no longer occur: " + ", ".join(f"`{k}`" for k in unused))
        add("")


def render_precompile(report: dict) -> list[str]:
    lines: list[str] = []
    add = lines.append
    cases = report.get("precompile_cases") or {}
    if not cases:
        return lines
    vs = report.get("precompile_vs_upstream")
    if vs:
        render_versus_upstream(
            add,
            "Precompile probes",
            "Each probe (tools/behaviour_diff/precompile_probes.py) saves in one fresh process and "
            "loads in another with an empty inductor cache dir (caching_precompile: only "
            "the dynamo/ folder carried over), then runs its steps under "
            "set_stance('fail_on_recompile') unless a step says otherwise.",
            vs,
            report.get("unused_precompile_expected_differences"),
            lambda d, tag: add(
                f"- {tag} `{d['case']}`"
                + (f" step {md(d['input'])!s}" if "input" in d else f" {d['what']}")
                + f": {vs['ours']} **{md(fmt_precompile_decision(d['ours']))}**; "
                f"upstream **{md(fmt_precompile_decision(d['theirs']))}**"
            ),
        )
    labels = list(cases)
    add("## Precompile probe results")
    add("")
    add("| probe | step | " + " | ".join(labels) + " |")
    add("|---|---|" + "---|" * len(labels))
    for name in ordered_case_ids({label: {"cases": c} for label, c in cases.items()}):
        first = next(c[name] for c in cases.values() if name in c)
        add(
            f"| `{name}` ({first['api']}, {first['backend']}) | save / load | "
            + " | ".join(
                md(
                    f"{precompile_phase_decision(c[name]['save'])} / {precompile_phase_decision(c[name]['load'])}"
                )
                if name in c
                else ABSENT
                for c in cases.values()
            )
            + " |"
        )
        for index, step in enumerate(first.get("steps", [])):
            cells = []
            for c in cases.values():
                steps = (c.get(name) or {}).get("steps", [])
                if index >= len(steps):
                    cells.append(ABSENT)
                    continue
                cells.append(fmt_precompile_decision(precompile_step_decision(steps[index])))
            add(f"| | {md(step['label'])} | " + " | ".join(cells) + " |")
    add("")
    return lines


def environment_notes(infos: dict) -> list[str]:
    notes = []
    wheel, overlay = infos.get("wheel") or {}, infos.get("overlay") or {}
    if wheel.get("status") == "absent":
        notes.append(
            "The patched wheel venv does not exist (`make wheel-venv` builds it): the "
            "wheel column is missing."
        )
    if wheel.get("status") == "ok" and overlay.get("series_hash"):
        # 2.7.1+overlay.<YYYYMMDD>.<series hash>: the hash is the last part.
        built_from = wheel["torch"].partition("+overlay.")[2].rpartition(".")[2]
        if built_from != overlay["series_hash"]:
            notes.append(
                f"The patched wheel is STALE: built from series {built_from or '?'}, the "
                f"sources are at series {overlay['series_hash']} (`make wheel-venv` "
                "rebuilds it); overlay-vs-wheel differences may come from that alone."
            )
    return notes


def ordered_case_ids(probe_runs: dict) -> list[str]:
    order: dict[str, None] = {}
    for probes in probe_runs.values():
        for case_id in probes.get("cases", {}):
            order.setdefault(case_id, None)
    return list(order)


def environment_row(label: str, e: dict) -> str:
    """One row of the environments table: torch, description, pytest and probe runs."""
    pytest_info = e.get("pytest") or {}
    if e["status"] != "ok":
        torch_text = f"**{e['status']}**: {md(e.get('detail'))}"
    else:
        torch_text = f"{e['torch']} ({e.get('guards_loader')})"
    pytest_text = pytest_info.get("summary") or pytest_info.get("status", "not run")
    if pytest_info.get("detail"):
        pytest_text += f": {pytest_info['detail']}"
    if pytest_info.get("seconds") is not None:
        pytest_text += f" [{pytest_info['seconds']} s]"
    probes = e.get("probes") or {}
    probe_text = probes.get("status", "not run")
    if probes.get("detail"):
        probe_text += f": {probes['detail']}"
    if probes.get("wall_seconds"):
        probe_text += f" [{probes['wall_seconds']} s]"
    return f"| {label} | {md(torch_text)} | {md(e['description'])} | {md(pytest_text)} | {md(probe_text)} |"


def render_header(report: dict) -> list[str]:
    """Title, when and where the report was made, and the environments table."""
    git = report["git"]
    dirty = f" (+{git['dirty_files']} uncommitted files)" if git["dirty_files"] else ""
    lines = [
        "# Behaviour diff: stock 2.7.1, overlay, patched wheel, upstream 2.13",
        "",
        f"Generated {report['generated']} in {report['seconds']} s at `{git['head'][:12]}`"
        f"{dirty}.",
        "",
        "| environment | torch | what | pytest | probes |",
        "|---|---|---|---|---|",
    ]
    lines.extend(environment_row(label, e) for label, e in report["environments"].items())
    lines.append("")
    return lines


def agreement_line(entry: dict) -> str:
    """The summary's line for one pair of environments."""
    a, b = entry["pair"]
    if entry["agree"]:
        return f"- **{a} vs {b}: agree** on every test and every probe decision."
    parts = []
    if entry.get("error"):
        parts.append(entry["error"].strip())
    if entry.get("tests"):
        parts.append(f"{len(entry['tests'])} tests disagree")
    if entry.get("probes"):
        parts.append(f"{len(entry['probes'])} probe results disagree")
    if entry.get("precompile"):
        parts.append(f"{len(entry['precompile'])} precompile probe results disagree")
    gate = "" if entry["required"] else " (informational here; `make agree-overlay-wheel` gates on it)"
    return f"- **{a} vs {b}: DISAGREE**{gate}: {'; '.join(parts)}."


def versus_upstream_count_line(vs: Optional[dict], what: str) -> list[str]:
    """'<ours> vs upstream-2.13 <what> differences: N, of which M UNEXPECTED.'"""
    if not vs:
        return []
    unexpected = [d for d in vs["differences"] if not d["intended"]]
    return [
        f"- {vs['ours']} vs upstream-2.13 {what} differences: {len(vs['differences'])}, "
        f"of which **{len(unexpected)} UNEXPECTED**."
    ]


def render_summary(report: dict) -> list[str]:
    lines = ["## Summary", ""]
    lines.extend(f"- **Note**: {note}" for note in report.get("notes", []))
    lines.extend(agreement_line(entry) for entry in report["agreement"])
    bugs = report.get("probe_bugs", [])
    lines.append(
        f"- Loaded-vs-reference guard mismatches (bugs): **{len(bugs)}**"
        + (f" ({', '.join(sorted({b['environment'] for b in bugs}))})" if bugs else "")
        + "."
    )
    lines.extend(versus_upstream_count_line(report.get("probe_vs_upstream"), "probe"))
    lines.extend(
        versus_upstream_count_line(report.get("precompile_vs_upstream"), "precompile probe")
    )
    comparison = report["test_comparison"]
    lines.append(
        f"- Tests: {len(comparison['tests'])} across {', '.join(comparison['environments']) or 'no environment'}; "
        f"{len(comparison['differing'])} differ in outcome between environments."
    )
    lines.append("")
    return lines


def render_bugs(report: dict) -> list[str]:
    """The loaded-vs-reference guard mismatches, one table row each."""
    bugs = report.get("probe_bugs", [])
    if not bugs:
        return []
    lines = [
        "## BUGS: loaded guards decide unlike the reference guards they were saved from",
        "",
        "| environment | case | kind | input | reference | loaded | detail |",
        "|---|---|---|---|---|---|---|",
    ]
    for bug in bugs:
        why = bug.get("why") or {}
        detail = bug.get("detail") or "; ".join(f"{k}: {v}" for k, v in why.items())
        lines.append(
            f"| {bug['environment']} | `{bug['case']}` | {md(bug['kind'])} | {md(bug.get('input', ''))} "
            f"| {fmt_decision(bug.get('reference')) if 'reference' in bug else ''} "
            f"| {md(', '.join(f'{c}: {fmt_decision(v)}' for c, v in bug['loaded'].items())) if 'loaded' in bug else ''} "
            f"| {md(detail)} |"
        )
    lines.append("")
    return lines


def render_disagreements(report: dict) -> list[str]:
    """One section per pair of environments that disagree: tests, guard probes and
    precompile probes on which they do."""
    lines: list[str] = []
    add = lines.append
    for entry in report["agreement"]:
        if entry["agree"]:
            continue
        a, b = entry["pair"]
        add(f"## {a} vs {b}: disagreements")
        add("")
        for t in entry.get("tests", []):
            msgs = "; ".join(f"{k}: {v}" for k, v in t["messages"].items())
            add(f"- test `{t['test']}`: {a} {t[a]}, {b} {t[b]}" + (f" — {md(msgs)}" if msgs else ""))
        for p in entry.get("probes", []):
            where = f" input {p['input']!r}" if "input" in p else ""
            add(f"- probe `{p['case']}` {p['what']}{where}: {a} {md(p.get(a))}, {b} {md(p.get(b))}")
        for p in entry.get("precompile", []):
            where = f" step {p['input']!r}" if "input" in p else ""
            add(
                f"- precompile probe `{p['case']}` {p['what']}{where}: {a} "
                f"{md(fmt_precompile_decision(p.get(a)))}, {b} {md(fmt_precompile_decision(p.get(b)))}"
            )
        add("")
    return lines


def guard_difference_lines(vs: dict, d: dict, tag: str) -> list[str]:
    """One guard probe difference against upstream: a status line, or the inputs on
    which the loaded guards decide differently."""
    for side, who in (("ours", vs["ours"]), ("theirs", "upstream")):
        if d.get(f"{side}_self_mismatch"):
            tag += f" (⚠ {who}'s loaded guards disagree with its reference: see BUGS)"
    if d["kind"] == "status":
        return [
            f"- {tag} `{d['case']}`: {vs['ours']} **{d['ours_status']}**"
            + refusal_text(d.get("ours_refusal"))
            + f"; upstream **{d['theirs_status']}**"
            + refusal_text(d.get("theirs_refusal"))
        ]
    lines = [f"- {tag} `{d['case']}`: loaded decisions differ on {len(d['inputs'])} input(s)"]
    for i in d["inputs"]:
        lines.append(
            f"    - {md(i['input'])}: {vs['ours']} ref {fmt_decision(i['ours_reference'])} / "
            f"loaded {fmt_decision(i['ours_loaded'])}; upstream ref "
            f"{fmt_decision(i['theirs_reference'])} / loaded {fmt_decision(i['theirs_loaded'])}"
            + (" (references differ)" if i["references_differ"] else " (**serialization**)")
            + (f"; {vs['ours']}: {md(i['ours_why'])}" if i["ours_why"] else "")
            + (f"; upstream: {md(i['theirs_why'])}" if i["theirs_why"] else "")
        )
    return lines


def render_guard_versus_upstream(report: dict) -> list[str]:
    vs = report.get("probe_vs_upstream")
    if not vs:
        return []
    lines: list[str] = []
    render_versus_upstream(
        lines.append,
        "Guard probes",
        "Decisions compared are those of the LOADED guards in a fresh process. "
        "`references differ` means the two versions' own compile-time guards already "
        "decide differently (their guard sets differ), not a serialization effect.",
        vs,
        report.get("unused_expected_differences"),
        lambda d, tag: lines.extend(guard_difference_lines(vs, d, tag)),
    )
    return lines


def probe_status_cell(status: str, case: dict) -> str:
    """A case's status in one environment, with the refusal or error message."""
    if status == "refused":
        status += f": {md(normalize((case.get('refusal') or {}).get('message', '')))[:140]}"
    elif status in ("trace_error", "reference_error"):
        status += f": {md((case.get('error') or {}).get('message', ''))[:140]}"
    return status


def render_probe_statuses(report: dict) -> list[str]:
    statuses = report.get("probe_statuses") or {}
    if not statuses:
        return []
    probe_labels = list(next(iter(statuses.values())).keys())
    lines = [
        "## Guard probe statuses",
        "",
        "| case | " + " | ".join(probe_labels) + " |",
        "|---|" + "---|" * len(probe_labels),
    ]
    cases = report.get("probe_cases", {})
    for case_id, by_env in statuses.items():
        cells = [
            probe_status_cell(by_env.get(label, ABSENT), cases.get(label, {}).get(case_id, {}))
            for label in probe_labels
        ]
        lines.append(f"| `{case_id}` | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


def render_guard_type_coverage(report: dict) -> list[str]:
    """Which guard types the probes emit in each environment, then the probe cases
    whose battery does not separate."""
    lines: list[str] = []
    add = lines.append
    coverage = report.get("guard_type_coverage") or {}
    if coverage:
        probe_labels = sorted({label for per in coverage.values() for label in per})
        add("## Guard types emitted by the probes (mode `all`)")
        add("")
        add("| guard type | " + " | ".join(probe_labels) + " |")
        add("|---|" + "---|" * len(probe_labels))
        for guard_type, per in coverage.items():
            cells = []
            for label in probe_labels:
                names = per.get(label, [])
                cells.append(f"{len(names)}: {', '.join(names[:4])}{', …' if len(names) > 4 else ''}" if names else ABSENT)
            add(f"| {guard_type} | " + " | ".join(cells) + " |")
        add("")
    weak = {k: v for k, v in (report.get("weak_probes") or {}).items() if v}
    if weak:
        add("Probe cases whose battery does not separate (reference accepts or rejects every input): ")
        for label, cases in weak.items():
            add(f"- {label}: {', '.join(cases)}")
        add("")
    return lines


def render_differing_tests(report: dict) -> list[str]:
    comparison = report["test_comparison"]
    lines = ["## Tests whose outcome differs between environments", ""]
    if not comparison["differing"]:
        lines.append("None.")
    for d in comparison["differing"]:
        outcomes = ", ".join(f"{k} {v}" for k, v in d["outcomes"].items())
        lines.append(f"- `{d['test']}`: {outcomes}")
        for label, message in d["messages"].items():
            lines.append(f"    - {label}: {md(message)}")
    lines.append("")
    return lines


def render_test_outcomes(report: dict) -> list[str]:
    """Every test's outcome in every environment that ran the suite."""
    ran = report["test_comparison"]["environments"]
    lines = [
        "## Test outcomes",
        "",
        "| test | " + " | ".join(ran) + " |",
        "|---|" + "---|" * len(ran),
    ]
    for test_id in report["test_comparison"]["tests"]:
        cells = []
        for label in ran:
            test = report["tests"][label].get(test_id)
            cells.append(test["outcome"] if test else ABSENT)
        marker = " ⚠" if len(set(cells)) > 1 else ""
        lines.append(f"| `{md(test_id)}`{marker} | " + " | ".join(cells) + " |")
    lines.append("")
    return lines


# The report's sections, in order.
# NOTE: [Upstream conformance in the behaviour diff]
# --conformance names the report.json of make upstream-conformance
# (tools/upstream_conformance/run_conformance.py: upstream's own precompile test
# files run unchanged, per environment, beside 2.13's recorded CPU results). Its
# per-file counts for every environment it ran (2.13 itself included when run
# with --envs ...,upstream) and the tests whose outcome differs between them
# become one section of this report, so the suite, the probes and upstream's
# tests are compared in one place. The conformance run decides its own exit
# status; this report only shows it.


def load_included_report(path: Optional[Path], option: str, make_target: str) -> Optional[dict]:
    """The json report an ``option`` names (None: not asked for), which
    ``make_target`` writes."""
    if path is None:
        return None
    if not path.exists():
        raise SystemExit(f"{option} {path}: no such report (run make {make_target} first)")
    return json.loads(path.read_text())


def render_conformance(report: dict) -> list[str]:
    conformance = report.get("conformance")
    if not conformance:
        return []
    envs = conformance["environments"]
    lines = [
        "## Upstream's precompile tests, unchanged (make upstream-conformance)",
        "",
        f"Files: `{md(conformance['tests_root'])}`. Columns: 2.13's recorded CPU result, then each "
        "environment the conformance run ran (2.13 itself as `upstream` when it ran there).",
        "",
        "| file | 2.13 (recorded) | " + " | ".join(envs) + " |",
        "|---|---|" + "---|" * len(envs),
    ]
    per_file: dict[str, dict[str, dict[str, int]]] = {}
    for row in conformance["rows"]:
        name = row["test_id"].split("::")[0].rsplit("/", 1)[-1]
        counts = per_file.setdefault(name, {})
        for label, outcome in [("2.13 (recorded)", row["expected"]), *row["outcomes"].items()]:
            counts.setdefault(label, {"passed": 0, "failed": 0, "skipped": 0})[outcome] += 1

    def cell(c: dict[str, int]) -> str:
        return f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped"

    for name, counts in sorted(per_file.items()):
        lines.append(f"| {md(name)} | {cell(counts['2.13 (recorded)'])} | " + " | ".join(cell(counts[e]) for e in envs) + " |")
    lines += ["", "Tests whose outcome here differs from 2.13's:", ""]
    differing = [r for r in conformance["rows"] if any(r["outcomes"][e] != r["expected"] for e in envs if e != "upstream")]
    for row in differing:
        outcomes = ", ".join(f"{e} {row['outcomes'][e]}" for e in envs)
        lines.append(f"- `{md(row['test_id'].rsplit('/', 1)[-1])}`: 2.13 {row['expected']}, {outcomes}; {row['kind'] or 'no entry'}: {md(row['reason'])}")
    lines.append("")
    return lines


# NOTE: [The transformers sweep in the behaviour diff]
# --sweep names the results_vs_upstream.json that make transformers-sweep-compare
# writes (tools/transformers_sweep/sweep.py compare_results: the same
# architectures and spellings decoded from a package on the overlay and from
# caching_precompile on 2.13). Its counts per spelling and the cases where one
# side passes and the other does not become one section of this report. The
# sweep runs for hours (the nightly workflow); this report only shows its last
# comparison.


def render_sweep(report: dict) -> list[str]:
    sweep = report.get("sweep")
    if not sweep:
        return []
    ours, upstream = sweep["ours"], sweep["upstream"]
    lines = [
        "## The transformers sweep beside 2.13 (make transformers-sweep-compare)",
        "",
        f"Ours: torch {md(ours['torch'])}, {md(ours['backend'])}, packages. Upstream: torch "
        f"{md(upstream['torch'])}, {md(upstream['backend'])}, caching_precompile; transformers "
        f"{md(ours['transformers'])}. Cases passing per spelling (ours / upstream), of the cases both ran:",
        "",
        "| spelling | both ran | ours pass | upstream pass |",
        "|---|---|---|---|",
    ]
    for spelling in sweep["spellings"]:
        both = [row[spelling] for row in sweep["rows"].values() if spelling in row and all(row[spelling])]
        lines.append(
            f"| {md(spelling)} | {len(both)} | {sum(r[0] == 'pass' for r in both)} | "
            f"{sum(r[1] == 'pass' for r in both)} |"
        )
    for title, key in (
        ("2.13 fails where we pass", "upstream_fails_where_ours_passes"),
        ("We fail where 2.13 passes", "ours_fails_where_upstream_passes"),
    ):
        cases = sweep[key]
        lines += ["", f"{title} ({len(cases)}):", ""]
        lines += [f"- {md(c['arch'])} / {md(c['spelling'])}: {md(c['result'])}: {md(c['error'])}" for c in cases]
    lines.append("")
    return lines


# NOTE: [Distributed jobs in the behaviour diff]
# Issue #47's promise is a training job whose compiled work one rank saves and
# every rank of the next job reuses. distributed_jobs.py runs that job in each
# environment with the environment's best path (packages on the overlay;
# 2.13's Mega-Cache, and Mega-Cache with caching_precompile) and records three
# things per job: whether the fresh job recompiles (Dynamo graphs traced, FX
# graph cache misses), whether its per-step losses are bitwise the cold job's
# on every rank, and what rank 0's artifacts did for each rank (everything
# served; only Inductor's graphs, Dynamo traced again; or compiled). They are
# shown side by side, not judged: 2.13 has no way to skip Dynamo's trace for
# these jobs, which is the difference the table is for.

_SERVED_TEXT = {
    "all": "everything (nothing traced or compiled)",
    "inductor": "Inductor's graphs only (Dynamo traced again)",
    "compiled": "no (Inductor compiled)",
}


def distributed_cells(verdict: dict) -> list[str]:
    """The table cells of one job in one environment and mode."""
    if verdict.get("error"):
        return [f"failed: {md(verdict['error'])}", "", ""]
    graphs, fx = verdict.get("graphs_traced", []), verdict.get("fxgraph_cache", [])
    if verdict.get("recompiles"):
        recompiles = (
            "yes: Dynamo graphs per rank "
            + ", ".join(str(n) for n in graphs)
            + "; FX graph cache hit/miss per rank "
            + ", ".join(f"{hit}/{miss}" for hit, miss in fx)
        )
    else:
        recompiles = "no"
        if verdict.get("entries_loaded"):
            recompiles += " (package entries loaded per rank: " + ", ".join(str(n) for n in verdict["entries_loaded"]) + ")"
    equal = verdict.get("losses_bitwise_equal") or []
    if equal and all(equal):
        losses = "yes, every rank"
    else:
        losses = "**NO** on rank " + ", ".join(str(r) for r, same in enumerate(equal) if not same)
    served = verdict.get("served") or []
    if served and len(set(served)) == 1:
        serves = f"every rank: {_SERVED_TEXT.get(served[0], served[0])}"
    else:
        serves = "; ".join(f"rank {r}: {_SERVED_TEXT.get(s, s)}" for r, s in enumerate(served))
    return [recompiles, losses, serves]


def render_distributed(report: dict) -> list[str]:
    """NOTE: [Distributed jobs in the behaviour diff]"""
    runs = report.get("distributed_jobs") or {}
    if not runs:
        return []
    lines = [
        "## Distributed jobs: one rank saves, every rank of a fresh job loads",
        "",
        "tools/behaviour_diff/distributed_jobs.py: DDP with Inductor (bucket_cap_mb=1, DDPOptimizer "
        "splits the graph) and FSDP2 with each block compiled, on 2 gloo CPU ranks; a cold job trains "
        "and rank 0 saves, then a fresh job (new processes, empty Inductor caches) where every rank "
        "loads rank 0's artifacts trains the same steps.",
        "",
        "| job | environment (mode) | fresh job recompiles | losses bitwise = cold job's | "
        "rank 0's artifacts serve | cold / fresh job s |",
        "|---|---|---|---|---|---|",
    ]
    jobs = sorted({job for run in runs.values() for job in (run.get("jobs") or {})})
    for label, run in runs.items():
        if run.get("status") != "ran":
            lines.append(f"| all | {md(label)} | did not run ({run.get('status')}): {md(run.get('detail', ''))} | | | |")
    for job in jobs:
        for label, run in runs.items():
            if run.get("status") != "ran":
                continue
            for mode, verdict in (run.get("jobs") or {}).get(job, {}).items():
                seconds = f"{verdict.get('cold_seconds')} / {verdict.get('fresh_seconds')}"
                cells = distributed_cells(verdict)
                lines.append(f"| {md(job)} | {md(label)} ({md(mode)}) | " + " | ".join(cells) + f" | {seconds} |")
    steps = {run.get("steps") for run in runs.values() if run.get("status") == "ran"}
    if steps:
        lines += ["", f"Steps per job: {', '.join(str(s) for s in sorted(steps))}."]
    lines.append("")
    return lines


REPORT_SECTIONS = (
    render_header,
    render_summary,
    render_bugs,
    render_disagreements,
    render_precompile,
    render_distributed,
    render_conformance,
    render_sweep,
    render_guard_versus_upstream,
    render_probe_statuses,
    render_guard_type_coverage,
    render_differing_tests,
    render_test_outcomes,
)


def render_markdown(report: dict) -> str:
    return "\n".join(line for section in REPORT_SECTIONS for line in section(report))


def refusal_text(refusal: Optional[dict]) -> str:
    if not refusal:
        return ""
    return f" ({md(refusal.get('type', '').rsplit('.', 1)[-1])}: {md(normalize(refusal.get('message', '')))})"


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_pairs(text: str) -> list[tuple[str, str]]:
    pairs = []
    for item in filter(None, (text or "").split(";")):
        a, _, b = item.partition(",")
        if not b:
            raise argparse.ArgumentTypeError(f"expected A,B, got {item!r}")
        pairs.append((a.strip(), b.strip()))
    return pairs


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="report directory")
    parser.add_argument(
        "--envs",
        default=",".join(e.label for e in default_environments()),
        help="comma-separated environments to run (default: all four)",
    )
    parser.add_argument("--no-tests", dest="tests", action="store_false", help="skip the pytest runs")
    parser.add_argument(
        "--junit",
        action="append",
        default=[],
        metavar="LABEL=PATH",
        help="read this environment's test outcomes from a junit XML instead of running "
        "the suite (repeatable)",
    )
    parser.add_argument(
        "--no-probes", dest="probes", action="store_false", help="skip the guard and precompile probes"
    )
    parser.add_argument(
        "--no-precompile-probes",
        dest="precompile_probes",
        action="store_false",
        help="run the guard probes but not the precompile probes",
    )
    parser.add_argument(
        "--no-distributed",
        dest="distributed",
        action="store_false",
        help="skip the distributed jobs (NOTE: [Distributed jobs in the behaviour diff])",
    )
    parser.add_argument(
        "--require-agreement",
        type=parse_pairs,
        default=[],
        metavar="A,B[;C,D]",
        help="exit 1 if these environments disagree on any test, guard probe or precompile "
        "probe (CI: overlay,wheel)",
    )
    parser.add_argument(
        "--fail-on-unexpected",
        action="store_true",
        help="also exit 1 on an UNEXPECTED overlay-vs-upstream probe difference or a "
        "loaded-vs-reference mismatch",
    )
    parser.add_argument(
        "--conformance",
        type=Path,
        default=None,
        help="report.json of make upstream-conformance to include (NOTE: [Upstream conformance in the behaviour diff])",
    )
    parser.add_argument(
        "--sweep",
        type=Path,
        default=None,
        help="results_vs_upstream.json of make transformers-sweep-compare to include "
        "(NOTE: [The transformers sweep in the behaviour diff])",
    )
    parser.add_argument("--expected", type=Path, default=EXPECTED_DIFFERENCES)
    parser.add_argument("--precompile-expected", type=Path, default=PRECOMPILE_EXPECTED_DIFFERENCES)
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="rebuild the report from the results already in --out (after editing the "
        "expected differences, say) instead of running anything",
    )
    parser.add_argument(
        "--jobs", type=int, default=2, help="environments run at once (default 2)"
    )
    parser.add_argument("--pytest-timeout", type=int, default=1200, help="seconds per environment")
    # The precompile probes' serving cases (NOTE: [Serving probes]) compile three
    # tiny Hugging Face models with Inductor: ~4 minutes of an environment's run
    # on a busy 2-core machine, on top of the other probes.
    parser.add_argument("--probe-timeout", type=int, default=1200, help="seconds per environment")
    # Four 2-rank jobs per mode with cold Inductor compiles (2.13 runs two modes).
    parser.add_argument("--distributed-timeout", type=int, default=2400, help="seconds per environment")
    parser.add_argument("pytest_args", nargs="*", help="extra pytest arguments (after --)")
    parser.add_argument("-v", "--verbose", action="store_true")
    return parser


def selected_environments(parser: argparse.ArgumentParser, args) -> list[Environment]:
    """The environments --envs names, after checking that --require-agreement and
    --junit name only those (``args.junit`` becomes a label -> path dict)."""
    wanted = [x.strip() for x in args.envs.split(",") if x.strip()]
    known = {e.label: e for e in default_environments()}
    unknown = [x for x in wanted if x not in known]
    if unknown:
        parser.error(f"unknown environment(s) {unknown}; known: {list(known)}")
    for a, b in args.require_agreement:
        if a not in wanted or b not in wanted:
            parser.error(f"--require-agreement {a},{b} names an environment not in --envs")
    try:
        args.junit = parse_junit_args(args.junit)
    except argparse.ArgumentTypeError as e:
        parser.error(str(e))
    if any(label not in wanted for label in args.junit):
        parser.error(f"--junit names an environment not in --envs: {sorted(args.junit)}")
    return [known[x] for x in wanted]


@dataclasses.dataclass
class EnvironmentRuns:
    """What running the environments produced, each by environment label."""

    infos: dict = dataclasses.field(default_factory=dict)
    tests: dict = dataclasses.field(default_factory=dict)
    probes: dict = dataclasses.field(default_factory=dict)
    precompile: dict = dataclasses.field(default_factory=dict)
    distributed: dict = dataclasses.field(default_factory=dict)


def run_environment_tests(args, environment: Environment, runs: EnvironmentRuns) -> None:
    label = environment.label
    if label in args.junit:
        runs.tests[label] = read_junit_run(args.junit[label])
    elif args.reuse:
        runs.tests[label] = reuse_pytest(environment, args.out)
    else:
        runs.tests[label] = run_pytest(environment, args.out, args.pytest_timeout, args.pytest_args)
    run = runs.tests[label]
    say(f"[{label}] pytest: {run.get('summary') or run['status']} ({run.get('seconds', '?')} s)")


def run_environment_probes(args, environment: Environment, runs: EnvironmentRuns) -> None:
    label = environment.label
    if args.reuse:
        runs.probes[label] = reuse_probes(environment, args.out)
    else:
        runs.probes[label] = run_probes(environment, args.out, args.probe_timeout)
    run = runs.probes[label]
    say(f"[{label}] probes: {run['status']} ({run.get('wall_seconds', '?')} s) {run.get('detail', '')}")
    if not args.precompile_probes:
        return
    runs.precompile[label] = run_precompile_probes(
        environment, args.out, args.probe_timeout, args.reuse
    )
    run = runs.precompile[label]
    say(f"[{label}] precompile probes: {run['status']} ({run.get('seconds', '?')} s) {run.get('detail', '')}")


def run_environment(args, environment: Environment, runs: EnvironmentRuns) -> None:
    label = environment.label
    runs.infos[label] = info = describe_environment(environment)
    say(f"[{label}] {info.get('torch', info['status'] + ': ' + info.get('detail', ''))}")
    if info["status"] != "ok":
        return
    if args.tests:
        run_environment_tests(args, environment, runs)
    if args.probes and environment.probes:
        run_environment_probes(args, environment, runs)
    if args.distributed and environment.distributed:
        runs.distributed[label] = run = run_distributed_jobs(
            environment, args.out, args.distributed_timeout, args.reuse
        )
        say(f"[{label}] distributed jobs: {run['status']} ({run.get('seconds', '?')} s) {run.get('detail', '')}")


def run_environments(args, environments: list[Environment]) -> EnvironmentRuns:
    runs = EnvironmentRuns()
    # The environments are independent processes: run the slowest suites first and
    # up to --jobs of them at once.
    by_cost = sorted(environments, key=lambda e: SLOWEST_FIRST.index(e.label))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in [pool.submit(run_environment, args, e, runs) for e in by_cost]:
            future.result()
    return runs


def exit_status(args, report: dict) -> int:
    """Print the disagreements and UNEXPECTED differences; 1 where --require-agreement
    or --fail-on-unexpected asks to fail on them."""
    status = 0
    for entry in report["agreement"]:
        if entry["required"] and not entry["agree"]:
            a, b = entry["pair"]
            print(
                f"{a} and {b} disagree: {entry.get('error', '').strip()} "
                f"{len(entry.get('tests', []))} tests, {len(entry.get('probes', []))} probe results, "
                f"{len(entry.get('precompile', []))} precompile probe results",
                file=sys.stderr,
            )
            status = 1
    unexpected = [d for d in (report.get("probe_vs_upstream") or {}).get("differences", []) if not d["intended"]]
    unexpected_precompile = [
        d for d in (report.get("precompile_vs_upstream") or {}).get("differences", []) if not d["intended"]
    ]
    bugs = report.get("probe_bugs", [])
    print(
        f"{len(unexpected)} UNEXPECTED guard probe differences, {len(unexpected_precompile)} UNEXPECTED "
        f"precompile probe differences, {len(bugs)} loaded-vs-reference mismatches"
    )
    if args.fail_on_unexpected and (unexpected or unexpected_precompile or bugs):
        status = 1
    return status


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    environments = selected_environments(parser, args)

    started = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = run_environments(args, environments)
    report = build_report(args, environments, runs.infos, runs.tests, runs.probes, started)
    add_precompile_report(report, args, runs.precompile)
    report["conformance"] = load_included_report(args.conformance, "--conformance", "upstream-conformance")
    report["sweep"] = load_included_report(args.sweep, "--sweep", "transformers-sweep-compare")
    report["distributed_jobs"] = runs.distributed
    (args.out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (args.out / "report.md").write_text(render_markdown(report))
    print(f"report: {args.out / 'report.md'} ({report['seconds']} s)")
    return exit_status(args, report)

if __name__ == "__main__":
    sys.exit(main())
