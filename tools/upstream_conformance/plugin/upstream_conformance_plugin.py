"""pytest plugin for the upstream conformance run: what torch 2.13's precompile test
files import at module level that torch 2.7.1 lacks and that is NOT precompile.

``make upstream-conformance`` loads it with ``-p upstream_conformance_plugin`` so that
upstream's files import unchanged; each name below says which upstream PR added the
real thing. A test that then exercises one of these features fails here, and its
entry in keep_list.toml names the feature as 2.13-only. Nothing here supplies a
precompile name: those are the patch set's to provide (issue 28: "0 shims for
precompile names"), and ``test_no_precompile_names`` in
test/overlay/test_upstream_conformance.py holds this module to it.
"""

from __future__ import annotations

import sys
import types


# What this plugin supplies: (module, name) -> the upstream PR that added it.
SUPPLIED: dict[tuple[str, str], str] = {}


class FeatureNotInBase(NotImplementedError):
    """A 2.13 feature outside precompile that the base torch does not have."""


def _missing(feature: str, pr: str):
    def call(*args, **kwargs):
        import torch

        raise FeatureNotInBase(
            f"{feature} (pytorch#{pr}) is not in torch {torch.__version__}; the "
            "conformance plugin supplies its name only so that upstream's test file imports"
        )

    call.__name__ = feature.rsplit(".", 1)[-1]
    return call


def _module(name: str) -> types.ModuleType:
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name, f"Conformance stand-in for {name} (not in this torch)")
        sys.modules[name] = module
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(_module(parent), child, module)
    return module


def _supply(module_name: str, name: str, value, pr: str) -> None:
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ImportError:
        module = _module(module_name)
    if hasattr(module, name):
        return
    setattr(module, name, value)
    SUPPLIED[(module_name, name)] = pr


def _opaque_objects() -> None:
    # Opaque objects: pytorch#162660 (reference types), pytorch#167768 (value types).
    # test_guard_serialization.py subclasses OpaqueBase and registers a value type at
    # import; the registry below records registrations and nothing reads it.
    class OpaqueBase:
        """Stand-in base class of torch 2.13's opaque objects."""

    registered: dict[type, str] = {}

    def register_opaque_type(cls, *args, typ: str = "reference", **kwargs):
        registered[cls] = typ

    _supply("torch._opaque_base", "OpaqueBase", OpaqueBase, "162660")
    _supply("torch._library.opaque_object", "register_opaque_type", register_opaque_type, "167768")


def _test_utilities() -> None:
    # torch.testing._internal.inductor_utils' HAS_CUDA_AND_TRITON and
    # HAS_XPU_AND_TRITON (pytorch#159883): computed the way their names say.
    from torch.testing._internal import inductor_utils
    from torch.utils._triton import has_triton

    _supply(
        "torch.testing._internal.inductor_utils",
        "HAS_CUDA_AND_TRITON",
        bool(getattr(inductor_utils, "HAS_CUDA", False)) and has_triton(),
        "159883",
    )
    _supply(
        "torch.testing._internal.inductor_utils",
        "HAS_XPU_AND_TRITON",
        bool(getattr(inductor_utils, "HAS_XPU", False)) and has_triton(),
        "159883",
    )


def _joint_with_descriptors() -> None:
    # aot_export_joint_with_descriptors / aot_compile_joint_with_descriptors:
    # pytorch#158715.
    for name in ("aot_export_joint_with_descriptors", "aot_compile_joint_with_descriptors"):
        _supply("torch._functorch.aot_autograd", name, _missing(f"torch._functorch.aot_autograd.{name}", "158715"), "158715")


def _regional_inductor() -> None:
    # torch.fx.passes.regional_inductor: compiles fx_traceback.annotate'd regions
    # with Inductor (pytorch#164776).
    _supply(
        "torch.fx.passes.regional_inductor",
        "regional_inductor",
        _missing("torch.fx.passes.regional_inductor.regional_inductor", "164776"),
        "164776",
    )


def supply_all() -> None:
    """Supply every name above (idempotent)."""
    _opaque_objects()
    _test_utilities()
    _joint_with_descriptors()
    _regional_inductor()


# NOTE: [Stand-ins in spawned processes]
# Some upstream tests run a function of the test file in a process started with
# multiprocessing's spawn method; that process imports the test file again by
# module name, without pytest and so without this plugin, and a file that
# imports a stand-in at module level would fail there (its parent then waits
# forever on the child's result queue). sitecustomize.py beside this file (the
# run puts this directory on PYTHONPATH, which children inherit) installs
# UpstreamTestFileFinder: before a module named like one of upstream's test
# files is loaded, the stand-ins are supplied. It finds nothing itself.
TEST_FILE_MODULES = ("test_aot_compile", "test_package", "test_guard_serialization", "test_precompile_context")


class UpstreamTestFileFinder:
    """A meta path finder that supplies the stand-ins before an upstream test
    file is imported, and leaves finding the file to the other finders."""

    @staticmethod
    def find_spec(fullname, path=None, target=None):
        if fullname.rpartition(".")[2] in TEST_FILE_MODULES:
            supply_all()
        return None


def install_test_file_finder() -> None:
    if not any(isinstance(f, UpstreamTestFileFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, UpstreamTestFileFinder())


def pytest_configure(config) -> None:
    supply_all()
    config.stash[_SUPPLIED_KEY] = dict(SUPPLIED)


def pytest_report_header(config) -> list[str]:
    supplied = config.stash.get(_SUPPLIED_KEY, {})
    return [
        "upstream conformance plugin supplies: "
        + ", ".join(f"{m}.{n} (pytorch#{pr})" for (m, n), pr in sorted(supplied.items()))
    ]


try:
    import pytest

    _SUPPLIED_KEY = pytest.StashKey[dict]()
except ImportError:  # imported outside pytest (the plugin's own test)
    _SUPPLIED_KEY = None  # type: ignore[assignment]
