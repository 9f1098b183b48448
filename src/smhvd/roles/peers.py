"""Leader side: reach every worker (bounded, backed-off retries, in parallel) and keep a link to each."""

from __future__ import annotations

import contextlib
import logging
import select
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd import link
from smhvd.errors import PeerError, Stopped
from smhvd.proc.processes import die_with_parent
from smhvd.proc.waiting import NotYet, wait_until

log = logging.getLogger("smhvd")


class WorkerLink:
    """One open ssh session to a worker's link relay."""

    def __init__(self, host: str, proc: subprocess.Popen[bytes]) -> None:
        self.host = host
        self.proc = proc

    def send(self, event: dict[str, object]) -> bool:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(link.encode(event))
            self.proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            return False
        return True

    def close(self, timeout: float = 5.0) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def ssh_command(ssh_config: Path, host: str, remote: Sequence[str]) -> list[str]:
    # ssh hands the remote command to the remote shell: quote it (host names are validated, no leading '-').
    return ["ssh", "-F", str(ssh_config), host, shlex.join(remote)]


ATTEMPT_TIMEOUT = 15.0  # one ssh attempt: connect + start the relay


@dataclass
class _Attempts:
    """Attempts to reach one worker, all started from the main thread (PR_SET_PDEATHSIG is per thread)."""

    host: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
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
        self.started = now
        self.count += 1

    def poll(self, now: float) -> WorkerLink | None:
        """The link once the relay said ready; on a failed attempt, schedule the next one (backed off)."""
        proc = self.proc
        assert proc is not None
        assert proc.stdout is not None
        readable, _, _ = select.select([proc.stdout], [], [], 0)
        if readable:
            line = proc.stdout.readline()
            if line == link.READY:
                return WorkerLink(self.host, proc)
        elif proc.poll() is None and now - self.started < ATTEMPT_TIMEOUT:
            return None  # still connecting
        proc.kill()
        _, err = proc.communicate()
        lines = err.decode(errors="replace").strip().splitlines()
        self.last_error = lines[-1] if lines else f"no answer within {ATTEMPT_TIMEOUT:g}s"
        self.proc = None
        self.next_try = now + min(2.0, 0.1 * 1.6**self.count)
        return None


def connect_all(
    hosts: Sequence[str],
    ssh_config: Path,
    port: int,
    timeout: float,
    stop_requested: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.monotonic,
) -> list[WorkerLink]:
    """Links to every host, or PeerError naming each host that did not come up (the others are closed)."""
    remote = [sys.executable, "-m", "smhvd.link", str(port)]
    attempts = [_Attempts(host, ssh_command(ssh_config, host, remote)) for host in hosts]
    links: dict[str, WorkerLink] = {}

    def all_linked() -> list[WorkerLink] | None:
        if stop_requested():
            raise Stopped("stopped while waiting for workers " + ", ".join(hosts))
        now = clock()
        for attempt in attempts:
            if attempt.host in links:
                continue
            if attempt.proc is None:
                if now >= attempt.next_try:
                    attempt.start(now)
            elif (worker := attempt.poll(now)) is not None:
                links[attempt.host] = worker
        if len(links) == len(attempts):
            return [links[a.host] for a in attempts]
        raise NotYet("; ".join(f"{a.host}: {a.last_error}" for a in attempts if a.host not in links))

    try:
        return wait_until(
            all_linked, what="workers " + ", ".join(hosts), timeout=timeout, maximum=0.1, error=PeerError
        )
    except (PeerError, Stopped) as exc:
        for attempt in attempts:
            if attempt.proc is not None and attempt.host not in links:
                attempt.proc.kill()
                attempt.proc.wait()
        for worker in links.values():
            worker.send({"event": "end", "exit_code": exc.exit_code, "reason": str(exc)})
            worker.close()
        raise
