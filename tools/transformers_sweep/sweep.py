"""Sweep of precompile over transformers' text-generating architectures.

Every class of transformers 4.52.4's ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`` and
``MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES`` (issue 46), built from a tiny
config (``shrink.py``), is greedily decoded under torch.compile five ways
(NOTE: [Sweep spellings] in ``decoding.py``), saved in one fresh process and
loaded in another, under ``fail_on_recompile`` on a prompt length and a number
of steps never seen at save, its tokens compared with eager's.

Usage (the python of the overlay's venv runs the sweep; each phase runs in
the python of ``--env``)::

    TORCH_OVERLAY=1 .venv/bin/python tools/transformers_sweep/sweep.py --out DIR \\
        [--archs gpt2,t5] [--spellings a,c] [--env overlay|upstream] [--jobs 1] [--work DIR]
    .venv/bin/python tools/transformers_sweep/sweep.py --out DIR --eager-check

writes ``DIR/results.json`` and ``DIR/results.md`` (architecture x spelling);
``--eager-check`` writes ``DIR/eager_check.json`` and ``DIR/eager_check.md``
instead: for every architecture, whether its tiny config and model build and
each spelling decodes eagerly (no compile; a few phases in all).
"""

# NOTE: [Sweep results]
# Per architecture and spelling, a SAVE process then a LOAD process (fresh
# interpreters, each with an empty TORCHINDUCTOR_CACHE_DIR of its own: the
# load's holds only the save's dynamo/ folder on upstream, which is where
# caching_precompile keeps what it loads; the overlay's package is a
# directory of its own). Backend aot_eager on the overlay, inductor on 2.13
# (its caching_precompile keeps backend artifacts only for Inductor graphs),
# dynamic=True on both. The result is the first of these that applies:
#   eager-fails  eager greedy decoding of the spelling fails (at either length):
#                nothing compiled to judge; the error is the eager one
#   crash-save   the save process raised (stage named) or died (exit, timeout);
#                a raise before the save is tried again without precompile
#                (without_precompile: "runs", or that error), saying whose it is
#   refused      save_package raised a PackageError naming what it refused
#   crash-load   the load process raised (stage named) or died
#   wrong-tokens the compiled tokens differ from eager's (at save or load)
#   refused      the save left entries out with a warning naming a guard type
#                (or another reason); the load's outcome is kept beside it
#   recompiles   a call under fail_on_recompile compiled: its error's first line;
#                the load process then runs the save's and the load's workloads
#                under a plain torch.compile (in_one_process: "runs", or the
#                recompile that the model has without any package)
#   pass         the load ran every call from the package, tokens equal eager's
# One architecture's failure never stops the sweep: a phase that dies is
# reported by its exit code (or the timeout) and the last line of its stderr,
# and results.json is rewritten after every case.

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional


HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
sys.path.insert(0, str(HERE))

import shrink


log = logging.getLogger(__name__)

SPELLINGS = ("a", "b", "c", "d", "e")
# The python of each environment, and what its phases add to the environment.
PYTHONS = {"overlay": REPO / ".venv/bin/python", "upstream": REPO / ".venv-upstream/bin/python"}
ENV_VARS: dict[str, dict[str, Optional[str]]] = {
    "overlay": {"TORCH_OVERLAY": "1"},
    "upstream": {"TORCH_OVERLAY": None},
}
PHASE_SCRIPT = HERE / "sweep_phase.py"
REPORT_PATH_ENV = "TORCH_FRESH_PROCESS_REPORT"
DEFAULT_TIMEOUT_S = 240
# Architectures per eager-check process (a crash costs the rest of its chunk
# one restart).
EAGER_CHECK_CHUNK = 40
RESULTS_JSON, RESULTS_MD = "results.json", "results.md"
EAGER_JSON, EAGER_MD = "eager_check.json", "eager_check.md"


# -- running phases ---------------------------------------------------------------


def phase_env(env: str, cache_dir: Optional[Path], report: Path, torch_logs: str = "recompiles") -> dict[str, str]:
    environ = dict(os.environ)
    for name, value in ENV_VARS[env].items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    environ.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
        OMP_NUM_THREADS="1", TORCH_LOGS=torch_logs,
    )
    environ[REPORT_PATH_ENV] = str(report)
    if cache_dir is not None:
        environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir)
    return environ


