"""A worker (every host but the leader): run sshd, wait for the leader's link, exit when the job ends.

The wait before the job starts is bounded (launcher_leader_timeout_seconds); once it started, the worker
waits for the leader's `end` event and exits with the job's exit code within milliseconds, or at once with
EX_UNAVAILABLE when the link closes without one (the leader died).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd import wire
from smhvd.config.job import Job
from smhvd.config.launcher_options import LauncherOwnOptions
from smhvd.env_options import read_env_options
from smhvd.errors import EX_STOPPED, EX_UNAVAILABLE, HostEnvError, PeerError, exit_status
from smhvd.mpi.supervisor import STOP_DUMP_WAIT, AfterDump, Dumps, terminate_local_ranks
from smhvd.option_spec import key_of
from smhvd.proc.loop import Scope, process_loop
from smhvd.proc.processes import die_with_parent, kill_descendants
from smhvd.proc.signals import SignalWatch
from smhvd.proc.timers import Timer, Timers
from smhvd.proc.trust import LINK_SOCKET, directory, peer_credentials
from smhvd.report import failure, stacks
from smhvd.roles import hostenv
from smhvd.roles.sshd import start_sshd

log = logging.getLogger("smhvd")
OUTSIDE_STOP_GRACE = 10.0  # a script outside MPI gets SIGTERM when the job ends, then SIGKILL after this
STOP_GRACE = 110.0  # after SIGTERM, how long to wait for the leader's verdict (SageMaker kills at 120 s)


@dataclass(frozen=True)
class Verdict:
    exit_code: int
    reason: str


@contextlib.contextmanager
def listening(place: Path) -> Iterator[socket.socket]:
    """The link socket the leader's relay connects to, in this `train`'s private directory (claimed by
    hostenv.serving: another user cannot reach it, and a second `train` for the port is refused there)."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = place / LINK_SOCKET
    try:
        try:
            server.bind(str(path))
        except OSError as exc:
            raise HostEnvError(f"cannot wait for the leader: {path}: {exc.strerror}") from None
        server.listen(16)
        server.setblocking(False)
        yield server
    finally:
        server.close()
        path.unlink(missing_ok=True)


