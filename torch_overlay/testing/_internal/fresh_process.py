"""Run Python code or a script in a fresh interpreter and read back its report.

Tests of compile packages, saved guards and ``aot_compile`` prove things across
processes: save in one interpreter, load in a fresh one (often with an empty
Inductor cache, under ``torch.compiler.set_stance("fail_on_recompile")``). This
module is the one way the test suites start such a child: one environment
policy, one timeout policy and one report protocol (NOTE: [Fresh-process
tests]).

In the test (the parent)::

    from torch.testing._internal.fresh_process import run_code

    report = run_code(SAVE_SOURCE, str(package_dir), fresh_inductor_cache=True)

In the child::

    from torch.testing._internal.fresh_process import write_report

    write_report({"traced_graphs": 0, "same": True})

Provides :func:`run_code` and :func:`run_script` (run a child to the end and
return its report, or raise ``AssertionError`` with its exit code and stderr
tail), :func:`start_code` and :func:`start_script` (start a child and return a
:class:`FreshProcess`, for children that run concurrently or are expected to
fail), :func:`reports` (the reports of children run side by side),
:func:`write_report` (the child's side), :func:`fresh_env` (the
environment, for launchers that start processes themselves), and
:data:`REPORT_PATH_ENV`, :data:`DEFAULT_TIMEOUT_S`.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import weakref
from dataclasses import dataclass
from typing import Any, TYPE_CHECKING


if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from typing_extensions import Self


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "REPORT_PATH_ENV",
    "Finished",
    "FreshProcess",
    "fresh_env",
    "reports",
    "run_code",
    "run_script",
    "start_code",
    "start_script",
    "write_report",
]

# NOTE: [Fresh-process tests]
# A test that proves something across processes (a package saved here loads
# there without compiling) is only as good as the isolation of the child and as
# readable as its failure. Every such child is started here, so all of them get
# the same answers:
#
# Environment. The child inherits the parent's environment, so it runs the same
# torch as the parent: with the overlay, TORCH_OVERLAY=1 is inherited and the
# child activates it at startup like the parent did; the patched wheel needs
# nothing. ``pythonpath`` directories are put first on PYTHONPATH, so a child
# imports the test's helper modules by name; ``-P`` (safe_path) is passed on
# when the parent has it, and the child's working directory is a fresh empty
# directory unless the test names one, so neither the repository nor the
# test's directory lands on the child's sys.path by accident (a patched-wheel
# run must never import the repository's sources). ``fresh_inductor_cache``
# gives the child an empty TORCHINDUCTOR_CACHE_DIR of its own, which is what
# "loads without compiling" needs: a warm cache would hide a recompile. ``env``
# adds variables, or removes one given as None, last.
#
# Timeout. One default, DEFAULT_TIMEOUT_S per child (TORCH_FRESH_PROCESS_TIMEOUT_S
# overrides it for a slow machine); a test whose child does more passes its own.
# A child runs in its own session and, on timeout, its whole process group is
# killed: Inductor's compile workers must not outlive it holding its pipes.
#
# Report. The child writes ONE JSON value to the file named by
# TORCH_FRESH_PROCESS_REPORT (write_report does it atomically; a child that must
# not import this module, e.g. one that measures its own imports, may write the
# file itself). stdout stays free for the code under test. A child counts as
# passed only if it exits 0 AND wrote a report: one that returned early, or
# whose report got lost, fails loudly instead of passing with nothing checked.
# Any failure or timeout raises AssertionError naming the exit code, with the
# tails of the child's stderr and stdout, so the test log shows why the child
# failed, not only that it did.

# Where the child writes its JSON report (a path the parent chose).
REPORT_PATH_ENV = "TORCH_FRESH_PROCESS_REPORT"
# Seconds a child may run unless the test says otherwise.
DEFAULT_TIMEOUT_S = float(os.environ.get("TORCH_FRESH_PROCESS_TIMEOUT_S", "900"))
# How much of a failed child's output an AssertionError carries.
_STDERR_TAIL = 8000
_STDOUT_TAIL = 3000


def write_report(report: Any) -> None:
    """Writes ``report`` (any JSON value) as this child's report.

    Called in the child. Written atomically, so the parent never reads half a
    report; a second call replaces the first. Run by hand (no parent), the
    report is printed instead.
    """
    text = json.dumps(report)
    path = os.environ.get(REPORT_PATH_ENV)
    if not path:
        print(text)
        return
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def fresh_env(
    *,
    env: Mapping[str, str | None] | None = None,
    pythonpath: Sequence[str | os.PathLike[str]] = (),
    inductor_cache: str | os.PathLike[str] | None = None,
) -> dict[str, str]:
    """The environment of a fresh child (NOTE: [Fresh-process tests]).

    The parent's environment, with ``pythonpath`` first on PYTHONPATH,
    TORCHINDUCTOR_CACHE_DIR set to ``inductor_cache`` when given, and ``env``
    applied last (a None value removes that variable). For launchers that start
    their processes themselves; :func:`start_code` and :func:`start_script` use it.
    """
    result = dict(os.environ)
    paths = [os.fspath(p) for p in pythonpath]
    if result.get("PYTHONPATH"):
        paths.append(result["PYTHONPATH"])
    if paths:
        result["PYTHONPATH"] = os.pathsep.join(paths)
    if inductor_cache is not None:
        result["TORCHINDUCTOR_CACHE_DIR"] = os.fspath(inductor_cache)
    for name, value in (env or {}).items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result


@dataclass(frozen=True)
class Finished:
    """A child that ran to its end (or was killed at its timeout)."""

    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool
    # Whether the child wrote a report, and the parsed report.
    reported: bool
    report: Any

    @property
    def ok(self) -> bool:
        """Whether the child passed: exited 0 having written its report."""
        return not self.timed_out and self.returncode == 0 and self.reported

    def describe(self) -> str:
        if self.timed_out:
            how = "timed out and was killed"
        elif self.returncode == 0 and not self.reported:
            how = f"exited 0 without writing its report ({REPORT_PATH_ENV})"
        else:
            how = f"exited with {self.returncode}"
        shown = list(self.command)
        if "-c" in shown:
            shown[shown.index("-c") + 1] = "<code>"
        return (
            f"fresh process {how}: {' '.join(shown)}\n"
            f"--- stderr (tail) ---\n{self.stderr[-_STDERR_TAIL:]}\n"
            f"--- stdout (tail) ---\n{self.stdout[-_STDOUT_TAIL:]}"
        )


class FreshProcess:
    """A running child; :meth:`report` or :meth:`failure` waits for it.

    Usable as a context manager: leaving the block kills a child still running.
    """

    def __init__(
        self,
        command: list[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: Mapping[str, str | None] | None = None,
        pythonpath: Sequence[str | os.PathLike[str]] = (),
        fresh_inductor_cache: bool = False,
        timeout: float | None = None,
    ) -> None:
        self.command = command
        self.timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
        self._scratch = tempfile.mkdtemp(prefix="fresh-process-")
        self._report_path = os.path.join(self._scratch, "report.json")
        if cwd is None:
            cwd = os.path.join(self._scratch, "cwd")
            os.mkdir(cwd)
        cache = None
        if fresh_inductor_cache:
            cache = os.path.join(self._scratch, "inductor-cache")
            os.mkdir(cache)
        child_env = fresh_env(env=env, pythonpath=pythonpath, inductor_cache=cache)
        child_env[REPORT_PATH_ENV] = self._report_path
        self._finished: Finished | None = None
        self._proc = subprocess.Popen(
            command,
            cwd=cwd,
            env=child_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self._cleanup = weakref.finalize(self, _kill_and_remove, self._proc, self._scratch)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def finish(self) -> Finished:
        """Waits for the child (killing it at its timeout) and returns what it left."""
        if self._finished is not None:
            return self._finished
        timed_out = False
        try:
            stdout, stderr = self._proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(self._proc)
            stdout, stderr = self._proc.communicate()
        else:
            # Compile workers and other stragglers of a child that exited go with it.
            _kill_group(self._proc, even_if_exited=True)
        reported = os.path.exists(self._report_path)
        report = None
        if reported:
            with open(self._report_path) as f:
                report = json.load(f)
        self._finished = Finished(
            self.command, self._proc.returncode, stdout, stderr, timed_out, reported, report
        )
        self._cleanup()
        return self._finished

    def report(self) -> Any:
        """The child's report; raises AssertionError unless it exited 0 having written one."""
        done = self.finish()
        if not done.ok:
            raise AssertionError(done.describe())
        return done.report

    def failure(self) -> Finished:
        """What a child that must fail left; raises AssertionError if it exited 0
        or timed out (a hang is not the failure a test expects)."""
        done = self.finish()
        if done.timed_out or done.returncode == 0:
            raise AssertionError("expected the fresh process to fail, but it " + done.describe())
        return done

    def kill(self) -> None:
        """Kills the child and everything it started."""
        _kill_group(self._proc)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._finished is None:
            self.kill()
            self.finish()


