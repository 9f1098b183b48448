"""A worker (every host but the leader): sshd and the leader's link from `train`'s start, then the job's end.

Its life is a `State` (WAITING -> LINKED -> RUNNING -> STOPPING, `NEXT`), and what each happening means is
read from it, in one place (`Worker`):
- the leader's `linked`: WAITING -> LINKED; `start`: LINKED -> RUNNING; `end`: the worker exits with the
  leader's code and reason (before the start: "the leader ... ended the job before it started: ...");
- its link closes: WAITING, an attempt the leader gave up (the wait goes on); LINKED, the leader ended
  before the start: exit 69 at once; RUNNING, the leader was lost: exit 69; STOPPING: exit 143;
- a stop signal: before the start, exit 143; RUNNING, a stack dump, then SIGTERM to this host's ranks, and
  STOPPING (the verdict still comes from the leader);
- deadlines: before the start, launcher_leader_timeout_seconds from `train`'s start (69); RUNNING,
  SILENCE_LIMIT without a word (69); STOPPING, STOP_GRACE (143).
The link's events are handled from `__enter__` on, whoever runs the process's loop (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from smhvd.config.job import Job
from smhvd.config.launcher_options import LauncherOwnOptions
from smhvd.env_options import read_env_options
from smhvd.errors import EX_STOPPED, EX_UNAVAILABLE, Ended, PeerError, exit_for, exit_status
from smhvd.hostenv import server
from smhvd.hostenv.trust import directory
from smhvd.link import END, LINKED, PREPARED, PREPARING, SILENCE_LIMIT, START, STOP, Event
from smhvd.link.listen import Connection, Listener, listening
from smhvd.option_spec import key_of
from smhvd.proc.loop import process_loop, wait_exits
from smhvd.proc.processes import die_with_parent, terminate_local_ranks
from smhvd.proc.signals import SignalWatch
from smhvd.proc.timers import Timer
from smhvd.report import failure
from smhvd.report.stacks import STOP_DUMP_WAIT, AfterDump, Dumps, StackDumper
from smhvd.roles.sshd import start_sshd

log = logging.getLogger("smhvd")
OUTSIDE_STOP_GRACE = 10.0  # a script outside MPI gets SIGTERM when the job ends, then SIGKILL after this
STOP_GRACE = 110.0  # after SIGTERM, how long to wait for the leader's verdict (SageMaker kills at 120 s)


class State(enum.Enum):
    WAITING = "waiting for the leader"
    LINKED = "linked to the leader, waiting for the job's start"
    RUNNING = "the job runs"
    STOPPING = "stopped, waiting for the leader's verdict"


NEXT = {State.WAITING: (State.LINKED,), State.LINKED: (State.RUNNING,), State.RUNNING: (State.STOPPING,)}
BEFORE_START = (State.WAITING, State.LINKED)
LOST = "lost the leader {} during the job: its link closed without a result (host down or launcher killed)"
ENDED = "the leader {} ended before the job started: its link closed without a word"
LINK_CLOSED: dict[State, tuple[int, str] | None] = {  # what the leader's link closing means (None: nothing)
    State.WAITING: None,  # an attempt it gave up: the wait goes on
    State.LINKED: (EX_UNAVAILABLE, ENDED),
    State.RUNNING: (EX_UNAVAILABLE, LOST),
    State.STOPPING: (EX_STOPPED, LOST),
}


class OutsideScript:
    """The entry point run once on a host outside the MPI instance groups (config/instance_groups.py), as the
    toolkit does."""

    def __init__(self, command: Sequence[str], env: Mapping[str, str], cwd: Path, host: str) -> None:
        self.host = host
        self.proc = subprocess.Popen(
            list(command),
            env=dict(env),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509
        )
        self.reported = False

    def check(self) -> None:
        """Ended (the job fails with it) when the script failed; a success waits for the job's end."""
        code = self.proc.poll()
        if code is None or self.reported:
            return
        self.reported = True
        if code == 0:
            log.info("the script finished on %s; waiting for the MPI job to end", self.host)
            return
        code = exit_status(code)
        raise Ended(
            code, f"the script on {self.host} (outside the MPI instance groups) exited with code {code}"
        )

    def stop(self) -> None:
        if self.proc.poll() is None:
            log.info("the job ended: stopping the script on %s", self.host)
            self.proc.terminate()
            if not wait_exits([self.proc.pid], OUTSIDE_STOP_GRACE):
                self.proc.kill()
        self.proc.wait()


