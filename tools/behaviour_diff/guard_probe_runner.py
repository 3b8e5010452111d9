"""Run the guard probe set inside one torch environment and write its decisions as JSON.

Executed with the python of the environment under test (stock torch 2.7.1 +
torch_overlay, the patched wheel, or upstream torch), never imported by the
harness that compares them. For every probe of ``guard_probes.py`` and every
guard mode it traces the probe with Dynamo's InstructionTranslator, builds

* the REFERENCE guard manager (``CheckFunctionManager`` as a compile builds it),
* a SAVING one, whose ``guards_state`` bytes are kept, and
* LOADED ones rebuilt from those bytes through the environment's own API,

and records each manager's decision (accept / reject) on every input of the
probe's battery. Where a version refuses to save a probe, the refusal (exception
type and first message line) is recorded instead.

Every version is driven through the same API, upstream's, by
test/dynamo/guard_round_trip.py (the harness the guard serialization tests build,
save and load their guard managers with): ``CheckFunctionManager(code,
output_graph, save_guards=True)`` (with ``strict_error=True`` where it exists,
so upstream refuses what it cannot save instead of saving nothing), then
``torch._dynamo.package.load_guard_manager(load_guards_state(data), code,
f_globals)``. A version whose CheckFunctionManager takes no ``save_guards``
(stock 2.7.1) only gets its reference manager. Upstream's package loader
installs the globals Dynamo put into the frame's module before it builds the
guards (the overlay's load does it itself), so the runner does that for it.

The loaded managers are built twice: in the saving process ("loaded") and in a
fresh process that never traced anything ("fresh"), which is how a saved
program is really loaded: there, module-level objects are new objects found
again by name, and nothing Dynamo installed while tracing exists.

Guard modes: ``all`` keeps every guard; ``portable`` applies the same
guard_filter_fn in both versions, dropping the identity guard types upstream
refuses to serialize (see :data:`UPSTREAM_UNSERIALIZABLE`), so the two versions
can be compared on probes upstream would otherwise refuse outright.
A probe's ``keep_guard`` predicate narrows the guards further in both modes
(what a user would pass as guard_filter_fn, e.g. to leave out TYPE_MATCH on a
class defined in local scope).

Tracing is test/dynamo/frame_tracing.py's, the tracing under guard_round_trip.py
(NOTE: [Tracing a frame as convert_frame does] there): the probe is traced as convert_frame traces a frame, and the
managers are built where convert_frame builds them. Loading is done outside all
of that (and outside the probe's compile context), as a program loading
precompiled code would.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Optional


log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
# test/dynamo, home of guard_round_trip.py and frame_tracing.py (the harness
# shared with the guard serialization tests).
TEST_DYNAMO = HERE.parents[1] / "test" / "dynamo"

# The guard types 2.13's CheckFunctionManager refuses to serialize
# (CheckFunctionManager.UNSUPPORTED_SERIALIZATION_GUARD_TYPES there), plus the
# 2.7.1-only PYMODULE_MATCH, the old spelling of MODULE_MATCH.
UPSTREAM_UNSERIALIZABLE = frozenset(
    {
        "DICT_VERSION",
        "NN_MODULE",
        "ID_MATCH",
        "FUNCTION_MATCH",
        "CLASS_MATCH",
        "MODULE_MATCH",
        "CLOSURE_MATCH",
        "WEAKREF_ALIVE",
        "PYMODULE_MATCH",
    }
)

MODES = ("all", "portable")

# The loaded managers' columns are "loaded_<LOADER>" (built in the saving
# process) and "fresh_<LOADER>" (in a fresh one): the one way they are loaded.
LOADER = "load_guard_manager"


def portable_guard_filter(entries):
    """Drop the guards upstream cannot serialize; keep identity checks of None,
    True and False, which are 2.7.1's spelling of upstream's NONE_MATCH and
    BOOL_MATCH (both serializable there)."""
    keep = []
    for entry in entries:
        types = {entry.guard_type, *(entry.derived_guard_types or ())}
        singleton = getattr(entry, "has_value", True) and any(
            entry.value is v for v in (None, True, False)
        )
        keep.append(singleton or not (types & UPSTREAM_UNSERIALIZABLE))
    return keep


def first_line(text: str) -> str:
    for line in str(text).splitlines():
        if line.strip():
            return re.sub(r"\s{2,}", " ", line.strip())[:300]
    return ""


def describe_exception(e: BaseException) -> dict:
    return {"type": f"{type(e).__module__}.{type(e).__qualname__}", "message": first_line(str(e))}


# ---------------------------------------------------------------------------
# The torch side: imported lazily, inside the environment under test.
# ---------------------------------------------------------------------------


class TorchApi:
    """What differs between the torch versions the runner supports."""

    def __init__(self) -> None:
        import torch
        import torch._dynamo
        from torch._dynamo.guards import CheckFunctionManager

        self.torch = torch
        self.harness = import_round_trip()
        cfm_params = inspect.signature(CheckFunctionManager.__init__).parameters
        self.api = "save_guards" if "save_guards" in cfm_params else None
        try:
            import torch._dynamo.guard_serialization
        except ImportError:
            # upstream: its package loader installs Dynamo's globals first
            self.loader_installs_globals = True
        else:
            self.loader_installs_globals = False

    def describe(self) -> dict:
        torch = self.torch
        import torch._dynamo.guards as guards_module

        loader = type(getattr(guards_module, "__loader__", None)).__name__
        return {
            "torch": str(torch.__version__),
            "api": self.api,
            "guards_loader": loader,
            "python": sys.version.split()[0],
            "executable": sys.executable,
        }

    # -- tracing --------------------------------------------------------------

    def trace(self, fn, call_args, build):
        """Trace ``fn`` on ``call_args`` and return ``build(code, output_graph)``;
        TraceError when the trace itself fails (an error of ``build`` propagates)."""
        frame_tracing = import_frame_tracing()
        built = []

        def build_after_trace(code, output_graph):
            built.append(True)
            return build(code, output_graph)

        frame = frame_tracing.frame_of(fn, call_args.args, call_args.kwargs)
        try:
            return frame_tracing.trace_frame(frame, build=build_after_trace)
        except Exception as e:
            if built:
                raise
            raise TraceError(e) from e

    # -- building -----------------------------------------------------------------

    def reference(self, code, output_graph, guard_filter_fn):
        return self.harness.new_check_fn_manager(
            code, output_graph, guard_filter_fn=guard_filter_fn
        )

    def save(self, code, output_graph, guard_filter_fn) -> tuple[bytes, dict]:
        """The guards_state bytes, and what else the version's package keeps."""
        manager = self.harness.new_check_fn_manager(
            code, output_graph, guard_filter_fn=guard_filter_fn, save_guards=True
        )
        extras: dict[str, Any] = {}
        if self.loader_installs_globals:
            # 2.13's CompilePackage saves the modules Dynamo aliased into the
            # frame's globals next to the guards and installs them before loading.
            extras["import_sources"] = dict(getattr(output_graph, "import_sources", {}))
        if manager.guards_state is None:
            raise RuntimeError("CheckFunctionManager saved no guards_state")
        return manager.guards_state, extras

    def load(self, code, data: bytes, runtime_globals: dict, extras: dict):
        """The guard manager loaded from ``data``."""
        if not self.loader_installs_globals:
            return self.harness.load_guard_manager(data, code, runtime_globals)

        from torch._dynamo.output_graph import get_builtins_dict
        from torch._dynamo.package import load_guards_state
        from torch._dynamo.utils import dynamo_timed
        from torch._guards import compile_context, CompileContext, CompileId

        # What 2.13's package loader does before it builds the guards: install
        # the module aliases and the builtins dict Dynamo put into the frame's
        # globals while tracing (a fresh process lacks them; the state, read
        # here for the dict's name, is read again by the load), and build
        # inside a compile context.
        for alias, module_name in extras.get("import_sources", {}).items():
            runtime_globals.setdefault(alias, importlib.import_module(module_name))
        builtins_name = getattr(
            load_guards_state(data).output_graph,
            "name_of_builtins_dict_key_in_fglobals",
            None,
        )
        if builtins_name and builtins_name not in runtime_globals:
            runtime_globals[builtins_name] = get_builtins_dict(runtime_globals)
        with compile_context(
            CompileContext(CompileId(frame_id=0, frame_compile_id=0))
        ), dynamo_timed("guard_probe_load"):
            return self.harness.load_guard_manager(data, code, runtime_globals)


