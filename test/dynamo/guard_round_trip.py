"""Build, save and load guard managers: the harness of the guard serialization tests.

A test helper, not a test file: test_guard_serialization.py,
test_guard_serialization_functorch.py and the behaviour diff's guard probe runner
(tools/behaviour_diff/guard_probe_runner.py) build, save and load their guard
managers here, so every round trip takes one path, upstream's: save with
``CheckFunctionManager(code, output_graph, save_guards=True)``, load with
``torch._dynamo.package.load_guard_manager(load_guards_state(data), code,
f_globals)``, so the restricted unpickler reads every saved state. (The seed's
``guards_serialization_mode`` alias is tested once, in
test_guard_serialization.py's TestGuardSerializationSpellings.) Like
frame_tracing.py, which traces the frames, it runs under torch 2.7.1 with the
backported modules and under upstream torch, and finds version differences by
signature.

* :func:`new_check_fn_manager` -- the CheckFunctionManager of a traced frame,
  saving its guards with ``save_guards=True``;
* :func:`load_guard_manager` -- the guard manager of saved guards;
* :func:`build_check_fn_manager` -- trace one call (frame_tracing) and build its
  manager, as a :class:`Built`; :func:`load_built` loads what it saved;
* :func:`save_and_load_in_fresh_processes` -- save in one fresh interpreter and
  load in another;
* :func:`guard_type_name` -- a guard's type, in every version.
"""

import dataclasses
import inspect
import os
import textwrap
import types
from typing import Any, Callable, Optional

from torch._dynamo.guards import CheckFunctionManager
from torch._guards import Guard

from frame_tracing import frame_of, trace_frame


HERE = os.path.dirname(os.path.abspath(__file__))

# The global state and torch function mode stack guards, which 2.7.1 installed
# outside any filter (the guard filter presets' patch made them the filterable
# GLOBAL_STATE / TORCH_FUNCTION_STATE): kept whatever ``guard_types`` says.
ALWAYS_KEPT_GUARD_TYPES = ("GLOBAL_STATE", "TORCH_FUNCTION_STATE")


def guard_type_name(guard: Guard) -> str:
    """The guard's type (its GuardBuilder method's name), as the torch under
    test names it: guard_serialization.guard_type_name with the backport,
    Guard.create_fn_name() upstream, Guard.inner_create_fn() in stock 2.7.1."""
    try:
        from torch._dynamo.guard_serialization import guard_type_name as type_name
    except ImportError:
        create_fn_name = getattr(guard, "create_fn_name", None)
        if create_fn_name is not None:
            return create_fn_name()
        return guard.inner_create_fn().__name__
    return type_name(guard)


def new_check_fn_manager(
    code: types.CodeType,
    output_graph: Any,
    *,
    guard_filter_fn: Optional[Callable] = None,
    save_guards: bool = False,
    guards_serialization_mode: Optional[str] = None,
) -> CheckFunctionManager:
    """The CheckFunctionManager of a traced frame, as a compile builds it; with
    ``save_guards`` it also saves them (``.guards_state``), refusing what it
    cannot save (upstream's ``strict_error=True``, where it exists: upstream
    otherwise saves nothing and carries on). ``guards_serialization_mode`` is
    the seed's alias, for the one test of it."""
    kwargs: dict[str, Any] = {"guard_filter_fn": guard_filter_fn}
    if save_guards:
        kwargs["save_guards"] = True
        if "strict_error" in inspect.signature(CheckFunctionManager).parameters:
            kwargs["strict_error"] = True
    if guards_serialization_mode is not None:
        kwargs["guards_serialization_mode"] = guards_serialization_mode
    return CheckFunctionManager(code, output_graph, **kwargs)


def load_guard_manager(guards_state: bytes, code: types.CodeType, f_globals: dict):
    """The guard manager of ``guards_state`` (saved guards) for frames of
    ``code`` whose globals are ``f_globals``: upstream's load, the bytes read by
    the restricted unpickler."""
    from torch._dynamo.package import load_guard_manager, load_guards_state

    return load_guard_manager(load_guards_state(guards_state), code, f_globals)


