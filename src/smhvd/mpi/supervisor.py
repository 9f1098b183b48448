"""Run one command (mpirun, or a single rank) to its end: its stderr, signals, orphans, the role's duties.

A stop (SageMaker's SIGTERM, Ctrl-C) sends SIGTERM to this host's ranks, after a stack dump, so each can
checkpoint; mpirun ends when they do. When Open MPI announced an abort and mpirun has not exited ABORT_GRACE
later (ranks stuck in a collective or MPI_Finalize), it gets SIGTERM, then SIGKILL after KILL_GRACE.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from smhvd.errors import EX_MPI_ABORT, exit_status
from smhvd.link import HEARTBEAT_INTERVAL
from smhvd.mpi.output import StderrFilter
from smhvd.proc import processes
from smhvd.proc.loop import Scope, process_loop
from smhvd.proc.processes import die_with_parent, drain_pipe, signal_pids, terminate_local_ranks, write_all
from smhvd.proc.signals import SignalWatch
from smhvd.proc.timers import Timer, Timers
from smhvd.report.stacks import STOP_DUMP_WAIT, AfterDump, Dumps

log = logging.getLogger("smhvd")
ABORT_GRACE = 5.0  # Open MPI said the job aborts -> mpirun gets SIGTERM if still running after this long
KILL_GRACE = 3.0
# After a stop (SageMaker's SIGTERM), ranks that have not ended this long after it are killed, before
# SageMaker's own SIGKILL at 120 s, so the launcher still reports; a second stop signal kills at once.
STOP_KILL_AFTER = 100.0


@dataclass
class Outcome:
    exit_code: int
    output: StderrFilter
    stopped: bool
    ended_hung_abort: bool = False  # Open MPI announced an abort and mpirun had to be ended by the launcher


class Role(Protocol):
    """What this host's role does while the command runs."""

    keep: Sequence[int]  # its own children, whose exits it waits for (never reaped here as orphans)
    dumps: Dumps  # when and how stack dumps of every rank are taken

    def heartbeat(self) -> None:
        """Every HEARTBEAT_INTERVAL (the leader tells its workers that it is alive)."""

    def stopping(self) -> None:
        """A stop reached this host's ranks (the leader passes it on to its workers)."""

    def inflight_reports(self, lines: bytes) -> None:
        """The ranks' in-flight reports (wire.INFLIGHT lines), as they come (the leader judges them)."""


@dataclass
class Alone:
    """A script run once on its host, with nobody to tell (MPI disabled)."""

    keep: Sequence[int] = ()
    dumps: Dumps = field(default_factory=lambda: Dumps(lambda _why: None))

    def heartbeat(self) -> None:
        pass

    def stopping(self) -> None:
        pass

    def inflight_reports(self, lines: bytes) -> None:
        pass


def supervise(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path, watch: SignalWatch, role: Role
) -> Outcome:
    """Run argv to its end, `role`'s heartbeat every HEARTBEAT_INTERVAL, its stack dumps when due (SIGUSR1, a
    stop, a Horovod stall, silence), `watch` read for stop signals."""
    output = StderrFilter(inflight=role.inflight_reports)
    proc = _start(argv, env, cwd)
    assert proc.stderr is not None
    stderr = proc.stderr
    timers = Timers()
    timers.every(Timer("heartbeat"), HEARTBEAT_INTERVAL, role.heartbeat)
    role.dumps.start(timers)
    with contextlib.ExitStack() as stack:
        stack.callback(stderr.close)
        scope = stack.enter_context(process_loop().scope(timers))
        hung = HungAbort(lambda: proc.poll() is None, proc.terminate, lambda: _kill(proc), timers, scope.stop)
        stop = Stop(proc, {proc.pid, *role.keep}, role, timers, scope)

        def read() -> None:
            data = os.read(stderr.fileno(), 65536)
            if not data:
                scope.stop()
                return
            _show(output, output.feed(data))
            role.dumps.heard(output.stall_notice is not None)
            if output.abort_notice is not None:
                hung.announced(output.abort_notice)

        def exited() -> None:
            # The job ends when the command does, not when every copy of its stderr closes (a process it
            # left behind may hold one): take what is in the pipe, stop reading.
            for data in drain_pipe(stderr.fileno()):  # bounded: a leftover process may keep writing
                _show(output, output.feed(data))
            scope.stop()

        scope.reader(stderr, read)
        scope.reader(watch, functools.partial(stop.signals, watch))
        scope.exit_of(proc.pid, exited)
        scope.run()
        _show(output, output.flush())
        code = proc.wait()
        remove_session_dir(proc.pid, env)
    if hung.ended:
        return Outcome(exit_code=EX_MPI_ABORT, output=output, stopped=stop.requested, ended_hung_abort=True)
    return Outcome(exit_code=exit_status(code), output=output, stopped=stop.requested)


def _start(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: die_with_parent(signal.SIGTERM),  # noqa: PLW1509  (no job outlives the launcher)
        start_new_session=True,  # Ctrl-C reaches the launcher alone, which stops the ranks in order
    )


