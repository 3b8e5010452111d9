"""Spawn to first generated token: Inductor package loads against eager, over a
fixed sample of the transformers sweep's architectures (issue #46, item 2).

For each architecture of :data:`SAMPLE` (ids of
``tools/transformers_sweep/shrink.architectures()``) one save process compiles
``model.forward`` with Inductor and ``dynamic=True`` into a package, runs
generate() at prompt lengths 5 and 9 and saves. Then ``--rounds`` rounds, each
starting, per architecture, one eager process and one package process (fresh
interpreters, the order alternating by round), timed by this process from just
before the spawn to the moment it reads the child's first-token line. Reports
min and median seconds, the ratio of medians (package / eager), the min of the
per-round ratios, and the sample's median ratio, into
``benchmarks/results/transformers_first_token.{json,md}``.

    make bench-transformers-first-token
    TORCH_OVERLAY=1 python benchmarks/transformers_first_token.py --archs gpt2,t5 --rounds 3
"""

# NOTE: [First-token processes]
# Every measured child is this file run with --child (so it imports nothing
# but the standard library before its own timed imports) in an environment like
# the sweep's phases (tools/transformers_sweep/sweep.py): HF_HUB_OFFLINE,
# TRANSFORMERS_OFFLINE, OMP_NUM_THREADS=1 and torch.set_num_threads(1), the
# overlay on (TORCH_OVERLAY=1, this worktree first on PYTHONPATH, the overlay
# cache of build/overlay-cache). What both kinds of child do:
# * eager: import torch, import the sweep's tooling (transformers with it),
#   build the tiny seeded model, generate() one greedy token of the 9-token
#   prompt (decoding.greedy_generate);
# * package: the same, plus model.forward = torch.compile(model.forward,
#   backend="inductor", dynamic=True, package=DIR) and load_package() before the
#   generate(), which runs under set_stance("fail_on_recompile"), with an empty
#   TORCHINDUCTOR_CACHE_DIR of its own (the package carries its kernels).
# Right after its first token a child prints one FIRST_TOKEN line and flushes;
# the parent's clock stops when it reads that line, so the figure is spawn to
# first token (interpreter start included, interpreter exit not). Only then,
# untimed, does the child check its work and report it on a second line: the
# package child's token against the eager token the save process computed,
# the frames Dynamo compiled during the generate() (0 when the package served
# every call), and each child's phase times (imports, build, compile wrapper,
# load_package, the generate()) for "where the time goes". A child that fails
# (fail_on_recompile raising included) reports the error instead of a token,
# and the parent records the failure rather than a time.
#
# NOTE: [Save process]
# One per architecture, before any round, with an empty TORCHINDUCTOR_CACHE_DIR
# of its own: the eager token of the 9-token prompt (what the package children
# must reproduce), then a fresh model of the same seed compiled as the package
# child compiles it, generate() of SAVE_NEW_TOKENS tokens at prompt length 5
# and then 9 (so the entries cover the prefill of both lengths and the
# one-token decode steps), then save_package(). A save that fails is reported
# with its stage and error in the results, and that architecture is not timed.
# Saves are not timed themselves (their seconds are reported for scale) and may
# run two at a time (--save-jobs); no round starts before every save is done.

from __future__ import annotations

import argparse
import concurrent.futures
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
SWEEP_DIR = ROOT / "tools" / "transformers_sweep"
RESULTS = ROOT / "benchmarks" / "results" / "transformers_first_token"

# Decoder-only (gpt2 ... falcon), sliding window (mistral, qwen2's config has
# one too), MoE (mixtral) and encoder-decoder (seq2seq:bart, t5).
SAMPLE = (
    "gpt2", "gpt_neox", "opt", "llama", "qwen2", "mistral", "phi3", "falcon",
    "mixtral", "seq2seq:bart", "t5",
)
KINDS = {
    "gpt2": "decoder-only", "gpt_neox": "decoder-only", "opt": "decoder-only",
    "llama": "decoder-only", "qwen2": "decoder-only", "mistral": "decoder-only, sliding window",
    "phi3": "decoder-only", "falcon": "decoder-only", "mixtral": "decoder-only, MoE, sliding window",
    "seq2seq:bart": "encoder-decoder", "t5": "encoder-decoder",
}
SAVE_PROMPTS = (5, 9)
SAVE_NEW_TOKENS = 3
FIRST_TOKEN_PROMPT = 9
GOAL = 1.2
FIRST_TOKEN = "FIRST_TOKEN"
CHILD_REPORT = "CHILD_REPORT"
SAVE_TIMEOUT_S = 1200
CHILD_TIMEOUT_S = 300


