"""The modules only compiling needs, imported in one place when a compile starts.

A process that loads a compile package or an aot_compile'd function runs
compiled code and never traces, so ``import torch._dynamo`` and the runtime
modules it imports (eval_frame, convert_frame, guards, utils) leave Dynamo's
tracer, symbolic shapes and sympy unimported. The first compile imports them
all here, through :func:`import_compiler`, which ``convert_frame._compile``
calls before anything else.
"""

import importlib
import logging
import sys
import time


log = logging.getLogger(__name__)

# NOTE: [Compile-only imports]
# Invariant: every module in COMPILE_ONLY_MODULES is first imported by
# import_compiler(), which the first compile calls before it traces, so a
# profile of a first compile shows their whole cost under one frame, and a
# process that only runs loaded code never pays it (test_load_imports checks
# both). Code on the runtime path that needs a name from one of them while it
# compiles (guards built for a new entry, shape-env helpers) imports the name
# where it uses it; by then the module is in sys.modules and the import is a
# dict lookup. The torch object rule map, which imports every module a name in
# it lives in, is built here as well (see NOTE: [The torch object rule map is
# built on first use] in trace_rules.py).
#
# Inductor's compiler has one such place of its own: the first compile imports
# torch._inductor.compile_fx in _TorchCompileInductorWrapper.__call__
# (torch/__init__.py), which imports the rest of Inductor's compiler.
COMPILE_ONLY_MODULES = (
    "sympy",
    "torch.utils._sympy.functions",
    "torch.utils._sympy.value_ranges",
    "torch.fx.experimental.symbolic_shapes",
    "torch.fx.experimental.validator",
    "torch._dynamo.variables",
    "torch._dynamo.output_graph",
    "torch._dynamo.symbolic_convert",
)


def import_compiler() -> None:
    """Import what tracing needs and build the torch object rule map.

    Every compile calls it. After the first, each import is a sys.modules
    lookup and the rule map is cached (trace_rules.get_torch_obj_rule_map is
    lru_cached; after trace_rules.clear_lru_cache() the next compile rebuilds
    it here), so it keeps no state of its own; concurrent first compiles are
    serialized by the import system's module locks."""
    missing = [name for name in COMPILE_ONLY_MODULES if name not in sys.modules]
    start = time.perf_counter()
    for name in COMPILE_ONLY_MODULES:
        importlib.import_module(name)
    from torch._dynamo import trace_rules

    trace_rules.get_torch_obj_rule_map()
    if missing:
        log.debug(
            "imported Dynamo's compiler (%d modules) in %.3f s",
            len(missing),
            time.perf_counter() - start,
        )