class TraceError(Exception):
    pass


def import_frame_tracing():
    """test/dynamo/frame_tracing.py, imported inside the environment under test."""
    if str(TEST_DYNAMO) not in sys.path:
        sys.path.insert(0, str(TEST_DYNAMO))
    import frame_tracing

    return frame_tracing


def import_round_trip():
    """test/dynamo/guard_round_trip.py, imported inside the environment under test."""
    import_frame_tracing()
    import guard_round_trip

    return guard_round_trip


# ---------------------------------------------------------------------------
# Running the probes
# ---------------------------------------------------------------------------


def import_probes():
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    import guard_probes

    return guard_probes


@contextlib.contextmanager
def probe_config(api: TorchApi, probe):
    if not probe.config:
        yield
        return
    with api.torch._dynamo.config.patch(**probe.config):
        yield


@contextlib.contextmanager
def optional_context(factory):
    if factory is None:
        yield
        return
    with factory():
        yield


def guard_types_of(output_graph) -> tuple[list[str], list[str], list[str]]:
    """Guard types created, derived guard types, and the identity guards
    ("TYPE on source") of a traced frame."""
    guard_type_name = import_round_trip().guard_type_name
    created, derived, identity = set(), set(), set()
    for guard in output_graph.guards:
        own_type = guard_type_name(guard)
        created.add(own_type)
        derived.update(guard.guard_types or ())
        for guard_type in {own_type, *(guard.guard_types or ())}:
            if guard_type in UPSTREAM_UNSERIALIZABLE:
                identity.add(f"{guard_type} on {guard.name or '<global>'}")
    return sorted(created), sorted(derived - created), sorted(identity)


