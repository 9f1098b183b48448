"""Signals before the job starts: a stop raises errors.Stopped wherever the preparation is; SIGUSR1 only says
that there is nothing to dump yet.

`train` installs PreparationSignals first thing; a role replaces them with its own event loop
(signals.SignalWatch, which puts them back when it ends). As PID 1 in a container a signal without a handler
is ignored, and outside PID 1 SIGUSR1's default action would kill `train` and leave its children running:
these handlers are needed either way.
"""

from __future__ import annotations

import os
import signal
import time

from smhvd.errors import Stopped

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SageMaker's stop, Ctrl-C, a closed terminal


class PreparationSignals:
    """Raise Stopped in the main thread on the first stop signal: the preparation step in progress
    (code download, pip, the EFA probe: steps.py) is ended with its process tree, and the launcher then
    kills whatever else it started. Later stops while that unwinds are ignored, so they cannot interrupt the
    cleanup."""

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
        # One write, not the logging module: a stop that arrives while this runs must not land in a logging
        # handler's `except` (see errors.Stopped).
        line = (
            f"[smhvd {time.strftime('%H:%M:%S')}] INFO SIGUSR1: no rank is running yet (the job is being "
            "prepared): no stack dump to take\n"
        )
        os.write(2, line.encode())
