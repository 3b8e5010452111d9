"""One phase of the transformers sweep, run in this (fresh) interpreter.

``sweep.py`` starts this file once per phase with the python of the
environment under test and reads back the JSON report it writes to the path in
``TORCH_FRESH_PROCESS_REPORT`` (the protocol of
``torch.testing._internal.fresh_process``, written here by hand so that torch
2.13, which lacks that module, speaks it too). Phases:

* ``save``: eager greedy tokens of a 5-token prompt (4 new tokens), then the
  same under torch.compile with a package (overlay) or caching_precompile
  (upstream), then the save; reports tokens, the save's warnings, entries left
  out and the guard types named, or where it crashed (and, for a crash before
  the save, whether the same compile runs without precompile).
* ``load``: the load into a fresh torch.compile, then a 9-token prompt for 7
  new tokens under ``set_stance("fail_on_recompile")``, and eager's tokens for
  the same; reports both (and the largest difference of their logits), the
  frames Dynamo compiled, or the recompile (and whether the same workloads
  recompile in one process without a package), or where it crashed.
* ``eager-check``: for each of several architectures, whether its tiny config
  builds, the model builds, and each spelling decodes eagerly at both
  lengths; one JSON line per architecture appended to the report file, so
  that a crash loses only the architecture it happened in.
"""

# NOTE: [Sweep phase reports]
# A phase never raises: every failure the sweep classifies is caught and
# reported with its stage ("compiled run", "save_package", "load_package",
# "decode under fail_on_recompile" ...), its exception type, first line and
# innermost frame. A phase that dies anyway (a segfault, the timeout) leaves no
# report, and the runner reports the exit instead. Warnings raised anywhere but
# in transformers, and WARNING records of torch's loggers, are kept (first 300
# characters each): the overlay leaves unsaveable entries out with a warning
# ("... is not saved: <GUARD_TYPE> guard cannot be serialized ..."), 2.13 logs.

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch

import decoding
import shrink


log = logging.getLogger(__name__)

REPORT_PATH_ENV = "TORCH_FRESH_PROCESS_REPORT"
SAVE_PROMPT, SAVE_NEW_TOKENS = 5, 4
LOAD_PROMPT, LOAD_NEW_TOKENS = 9, 7
# Backends per environment: 2.13's caching_precompile keeps backend artifacts
# only for Inductor graphs (NOTE: [Serving probes] in
# tools/behaviour_diff/precompile_probes.py).
BACKENDS = {"overlay": "aot_eager", "upstream": "inductor"}
WARNING_CHARS = 300
# 2.13 logs one warning per guard that caching_precompile drops.
MAX_WARNINGS = 60
GUARD_REFUSAL = re.compile(r"\b([A-Z][A-Z0-9_]+) guard cannot be serialized")
NOT_SAVED = "is not saved"


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def headline(text: str) -> str:
    """The first line of an error, and the next while a line ends in ':'
    (Dynamo's "backend='inductor' raised:" says nothing by itself)."""
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    taken = lines[:1]
    while taken and taken[-1].endswith(":") and len(taken) < min(len(lines), 3):
        taken.append(lines[len(taken)])
    return " ".join(taken)


def describe(e: BaseException, stage: str) -> dict[str, Any]:
    """``e`` as the report names it (NOTE: [Sweep phase reports])."""
    traceback.print_exception(e, file=sys.stderr)
    frames = traceback.extract_tb(e.__traceback__)
    innermost = frames[-1] if frames else None
    return {
        "stage": stage,
        "type": type(e).__name__,
        "message": headline(str(e))[:600],
        "frame": f"{_short_path(innermost.filename)}:{innermost.lineno} in {innermost.name}" if innermost else "",
    }