class Stop:
    """Stop requests while the command runs: the first takes a stack dump, then (AfterDump) SIGTERM to the
    local ranks, and the role hears of it; STOP_KILL_AFTER later, or at a second stop, they are killed with
    mpirun. SIGUSR1 takes a stack dump."""

    def __init__(
        self, proc: subprocess.Popen[bytes], keep_pids: set[int], role: Role, timers: Timers, loop: Scope
    ) -> None:
        self.proc, self.keep_pids, self.role, self.timers, self.loop = proc, keep_pids, role, timers, loop
        self.dumps = role.dumps
        self.requested = False
        self.kill_timer = Timer("the kill after a stop")
        self.after_dump: AfterDump | None = None

    def signals(self, watch: SignalWatch) -> None:
        got = watch.receive(self.keep_pids)
        if got.dump:
            self.dumps.dump("SIGUSR1")
        if got.stop is None:
            return
        name = signal.Signals(got.stop).name
        if self.requested:
            if self.after_dump is not None:
                self.after_dump.now()  # the workers hear of it, if the dump still runs
            log.warning("stopped again by %s: killing mpirun and this host's ranks now", name)
            _kill(self.proc)
            return
        self.requested = True
        why = f"stopped by {name}"
        self.dumps.dump(why)  # the ranks' stacks before they are stopped
        self.after_dump = AfterDump(
            self.loop, self.dumps, STOP_DUMP_WAIT, functools.partial(self._terminate, why)
        )
        self.after_dump.start()

    def _terminate(self, why: str) -> None:
        """SIGTERM to the local ranks, the workers told, the kill timer set."""
        log.warning("%s: SIGTERM sent to %d local rank(s)", why, terminate_local_ranks())
        self.role.stopping()
        self.timers.after(self.kill_timer, STOP_KILL_AFTER, self._late)

    def _late(self) -> None:
        if self.proc.poll() is None:
            log.warning(
                "ranks still running %gs after the stop: killing mpirun and this host's ranks",
                STOP_KILL_AFTER,
            )
            _kill(self.proc)


def _show(output: StderrFilter, shown: bytes) -> None:
    """What mpirun's stderr shows: the ranks' stdout lines to stdout, the rest to stderr."""
    write_all(1, output.take_stdout())
    write_all(2, shown)


def session_dirs(pid: int, env: Mapping[str, str]) -> list[Path]:
    """The session directory mpirun `pid` made (Open MPI 4: TMPDIR/ompi.<node>.<uid>/pid.<pid>; its temp
    dir is TMPDIR, else TEMP, else TMP, else /tmp)."""
    tmp = Path(env.get("TMPDIR") or env.get("TEMP") or env.get("TMP") or "/tmp")
    return sorted(tmp.glob(f"ompi.*.{os.getuid()}/pid.{pid}"))


def remove_session_dir(pid: int, env: Mapping[str, str]) -> None:
    """Remove what mpirun `pid` left in its temp dir (it does so itself only when it ends cleanly)."""
    for directory in session_dirs(pid, env):
        shutil.rmtree(directory, ignore_errors=True)
        with contextlib.suppress(OSError):
            directory.parent.rmdir()  # only when empty: another job on this host may use it


class HungAbort:
    """Ends mpirun when Open MPI announced an abort and mpirun does not exit by itself: `terminate` after
    ABORT_GRACE, `kill` KILL_GRACE later, and after another KILL_GRACE `give_up` (the loop stops reading
    output that something mpirun started may hold open). Each step is a timer, taken while mpirun runs."""

    def __init__(
        self,
        running: Callable[[], bool],
        terminate: Callable[[], object],
        kill: Callable[[], object],
        timers: Timers,
        give_up: Callable[[], object] = lambda: None,
    ) -> None:
        self.running, self.terminate, self.kill, self.timers = running, terminate, kill, timers
        self.on_give_up = give_up
        self.notice: str | None = None
        self.ended = False  # the launcher ended mpirun
        self.gave_up = False
        self.term_timer = Timer("abort: terminate")
        self.kill_timer = Timer("abort: kill")
        self.give_up_timer = Timer("abort: give up")

    def announced(self, notice: str) -> None:
        if self.notice is None:
            self.notice = notice
            self.timers.after(self.term_timer, ABORT_GRACE, self._term)

    def _term(self) -> None:
        if not self.running():
            return
        log.error("Open MPI aborted the job (%s) and mpirun did not exit: ending it", self.notice)
        self.ended = True
        self.terminate()
        self.timers.after(self.kill_timer, KILL_GRACE, self._kill)

    def _kill(self) -> None:
        if not self.running():
            return
        self.kill()
        self.timers.after(self.give_up_timer, KILL_GRACE, self._give_up)

    def _give_up(self) -> None:
        self.gave_up = True
        self.on_give_up()


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """mpirun and this host's ranks, at once."""
    proc.kill()
    signal_pids(processes.local_ranks(), signal.SIGKILL)
