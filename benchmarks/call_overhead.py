"""Per-call overhead: eager, a fresh torch.compile, a loaded package and a loaded
aot_compile function, against upstream torch 2.13 in the same run (issue 30 item 1).

Rows: (a) a one-op function, (b) the seed MLP (models.SeedMLP, batch 2 as in
load_time.py's steady state), (c) a 32-layer decoder stack of small layers
(models.TransformerBlock with d=32), (d) one decode step of the serving zoo's
tiny Llama (benchmarks/serving_models.py) into a DynamicCache. Each in no_grad
and in grad mode, torch.set_num_threads(1), Inductor for everything compiled.

Variants, each one FRESH process per round, interleaved across rounds so that
machine noise hits all alike: eager; a fresh torch.compile; our package
(saved once by a separate process, loaded with an empty TORCHINDUCTOR_CACHE_DIR,
called under fail_on_recompile); our aot_compile function (the same); and
upstream 2.13's eager, fresh torch.compile, caching_precompile + Mega-Cache
load, and aot_compile load. A measured process warms up, then times
``--repeats`` blocks of about ``--block-ms`` of calls each with the garbage
collector off (as timeit does); its figure is the median block. The parent reports min and median
over rounds, and ratios to eager of the same interpreter, the same round.

Each compiled process also breaks one call down by peeling its layers (NOTE:
[Peeling a call]); the guard check is timed on its own, over the live frame's
f_locals.

    make bench-calls           (results in benchmarks/results/call_overhead.{md,json})
    make bench-calls BENCH_ARGS="--rounds 1 --repeats 3 --block-ms 5 --rows one_op mlp"   (smoke, ~3 min)
"""

import argparse
import concurrent.futures
import gc
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


log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parent.parent
BENCH_DIR = ROOT / "benchmarks"
OVERLAY_PY = ROOT / ".venv" / "bin" / "python"
UPSTREAM_PY = ROOT / ".venv-upstream" / "bin" / "python"

ROWS = ("one_op", "mlp", "stack32", "llama")
ROW_TITLES = {
    "one_op": "(a) one-op function",
    "mlp": "(b) seed MLP, batch 2",
    "stack32": "(c) 32-layer decoder stack, d=32",
    "llama": "(d) tiny Llama decode step, DynamicCache",
}
MODES = ("no_grad", "grad")
# (variant id, interpreter, saved by a priming process)
VARIANTS = (
    ("eager", "overlay", False),
    ("compile", "overlay", False),
    ("package", "overlay", True),
    ("package-dict-tags", "overlay", True),
    ("aot", "overlay", True),
    ("upstream-eager", "upstream", False),
    ("upstream-compile", "upstream", False),
    ("upstream-precompile", "upstream", True),
    ("upstream-aot", "upstream", True),
)
VARIANT_TITLES = {
    "eager": "eager",
    "compile": "torch.compile (fresh)",
    "package": "package load (ours)",
    "package-dict-tags": "package load (ours), recursive dict tags",
    "aot": "aot_compile load (ours)",
    "upstream-eager": "2.13 eager",
    "upstream-compile": "2.13 torch.compile (fresh)",
    "upstream-precompile": "2.13 caching_precompile + Mega-Cache load",
    "upstream-aot": "2.13 aot_compile load",
}
LAYERS = ("wrapper_py", "frame", "guard", "aot_autograd", "output_code", "wrapper", "kernels")
LAYER_TITLES = {
    "wrapper_py": "torch.compile's Python wrapper",
    "frame": "frame callback + cache lookup",
    "guard": "guard check",
    "aot_autograd": "AOTAutograd wrappers",
    "output_code": "CompiledFxGraph.__call__",
    "wrapper": "generated wrapper",
    "kernels": "kernels",
}


# ---------------------------------------------------------------------------
# Child: builds a row, saves or measures one variant. Runs under either
# interpreter, so it only uses APIs both have.
# ---------------------------------------------------------------------------


def one_op(x):
    return x + 1


if "--child" in sys.argv:  # only the measured processes import torch
    import torch

    sys.path.insert(0, str(BENCH_DIR))
    import models

    class DecoderStack(torch.nn.Module):
        """``layers`` small causal TransformerBlocks (d=32) looped in forward, as
        a decoder is written (an nn.Sequential's forward is torch.nn's, which
        aot_compile cannot load on either side). At module level, so that an
        aot_compile function of its forward loads in another process."""

        def __init__(self, layers):
            super().__init__()
            self.layers = torch.nn.ModuleList(
                models.TransformerBlock(d=32, heads=4, hidden=64) for _ in range(layers)
            )

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x


def build_row(row: str):
    """(target, make_call, dynamic): ``make_call()`` gives one call's (args, kwargs);
    calls of a row are all alike (the Llama's each get a fresh DynamicCache
    holding the same prefix)."""
    import torch

    sys.path.insert(0, str(BENCH_DIR))
    import models

    torch.manual_seed(0)
    if row == "one_op":
        x = torch.randn(8, requires_grad=True)
        return one_op, lambda: ((x,), {}), None
    if row == "mlp":
        model = models.SeedMLP().eval()
        x = torch.randn(2, 64)
        return model, lambda: ((x,), {}), None
    if row == "stack32":
        model = DecoderStack(32).eval()
        x = torch.randn(1, 8, 32)
        return model, lambda: ((x,), {}), None
    if row == "llama":
        import serving_models as serving
        from transformers import DynamicCache

        model = serving.MODELS["llama"]()
        prompt = serving.prompt(8)
        with torch.no_grad():
            out = model(input_ids=prompt, past_key_values=DynamicCache(), use_cache=True)
        legacy = out.past_key_values.to_legacy_cache()
        nxt = out.logits[:, -1:].argmax(-1)

        def make_call():
            cache = DynamicCache.from_legacy_cache(legacy)
            return (), {"input_ids": nxt, "past_key_values": cache, "use_cache": True}

        # A server compiles for every prompt length (load_time.py's serving row).
        return model, make_call, True
    raise ValueError(row)


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:300] if text else ''}"