def _short_path(path: str) -> str:
    for marker in ("site-packages/", "/work/main/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


class _TorchWarnings(logging.Handler):
    """WARNING records of torch's loggers, kept with the warnings."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.messages.append(record.getMessage())


@contextlib.contextmanager
def kept_warnings():
    """Yields the list the warnings and torch WARNING logs of the block land in."""
    kept: list[str] = []
    handler = _TorchWarnings()
    torch_log = logging.getLogger("torch")
    torch_log.addHandler(handler)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield kept
        finally:
            torch_log.removeHandler(handler)
            for w in caught:
                if "/transformers/" not in str(w.filename):
                    kept.append(f"{w.category.__name__}: {w.message}")
            kept.extend(handler.messages)
            unique = list(dict.fromkeys(m[:WARNING_CHARS] for m in kept))
            if len(unique) > MAX_WARNINGS:
                unique = [*unique[:MAX_WARNINGS], f"... and {len(unique) - MAX_WARNINGS} more"]
            kept[:] = unique


def refusals(messages: list[str]) -> dict[str, Any]:
    """The entries a save left out, and the guard types the messages name."""
    left_out = [m for m in messages if NOT_SAVED in m or GUARD_REFUSAL.search(m)]
    guard_types = sorted({g for m in messages for g in GUARD_REFUSAL.findall(m)})
    return {"left_out": left_out, "guard_types": guard_types}


def _frames_compiled() -> int:
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


def is_recompile(e: BaseException) -> bool:
    return "Detected recompile" in str(e) or "fail_on_recompile" in str(e)


# -- the phases -----------------------------------------------------------------


def _api(env: str):
    """What the phase runs under: 2.13's caching_precompile for upstream."""
    if env == "upstream":
        return torch._dynamo.config.patch(caching_precompile=True)
    return contextlib.nullcontext()


def _compile(spelling: str, model, env: str, package: Path):
    options: dict[str, Any] = {"dynamic": True, "backend": BACKENDS[env]}
    if env == "overlay":
        options["package"] = str(package)
    return decoding.compile_for(spelling, model, **options)


def _eager(arch, spelling: str, length: int, new_tokens: int) -> decoding.Decoded:
    model = shrink.build_model(arch)
    return decoding.decode(spelling, model, model, decoding.prompt(model.config, length), new_tokens)


def _entries(env: str, package: Path) -> Any:
    if env == "overlay":
        manifest = package / "manifest.json"
        return json.loads(manifest.read_text()).get("entries") if manifest.exists() else None
    dynamo = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "")) / "dynamo"
    return sum(1 for p in dynamo.rglob("*") if p.is_file()) if dynamo.is_dir() else 0


def _eager_report(phase: str, arch, spelling: str, prompt_length: int, new_tokens: int) -> tuple[dict[str, Any], Any]:
    """The phase's report with the eager tokens, and the eager decode; or the
    eager-fails report and None."""
    report: dict[str, Any] = {"phase": phase}
    try:
        eager = _eager(arch, spelling, prompt_length, new_tokens)
    except Exception as e:
        return {**report, "outcome": "eager-fails", "error": describe(e, "eager decode")}, None
    report["eager_tokens"] = eager.tokens
    return report, eager


def run_save(arch, spelling: str, env: str, work: Path) -> dict[str, Any]:
    report, eager = _eager_report("save", arch, spelling, SAVE_PROMPT, SAVE_NEW_TOKENS)
    if eager is None:
        return report
    package = work / "package"
    with _api(env), kept_warnings() as messages:
        stage = "compile"
        try:
            model = shrink.build_model(arch)
            fn = _compile(spelling, model, env, package)
            stage = "compiled run"
            ids = decoding.prompt(model.config, SAVE_PROMPT)
            compiled = decoding.decode(spelling, fn, model, ids, SAVE_NEW_TOKENS)
            report["tokens"] = compiled.tokens
            report["max_logit_difference"] = decoding.max_logit_difference(compiled, eager)
            if env == "overlay":
                stage = "save_package"
                decoding.package_holder(spelling, fn, model).save_package()
            else:
                stage = "save_cache_artifacts"
                torch.compiler.save_cache_artifacts()
            report["outcome"] = "saved"
        except Exception as e:
            refused = type(e).__name__ == "PackageError" or GUARD_REFUSAL.search(str(e))
            report["outcome"] = "refused" if stage.startswith("save") and refused else "crash"
            report["error"] = describe(e, stage)
    if report["outcome"] == "crash" and not stage.startswith("save"):
        report["without_precompile"] = _without_precompile(arch, spelling, env)
    report["warnings"] = messages
    report.update(refusals(messages + ([report["error"]["message"]] if "error" in report else [])))
    report["entries"] = _entries(env, package)
    return report


def _without_precompile(arch, spelling: str, env: str) -> Any:
    """Whether the compiled run that crashed runs without the package (or
    caching_precompile): "runs", or the error it raises then too."""
    torch._dynamo.reset()
    try:
        model = shrink.build_model(arch)
        fn = decoding.compile_for(spelling, model, dynamic=True, backend=BACKENDS[env])
        decoding.decode(spelling, fn, model, decoding.prompt(model.config, SAVE_PROMPT), SAVE_NEW_TOKENS)
    except Exception as e:
        return describe(e, "compiled run without precompile")
    return "runs"


