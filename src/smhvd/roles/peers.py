"""Leader side: reach every worker (in parallel, bounded, backed-off retries) and keep a link to each.

Every worker is reached at once, so N workers cost about one worker's latency, not N:
- readiness is probed cheaply first, a TCP connect to the worker's sshd port (PROBE_THREADS threads, so a
  slow name lookup holds up no other host), again every PROBE_MAX seconds at most while it is refused: an ssh
  attempt against a closed port would still cost a process, and a handshake costs the leader's CPU;
- an open port gets an ssh attempt, at most MAX_SSH_IN_FLIGHT at once; a failed one is retried, backed off;
- the loop sleeps until an ssh session prints or exits, or a probe answers (LOOP_MAX_SLEEP at most);
- closing the links (close_all) closes every session first, then waits for all, under one deadline.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import selectors
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from smhvd import wire
from smhvd.errors import PeerError, Stopped
from smhvd.proc.processes import die_with_parent
from smhvd.proc.ssh import ssh_command
from smhvd.proc.waiting import NotYet, wait_until

log = logging.getLogger("smhvd")

ATTEMPT_TIMEOUT = 15.0  # one ssh attempt: connect + start the relay
PROBE_TIMEOUT = 2.0  # one TCP connect to a worker's sshd port
PROBE_FIRST = 0.05  # the first re-probe of a refused port; then x1.6 up to PROBE_MAX
PROBE_MAX = 0.25  # a worker whose sshd starts is noticed within this (plus one probe)
PROBE_THREADS = 16
MAX_SSH_IN_FLIGHT = 64  # ssh attempts at once (each is a process and a handshake on the leader)
CLOSE_TIMEOUT = 5.0
LOOP_MAX_SLEEP = 0.1  # the loop wakes on every event; at the latest after this (a stop is noticed)

Probe = Callable[[str, int, float], "str | None"]
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


def port_open(host: str, port: int, timeout: float) -> str | None:
    """None when `host` accepts a TCP connection on `port`, else why not (one line)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except socket.gaierror as exc:
        return f"cannot resolve {host} ({exc.strerror})"
    except OSError as exc:
        return f"port {port}: {exc.strerror or exc}"


def probe_delay(failures: int) -> float:
    """Seconds before probing again after `failures` refused probes in a row."""
    return float(min(PROBE_MAX, PROBE_FIRST * 1.6 ** max(0, failures - 1)))


def retry_delay(attempts: int) -> float:
    """Seconds before another ssh attempt after `attempts` failed ones (the port was open, ssh failed)."""
    return float(min(2.0, 0.1 * 1.6**attempts))


@dataclass
class _Attempts:
    """Reaching one worker: probes of its port, then ssh attempts, all started from the main thread
    (PR_SET_PDEATHSIG is per thread)."""

    host: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    probe: Future[str | None] | None = None
    port_is_open: bool = False
    probes_failed: int = 0
    started: float = 0.0
    next_try: float = 0.0
    count: int = 0
    last_error: str = "not tried yet"

    def start(self, now: float) -> None:
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=die_with_parent,  # noqa: PLW1509  (if the leader dies, the session closes)
        )
        self.port_is_open = False
        self.started = now
        self.count += 1

    def probed(self, now: float) -> None:
        """Take the finished probe's answer: the port is open, or probe again later."""
        assert self.probe is not None
        error = self.probe.result()
        self.probe = None
        if error is None:
            self.port_is_open = True
            self.probes_failed = 0
            return
        self.last_error = error
        self.probes_failed += 1
        self.next_try = now + probe_delay(self.probes_failed)

    def poll(self, now: float) -> WorkerLink | None:
        """The link once the relay said ready; on a failed attempt, schedule the next one (backed off)."""
        proc = self.proc
        assert proc is not None
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 0)
        if readable:
            line = proc.stdout.readline()
            if line == wire.READY:
                return WorkerLink(self.host, proc)
        elif proc.poll() is None and now - self.started < ATTEMPT_TIMEOUT:
            return None  # still connecting
        proc.kill()
        _, err = proc.communicate()
        lines = err.decode(errors="replace").strip().splitlines()
        self.last_error = lines[-1] if lines else f"no answer within {ATTEMPT_TIMEOUT:g}s"
        self.proc = None
        self.next_try = now + retry_delay(self.count)
        return None