def grad_mode(mode: str):
    import torch

    return torch.no_grad() if mode == "no_grad" else torch.enable_grad()


def compile_target(target, dynamic, **kwargs):
    import torch

    if dynamic is not None:
        kwargs["dynamic"] = dynamic
    return torch.compile(target, **kwargs)


def aot_path(artifact: str, mode: str) -> str:
    return f"{artifact}.aot-{mode}"


def save_variant(spec: dict) -> dict:
    """The priming process: compile and save what ``variant`` loads, in the
    grad modes ``spec["modes"]`` names (default: MODES)."""
    import torch

    modes = tuple(spec.get("modes", MODES))

    variant, artifact = spec["variant"], spec["artifact"]
    target, make_call, dynamic = build_row(spec["row"])
    errors = {}
    if variant.startswith("package"):
        compiled = compile_target(target, dynamic, package=artifact)
        for mode in modes:
            with grad_mode(mode):
                for _ in range(2):
                    args, kwargs = make_call()
                    compiled(*args, **kwargs)
        compiled.save_package()
    elif variant == "upstream-precompile":
        torch._dynamo.config.caching_precompile = True
        compiled = compile_target(target, dynamic)
        for mode in modes:
            with grad_mode(mode):
                for _ in range(2):
                    args, kwargs = make_call()
                    compiled(*args, **kwargs)
        data, _ = torch.compiler.save_cache_artifacts()
        Path(artifact).write_bytes(data)
    elif variant in ("aot", "upstream-aot"):
        torch._dynamo.config.enable_aot_compile = True
        for mode in modes:
            try:
                compiled = compile_target(target, dynamic, fullgraph=True)
                entry = compiled if not isinstance(target, torch.nn.Module) else compiled.forward
                with grad_mode(mode):
                    fn = entry.aot_compile(make_call())
                fn.save_compiled_function(aot_path(artifact, mode))
            except Exception as e:  # reported as the row's n/a
                errors[mode] = one_line(e)
                log.debug("aot_compile failed", exc_info=True)
    else:
        raise ValueError(variant)
    return {"save_errors": errors}


def prepare_variant(spec: dict, target, make_call, dynamic):
    """The callable a measured process times, per mode of ``spec["modes"]``
    (default: MODES), and what it reports."""
    import torch

    modes = tuple(spec.get("modes", MODES))

    variant, artifact = spec["variant"], spec.get("artifact")
    info = {}
    if variant.endswith("eager"):
        return dict.fromkeys(modes, target), info
    if variant.endswith("compile") and not variant.endswith("precompile"):
        compiled = compile_target(target, dynamic)
        return dict.fromkeys(modes, compiled), info
    if variant.startswith("package"):
        # The same package, loaded with torch._dynamo.config's
        # use_recursive_dict_tags_for_guards on (package-dict-tags) or off.
        torch._dynamo.config.use_recursive_dict_tags_for_guards = variant == "package-dict-tags"
        compiled = compile_target(target, dynamic, package=artifact)
        compiled.load_package()
        torch.compiler.set_stance("fail_on_recompile")
        return dict.fromkeys(modes, compiled), info
    if variant == "upstream-precompile":
        torch._dynamo.config.caching_precompile = True
        torch.compiler.load_cache_artifacts(Path(artifact).read_bytes())
        compiled = compile_target(target, dynamic)
        return dict.fromkeys(modes, compiled), info
    if variant in ("aot", "upstream-aot"):
        torch._dynamo.config.enable_aot_compile = True
        fns, errors = {}, dict(spec.get("save_errors") or {})
        for mode in modes:
            if mode in errors:
                continue
            try:
                with open(aot_path(artifact, mode), "rb") as f:
                    loaded = torch.compiler.load_compiled_function(f)
            except Exception as e:  # reported as the row's n/a
                errors[mode] = "load: " + one_line(e)
                continue
            if isinstance(target, torch.nn.Module):
                fns[mode] = lambda *a, _fn=loaded, **k: _fn(target, *a, **k)
            else:
                fns[mode] = loaded
        info["errors"] = errors
        return fns, info
    raise ValueError(variant)


def time_blocks(fn, make_call, calls, repeats, fresh_calls, enter=None, leave=None) -> list[float]:
    """µs per call of ``repeats`` blocks of ``calls`` calls; each call's
    arguments are made before its block's clock starts. ``enter()`` and
    ``leave(state)`` run around each block, outside the clock."""
    blocks = []
    for _ in range(repeats):
        items = [make_call() for _ in range(calls)] if fresh_calls else [make_call()] * calls
        gc.collect()
        gc.disable()
        state = enter() if enter else None
        try:
            start = time.perf_counter()
            for args, kwargs in items:
                fn(*args, **kwargs)
            blocks.append((time.perf_counter() - start) / calls * 1e6)
        finally:
            if leave:
                leave(state)
            gc.enable()
        del items
    return blocks