class LinkWaiter:
    """Accepts the leader's link(s) and turns their lines into a Verdict."""

    def __init__(
        self,
        server: socket.socket,
        leader: str,
        start_timeout: float,
        watch: SignalWatch,
        silence_limit: float = wire.SILENCE_LIMIT,
        on_child: Callable[[], Verdict | None] | None = None,
        dumps: Dumps | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.server = server
        self.leader = leader
        self.start_timeout = start_timeout
        self.watch = watch
        self.silence_limit = silence_limit
        self.on_child = on_child  # called on SIGCHLD; a Verdict ends the wait (a script outside MPI failed)
        # Stack dumps of this host's ranks (SIGUSR1, and before a stop), in the background.
        self.dumps = dumps or Dumps(lambda _why: None)
        self.started = False
        self.stopping = False
        self.buffers: dict[socket.socket, bytes] = {}
        # One deadline at a time, each a timer of the loop: the job's start (start_timeout), then the
        # leader's silence (set again by every word from it), and after a stop the grace for its verdict.
        self.timers = Timers(clock)
        self.start_timer = Timer("the job's start")
        self.silence_timer = Timer("the leader's silence")
        self.stop_grace_timer = Timer("the grace for the leader's verdict")
        self.verdict: Verdict | None = None
        self.loop: Scope  # what `wait` watches on this process's loop, while it runs

    def wait(self, keep: list[int]) -> Verdict:
        self.timers.after(self.start_timer, self.start_timeout, self._not_started)
        self.loop = process_loop().scope(self.timers)
        with self.loop as loop:
            loop.reader(self.server, self._accept)
            loop.reader(self.watch, functools.partial(self._signals, keep))
            loop.run()
        assert self.verdict is not None
        return self.verdict

    def _decide(self, verdict: Verdict | None) -> None:
        """The wait ends with `verdict` (None: it goes on)."""
        if verdict is not None:
            self.verdict = verdict
            self.loop.stop()

    def _not_started(self) -> None:
        raise PeerError(
            f"the leader {self.leader} did not start the job within {self.start_timeout:g}s "
            f"({key_of(LauncherOwnOptions, 'leader_timeout')})"
        )

    def _leader_silent(self) -> None:
        self._decide(
            Verdict(
                EX_UNAVAILABLE,
                f"lost the leader {self.leader} during the job: no word from it for {self.silence_limit:g}s "
                f"(leader host down or unreachable); see {self.leader}'s log",
            )
        )

    def _stop_grace_over(self) -> None:
        self._decide(Verdict(EX_STOPPED, ""))

    def _heard(self) -> None:
        if self.started and not self.stopping:
            self.timers.after(self.silence_timer, self.silence_limit, self._leader_silent)

    def _accept(self) -> None:
        conn, _ = self.server.accept()
        if peer_credentials(conn)[1] == os.geteuid():
            log.debug("link from the leader connected")
            conn.setblocking(False)
            self.buffers[conn] = b""
            self.loop.reader(conn, functools.partial(self._receive, conn))
        else:
            conn.close()

    def _receive(self, conn: socket.socket) -> None:
        self._decide(self._read(conn))

    def _signals(self, keep: list[int]) -> None:
        got = self.watch.receive(keep)
        if got.dump:
            self.dumps.dump("SIGUSR1")
        if got.stop is not None:
            verdict = self._stop(f"{signal.Signals(got.stop).name} received")
            if verdict is not None:
                self._decide(verdict)
                return
        if got.child and self.on_child is not None:
            self._decide(self.on_child())

    def _stop(self, why: str) -> Verdict | None:
        """A stop (this host's SIGTERM, or the leader's `stop` event): this host's ranks get SIGTERM once,
        after a stack dump (the loop runs on meanwhile: AfterDump); the job's verdict still comes from the
        leader."""
        if self.stopping:
            return None
        self.stopping = True
        if not self.started:
            return Verdict(EX_STOPPED, "")
        self.timers.cancel(self.silence_timer)  # from now on only the grace for the leader's verdict counts
        self.timers.after(self.stop_grace_timer, STOP_GRACE, self._stop_grace_over)
        self.dumps.dump(f"stopped: {why}")
        then = functools.partial(terminate_local_ranks, f"stopped: {why}", "; waiting for the leader")
        AfterDump(self.loop, self.dumps, STOP_DUMP_WAIT, then).start()
        return None

    def _read(self, conn: socket.socket) -> Verdict | None:
        data = conn.recv(65536)
        self._heard()
        if not data:
            self.loop.forget(conn)
            self.buffers.pop(conn, None)
            conn.close()
            if self.started:  # the leader's session closed mid-job without a verdict
                return Verdict(
                    EX_STOPPED if self.stopping else EX_UNAVAILABLE,
                    f"lost the leader {self.leader} during the job: its link closed without a result "
                    f"(leader host down or launcher killed); see {self.leader}'s log",
                )
            return None  # an attempt the leader abandoned before the job started
        lines = (self.buffers[conn] + data).split(b"\n")
        self.buffers[conn] = lines.pop()
        for line in lines:
            event = wire.decode(line)
            if event is None:
                continue
            if event["event"] != "alive":  # heartbeats every 2 s would drown the debug log
                log.debug("link event: %s", event)
            if event["event"] == "start":
                self.started = True
                self.timers.cancel(self.start_timer)
                self._heard()
                log.info("job started by %s", self.leader)
            elif event["event"] == "stop":
                self._stop(f"the leader {self.leader} was stopped")
            elif event["event"] == "end":
                code = event.get("exit_code")
                return Verdict(
                    code if isinstance(code, int) else EX_UNAVAILABLE, str(event.get("reason") or "")
                )
        return None


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

    def check(self) -> Verdict | None:
        """A Verdict when the script failed (the job fails with it); a success waits for the job's end."""
        code = self.proc.poll()
        if code is None or self.reported:
            return None
        self.reported = True
        if code == 0:
            log.info("the script finished on %s; waiting for the MPI job to end", self.host)
            return None
        code = exit_status(code)
        return Verdict(
            code, f"the script on {self.host} (outside the MPI instance groups) exited with code {code}"
        )

    def stop(self, grace: float = OUTSIDE_STOP_GRACE) -> None:
        if self.proc.poll() is None:
            log.info("the job ended: stopping the script on %s", self.host)
            self.proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(grace)


def run_worker(
    job: Job,
    run_dir: Path,
    rank_env: Mapping[str, str],
    outside: tuple[Sequence[str], Path] | None = None,
) -> int:
    """`rank_env`: what this host's ranks get (its container's variables, its SM_* values; roles/hostenv.py).
    `outside`: (command, cwd) of the script a host outside the MPI instance groups runs once."""
    port = read_env_options(os.environ).ssh_port
    leader = job.leader
    host = job.resources.current_host
    with SignalWatch() as watch, contextlib.ExitStack() as stack:
        place = directory(port)
        stack.enter_context(hostenv.serving(place, rank_env))
        server = stack.enter_context(listening(place))
        sshd = start_sshd(run_dir, port)
        script = OutsideScript(outside[0], rank_env, outside[1], host) if outside else None
        log.info(
            "sshd listening on port %d; waiting for the leader %s (up to %gs)",
            port,
            leader,
            job.options.launcher.leader_timeout,
        )
        try:
            keep = [sshd.pid] + ([script.proc.pid] if script else [])
            dumper = stacks.StackDumper(host, job.paths.output_data_dir, [], None, "this host's ranks")
            waiter = LinkWaiter(
                server,
                leader,
                job.options.launcher.leader_timeout,
                watch,
                on_child=script.check if script else None,
                dumps=Dumps(dumper.start, dumper.finished),
            )
            verdict = waiter.wait(keep)
            dumper.finish(STOP_DUMP_WAIT)
            if script:
                script.stop()
        finally:
            sshd.terminate()
            sshd.wait()
            kill_descendants()
    if verdict.exit_code not in (0, EX_STOPPED):
        text = verdict.reason or f"the job failed with exit code {verdict.exit_code} (see {leader}'s log)"
        failure.write_failure(job.paths.failure_file, text)
        log.error("job failed (exit %d): %s", verdict.exit_code, text.splitlines()[0])
    else:
        log.info(
            "job %s (exit %d)",
            "stopped" if verdict.exit_code == EX_STOPPED else "succeeded",
            verdict.exit_code,
        )
    return verdict.exit_code
