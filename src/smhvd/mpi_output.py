"""Read mpirun's stderr as it streams: pass it through, pick out rank-failure markers and mpirun's verdict.

`StderrFilter.feed` returns the bytes to show (marker lines are removed, everything else is passed at once,
partial lines included, so progress bars keep working). When no marker arrived (the wrapper itself was
killed), `parse_mpirun_verdict` reads mpirun's own message for the failing rank, host and code.
"""

from __future__ import annotations

import re
from collections import deque

from .failure import MARKER, RankFailure

_MARK = MARKER.encode()
_NOTICED = re.compile(
    r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) exited on signal (?P<signal>\d+)"
)
_PROCESS_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(?P<code>-?\d+)")
_HOST_LINE = re.compile(r"Local host:\s*(?P<host>\S+)")


class StderrFilter:
    def __init__(self, keep_bytes: int = 16384) -> None:
        self.failures: list[RankFailure] = []
        self._pending = b""  # a partial line that may be (the start of) a marker
        self._mid_line = False  # the last byte shown was not a newline
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._keep = keep_bytes

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data
        self._pending = b""
        shown = bytearray()
        while buf:
            newline = buf.find(b"\n")
            if newline < 0:
                if not self._mid_line and (_MARK.startswith(buf) or buf.startswith(_MARK)):
                    self._pending = buf  # wait for the rest of the line
                else:
                    shown += buf
                    self._mid_line = True
                break
            line, buf = buf[: newline + 1], buf[newline + 1 :]
            if not self._mid_line and line.startswith(_MARK):
                failure = RankFailure.from_marker(line.decode(errors="replace"))
                if failure is not None:
                    self.failures.append(failure)
                    continue
            shown += line
            self._mid_line = False
        self._remember(bytes(shown))
        return bytes(shown)

    def flush(self) -> bytes:
        rest, self._pending = self._pending, b""
        self._remember(rest)
        return rest

    def _remember(self, data: bytes) -> None:
        if not data:
            return
        self._tail.append(data)
        self._tail_size += len(data)
        while self._tail_size > self._keep and len(self._tail) > 1:
            self._tail_size -= len(self._tail.popleft())

    def tail_text(self) -> str:
        return b"".join(self._tail).decode(errors="replace")[-self._keep :]


def parse_mpirun_verdict(text: str) -> RankFailure | None:
    """mpirun's own account of the first failed process, when the rank wrapper could not report."""
    noticed = _NOTICED.search(text)
    if noticed:
        return RankFailure(
            rank=int(noticed["rank"]), host=noticed["host"], signal=int(noticed["signal"]), stderr_tail=""
        )
    name = _PROCESS_NAME.search(text)
    code = _EXIT_CODE.search(text)
    if name and code:
        host = _HOST_LINE.search(text)
        return RankFailure(
            rank=int(name["rank"]), host=host["host"] if host else None, exit_code=int(code["code"])
        )
    return None
