# Owner(s): ["module: dynamo"]
"""Signed compile packages (torch/_dynamo/package_trust.py): signing at save,
verification before anything is read at load, package_require_signature, the
sign / verify / inspect command line, and the checks that hold for unsigned
packages (confined names and reads, kernel headers, the graph allow-list, the
manifest schema). Loads run in fresh processes."""

import base64
import hashlib
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch._dynamo.test_case
from torch._dynamo.exc import PackageError
from torch._dynamo.package_format import SIGNATURE_FILE
from torch._dynamo.package_trust import (
    allowed_global,
    check_kernel_binary,
    check_manifest_schema,
    check_name,
    kernel_copies_dir,
    load_graph_pickle,
    parse_manifest,
    read_confined,
    remove_kernel_copies,
    remove_orphaned_kernel_copies,
)
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
)
from torch.testing._internal.fresh_process import run_code


MODEL = """
import torch


def f(x, y):
    return torch.sin(x) + y * 2
"""

SAVE = """
import sys
import torch

out, key = sys.argv[1], sys.argv[2]
sys.path.insert(0, out)
import trust_model

x = torch.arange(6.0)
for name, signing_key in (("unsigned", None), ("signed", key)):
    with torch._dynamo.config.patch(package_signing_key=signing_key):
        torch._dynamo.reset()
        compiled = torch.compile(trust_model.f, backend="eager", package=f"{out}/{name}")
        compiled(x, x)
        compiled.save_package()
        with torch._dynamo.config.patch(enable_aot_compile=True):
            fn = torch.compile(trust_model.f, fullgraph=True, backend="eager").aot_compile(((x, x), {}))
            fn.save_compiled_function(f"{out}/{name}.pt")
from torch.testing._internal.fresh_process import write_report
write_report("saved")
"""

# One fresh process loads every case of a test: each with its own config, after
# torch._dynamo.reset(); a case reports its result or its error's type.
LOAD = """
import json
import sys
import torch
from torch.testing._internal.fresh_process import write_report

out = sys.argv[1]
sys.path.insert(0, out)
import trust_model

x = torch.arange(6.0)
expected = trust_model.f(x, x)
reports = []
for case in json.loads(sys.argv[2]):
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(**case["config"]):
            if case["path"].endswith(".pt"):
                loaded = torch.compiler.load_compiled_function(case["path"])
                result = loaded(x, x)
            else:
                compiled = torch.compile(trust_model.f, backend="eager", package=case["path"])
                compiled.load_package()
                with torch.compiler.set_stance("fail_on_recompile"):
                    result = compiled(x, x)
        reports.append({"ok": bool(torch.equal(result, expected))})
    except Exception as e:
        reports.append({"error": type(e).__name__, "message": str(e)[:500]})
write_report(reports)
"""

# Saves and loads without signatures (trusted keys configured, none required):
# which cryptography modules the process has imported then.
UNSIGNED_ONLY = """
import sys
import torch

out, public = sys.argv[1], sys.argv[2]
sys.path.insert(0, out)
import trust_model

x = torch.arange(6.0)
expected = trust_model.f(x, x)
compiled = torch.compile(trust_model.f, backend="eager", package=f"{out}/unsigned-again")
compiled(x, x)
compiled.save_package()
with torch._dynamo.config.patch(package_trusted_keys=[public], package_require_signature=False):
    for path in (f"{out}/unsigned", f"{out}/unsigned-again"):
        torch._dynamo.reset()
        loaded = torch.compile(trust_model.f, backend="eager", package=path)
        loaded.load_package()
        with torch.compiler.set_stance("fail_on_recompile"):
            assert torch.equal(loaded(x, x), expected)
    assert torch.equal(torch.compiler.load_compiled_function(f"{out}/unsigned.pt")(x, x), expected)
imported = sorted(m for m in sys.modules if m.partition(".")[0] == "cryptography")
from torch.testing._internal.fresh_process import write_report
write_report(imported)
"""