# NOTE: [Peeling a call]
# One call of a compiled function is Dynamo's frame callback (the C eval-frame
# hook, the cache lookup, the transformed bytecode), the guard check of the
# cache entries it tries, the backend's compiled_fn (AOTAutograd's runtime
# wrappers, then Inductor's CompiledFxGraph.__call__, then the generated
# module's call(): its Python wrapper code around the kernels). Each layer is
# timed alone, the same way as the full call (blocks of calls, median), in the
# same process, on the arguments it got in a real call:
#   guard check: for every frame of the call that has cache entries (found by
#     tracing an eager call with sys.setprofile and asking
#     torch._dynamo.eval_frame._debug_get_cache_entry_list for each code),
#     guard_manager.check(f_locals) of each entry in cache order up to the one
#     that passes, over that frame's f_locals (the Llama's DynamicCache is
#     swapped for a fresh one holding the same prefix, so the check passes);
#   compiled_fn: the __compiled_fn_* globals of the entry's code, wrapped for
#     one call to capture their arguments;
#   CompiledFxGraph: its __call__ patched for one call to capture the graph and
#     its inputs; the graph's current_callable alone gives the generated call;
#   kernels: call() once more with every kernel it names (cpp_fused_*,
#     extern_kernels.*, aten / torch.ops fallbacks) replaced by a replay of what
#     that kernel returned in a recorded call: what is left is the generated
#     wrapper (allocations, asserts, reinterpret_tensor, plus one Python call
#     per kernel of the replay, which flatters the kernels slightly).
# The layers: frame = full - guard - compiled_fn; AOTAutograd wrappers =
# compiled_fn - CompiledFxGraph (our package's _PackagedInductorGraph shell
# included); CompiledFxGraph.__call__ = itself - current_callable; generated
# wrapper = current_callable - kernels. For an aot_compile function there is no
# frame callback or guard: what lies above the CompiledFxGraph (the loaded
# function's own wrapper and AOTAutograd) is all "AOTAutograd wrappers".
# Graph breaks would put resume functions outside the eager trace: the number
# of compiled frames is reported, and every row measured here has one.


class _Replay:
    """Stands in for a kernel namespace or kernel in a generated module: records
    what each call returns, then replays it without computing."""

    def __init__(self, real, tape, path=""):
        self._real, self._tape, self._path = real, tape, path

    def __getattr__(self, name):
        import types

        attr = getattr(self._real, name)
        if (self._path == "torch" and name != "ops") or not (
            callable(attr) or isinstance(attr, types.ModuleType)
        ):
            child = attr  # torch.float32, torch._C, ...: the real thing
        else:
            child = _Replay(attr, self._tape, f"{self._path}.{name}")
        object.__setattr__(self, name, child)
        return child

    def __call__(self, *args, **kwargs):
        tape = self._tape
        if tape["recording"]:
            out = self._real(*args, **kwargs)
            tape["outs"].append(out)
            return out
        i = tape["i"]
        tape["i"] = i + 1
        return tape["outs"][i]


def replayed_call(call):
    """``call`` with its kernels replayed (NOTE: [Peeling a call]), and a function
    that records one real call of it first. ``call`` is the generated module's
    function (2.7.1) or its Runner's bound method (2.13)."""
    import types

    tape = {"recording": True, "outs": [], "i": 0}
    func = getattr(call, "__func__", call)
    glb = dict(func.__globals__)
    for name in list(glb):
        if name.startswith(("cpp_fused", "kernel_cpp", "extern_kernels", "aten", "torch")):
            glb[name] = _Replay(glb[name], tape, name)
    stub = types.FunctionType(func.__code__, glb, func.__name__, func.__defaults__, func.__closure__)
    if func is not call:
        stub = types.MethodType(stub, call.__self__)

    def record(inputs):
        tape.update(recording=True, outs=[], i=0)
        stub(list(inputs))
        tape["recording"] = False

    def replay(inputs):
        tape["i"] = 0
        return stub(inputs)

    return record, replay


def _raw_call(fn):
    """The generated module's call() under whatever wrapper post_compile put
    around it (input alignment)."""
    seen = 0
    while getattr(fn, "__name__", None) != "call" and seen < 4:
        cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
        fns = [c for c in cells if callable(c)]
        if not fns:
            return None
        fn = fns[0]
        seen += 1
    return fn if getattr(fn, "__name__", None) == "call" else None


def count_guards(guard_manager) -> int:
    """Leaf guards of a guard manager: the lines of its printed tree that are
    guards, not managers (walking get_child_managers() misses the key and value
    managers of dict guard managers, where an nn.ModuleList's guards live).
    Subtrees built apart for recursive dict tags count their own guards, not
    the one guard that stands for each in the tree."""
    count = 0
    for line in str(guard_manager).splitlines():
        _, sep, item = line.partition("+- ")
        if sep and "Manager" not in item.split(":", 1)[0]:
            count += 1
    subtrees = getattr(guard_manager, "dict_tag_subtrees", None)
    if subtrees is not None:
        wrapper = type(guard_manager)
        for subtree in subtrees.by_source.values():
            count += count_guards(wrapper(subtree.manager)) - 1
    return count