@dataclasses.dataclass
class Built:
    """A traced call and the guard manager built for it (``ref``)."""

    code: types.CodeType
    ref: CheckFunctionManager
    f_locals: dict
    f_globals: dict


def build_check_fn_manager(
    fn,
    args,
    kwargs=None,
    *,
    guard_types=None,
    extra_guards=(),
    save_guards=True,
    guards_serialization_mode=None,
    guard_filter_fn=None,
    backend=None,
) -> Built:
    """Trace ``fn(*args, **kwargs)`` with InstructionTranslator as a compile
    would (frame_tracing.trace_frame) and build its guard manager, saving its
    guards unless ``save_guards=False``.

    The frame is made from the arguments without running ``fn``, so inputs that
    calling would consume (iterators) are guarded as given. ``guard_types``
    keeps only guards of those types (and ALWAYS_KEPT_GUARD_TYPES), unless a
    ``guard_filter_fn`` is given. ``extra_guards``, (source, GuardBuilder
    method) pairs, are added to the traced graph's guards.
    """
    frame = frame_of(fn, args, kwargs)

    def keep_guard_types(entries):
        return [
            e.guard_type in guard_types or e.guard_type in ALWAYS_KEPT_GUARD_TYPES
            for e in entries
        ]

    if guard_filter_fn is None and guard_types:
        guard_filter_fn = keep_guard_types

    def build(code, output_graph):
        for source, create_fn in extra_guards:
            output_graph.guards.add(Guard(source, create_fn))
        return new_check_fn_manager(
            code,
            output_graph,
            guard_filter_fn=guard_filter_fn,
            save_guards=save_guards,
            guards_serialization_mode=guards_serialization_mode,
        )

    ref = trace_frame(frame, build=build, backend=backend)
    return Built(frame.code, ref, frame.f_locals, frame.f_globals)


def load_built(built: Built):
    """The guard manager loaded from what ``built`` saved."""
    if not isinstance(built.ref.guards_state, bytes):
        raise AssertionError("the guards were built without save_guards=True")
    return load_guard_manager(built.ref.guards_state, built.code, built.f_globals)


# What the fresh interpreters of save_and_load_in_fresh_processes run first.
_FRESH_PRELUDE = """\
import torch
import guard_round_trip
import {module} as t
from torch.testing._internal.fresh_process import write_report as report

GUARDS_PATH = {guards_path!r}


def save(built):
    with open(GUARDS_PATH, "wb") as f:
        f.write(built.ref.guards_state)
    report(len(built.ref.guards_state))


def load(fn):
    with open(GUARDS_PATH, "rb") as f:
        data = f.read()
    return guard_round_trip.load_guard_manager(data, fn.__code__, fn.__globals__)

"""


def save_and_load_in_fresh_processes(test_file: str, save_body: str, load_body: str) -> Any:
    """Runs ``save_body`` in one fresh interpreter and ``load_body`` in another
    and returns what the loading one reported.

    Both see the test module of ``test_file`` (pass ``__file__``) as ``t`` and
    these helpers: ``save(built)`` writes what ``build_check_fn_manager``
    saved to the guards file; ``load(fn)`` is the guard manager loaded from it
    for the module-level function ``fn``; ``report(value)`` reports a JSON
    value to the test (the children are torch.testing._internal.fresh_process's).
    """
    import tempfile

    from torch.testing._internal.fresh_process import run_code

    module = os.path.splitext(os.path.basename(test_file))[0]
    test_dir = os.path.dirname(os.path.abspath(test_file))
    with tempfile.TemporaryDirectory() as tmp:
        prelude = _FRESH_PRELUDE.format(
            module=module, guards_path=os.path.join(tmp, "guards.bin")
        )
        pythonpath = list(dict.fromkeys([HERE, test_dir]))
        run_code(prelude + textwrap.dedent(save_body), pythonpath=pythonpath)
        return run_code(prelude + textwrap.dedent(load_body), pythonpath=pythonpath)
