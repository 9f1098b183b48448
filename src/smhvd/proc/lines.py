"""A rank's output, passed on in whole lines, each tagged with the rank and host it came from.

Ranks share one log: mpirun forwards what each rank writes as it reads it, so a line a rank writes in pieces
(an unbuffered `print` writes its text and its newline apart) is cut by other ranks' output
(`...allreduce 10probe rank 2/4`), and so is a line that waits in the rank's pipe behind others when mpirun
reads a piece of its own size. The rank wrapper therefore reads the program's stdout and stderr itself and
writes each complete line, tagged `[RANK,HOST]<stdout>: ` (or `<stderr>`: the form of Open MPI's --tag-output,
with the host), in a write of its own to its stderr (a pipe; Open MPI gives stdout a pseudo-terminal, whose
unread bytes cannot be counted), and only once mpirun has read that pipe empty: each of mpirun's reads holds
one whole line. A line that came from the program's stdout starts with mpi/output.STDOUT_MARK, which the
launcher's supervisor takes off before writing the line to its own stdout.

Metric regexes (SageMaker's `metric_definitions`, which CloudWatch searches anywhere in a line) still match as
long as they are not anchored with `^`; to read one rank's figures, start the regex with its tag, e.g.
`\\[0,[^]]*\\]<stdout>: .*loss: ([0-9.]+)`. A line longer than MAX_LINE bytes goes on in pieces, each tagged.
"""

from __future__ import annotations

import fcntl
import os
import struct
import termios
import time
from collections.abc import Callable

MAX_LINE = 4000  # below PIPE_BUF (4096): one write of a tagged line reaches the pipe whole


def tag(rank: int | None, host: str | None, stream: str) -> bytes:
    """`[RANK,HOST]<stream>: `. Pure."""
    return f"[{'?' if rank is None else rank},{host or '?'}]<{stream}>: ".encode()


DRAIN_WAIT = 2.0  # at most this long for mpirun to read a pipe empty (then the batch goes in anyway)


def queued(fd: int) -> int | None:
    """Bytes written to the pipe `fd` that its reader has not read yet; None when `fd` is not a pipe."""
    if os.isatty(fd):
        return None  # a pseudo-terminal's writer cannot count what its reader has not read yet
    try:
        return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
    except OSError:
        return None


def wait_drained(fd: int, limit: float = DRAIN_WAIT) -> None:
    """Until the reader emptied the pipe, bounded (a reader that stopped reading does not stop the rank)."""
    deadline = time.monotonic() + limit
    pause = 0.0001
    while (queued(fd) or 0) > 0 and time.monotonic() < deadline:
        time.sleep(pause)  # polled: a pipe's writer is told when there is room, never when it is empty
        pause = min(pause * 2, 0.01)


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def write_paced(fd: int, line: bytes) -> None:
    """A whole line to `fd`, once the pipe behind it has been read empty."""
    wait_drained(fd)
    write_all(fd, line)


class LineWriter:
    """Whole lines of one stream to `write`, one line a call, each behind `prefix` (b"" for no tag)."""

    def __init__(self, write: Callable[[bytes], None], prefix: bytes) -> None:
        self._write = write
        self._prefix = prefix
        self._partial = b""
        self._limit = max(MAX_LINE - len(prefix) - 1, 64)

    def feed(self, chunk: bytes) -> None:
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()
        while len(self._partial) > self._limit:  # a line with no end in sight: passed on in pieces
            lines.append(self._partial[: self._limit])
            self._partial = self._partial[self._limit :]
        self._emit(lines)

    def _emit(self, lines: list[bytes]) -> None:
        for line in lines:
            for start in range(0, max(len(line), 1), self._limit):
                self._write(self._prefix + line[start : start + self._limit] + b"\n")

    def flush(self) -> None:
        """The unfinished last line, ended (the program exited without a newline)."""
        if self._partial:
            self._emit([self._partial])
            self._partial = b""