def _python() -> list[str]:
    return [sys.executable, "-P"] if sys.flags.safe_path else [sys.executable]


def start_code(code: str, *argv: str | os.PathLike[str], **options: Any) -> FreshProcess:
    """Starts ``python -c code argv...`` in a fresh interpreter (NOTE: [Fresh-process
    tests]); ``sys.argv[1:]`` is ``argv`` there. ``options`` are FreshProcess's:
    cwd, env, pythonpath, fresh_inductor_cache, timeout."""
    return FreshProcess([*_python(), "-c", code, *(os.fspath(a) for a in argv)], **options)


def start_script(
    script: str | os.PathLike[str], *argv: str | os.PathLike[str], **options: Any
) -> FreshProcess:
    """Starts ``python script argv...`` in a fresh interpreter (NOTE: [Fresh-process
    tests]), with :func:`start_code`'s options. Without ``-P`` the script's
    directory is on its sys.path, as usual."""
    return FreshProcess(
        [*_python(), os.fspath(script), *(os.fspath(a) for a in argv)], **options
    )


def run_code(code: str, *argv: str | os.PathLike[str], **options: Any) -> Any:
    """Runs ``code`` in a fresh interpreter to its end and returns its report.

    Takes :func:`start_code`'s options. Raises AssertionError (exit code, stderr
    and stdout tails) if the child fails, times out or writes no report.
    """
    return start_code(code, *argv, **options).report()