def _swap(value, swap, depth=0):
    """``value`` with the objects ``swap`` maps (by id) replaced, also inside
    the dicts, lists and tuples it holds (a wrapper's ``**kwargs``)."""
    if id(value) in swap:
        return swap[id(value)]
    if depth < 3 and type(value) in (dict, list, tuple):
        if type(value) is dict:
            return {k: _swap(v, swap, depth + 1) for k, v in value.items()}
        return type(value)(_swap(v, swap, depth + 1) for v in value)
    return value


def trace_frames(target, make_call):
    """(code, f_globals, f_locals) of every Python frame a call of ``target``
    (not compiled) enters, with the call's arguments swapped for a fresh
    call's."""
    frames = []

    def prof(frame, event, arg):
        if event == "call":
            frames.append((frame.f_code, frame.f_globals, dict(frame.f_locals)))

    args, kwargs = make_call()
    sys.setprofile(prof)
    try:
        target(*args, **kwargs)
    finally:
        sys.setprofile(None)
    args2, kwargs2 = make_call()
    swap = {id(a): b for a, b in zip(args, args2)}
    swap.update({id(kwargs[k]): kwargs2[k] for k in kwargs})
    return [
        (code, glb, {k: _swap(v, swap) for k, v in f_locals.items()})
        for code, glb, f_locals in frames
    ]


def grad_off() -> bool:
    import torch

    prev = torch.is_grad_enabled()
    torch._C._set_grad_enabled(False)
    return prev


