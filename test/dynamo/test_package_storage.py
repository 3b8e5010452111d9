# Owner(s): ["module: dynamo"]
"""Compile packages in object storage, and many processes sharing one package.

A prefix may be any fsspec URL: ``file://`` and ``s3://`` packages are saved by
one interpreter and loaded by a FRESH one under
torch.compiler.set_stance("fail_on_recompile"); ``s3://`` runs against a real
S3-compatible HTTP server (moto's server mode) this file starts on 127.0.0.1.
Local packages are loaded by several processes at once, while another one
replaces them, and saved by several processes at once.
"""

import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import unittest.mock
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._dynamo.exc import PackageError
from torch._dynamo.package_format import DYNAMO_FILE, GRAPH_PREFIX, MANIFEST
from torch.testing._internal.common_utils import slowTest
from torch.testing._internal.fresh_process import FreshProcess, reports, start_script, write_report


PACKAGE = "storage_pkg"
# Seconds for any one worker process.
WORKER_TIMEOUT_S = 180


def _f(x, w):
    return torch.sin(x @ w) + x.cos()


def _inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)


# ---------------------------------------------------------------------------
# Worker side: ``python test_package_storage.py --worker '{json}'``
# ---------------------------------------------------------------------------


def _wait_for(go_file):
    # Every concurrent loader has imported torch and compiled: load together.
    deadline = time.monotonic() + WORKER_TIMEOUT_S
    while go_file and not os.path.exists(go_file):
        if time.monotonic() > deadline:
            raise TimeoutError(go_file)
        time.sleep(0.01)


def _worker(args: dict) -> dict:
    compiled = torch.compile(_f, backend="aot_eager", package=PACKAGE)
    if args["phase"] == "save":
        compiled(*_inputs())
        compiled.save_package(prefix=args["prefix"])
        return {"saved": True}
    if args.get("ready"):
        Path(args["ready"]).touch()
    _wait_for(args.get("go"))
    started = time.perf_counter()
    try:
        compiled.load_package(prefix=args["prefix"])
    except PackageError as e:
        return {"error": str(e)}
    load_s = time.perf_counter() - started
    with torch.compiler.set_stance("fail_on_recompile"):
        out = compiled(*_inputs())
    torch.testing.assert_close(out, _f(*_inputs()))
    return {"hit": True, "load_s": load_s}


def _start_worker(env=None, **args) -> FreshProcess:
    return start_script(__file__, "--worker", json.dumps(args), env=env, timeout=WORKER_TIMEOUT_S)


def _run_worker(env=None, **args) -> dict:
    return _start_worker(env, **args).report()


# ---------------------------------------------------------------------------
# moto's S3 server, on the loopback address
# ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


class _MotoServer:
    def __init__(self) -> None:
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            # fsspec's configuration of the s3 protocol (s3fs's endpoint_url).
            "FSSPEC_S3_ENDPOINT_URL": self.endpoint,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("moto server did not start") from None
                time.sleep(0.1)

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(
            key="testing", secret="testing", client_kwargs={"endpoint_url": self.endpoint}
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# ---------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------


class _TmpDirTestCase(torch._dynamo.test_case.TestCase):
    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="test_package_storage_"))

    def tearDown(self):
        import shutil

        for dirpath, _, _ in os.walk(self.tmp):
            os.chmod(dirpath, 0o700)
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()


