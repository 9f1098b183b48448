"""A one-line progress counter on stderr: redrawn in place on a terminal, a line per tenth otherwise."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    def __init__(
        self,
        what: str,
        total_files: int,
        total_bytes: int,
        stream: TextIO,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        interval: float = 0.1,
        lines: bool = True,
    ) -> None:
        """On a terminal one line redrawn at most every `interval` s; otherwise a line per tenth
        (`lines`) or nothing."""
        self.what = what
        self.total_files = total_files
        self.total_bytes = total_bytes
        self.stream = stream
        self.tty = stream.isatty() if tty is None else tty
        self.clock = clock
        self.interval = interval
        self.lines = lines
        self.files = 0
        self.bytes = 0
        self.start = clock()
        self._last_draw = -1.0
        self._last_tenth = 0
        self._lock = threading.Lock()

    def line(self) -> str:
        elapsed = max(self.clock() - self.start, 1e-9)
        return (
            f"{self.what} {self.files}/{self.total_files} files, "
            f"{human(self.bytes)}/{human(self.total_bytes)}, {human(self.bytes / elapsed)}/s"
        )

    def advance(self, nbytes: int, files: int = 1) -> None:
        with self._lock:
            self.files += files
            self.bytes += nbytes
            if self.tty:
                now = self.clock()
                if now - self._last_draw >= self.interval or self.files == self.total_files:
                    self._last_draw = now
                    self.stream.write("\r" + self.line() + "\x1b[K")
                    self.stream.flush()
            elif self.lines:
                tenth = self.files * 10 // max(self.total_files, 1)
                if tenth > self._last_tenth:
                    self._last_tenth = tenth
                    self.stream.write(self.line() + "\n")
                    self.stream.flush()

    def close(self) -> None:
        with self._lock:
            if self.tty and self._last_draw >= 0:
                self.stream.write("\n")
                self.stream.flush()
