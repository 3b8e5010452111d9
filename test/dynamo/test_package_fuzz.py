# Owner(s): ["module: dynamo"]
"""A seeded fuzzer for compile packages and aot_compile archives.

Packages are built once per test class (an eager package, an Inductor package
with its CPU kernels, an aot_compile archive; unsigned and signed), then
mutated the way bad storage or an attacker would: bytes flipped, files
truncated (with the manifest's sha256 left, or re-computed as an attacker
would), manifest fields replaced by hostile values, hostile names, symlinks,
FIFOs and directories where files were, hostile pickles (that create a marker
file if they ever run), damaged entries, zip-slip and malformed archives.
A loader process loads mutated copies one after another (each after
torch._dynamo.reset(), under a per-case alarm) and reports each outcome; a
crashed loader is restarted after the case that crashed it. For every case:
no crash (signal), no hang, only a PackageError (or, for an entry left out,
the fail_on_recompile refusal), never a wrong output, never the marker.

With signatures required, every mutation that changes what the package holds is
refused; unsigned, mutations that replace code by other valid code (bytecode
of the function's own shape, a graph's generated code, a kernel binary) are
not among the cases: a package is code, and only a signature protects it
(NOTE: [Trust model of compile packages] in torch/_dynamo/package_trust.py).

``FUZZ_CASES=N`` (``make fuzz``) runs N cases per mode instead of the suite's
default; ``FUZZ_SEED`` picks the seed.
"""

import hashlib
import io
import json
import marshal
import os
import pickle
import random
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Optional

import torch
import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    slowTest,
    subtest,
)
from torch.testing._internal.fresh_process import run_code, start_code


CASES_PER_MODE = int(os.environ.get("FUZZ_CASES", "120"))
SEED = int(os.environ.get("FUZZ_SEED", "1515"))
CASE_TIMEOUT_S = 20

MODEL = """
import torch


def f(x, y):
    return torch.sin(x) + y * 2


def g(x):
    return torch.relu(x) * 3 + x.cos()
"""

SAVE = """
import sys
import torch
from torch.testing._internal.fresh_process import write_report

out, key = sys.argv[1], sys.argv[2]
sys.path.insert(0, out)
import fuzz_model

x = torch.arange(6.0)
for suffix, signing_key in (("", None), ("_signed", key)):
    with torch._dynamo.config.patch(package_signing_key=signing_key):
        torch._dynamo.reset()
        compiled = torch.compile(fuzz_model.f, backend="eager", package=f"{out}/eager{suffix}")
        compiled(x, x)
        compiled.save_package()
        compiled = torch.compile(fuzz_model.g, package=f"{out}/inductor{suffix}")
        compiled(x)
        compiled.save_package()
        with torch._dynamo.config.patch(enable_aot_compile=True):
            fn = torch.compile(fuzz_model.f, fullgraph=True, backend="eager").aot_compile(((x, x), {}))
            fn.save_compiled_function(f"{out}/aot{suffix}.pt")
write_report("saved")
"""

