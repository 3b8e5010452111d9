# Owner(s): ["module: dynamo"]
"""Upstream's package API on the backport: DynamoStore, DynamoCache, PrecompileContext.

Code written for upstream saves with a store (``DiskDynamoStore().save_package``,
``DynamoCache.save``, ``PrecompileContext.save_to_dynamo_cache``) and loads with
``load_package`` + ``CompilePackage.install``. Each save here runs in one
interpreter and each load in a FRESH one with an empty inductor cache, under
``set_stance("fail_on_recompile")``; damaged artifacts and changed sources are
refused with typed errors.
"""

import os
import sys
import shutil
import tempfile
import textwrap
from pathlib import Path
from unittest import mock

import torch
import torch._dynamo.test_case
from torch._dynamo import convert_frame, package_store
from torch._dynamo.exc import PackageError
from torch._dynamo.package import (
    CompilePackage,
    DiskDynamoStore,
    InMemoryDynamoStore,
    SystemInfo,
)
from torch._dynamo.precompile_context import PackageGraphArtifact, PrecompileContext
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
    subtest,
)
from torch.testing._internal.fresh_process import run_code, run_script


# A module of its own, so that a fresh process finds the compiled functions by name.
CASE = '''
import torch

def add_one(x):
    return helper(x) + 1

def helper(x):
    return x.sin() * 2

def cos_plus(x):
    return x.cos() + x

def with_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return x.cos() + y
'''

RUNNER = r'''
import json, os, sys
import torch
from torch.testing._internal.fresh_process import write_report
sys.path.insert(0, os.path.dirname(sys.argv[3]))
import store_case as case
from torch._dynamo.package import CompilePackage, DiskDynamoStore, DynamoCache
from torch._dynamo.precompile_context import PrecompileContext

mode, backend, case_path = sys.argv[1:4]
prefix = os.path.dirname(case_path)
x = torch.arange(6.0).reshape(3, 2)
report = {}
if mode == "save-store":
    package = CompilePackage(case.add_one)
    compiled = torch._dynamo.optimize(backend, package=package)(case.add_one)
    report["out"] = compiled(x).tolist()
    DiskDynamoStore(prefix).save_package(package, "add_one")
elif mode == "load-store":
    package, backends = DiskDynamoStore(prefix).load_package(case.add_one, "add_one")
    compiled = torch._dynamo.optimize(package=package)(case.add_one)
    package.install(backends)
    with torch.compiler.set_stance("fail_on_recompile"):
        report["out"] = compiled(x).tolist()
elif mode == "save-break":
    recorded = []
    add_resume_function = CompilePackage.add_resume_function

    def spy(self, python_code, python_module, function_name):
        recorded.append([python_code.co_name, python_module, function_name])
        return add_resume_function(self, python_code, python_module, function_name)

    CompilePackage.add_resume_function = spy
    package = CompilePackage(case.with_break)
    compiled = torch._dynamo.optimize(backend, package=package)(case.with_break)
    report["out"] = compiled(x).tolist()
    report["recorded"] = recorded
    report["entry_globals"] = sorted(
        name for entry in package.entries for name, ref in entry.globals.items() if ref[0] == "resume"
    )
    DiskDynamoStore(prefix).save_package(package, "with_break")
elif mode == "load-break":
    package, backends = DiskDynamoStore(prefix).load_package(case.with_break, "with_break")
    compiled = torch._dynamo.optimize(package=package)(case.with_break)
    package.install(backends)
    frames = torch._dynamo.convert_frame.FRAME_COUNTER
    with torch.compiler.set_stance("fail_on_recompile"):
        report["out"] = compiled(x).tolist()
    report["frames_compiled"] = torch._dynamo.convert_frame.FRAME_COUNTER - frames
    report["function_names"] = sorted(
        name for code in package.cache_entry().codes for name in code.function_names
        if code.install_to_global
    )
elif mode == "save-cache":
    compiled = [torch.compile(f, backend=backend) for f in (case.add_one, case.cos_plus)]
    report["out"] = [c(x).tolist() for c in compiled]
    debug = PrecompileContext.save_to_dynamo_cache()
    report["dynamo"] = len(debug["dynamo"])
    report["backends"] = len(debug["backends"])
else:
    compiled = [torch.compile(f, backend=backend) for f in (case.add_one, case.cos_plus)]
    frames = torch._dynamo.convert_frame.FRAME_COUNTER
    with torch.compiler.set_stance("fail_on_recompile"):
        report["out"] = [c(x).tolist() for c in compiled]
    report["frames_compiled"] = torch._dynamo.convert_frame.FRAME_COUNTER - frames
write_report(report)
'''