# -- children (NOTE: [First-token processes], NOTE: [Save process]) ---------------


def _child_setup():
    """Imports of a child, timed: torch, then the sweep's tooling."""
    marks = {}
    start = time.perf_counter()
    import torch

    marks["import torch"] = time.perf_counter() - start
    torch.set_num_threads(1)
    start = time.perf_counter()
    sys.path.insert(0, str(SWEEP_DIR))
    import decoding
    import shrink
    import transformers  # noqa: F401  (already imported by shrink; named for the reader)

    marks["import transformers + sweep tooling"] = time.perf_counter() - start
    return torch, decoding, shrink, marks


def _compile_options(package: str) -> dict[str, Any]:
    return {"backend": "inductor", "dynamic": True, "package": package}


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def child_first_token(kind: str, arch_id: str, package: Optional[str]) -> dict[str, Any]:
    """An eager or package child: prints FIRST_TOKEN right after its first token,
    returns what it reports afterwards."""
    torch, decoding, shrink, marks = _child_setup()
    start = time.perf_counter()
    model = shrink.build_model(shrink.architectures()[arch_id])
    ids = decoding.prompt(model.config, FIRST_TOKEN_PROMPT)
    marks["build model + prompt"] = time.perf_counter() - start
    frames = None
    if kind == "package":
        start = time.perf_counter()
        fn = decoding.compile_for("c", model, **_compile_options(package))
        marks["torch.compile wrapper"] = time.perf_counter() - start
        start = time.perf_counter()
        decoding.package_holder("c", fn, model).load_package()
        marks["load_package()"] = time.perf_counter() - start
        frames = _frames_compiled()
        start = time.perf_counter()
        with torch.compiler.set_stance("fail_on_recompile"):
            decoded = decoding.greedy_generate(model, ids, 1)
    else:
        start = time.perf_counter()
        decoded = decoding.greedy_generate(model, ids, 1)
    marks["generate() of the first token"] = time.perf_counter() - start
    print(f"{FIRST_TOKEN} {decoded.tokens[0]}", flush=True)
    report: dict[str, Any] = {"token": decoded.tokens[0], "phases": marks}
    if frames is not None:
        report["frames_compiled"] = _frames_compiled() - frames
    return report


def child_save(arch_id: str, package: str) -> dict[str, Any]:
    """The save process (NOTE: [Save process])."""
    torch, decoding, shrink, marks = _child_setup()
    arch = shrink.architectures()[arch_id]
    report: dict[str, Any] = {}
    stage = "eager generate()"
    try:
        eager_model = shrink.build_model(arch)
        eager = decoding.greedy_generate(eager_model, decoding.prompt(eager_model.config, FIRST_TOKEN_PROMPT), 1)
        report["eager_token"] = eager.tokens[0]
        stage = "compile"
        model = shrink.build_model(arch)
        fn = decoding.compile_for("c", model, **_compile_options(package))
        report["compiled_tokens"] = {}
        for length in SAVE_PROMPTS:
            stage = f"compiled generate() at prompt length {length}"
            start = time.perf_counter()
            decoded = decoding.greedy_generate(model, decoding.prompt(model.config, length), SAVE_NEW_TOKENS)
            marks[stage] = time.perf_counter() - start
            report["compiled_tokens"][str(length)] = decoded.tokens
        stage = "save_package()"
        start = time.perf_counter()
        decoding.package_holder("c", fn, model).save_package()
        marks[stage] = time.perf_counter() - start
        manifest = Path(package) / "manifest.json"
        if manifest.exists():
            report["entries"] = json.loads(manifest.read_text()).get("entries")
        report["outcome"] = "saved"
    except Exception as e:
        traceback.print_exc()
        report["outcome"] = "failed"
        report["error"] = {"stage": stage, "type": type(e).__name__, "message": str(e).strip().splitlines()[0][:400]
                           if str(e).strip() else ""}
    report["phases"] = marks
    return report


