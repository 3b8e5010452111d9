"""What signing costs a compile package: save and load with and without an
Ed25519 signature (torch/_dynamo/package_trust.py), in fresh processes.

Each run is a fresh interpreter (TORCH_OVERLAY=1 where the overlay is used)
that compiles a small MLP, then times ``save_package()`` (the eager backend's is
the cheapest save, so signing weighs most there; the signing key is made ready
while the graph compiles, NOTE: [Signing keys are prepared before the save],
so the whole saving process is reported too), and one that times ``load_package()``
plus the first call and the whole process, for an eager and an Inductor
package, with ``package_require_signature`` on for the signed ones; the
save and load phases in wall time and in the process's CPU time (which a machine
shared with other jobs disturbs less; it leaves out waiting for the disk, so its
ratios are the stricter ones). Modes alternate run by run; the result is min and median of each, and signed /
unsigned ratios of both (goal: <= 1.05x).

Then what the cryptography package, which makes and checks every signature
(NOTE: [Ed25519 through cryptography]), costs in a fresh process that has
imported torch and package_trust: its import, making the signing key ready,
one signature of a 3 kB manifest, the first verify_manifest() of a process
(what a signed load pays) and each one after it. ``--cryptography-only`` runs
just that part and replaces only its section of the results. Writes
benchmarks/results/package_signing.md.

    TORCH_OVERLAY=1 .venv/bin/python benchmarks/package_signing.py [--runs N] [--cryptography-only]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


MODEL = """
import torch


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)
        )

    def forward(self, x):
        return self.layers(x)
"""

# argv: root, backend, package path, "save"|"load"
RUN = """
import json, sys, time
started = time.perf_counter()
import torch
root, backend, path, mode = sys.argv[1:5]
sys.path.insert(0, root)
import signing_model

torch.manual_seed(0)
model = signing_model.MLP()
compiled = torch.compile(model, backend=backend, package=path)
x = torch.randn(8, 64)
if mode == "save":
    compiled(x)
    t0, c0 = time.perf_counter(), time.process_time()
    compiled.save_package()
elif mode == "save_alternating":
    # One process saving again and again, signed and unsigned in turn: the
    # per-save cost of signing without the noise between processes.
    key = torch._dynamo.config.package_signing_key
    compiled(x)
    compiled.save_package()
    times = {"signed": [], "unsigned": []}
    for i in range(2 * int(sys.argv[5])):
        mode_i = ("signed", "unsigned")[i % 2]
        with torch._dynamo.config.patch(package_signing_key=key if mode_i == "signed" else None):
            t = time.process_time()
            compiled.save_package()
            times[mode_i].append(time.process_time() - t)
    print("RESULT" + json.dumps(times))
    sys.exit(0)
else:
    t0, c0 = time.perf_counter(), time.process_time()
    compiled.load_package()
    with torch.compiler.set_stance("fail_on_recompile"):
        compiled(x)
phase, phase_cpu = time.perf_counter() - t0, time.process_time() - c0
print("RESULT" + json.dumps({"phase_s": phase, "phase_cpu_s": phase_cpu, "process_s": time.perf_counter() - started}))
"""


# argv: private key, public key, "sign"|"verify", repeats. Times in seconds.
CRYPTOGRAPHY_RUN = """
import json, sys, time
import torch
from torch._dynamo import package_trust