# Loads the cases listed in a JSON file, from index argv[3] on. Its report is
# written again before and after each case (the report file is replaced
# atomically), so that a crash is attributed to the case that caused it and the
# outcomes before it are kept.
LOADER = """
import gc
import glob
import json
import os
import shutil
import signal
import sys
import tempfile
import torch
from torch.testing._internal.fresh_process import write_report

out, cases_file, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
sys.path.insert(0, out)
import fuzz_model
from torch._dynamo.exc import PackageError

cases = json.load(open(cases_file))
x = torch.arange(6.0)
expected = {"f": fuzz_model.f(x, x), "g": fuzz_model.g(x)}


class Hang(Exception):
    pass


def on_alarm(signum, frame):
    raise Hang()


signal.signal(signal.SIGALRM, on_alarm)
kernel_copies = os.path.join(tempfile.gettempdir(), "torch_package_kernels_*")
report = {"started": None, "cases": []}
for i in range(first, len(cases)):
    case = cases[i]
    report["started"] = i
    write_report(report)
    before = set(glob.glob(kernel_copies))
    torch._dynamo.reset()
    signal.alarm(case["timeout"])
    try:
        with torch._dynamo.config.patch(**case["config"]):
            fn = getattr(fuzz_model, case["fn"])
            args = (x, x) if case["fn"] == "f" else (x,)
            with torch.compiler.set_stance("fail_on_recompile"):
                if case["path"].endswith(".pt"):
                    result = torch.compiler.load_compiled_function(case["path"])(*args)
                else:
                    compiled = torch.compile(fn, backend=case["backend"], package=case["path"])
                    compiled.load_package()
                    result = compiled(*args)
        outcome = {"outcome": "ok" if torch.allclose(result, expected[case["fn"]]) else "wrong"}
    except Hang:
        outcome = {"outcome": "hang"}
    except PackageError as e:
        outcome = {"outcome": "package_error", "type": type(e).__name__, "message": str(e)[:300]}
    except RuntimeError as e:
        if "fail_on_recompile" in str(e) or "Detected recompile" in str(e):
            outcome = {"outcome": "recompile_refused"}
        else:
            outcome = {"outcome": "untyped", "type": type(e).__name__, "message": str(e)[:300]}
    except BaseException as e:
        outcome = {"outcome": "untyped", "type": type(e).__name__, "message": str(e)[:300]}
    finally:
        signal.alarm(0)
    if outcome["outcome"] != "ok":
        # A failed load leaves no kernel copies behind (once its objects are gone;
        # a loaded package's copies live as long as its graphs, in module globals).
        compiled = result = None
        gc.collect()
        leftovers = set(glob.glob(kernel_copies)) - before
        if leftovers:
            outcome = {"outcome": "leftover_temp_dir", "was": outcome}
            for leftover in leftovers:
                shutil.rmtree(leftover, ignore_errors=True)
    report["cases"].append({"index": i, **outcome})
    write_report(report)
"""

ALLOWED = {"ok", "package_error", "recompile_refused"}
# Every CONTROL_EVERY-th case is an unchanged copy, which must load and compute right.
CONTROL_EVERY = 15
CONTROL = "unchanged (control)"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _write_keys(directory: Path) -> tuple[str, str]:
    from torch._dynamo.package_trust import write_key_pair

    private, public = directory / "fuzz.pem", directory / "fuzz.pub.pem"
    write_key_pair(private, public)
    return str(private), str(public)


