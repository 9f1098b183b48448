"""Signals, the two ways `train` takes them: before the job starts a stop raises errors.Stopped wherever the
preparation is (`PreparationSignals`); a role's wait takes them as events on its loop (`SignalWatch`). As
PID 1 a signal without a handler is ignored, and elsewhere SIGUSR1's default would kill `train` alone.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType

from smhvd.errors import Stopped
from smhvd.proc.processes import reap_orphans

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SageMaker's stop, Ctrl-C, a closed terminal
WATCHED = (*STOP_SIGNALS, signal.SIGCHLD, signal.SIGUSR1)  # USR1: stack dumps


class PreparationSignals:
    """Raise Stopped in the main thread on the first stop signal (the step in progress ends with its tree);
    later stops are ignored, so they cannot interrupt the cleanup."""

    def __init__(self) -> None:
        self.stopped_by: int | None = None

    def install(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._stop)
        signal.signal(signal.SIGUSR1, self._dump)

    def _stop(self, signum: int, _frame: object) -> None:
        if self.stopped_by is not None:
            return
        self.stopped_by = signum
        raise Stopped(f"stopped by {signal.Signals(signum).name} before the job started")

    @staticmethod
    def _dump(_signum: int, _frame: object) -> None:
        # One write, not logging: a stop must not land in a logging handler's `except` (errors.Stopped).
        line = (
            f"[smhvd {time.strftime('%H:%M:%S')}] INFO SIGUSR1: no rank is running yet (the job is being "
            "prepared): no stack dump to take\n"
        )
        os.write(2, line.encode())


@dataclass(frozen=True)
class Received:
    """The signals that arrived since the last look, as events."""

    stop: int | None = None  # the first stop signal (SIGTERM from SageMaker, Ctrl-C, SIGHUP)
    dump: bool = False  # SIGUSR1: a stack dump of every rank was asked for
    child: bool = False  # SIGCHLD: a child exited (re-parented orphans are already reaped)


class SignalWatch:
    """Context manager: while active, WATCHED signals become bytes on `fileno()`; `drain()` returns them."""

    def __init__(self) -> None:
        self._recv, self._send = socket.socketpair()
        self._recv.setblocking(False)
        self._send.setblocking(False)
        self._previous: dict[int, object] = {}
        self._old_fd = -1

    def __enter__(self) -> SignalWatch:
        self._old_fd = signal.set_wakeup_fd(self._send.fileno(), warn_on_full_buffer=False)
        for sig in WATCHED:
            self._previous[sig] = signal.signal(sig, lambda *_: None)
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._old_fd)
        self._recv.close()
        self._send.close()

    def fileno(self) -> int:
        return self._recv.fileno()

    def stop_requested(self) -> bool:
        """Whether a stop signal arrived (for waits that cannot select on fileno(), e.g. polling loops)."""
        return any(sig in STOP_SIGNALS for sig in self.drain())

    def receive(self, keep_pids: Iterable[int]) -> Received:
        """The signals since the last call, as events; on SIGCHLD the zombies of re-parented orphans are
        reaped, except `keep_pids` (the children whose exit status their owner waits for)."""
        received = self.drain()
        if signal.SIGCHLD in received:
            reap_orphans(keep_pids)
        stops = [sig for sig in received if sig in STOP_SIGNALS]
        return Received(
            stop=stops[0] if stops else None,
            dump=signal.SIGUSR1 in received,
            child=signal.SIGCHLD in received,
        )

    def drain(self) -> list[int]:
        received: list[int] = []
        while True:
            try:
                data = self._recv.recv(512)
            except BlockingIOError:
                return received
            if not data:
                return received
            received += list(data)