def child_main(args) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.child == "save":
            report = child_save(args.arch, args.package)
        else:
            report = child_first_token(args.child, args.arch, args.package)
            if args.expect_token is not None and report["token"] != args.expect_token:
                report["error"] = f"token {report['token']} != eager's {args.expect_token}"
            elif report.get("frames_compiled"):
                report["error"] = f"Dynamo compiled {report['frames_compiled']} frame(s) after load_package()"
    except Exception as e:
        traceback.print_exc()
        first = str(e).strip().splitlines()[0][:400] if str(e).strip() else ""
        report = {"error": f"{type(e).__name__}: {first}"}
    print(f"{CHILD_REPORT} {json.dumps(report)}", flush=True)
    return 0


# -- the parent -------------------------------------------------------------------


def child_env(inductor_cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TRANSFORMERS_VERBOSITY="error",
        OMP_NUM_THREADS="1", TORCH_OVERLAY="1", TORCHINDUCTOR_CACHE_DIR=str(inductor_cache),
    )
    env.setdefault("TORCH_OVERLAY_CACHE_DIR", str(ROOT / "build" / "overlay-cache"))
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _child_command(kind: str, arch_id: str, package: Path, expect_token: Optional[int]) -> list[str]:
    command = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--arch", arch_id,
               "--package", str(package)]
    if expect_token is not None:
        command += ["--expect-token", str(expect_token)]
    return command


def run_child(command: list[str], env: dict[str, str], timeout: float, stderr_path: Path) -> dict[str, Any]:
    """Runs a child; returns its report with ``seconds``: spawn to the moment its
    FIRST_TOKEN line was read (None if it printed none)."""
    seconds = None
    report: dict[str, Any] = {}
    with open(stderr_path, "w") as stderr:
        start = time.perf_counter()
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            for line in proc.stdout:
                if line.startswith(FIRST_TOKEN) and seconds is None:
                    seconds = time.perf_counter() - start
                elif line.startswith(CHILD_REPORT):
                    report = json.loads(line[len(CHILD_REPORT):])
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            report.setdefault("error", f"timed out after {timeout:.0f}s")
    if proc.returncode and "error" not in report:
        tail = stderr_path.read_text().strip().splitlines()[-1:] or [""]
        report["error"] = f"exit {proc.returncode}: {tail[0][:300]}"
    report["seconds"] = seconds
    return report


def save(arch_id: str, workdir: Path) -> dict[str, Any]:
    """The save process of ``arch_id``; a save a previous run left in ``workdir``
    (--workdir) is reused."""
    case = workdir / arch_id.replace(":", "_")
    saved = case / "save.json"
    if saved.exists():
        report = json.loads(saved.read_text())
        print(f"{arch_id:14s} save: reusing {saved} ({report['outcome']})", flush=True)
        return report
    shutil.rmtree(case, ignore_errors=True)
    cache = case / "save-inductor-cache"
    cache.mkdir(parents=True)
    start = time.perf_counter()
    report = run_child(_child_command("save", arch_id, case / "package", None), child_env(cache),
                       SAVE_TIMEOUT_S, case / "save.stderr")
    report["save_process_seconds"] = round(time.perf_counter() - start, 2)
    if "outcome" not in report:
        report["outcome"] = "failed"
    saved.write_text(json.dumps(report, indent=1))
    print(f"{arch_id:14s} save: {report['outcome']} in {report['save_process_seconds']:.1f}s"
          + (f" ({report['error']})" if "error" in report else ""), flush=True)
    return report