@unittest.skipUnless(_has("moto") and _has("s3fs"), "needs moto[server] and s3fs (pip install)")
class TestPackageS3(_TmpDirTestCase):
    """One package saved to s3:// by a worker process, for all the tests."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.server = _MotoServer()
        try:
            cls.server.filesystem().mkdir("packages")
            cls.prefix = "s3://packages/saved"
            _run_worker(cls.server.env, phase="save", prefix=cls.prefix)
        except BaseException:
            cls.server.stop()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()
        super().tearDownClass()

    def test_s3_save_in_one_process_load_in_another(self):
        fs = self.server.filesystem()
        names = sorted(p.rsplit(f"{PACKAGE}/", 1)[1] for p in fs.find(f"{self.prefix}/{PACKAGE}"))
        self.assertIn("manifest.json", names)
        self.assertTrue(any(n.startswith("graphs/") for n in names), names)
        # A private temp directory: the fetched copy is gone after the load.
        result = _run_worker({**self.server.env, "TMPDIR": str(self.tmp)}, phase="load", prefix=self.prefix)
        self.assertTrue(result["hit"])
        self.assertEqual(list(self.tmp.iterdir()), [])

    def _load_damaged(self, damage) -> str:
        """Load a copy of the saved package damaged by ``damage`` in this
        process; the PackageError's message. Nothing may be left in the temp dir."""
        import fsspec

        fs = self.server.filesystem()
        prefix = f"s3://packages/{self.id().rsplit('.', 1)[-1]}"
        fs.copy(f"{self.prefix}/{PACKAGE}", f"{prefix}/{PACKAGE}", recursive=True)
        graph = next(p for p in fs.find(f"{prefix}/{PACKAGE}") if "/graphs/" in p)
        damage(fs, graph)
        compiled = torch.compile(_f, backend="aot_eager", package=PACKAGE)
        s3_conf = {"key": "testing", "secret": "testing", "endpoint_url": self.server.endpoint}
        with unittest.mock.patch.dict(fsspec.config.conf, {"s3": s3_conf}), unittest.mock.patch.object(
            tempfile, "tempdir", str(self.tmp)
        ):
            fsspec.filesystem("s3", **s3_conf).invalidate_cache()
            with self.assertRaises(PackageError) as caught:
                compiled.load_package(prefix=prefix)
        self.assertEqual(list(self.tmp.iterdir()), [])
        self.assertEqual(compiled._package._loaded, [])
        return str(caught.exception)

    def test_s3_missing_object(self):
        message = self._load_damaged(lambda fs, path: fs.rm(path))
        self.assertIn("is missing graphs/", message)

    def test_s3_truncated_object(self):
        def truncate(fs, path):
            fs.pipe_file(path, fs.cat_file(path)[:100])

        message = self._load_damaged(truncate)
        self.assertIn("truncated", message)


class TestPackageURLs(_TmpDirTestCase):
    def test_file_url_save_and_load_in_fresh_processes(self):
        # A file:// prefix is the local directory it names: the save leaves a
        # whole package there (the files its manifest lists, with those
        # sha256s, and nothing else), which a fresh process then loads.
        prefix = f"file://{self.tmp}/store"
        _run_worker(phase="save", prefix=prefix)
        package = self.tmp / "store" / PACKAGE
        listed = json.loads((package / MANIFEST).read_text())["files"]
        self.assertIn(DYNAMO_FILE, listed)
        self.assertTrue(any(name.startswith(GRAPH_PREFIX) for name in listed), listed)
        on_disk = {str(p.relative_to(package)) for p in package.rglob("*") if p.is_file()}
        self.assertEqual(on_disk, {MANIFEST, *listed})
        for name, digest in listed.items():
            self.assertEqual(hashlib.sha256((package / name).read_bytes()).hexdigest(), digest, name)
        self.assertTrue(_run_worker(phase="load", prefix=prefix)["hit"])

    def test_memory_url_round_trip_and_missing_object(self):
        import fsspec

        compiled = torch.compile(_f, backend="aot_eager", package=PACKAGE)
        compiled(*_inputs())
        compiled.save_package(prefix="memory://roundtrip")
        fs = fsspec.filesystem("memory")
        self.assertTrue(fs.exists(f"/roundtrip/{PACKAGE}/manifest.json"))
        torch._dynamo.reset()
        fresh = torch.compile(_f, backend="aot_eager", package=PACKAGE)
        fresh.load_package(prefix="memory://roundtrip")
        with torch.compiler.set_stance("fail_on_recompile"):
            torch.testing.assert_close(fresh(*_inputs()), _f(*_inputs()))
        fs.rm(f"/roundtrip/{PACKAGE}/dynamo.bin")
        with self.assertRaisesRegex(PackageError, "is missing dynamo.bin"):
            torch.compile(_f, backend="aot_eager", package=PACKAGE).load_package(
                prefix="memory://roundtrip"
            )
        fs.rm("/roundtrip", recursive=True)

    def test_unknown_protocol_is_a_package_error(self):
        compiled = torch.compile(_f, backend="aot_eager", package=PACKAGE)
        with self.assertRaisesRegex(PackageError, "no fsspec filesystem"):
            compiled.load_package(prefix="nosuchprotocol://bucket")


