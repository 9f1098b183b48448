"""Read mpirun's stderr as it streams: pass it through, pick out rank-failure markers and mpirun's verdict.

`StderrFilter.feed` returns the bytes to show (marker lines are removed, everything else is passed at once,
partial lines included, so progress bars keep working). When no marker arrived (the wrapper itself was
killed), `parse_mpirun_verdict` reads mpirun's own message for the failing rank, host and code.

It also notices when Open MPI announces that the job aborts (`abort_notice`: the first sentence of that
message). Ranks that cannot reach each other print such a notice and may then never exit (stuck in a
collective or in MPI_Finalize), so mpirun never does either: the supervisor ends it after a grace period.
"""

from __future__ import annotations

import re
from collections import deque

from smhvd.report.failure import MARKER, RankFailure
from smhvd.report.summary import RankStart
from smhvd.wire import START_MARKER, STDOUT_MARK

_MARK = MARKER.encode()
_START = START_MARKER.encode()
_MARKS = (_MARK, _START, STDOUT_MARK)
_NOTICED = re.compile(
    r"process rank (?P<rank>\d+) with PID \d+ on node (?P<host>\S+) exited on signal (?P<signal>\d+)"
)
_PROCESS_NAME = re.compile(r"Process name:\s*\[\[\d+,\d+\],(?P<rank>\d+)\]")
_EXIT_CODE = re.compile(r"Exit code:\s*(?P<code>-?\d+)")
_HOST_LINE = re.compile(r"Local host:\s*(?P<host>\S+)")
# Lines by which Open MPI says the whole job is going down (help messages of Open MPI 4.1's ompi/orte).
ABORT_SIGNS = (
    "Your MPI job is now going to abort",
    "MPI_ABORT was invoked",
    "unable to reach each other for MPI communications",  # (a line break may fall anywhere in it)
    "ORTE has lost communication with a remote daemon",
    "ORTE does not know how to route a message",
)
# Horovod's stall inspector: "One or more tensors were submitted to be reduced, gathered or broadcasted by
# subset of ranks and are waiting for remainder of ranks for more than 60 seconds. ..."
HOROVOD_STALL = "are waiting for remainder of ranks"
_RULE = re.compile(r"^-{20,}$")
_SENTENCE_END = re.compile(r"(?<=[.;])\s")
NOTICE_LIMIT = 300


def first_sentence(lines: list[str]) -> str:
    """The first sentence of an Open MPI message block, on one line."""
    text = " ".join(" ".join(lines).split())
    head = _SENTENCE_END.split(text, maxsplit=1)[0].rstrip(".;")
    return head[: NOTICE_LIMIT - 3] + "..." if len(head) > NOTICE_LIMIT else head


class StderrFilter:
    def __init__(self, keep_bytes: int = 16384) -> None:
        self.failures: list[RankFailure] = []
        self.starts: list[RankStart] = []  # each rank's start (the rank wrapper's start markers)
        self._pending = b""  # a partial line that may be (the start of) a marker
        self._mid_line = False  # the last byte shown was not a newline
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._keep = keep_bytes
        self.abort_notice: str | None = None  # Open MPI's own word that the job aborts
        self.stall_notice: str | None = None  # Horovod's stall warning (ranks waiting for others)
        self._block: list[str] = []  # lines of the current Open MPI message (between rules of dashes)
        self._partial = b""  # the shown output's last, unfinished line
        self._stdout = bytearray()  # the ranks' stdout lines found since take_stdout()

    def feed(self, data: bytes) -> bytes:
        buf = self._pending + data
        self._pending = b""
        shown = bytearray()
        while buf:
            newline = buf.find(b"\n")
            if newline < 0:
                if not self._mid_line and any(m.startswith(buf) or buf.startswith(m) for m in _MARKS):
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
            if not self._mid_line and line.startswith(_START):
                start = RankStart.from_marker(line.decode(errors="replace"))
                if start is not None:
                    self.starts.append(start)
                    continue
            if not self._mid_line and line.startswith(STDOUT_MARK):
                self._stdout += line[len(STDOUT_MARK) :]  # a rank's stdout line (proc/lines.py): to stdout
                continue
            shown += line
            self._mid_line = False
        self._scan(bytes(shown))
        self._remember(bytes(shown))
        return bytes(shown)

    def _scan(self, shown: bytes) -> None:
        lines = (self._partial + shown).split(b"\n")
        self._partial = lines.pop()[-4096:]
        for line in lines:
            self._scan_line(line.decode(errors="replace").strip())

    def _scan_line(self, line: str) -> None:
        """Open MPI's messages stand between rules of dashes: read each whole message when it closes."""
        if self.stall_notice is None and HOROVOD_STALL in line:
            self.stall_notice = line[:NOTICE_LIMIT]
        if not _RULE.match(line):
            self._block.append(line)
            if len(self._block) > 60:  # not a message block: keep the memory bounded
                del self._block[:-30]
            return
        block, self._block = self._block, []
        text = " ".join(" ".join(block).split())
        if self.abort_notice is None and any(sign in text for sign in ABORT_SIGNS):
            self.abort_notice = first_sentence(block)

    def take_stdout(self) -> bytes:
        """The ranks' stdout lines that came with the stderr fed so far (their marks taken off)."""
        out, self._stdout = bytes(self._stdout), bytearray()
        return out

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