class _Wakeup:
    """Sleeps until an ssh session has output (or ended), a probe finished, or the time is up."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._lock = threading.Lock()  # notify() from a probe thread never writes to a closed (reused) fd
        self._closed = False
        self.selector = selectors.DefaultSelector()
        self.selector.register(self._read, selectors.EVENT_READ)

    def notify(self, _future: object = None) -> None:
        with self._lock, contextlib.suppress(BlockingIOError):
            if not self._closed:
                os.write(self._write, b"x")

    def sleep(self, attempts: Sequence[_Attempts], seconds: float) -> None:
        watched = [a.proc.stdout for a in attempts if a.proc is not None and a.proc.stdout is not None]
        for stream in watched:
            self.selector.register(stream, selectors.EVENT_READ)
        try:
            for key, _ in self.selector.select(seconds):
                if key.fileobj == self._read:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._read, 4096)
        finally:
            for stream in watched:
                self.selector.unregister(stream)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.selector.close()
            os.close(self._read)
            os.close(self._write)


def connect_all(
    hosts: Sequence[str],
    ssh_config: Path,
    port: int,
    timeout: float,
    stop_requested: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
    command: Command | None = None,
    probe: Probe = port_open,
) -> list[WorkerLink]:
    """Links to every host, or PeerError naming each host that did not come up (the others are closed).
    `command(host)` is the argv of one attempt (default: ssh to the host's link relay); `probe(host, port,
    timeout)` says why the host is not ready yet, or None (default: a TCP connect to its sshd)."""
    remote = [sys.executable, "-m", "smhvd.link", str(port)]
    argv_for = command or (lambda host: ssh_command(ssh_config, host, remote))
    attempts = [_Attempts(host, argv_for(host)) for host in hosts]
    links: dict[str, WorkerLink] = {}
    wakeup = _Wakeup()
    pool = ThreadPoolExecutor(max_workers=min(PROBE_THREADS, max(1, len(hosts))), thread_name_prefix="probe")

    def step() -> list[WorkerLink] | None:
        if stop_requested():
            raise Stopped("stopped while waiting for workers " + ", ".join(hosts))
        now = clock()
        for attempt in attempts:  # sessions under way: ready, still connecting, or failed
            if attempt.proc is not None and attempt.host not in links:
                worker = attempt.poll(now)
                if worker is not None:
                    links[attempt.host] = worker
        waiting = [a for a in attempts if a.host not in links and a.proc is None]
        in_flight = sum(1 for a in attempts if a.host not in links and a.proc is not None)
        for attempt in waiting:  # probes answered, sessions to start, probes to send
            if attempt.probe is not None and attempt.probe.done():
                attempt.probed(now)
            if attempt.port_is_open and in_flight < MAX_SSH_IN_FLIGHT:
                attempt.start(now)
                in_flight += 1
            elif not attempt.port_is_open and attempt.probe is None and now >= attempt.next_try:
                attempt.probe = pool.submit(probe, attempt.host, port, PROBE_TIMEOUT)
                attempt.probe.add_done_callback(wakeup.notify)
        if len(links) == len(attempts):
            return [links[a.host] for a in attempts]
        raise NotYet("; ".join(f"{a.host}: {a.last_error}" for a in attempts if a.host not in links))

    try:
        return wait_until(
            step,
            what="workers " + ", ".join(hosts),
            timeout=timeout,
            initial=LOOP_MAX_SLEEP,
            maximum=LOOP_MAX_SLEEP,
            factor=1.0,
            clock=clock,
            sleep=lambda seconds: wakeup.sleep([a for a in attempts if a.host not in links], seconds),
            error=PeerError,
        )
    except (PeerError, Stopped) as exc:
        for attempt in attempts:
            if attempt.proc is not None and attempt.host not in links:
                attempt.proc.kill()
                attempt.proc.wait()
        for worker in links.values():
            worker.send({"event": "end", "exit_code": exc.exit_code, "reason": str(exc)})
        close_all(list(links.values()))
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)  # none in flight once every host is linked
        wakeup.close()
