"""Leader side: reach every worker (bounded, backed-off retries, in parallel) and keep a link to each."""

from __future__ import annotations

import contextlib
import logging
import selectors
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from . import link
from .errors import PeerError
from .processes import die_with_parent
from .waiting import NotYet, wait_until

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


def _open_once(host: str, argv: list[str], attempt_timeout: float) -> WorkerLink:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=die_with_parent,  # noqa: PLW1509  (if the leader dies, the session closes)
    )
    assert proc.stdout is not None
    assert proc.stderr is not None
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(attempt_timeout)
    line = proc.stdout.readline() if ready else b""
    if line == link.READY:
        return WorkerLink(host, proc)
    proc.kill()
    _, err = proc.communicate()
    reason = err.decode(errors="replace").strip().splitlines()
    raise NotYet(reason[-1] if reason else f"no answer within {attempt_timeout:g}s")


def connect(host: str, ssh_config: Path, port: int, timeout: float) -> WorkerLink:
    argv = ssh_command(ssh_config, host, [sys.executable, "-m", "smhvd.link", str(port)])
    deadline = time.monotonic() + timeout

    def attempt() -> WorkerLink:
        return _open_once(host, argv, max(1.0, min(15.0, deadline - time.monotonic())))

    return wait_until(
        attempt, what=f"worker {host} (its sshd and launcher)", timeout=timeout, maximum=2.0, error=PeerError
    )


def connect_all(hosts: Sequence[str], ssh_config: Path, port: int, timeout: float) -> list[WorkerLink]:
    """Links to every host, or PeerError naming each host that did not come up (the others are closed)."""
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        futures = {host: pool.submit(connect, host, ssh_config, port, timeout) for host in hosts}
    links, errors = [], []
    for host, future in futures.items():
        exc = future.exception()
        if exc is None:
            links.append(future.result())
        else:
            errors.append(f"{host}: {exc}")
    if errors:
        for worker in links:
            worker.send({"event": "end", "exit_code": PeerError.exit_code, "reason": "; ".join(errors)})
            worker.close()
        raise PeerError("; ".join(errors))
    return links