def _write_keys(directory: Path, name: str) -> tuple[str, str]:
    from torch._dynamo.package_trust import write_key_pair

    private, public = directory / f"{name}.pem", directory / f"{name}.pub.pem"
    write_key_pair(private, public)
    return str(private), str(public)


def _fix_sha256(package: Path, name: str) -> None:
    """Recompute ``name``'s sha256 in the manifest (what an attacker would do)."""
    manifest = json.loads((package / "manifest.json").read_text())
    manifest["files"][name] = hashlib.sha256((package / name).read_bytes()).hexdigest()
    (package / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))


class _Marker:
    """A hostile pickle: unpickling it creates a file (it must never run)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


class PackageTrustTests(torch._dynamo.test_case.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="package-trust-"))
        cls.key, cls.public = _write_keys(cls.root, "signer")
        cls.other_key, cls.other_public = _write_keys(cls.root, "other")
        (cls.root / "trust_model.py").write_text(MODEL)
        run_code(
            SAVE,
            cls.root,
            cls.key,
            cwd=cls.root,
            env={"TORCHINDUCTOR_CACHE_DIR": str(cls.root / "save-cache")},
        )

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.root, ignore_errors=True)
        super().tearDownClass()

    def copy(self, name: str) -> Path:
        target = Path(tempfile.mkdtemp(dir=self.root)) / name
        source = self.root / name
        if source.is_dir():
            shutil.copytree(source, target)
        else:
            shutil.copyfile(source, target)
        return target

    def load(self, cases: list[tuple[Path, dict]]) -> list[dict]:
        payload = json.dumps([{"path": str(p), "config": c} for p, c in cases])
        return run_code(
            LOAD, self.root, payload, cwd=self.root, timeout=300, fresh_inductor_cache=True
        )

    def trusted(self, *keys, require=True) -> dict:
        return {"package_trusted_keys": list(keys), "package_require_signature": require}

    def test_signature_files_are_written(self):
        self.assertTrue((self.root / "signed" / "manifest.json.sig").is_file())
        self.assertFalse((self.root / "unsigned" / "manifest.json.sig").exists())
        import zipfile

        with zipfile.ZipFile(self.root / "signed.pt") as archive:
            self.assertIn("manifest.json.sig", archive.namelist())
        record = json.loads((self.root / "signed" / "manifest.json.sig").read_bytes())
        self.assertEqual(record["algorithm"], "ed25519")
        self.assertEqual(len(base64.b64decode(record["signature"])), 64)

    def test_sign_verify_require(self):
        marker = self.root / "marker-require"
        hostile = self.copy("unsigned")
        graph = next((hostile / "graphs").iterdir())
        graph.write_bytes(pickle.dumps({"backend": "eager", "gm": _Marker(str(marker))}))
        _fix_sha256(hostile, f"graphs/{graph.name}")
        tampered = self.copy("signed")
        manifest = json.loads((tampered / "manifest.json").read_text())
        manifest["entries"] += 0
        manifest["compile_options"]["dynamic"] = "True"
        (tampered / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
        reports = self.load(
            [
                (self.root / "signed", self.trusted(self.public)),
                (self.root / "signed.pt", self.trusted(self.public)),
                (self.root / "signed", self.trusted(self.other_public, self.public)),
                (self.root / "unsigned", self.trusted(self.public)),
                (self.root / "unsigned.pt", self.trusted(self.public)),
                (hostile, self.trusted(self.public)),
                (self.root / "signed", self.trusted(self.other_public)),
                (self.root / "signed.pt", self.trusted(self.other_public)),
                (tampered, self.trusted(self.public)),
                (self.root / "signed", self.trusted(require=True)),
                # Not required: unsigned loads; a signature that does not verify
                # against configured keys is still refused.
                (self.root / "unsigned", self.trusted(self.public, require=False)),
                (self.root / "signed", self.trusted(self.other_public, require=False)),
                (self.root / "signed", self.trusted(require=False)),
            ]
        )
        ok = {"ok": True}
        self.assertEqual(reports[:3], [ok, ok, ok])
        for report in reports[3:10]:
            self.assertEqual(report.get("error"), "PackageSignatureError", report)
        self.assertIn("not signed", reports[3]["message"])
        self.assertIn("does not verify", reports[6]["message"])
        self.assertIn("does not verify", reports[8]["message"])
        self.assertIn("no package_trusted_keys", reports[9]["message"])
        self.assertEqual(reports[10], ok)
        self.assertEqual(reports[11].get("error"), "PackageSignatureError")
        self.assertEqual(reports[12], ok)
        self.assertFalse(marker.exists())

    def test_unsigned_packages_do_not_import_cryptography(self):
        # NOTE: [Ed25519 through cryptography]: only a signature imports it.
        unset = {k: None for k in os.environ if k.startswith("TORCH_COMPILE_PACKAGE_")}
        imported = run_code(
            UNSIGNED_ONLY,
            self.root,
            self.public,
            cwd=self.root,
            timeout=300,
            env=unset,
            fresh_inductor_cache=True,
        )
        self.assertEqual(imported, [])

    def test_tampered_file_with_fixed_sha256(self):
        # A graph changed after signing, its sha256 fixed in the manifest: the
        # manifest no longer matches its signature.
        tampered = self.copy("signed")
        graph = next((tampered / "graphs").iterdir())
        graph.write_bytes(graph.read_bytes() + b"\0")
        _fix_sha256(tampered, f"graphs/{graph.name}")
        # Unsigned, the same change is caught by the restricted reader (typed).
        plain = self.copy("unsigned")
        graph = next((plain / "graphs").iterdir())
        graph.write_bytes(graph.read_bytes()[:-3])
        _fix_sha256(plain, f"graphs/{graph.name}")
        reports = self.load([(tampered, self.trusted(self.public)), (plain, {})])
        self.assertEqual(reports[0]["error"], "PackageSignatureError")
        self.assertEqual(reports[1]["error"], "PackageError")

    def cli(self, *args, module="torch._dynamo.package_trust", **env):
        return subprocess.run(
            [sys.executable, "-m", module, *args],
            capture_output=True,
            text=True,
            cwd=self.root,
            env={**os.environ, **env},
        )

    def test_cli_sign_verify_inspect(self):
        package, archive = self.copy("unsigned"), self.copy("unsigned.pt")
        for path in (package, archive):
            proc = self.cli("sign", str(path), "--key", self.key)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("signed", proc.stdout)
            proc = self.cli("verify", str(path), "--trusted-key", self.public)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("verified", proc.stdout)
            proc = self.cli("verify", str(path), "--trusted-key", self.other_public)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("does not verify", proc.stderr)
        proc = self.cli("inspect", str(package), TORCH_COMPILE_PACKAGE_TRUSTED_KEYS=self.public)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        for expected in ("signer: ed25519:", "torch_version", "dynamo.bin", "guard", "kernels: 0", "function"):
            self.assertIn(expected, proc.stdout)
        proc = self.cli("inspect", "--json", str(archive))
        info = json.loads(proc.stdout)
        self.assertTrue(info["signed"])
        self.assertIsNone(info["signer_verified"])
        self.assertEqual(len(info["entries"]), 1)
        # Each guard is "<source>: <guard type>", the type spelled as refusals
        # and guard_filter_fn spell it.
        guards = info["entries"][0]["guards"]
        self.assertIn("L['x']: TENSOR_MATCH", guards)
        # The package was saved from f(x, x).
        self.assertIn("L['y']: DUPLICATE_INPUT", guards)
        self.assertIn("G['torch'].sin: FUNCTION_MATCH", guards)
        # The signed copies load with the signature required.
        reports = self.load([(package, self.trusted(self.public)), (archive, self.trusted(self.public))])
        self.assertEqual(reports, [{"ok": True}, {"ok": True}])

    @slowTest
    def test_cli_keygen_makes_a_key_pair_that_signs_and_verifies(self):
        key = self.root / "keygen-test.pem"
        proc = self.cli("keygen", str(key))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(key.stat().st_mode & 0o777, 0o600)
        # Never overwrites a key.
        proc = self.cli("keygen", str(key))
        self.assertEqual(proc.returncode, 1)
        self.assertIn("never overwrites", proc.stderr)
        package = self.copy("unsigned")
        proc = self.cli("sign", str(package), "--key", str(key))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = self.cli("verify", str(package), "--trusted-key", f"{key}.pub")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = self.cli("verify", str(package), "--trusted-key", self.public)
        self.assertEqual(proc.returncode, 1)


class PackageTrustUnitTests(torch._dynamo.test_case.TestCase):
    @parametrize(
        "name",
        ["graphs/../../../x", "/etc/hostname", "a\0b", "", "graphs//x", "./dynamo.bin", "x" * 300, "a\\b", "a/b/c/d/e", 5],
    )
    def test_bad_names(self, name):
        with self.assertRaises(PackageError):
            check_name(name, "<test>")

    def test_confined_reads(self):
        root = Path(tempfile.mkdtemp())
        self.addCleanup(shutil.rmtree, root, True)
        (root / "graphs").mkdir()
        (root / "graphs" / "ok.bin").write_bytes(b"data")
        (root / "outside").write_bytes(b"secret")
        os.symlink(root / "outside", root / "graphs" / "link.bin")
        os.symlink(root / "graphs", root / "dirlink")
        os.mkfifo(root / "graphs" / "fifo.bin")
        self.assertEqual(read_confined(root, "graphs/ok.bin", "<test>"), b"data")
        for name in ("graphs/link.bin", "dirlink/ok.bin", "graphs/fifo.bin", "graphs", "graphs/missing.bin"):
            with self.assertRaises(PackageError, msg=name):
                read_confined(root, name, "<test>")

    def test_kernel_headers(self):
        import torch._C as c_module

        data = Path(c_module.__file__).read_bytes()
        check_kernel_binary(data, "kernels/x.so", "<test>")
        for bad in (data[: len(data) // 2], data[:100], b"\x7fELF" + b"\0" * 100, b"MZ" + data[2:], data[:4] + b"\1" + data[5:]):
            with self.assertRaises(PackageError):
                check_kernel_binary(bad, "kernels/x.so", "<test>")

    def test_graph_allow_list(self):
        for module, name in (("os", "system"), ("builtins", "eval"), ("builtins", "getattr"), ("torch", "load"),
                             ("torch.storage", "_load_from_bytes"), ("subprocess", "Popen"), ("builtins", "__import__"),
                             ("torch.fx.graph_module", "__builtins__"), ("torch", "ops")):
            self.assertIsNone(allowed_global(module, name), (module, name))
        self.assertIs(allowed_global("torch", "float32"), torch.float32)
        self.assertIs(allowed_global("torch._utils", "_rebuild_tensor_v2"), torch._utils._rebuild_tensor_v2)
        with self.assertRaises(PackageError):
            load_graph_pickle(pickle.dumps(_Marker("/nonexistent/marker")), "<test>")
        with self.assertRaises(PackageError):
            load_graph_pickle(b"\x80\x04garbage", "<test>")
        from torch._dynamo.package_artifacts import _deserialize_custom_graph

        marker = Path(tempfile.mkdtemp()) / "marker"
        for callable_class in (("torch._dynamo.aot_compile_types", "GraphModuleSerializableCallable"),
                               ("os", "system"), ("subprocess", "Popen"), ("this", "x")):
            payload = {"backend": "custom:x", "callable_class": callable_class,
                       "artifacts": pickle.dumps(_Marker(str(marker)))}
            with self.assertRaises(PackageError):
                _deserialize_custom_graph(payload, "g")
        self.assertFalse(marker.exists())
        self.assertNotIn("this", sys.modules)

    @parametrize("device", ["xyz", "", "__class__", "cpu,", "cuda.is_available"])
    def test_manifest_device_values(self, device):
        with self.assertRaises(PackageError):
            check_manifest_schema({"format_version": 3, "device": device, "files": {}}, "<test>")

    def test_manifest_types_and_nesting(self):
        for manifest in ({"device": 5}, {"files": []}, {"files": {"../x": "0" * 64}}, {"files": {"a": "zz"}},
                         {"frozen": "yes"}, {"entries": True}, {"aot_compile": {"module": 1}}, []):
            with self.assertRaises(PackageError, msg=repr(manifest)):
                check_manifest_schema(manifest, "<test>")
        with self.assertRaises(PackageError):
            parse_manifest(b"[" * 100000 + b"]" * 100000, "<test>")
        with self.assertRaises(PackageError):
            parse_manifest(b"{not json", "<test>")


# RFC 8032 section 7.1, TEST 1 and TEST 2: (private key, public key, message, signature).
RFC8032_VECTORS = [
    (
        "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
        "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
        "",
        "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    ),
    (
        "4ccd089b28ff96da9db6c346ec114e0f5b8a319f35aba624da8cf6ed4fb8a6fb",
        "3d4017c3e843895a92b70aa74d1b7ebc9c982ccf2ec4968cc0cd55f12af4660c",
        "72",
        "92a009a9f0d4cab8720e820b5f642540a2b27b5416503f8fb3762223ebdb69da085ac1e43e15996e458f3613d0f11d8c387b2eaeb4302aeeb00d291612bb0c00",
    ),
]


def _pem(label: str, der: bytes) -> bytes:
    body = base64.b64encode(der)
    lines = [body[i : i + 64] for i in range(0, len(body), 64)]
    return b"\n".join([f"-----BEGIN {label}-----".encode(), *lines, f"-----END {label}-----".encode(), b""])


class KernelCopiesTests(torch._dynamo.test_case.TestCase):
    """NOTE: [Kernel copies are removed at exit]: what a process that ended
    without exit hooks left is removed; what a live process holds is not."""

    def setUp(self):
        super().setUp()
        self.tmp = Path(tempfile.mkdtemp(prefix="kernel-copies-test-"))
        self.old_tempdir, tempfile.tempdir = tempfile.tempdir, str(self.tmp)

    def tearDown(self):
        tempfile.tempdir = self.old_tempdir
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def test_only_copies_no_live_process_holds_are_removed(self):
        import fcntl

        ours = kernel_copies_dir("torch_package_kernels_")
        (ours / "k.so").write_bytes(b"kernel")
        # A copy another live process holds: its lock file is locked by another
        # open file description (flock locks of two descriptions conflict as
        # those of two processes do).
        other = self.tmp / "torch_package_ddp_kernels_live"
        other.mkdir()
        (other / ".owner.lock").write_bytes(b"")
        held = os.open(other / ".owner.lock", os.O_RDONLY)
        fcntl.flock(held, fcntl.LOCK_EX)
        # What a killed process left: its lock file, unlocked.
        orphans = [self.tmp / "torch_package_kernels_dead1", self.tmp / "torch_bundled_graph_kernels_dead2"]
        for orphan in orphans:
            orphan.mkdir()
            (orphan / ".owner.lock").write_bytes(b"")
            (orphan / "k.so").write_bytes(b"kernel")
        # Left alone: a directory being made (no lock file yet), and other names.
        unlocked = self.tmp / "torch_package_kernels_being_made"
        unlocked.mkdir()
        (self.tmp / "torch_other_dir").mkdir()
        (self.tmp / "torch_other_dir" / ".owner.lock").write_bytes(b"")

        removed = remove_orphaned_kernel_copies(self.tmp)
        self.assertEqual(sorted(removed), sorted(o.name for o in orphans))
        self.assertEqual(
            sorted(p.name for p in self.tmp.iterdir()),
            sorted([ours.name, other.name, unlocked.name, "torch_other_dir"]),
        )
        self.assertEqual((ours / "k.so").read_bytes(), b"kernel")
        remove_kernel_copies(ours)
        self.assertFalse(ours.exists())
        # Once "the other process" is gone, its copies are an orphan's.
        os.close(held)
        self.assertEqual(remove_orphaned_kernel_copies(self.tmp), [other.name])

    def test_without_flock_the_copies_are_made_unlocked(self):
        import fcntl
        import unittest.mock

        def no_flock(fd, operation):
            raise OSError(38, "Function not implemented")

        with unittest.mock.patch.object(fcntl, "flock", no_flock):
            copies = kernel_copies_dir("torch_package_kernels_")
        self.assertEqual(list(copies.iterdir()), [])  # no lock file, half-made or named
        # Not an orphan to another process (no lock file), and removed as usual.
        self.assertEqual(remove_orphaned_kernel_copies(self.tmp), [])
        remove_kernel_copies(copies)
        self.assertFalse(copies.exists())

    def test_a_load_removes_what_a_killed_process_left(self):
        code = (
            "import os, tempfile, sys\n"
            "tempfile.tempdir = sys.argv[1]\n"
            "from torch._dynamo.package_trust import kernel_copies_dir\n"
            "d = kernel_copies_dir('torch_package_kernels_')\n"
            "(d / 'k.so').write_bytes(b'kernel')\n"
            "print(d.name, flush=True)\n"
            "os._exit(0)\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "TMPDIR"}
        left = subprocess.run(
            [sys.executable, "-c", code, str(self.tmp)], env=env, check=True, capture_output=True, text=True
        ).stdout.split()[-1]
        self.assertTrue((self.tmp / left / "k.so").exists())  # os._exit ran no exit hook
        self.assertEqual(remove_orphaned_kernel_copies(self.tmp), [left])
        self.assertEqual(list(self.tmp.iterdir()), [])


class Ed25519Tests(torch._dynamo.test_case.TestCase):
    """NOTE: [Ed25519 through cryptography]: signing keys, signatures and their
    verification."""

    def setUp(self):
        super().setUp()
        from torch._dynamo import package_trust

        self.trust = package_trust
        self.tmp = tempfile.mkdtemp(prefix="ed25519-test-")
        package_trust.write_key_pair(f"{self.tmp}/key", f"{self.tmp}/key.pub")
        self.private = package_trust.load_private_key(f"{self.tmp}/key")
        self.public = package_trust.load_public_key(f"{self.tmp}/key.pub")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)
        super().tearDown()

    def test_rfc8032_vectors(self):
        # Ed25519 is deterministic: these bytes are what any build, this one or
        # one before it, writes for these keys, so its packages keep verifying.
        for i, (private, public, message, signature) in enumerate(RFC8032_VECTORS):
            key, pub = f"{self.tmp}/rfc{i}", f"{self.tmp}/rfc{i}.pub"
            Path(key).write_bytes(_pem("PRIVATE KEY", self.trust._PKCS8_ED25519_PREFIX + bytes.fromhex(private)))
            Path(pub).write_bytes(_pem("PUBLIC KEY", self.trust._SPKI_ED25519_PREFIX + bytes.fromhex(public)))
            record = self.trust.sign_manifest(bytes.fromhex(message), key)
            self.assertEqual(base64.b64decode(json.loads(record)["signature"]).hex(), signature)
            self.assertEqual(self._fingerprint(record), self.trust.key_fingerprint(bytes.fromhex(public)))
            signer = self.trust.verify_manifest(bytes.fromhex(message), record, "<test>", trusted=[pub], require=True)
            self.assertEqual(signer, self.trust.key_fingerprint(bytes.fromhex(public)))

    def test_sign_and_verify(self):
        data = b'{"files": {}}' * 50
        signer = self.trust._Signer(self.private)
        signature = signer.sign(data)
        self.assertEqual(len(signature), 64)
        self.assertEqual(signer.public, self.public)
        self.assertTrue(self.trust._verify(self.public, signature, data))
        self.assertFalse(self.trust._verify(self.public, signature, data + b" "))
        self.assertFalse(self.trust._verify(self.public, bytes([signature[0] ^ 1]) + signature[1:], data))
        self.assertFalse(self.trust._verify(self.public, bytes(64), data))

    def test_another_key_does_not_verify(self):
        self.trust.write_key_pair(f"{self.tmp}/other", f"{self.tmp}/other.pub")
        other = self.trust.load_public_key(f"{self.tmp}/other.pub")
        signature = self.trust._Signer(self.private).sign(b"manifest")
        self.assertFalse(self.trust._verify(other, signature, b"manifest"))

    def test_sign_and_verify_manifest(self):
        record = self.trust.sign_manifest(b"manifest", f"{self.tmp}/key")
        signer = self.trust.verify_manifest(b"manifest", record, "<test>", trusted=[f"{self.tmp}/key.pub"], require=True)
        self.assertEqual(signer, self.trust.key_fingerprint(self.public))
        with self.assertRaises(self.trust.PackageSignatureError):
            self.trust.verify_manifest(b"manifest!", record, "<test>", trusted=[f"{self.tmp}/key.pub"], require=True)

    def _fingerprint(self, signature_record: bytes) -> str:
        return json.loads(signature_record)["signer"]

    def test_rotated_key_is_used_by_the_next_save(self):
        # NOTE: [Signing keys are prepared before the save]: kept per file, and
        # read again once the file is replaced or rewritten.
        key = f"{self.tmp}/key"
        first = self.trust.sign_manifest(b"manifest", key)
        self.assertEqual(self._fingerprint(first), self.trust.key_fingerprint(self.public))
        self.trust.write_key_pair(f"{self.tmp}/new", f"{self.tmp}/new.pub")
        os.replace(f"{self.tmp}/new", key)
        second = self.trust.sign_manifest(b"manifest", key)
        new_public = self.trust.load_public_key(f"{self.tmp}/new.pub")
        self.assertEqual(self._fingerprint(second), self.trust.key_fingerprint(new_public))
        self.trust.verify_manifest(b"manifest", second, "<test>", trusted=[f"{self.tmp}/new.pub"], require=True)

    def test_compile_prepares_the_signing_key(self):
        key = f"{self.tmp}/key"
        self.trust._signer_of.cache_clear()
        with torch._dynamo.config.patch(package_signing_key=key):
            compiled = torch.compile(lambda x: x.sin() + 1, backend="eager", package=f"{self.tmp}/pkg")
            compiled(torch.ones(3))
            self.assertEqual(self.trust._signer_of.cache_info().currsize, 1)
            misses = self.trust._signer_of.cache_info().misses
            compiled.save_package()
            self.assertEqual(self.trust._signer_of.cache_info().misses, misses)
        record = Path(f"{self.tmp}/pkg/{SIGNATURE_FILE}").read_bytes()
        self.assertEqual(self._fingerprint(record), self.trust.key_fingerprint(self.public))

    def test_unusable_signing_key_is_reported_by_the_save(self):
        Path(f"{self.tmp}/bad").write_bytes(b"not a key")
        with torch._dynamo.config.patch(package_signing_key=f"{self.tmp}/bad"):
            compiled = torch.compile(lambda x: x.cos() * 2, backend="eager", package=f"{self.tmp}/pkg")
            self.assertEqual(compiled(torch.ones(3)), torch.ones(3).cos() * 2)
            with self.assertRaisesRegex(PackageError, "signing key .*bad"):
                compiled.save_package()
        self.assertFalse(Path(f"{self.tmp}/pkg").exists())

instantiate_parametrized_tests(PackageTrustUnitTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