def run_phase(
    env: str, args: list[str], work: Path, name: str, cache_dir: Optional[Path], timeout_s: float,
    json_report: bool = True,
) -> dict[str, Any]:
    """Runs sweep_phase.py ``args`` in a fresh interpreter of ``env``; returns
    {"rc", "seconds", "report" (None if it wrote none; its path unless
    ``json_report``), "stderr_tail", "recompile_log", "traced"}."""
    report = work / f"{name}.json"
    report.unlink(missing_ok=True)
    cmd = [str(PYTHONS[env]), "-P", str(PHASE_SCRIPT), *args]
    started = time.perf_counter()
    with open(work / f"{name}.log", "w") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, cwd=work,
            env=phase_env(env, cache_dir, report, "recompiles,dynamo" if name == "load" else "recompiles"),
            start_new_session=True,
        )
        try:
            rc: Any = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # Its whole session: Inductor's compile workers too.
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            rc = "timeout"
    lines = [line for line in (work / f"{name}.log").read_text(errors="replace").splitlines() if line.strip()]
    return {
        "rc": rc,
        "seconds": round(time.perf_counter() - started, 1),
        "report": (json.loads(report.read_text()) if json_report else report) if report.exists() else None,
        "stderr_tail": lines[-1][:300] if lines else "",
        "recompile_log": [line[:300] for line in lines if "Recompiling function" in line or "triggered by" in line][:4],
        # TORCH_LOGS=dynamo's line for each frame Dynamo starts to trace.
        "traced": [line.split("start tracing", 1)[1].strip()[:200] for line in lines if "torchdynamo start tracing" in line][:8],
    }


