"""Run one command (mpirun, or a single rank) to its end: stream its stderr, handle signals, reap orphans.

On a stop signal (SIGTERM from SageMaker, Ctrl-C) the ranks *on this host* get SIGTERM directly, so every
rank can save a checkpoint; the command itself is left to end when they do.

When Open MPI announces that the job aborts (ranks that cannot reach each other, MPI_Abort, a lost daemon) and
mpirun has not exited ABORT_GRACE seconds later, it never will by itself (ranks stuck in a collective or in
MPI_Finalize): mpirun gets SIGTERM, which ends the ranks on every host, then SIGKILL after KILL_GRACE.
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

from smhvd.errors import EX_MPI_ABORT, exit_status
from smhvd.mpi.output import StderrFilter
from smhvd.proc.lines import write_all
from smhvd.proc.loop import Scope, process_loop
from smhvd.proc.processes import descendants, die_with_parent, drain_pipe, is_rank_wrapper, signal_pids
from smhvd.proc.signals import SignalWatch
from smhvd.proc.timers import Timer, Timers
from smhvd.wire import HEARTBEAT_INTERVAL

log = logging.getLogger("smhvd")
ABORT_GRACE = 5.0  # Open MPI said the job aborts -> mpirun gets SIGTERM if still running after this long
KILL_GRACE = 3.0
# On a stop, the ranks get SIGTERM once the stack dump has ended, or this long after the stop if it has not
# (the loop runs meanwhile: output, heartbeats, a second stop).
STOP_DUMP_WAIT = 8.0
# After a stop (SageMaker's SIGTERM), ranks that have not ended this long after it are killed, before
# SageMaker's own SIGKILL at 120 s, so the launcher still reports; a second stop signal kills at once.
STOP_KILL_AFTER = 100.0


@dataclass
class Outcome:
    exit_code: int
    output: StderrFilter
    stopped: bool
    ended_hung_abort: bool = False  # Open MPI announced an abort and mpirun had to be ended by the launcher


def local_ranks() -> list[int]:
    """Rank wrappers started on this host by this launcher (directly, by mpirun or by orted)."""
    return [pid for pid in descendants() if is_rank_wrapper(pid)]


def terminate_local_ranks(why: str, after: str = "") -> None:
    """SIGTERM to this host's ranks, said in the log (the leader's and every worker's one way)."""
    ranks = local_ranks()
    signal_pids(ranks, signal.SIGTERM)
    log.warning("%s: SIGTERM sent to %d local rank(s)%s", why, len(ranks), after)


def supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    keep: Sequence[int] = (),
    watch: SignalWatch | None = None,
    tick: Callable[[], object] | None = None,
    tick_interval: float = HEARTBEAT_INTERVAL,
    dumps: Dumps | None = None,
    on_stop: Callable[[], object] = lambda: None,
) -> Outcome:
    """Run argv to its end. `tick` (the leader's heartbeat to its workers) is called every tick_interval;
    `dumps` says when to take stack dumps of every rank (SIGUSR1, a stop, a Horovod stall, silence);
    `on_stop` runs once a stop request reached the local ranks (the leader passes it on to its workers)."""
    output = StderrFilter()
    dumps = dumps or Dumps(lambda _why: None)
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: die_with_parent(signal.SIGTERM),  # noqa: PLW1509  (no job outlives the launcher)
        # Its own session: a signal to the launcher's process group (a terminal's Ctrl-C, `timeout`, a shell
        # killing its job) reaches the launcher alone, which stops the ranks in order (stack dumps first).
        start_new_session=True,
    )
    assert proc.stderr is not None
    stderr = proc.stderr
    timers = Timers()
    if tick is not None:
        timers.every(Timer("heartbeat"), tick_interval, tick)
    dumps.start(timers)
    with contextlib.ExitStack() as stack:
        stack.callback(stderr.close)
        if watch is None:
            watch = stack.enter_context(SignalWatch())
        scope = stack.enter_context(process_loop().scope(timers))
        hung = HungAbort(lambda: proc.poll() is None, proc.terminate, lambda: _kill(proc), timers, scope.stop)
        stop = Stop(proc, {proc.pid, *keep}, dumps, on_stop, timers, scope)

        def read() -> None:
            data = os.read(stderr.fileno(), 65536)
            if not data:
                scope.stop()
                return
            _show(output, output.feed(data))
            dumps.heard(output)
            if output.abort_notice is not None:
                hung.announced(output.abort_notice)

        def exited() -> None:
            # The job ends when the command does, not when every copy of its stderr closes (a process it
            # left behind may hold one): take what is in the pipe, stop reading.
            _drain(stderr.fileno(), output)
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