def _fn(x):
    return x * 3 + 1


def _with_graph_break(x):
    y = x.sin()
    torch._dynamo.graph_break()
    return x.cos() + y


def _scaled(x):
    return (x * 2).sin()


def _scaled_twice(x):
    return _scaled(_scaled(x))


class TestPackageStores(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        PrecompileContext.clear()
        self.tmp = Path(tempfile.mkdtemp(prefix="package-stores-"))
        self.addCleanup(shutil.rmtree, self.tmp, True)
        (self.tmp / "store_case.py").write_text(CASE)
        (self.tmp / "runner.py").write_text(RUNNER)

    def tearDown(self):
        PrecompileContext.clear()
        super().tearDown()

    def _run(self, mode, backend, cache_dir, **extra_env):
        return run_script(
            self.tmp / "runner.py",
            mode,
            backend,
            self.tmp / "store_case.py",
            env={"TORCHINDUCTOR_CACHE_DIR": str(cache_dir), **extra_env},
            timeout=600,
        )

    @parametrize("backend", ["eager", subtest("inductor", decorators=[slowTest])])
    def test_disk_store_fresh_process(self, backend):
        # both processes' stores have the case file's folder as their prefix
        saved = self._run("save-store", backend, self.tmp / "cache-save")
        self.assertTrue((self.tmp / "add_one" / "manifest.json").is_file())
        loaded = self._run("load-store", backend, self.tmp / "cache-load")
        self.assertEqual(saved["out"], loaded["out"])

    def test_dynamo_cache_fresh_process(self):
        cache = self.tmp / "inductor-cache"
        saved = self._run("save-cache", "eager", cache, TORCH_CACHING_PRECOMPILE="1")
        # one Dynamo entry per compiled function, one backend per graph
        self.assertEqual((saved["dynamo"], saved["backends"]), (2, 2))
        loaded = self._run("load-cache", "eager", cache, TORCH_CACHING_PRECOMPILE="1")
        self.assertEqual(saved["out"], loaded["out"])
        self.assertEqual(loaded["frames_compiled"], 0)

    def test_in_memory_store_round_trip(self):
        store = InMemoryDynamoStore()
        package = CompilePackage(_fn)
        compiled = torch._dynamo.optimize("eager", package=package)(_fn)
        x = torch.randn(4)
        expected = compiled(x)
        store.save_package(package, "k")
        self.assertEqual(sorted(store.packages), ["k"])
        torch._dynamo.reset()
        loaded, backends = store.load_package(_fn, "k")
        self.assertEqual(set(backends), set(package.cached_backends))
        compiled = torch._dynamo.optimize(package=loaded)(_fn)
        # install() takes the entries as the store returned them: no dynamo.bin
        # is written and read back (NOTE: [One check per stage of a load]).
        with (
            mock.patch.object(package_store, "cache_entry_files", side_effect=AssertionError("dynamo.bin written")),
            mock.patch.object(package_store, "_read_entries", side_effect=AssertionError("dynamo.bin read")),
        ):
            loaded.install(backends)
        self.assertEqual(loaded.load_stats["entries"], 1)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(compiled(x), expected)
        loaded.uninstall()
        torch._dynamo.reset()
        with torch.compiler.set_stance("fail_on_recompile"):
            with self.assertRaisesRegex(RuntimeError, "Detected recompile"):
                compiled(x)
        with self.assertRaisesRegex(RuntimeError, "No package found with key nope"):
            store.read("nope")

    def test_damaged_backend_artifact_is_refused(self):
        store = InMemoryDynamoStore()
        package = CompilePackage(_fn)
        torch._dynamo.optimize("eager", package=package)(_fn)(torch.randn(2))
        store.save_package(package, "k")
        entry = store.read("k")
        (backend_id,) = entry.backends
        self.assertIsInstance(entry.backends[backend_id], PackageGraphArtifact)
        entry.backends[backend_id].edit_contents(lambda data: data[: len(data) // 2])
        torch._dynamo.reset()
        loaded, backends = store.load_package(_fn, "k")
        with self.assertRaises(PackageError):
            loaded.install(backends)

    def test_missing_backend_is_refused_at_save(self):
        package = CompilePackage(_fn)
        torch._dynamo.optimize("eager", package=package)(_fn)(torch.randn(2))
        entry = package.cache_entry()
        PrecompileContext.clear()
        with self.assertRaisesRegex(RuntimeError, "is not found in the given backends"):
            DiskDynamoStore(str(self.tmp)).save_cache_entry(entry, "k")

    def test_changed_inlined_source_is_refused(self):
        module_path = self.tmp / "changing_module.py"
        module_path.write_text("def helper(x):\n    return x + 1\n")
        sys.path.insert(0, str(self.tmp))
        self.addCleanup(sys.path.remove, str(self.tmp))
        self.addCleanup(sys.modules.pop, "changing_module", None)
        import changing_module

        def fn(x):
            return changing_module.helper(x) * 2

        package = CompilePackage(fn)
        torch._dynamo.optimize("eager", package=package)(fn)(torch.randn(2))
        store = DiskDynamoStore(str(self.tmp / "store"))
        store.save_package(package, "fn")
        module_path.write_text("def helper(x):\n    return x - 1\n")
        with self.assertRaisesRegex(RuntimeError, r"Source code changes detected for changing_module \(line 1 - line 2\)"):
            store.load_package(fn, "fn")
        module_path.write_text("def helper(x):\n    return x + 1\n")
        store.load_package(fn, "fn")

    def _compile_with_graph_break(self, x):
        """_with_graph_break compiled under a package: two codes (the function
        and the resume function after its graph break), one graph each."""
        package = CompilePackage(_with_graph_break)
        compiled = torch._dynamo.optimize("eager", package=package)(_with_graph_break)
        return package, compiled(x)

    def test_loaded_codes_count_as_compiled_frames(self):
        # as upstream's install: every code a package holds is a frame, so a
        # load leaves convert_frame.FRAME_COUNTER where the compile left it
        store = InMemoryDynamoStore()
        x = torch.randn(3)
        package, expected = self._compile_with_graph_break(x)
        compiled_frames = convert_frame.FRAME_COUNTER
        self.assertEqual(compiled_frames, 2)
        store.save_package(package, "k")
        torch._dynamo.reset()
        self.assertEqual(convert_frame.FRAME_COUNTER, 0)
        loaded, backends = store.load_package(_with_graph_break, "k")
        compiled = torch._dynamo.optimize(package=loaded)(_with_graph_break)
        loaded.install(backends)
        self.assertEqual(convert_frame.FRAME_COUNTER, compiled_frames)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(compiled(x), expected)
        self.assertEqual(convert_frame.FRAME_COUNTER, compiled_frames)

    def test_reset_uninstalls_installed_packages(self):
        # torch._dynamo.reset() is a fresh process: what a package installed
        # before it no longer serves any compiled callable
        store = InMemoryDynamoStore()
        x = torch.randn(4)
        package = CompilePackage(_fn)
        torch._dynamo.optimize("eager", package=package)(_fn)(x)
        store.save_package(package, "k")
        torch._dynamo.reset()
        loaded, backends = store.load_package(_fn, "k")
        loaded.install(backends)
        other = torch._dynamo.optimize("eager", package=CompilePackage(_fn))(_fn)
        with torch.compiler.set_stance("fail_on_recompile"):
            self.assertEqual(other(x), _fn(x))
        torch._dynamo.reset()
        with torch.compiler.set_stance("fail_on_recompile"):
            with self.assertRaisesRegex(RuntimeError, "Detected recompile"):
                other(x)

    @torch._dynamo.config.patch(caching_precompile=True)
    def test_caching_entry_is_recorded_at_compile_time(self):
        # upstream's test_graph_break_partial_backend: the entry and its
        # backends are in the PrecompileContext once the frames compiled, and a
        # code whose backend is gone at save is saved bypassed: a fresh load
        # compiles that code alone again
        x = torch.randn(3)
        with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "cache")}):
            expected = torch.compile(_with_graph_break, backend="eager")(x)
            compiled_frames = convert_frame.FRAME_COUNTER
            (entry,) = PrecompileContext._dynamo_cache_entries.values()
            main, resume = sorted(entry.codes, key=lambda code: code.code_key[0])
            self.assertEqual(
                (main.code_key[0], main.python_module, main.function_names, main.install_to_global),
                ("function", __name__, [], False),
            )
            self.assertEqual((resume.code_key[0], resume.install_to_global), ("resume", True))
            self.assertEqual(len(resume.backend_ids), 1)
            for name in resume.function_names:
                self.assertIn(name, globals())
            self.assertEqual(set(PrecompileContext._backend_artifacts_by_key), entry.backend_ids)
            del PrecompileContext._backend_artifacts_by_key[resume.backend_ids[0]]
            debug = PrecompileContext.save_to_dynamo_cache()
            self.assertEqual((len(debug["dynamo"]), len(debug["backends"])), (1, 1))
            torch._dynamo.reset()
            PrecompileContext.clear()
            compiled = torch.compile(_with_graph_break, backend="eager")
            # both codes were compiled by the process that saved
            self.assertEqual(convert_frame.FRAME_COUNTER, compiled_frames)
            with torch.compiler.set_stance("fail_on_recompile"):
                with self.assertRaisesRegex(RuntimeError, "function name: 'torch_dynamo_resume_in"):
                    compiled(x)
            self.assertEqual(compiled(x), expected)
            self.assertEqual(convert_frame.FRAME_COUNTER, compiled_frames + 1)

    @parametrize("backend", ["eager", "inductor"])
    @torch._dynamo.config.patch(caching_precompile=True)
    def test_graph_artifact_kinds(self, backend):
        # upstream's test_editable (which needs a GPU there): an Inductor graph
        # is recorded as a BundledAOTAutogradCacheArtifact, edits reach it,
        # and the cache entry carries it
        from torch._functorch._aot_autograd.autograd_cache import BundledAOTAutogradCacheArtifact

        with mock.patch.dict(os.environ, {"TORCHINDUCTOR_CACHE_DIR": str(self.tmp / "cache")}):
            torch.compile(_scaled, backend=backend)(torch.randn(3, requires_grad=True)).sum().backward()
            (key,) = PrecompileContext._backend_artifacts_by_key
            bundled = backend == "inductor"
            self.assertEqual(
                isinstance(PrecompileContext.serialize_artifact_by_key(key), BundledAOTAutogradCacheArtifact),
                bundled,
            )
            PrecompileContext.edit_artifact(key, lambda content: content)
            entries, _ = PrecompileContext.create_cache_entries()
            (entry,) = entries.values()
            (artifact,) = entry.backends.values()
            self.assertIsInstance(artifact, PackageGraphArtifact)
            self.assertEqual(isinstance(artifact, BundledAOTAutogradCacheArtifact), bundled)
            self.assertIsInstance(artifact.content, bytes)

    @parametrize("backend", ["eager", "aot_eager"])
    def test_add_resume_function_fresh_process(self, backend):
        saved = self._run("save-break", backend, self.tmp / "cache-save")
        # The graph break's resume function is recorded through
        # add_resume_function, into the entry of the frame that calls it.
        self.assertEqual(len(saved["recorded"]), 1)
        resume_code, module, name = saved["recorded"][0]
        self.assertTrue(resume_code.startswith("torch_dynamo_resume_in_with_break"), resume_code)
        self.assertEqual(module, "store_case")
        self.assertTrue(name.startswith("__resume_at_"), name)
        self.assertEqual(saved["entry_globals"], [name])
        loaded = self._run("load-break", backend, self.tmp / "cache-load")
        self.assertEqual(loaded["out"], saved["out"])
        self.assertEqual(loaded["frames_compiled"], 0)
        self.assertEqual(loaded["function_names"], [name])

    def test_add_import_source_and_resume_function_record_the_current_entry(self):
        from torch._dynamo.package_artifacts import dump_code

        package = CompilePackage(_fn)
        with self.assertRaisesRegex(AssertionError, "_current_entry is not set"):
            package.add_import_source("__import_math", "math")
        resume_code = _scaled.__code__
        with package.code_context(_fn.__code__):
            package.add_import_source("__import_math", "math")
            package.add_resume_function(resume_code, __name__, "__resume_at_4_1")
            package.add_inlined_source([resume_code, _scaled_twice.__code__])
            package.record_compile(_fn.__code__, _fn.__code__, b"guards", globals())
        (entry,) = package.entries
        self.assertEqual(
            entry.globals,
            {
                "__import_math": ("module", "math"),
                "__resume_at_4_1": ("resume", "_scaled", dump_code(resume_code)),
            },
        )
        # A resume function is never an inlined source.
        inlined = {source.firstlineno for source in package.source_info.inlined_sources}
        self.assertEqual(inlined, {_scaled_twice.__code__.co_firstlineno})
        # The next code's entry starts empty.
        with package.code_context(_scaled.__code__):
            package.record_compile(_scaled.__code__, _scaled.__code__, b"guards", globals())
        self.assertEqual(package.entries[1].globals, {})

    def test_resume_function_of_another_module_leaves_the_entry_out(self):
        package = CompilePackage(_fn)
        with package.code_context(_fn.__code__):
            package.add_resume_function(_scaled.__code__, "some.other_module", "__resume_at_4_1")
            with self.assertWarnsRegex(UserWarning, "is a global of module 'some.other_module'"):
                package.record_compile(_fn.__code__, _fn.__code__, b"guards", globals())
        self.assertEqual(package.entries, [])

    def test_system_info_checks(self):
        current = SystemInfo.current()
        current.check_compatibility(SystemInfo.current())
        other = SystemInfo("2.0.0", current.torch_version, None, None)
        with self.assertRaisesRegex(RuntimeError, "created with a different Python version: 2.0.0"):
            other.check_compatibility(current)
        other = SystemInfo(current.python_version, "1.0", None, None)
        with self.assertRaisesRegex(RuntimeError, "created with a different PyTorch version: 1.0"):
            other.check_compatibility(current)

    def test_split_modules_serve_one_set_of_names(self):
        # package_store.py builds on package.py, which serves its store names;
        # imported first, in a fresh interpreter, it gives package.py the same
        # objects. A saved package names the DDP split graph's classes by
        # torch._dynamo.package (NOTE: [Split graph classes keep their module]).
        report = run_code(
            textwrap.dedent(
                """
                import pickle
                import torch._dynamo.package_store as store
                import torch._dynamo.package as package
                from torch.testing._internal.fresh_process import write_report

                names = ("DiskDynamoStore", "DiskDynamoCache", "DynamoCache", "cache_dir", "_BuiltinsOnlyUnpickler")
                piece = pickle.dumps(package._DDPSplitPiece(True), protocol=0)
                write_report({
                    "same": [getattr(package, name) is getattr(store, name) for name in names],
                    "modules": [package._DDPSplitPiece.__module__, package._DDPSplitGraph.__module__],
                    "piece_named_by_package": b"torch._dynamo.package\\n_DDPSplitPiece" in piece,
                })
                """
            )
        )
        self.assertEqual(report["same"], [True] * 5)
        self.assertEqual(report["modules"], ["torch._dynamo.package"] * 2)
        self.assertTrue(report["piece_named_by_package"])


instantiate_parametrized_tests(TestPackageStores)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