class TestSharedPackages(_TmpDirTestCase):
    def _save(self) -> Path:
        _run_worker(phase="save", prefix=str(self.tmp))
        return self.tmp / PACKAGE

    @slowTest
    def test_concurrent_loaders_of_a_read_only_package_all_hit(self):
        package = self._save()
        # Loading writes nothing and locks nothing: a read-only package loads.
        for dirpath, _, filenames in os.walk(package):
            for name in filenames:
                os.chmod(os.path.join(dirpath, name), 0o400)
            os.chmod(dirpath, 0o500)
        go = self.tmp / "go"
        procs = [
            _start_worker(phase="load", prefix=str(self.tmp), go=str(go), ready=str(self.tmp / f"ready{i}"))
            for i in range(4)
        ]
        deadline = time.monotonic() + WORKER_TIMEOUT_S
        while not all((self.tmp / f"ready{i}").exists() for i in range(4)):
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        go.touch()
        results = reports(procs)
        self.assertTrue(all(r.get("hit") for r in results), results)

    def _package_files(self, version: int) -> tuple[dict, dict]:
        from torch._dynamo.package_artifacts import _environment, _sha256, overlay_series_hash

        if not hasattr(self, "_environment_fields"):
            # (the series hash is computed from the patches: once per test)
            self._environment_fields = {**_environment(), "overlay_series_hash": overlay_series_hash()}
        files = {
            "dynamo.bin": f"entries of version {version}".encode() * 1000,
            "graphs/g.bin": f"graph of version {version}".encode() * 5000,
        }
        manifest = {
            "format_version": 0,
            **self._environment_fields,
            "version": version,
            "files": {name: _sha256(data) for name, data in files.items()},
        }
        return files, manifest

    def test_concurrent_saves_leave_one_complete_package(self):
        from torch._dynamo.package_artifacts import _write_atomically
        from torch._dynamo.package_trust import read_package

        target = self.tmp / "shared" / "pkg"
        errors = []

        def save(version):
            try:
                for _ in range(5):
                    _write_atomically(target, *self._package_files(version))
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=save, args=(v,)) for v in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        self.assertEqual(errors, [])
        self.assertEqual(sorted(p.name for p in target.parent.iterdir()), ["pkg"])
        package = read_package(target)
        self.assertIn(package.manifest["version"], range(4))
        self.assertEqual(set(package.files), {"dynamo.bin", "graphs/g.bin"})

    def test_loaders_see_the_old_or_the_new_package_never_a_mix(self):
        from torch._dynamo.package_artifacts import _write_atomically
        from torch._dynamo.package_storage import read_consistently
        from torch._dynamo.package_trust import read_package

        target = self.tmp / "pkg"
        _write_atomically(target, *self._package_files(0))
        stop = threading.Event()
        errors = []

        saved = [0]

        def replace():
            while not stop.is_set():
                try:
                    _write_atomically(target, *self._package_files(saved[0] + 1))
                except Exception as e:
                    errors.append(e)
                    return
                saved[0] += 1

        saver = threading.Thread(target=replace)
        saver.start()
        seen = set()
        try:
            # 200 reads or more while the saver replaces the package 50 times
            # or more (at most 30 s).
            deadline, reads = time.monotonic() + 30, 0
            while (saved[0] < 50 or reads < 200) and time.monotonic() < deadline:
                reads += 1
                package = read_consistently(target, read_package)
                version = package.manifest["version"]
                seen.add(version)
                # Every file is the version the manifest names (sha256 checked).
                # (== on the bytes: torch's assertEqual compares them per item)
                self.assertTrue(package.files == self._package_files(version)[0], version)
        finally:
            stop.set()
            saver.join(timeout=60)
        self.assertEqual(errors, [])
        self.assertGreater(len(seen), 1, (saved, reads, seen))
        self.assertEqual(sorted(p.name for p in self.tmp.iterdir()), ["pkg"])


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        write_report(_worker(json.loads(sys.argv[2])))
    else:
        from torch._dynamo.test_case import run_tests

        run_tests()