def find_compiled_frames(fn, target, make_call):
    """What torch.compile's wrapper ``fn`` calls with the eval-frame hook set
    (the module's __call__, wrap_inline's function, or the function), and the
    frames of a call of it that have cache entries: (code, f_globals,
    f_locals, entries, index of the entry whose guards pass)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    inner = next(
        (o._torchdynamo_inline for o in (fn, getattr(fn, "forward", None))
         if hasattr(o, "_torchdynamo_inline")),
        target,
    )
    frames = []
    for code, glb, f_locals in trace_frames(inner, make_call):
        entries = _debug_get_cache_entry_list(code)
        if entries and not any(code is f[0] for f in frames):
            passing = [e.guard_manager.check(f_locals) for e in entries]
            if True not in passing:
                raise RuntimeError(f"no cache entry of {code.co_name} passes its guards")
            frames.append((code, glb, f_locals, entries, passing.index(True)))
    return inner, frames


def breakdown(fn, target, make_call, calls, repeats, fresh_calls, dynamo: bool) -> dict:
    """The layers of one call of ``fn`` (NOTE: [Peeling a call]), µs."""
    import torch
    import torch._inductor.output_code as output_code

    result = {}
    timers = {"full": lambda: fn}
    around = {}
    if dynamo:
        import torch._dynamo.eval_frame as eval_frame

        # The callback torch.compile's wrapper installs, for the call without
        # the wrapper: the eval-frame hook set around a block of plain calls.
        callbacks = []
        original_set = eval_frame._maybe_set_eval_frame

        def record_set(callback):
            if callback not in (None, False) and not callbacks:
                callbacks.append(callback)
            return original_set(callback)

        eval_frame._maybe_set_eval_frame = record_set
        args, kwargs = make_call()
        try:
            fn(*args, **kwargs)
        finally:
            eval_frame._maybe_set_eval_frame = original_set
        if callbacks:
            set_eval_frame = torch._C._dynamo.eval_frame.set_eval_frame
            timers["hooked"] = lambda: inner
            around["hooked"] = (lambda: set_eval_frame(callbacks[0]), set_eval_frame)

        inner, compiled_frames = find_compiled_frames(fn, target, make_call)
        result["compiled_frames"] = len(compiled_frames)
        result["cache_entries"] = [len(e) for _, _, _, e, _ in compiled_frames]
        checks = []
        for code, glb, f_locals, entries, hit in compiled_frames:
            managers = [e.guard_manager for e in entries]
            checks.append((managers[: hit + 1], f_locals))
            result.setdefault("guards", []).append(count_guards(managers[hit]))

        def guard_lookup():
            for managers, f_locals in checks:
                for m in managers:
                    if m.check(f_locals):
                        break

        # Capture the compiled_fn calls of one real call.
        captured, originals = [], []
        for code, glb, _, entries, _ in compiled_frames:
            for entry in entries:
                for name in entry.code.co_names:
                    if name.startswith("__compiled_fn") and name in glb:
                        real = glb[name]
                        originals.append((glb, name, real))

                        def capture(*a, _real=real, **k):
                            captured.append((_real, a, k))
                            return _real(*a, **k)

                        # Not a frame for Dynamo to compile (under fail_on_recompile
                        # it would raise): the compiled code calls it with the hook on.
                        glb[name] = torch._dynamo.disable(capture)
        args, kwargs = make_call()
        try:
            fn(*args, **kwargs)
        finally:
            for glb, name, real in originals:
                glb[name] = real

        def compiled_fns(*_a, **_k):
            for real, a, k in captured:
                real(*a, **k)

        timers["guard"] = lambda: (lambda *a, **k: guard_lookup())
        if captured:
            timers["compiled_fn"] = lambda: compiled_fns
    # Capture the CompiledFxGraph calls of one real call.
    graphs = []
    original_call = output_code.CompiledFxGraph.__call__

    def capture_graph(self, inputs):
        graphs.append((self, list(inputs)))
        return original_call(self, inputs)

    output_code.CompiledFxGraph.__call__ = torch._dynamo.disable(capture_graph)
    args, kwargs = make_call()
    try:
        fn(*args, **kwargs)
    finally:
        output_code.CompiledFxGraph.__call__ = original_call
    result["graphs"] = len(graphs)
    if graphs:
        def graph_calls(*_a, **_k):
            for g, inputs in graphs:
                g(list(inputs))

        def current_callables(*_a, **_k):
            for g, inputs in graphs:
                g.current_callable(list(inputs))

        timers["graph"] = lambda: graph_calls
        timers["callable"] = lambda: current_callables
        raw = [(_raw_call(g.current_callable), inputs) for g, inputs in graphs]
        if all(r is not None for r, _ in raw):
            replays = []
            for r, inputs in raw:
                record, replay = replayed_call(r)
                with torch.no_grad():
                    record(inputs)
                replays.append((r, replay, inputs))

            def raw_calls(*_a, **_k):
                for r, _, inputs in replays:
                    r(list(inputs))

            def replayed(*_a, **_k):
                for _, replay, inputs in replays:
                    replay(list(inputs))

            timers["raw_call"] = lambda: raw_calls
            timers["replayed"] = lambda: replayed
    # Below AOTAutograd the graph runs with grad off (in grad mode, inside its
    # autograd.Function's forward).
    for name in ("graph", "callable", "raw_call", "replayed"):
        around[name] = (grad_off, torch._C._set_grad_enabled)
    # Interleaved: every layer once per repeat.
    samples = {name: [] for name in timers}
    for _ in range(repeats):
        for name, get in timers.items():
            fresh = fresh_calls and name in ("full", "hooked")
            enter, leave = around.get(name, (None, None))
            samples[name] += time_blocks(get(), make_call, calls, 1, fresh, enter, leave)
    # NOTE: [Layers from the fastest block]
    # A layer is a difference of two timings, and a block that another job's
    # burst slowed would show up in it at full size, even as a negative layer:
    # the layers come from each timing's fastest block (timeit's rule), the
    # call's own figure in the tables from the median block.
    med = {name: min(v) for name, v in samples.items()}
    result["us"] = med
    full = med["full"]
    graph = med.get("graph")
    layers = {}
    if dynamo:
        layers["guard"] = med["guard"]
        hooked = med.get("hooked", full)
        if "hooked" in med:
            layers["wrapper_py"] = full - hooked
        if "compiled_fn" in med:
            layers["frame"] = hooked - med["guard"] - med["compiled_fn"]
            if graph is not None:
                layers["aot_autograd"] = med["compiled_fn"] - graph
    elif graph is not None:
        layers["aot_autograd"] = full - graph
    if graph is not None:
        layers["output_code"] = graph - med["callable"]
        if "replayed" in med:
            kernels = med["raw_call"] - med["replayed"]
            layers["kernels"] = kernels
            layers["wrapper"] = med["callable"] - kernels
        else:
            layers["wrapper"] = med["callable"]
    result["layers"] = layers
    return result


def measure_variant(spec: dict) -> dict:
    import torch

    torch.set_num_threads(1)
    target, make_call, dynamic = build_row(spec["row"])
    fresh_calls = spec["row"] == "llama"
    fns, info = prepare_variant(spec, target, make_call, dynamic)
    out = {"modes": {}, **info}
    dynamo = spec["variant"].startswith("package") or spec["variant"].split("-")[-1] in (
        "compile",
        "precompile",
    )
    for mode in MODES:
        fn = fns.get(mode)
        if fn is None:
            continue
        try:
            out["modes"][mode] = measure_mode(spec, mode, fn, target, make_call, fresh_calls, dynamo)
        except Exception as e:  # reported as the row's n/a
            out.setdefault("errors", {})[mode] = one_line(e)
            log.warning("%s %s failed:\n%s", spec["variant"], mode, traceback.format_exc())
    try:
        from torch._dynamo.utils import counters

        out["unique_graphs"] = counters["stats"]["unique_graphs"]
    except Exception:
        pass
    return out


def measure_mode(spec, mode, fn, target, make_call, fresh_calls, dynamo) -> dict:
    """The per-call figure of one mode, and its breakdown."""
    with grad_mode(mode):
        for _ in range(spec["warmup"]):
            args, kwargs = make_call()
            fn(*args, **kwargs)
        # Calls per block: about --block-ms of calls, from a short block.
        probe = min(time_blocks(fn, make_call, 5, 3, fresh_calls))
        calls = int(min(spec["max_calls"], max(5, spec["block_ms"] * 1e3 / probe)))
        blocks = time_blocks(fn, make_call, calls, spec["repeats"], fresh_calls)
        res = {"us": statistics.median(blocks), "us_min": min(blocks), "calls": calls}
        if spec["breakdown"] and not spec["variant"].endswith("eager"):
            try:
                res["breakdown"] = breakdown(
                    fn, target, make_call, calls, spec["breakdown_repeats"], fresh_calls, dynamo
                )
            except Exception as e:  # reported, the timing stands
                res["breakdown_error"] = one_line(e)
                log.warning("breakdown failed:\n%s", traceback.format_exc())
    return res


def count_row_guards(spec: dict) -> dict:
    """--recount-guards: the leaf guards of each compiled frame of a fresh
    compile of the row, per mode (backend="eager": the guards are Dynamo's)."""
    import torch

    target, make_call, dynamic = build_row(spec["row"])
    compiled = compile_target(target, dynamic, backend="eager")
    out = {}
    for mode in MODES:
        with grad_mode(mode):
            args, kwargs = make_call()
            compiled(*args, **kwargs)
            _, frames = find_compiled_frames(compiled, target, make_call)
            out[mode] = [count_guards(entries[hit].guard_manager) for *_, entries, hit in frames]
    torch._dynamo.reset()
    return out


def child_main(spec_json: str) -> int:
    logging.basicConfig(level=logging.WARNING)
    spec = json.loads(spec_json)
    phases = {"save": save_variant, "measure": measure_variant, "guards": count_row_guards}
    result = phases[spec["phase"]](spec)
    print("RESULT" + json.dumps(result), flush=True)
    return 0


# ---------------------------------------------------------------------------
# Parent: primes, interleaves fresh processes, reports.
# ---------------------------------------------------------------------------


# NOTE: [A snapshot of the overlay]
# A package records the overlay's series hash (the patches, mirrored modules
# and C++ sources) and a process with another hash refuses to load it. Other
# work edits the overlay in this checkout while a run takes minutes, so every
# overlay process of a run imports one snapshot of it: the committed
# torch_overlay/ and patches/ of HEAD (git archive) plus the built extension,
# first on PYTHONPATH (the editable install's finder comes after it).
SNAPSHOT = {"dir": None, "commit": None}


def snapshot_overlay(workdir: Path, commit: str = "HEAD") -> Path:
    snap = workdir / "overlay-snapshot"
    snap.mkdir()
    SNAPSHOT["commit"] = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", commit], capture_output=True, text=True, check=True
    ).stdout.strip()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", SNAPSHOT["commit"], "torch_overlay", "patches"],
        capture_output=True, check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    for lib in (ROOT / "torch_overlay").rglob("*.so"):
        dest = snap / lib.relative_to(ROOT)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(lib, dest)
    return snap