private, public, mode, repeats = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
assert "cryptography" not in sys.modules, "package_trust imported cryptography at import"
manifest = package_trust.manifest_bytes({
    "format_version": 2, "torch_version": torch.__version__, "device": "cpu",
    "files": {f"graphs/{i:032x}.bin": f"{i:064x}" for i in range(36)},
})
result = {"manifest_bytes": len(manifest)}
if mode == "sign":
    t = time.perf_counter()
    package_trust._ed25519()
    result["import_s"] = time.perf_counter() - t
    t = time.perf_counter()
    package_trust._signer(private)
    result["prepare_s"] = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        record = package_trust.sign_manifest(manifest, private)
        times.append(time.perf_counter() - t)
    result["sign_s"] = sorted(times)[len(times) // 2]
    result["record"] = record.decode()
else:
    record = sys.argv[5].encode()
    t = time.perf_counter()
    package_trust.verify_manifest(manifest, record, "<bench>", trusted=[public], require=True)
    result["first_verify_s"] = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        package_trust.verify_manifest(manifest, record, "<bench>", trusted=[public], require=True)
        times.append(time.perf_counter() - t)
    result["verify_s"] = sorted(times)[len(times) // 2]
print("RESULT" + json.dumps(result))
"""

CRYPTOGRAPHY_SECTION = "## Ed25519 through cryptography"


def _keys(root: Path) -> tuple[str, str]:
    from torch._dynamo.package_trust import write_key_pair

    private, public = root / "bench.pem", root / "bench.pub.pem"
    write_key_pair(private, public)
    return str(private), str(public)


def _run(root: Path, backend: str, path: Path, mode: str, env: dict, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", RUN, str(root), backend, str(path), mode, *extra],
        capture_output=True,
        text=True,
        cwd=root,
        # Saves share a warm cache (the compile is not what is measured); every
        # load starts from an empty one.
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(
            root / ("save-cache" if mode == "save" else f"cache-{time.monotonic_ns()}")
        ), **env},
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} {backend} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT") :])


def _save_then_load(root: Path, backend: str, path: Path, save_env: dict, load_env: dict) -> tuple[dict, dict]:
    """Save a package, then load it in a fresh process; saved again when the
    patch series changed in between (a package records it; the overlay serves
    the series as it is on disk)."""
    for attempt in range(3):
        saved = _run(root, backend, path, "save", save_env)
        try:
            return saved, _run(root, backend, path, "load", load_env)
        except RuntimeError as e:
            if "overlay_series_hash" not in str(e) or attempt == 2:
                raise
    raise AssertionError("unreachable")


def _summary(values: list[float]) -> tuple[float, float]:
    return min(values), statistics.median(values)


def _run_cryptography(private: str, public: str, mode: str, signatures: int, *extra: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", CRYPTOGRAPHY_RUN, private, public, mode, str(signatures), *extra],
        capture_output=True,
        text=True,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"cryptography {mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT") :])


def _cryptography_section(private: str, public: str, runs: int, signatures: int) -> str:
    """What cryptography costs signing and verifying, in fresh processes."""
    samples: dict[str, list[float]] = {}
    size = 0
    for run in range(runs):
        signed = _run_cryptography(private, public, "sign", signatures)
        verified = _run_cryptography(private, public, "verify", signatures, signed["record"])
        size = signed["manifest_bytes"]
        for result in (signed, verified):
            for key, value in result.items():
                if key.endswith("_s"):
                    samples.setdefault(key, []).append(value)
        print(f"cryptography run {run + 1}/{runs} done", file=sys.stderr)
    what = {
        "import_s": "import of cryptography's Ed25519 (the first signature or verify of a process pays it)",
        "prepare_s": "signing key made ready after that import (PEM read, key object; done while a package compiles)",
        "sign_s": f"sign_manifest() of a {size}-byte manifest, median of {signatures} in one process",
        "first_verify_s": "first verify_manifest() of a process, the import included (a signed load pays it once)",
        "verify_s": f"verify_manifest() after that (public key file read each time), median of {signatures}",
    }
    rows = ["| measured | min (ms) | median (ms) |", "|---|---|---|"]
    for key, text in what.items():
        low, mid = _summary(samples[key])
        rows.append(f"| {text} | {low * 1e3:.3f} | {mid * 1e3:.3f} |")
    import cryptography

    load = os.getloadavg()[0]
    return (
        f"{CRYPTOGRAPHY_SECTION}\n\n"
        f"cryptography {cryptography.__version__}, {runs} fresh processes per row (each after `import torch` and "
        f"package_trust, which do not import cryptography), {time.strftime('%Y-%m-%d', time.gmtime())}, "
        f"{os.cpu_count()} CPUs, load average {load:.1f} when it ended.\n\n" + "\n".join(rows) + "\n"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--repeats", type=int, default=50, help="saves of each kind in the alternating process")
    parser.add_argument("--signatures", type=int, default=2000, help="signatures and verifies timed in one process")
    parser.add_argument("--cryptography-only", action="store_true", help="only the cost of cryptography itself")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "package_signing.md"))
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="package-signing-"))
    (root / "signing_model.py").write_text(MODEL)
    private, public = _keys(root)
    out = Path(args.out)
    if args.cryptography_only:
        section = _cryptography_section(private, public, args.runs, args.signatures)
        previous = out.read_text().split(CRYPTOGRAPHY_SECTION)[0].rstrip() if out.exists() else "# Package signing cost"
        out.write_text(previous + "\n\n" + section)
        print(section)
        return 0
    modes = {
        "unsigned": ({}, {}),
        "signed": (
            {"TORCH_COMPILE_PACKAGE_SIGNING_KEY": private},
            {"TORCH_COMPILE_PACKAGE_TRUSTED_KEYS": public, "TORCH_COMPILE_PACKAGE_REQUIRE_SIGNATURE": "1"},
        ),
    }
    samples: dict[tuple, list[float]] = {}
    for run in range(args.runs):
        for mode, (save_env, load_env) in modes.items():
            # Each run saves the packages it loads: a package records the patch
            # series, which may change while a long benchmark runs.
            for backend in ("eager", "inductor"):
                saved, loaded = _save_then_load(root, backend, root / f"{backend}-{mode}-{run}", save_env, load_env)
                samples.setdefault((f"save {backend}", "save_package()", mode), []).append(saved["phase_s"])
                samples.setdefault((f"save {backend}", "save_package(), CPU", mode), []).append(saved["phase_cpu_s"])
                samples.setdefault((f"save {backend}", "fresh process, start to saved (compile + save)", mode), []).append(
                    saved["process_s"]
                )
                samples.setdefault((f"load {backend}", "load_package() + first call", mode), []).append(loaded["phase_s"])
                samples.setdefault((f"load {backend}", "load_package() + first call, CPU", mode), []).append(
                    loaded["phase_cpu_s"]
                )
                samples.setdefault((f"load {backend}", "fresh process, start to first output", mode), []).append(loaded["process_s"])
        print(f"run {run + 1}/{args.runs} done", file=sys.stderr)
    for backend in ("eager", "inductor"):
        alternating = _run(root, backend, root / f"{backend}-alternating", "save_alternating",
                           modes["signed"][0], str(args.repeats))
        for mode in ("unsigned", "signed"):
            samples[(f"save {backend}", f"save_package(), CPU, {args.repeats} alternating saves in one process", mode)] = (
                alternating[mode]
            )
    rows = [
        "| case | measured | unsigned min / median (s) | signed min / median (s) | signed/unsigned min | median |",
        "|---|---|---|---|---|---|",
    ]
    for case, what in dict.fromkeys((c, w) for c, w, _ in samples):
        u_min, u_med = _summary(samples[(case, what, "unsigned")])
        s_min, s_med = _summary(samples[(case, what, "signed")])
        rows.append(
            f"| {case} | {what} | {u_min:.4f} / {u_med:.4f} | {s_min:.4f} / {s_med:.4f} "
            f"| {s_min / u_min:.3f} | {s_med / u_med:.3f} |"
        )
    text = (
        f"# Package signing cost\n\n{args.runs} fresh processes per cell, modes alternating; "
        "signed loads with package_require_signature on.\n\n" + "\n".join(rows) + "\n\n"
        + _cryptography_section(private, public, args.runs, args.signatures)
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