class _Opens:
    """A hostile pickle: unpickling it creates the marker file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


# ---------------------------------------------------------------------------
# Mutations of a package directory
# ---------------------------------------------------------------------------


class DirectoryMutator:
    """Mutations of one copy of a package directory (``self.root``)."""

    def __init__(self, rng: random.Random, root: Path, marker: str, signed: bool) -> None:
        self.rng, self.root, self.marker, self.signed = rng, root, marker, signed

    def manifest(self) -> dict:
        return json.loads((self.root / "manifest.json").read_text())

    def write_manifest(self, manifest, raw: Optional[bytes] = None) -> None:
        (self.root / "manifest.json").write_bytes(
            raw if raw is not None else json.dumps(manifest, indent=1, sort_keys=True).encode()
        )

    def files(self) -> list[str]:
        return sorted(self.manifest()["files"])

    def replace_file(self, name: str, data: bytes, fix_sha: bool = True) -> None:
        (self.root / name).write_bytes(data)
        if fix_sha:
            manifest = self.manifest()
            manifest["files"][name] = _sha(data)
            self.write_manifest(manifest)

    def pick(self, prefix: str = "") -> str:
        names = [n for n in self.files() if n.startswith(prefix)]
        return self.rng.choice(names) if names else self.rng.choice(self.files())

    # Each mutation returns a description.
    def flip_bytes(self) -> str:
        name, fix = self.pick(), self.rng.random() < 0.7
        data = bytearray((self.root / name).read_bytes())
        for _ in range(self.rng.randint(1, 8)):
            data[self.rng.randrange(len(data))] ^= 1 << self.rng.randrange(8)
        self.replace_file(name, bytes(data), fix)
        return f"flip bytes of {name} (sha fixed: {fix})"

    def truncate(self) -> str:
        name, fix = self.pick(self.rng.choice(["kernels/", "graphs/", "dynamo", ""])), self.rng.random() < 0.8
        data = (self.root / name).read_bytes()
        self.replace_file(name, data[: self.rng.randrange(len(data))], fix)
        return f"truncate {name} (sha fixed: {fix})"

    def manifest_field(self) -> str:
        manifest = self.manifest()
        field = self.rng.choice(
            ["device", "format_version", "files", "entries", "backend", "frozen", "compile_options",
             "torch_version", "aot_compile", "cpu_capability", "skipped_frames"]
        )
        value = self.rng.choice(
            [5, "", "xyz", "__class__", None, [], {}, "cpu,xyz", "cuda", -1, True, "x" * 5000,
             {"a": {"b": [1]}}, "cpu,", {"module": 1}, "meta"]
        )
        manifest[field] = value
        self.write_manifest(manifest)
        return f"manifest {field} = {str(value)[:40]!r}"

    def manifest_bytes(self) -> str:
        kind = self.rng.choice(["deep", "garbage", "empty", "not-object", "huge-number"])
        raw = {
            "deep": b"[" * 200000 + b"]" * 200000,
            "garbage": os.urandom(64),
            "empty": b"",
            "not-object": b"[1, 2, 3]",
            "huge-number": b'{"format_version": 1' + b"0" * 5000 + b"}",
        }[kind]
        self.write_manifest(None, raw)
        return f"manifest bytes {kind}"

    def hostile_name(self) -> str:
        manifest = self.manifest()
        name = self.rng.choice(
            ["graphs/../../../../etc/hostname", "/etc/hostname", "graphs/a\0b.bin", "x" * 400,
             "kernels/../manifest.json", "graphs//x.bin", "./dynamo.bin", "graphs/\\x.bin",
             "manifest.json", "kernels/abc.so", "graphs/x.txt"]
        )
        manifest["files"][name] = _sha(b"")
        self.write_manifest(manifest)
        return f"manifest names file {name[:40]!r}"

    def drop_listed(self) -> str:
        manifest = self.manifest()
        name = self.pick(self.rng.choice(["graphs/", "kernels/"]))
        del manifest["files"][name]
        if self.rng.random() < 0.5:
            (self.root / name).unlink()
        self.write_manifest(manifest)
        return f"manifest drops {name}"

    def file_type(self) -> str:
        files = self.files()
        name = self.rng.choice(["manifest.json", *files])
        kind = self.rng.choice(["symlink-outside", "symlink-inside", "fifo", "directory", "dir-symlink"])
        target = self.root / name
        if kind == "dir-symlink" and "/" in name:
            folder = self.root / name.split("/")[0]
            moved = self.root.parent / (self.root.name + "-moved")
            shutil.move(str(folder), str(moved))
            os.symlink(moved, folder)
            return f"{name.split('/')[0]} is a symlink to a copy"
        target.unlink()
        if kind == "symlink-outside":
            os.symlink("/etc/hostname", target)
        elif kind == "symlink-inside":
            os.symlink(self.root / files[0], target)
        elif kind == "fifo":
            os.mkfifo(target)
        else:
            target.mkdir()
        return f"{name} is a {kind}"

    def hostile_graph_pickle(self) -> str:
        name = self.pick("graphs/")
        kind = self.rng.choice(
            ["plain", "eager-payload", "custom-backend", "torch-callable", "inductor-nested", "inductor-direct"]
        )
        hostile = _Opens(self.marker)
        if kind == "plain":
            data = pickle.dumps(hostile)
        elif kind == "eager-payload":
            data = pickle.dumps({"backend": "eager", "gm": hostile})
        elif kind == "torch-callable":
            # torch's own SerializableCallable, whose bytes are a pickle.
            data = pickle.dumps({"backend": "custom:x",
                                 "callable_class": ("torch._dynamo.aot_compile_types", "GraphModuleSerializableCallable"),
                                 "artifacts": pickle.dumps(hostile)})
        elif kind == "custom-backend":
            data = pickle.dumps({"backend": "custom:x", "callable_class": ("os", "system"),
                                 "artifacts": f"touch {self.marker}".encode()})
        else:
            buf = io.BytesIO()
            payload = {"backend": "inductor", "entry": pickle.dumps(hostile), "fw_graph": pickle.dumps(hostile),
                       "bw_graph": None, "aot_config": {}, "params": {}, "extern_kernels": {}}
            if kind == "inductor-direct":
                payload["params"] = {"w": hostile}
            torch.save(payload, buf)
            data = buf.getvalue()
        self.replace_file(name, data)
        return f"hostile pickle ({kind}) in {name}"

    def entries(self) -> list:
        return pickle.loads((self.root / "dynamo.bin").read_bytes())

    def write_entries(self, entries) -> None:
        self.replace_file("dynamo.bin", pickle.dumps(entries))

    def damaged_entry(self) -> str:
        entries = self.entries()
        fields = list(entries[0])
        kind = self.rng.choice(["global_module", "code_key", "out_code", "guards", "globals", "shape", "hostile"])
        if kind == "global_module":
            fields[3] = self.rng.choice(["this", "os", "antigravity", "", "torch"])
        elif kind == "code_key":
            fields[0] = self.rng.choice([("function", "os", "system"), ("resume", "x", "y"), (), ("x",), 5])
        elif kind == "out_code":
            fields[1] = self.rng.choice([b"", b"garbage", marshal.dumps(compile(f"open({self.marker!r}, 'w')", "x", "exec")),
                                         marshal.dumps(1), fields[1][:-5]])
        elif kind == "guards":
            fields[2] = self.rng.choice([b"", fields[2][:-7], pickle.dumps(_Opens(self.marker)), pickle.dumps([1, 2])])
        elif kind == "globals":
            name = next(iter(fields[4]), "__x")
            fields[4] = {name: self.rng.choice([("graph", "missing"), ("module", "this"), ("named", "os", "system"),
                                                ("resume", "r", b"bad"), ("xyz",), 5])}
        elif kind == "shape":
            fields = fields[:3]
        else:
            self.replace_file("dynamo.bin", pickle.dumps([_Opens(self.marker)]))
            return "hostile pickle in dynamo.bin"
        entries[0] = tuple(fields)
        self.write_entries(entries)
        return f"entry field {kind} damaged"

    def code_replacement(self) -> str:
        """Code replaced by other valid code: refused only by the signature."""
        kind = self.rng.choice(["bytecode", "kernel"] if self.files_with("kernels/") else ["bytecode"])
        if kind == "bytecode":
            entries = self.entries()
            fields = list(entries[0])
            code = marshal.loads(fields[1])
            source = f"def {code.co_name}(*a, **k):\n    open({self.marker!r}, 'w')\n"
            hostile = compile(source, code.co_filename, "exec").co_consts[0]
            fields[1] = marshal.dumps(hostile)
            entries[0] = tuple(fields)
            self.write_entries(entries)
        else:
            name = self.pick("kernels/")
            self.replace_file(name, Path(torch._C.__file__).read_bytes())
        return f"{kind} replaced by other code"

    def files_with(self, prefix: str) -> bool:
        return any(n.startswith(prefix) for n in self.files())

    def signature(self) -> str:
        kind = self.rng.choice(["remove", "garbage", "other-signature", "symlink"])
        sig = self.root / "manifest.json.sig"
        if kind == "remove":
            sig.unlink(missing_ok=True)
        elif kind == "garbage":
            sig.write_bytes(self.rng.choice([b"{}", os.urandom(40), b"[" * 10000]))
        elif kind == "other-signature":
            record = {"format": 1, "algorithm": "ed25519", "signer": "ed25519:0", "signature": "A" * 86 + "=="}
            sig.write_text(json.dumps(record))
        else:
            sig.unlink(missing_ok=True)
            os.symlink("/etc/hostname", sig)
        return f"signature {kind}"

    def mutate(self) -> str:
        choices = [self.flip_bytes, self.truncate, self.manifest_field, self.manifest_bytes, self.hostile_name,
                   self.drop_listed, self.file_type, self.hostile_graph_pickle, self.damaged_entry]
        if self.signed:
            choices += [self.code_replacement, self.signature]
        return self.rng.choice(choices)()


# ---------------------------------------------------------------------------
# Mutations of an archive
# ---------------------------------------------------------------------------


def _mutate_archive(rng: random.Random, source: Path, target: Path, marker: str, signed: bool) -> str:
    with zipfile.ZipFile(source) as archive:
        members = {info.filename: archive.read(info) for info in archive.infolist()}
    manifest = json.loads(members["manifest.json"])
    kind = rng.choice(["zip-slip", "duplicate", "compressed", "truncated", "flip", "hostile-pickle",
                       "drop", "symlink-member", "extra", "directory-member"])
    if kind == "zip-slip":
        name = rng.choice(["kernels/../../../../tmp/fuzz-zip-slip", "/tmp/fuzz-abs", "graphs/../../x.bin"])
        members[name] = b"\x7fELF"
        manifest["files"][name] = _sha(b"\x7fELF")
    elif kind == "hostile-pickle":
        name = next(n for n in members if n.startswith("graphs/"))
        members[name] = pickle.dumps({"backend": "eager", "gm": _Opens(marker)})
        manifest["files"][name] = _sha(members[name])
    elif kind == "drop":
        members.pop(next(n for n in members if n.startswith("graphs/")))
    elif kind == "extra":
        members["graphs/extra.bin"] = b"x"
    elif kind == "flip":
        name = rng.choice(sorted(members))
        data = bytearray(members[name])
        data[rng.randrange(len(data))] ^= 0xFF
        members[name] = bytes(data)
        if name != "manifest.json" and rng.random() < 0.7:
            manifest["files"][name] = _sha(members[name])
    if kind in ("zip-slip", "hostile-pickle") or (kind == "flip" and "manifest.json" in members):
        # What an attacker does: the manifest lists the new sha256 (re-written
        # unless the flip hit the manifest itself).
        if kind != "flip" or name != "manifest.json":
            members["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            if kind == "compressed":
                info.compress_type = zipfile.ZIP_DEFLATED
            if kind == "symlink-member" and name.startswith("graphs/"):
                info.external_attr = 0o120777 << 16
            archive.writestr(info, data)
            if kind == "duplicate" and name.startswith("graphs/"):
                archive.writestr(zipfile.ZipInfo(name), pickle.dumps(_Opens(marker)))
        if kind == "directory-member":
            archive.writestr(zipfile.ZipInfo("kernels/"), b"")
    data = buf.getvalue()
    if kind == "truncated":
        data = data[: rng.randrange(len(data))]
    target.write_bytes(data)
    return f"archive {kind}"


class PackageFuzzTests(torch._dynamo.test_case.TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.root = Path(tempfile.mkdtemp(prefix="package-fuzz-"))
        cls.key, cls.public = _write_keys(cls.root)
        (cls.root / "fuzz_model.py").write_text(MODEL)
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

    def make_cases(self, signed: bool, count: int, work: Path, marker: str) -> list[dict]:
        rng = random.Random(SEED + signed)
        suffix = "_signed" if signed else ""
        config = (
            {"package_trusted_keys": [self.public], "package_require_signature": True} if signed else {}
        )
        cases = []
        for i in range(count):
            base = rng.choice(["eager", "inductor", "aot"])
            control = i % CONTROL_EVERY == 0
            if base == "aot":
                target = work / f"case{i}.pt"
                if control:
                    shutil.copyfile(self.root / f"aot{suffix}.pt", target)
                    what = CONTROL
                else:
                    what = _mutate_archive(rng, self.root / f"aot{suffix}.pt", target, marker, signed)
                fn, backend = "f", "eager"
            else:
                target = work / f"case{i}" / "pkg"
                shutil.copytree(self.root / f"{base}{suffix}", target, symlinks=True)
                what = CONTROL if control else DirectoryMutator(rng, target, marker, signed).mutate()
                fn, backend = ("f", "eager") if base == "eager" else ("g", "inductor")
            cases.append({"path": str(target), "what": f"{base}: {what}", "fn": fn, "backend": backend,
                          "config": config, "timeout": CASE_TIMEOUT_S})
        return cases

    def run_cases(self, cases: list[dict], work: Path) -> dict[int, dict]:
        cases_file = work / "cases.json"
        cases_file.write_text(json.dumps(cases))
        results: dict[int, dict] = {}
        first = 0
        # The loader's own temp dir: a load must leave nothing in it.
        (work / "tmp").mkdir(exist_ok=True)
        env = {"TORCHINDUCTOR_CACHE_DIR": str(work / "empty-cache"), "TMPDIR": str(work / "tmp")}
        while first < len(cases):
            # A crash is an outcome here (the loader restarts after the case that
            # caused it); a loader that hangs past all its cases' alarms is not.
            done = start_code(
                LOADER,
                self.root,
                cases_file,
                str(first),
                cwd=work,
                env=env,
                timeout=CASE_TIMEOUT_S * (len(cases) - first) + 120,
            ).finish()
            if done.timed_out:
                raise AssertionError(done.describe())
            report = done.report or {"started": None, "cases": []}
            for case_report in report["cases"]:
                results[case_report["index"]] = case_report
            if done.returncode == 0:
                if not done.ok:  # it wrote no report
                    raise AssertionError(done.describe())
                break
            # The loader died in case `started`: a crash.
            started = report["started"]
            crashed = started if started is not None else first
            results[crashed] = {"index": crashed, "outcome": "crash", "type": f"exit {done.returncode}",
                                "message": done.stderr[-300:]}
            first = crashed + 1
        return results

    @parametrize("signed", [subtest(False, decorators=[slowTest]), True])
    def test_fuzz(self, signed):
        work = Path(tempfile.mkdtemp(dir=self.root))
        marker = str(work / "MARKER-code-ran")
        cases = self.make_cases(signed, CASES_PER_MODE, work, marker)
        results = self.run_cases(cases, work)
        bad = []
        outcomes: dict[str, int] = {}
        for i, case in enumerate(cases):
            report = results.get(i, {"outcome": "missing"})
            outcomes[report["outcome"]] = outcomes.get(report["outcome"], 0) + 1
            if case["what"].endswith(CONTROL):
                # Unchanged copies load and compute right (the harness works).
                if report["outcome"] != "ok":
                    bad.append(f"{case['what']}: {report}")
            elif report["outcome"] not in ALLOWED:
                bad.append(f"{case['what']}: {report}")
            elif signed and report["outcome"] == "ok":
                # With a signature required, a changed package never loads.
                bad.append(f"{case['what']}: loaded although changed after signing")
        print(f"fuzz signed={signed}: {len(cases)} cases, outcomes {outcomes}", file=sys.stderr)
        self.assertFalse(os.path.exists(marker), "a hostile pickle or replaced code ran")
        self.assertFalse(os.path.exists("/tmp/fuzz-zip-slip") or os.path.exists("/tmp/fuzz-abs"))
        leftovers = list((work / "tmp").glob("torch_package_kernels_*"))
        if bad:
            self.fail(f"{len(bad)} of {len(cases)} cases failed:\n" + "\n".join(bad[:30]))
        self.assertEqual(leftovers, [], "a load left kernel copies behind")


instantiate_parametrized_tests(PackageFuzzTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
