"""Run one command (mpirun, or a single rank) to its end: stream its stderr, handle signals, reap orphans.

On a stop signal (SIGTERM from SageMaker, Ctrl-C) the ranks *on this host* get SIGTERM directly, so every
rank can save a checkpoint; the command itself is left to end when they do.
"""

from __future__ import annotations

import logging
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from . import link
from .mpi_output import StderrFilter
from .processes import cmdline, descendants, die_with_parent, reap_orphans, signal_pids
from .signals import SignalWatch, is_stop

log = logging.getLogger("smhvd")
RANK_MODULE = "smhvd.rank"


@dataclass
class Outcome:
    exit_code: int
    output: StderrFilter
    stopped: bool


def local_ranks() -> list[int]:
    """Rank wrappers started on this host by this launcher (directly, by mpirun or by orted)."""
    return [pid for pid in descendants() if RANK_MODULE in cmdline(pid)[1:4]]


def stop_local_ranks() -> list[int]:
    ranks = local_ranks()
    signal_pids(ranks, signal.SIGTERM)
    return ranks


def supervise(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    keep: Sequence[int] = (),
    watch: SignalWatch | None = None,
    tick: Callable[[], object] | None = None,
    tick_interval: float = link.HEARTBEAT_INTERVAL,
) -> Outcome:
    """Run argv to its end. `tick` (the leader's heartbeat to its workers) is called every tick_interval."""
    output = StderrFilter()
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: die_with_parent(signal.SIGTERM),  # noqa: PLW1509  (no job outlives the launcher)
    )
    keep_pids = {proc.pid, *keep}
    stopped = False
    assert proc.stderr is not None
    stderr_fd = proc.stderr.fileno()
    own = watch is None
    watch = watch or SignalWatch().__enter__()
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(stderr_fd, selectors.EVENT_READ)
            sel.register(watch.fileno(), selectors.EVENT_READ)
            open_stream = True
            next_tick = time.monotonic() + tick_interval
            while open_stream:
                if tick is not None and time.monotonic() >= next_tick:
                    tick()
                    next_tick = time.monotonic() + tick_interval
                timeout = max(0.0, next_tick - time.monotonic()) if tick is not None else None
                for key, _ in sel.select(timeout):
                    if key.fd == stderr_fd:
                        data = os.read(stderr_fd, 65536)
                        if not data:
                            open_stream = False
                            break
                        os.write(2, output.feed(data))
                    else:
                        for sig in watch.drain():
                            if is_stop(sig) and not stopped:
                                stopped = True
                                ranks = stop_local_ranks()
                                log.warning(
                                    "%s received: SIGTERM sent to %d local rank(s)",
                                    signal.Signals(sig).name,
                                    len(ranks),
                                )
                            elif sig == signal.SIGCHLD:
                                reap_orphans(keep_pids)
        os.write(2, output.flush())
        code = proc.wait()
    finally:
        if own:
            watch.__exit__(None, None, None)
    return Outcome(exit_code=code if code >= 0 else 128 - code, output=output, stopped=stopped)