def decide(manager, frame_locals: dict, context_factory) -> tuple[Any, Optional[str]]:
    """(accepted?, why it was rejected) of ``manager`` on ``frame_locals``."""
    try:
        with optional_context(context_factory):
            accepted = bool(manager.check(frame_locals))
            why = None
            if not accepted:
                parts = manager.check_verbose(frame_locals).verbose_code_parts
                why = first_line(" | ".join(str(p) for p in parts)) or "(no reason given)"
            return accepted, why
    except Exception as e:
        return f"error: {type(e).__qualname__}: {first_line(str(e))}", None


def record(row: dict, column: str, outcome: tuple[Any, Optional[str]]) -> None:
    row[column] = outcome[0]
    if outcome[1] is not None:
        row.setdefault("why", {})[column] = outcome[1]


def battery_frames(probe) -> list[tuple[Any, Optional[dict], Optional[str]]]:
    """(call, frame locals or None, error) for the example and every battery input."""
    out = []
    for call in (probe.example, *probe.battery):
        try:
            call_args = call.make()
            frame = import_frame_tracing().frame_of(probe.fn, call_args.args, call_args.kwargs)
            out.append((call, frame.f_locals, None))
        except Exception as e:
            out.append((call, None, f"{type(e).__qualname__}: {first_line(str(e))}"))
    return out


def run_save(api: TorchApi, probes_module, out_dir: Path, only: Optional[set]) -> dict:
    cases: dict[str, dict] = {}
    blobs = out_dir / "guards"
    blobs.mkdir(parents=True, exist_ok=True)
    for probe in probes_module.PROBES:
        if only and probe.name not in only:
            continue
        for mode in MODES:
            case_id = f"{probe.name}@{mode}"
            started = time.perf_counter()
            cases[case_id] = run_case_save(api, probe, mode, blobs / f"{case_id}.bin")
            cases[case_id]["seconds"] = round(time.perf_counter() - started, 3)
            log.info("%s: %s", case_id, cases[case_id]["status"])
    return cases


def guard_filter_for(probe, mode: str):
    """The guard_filter_fn of a probe in a guard mode (None keeps every guard)."""
    mode_filter = portable_guard_filter if mode == "portable" else None
    keep_guard = probe.keep_guard
    if keep_guard is None:
        return mode_filter

    def probe_filter(entries):
        kept = mode_filter(entries) if mode_filter else [True] * len(entries)
        return [k and bool(keep_guard(e)) for k, e in zip(kept, entries)]

    return probe_filter


def run_case_save(api: TorchApi, probe, mode: str, blob_path: Path) -> dict:
    filter_fn = guard_filter_for(probe, mode)
    case: dict[str, Any] = {
        "probe": probe.name,
        "mode": mode,
        "covers": list(probe.covers),
        "expect_refusal": probe.expect_refusal,
        "source": inspect.getsource(probe.fn),
        "status": "ok",
    }
    example = probe.example.make()
    with probe_config(api, probe), optional_context(probe.compile_context):

        def build_reference(code, output_graph):
            manager = api.reference(code, output_graph, filter_fn)
            return manager, guard_types_of(output_graph)

        try:
            reference, (created, derived, identity) = api.trace(
                probe.fn, example, build_reference
            )
        except TraceError as e:
            case["status"] = "trace_error"
            case["error"] = describe_exception(e.args[0])
            return case
        except Exception as e:
            case["status"] = "reference_error"
            case["error"] = describe_exception(e)
            case["traceback"] = traceback.format_exc()[-3000:]
            return case
        case["guard_types"] = created
        case["derived_guard_types"] = derived
        case["identity_guards"] = identity

        data = None
        if api.api is None:
            case["status"] = "no_api"
        else:
            try:
                data, extras = api.trace(
                    probe.fn,
                    probe.example.make(),
                    lambda code, og: api.save(code, og, filter_fn),
                )
                case["extras"] = extras
            except Exception as e:
                case["status"] = "refused"
                case["refusal"] = describe_exception(e)
                if type(e).__name__ != "PackageError":
                    case["traceback"] = traceback.format_exc()[-3000:]

    frames = battery_frames(probe)
    loaded = {}
    if data is not None:
        blob_path.write_bytes(data)
        case["bytes"] = len(data)
        case["blob"] = blob_path.name
        loaded, case["load_errors"] = build_loaded(api, probe, data, extras)
    case["inputs"] = []
    for call, frame_locals, error in frames:
        row: dict[str, Any] = {"label": call.label, "context": call.context is not None}
        if error is not None:
            row["reference"] = f"error: {error}"
        else:
            with probe_config(api, probe):
                record(row, "reference", decide(reference.guard_manager, frame_locals, call.context))
                for name, manager in loaded.items():
                    record(row, f"loaded_{name}", decide(manager, frame_locals, call.context))
        case["inputs"].append(row)
    return case


