"""Leader side: reach every worker (in parallel, bounded, backed-off retries) and keep a link to each.

Every worker is reached at once, on the one event loop (proc/loop.py), so N workers cost about one worker's
latency, not N, and nothing polls:
- readiness is probed cheaply first: a non-blocking TCP connect to the worker's sshd port (a writer on the
  loop, its answer read with SO_ERROR, PROBE_TIMEOUT a timer), again after probe_delay while it is refused:
  an ssh attempt against a closed port would still cost a process, and a handshake costs the leader's CPU.
  The name lookup before it is the one blocking call (getaddrinfo has no non-blocking form): /etc/hosts or a
  resolver answers it in about a millisecond; a resolver that does not answer holds up the loop for its
  timeout (an ssh to that host would wait as long);
- an open port gets an ssh attempt, at most MAX_SSH_IN_FLIGHT at once: its stdout a reader (the relay
  says `ready`), its exit a pidfd, ATTEMPT_TIMEOUT a timer; a failed one is retried after retry_delay (the
  port probed first);
- the overall deadline is a timer; the caller's SignalWatch is a reader: a stop signal ends the wait at once;
- closing the links (close_all) closes every session first, then waits for all, under one deadline.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smhvd import wire
from smhvd.errors import PeerError, Stopped
from smhvd.proc.loop import Scope, process_loop
from smhvd.proc.processes import die_with_parent
from smhvd.proc.signals import SignalWatch
from smhvd.proc.ssh import ssh_command
from smhvd.proc.timers import Timer, Timers

log = logging.getLogger("smhvd")

ATTEMPT_TIMEOUT = 15.0  # one ssh attempt: connect + start the relay
PROBE_TIMEOUT = 2.0  # one TCP connect to a worker's sshd port
PROBE_FIRST = 0.05  # the first re-probe of a refused port; then x1.6 up to PROBE_MAX
PROBE_MAX = 0.25  # a worker whose sshd starts is noticed within this (plus one probe)
MAX_SSH_IN_FLIGHT = 64  # ssh attempts at once (each is a process and a handshake on the leader)
CLOSE_TIMEOUT = 5.0

Address = tuple[socket.AddressFamily, tuple[Any, ...]]  # a socket family and an address of it
Resolve = Callable[[str, int], Sequence[Address]]
Command = Callable[[str], list[str]]


class WorkerLink:
    """One open ssh session to a worker's link relay."""

    def __init__(self, host: str, proc: subprocess.Popen[bytes]) -> None:
        self.host = host
        self.proc = proc

    def send(self, event: dict[str, object]) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(wire.encode(event))
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return False
        return True

    def hang_up(self) -> None:
        """Close the session's input: the relay on the worker sees the end of it and exits."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()

    def close(self, timeout: float = CLOSE_TIMEOUT) -> None:
        self.hang_up()
        self.reap(time.monotonic() + timeout)

    def reap(self, deadline: float) -> None:
        """Wait for the session to end until `deadline` (time.monotonic()), then kill it."""
        try:
            self.proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def close_all(links: Sequence[WorkerLink], timeout: float = CLOSE_TIMEOUT) -> None:
    """Close every link: all sessions are hung up first, then reaped under one deadline (the workers'
    relays exit in parallel; nothing waits for one worker before hanging up on the next)."""
    for worker in links:
        worker.hang_up()
    deadline = time.monotonic() + timeout
    for worker in links:
        worker.reap(deadline)


def addresses(host: str, port: int) -> list[Address]:
    """Where `host` takes TCP connections on `port`, in the resolver's order; socket.gaierror if nowhere."""
    return [
        (family, address)
        for family, _, _, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    ]


def probe_delay(failures: int) -> float:
    """Seconds before probing again after `failures` refused probes in a row."""
    return float(min(PROBE_MAX, PROBE_FIRST * 1.6 ** max(0, failures - 1)))


def retry_delay(attempts: int) -> float:
    """Seconds before another ssh attempt after `attempts` failed ones (the port was open, ssh failed)."""
    return float(min(2.0, 0.1 * 1.6**attempts))


@dataclass
class _Worker:
    """Reaching one worker: probes of its port, then ssh attempts, all started from the main thread
    (PR_SET_PDEATHSIG is per thread)."""

    host: str
    argv: list[str]
    probe: socket.socket | None = None  # a connect under way
    untried: list[Address] = field(default_factory=list)  # the addresses this probe has yet to try
    probes_failed: int = 0
    proc: subprocess.Popen[bytes] | None = None  # an ssh attempt under way
    out: int = -1  # its stdout
    pidfd: int = -1
    said: bytes = b""
    count: int = 0
    last_error: str = "not tried yet"
    link: WorkerLink | None = None
    # Its one timer: the probe's timeout, the next probe, or the attempt's timeout.
    timer: Timer = field(init=False)

    def __post_init__(self) -> None:
        self.timer = Timer(f"worker {self.host}")