def run_script(script: str | os.PathLike[str], *argv: str | os.PathLike[str], **options: Any) -> Any:
    """Runs ``script`` in a fresh interpreter to its end and returns its report;
    as :func:`run_code`."""
    return start_script(script, *argv, **options).report()


def reports(processes: Sequence[FreshProcess]) -> list[Any]:
    """The reports of children that run side by side (ranks, concurrent loaders).

    Waits for all of them first, then raises one AssertionError describing every
    child that failed, timed out or wrote no report, so that a failure of one
    shows what the others were doing.
    """
    finished = [p.finish() for p in processes]
    failed = [(i, done) for i, done in enumerate(finished) if not done.ok]
    if failed:
        raise AssertionError(
            f"{len(failed)} of {len(finished)} fresh processes failed\n"
            + "\n".join(f"=== process {i}: {done.describe()}" for i, done in failed)
        )
    return [done.report for done in finished]


# NOTE: [Ranks in fresh processes]
# A distributed test runs each rank as its own fresh process: the test file
# started again as ``script --worker <json>``, the json holding the rank, the
# world size, a file store the ranks join through and the phase's timeout (plus
# what the test passes). The ranks of one phase share an empty inductor cache,
# one OpenMP thread and one compile thread (Inductor's parallel compile forks,
# and a fork after gloo has started its threads can deadlock the child). A
# worker prints every thread's stack and exits shortly before the timeout, so
# a hang says where it is, and leaves without tearing gloo down once its last
# barrier passed (a known teardown hang, pytorch#75097).


def run_ranks(
    script: str | os.PathLike[str],
    workdir: str | os.PathLike[str],
    world_size: int,
    timeout: float,
    rank_args: Any = None,
    **args: Any,
) -> list[Any]:
    """Runs ``script --worker <json>`` once per rank, side by side, and returns
    the ranks' reports, process i being rank i (NOTE: [Ranks in fresh
    processes]). ``args`` go to every rank; ``rank_args(rank)``, if given, adds
    a rank's own."""
    store = os.path.join(tempfile.mkdtemp(dir=workdir), "store")
    env = {
        "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(dir=workdir, prefix="inductor_cache_"),
        "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    processes = []
    try:
        for rank in range(world_size):
            worker_args = {
                "rank": rank, "world_size": world_size, "store": store, "timeout": timeout,
                **args, **(rank_args(rank) if rank_args is not None else {}),
            }
            processes.append(
                start_script(script, "--worker", json.dumps(worker_args), env=env, timeout=timeout)
            )
        return reports(processes)
    finally:
        for process in processes:
            process.__exit__(None, None, None)


def rank_worker_main(argv: Sequence[str], worker: Any) -> None:
    """A rank's process (NOTE: [Ranks in fresh processes]): runs ``worker`` on
    the json in ``argv[0]``, reports its result and exits at once."""
    import faulthandler

    args = json.loads(argv[0])
    faulthandler.dump_traceback_later(float(args["timeout"]) - 20, exit=True)
    write_report(worker(args))
    sys.stdout.flush()
    os._exit(0)


def _kill_group(proc: subprocess.Popen[str], even_if_exited: bool = False) -> None:
    # The group id is the child's pid (start_new_session); Linux reuses no pid
    # that still names a process group, so this reaches only the child's own.
    if proc.poll() is not None and not even_if_exited:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _kill_and_remove(proc: subprocess.Popen[str], scratch: str) -> None:
    _kill_group(proc)
    shutil.rmtree(scratch, ignore_errors=True)