def _env(interpreter: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_OVERLAY")}
    env["TORCHINDUCTOR_CACHE_DIR"] = cache
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = "1"
    if interpreter == "overlay":
        env["TORCH_OVERLAY"] = "1"
        env["TORCH_OVERLAY_CACHE_DIR"] = str(ROOT / "build" / "overlay-cache")
        if SNAPSHOT["dir"]:
            env["PYTHONPATH"] = os.pathsep.join(
                [str(SNAPSHOT["dir"]), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
    return env


def run_child(interpreter: str, cache: str, spec: dict, timeout: float) -> dict:
    python = str(OVERLAY_PY if interpreter == "overlay" else UPSTREAM_PY)
    cmd = [python, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(
            cmd, env=_env(interpreter, cache), capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-3:]
        return {"error": f"exit {proc.returncode}: " + " | ".join(tail)[-600:]}
    return json.loads(lines[-1][len("RESULT"):])


def summarize(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "runs": values}


def measure(args) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="call-overhead-"))
    variants = [v for v in VARIANTS if v[1] == "overlay" or UPSTREAM_PY.exists()]
    if args.variants:
        variants = [v for v in variants if v[0] in args.variants]
    # The fresh compiles of a row run in the inductor cache its package save
    # (ours) or caching_precompile save (2.13) compiled into: warm, as in a
    # user's second process; every load gets an empty one.
    warm = {}
    saved = {}
    report = {"rows": {}, "errors": {}}
    try:
        SNAPSHOT["dir"] = snapshot_overlay(workdir)
        # Materialises the snapshot's overlay once, outside every measured process.
        subprocess.run([str(OVERLAY_PY), "-c", "import torch"],
                       env=_env("overlay", tempfile.mkdtemp(dir=workdir)),
                       check=True, capture_output=True)

        def save(job):
            row, variant, interpreter = job
            artifact = str(workdir / f"{row}-{variant}")
            log.info("saving %s %s", row, variant)
            # Each save compiles into an empty cache of its own, as a user's
            # first process would (load_time.py's priming does the same).
            cache = tempfile.mkdtemp(dir=workdir)
            spec = {"phase": "save", "row": row, "variant": variant, "artifact": artifact}
            return job, artifact, cache, run_child(interpreter, cache, spec, args.timeout)

        jobs = [(row, v, i) for row in args.rows for v, i, primed in variants if primed]
        # Saves are not timed: --save-jobs of them at once.
        with concurrent.futures.ThreadPoolExecutor(args.save_jobs) as pool:
            for (row, variant, interpreter), artifact, cache, res in pool.map(save, jobs):
                saved[(row, variant)] = (artifact, res)
                if variant in ("package", "package-dict-tags", "upstream-precompile"):
                    warm[(row, interpreter)] = cache
        samples = {}
        for rnd in range(args.rounds):
            for row in args.rows:
                for variant, interpreter, primed in variants:
                    spec = {
                        "phase": "measure", "row": row, "variant": variant,
                        "block_ms": args.block_ms, "max_calls": args.max_calls,
                        "repeats": args.repeats, "warmup": args.warmup,
                        "breakdown": not args.no_breakdown,
                        "breakdown_repeats": args.breakdown_repeats,
                    }
                    if (row, interpreter) not in warm:
                        warm[(row, interpreter)] = tempfile.mkdtemp(dir=workdir)
                    cache = warm[(row, interpreter)]
                    if primed:
                        artifact, save_res = saved[(row, variant)]
                        if "error" in save_res:
                            report["errors"][f"{row}/{variant}"] = "save: " + save_res["error"]
                            continue
                        spec.update(artifact=artifact, save_errors=save_res.get("save_errors"))
                        cache = tempfile.mkdtemp(dir=workdir)
                    log.info("round %d: %s %s", rnd, row, variant)
                    res = run_child(interpreter, cache, spec, args.timeout)
                    if "error" in res:
                        report["errors"][f"{row}/{variant}"] = res["error"]
                        continue
                    for key, err in (res.get("errors") or {}).items():
                        report["errors"][f"{row}/{variant}/{key}"] = err
                    samples.setdefault((row, variant), []).append(res)
                    if primed:
                        shutil.rmtree(cache, ignore_errors=True)
        report["rows"] = aggregate(samples, args.rows, variants)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def aggregate(samples: dict, rows, variants) -> dict:
    """Per row, mode and variant: µs (min / median over rounds), the median of
    per-round ratios to the same interpreter's eager, and the breakdown's
    layers (median over rounds)."""
    out = {}
    for row in rows:
        out[row] = {}
        for mode in MODES:
            table = {}
            for variant, interpreter, _ in variants:
                runs = samples.get((row, variant), [])
                per_round = [r["modes"][mode] for r in runs if mode in r.get("modes", {})]
                if not per_round:
                    continue
                entry = summarize([r["us"] for r in per_round])
                eager_id = "eager" if interpreter == "overlay" else "upstream-eager"
                eager_runs = samples.get((row, eager_id), [])
                ratios = [
                    r["modes"][mode]["us"] / e["modes"][mode]["us"]
                    for r, e in zip(runs, eager_runs)
                    if mode in r.get("modes", {}) and mode in e.get("modes", {})
                ]
                if ratios:
                    entry["vs_eager"] = statistics.median(ratios)
                bds = [r["breakdown"] for r in per_round if "breakdown" in r]
                if bds:
                    layers = {
                        name: statistics.median([b["layers"][name] for b in bds if name in b["layers"]])
                        for name in LAYERS
                        if any(name in b["layers"] for b in bds)
                    }
                    entry["breakdown"] = {
                        "layers_us": layers,
                        "full_us": statistics.median([b["us"]["full"] for b in bds]),
                        "compiled_frames": bds[0].get("compiled_frames"),
                        "cache_entries": bds[0].get("cache_entries"),
                        "guards": bds[0].get("guards"),
                        "graphs": bds[0].get("graphs"),
                    }
                errs = [r["breakdown_error"] for r in per_round if "breakdown_error" in r]
                if errs:
                    entry["breakdown_error"] = errs[0]
                if runs and "unique_graphs" in runs[0]:
                    entry["unique_graphs"] = runs[0]["unique_graphs"]
                table[variant] = entry
            out[row][mode] = table
    return out


def summary_lines(modes: dict) -> list[str]:
    """Per mode: our package load against eager and against 2.13's fastest
    load, and the layer of its call that costs most, kernels aside."""
    lines = []
    for mode in MODES:
        table = modes.get(mode, {})
        pkg = table.get("package")
        if not pkg or "vs_eager" not in pkg:
            continue
        text = f"{mode}: package load {pkg['vs_eager']:.2f}× eager"
        upstream = [table[v] for v in ("upstream-precompile", "upstream-aot") if v in table]
        if upstream:
            best = min(upstream, key=lambda e: e["median"])
            text += f", {pkg['median'] / best['median']:.2f}× 2.13's fastest load"
        layers = pkg.get("breakdown", {}).get("layers_us", {})
        overhead = {k: v for k, v in layers.items() if k != "kernels"}
        if overhead:
            top = max(overhead, key=overhead.get)
            text += f"; its largest layer besides kernels: {LAYER_TITLES[top]} ({overhead[top]:.1f} µs)"
        lines.append(f"- {text}.")
    return [""] + lines if lines else []


def render(report: dict) -> str:
    lines = [
        "## Per-call overhead (benchmarks/call_overhead.py)",
        "",
        f"Machine: {report['machine']}{'; ' + report['note'] if report.get('note') else ''}. "
        f"{report['rounds']} rounds, one fresh process per variant per round, variants "
        f"interleaved; overlay at commit {report['overlay_commit'][:10]} (NOTE: [A snapshot "
        f"of the overlay]); {report['repeats']} blocks of ~{report['block_ms']:.0f} ms of calls per "
        "process (median block), torch.set_num_threads(1), Inductor. µs per call: min / median "
        "over rounds; × eager: median of per-round ratios to the same interpreter's "
        "eager (ours: 2.7.1 + overlay; 2.13: upstream's).",
        "",
    ]
    if report.get("guards_recounted"):
        lines += ["Guards counted again after the run (NOTE: [Recounting guards]); "
                  "2.13's caching_precompile load's are not counted.", ""]
    variants = [v for v, _, _ in VARIANTS]
    for row, modes in report["rows"].items():
        lines += [f"### {ROW_TITLES[row]}", "", "| variant | no_grad µs | × eager | grad µs | × eager |",
                  "|---|---|---|---|---|"]
        for variant in variants:
            cells = []
            for mode in MODES:
                e = modes.get(mode, {}).get(variant)
                if e is None:
                    cells += ["n/a", ""]
                else:
                    cells += [f"{e['min']:.1f} / {e['median']:.1f}",
                              f"{e['vs_eager']:.2f}" if "vs_eager" in e else ""]
            if all(c in ("n/a", "") for c in cells):
                continue
            lines.append(f"| {VARIANT_TITLES[variant]} | " + " | ".join(cells) + " |")
        has_breakdown = any(
            "breakdown" in e for mode in MODES for e in modes.get(mode, {}).values()
        )
        if has_breakdown:  # none with --no-breakdown
            lines += ["", "Breakdown of one call, µs (× eager): each timing's fastest block, median over "
                      "rounds (NOTE: [Peeling a call], NOTE: [Layers from the fastest block]); "
                      "frames: compiled frames of the call, guards: their leaf guards:", "",
                      "| variant, mode | full | " + " | ".join(LAYER_TITLES[l] for l in LAYERS)
                      + " | frames / guards |", "|---|---|" + "---|" * len(LAYERS) + "---|"]
        for variant in variants:
            for mode in MODES:
                e = modes.get(mode, {}).get(variant)
                if not e or "breakdown" not in e:
                    continue
                eager = modes[mode].get("upstream-eager" if variant.startswith("upstream") else "eager")
                base = eager["median"] if eager else None
                bd = e["breakdown"]

                def cell(us):
                    return f"{us:.1f}" + (f" ({us / base:.2f})" if base else "")

                layer_cells = [cell(bd["layers_us"][l]) if l in bd["layers_us"] else "—" for l in LAYERS]
                frames = bd.get("compiled_frames")
                guards = bd.get("guards")
                fg = f"{frames} / {sum(guards)}" if frames is not None and guards else "—"
                lines.append(f"| {VARIANT_TITLES[variant]}, {mode} | {cell(bd['full_us'])} | "
                             + " | ".join(layer_cells) + f" | {fg} |")
        lines += summary_lines(modes)
        lines.append("")
    if report.get("errors"):
        lines += ["Not measured:", ""]
        lines += [f"- {k}: {v}" for k, v in sorted(report["errors"].items())]
        lines.append("")
    return "\n".join(lines) + "\n"


# NOTE: [Recounting guards]
# Until 2026-12-02 the breakdown counted guards by walking
# get_child_managers(), which misses the key and value managers of dict guard
# managers: the guards of an nn.ModuleList's layers, most of the 32-layer
# stack's. --recount-guards counts them again, from fresh compiles with the
# overlay snapshot the report names, without timing anything: it replaces the
# counts of the fresh compile and our package (which loads the guards its
# compile saved) and drops 2.13's caching_precompile load's (its guards
# differ from a compile's), then renders the report again.
RECOUNT_VARIANTS = {"overlay": ("compile", "package"), "upstream": ("upstream-compile",)}


def recount_guards(out: Path) -> int:
    report = json.loads(out.read_text())
    workdir = Path(tempfile.mkdtemp(prefix="call-overhead-guards-"))
    try:
        snapshot_overlay(workdir, report.get("overlay_commit") or "HEAD")
        SNAPSHOT["dir"] = workdir / "overlay-snapshot"
        for row, modes in report["rows"].items():
            for interpreter, variants in RECOUNT_VARIANTS.items():
                if interpreter == "upstream" and not UPSTREAM_PY.exists():
                    continue
                log.info("counting guards: %s %s", row, interpreter)
                res = run_child(interpreter, tempfile.mkdtemp(dir=workdir),
                                {"phase": "guards", "row": row}, 900)
                if "error" in res:
                    log.warning("%s %s: %s", row, interpreter, res["error"])
                    continue
                for mode, table in modes.items():
                    for variant in variants:
                        bd = table.get(variant, {}).get("breakdown")
                        if bd is not None and mode in res:
                            bd["guards"] = res[mode]
            for table in modes.values():
                bd = table.get("upstream-precompile", {}).get("breakdown")
                if bd is not None:
                    bd["guards"] = None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["guards_recounted"] = True
    out.write_text(json.dumps(report, indent=2))
    text = render(report)
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--block-ms", type=float, default=20.0, help="ms of calls per timed block")
    parser.add_argument("--max-calls", type=int, default=2000, help="at most this many calls a block")
    parser.add_argument("--repeats", type=int, default=7, help="timed blocks per process")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--breakdown-repeats", type=int, default=5)
    parser.add_argument("--no-breakdown", action="store_true")
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=ROWS)
    parser.add_argument("--variants", nargs="+", choices=[v for v, _, _ in VARIANTS])
    parser.add_argument("--save-jobs", type=int, default=2, help="save processes at once (untimed)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per process")
    parser.add_argument(
        "--recount-guards",
        action="store_true",
        help="count the guards of the report --out holds again (NOTE: [Recounting guards])",
    )
    parser.add_argument("--note", default="", help="a line about the machine for the report")
    parser.add_argument("--out", default=str(BENCH_DIR / "results" / "call_overhead.json"))
    args = parser.parse_args(argv)
    if args.child:
        return child_main(args.child)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.recount_guards:
        return recount_guards(Path(args.out))
    started = time.time()
    report = measure(args)
    report.update(
        machine=f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        note=args.note, rounds=args.rounds, block_ms=args.block_ms, repeats=args.repeats,
        overlay_commit=SNAPSHOT["commit"],
        wall_s=time.time() - started,
    )
    text = render(report)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    out.with_suffix(".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
