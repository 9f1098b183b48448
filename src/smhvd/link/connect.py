"""The leader's side of the link: every worker reached at once, from the leader's start, while it prepares
the job (docs/architecture.md). A worker's sshd port is probed with a non-blocking connect first (an ssh
attempt against a closed port costs a process and a handshake); an open port gets an ssh attempt running the
relay (link/relay.py), at most MAX_SSH_IN_FLIGHT at once, whose READY links the worker. Until the job starts,
a link that closes is a worker that ended: PeerError; once it runs, that is mpirun's to see.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import shlex
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smhvd.errors import Ended, PeerError, Stopped
from smhvd.link import END, LINKED, PREPARED, PREPARING, READY, Event
from smhvd.link.relay import command as relay_command
from smhvd.proc.loop import process_loop, wait_exits
from smhvd.proc.processes import die_with_parent
from smhvd.proc.signals import SignalWatch
from smhvd.proc.timers import Timer, Timers

log = logging.getLogger("smhvd")
ATTEMPT_TIMEOUT = 15.0  # one ssh attempt: connect + start the relay
PROBE_TIMEOUT = 2.0  # one TCP connect to a worker's sshd port
PROBE_FIRST, PROBE_MAX = 0.05, 0.25  # re-probes of a refused port: x1.6 from the first, up to the most
MAX_SSH_IN_FLIGHT = 64  # ssh attempts at once (each is a process and a handshake on the leader)
CLOSE_TIMEOUT = 5.0
PROBE_IDENTIFICATION = b"SSH-2.0-smhvd_probe\r\n"  # an SSH client's first line (RFC 4253 4.2)
SAID_KEPT = 4096  # of what an attempt printed before READY, at most this much is kept (its last words)
PREPARE_LOG_EVERY = 30.0  # while the leader waits for workers to prepare, it says for whom this often
WORDS_KEPT = 1 << 16  # a worker's word (a line) longer than this is not one: cut

Address = tuple[socket.AddressFamily, tuple[Any, ...]]  # a socket family and an address of it
Resolve = Callable[[str, int], Sequence[Address]]
Command = Callable[[str], list[str]]


class WorkerLink:
    """One open ssh session to a worker's relay."""

    def __init__(self, host: str, proc: subprocess.Popen[bytes]) -> None:
        self.host, self.proc = host, proc

    def send(self, event: Event) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(event.encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return False
        return True

    def hang_up(self) -> None:
        """Close the session's input: the relay on the worker sees the end of it and exits."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()


def ssh_command(ssh_config: Path, host: str, remote: Sequence[str]) -> list[str]:
    """`remote` on another host of the job, over ssh with the job's client configuration, quoted for the
    remote shell (host names are validated, no leading '-'). Pure."""
    return ["ssh", "-F", str(ssh_config), host, shlex.join(remote)]


class Said:
    """An attempt's output searched for READY as it comes, in bounded memory: only what may still start
    READY is carried, and the last SAID_KEPT bytes for the error."""

    def __init__(self) -> None:
        self.carry = self.tail = b""

    def ready(self, chunk: bytes) -> bool:
        window = self.carry + chunk
        self.carry, self.tail = window[1 - len(READY) :], (self.tail + chunk)[-SAID_KEPT:]
        return READY in window


def addresses(host: str, port: int) -> list[Address]:
    """Where `host` takes TCP connections on `port`, in the resolver's order; socket.gaierror if nowhere."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [(family, address) for family, _, _, _, address in found]


def probe_delay(failures: int) -> float:
    """Seconds before probing again after `failures` refused probes in a row."""
    return float(min(PROBE_MAX, PROBE_FIRST * 1.6 ** max(0, failures - 1)))


def retry_delay(attempts: int) -> float:
    """Seconds before another ssh attempt after `attempts` failed ones (the port was open, ssh failed)."""
    return float(min(2.0, 0.1 * 1.6**attempts))


@dataclass
class _Worker:
    """Reaching one worker: probes of its port, then ssh attempts, then its link. Its one timer: a probe's
    timeout, the next probe, or an attempt's."""

    host: str
    argv: list[str]
    timer: Timer
    probe: socket.socket | None = None  # a connect under way
    untried: list[Address] = field(default_factory=list)  # the addresses this probe has yet to try
    probes_failed: int = 0
    proc: subprocess.Popen[bytes] | None = None  # an ssh attempt under way
    out: int = -1  # its stdout (once linked, the link's: its end is the worker's)
    pidfd: int = -1
    said: Said = field(default_factory=Said)
    count: int = 0
    last_error: str = "not tried yet"
    link: WorkerLink | None = None
    told: bool = False  # the leader's `end` reached it
    resolved: bool = False  # its name resolved at least once
    prepared: bool = False  # it said `prepared`
    doing: str = "not heard from since it was linked"  # its last `preparing` step
    since: float = 0.0  # when it said so
    words: bytes = b""  # its line in progress
    gone: bool = False  # its link closed before the job started: its `train` ended


class Linking:
    """The leader's links to `hosts`, made on the process's loop from `__enter__` on, whoever runs it. From
    the main thread (PR_SET_PDEATHSIG of the ssh attempts is per thread)."""

    def __init__(
        self,
        hosts: Sequence[str],
        ssh_config: Path,
        port: int,
        timeout: float,
        command: Command | None = None,
        resolve: Resolve = addresses,
        clock: Callable[[], float] = time.monotonic,
        prepare_bound: tuple[float, str] | None = None,
    ) -> None:
        """`prepare_bound`: (seconds from `__enter__`, the option that sets them): `wait` waits until every
        worker also said `prepared`, up to that bound; None: linked is enough."""
        argv_for = command or (lambda host: ssh_command(ssh_config, host, relay_command(port)))
        self.workers = [_Worker(host, argv_for(host), Timer(f"worker {host}")) for host in hosts]
        self.port, self.timeout, self.resolve = port, timeout, resolve
        self.loop = process_loop().scope(Timers(clock))
        self.port_open: deque[_Worker] = deque()  # waiting for a free ssh slot
        self.in_flight = 0
        self.started = False  # the job runs: a link that closes is not the leader's to judge
        self.farewell: Event | None = None  # the job ended before it started: what each worker is told
        self.deadline = Timer("the wait for every worker")
        self.waiting = False  # `wait` or `end` runs the loop: only they may stop it (other waits run it too)
        self.timed_out = False  # the workers had the whole timeout to come up
        self.prepare_bound, self.clock = prepare_bound, clock
        self.prepare_deadline = Timer("the wait for every worker to prepare")

    def __enter__(self) -> Linking:
        self.loop.timers.after(self.deadline, self.timeout, self._timed_out)
        if self.prepare_bound is not None:
            self.loop.timers.after(self.prepare_deadline, self.prepare_bound[0], self._not_prepared)
        for worker in self.workers:
            self.probe(worker)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def links(self) -> list[WorkerLink]:
        return [w.link for w in self.workers if w.link is not None]

    def wait(self, signals: SignalWatch | None = None) -> list[WorkerLink]:
        """Until every worker is linked: PeerError naming each one that was not within the timeout (from
        `__enter__`), Stopped on a stop signal."""

        def check_stop() -> None:
            if signals is not None and signals.stop_requested():
                raise Stopped("stopped while waiting for workers " + ", ".join(w.host for w in self.workers))

        check_stop()
        if not self._ready():
            said = Timer("the wait for workers to prepare, said")
            if signals is not None:
                self.loop.reader(signals, check_stop)
            self._say_preparing()
            self.loop.timers.every(said, PREPARE_LOG_EVERY, self._say_preparing)
            try:
                self._run()
            finally:
                self.loop.timers.cancel(said)
                if signals is not None:
                    self.loop.forget(signals)
        self.loop.timers.cancel(self.prepare_deadline)
        return self.links

    def _ready(self) -> bool:
        """Every worker linked, and (with a prepare bound) prepared: the job may start."""
        return all(w.link is not None and (w.prepared or self.prepare_bound is None) for w in self.workers)

    def _doing(self, worker: _Worker) -> str:
        if worker.link is None:
            return (
                f"not reached yet ({worker.last_error})"
                if worker.count or worker.probes_failed
                else "not reached yet"
            )
        return f"{worker.doing}, {self.clock() - worker.since:.0f}s in" if worker.since else worker.doing

    def _unprepared(self) -> str:
        return "; ".join(f"{w.host}: {self._doing(w)}" for w in self.workers if not w.prepared)

    def _say_preparing(self) -> None:
        log.info("waiting for workers to prepare the job: %s", self._unprepared())

    def _not_prepared(self) -> None:
        assert self.prepare_bound is not None
        seconds, key = self.prepare_bound
        late = self._unprepared()
        raise PeerError(f"not every worker prepared the job within {seconds:g}s ({key}): {late}")

    def _run(self) -> None:
        self.waiting = True
        try:
            self.loop.run()
        finally:
            self.waiting = False

    def running(self) -> None:
        """The job starts: the links carry its events; their ends are no longer watched here."""
        self.started = True
        self.loop.timers.cancel(self.deadline)
        self.loop.timers.cancel(self.prepare_deadline)
        for worker in self.workers:
            if worker.link is not None and worker.out >= 0:
                self.loop.forget(worker.out)
                worker.out = -1

    def tell(self, event: Event) -> dict[str, bool]:
        """`event` to every linked worker: whether it could be written (a worker whose link broke exits)."""
        return {link.host: link.send(event) for link in self.links}

    def end(self, event: Event, wait: float) -> dict[str, bool]:
        """The job ended before it started: `event` to every worker linked within `wait` seconds; whom."""
        self.farewell = event
        for worker in self.workers:
            self._tell(worker)
        if wait > 0 and not all(self._done(w) for w in self.workers):
            names = ", ".join(w.host for w in self.workers if not self._done(w))
            log.info("telling %s that the job ended (up to %gs)", names, wait)
            self.loop.timers.after(self.deadline, wait, self.loop.stop)
            with contextlib.suppress(Stopped, PeerError):
                self._run()
        return {w.host: w.told for w in self.workers}

    def _done(self, worker: _Worker) -> bool:
        """Nothing more to tell it: told, its `train` ended, or (the whole timeout over) a name that never
        resolved, which no farewell wait would see come up (issue 53.5: `train` ran 30 s past its reason)."""
        return worker.told or worker.gone or (self.timed_out and not worker.resolved)

    def close(self) -> None:
        """End every probe and attempt under way, hang up on every link, then wait for their ends (a pidfd
        each) under one deadline; kill the rest."""
        for worker in self.workers:
            self._end_probe(worker)
            if worker.proc is not None:
                proc = self._end_session(worker)
                proc.kill()
                proc.communicate()
        self.loop.close()
        for link in self.links:
            link.hang_up()
        wait_exits([link.proc.pid for link in self.links if link.proc.poll() is None], CLOSE_TIMEOUT)
        for link in self.links:
            if link.proc.poll() is None:
                link.proc.kill()
            link.proc.wait()
            for pipe in (link.proc.stdout, link.proc.stderr):
                if pipe is not None:
                    pipe.close()

    def _timed_out(self) -> None:
        self.timed_out = True
        missing = "; ".join(f"{w.host}: {w.last_error}" for w in self.workers if w.link is None)
        what = "workers " + ", ".join(w.host for w in self.workers)
        raise PeerError(f"timed out after {self.timeout:g}s waiting for {what} (last: {missing})")

    def probe(self, worker: _Worker) -> None:
        try:
            worker.untried = list(self.resolve(worker.host, self.port))
        except socket.gaierror as exc:
            self._refused(worker, f"cannot resolve {worker.host} ({exc.strerror})")
            return
        worker.resolved = worker.resolved or bool(worker.untried)
        if worker.untried:
            self._connect(worker)
        else:
            self._refused(worker, f"cannot resolve {worker.host} (no address)")

    def _connect(self, worker: _Worker) -> None:
        """A non-blocking connect to the next address: its answer when the socket turns writable."""
        family, address = worker.untried.pop(0)
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        error = sock.connect_ex(address)
        if error != errno.EINPROGRESS:
            sock.close()
            self._probed(worker, os.strerror(error) if error else None)
            return
        worker.probe = sock

        def answered(error: str | None = None) -> None:
            assert worker.probe is not None
            code = worker.probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if not error and not code:  # said who it is: sshd logs no closed connection in the worker's log
                with contextlib.suppress(OSError):
                    worker.probe.send(PROBE_IDENTIFICATION)
            self._end_probe(worker)
            self._probed(worker, error or (os.strerror(code) if code else None))

        self.loop.writer(sock, answered)
        self.loop.timers.after(worker.timer, PROBE_TIMEOUT, functools.partial(answered, "timed out"))

    def _end_probe(self, worker: _Worker) -> None:
        if worker.probe is not None:
            self.loop.forget(worker.probe)
            worker.probe.close()
            worker.probe = None
        self.loop.timers.cancel(worker.timer)

    def _probed(self, worker: _Worker, error: str | None) -> None:
        """Open (error None): an ssh attempt once a slot is free; else the next address, or a probe later."""
        if error is None:
            worker.probes_failed = 0
            self.port_open.append(worker)
            self._start_sessions()
        elif worker.untried:
            worker.last_error = f"port {self.port}: {error}"
            self._connect(worker)
        else:
            self._refused(worker, f"port {self.port}: {error}")

    def _refused(self, worker: _Worker, error: str) -> None:
        worker.last_error = error
        worker.probes_failed += 1
        delay = probe_delay(worker.probes_failed)
        self.loop.timers.after(worker.timer, delay, functools.partial(self.probe, worker))

    def _start_sessions(self) -> None:
        while self.port_open and self.in_flight < MAX_SSH_IN_FLIGHT:
            worker = self.port_open.popleft()
            proc = subprocess.Popen(
                worker.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=die_with_parent,  # noqa: PLW1509  (if the leader dies, the session closes)
            )
            assert proc.stdout is not None
            worker.proc, worker.out, worker.said = proc, proc.stdout.fileno(), Said()
            worker.count += 1
            self.in_flight += 1
            self.loop.reader(worker.out, functools.partial(self._output, worker))
            worker.pidfd = self.loop.exit_of(proc.pid, functools.partial(self._failed, worker))
            self.loop.timers.after(worker.timer, ATTEMPT_TIMEOUT, functools.partial(self._failed, worker))

    def _output(self, worker: _Worker) -> None:
        """READY links the worker (`linked`); the end of the output before it fails the attempt."""
        chunk = os.read(worker.out, 65536)
        if not chunk:
            self._failed(worker)
        elif worker.said.ready(chunk):
            out = worker.out
            worker.link = WorkerLink(worker.host, self._end_session(worker))
            worker.link.send(Event(LINKED))
            worker.out = out
            self.loop.reader(out, functools.partial(self._link_output, worker))
            self._tell(worker)
            self._start_sessions()
            if all(w.link is not None for w in self.workers) and self.farewell is None:
                self.loop.timers.cancel(self.deadline)
                if self.waiting and self._ready():
                    self.loop.stop()

    def _link_output(self, worker: _Worker) -> None:
        """The link's output after READY: the worker's words on its preparation, until its end (the worker's
        `train` ended)."""
        data = os.read(worker.out, 65536)
        if data:
            *lines, rest = (worker.words + data).split(b"\n")
            worker.words = rest[-WORDS_KEPT:]
            for line in lines:
                event = Event.decode(line)
                if event is not None:
                    self._heard(worker, event)
            return
        self.loop.forget(worker.out)
        worker.out = -1
        if not self.started and not worker.told:
            worker.gone = True
            if self.farewell is None:
                raise PeerError(f"{worker.host} ended before the job started (its link closed); see its log")

    def _heard(self, worker: _Worker, event: Event) -> None:
        """A worker's word before the start: its step, that it prepared, or why it could not (Ended: the job
        ends with its code and reason)."""
        if self.started:
            return
        if event.kind == PREPARING:
            worker.doing, worker.since = event.reason[:200], self.clock()
            level = logging.INFO if self.waiting and self.farewell is None else logging.DEBUG
            log.log(level, "waiting for %s to prepare the job: %s", worker.host, worker.doing)
        elif event.kind == PREPARED:
            worker.prepared, worker.doing = True, "prepared"
            log.debug("%s prepared the job", worker.host)
            if self._ready():
                self.loop.timers.cancel(self.prepare_deadline)
                if self.waiting and self.farewell is None:
                    self.loop.stop()
        elif event.kind == END and self.farewell is None:
            worker.gone = True
            head, _, detail = event.reason.partition("\n")
            said = f"{worker.host} could not prepare the job (exit {event.exit_code}): {head}"
            raise Ended(event.exit_code, f"{said}\n{detail}".strip())

    def _tell(self, worker: _Worker) -> None:
        """The leader's `end`, once it ended before the start, to a worker as soon as it is linked."""
        if self.farewell is None or worker.link is None or worker.told:
            return
        worker.told = worker.link.send(self.farewell)
        worker.link.hang_up()
        if all(self._done(w) for w in self.workers) and self.waiting:
            self.loop.stop()

    def _failed(self, worker: _Worker) -> None:
        """The attempt exited, ended its output before READY, or timed out: another one, backed off."""
        proc = self._end_session(worker)
        proc.kill()
        _, err = proc.communicate()
        lines = (worker.said.tail + b"\n" + err).decode(errors="replace").strip().splitlines()
        worker.last_error = lines[-1][-300:] if lines else f"no answer within {ATTEMPT_TIMEOUT:g}s"
        self.loop.timers.after(worker.timer, retry_delay(worker.count), functools.partial(self.probe, worker))
        self._start_sessions()

    def _end_session(self, worker: _Worker) -> subprocess.Popen[bytes]:
        """Stop watching the attempt; its process."""
        proc = worker.proc
        assert proc is not None
        self.loop.forget(worker.out)
        self.loop.forget(worker.pidfd)
        self.loop.timers.cancel(worker.timer)
        worker.proc, worker.out = None, -1
        self.in_flight -= 1
        return proc