def measure(arch_id: str, kind: str, workdir: Path, eager_token: int, round_index: int) -> dict[str, Any]:
    case = workdir / arch_id.replace(":", "_")
    cache = Path(tempfile.mkdtemp(prefix=f"{kind}-inductor-cache-", dir=case))
    expect = eager_token if kind == "package" else None
    report = run_child(_child_command(kind, arch_id, case / "package", expect), child_env(cache),
                       CHILD_TIMEOUT_S, case / f"{kind}-{round_index}.stderr")
    shutil.rmtree(cache, ignore_errors=True)
    if kind == "eager" and "token" in report and report["token"] != eager_token:
        report["error"] = f"eager child's token {report['token']} != the save process's {eager_token}"
    seconds = report["seconds"]
    print(f"{arch_id:14s} {kind:8s} round {round_index}: "
          + (f"{seconds:6.2f} s" if seconds is not None else "no first token")
          + (f" FAILED: {report['error']}" if "error" in report else ""), flush=True)
    return report


def summarize(values: list[float]) -> dict[str, Any]:
    return {"min": min(values), "median": statistics.median(values), "runs": values}


def _median_phases(reports: list[dict[str, Any]]) -> dict[str, float]:
    names = list(reports[0].get("phases", {})) if reports else []
    return {n: statistics.median(r["phases"][n] for r in reports if n in r.get("phases", {})) for n in names}


