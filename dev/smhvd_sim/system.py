"""The simulator's base: its one error type (the message is the one line a user sees), running system
tools (ip, ssh-keygen) as argv lists, and its bounded waits (the launcher's wait, raising ClusterError)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from smhvd.proc.waiting import wait_until

T = TypeVar("T")


class ClusterError(Exception):
    """Bringing up, using or tearing down the simulated cluster failed; the message says what and where."""


class Interrupted(Exception):
    """SIGTERM or SIGINT reached the process that owns a cluster: the cluster is being torn down."""


REQUIRED_TOOLS = ("unshare", "nsenter", "ip", "mount", "ssh-keygen")


def run(argv: list[str], *, stdin: str | None = None, timeout: float = 30.0) -> str:
    """Run ``argv``; return its stdout, or raise ClusterError naming the command and its stderr."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ClusterError(f"{argv[0]}: not found on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{shlex.join(argv)}: no answer within {timeout:g} s") from exc
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1:] or ["no error output"]
        raise ClusterError(f"{shlex.join(argv)} failed with exit {done.returncode}: {detail[0]}")
    return done.stdout


FAN_OUT = 16  # at most this many commands at once when one is run per host


def run_each(commands: Sequence[tuple[list[str], str | None]], fan_out: int = FAN_OUT) -> None:
    """Run every ``(argv, stdin)`` as :func:`run` does, up to ``fan_out`` at once; raise the first failure
    (in the given order) after all have ended."""
    if not commands:
        return
    with ThreadPoolExecutor(max_workers=min(fan_out, len(commands))) as pool:
        futures = [pool.submit(run, argv, stdin=stdin) for argv, stdin in commands]
    for future in futures:
        future.result()


def check_prerequisites() -> None:
    """Fail early, with one line, when not root or when a needed tool is missing."""
    if os.geteuid() != 0:
        raise ClusterError("the simulated cluster needs root (network and mount namespaces, a bridge)")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"missing tools: {', '.join(missing)}"
            " (Debian: apt-get install iproute2 util-linux mount openssh-client)"
        )


def wait_for(
    check: Callable[[], T | None],
    what: str,
    timeout: float,
    *,
    first_delay: float = 0.005,
    max_delay: float = 0.25,
) -> T:
    """Call ``check`` until it returns something other than None; raise ClusterError after ``timeout`` s."""
    return wait_until(
        check,
        what=what,
        timeout=timeout,
        initial=first_delay,
        maximum=max_delay,
        factor=2.0,
        error=ClusterError,
    )