def run_load(arch, spelling: str, env: str, work: Path) -> dict[str, Any]:
    report, eager = _eager_report("load", arch, spelling, LOAD_PROMPT, LOAD_NEW_TOKENS)
    if eager is None:
        return report
    with _api(env), kept_warnings() as messages:
        stage = "compile"
        try:
            model = shrink.build_model(arch)
            fn = _compile(spelling, model, env, work / "package")
            if env == "overlay":
                stage = "load_package"
                decoding.package_holder(spelling, fn, model).load_package()
            stage = "decode under fail_on_recompile"
            ids = decoding.prompt(model.config, LOAD_PROMPT)
            frames_before = _frames_compiled()
            with torch.compiler.set_stance("fail_on_recompile"):
                compiled = decoding.decode(spelling, fn, model, ids, LOAD_NEW_TOKENS)
            report["tokens"] = compiled.tokens
            report["max_logit_difference"] = decoding.max_logit_difference(compiled, eager)
            # A second witness beside the stance's error: frames Dynamo
            # compiled during the calls (none, if the package served them all).
            report["frames_compiled"] = _frames_compiled() - frames_before
            report["outcome"] = "ran"
        except Exception as e:
            report["outcome"] = "recompile" if is_recompile(e) else "crash"
            report["error"] = describe(e, stage)
    if report["outcome"] == "recompile" or report.get("frames_compiled"):
        report["in_one_process"] = _in_one_process(arch, spelling, env)
    report["warnings"] = messages
    return report


def _in_one_process(arch, spelling: str, env: str) -> Any:
    """Whether the load's calls recompile without any package too: the save's
    workload and then the load's under fail_on_recompile, in this process
    with a plain torch.compile. "runs", or the error (a recompile there is
    the model's, not the package's)."""
    torch._dynamo.reset()
    stage = "save's workload, plain torch.compile"
    try:
        model = shrink.build_model(arch)
        fn = decoding.compile_for(spelling, model, dynamic=True, backend=BACKENDS[env])
        decoding.decode(spelling, fn, model, decoding.prompt(model.config, SAVE_PROMPT), SAVE_NEW_TOKENS)
        stage = "then the load's workload under fail_on_recompile"
        with torch.compiler.set_stance("fail_on_recompile"):
            decoding.decode(spelling, fn, model, decoding.prompt(model.config, LOAD_PROMPT), LOAD_NEW_TOKENS)
    except Exception as e:
        return describe(e, stage)
    return "runs"


def run_eager_check(arch_ids: list[str], report_path: Path) -> None:
    """One JSON line per architecture, appended as each is done."""
    archs = shrink.architectures()
    for arch_id in arch_ids:
        arch = archs[arch_id]
        row: dict[str, Any] = {"arch": arch_id, "class": arch.class_name}
        try:
            config = shrink.tiny_config(arch.model_type, arch.class_name)
            row["config"] = "ok"
            row["encoder_decoder"] = bool(getattr(config, "is_encoder_decoder", False))
        except Exception as e:
            row["config"] = describe(e, "tiny_config")
        if row["config"] == "ok":
            try:
                model = shrink.build_model(arch)
                row["build"] = "ok"
                row["parameters"] = sum(p.numel() for p in model.parameters())
            except Exception as e:
                row["build"] = describe(e, "build")
        if row.get("build") == "ok":
            row["eager"] = {}
            for spelling in decoding.SPELLINGS:
                try:
                    _eager(arch, spelling, SAVE_PROMPT, SAVE_NEW_TOKENS)
                    _eager(arch, spelling, LOAD_PROMPT, LOAD_NEW_TOKENS)
                    row["eager"][spelling] = "ok"
                except Exception as e:
                    row["eager"][spelling] = describe(e, "eager decode")
        with open(report_path, "a") as f:
            f.write(json.dumps(row) + "\n")


PHASES: dict[str, Callable[..., dict[str, Any]]] = {"save": run_save, "load": run_load}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", required=True, choices=[*PHASES, "eager-check"])
    parser.add_argument("--archs", required=True, help="comma-separated sweep ids (save/load: one)")
    parser.add_argument("--spelling", choices=sorted(decoding.SPELLINGS))
    parser.add_argument("--env", choices=sorted(BACKENDS), default="overlay")
    parser.add_argument("--work", type=Path, help="save/load: the case's work dir")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(1)
    report_path = Path(os.environ[REPORT_PATH_ENV])
    arch_ids = [a for a in args.archs.split(",") if a]
    if args.phase == "eager-check":
        run_eager_check(arch_ids, report_path)
        return 0
    (arch_id,) = arch_ids
    report = PHASES[args.phase](shrink.architectures()[arch_id], args.spelling, args.env, args.work)
    tmp = report_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1))
    tmp.replace(report_path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