def build_loaded(api: TorchApi, probe, data: bytes, extras: dict) -> tuple[dict, dict]:
    """{LOADER: the loaded guard manager}, or {LOADER: why it could not be loaded}."""
    managers, errors = {}, {}
    with probe_config(api, probe):
        try:
            managers[LOADER] = api.load(probe.fn.__code__, data, probe.fn.__globals__, extras)
        except Exception as e:
            errors[LOADER] = describe_exception(e)
            errors[LOADER]["traceback"] = traceback.format_exc()[-3000:]
    return managers, errors


def run_load(api: TorchApi, probes_module, out_dir: Path, saved: dict) -> dict:
    """Fresh-process load: rebuild every saved case and decide its battery."""
    by_name = {p.name: p for p in probes_module.PROBES}
    fresh: dict[str, dict] = {}
    for case_id, case in saved.items():
        if "blob" not in case:
            continue
        probe = by_name[case["probe"]]
        data = (out_dir / "guards" / case["blob"]).read_bytes()
        managers, errors = build_loaded(api, probe, data, case.get("extras", {}))
        decisions = []
        for call, frame_locals, error in battery_frames(probe):
            row: dict[str, Any] = {"label": call.label}
            if error is None:
                with probe_config(api, probe):
                    for name, manager in managers.items():
                        record(row, f"fresh_{name}", decide(manager, frame_locals, call.context))
            decisions.append(row)
        fresh[case_id] = {"load_errors": errors, "inputs": decisions}
    return fresh


def merge_fresh(cases: dict, fresh: dict) -> None:
    for case_id, result in fresh.items():
        case = cases[case_id]
        case["fresh_load_errors"] = result["load_errors"]
        for row, fresh_row in zip(case["inputs"], result["inputs"]):
            for key, value in fresh_row.items():
                if key == "why":
                    row.setdefault("why", {}).update(value)
                elif key != "label":
                    row[key] = value


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--label", default="", help="environment label for the report")
    parser.add_argument(
        "--phase", choices=("all", "load"), default="all",
        help="'all': save, then load in a fresh process; 'load': the fresh-process part",
    )
    parser.add_argument("--probe", action="append", help="run only these probes")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    # Keep the runner's own output readable: Dynamo's warnings are not results.
    logging.getLogger("torch").setLevel(logging.ERROR)
    out_dir = args.out.resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    api = TorchApi()
    probes_module = import_probes()

    if args.phase == "load":
        saved = json.loads((out_dir / "save.json").read_text())["cases"]
        fresh = run_load(api, probes_module, out_dir, saved)
        (out_dir / "fresh.json").write_text(json.dumps(fresh, indent=1, default=str))
        return 0

    started = time.perf_counter()
    cases = run_save(api, probes_module, out_dir, set(args.probe or ()))
    result = {
        "label": args.label,
        "environment": api.describe(),
        "modes": list(MODES),
        "upstream_unserializable": sorted(UPSTREAM_UNSERIALIZABLE),
        "cases": cases,
    }
    (out_dir / "save.json").write_text(json.dumps(result, indent=1, default=str))
    if api.api is not None:
        # A fresh interpreter, same environment: what loading in production is.
        cmd = [sys.executable, str(Path(__file__).resolve()), "--out", str(out_dir), "--phase", "load"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ.copy())
        if proc.returncode != 0:
            result["fresh_process_error"] = first_line(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
            result["fresh_process_stderr"] = proc.stderr[-4000:]
        else:
            merge_fresh(cases, json.loads((out_dir / "fresh.json").read_text()))
    result["seconds"] = round(time.perf_counter() - started, 2)
    (out_dir / "probes.json").write_text(json.dumps(result, indent=1, default=str))
    print(f"{len(cases)} cases -> {out_dir / 'probes.json'} ({result['seconds']} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