class _ConnectingWorkers:
    """The wait for every worker's link, as callbacks on `loop`: it stops once all are linked."""

    def __init__(self, loop: Scope, workers: Sequence[_Worker], port: int, resolve: Resolve) -> None:
        self.loop = loop
        self.workers = workers
        self.port = port
        self.resolve = resolve
        self.port_open: deque[_Worker] = deque()  # waiting for a free ssh slot
        self.in_flight = 0

    def probe(self, worker: _Worker) -> None:
        try:
            worker.untried = list(self.resolve(worker.host, self.port))
        except socket.gaierror as exc:
            self._refused(worker, f"cannot resolve {worker.host} ({exc.strerror})")
            return
        if not worker.untried:
            self._refused(worker, f"cannot resolve {worker.host} (no address)")
            return
        self._connect(worker)

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
        self.loop.writer(sock, functools.partial(self._connected, worker))
        self.loop.timers.after(worker.timer, PROBE_TIMEOUT, functools.partial(self._probe_timed_out, worker))

    def _connected(self, worker: _Worker) -> None:
        assert worker.probe is not None
        error = worker.probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        self._end_probe(worker)
        self._probed(worker, os.strerror(error) if error else None)

    def _probe_timed_out(self, worker: _Worker) -> None:
        self._end_probe(worker)
        self._probed(worker, "timed out")

    def _end_probe(self, worker: _Worker) -> None:
        if worker.probe is not None:
            self.loop.forget(worker.probe)
            worker.probe.close()
            worker.probe = None
        self.loop.timers.cancel(worker.timer)

    def _probed(self, worker: _Worker, error: str | None) -> None:
        """The port is open (error None): an ssh attempt once a slot is free; else the next address, or a
        probe again later."""
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
        self.loop.timers.after(
            worker.timer, probe_delay(worker.probes_failed), functools.partial(self.probe, worker)
        )

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
            worker.proc, worker.out, worker.said = proc, proc.stdout.fileno(), b""
            worker.count += 1
            self.in_flight += 1
            self.loop.reader(worker.out, functools.partial(self._output, worker))
            worker.pidfd = self.loop.exit_of(proc.pid, functools.partial(self._failed, worker))
            self.loop.timers.after(worker.timer, ATTEMPT_TIMEOUT, functools.partial(self._failed, worker))

    def _output(self, worker: _Worker) -> None:
        """The relay's first line: `ready` links the worker; anything else (or the end) fails the attempt."""
        chunk = os.read(worker.out, 4096)
        worker.said += chunk
        if chunk and b"\n" not in worker.said:
            return
        if chunk and worker.said.split(b"\n", 1)[0] + b"\n" == wire.READY:
            worker.link = WorkerLink(worker.host, self._end_session(worker))
            self._start_sessions()
            if all(w.link is not None for w in self.workers):
                self.loop.stop()
        else:
            self._failed(worker)

    def _failed(self, worker: _Worker) -> None:
        """The attempt exited, said something other than `ready`, or timed out: another one, backed off."""
        proc = self._end_session(worker)
        proc.kill()
        _, err = proc.communicate()
        lines = err.decode(errors="replace").strip().splitlines()
        worker.last_error = lines[-1] if lines else f"no answer within {ATTEMPT_TIMEOUT:g}s"
        self.loop.timers.after(worker.timer, retry_delay(worker.count), functools.partial(self.probe, worker))
        self._start_sessions()

    def _end_session(self, worker: _Worker) -> subprocess.Popen[bytes]:
        """Stop watching the attempt; its process."""
        proc = worker.proc
        assert proc is not None
        self.loop.forget(worker.out)
        self.loop.forget(worker.pidfd)
        self.loop.timers.cancel(worker.timer)
        worker.proc = None
        self.in_flight -= 1
        return proc

    def abandon(self) -> None:
        """End every probe and attempt under way (the wait failed or was stopped)."""
        for worker in self.workers:
            self._end_probe(worker)
            if worker.proc is not None:
                proc = self._end_session(worker)
                proc.kill()
                proc.wait()

    def missing(self) -> str:
        """Each worker not linked, with its last error."""
        return "; ".join(f"{w.host}: {w.last_error}" for w in self.workers if w.link is None)


def connect_all(
    hosts: Sequence[str],
    ssh_config: Path,
    port: int,
    timeout: float,
    signals: SignalWatch | None = None,
    clock: Callable[[], float] = time.monotonic,
    command: Command | None = None,
    resolve: Resolve = addresses,
) -> list[WorkerLink]:
    """Links to every host, or PeerError naming each host that did not come up (the others are closed).
    `signals` (the caller's SignalWatch) is read first and on every signal: Stopped on a stop.
    `command(host)` is the argv of one attempt (default: ssh to the host's link relay); `resolve(host, port)`
    the addresses its sshd is probed at (default: the resolver's). From the main thread."""
    remote = [sys.executable, "-m", "smhvd.link", str(port)]
    argv_for = command or (lambda host: ssh_command(ssh_config, host, remote))
    workers = [_Worker(host, argv_for(host)) for host in hosts]
    what = "workers " + ", ".join(hosts)

    def check_stop() -> None:
        if signals is not None and signals.stop_requested():
            raise Stopped("stopped while waiting for " + what)

    with process_loop().scope(Timers(clock)) as loop:
        check_stop()
        if signals is not None:
            loop.reader(signals, check_stop)
        if not workers:
            return []
        connecting = _ConnectingWorkers(loop, workers, port, resolve)

        def timed_out() -> None:
            raise PeerError(f"timed out after {timeout:g}s waiting for {what} (last: {connecting.missing()})")

        loop.timers.after(Timer("the wait for every worker"), timeout, timed_out)
        try:
            for worker in workers:
                connecting.probe(worker)
            loop.run()
        except BaseException as exc:
            connecting.abandon()
            links = [w.link for w in workers if w.link is not None]
            if isinstance(exc, PeerError | Stopped):  # the workers reached end with the leader's exit code
                for link in links:
                    link.send({"event": "end", "exit_code": exc.exit_code, "reason": str(exc)})
            close_all(links)
            raise
    return [w.link for w in workers if w.link is not None]