def arch_result(save_report: dict[str, Any], runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    result: dict[str, Any] = {"save": save_report}
    failures = [f"{kind} round {i}: {r['error']}" for kind in runs for i, r in enumerate(runs[kind]) if "error" in r]
    if failures:
        result["failures"] = failures
    good = {kind: [r for r in runs[kind] if "error" not in r and r["seconds"] is not None] for kind in runs}
    if not good["eager"] or not good["package"]:
        return result
    for kind in runs:
        result[kind] = summarize([r["seconds"] for r in good[kind]])
        result[kind]["phases_median"] = _median_phases(good[kind])
    pairs = [(p["seconds"], e["seconds"]) for p, e in zip(runs["package"], runs["eager"])
             if "error" not in p and "error" not in e and p["seconds"] is not None and e["seconds"] is not None]
    result["ratio_of_medians"] = result["package"]["median"] / result["eager"]["median"]
    result["min_round_ratio"] = min(p / e for p, e in pairs) if pairs else None
    result["meets_goal"] = result["ratio_of_medians"] <= GOAL and not failures
    return result


def render(report: dict[str, Any]) -> str:
    lines = [
        f"Machine: {report['machine']}; torch {report['torch']}, transformers {report['transformers']}; "
        f"{report['rounds']} rounds, each one fresh eager and one fresh package process per architecture "
        f"(order alternating by round); seconds from just before the spawn to the parent reading the child's "
        f"first-token line (min / median). Package: Inductor, dynamic=True, saved after generate() at "
        f"prompt lengths {' and '.join(map(str, SAVE_PROMPTS))}, loaded with an empty inductor cache, "
        f"first token under fail_on_recompile, checked against eager's. Run {report['started']} - "
        f"{report['finished']} UTC.",
        "",
        "| architecture | kind | eager s (min / median) | package s (min / median) | × eager (medians) "
        "| × eager (min of rounds) | ≤ 1.2× |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios = []
    for arch_id, row in report["architectures"].items():
        kind = KINDS.get(arch_id, "")
        if row["save"].get("outcome") != "saved":
            error = row["save"].get("error", {})
            lines.append(f"| {arch_id} | {kind} | save failed: {error} | | | | no |")
            continue
        if "ratio_of_medians" not in row:
            lines.append(f"| {arch_id} | {kind} | failed: {'; '.join(row.get('failures', []))[:300]} | | | | no |")
            continue
        ratios.append(row["ratio_of_medians"])
        eager, package = row["eager"], row["package"]
        lines.append(
            f"| {arch_id} | {kind} | {eager['min']:.2f} / {eager['median']:.2f} | "
            f"{package['min']:.2f} / {package['median']:.2f} | {row['ratio_of_medians']:.2f} | "
            f"{row['min_round_ratio']:.2f} | {'yes' if row['meets_goal'] else 'NO'} |"
        )
    if ratios:
        lines += ["", f"Sample median of the per-architecture ratios (package / eager, medians): "
                  f"{statistics.median(ratios):.2f} over {len(ratios)} architectures (goal ≤ {GOAL} each)."]
    failures = {a: r["failures"] for a, r in report["architectures"].items() if r.get("failures")}
    if failures:
        lines += ["", "Failed processes:"] + [f"- {a}: {f}" for a, fs in failures.items() for f in fs]
    lines += ["", "### Where the time goes (medians of the children's own phase timers, seconds)", "",
              "| architecture | child | interpreter start + rest | import torch | import transformers + tooling "
              "| build model | compile wrapper | load_package() | generate() first token |",
              "|---|---|---|---|---|---|---|---|---|"]
    for arch_id, row in report["architectures"].items():
        for kind in ("eager", "package"):
            if kind not in row:
                continue
            phases = row[kind]["phases_median"]
            rest = row[kind]["median"] - sum(phases.values())
            cells = [phases.get(n) for n in ("import torch", "import transformers + sweep tooling",
                                             "build model + prompt", "torch.compile wrapper", "load_package()",
                                             "generate() of the first token")]
            lines.append(f"| {arch_id} | {kind} | {rest:.2f} | "
                         + " | ".join("" if c is None else f"{c:.2f}" for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--archs", default=",".join(SAMPLE), help="comma-separated sweep ids")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=RESULTS, help="results path without suffix (.json and .md)")
    parser.add_argument("--save-jobs", type=int, default=2, help="save processes at a time (untimed)")
    parser.add_argument("--workdir", type=Path, help="keep packages here and reuse the saves found (default: a "
                        "temporary directory, removed at the end)")
    parser.add_argument("--child", choices=["save", "eager", "package"], help=argparse.SUPPRESS)
    parser.add_argument("--arch", help=argparse.SUPPRESS)
    parser.add_argument("--package", help=argparse.SUPPRESS)
    parser.add_argument("--expect-token", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    arch_ids = [a for a in args.archs.split(",") if a]
    versions = subprocess.run(
        [sys.executable, "-c", "import torch, transformers; print(torch.__version__, transformers.__version__)"],
        env=child_env(Path(tempfile.mkdtemp())), capture_output=True, text=True, check=True,
    ).stdout.split()
    report: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "torch": versions[0], "transformers": versions[1], "rounds": 0,
        "started": time.strftime("%Y-%m-%d %H:%M", time.gmtime()), "architectures": {},
    }
    # Absolute: the children run elsewhere, and their inductor caches live here.
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="transformers-first-token-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(max(1, args.save_jobs)) as pool:
            saves = dict(zip(arch_ids, pool.map(lambda a: save(a, workdir), arch_ids)))
        saved = [a for a in arch_ids if saves[a].get("outcome") == "saved"]
        runs = {a: {"eager": [], "package": []} for a in saved}
        for round_index in range(args.rounds):
            for arch_id in saved:
                order = ("eager", "package") if round_index % 2 == 0 else ("package", "eager")
                for kind in order:
                    runs[arch_id][kind].append(
                        measure(arch_id, kind, workdir, saves[arch_id]["eager_token"], round_index))
            # Written after every round, so that a run stopped early keeps the
            # rounds it finished (report["rounds"] says how many).
            write_results(args.out, report, arch_ids, saves, runs, round_index + 1)
        if not args.rounds or not saved:
            write_results(args.out, report, arch_ids, saves, runs, 0)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)
    print(args.out.with_suffix(".md").read_text())
    return 0


def write_results(out: Path, report: dict[str, Any], arch_ids: list[str], saves: dict[str, Any],
                  runs: dict[str, Any], rounds_done: int) -> None:
    report["rounds"] = rounds_done
    report["finished"] = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    for arch_id in arch_ids:
        report["architectures"][arch_id] = (
            arch_result(saves[arch_id], runs[arch_id]) if arch_id in runs else {"save": saves[arch_id]}
        )
    ratios = [r["ratio_of_medians"] for r in report["architectures"].values() if "ratio_of_medians" in r]
    report["sample_median_ratio"] = statistics.median(ratios) if ratios else None
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(render(report))


if __name__ == "__main__":
    sys.exit(main())