class Worker:
    """One worker's life (the module's table). A context manager: from its start this host's `train` claims
    its private directory, listens for the leader's link there and runs sshd; its end takes them down."""

    def __init__(self, job: Job, run_dir: Path) -> None:
        self.job, self.run_dir = job, run_dir
        self.leader = job.leader
        self.port = read_env_options(os.environ).ssh_port
        self.state = State.WAITING
        self.stack = contextlib.ExitStack()
        self.loop = process_loop().scope()
        self.start_timer = Timer("the job's start")
        self.silence_timer = Timer("the leader's silence")
        self.grace_timer = Timer("the grace for the leader's verdict")
        dumper = StackDumper(
            job.resources.current_host, job.paths.output_data_dir, [], None, "this host's ranks"
        )
        self.dumper = dumper
        self.dumps = Dumps(dumper.start, dumper.finished)
        self.keep: list[int] = []  # the children whose exits this worker waits for (sshd, a script)
        self.script: OutsideScript | None = None
        self.link: Connection | None = None  # the leader's link, once it said `linked`
        self.word = Event(PREPARING, reason="starting")  # how its preparation goes: the leader's to hear

    def __enter__(self) -> Worker:
        try:
            place = self.stack.enter_context(server.claimed(directory(self.port)))
            self.stack.enter_context(self.loop)
            self.listener = Listener(
                self.stack.enter_context(listening(place)), self.loop, self._event, self._closed
            )
            sshd = start_sshd(self.run_dir, self.port)
            self.stack.callback(sshd.wait)
            self.stack.callback(sshd.terminate)
            self.keep.append(sshd.pid)
        except BaseException:
            self.stack.close()
            raise
        timeout = self.job.options.launcher.leader_timeout
        self.loop.timers.after(self.start_timer, timeout, self._not_started)
        log.info(
            "sshd listening on port %d; waiting for the leader %s (up to %gs)",
            self.port,
            self.leader,
            timeout,
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc is not None and not isinstance(exc, Ended | PeerError) and self.word.kind != PREPARED:
            self._say(Event(END, *exit_for(exc)))  # why this host could not prepare: the job's cause
        self.dumper.finish(STOP_DUMP_WAIT)
        if self.script is not None:
            self.script.stop()
        self.stack.close()

    def preparing(self, step: str) -> None:
        """The preparation step this host is in, for the leader's log while it waits for it (issue 53.1)."""
        self._say(Event(PREPARING, reason=step))

    def prepared(self) -> None:
        """This host is ready to run the job: the leader may start it once every host is."""
        self._say(Event(PREPARED))

    def _say(self, word: Event) -> None:
        """`word` to the leader now if linked, else once it is (only the last word counts)."""
        self.word = word
        if self.link is not None:
            with contextlib.suppress(OSError):  # a link that broke: the worker hears it on its own
                self.link.sock.sendall(word.encode())

    def serve(self, env: Mapping[str, str]) -> None:
        """This host's ranks' environment, held for them until the end (hostenv/server.py)."""
        self.stack.enter_context(server.serving(directory(self.port), env))

    def run_outside(self, command: Sequence[str], env: Mapping[str, str], cwd: Path) -> None:
        """A host outside the MPI instance groups runs the script once, beside the job."""
        self.script = OutsideScript(command, env, cwd, self.job.resources.current_host)
        self.keep.append(self.script.proc.pid)

    def wait(self, what: str = "job") -> int:
        """Until the job's verdict; its exit code, said in the log (and the failure file when it failed).
        `what`: the job, or the pre-flight when it is the job (`train preflight`: no script ran)."""
        verdict = Ended(EX_UNAVAILABLE, "the wait for the leader ended without its verdict")
        with SignalWatch() as watch:
            self.loop.reader(watch, functools.partial(self._signals, watch))
            try:
                self.loop.run()
            except Ended as ended:
                verdict = ended
            finally:
                self.loop.close()  # the verdict is in: what the link does from now on means nothing
        code, reason = verdict.exit_code, str(verdict)
        if code == EX_STOPPED:
            log.info("%s stopped (exit %d)", what, code)
        elif code == 0:
            log.info("%s", "job succeeded (exit 0)" if what == "job" else f"{what} ended well (exit 0)")
        if code in (0, EX_STOPPED):
            return code
        text = reason or f"the job failed with exit code {code} (see {self.leader}'s log)"
        failure.write_failure(self.job.paths.failure_file, text)
        log.error("job failed (exit %d): %s", code, text.splitlines()[0])
        return code

    def _to(self, state: State) -> None:
        if state not in NEXT.get(self.state, ()):
            raise AssertionError(f"a worker cannot go from {self.state.name} to {state.name}")
        log.debug("worker: %s -> %s", self.state.name, state.name)
        self.state = state

    def _event(self, connection: Connection, event: Event) -> None:
        if self.state is State.RUNNING:  # any word from the leader: it is alive
            self.loop.timers.after(self.silence_timer, SILENCE_LIMIT, self._leader_silent)
        if event.kind == LINKED and self.state is State.WAITING:
            self._to(State.LINKED)
            self.link = connection
            self._say(self.word)
        elif event.kind == START and self.state is State.LINKED:
            self._to(State.RUNNING)
            self.loop.timers.cancel(self.start_timer)
            self.loop.timers.after(self.silence_timer, SILENCE_LIMIT, self._leader_silent)
            log.info("job started by %s", self.leader)
        elif event.kind == STOP:
            self._stop(f"the leader {self.leader} was stopped")
        elif event.kind == END and self.state in BEFORE_START:
            head, _, detail = event.reason.partition("\n")
            said = f"the leader {self.leader} ended the job before it started (exit {event.exit_code})"
            raise Ended(event.exit_code, failure.compose(f"{said}: {head}" if head else said, detail))
        elif event.kind == END:
            raise Ended(event.exit_code, event.reason)

    def _closed(self, connection: Connection) -> None:
        """A connection's end: an attempt the leader gave up is nothing; its link's, what LINK_CLOSED says."""
        meaning = LINK_CLOSED[self.state] if connection.linked else None
        if meaning is not None:
            raise Ended(meaning[0], f"{meaning[1].format(self.leader)}; see {self.leader}'s log")

    def _not_started(self) -> None:
        key = key_of(LauncherOwnOptions, "leader_timeout")
        timeout = self.job.options.launcher.leader_timeout
        raise PeerError(f"the leader {self.leader} did not start the job within {timeout:g}s ({key})")

    def _leader_silent(self) -> None:
        raise Ended(
            EX_UNAVAILABLE,
            f"lost the leader {self.leader} during the job: no word from it for {SILENCE_LIMIT:g}s "
            f"(leader host down or unreachable); see {self.leader}'s log",
        )

    def _signals(self, watch: SignalWatch) -> None:
        got = watch.receive(self.keep)
        if got.dump:
            self.dumps.dump("SIGUSR1")
        if got.stop is not None:
            self._stop(f"{signal.Signals(got.stop).name} received")
        if got.child and self.script is not None:
            self.script.check()

    def _stop(self, why: str) -> None:
        """A stop (this host's SIGTERM, or the leader's `stop`), as the module's table says."""
        if self.state in BEFORE_START:
            raise Ended(EX_STOPPED, "")
        if self.state is State.STOPPING:
            return
        self._to(State.STOPPING)
        self.loop.timers.cancel(self.silence_timer)
        self.loop.timers.after(self.grace_timer, STOP_GRACE, functools.partial(self._raise, EX_STOPPED))
        self.dumps.dump(f"stopped: {why}")

        def terminate() -> None:
            ranks = terminate_local_ranks()
            log.warning("stopped: %s: SIGTERM sent to %d local rank(s); waiting for the leader", why, ranks)

        AfterDump(self.loop, self.dumps, STOP_DUMP_WAIT, terminate).start()

    @staticmethod
    def _raise(code: int) -> None:
        raise Ended(code, "")