class AfterDump:
    """Call `then` once, when the stack dump just started has ended (`dumps.finished` readable on the loop),
    or `wait` seconds after `start` if it has not; `now` calls it at once. The loop runs on meanwhile."""

    def __init__(self, loop: Scope, dumps: Dumps, wait: float, then: Callable[[], object]) -> None:
        self.loop, self.dumps, self.wait, self.then = loop, dumps, wait, then
        self.timer = Timer("the wait for a stack dump")
        self.watched: int | None = None  # the dump's `finished` fd while the loop waits on it
        self.done = False

    def start(self) -> None:
        if self.dumps.finished is None:  # `dump` returned when it was done
            self.now()
            return
        self.watched = self.dumps.finished
        self.loop.reader(self.watched, self.now)
        self.loop.timers.after(self.timer, self.wait, self.now)

    def now(self) -> None:
        if self.done:
            return
        self.done = True
        if self.watched is not None:
            self.loop.timers.cancel(self.timer)
            self.loop.forget(self.watched)
            self.watched = None
        self.then()


class Stop:
    """Stop requests while the command runs: the first takes a stack dump, and once it has ended (or
    STOP_DUMP_WAIT later) the local ranks get SIGTERM and the workers hear of it (`on_stop`); the loop runs
    on meanwhile. Ranks that have not ended STOP_KILL_AFTER later are killed with mpirun, and a second stop
    signal kills them at once. SIGUSR1 takes a stack dump."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        keep_pids: set[int],
        dumps: Dumps,
        on_stop: Callable[[], object],
        timers: Timers,
        loop: Scope,
    ) -> None:
        self.proc, self.keep_pids, self.dumps, self.on_stop, self.timers, self.loop = (
            proc,
            keep_pids,
            dumps,
            on_stop,
            timers,
            loop,
        )
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
        terminate_local_ranks(why)
        self.on_stop()
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


def _drain(fd: int, output: StderrFilter) -> None:
    """Pass on what is already in the pipe (bounded: a leftover process may keep writing)."""
    for data in drain_pipe(fd):
        _show(output, output.feed(data))


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


@dataclass
class Dumps:
    """When to take stack dumps of every rank (stacks.py), besides SIGUSR1 and a stop: once when Horovod
    reports a stall, and once per silence when no rank has written anything for `silence` seconds (a timer
    of the supervisor's loop, set again by every output)."""

    dump: Callable[[str], object]  # starts a dump in the background
    finished: int | None = None  # readable once the dump last started has ended (None: `dump` returns then)
    silence: float | None = None  # launcher_hang_dump_seconds
    stall_dumped: bool = False
    timers: Timers | None = None
    silence_timer: Timer = field(default_factory=lambda: Timer("silence"))

    def start(self, timers: Timers) -> None:
        self.timers = timers
        self._listen_for_silence()

    def heard(self, output: StderrFilter) -> None:
        """Some rank wrote: the silence starts again; a stall Horovod reported is dumped once."""
        self._listen_for_silence()
        if output.stall_notice is not None and not self.stall_dumped:
            self.stall_dumped = True
            self.dump("Horovod reported a stall")

    def _listen_for_silence(self) -> None:
        if self.silence is not None and self.timers is not None:
            self.timers.after(self.silence_timer, self.silence, self._silent)

    def _silent(self) -> None:
        self.dump(f"no output from any rank for {self.silence:g}s")


class HungAbort:
    """Ends mpirun when Open MPI announced an abort and mpirun does not exit by itself: `terminate` after
    ABORT_GRACE, `kill` KILL_GRACE later, and after another KILL_GRACE the loop gives up reading the output
    that something mpirun started may still hold open (`gave_up`). Each step is a timer of the loop, taken
    only while mpirun runs; `give_up` ends the loop."""

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
    signal_pids(local_ranks(), signal.SIGKILL)
