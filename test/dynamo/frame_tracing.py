"""Trace one call of a function with Dynamo's InstructionTranslator, as a compile does.

A test helper, not a test file: guard_round_trip.py, the harness the guard
serialization tests (test_guard_serialization.py,
test_guard_serialization_functorch.py) and the behaviour diff's guard probe runner
build, save and load their guard managers with, traces with it; the runner runs it
under torch 2.7.1 (with or without the backported modules) and under upstream
torch. It therefore imports only what all of those have, and finds version
differences by signature (upstream's InstructionTranslator takes ``package``).

* :func:`frame_of` -- the frame a call would get (locals with defaults applied, the
  function's globals, builtins and closure), made without running the function;
* :func:`trace_frame` -- trace such a frame and return ``build(code, output_graph)``.
"""

import contextlib
import dataclasses
import inspect
import types
from typing import Any, Callable

import torch
import torch._dynamo
import torch._dynamo.convert_frame as convert_frame
import torch._dynamo.symbolic_convert as symbolic_convert
from torch._dynamo.bytecode_transformation import transform_code_object
from torch._dynamo.exc import RestartAnalysis, UnspecializeRestartAnalysis
from torch._dynamo.utils import dynamo_timed, get_metrics_context
from torch._guards import compile_context, CompileContext, CompileId, tracing


# NOTE: [Tracing a frame as convert_frame does]
# A compile sets up more than the tracer, and guards read some of it:
# ``convert_frame.initial_global_state`` (read by 2.7.1's guard builder and by
# upstream's OutputGraph when it is created), the compile and metrics contexts, the
# tracing context, and ``preserve_global_state`` (the torch function modes popped
# while tracing; grad mode, RNG and dispatch keys restored after it). trace_frame
# sets exactly those where convert_frame does: the tracer runs inside the tracing
# context and preserve_global_state; the guards are built after both, inside the
# compile and metrics contexts, with initial_global_state still set. A trace that
# raises RestartAnalysis starts again, as convert_frame's loop does: the
# speculation log is replayed from its start, and dropped only on
# UnspecializeRestartAnalysis.

# convert_frame gives up after 100 restarts too.
MAX_RESTARTS = 100


@dataclasses.dataclass
class Frame:
    code: types.CodeType
    f_locals: dict
    f_globals: dict
    f_builtins: dict
    closure: tuple


def frame_of(fn, args, kwargs=None) -> Frame:
    """The frame ``fn(*args, **kwargs)`` would start with, made without calling
    ``fn``: inputs that running it would consume (iterators) are seen as given."""
    bound = inspect.signature(fn, follow_wrapped=False).bind(*args, **(kwargs or {}))
    bound.apply_defaults()
    code = fn.__code__
    closure = fn.__closure__ or ()
    f_locals = dict(bound.arguments)
    for name, cell in zip(code.co_freevars, closure):
        f_locals[name] = cell.cell_contents
    f_globals = fn.__globals__
    f_builtins = f_globals["__builtins__"]
    if isinstance(f_builtins, types.ModuleType):
        f_builtins = vars(f_builtins)
    return Frame(code, f_locals, f_globals, f_builtins, closure)


def trace_frame(
    frame: Frame, *, build: Callable[[types.CodeType, Any], Any], backend=None
) -> Any:
    """Trace ``frame`` (see :func:`frame_of`) and return ``build(code, output_graph)``.

    ``backend`` is the compiler function handed to the tracer (default: the eager
    backend, the one Dynamo accepts for frames running inside vmap, grad or jvp).
    An error of the trace itself propagates unchanged, as does one of ``build``.
    See NOTE: [Tracing a frame as convert_frame does].
    """
    if backend is None:
        backend = torch._dynamo.lookup_backend("eager")
    # Taken before tracing: preserve_global_state pops the modes while it traces.
    mode_stack = torch.overrides._get_current_function_mode_stack()
    speculation_log = symbolic_convert.SpeculationLog()
    for _attempt in range(MAX_RESTARTS):
        speculation_log.restart()
        try:
            return _trace_once(frame, mode_stack, backend, speculation_log, build)
        except RestartAnalysis as e:
            if isinstance(e, UnspecializeRestartAnalysis):
                speculation_log.clear()
    raise RuntimeError(f"the trace of {frame.code.co_name} restarted {MAX_RESTARTS} times")


def _new_tracer(frame, instructions, code_options, mode_stack, backend, speculation_log):
    kwargs: dict[str, Any] = dict(
        one_graph=False,
        export=False,
        export_constraints=None,
        frame_state=None,
        speculation_log=speculation_log,
        distributed_state=None,
    )
    tracer_params = inspect.signature(symbolic_convert.InstructionTranslator).parameters
    if "package" in tracer_params:
        kwargs["package"] = None
    # NOTE: torch 2.6.0's tracer has no exception stack (a second supported base).
    if "exn_vt_stack" in tracer_params:
        kwargs["exn_vt_stack"] = symbolic_convert.ExceptionStack()
    return symbolic_convert.InstructionTranslator(
        instructions,
        frame.code,
        frame.f_locals,
        frame.f_globals,
        frame.f_builtins,
        frame.closure,
        mode_stack,
        code_options,
        backend,
        **kwargs,
    )


def _trace_once(frame, mode_stack, backend, speculation_log, build) -> Any:
    traced: dict[str, Any] = {}

    def transform(instructions, code_options):
        tracer = _new_tracer(
            frame, instructions, code_options, mode_stack, backend, speculation_log
        )
        with tracing(tracer.output.tracing_context), tracer.set_current_tx():
            try:
                tracer.run()
            except Exception as e:
                # Raised once preserve_global_state has restored the global state.
                traced["error"] = e
                return
        traced["output"] = tracer.output

    previous = convert_frame.initial_global_state
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            compile_context(CompileContext(CompileId(frame_id=0, frame_compile_id=0)))
        )
        stack.enter_context(get_metrics_context())
        stack.enter_context(dynamo_timed("trace_frame"))
        convert_frame.initial_global_state = torch._C._dynamo.guards.GlobalStateGuard()
        try:
            convert_frame.preserve_global_state(transform_code_object)(
                frame.code, transform
            )
            if "error" in traced:
                raise traced["error"]
            return build(frame.code, traced["output"])
        finally:
            convert_frame.initial_global_state = previous