def _died(run: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    if run["rc"] == "timeout":
        return {"stage": "process", "type": "timeout", "message": f"ran over {timeout_s:g} s"}
    return {"stage": "process", "type": f"exit {run['rc']}", "message": run["stderr_tail"]}


def run_case(arch_id: str, spelling: str, env: str, work_root: Path, timeout_s: float) -> dict[str, Any]:
    """Save, then load (NOTE: [Sweep results])."""
    work = work_root / env / arch_id.replace(":", "-") / spelling
    shutil.rmtree(work, ignore_errors=True)
    save_cache, load_cache = work / "save-cache", work / "load-cache"
    save_cache.mkdir(parents=True)
    load_cache.mkdir()
    phase_args = ["--archs", arch_id, "--spelling", spelling, "--env", env, "--work", str(work)]
    save = run_phase(env, ["--phase", "save", *phase_args], work, "save", save_cache, timeout_s)
    case: dict[str, Any] = {"arch": arch_id, "spelling": spelling, "env": env, "save_seconds": save["seconds"]}
    saved = save["report"]
    if saved is None:
        return {**case, "result": "crash-save", "error": _died(save, timeout_s)}
    case.update(
        warnings=saved.get("warnings", []), left_out=saved.get("left_out", []),
        guard_types=saved.get("guard_types", []), entries=saved.get("entries"),
    )
    if saved["outcome"] == "eager-fails":
        return {**case, "result": "eager-fails", "error": saved["error"]}
    if saved["outcome"] == "crash":
        return {**case, "result": "crash-save", "error": saved["error"], "without_precompile": saved.get("without_precompile")}
    if saved["outcome"] == "refused":
        return {**case, "result": "refused", "error": saved["error"]}
    if saved["tokens"] != saved["eager_tokens"]:
        return {**case, "result": "wrong-tokens", "where": "save", "tokens": saved["tokens"], "eager_tokens": saved["eager_tokens"]}
    if env == "upstream" and (save_cache / "dynamo").is_dir():
        # What caching_precompile loads from (NOTE: [Serving probes] in
        # tools/behaviour_diff/precompile_probes.py).
        shutil.copytree(save_cache / "dynamo", load_cache / "dynamo")
    load = run_phase(env, ["--phase", "load", *phase_args], work, "load", load_cache, timeout_s)
    case["load_seconds"] = load["seconds"]
    case["max_logit_difference"] = {"save": saved.get("max_logit_difference")}
    loaded = load["report"]
    if loaded is None:
        return {**case, "result": "crash-load", "error": _died(load, timeout_s)}
    case["load_warnings"] = loaded.get("warnings", [])
    case["max_logit_difference"]["load"] = loaded.get("max_logit_difference")
    if loaded["outcome"] == "eager-fails":
        return {**case, "result": "eager-fails", "error": loaded["error"]}
    if loaded["outcome"] == "crash":
        return {**case, "result": "crash-load", "error": loaded["error"]}
    load_outcome: dict[str, Any]
    if loaded["outcome"] == "recompile":
        load_outcome = {"result": "recompiles", "error": loaded["error"], "recompile_log": load["recompile_log"]}
    elif loaded["tokens"] != loaded["eager_tokens"]:
        return {**case, "result": "wrong-tokens", "where": "load", "tokens": loaded["tokens"], "eager_tokens": loaded["eager_tokens"]}
    elif loaded.get("frames_compiled"):
        load_outcome = {
            "result": "recompiles",
            "error": {
                "stage": "decode under fail_on_recompile", "type": "compiled at load",
                "message": f"{loaded['frames_compiled']} frame(s) compiled at load without "
                "fail_on_recompile raising: " + "; ".join(load["traced"]),
            },
        }
    else:
        load_outcome = {"result": "pass"}
    if "in_one_process" in loaded:
        load_outcome["in_one_process"] = loaded["in_one_process"]
    if case["left_out"]:
        return {**case, "result": "refused", "load": load_outcome}
    return {**case, **load_outcome}


# -- the eager check ----------------------------------------------------------------


def eager_check(arch_ids: list[str], env: str, work_root: Path, timeout_s: float) -> dict[str, dict]:
    """Every architecture's tiny config, model and eager decoding, a chunk of
    architectures per process; a process that dies costs the architecture it
    was at, and the rest of its chunk runs again."""
    work = work_root / env / "eager-check"
    work.mkdir(parents=True, exist_ok=True)
    rows: dict[str, dict] = {}
    pending = list(arch_ids)
    while pending:
        chunk = pending[:EAGER_CHECK_CHUNK]
        run = run_phase(
            env, ["--phase", "eager-check", "--archs", ",".join(chunk)], work, "eager-check", None,
            timeout_s * 4, json_report=False,
        )
        report = run["report"]
        done = [json.loads(line) for line in report.read_text().splitlines()] if report else []
        for row in done:
            rows[row["arch"]] = row
        remaining = [a for a in chunk if a not in rows]
        if remaining:
            # It died (or ran out of time) at the first it did not report.
            stuck = remaining[0]
            rows[stuck] = {"arch": stuck, "config": _died(run, timeout_s * 4)}
            remaining = remaining[1:]
        pending = remaining + pending[len(chunk):]
        print(f"[eager-check] {len(rows)}/{len(arch_ids)}", flush=True)
    return {a: rows[a] for a in arch_ids}


# -- output ----------------------------------------------------------------------------


def _error_text(error: Optional[dict]) -> str:
    if not error:
        return ""
    where = f" at {error['frame']}" if error.get("frame") else ""
    return f"[{error['stage']}] {error['type']}: {error['message']}{where}"


def _cell(case: Optional[dict]) -> str:
    if case is None:
        return ""
    result = case["result"]
    if result == "refused" and case.get("guard_types"):
        result += " (" + ", ".join(case["guard_types"]) + ")"
    if result == "refused" and case.get("load"):
        result += f"; load: {case['load']['result']}"
    difference = (case.get("max_logit_difference") or {}).get("load")
    if result == "pass" and difference is not None:
        result += f" (max logit diff {difference:.1g})"
    return result


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_results(out_dir: Path, results: dict[str, Any]) -> None:
    tmp = out_dir / (RESULTS_JSON + ".tmp")
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(out_dir / RESULTS_JSON)
    spellings = results["spellings"]
    lines = [
        f"# transformers sweep: {results['env']} (torch {results['torch']}, transformers {results['transformers']})",
        "",
        f"Save: {results['save']}; load: {results['load']}, under fail_on_recompile, "
        f"in a fresh process with an empty inductor cache; backend {results['backend']}, dynamic=True. "
        "Results as in NOTE: [Sweep results] (tools/transformers_sweep/sweep.py); a pass gives "
        "how far the loaded logits were from eager's at most.",
        "",
        "Spellings: " + "; ".join(f"{s}. {results['spelling_docs'][s]}" for s in spellings),
        "",
        "| architecture | class | " + " | ".join(spellings) + " |",
        "|---|---|" + "---|" * len(spellings),
    ]
    for arch_id, row in results["cases"].items():
        cells = [_cell(row.get(s)) for s in spellings]
        lines.append(f"| {arch_id} | {results['classes'][arch_id]} | " + " | ".join(cells) + " |")
    details = []
    for arch_id, row in results["cases"].items():
        for s in spellings:
            case = row.get(s)
            if not case or case["result"] == "pass":
                continue
            text = _error_text(case.get("error") or (case.get("load") or {}).get("error"))
            if case["result"] == "wrong-tokens":
                text = f"at {case['where']}: compiled {case['tokens']}, eager {case['eager_tokens']}"
            details.append(f"- **{arch_id} / {s}: {case['result']}** {_md_escape(text)}")
            control = case.get("without_precompile")
            if control is not None:
                control = control if control == "runs" else _error_text(control)
                details.append(f"  - the same compile without precompile: {_md_escape(control)}")
            control = case.get("in_one_process", (case.get("load") or {}).get("in_one_process"))
            if control is not None:
                control = control if control == "runs" else _error_text(control)
                details.append(
                    "  - save's then load's workload in one process, plain torch.compile: "
                    + _md_escape(control)
                )
            for message in case.get("left_out", [])[:5]:
                details.append(f"  - left out at save: `{_md_escape(message)}`")
    if details:
        lines += ["", "## Non-pass results", "", *details]
    (out_dir / RESULTS_MD).write_text("\n".join(lines) + "\n")


COMPARISON_MD = "results_vs_upstream.md"
COMPARISON_JSON = "results_vs_upstream.json"
# Results that decode from the package as eager does; the rest fail the case.
_PASSING = ("pass",)


def compare_results(ours: dict[str, Any], upstream: dict[str, Any]) -> dict[str, Any]:
    """The overlay's and upstream 2.13's results of the same cases: per case
    both results, and the cases where one side passes and the other does not
    (a case one side did not run, or that fails eagerly, is in neither list)."""
    spellings = [s for s in SPELLINGS if s in ours["spellings"] or s in upstream["spellings"]]
    rows: dict[str, dict[str, list[str]]] = {}
    ahead: list[dict[str, str]] = []
    behind: list[dict[str, str]] = []
    arch_ids = list(ours["cases"]) + [a for a in upstream["cases"] if a not in ours["cases"]]
    for arch_id in arch_ids:
        rows[arch_id] = {}
        for s in spellings:
            mine = ours["cases"].get(arch_id, {}).get(s)
            theirs = upstream["cases"].get(arch_id, {}).get(s)
            rows[arch_id][s] = [mine["result"] if mine else "", theirs["result"] if theirs else ""]
            if mine is None or theirs is None or "eager-fails" in (mine["result"], theirs["result"]):
                continue
            if mine["result"] in _PASSING and theirs["result"] not in _PASSING:
                ahead.append({"arch": arch_id, "spelling": s, "result": _cell(theirs),
                              "error": _error_text(theirs.get("error"))[:300]})
            elif theirs["result"] in _PASSING and mine["result"] not in _PASSING:
                behind.append({"arch": arch_id, "spelling": s, "result": _cell(mine),
                               "error": _error_text(mine.get("error"))[:300]})
    return {
        "ours": {k: ours[k] for k in ("env", "torch", "transformers", "backend")},
        "upstream": {k: upstream[k] for k in ("env", "torch", "transformers", "backend")},
        "spellings": spellings,
        "rows": rows,
        "upstream_fails_where_ours_passes": ahead,
        "ours_fails_where_upstream_passes": behind,
    }


def write_comparison(out_dir: Path, ours_dir: Path, upstream_dir: Path) -> None:
    """``out_dir``/results_vs_upstream.md and .json: compare_results of the two
    runs' directories (the behaviour diff reads the json: make diff-upstream)."""
    ours = json.loads((ours_dir / RESULTS_JSON).read_text())
    upstream = json.loads((upstream_dir / RESULTS_JSON).read_text())
    comparison = compare_results(ours, upstream)
    spellings = comparison["spellings"]
    lines = [
        "# transformers sweep: the overlay beside upstream",
        "",
        f"Overlay: torch {ours['torch']}, backend {ours['backend']}, package save/load. "
        f"Upstream: torch {upstream['torch']}, backend {upstream['backend']}, caching_precompile with "
        "save_cache_artifacts / load_cache_artifacts. Same tiny configs, prompts and calls "
        "(NOTE: [Sweep results] in tools/transformers_sweep/sweep.py). Each cell: ours / upstream; "
        "empty where that side did not run the case.",
        "",
        "| architecture | " + " | ".join(spellings) + " |",
        "|---|" + "---|" * len(spellings),
    ]
    for arch_id, row in comparison["rows"].items():
        lines.append(f"| {arch_id} | " + " | ".join(f"{row[s][0]} / {row[s][1]}" for s in spellings) + " |")
    for title, key, side in (
        ("Upstream fails where the overlay passes", "upstream_fails_where_ours_passes", "upstream"),
        ("The overlay fails where upstream passes", "ours_fails_where_upstream_passes", "ours"),
    ):
        cases = comparison[key]
        lines += ["", f"## {title} ({len(cases)})", ""]
        lines += [f"- {c['arch']} / {c['spelling']}: {side} {_md_escape(c['result'])}: {_md_escape(c['error'])}"
                  for c in cases]
    (out_dir / COMPARISON_MD).write_text("\n".join(lines) + "\n")
    (out_dir / COMPARISON_JSON).write_text(json.dumps(comparison, indent=1))


def write_eager_check(out_dir: Path, rows: dict[str, dict], env: str) -> None:
    (out_dir / EAGER_JSON).write_text(json.dumps(rows, indent=1))
    ok = [a for a, r in rows.items() if r.get("build") == "ok" and all(v == "ok" for v in r["eager"].values())]
    lines = [
        f"# transformers sweep, eager check ({env})",
        "",
        f"{len(rows)} architectures; {len(ok)} build and decode eagerly in every spelling "
        "(prompt 5 with 4 new tokens and prompt 9 with 7, no compile).",
        "",
        "| architecture | class | config | model | " + " | ".join(SPELLINGS) + " |",
        "|---|---|---|---|" + "---|" * len(SPELLINGS),
    ]
    failures = []
    for arch_id, row in rows.items():
        config = "ok" if row.get("config") == "ok" else "fails"
        build = "ok" if row.get("build") == "ok" else ("" if row.get("build") is None else "fails")
        eager = row.get("eager", {})
        cells = ["ok" if eager.get(s) == "ok" else ("fails" if s in eager else "") for s in SPELLINGS]
        lines.append(f"| {arch_id} | {row.get('class', '')} | {config} | {build} | " + " | ".join(cells) + " |")
        for what, value in (("config", row.get("config")), ("model", row.get("build")), *((f"eager {s}", eager.get(s)) for s in SPELLINGS)):
            if isinstance(value, dict):
                failures.append(f"- **{arch_id}** {what}: {_md_escape(_error_text(value))}")
    lines += ["", "## Failures", "", *failures]
    (out_dir / EAGER_MD).write_text("\n".join(lines) + "\n")


# -- main --------------------------------------------------------------------------------


def select_archs(spec: str) -> list[str]:
    """Sweep ids from a comma-separated list: an id, or a model type (every
    id of that type)."""
    known = shrink.architectures()
    if not spec:
        return list(known)
    chosen: list[str] = []
    for name in (n.strip() for n in spec.split(",") if n.strip()):
        matches = [a for a in known if a == name] or [a for a, arch in known.items() if arch.model_type == name]
        if not matches:
            raise SystemExit(f"unknown architecture {name!r}")
        chosen += [m for m in matches if m not in chosen]
    return chosen


def _versions(env: str) -> dict[str, str]:
    out = subprocess.run(
        [str(PYTHONS[env]), "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
        capture_output=True, text=True, env=phase_env(env, None, Path(os.devnull)), check=False,
    ).stdout.split()
    return {"torch": out[0] if out else "?", "transformers": out[1] if len(out) > 1 else "?"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--compare", nargs=2, type=Path, metavar=("OURS", "UPSTREAM"),
        help="write OUT/results_vs_upstream.md from two runs' directories, and run nothing",
    )
    parser.add_argument("--archs", default="", help="comma-separated ids or model types (default: all)")
    parser.add_argument("--spellings", default=",".join(SPELLINGS))
    parser.add_argument("--env", choices=sorted(PYTHONS), default="overlay")
    parser.add_argument("--jobs", type=int, default=1, help="cases run side by side")
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds per phase")
    parser.add_argument("--eager-check", action="store_true", help="tiny configs and eager decoding only")
    parser.add_argument("--work", type=Path, help="packages, caches and phase logs (default: OUT/work)")
    parser.add_argument(
        "--update", action="store_true",
        help="keep OUT/results.json's other cases (same env), replacing those run now",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.compare:
        write_comparison(out_dir, *(d.resolve() for d in args.compare))
        return 0
    work_root = (args.work or out_dir / "work").resolve()
    arch_ids = select_archs(args.archs)
    archs = shrink.architectures()
    if args.eager_check:
        write_eager_check(out_dir, eager_check(arch_ids, args.env, work_root, args.timeout), args.env)
        return 0
    spellings = [s for s in args.spellings.split(",") if s]
    unknown = [s for s in spellings if s not in SPELLINGS]
    if unknown:
        parser.error(f"unknown spellings {unknown}; known: {SPELLINGS}")
    import decoding

    backend = "aot_eager" if args.env == "overlay" else "inductor"
    results: dict[str, Any] = {
        "env": args.env, **_versions(args.env), "backend": backend,
        "save": "prompt 5 tokens, 4 new tokens", "load": "prompt 9 tokens, 7 new tokens",
        "spellings": spellings, "spelling_docs": {s: decoding.SPELLINGS[s] for s in spellings},
        "classes": {a: archs[a].class_name for a in arch_ids},
        "cases": {a: {} for a in arch_ids},
    }
    previous = out_dir / RESULTS_JSON
    if args.update and previous.exists():
        kept = json.loads(previous.read_text())
        if kept.get("env") == args.env:
            for arch_id, row in kept["cases"].items():
                results["cases"].setdefault(arch_id, {}).update(
                    {s: case for s, case in row.items() if not (arch_id in arch_ids and s in spellings)}
                )
                results["classes"].setdefault(arch_id, kept["classes"][arch_id])
            # The table keeps its rows where they were; new architectures go last.
            order = [*kept["cases"], *(a for a in results["cases"] if a not in kept["cases"])]
            results["cases"] = {a: results["cases"][a] for a in order}
            results["classes"] = {a: results["classes"][a] for a in order}
            results["spellings"] = sorted(set(spellings) | set(kept["spellings"]))
            results["spelling_docs"] = {s: decoding.SPELLINGS[s] for s in results["spellings"]}
    lock = threading.Lock()
    started = time.perf_counter()

    def one(arch_id: str, spelling: str) -> None:
        try:
            case = run_case(arch_id, spelling, args.env, work_root, args.timeout)
        except Exception as e:  # the runner's own failure, for this case only
            log.exception("%s / %s", arch_id, spelling)
            case = {"arch": arch_id, "spelling": spelling, "result": "crash-save",
                    "error": {"stage": "runner", "type": type(e).__name__, "message": str(e)[:300]}}
        with lock:
            results["cases"][arch_id][spelling] = case
            results["seconds"] = round(time.perf_counter() - started, 1)
            write_results(out_dir, results)
            seconds = case.get("save_seconds", 0) + case.get("load_seconds", 0)
            print(f"[{args.env}] {arch_id} / {spelling}: {_cell(case)} ({seconds:.0f} s) {_error_text(case.get('error'))[:160]}", flush=True)

    jobs = [(a, s) for a in arch_ids for s in spellings]
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for future in [pool.submit(one, a, s) for a, s in jobs]:
            future.result()
    write_results(out_dir, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
