"""Read mpirun's stderr as it streams: the ranks' frames, mpirun's own words, and mpirun's verdict.

With --tag-output every piece of a rank wrapper's stderr Open MPI read (at most wire.FRAME_MAX bytes) comes
behind `[JOB,RANK]<stderr>:`; the wrapper writes whole frames of at most that size in one write each, so a
piece ends at a frame's end unless it is FRAME_MAX long. `FrameReader` joins each rank's frames and lines
whatever came between them and passes what is no frame as text (why it holds: docs/output.md).
`StderrFilter` routes it: stdout lines to stdout, stderr lines and mpirun's text to stderr, start and failure
reports to the summary and the failure file, in-flight reports to whoever watches the job (inflight/);
`parse_mpirun_verdict` reads mpirun's own message when no report came. `abort_notice`: Open MPI announced
that the job aborts (the supervisor ends a mpirun that then hangs).
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable

from smhvd import wire
from smhvd.wire import RankFailure, RankStart

TEXT = 0  # FrameReader's kind for what is not a frame
MAX_LINE = 1 << 20  # a rank's line in progress is held up to this size, then passed on as it is
_DIRECT = b"-"  # the rank of frames that came without a tag (one rank wrapper run without mpirun)
_TAG = re.compile(rb"\[\d+,(\d+)\]<(?:stdout|stderr|stddiag)>:")
_TEXT_END = re.compile(rb"\n|\[\d+,\d+\]<(?:stdout|stderr|stddiag)>:|\x1c")
_PIECE_STREAM = {wire.STDOUT_PIECE: wire.STDOUT, wire.STDERR_PIECE: wire.STDERR}  # a piece kind: its stream
_LINES = (wire.STDOUT, wire.STDERR)


class FrameReader:
    """mpirun --tag-output's stderr (or one rank wrapper's, run directly) taken apart. `feed` returns, in
    order, (TEXT, bytes) for what is not a frame and (kind, bytes) for the whole lines of each frame kind
    (wire.STDOUT and wire.STDERR: the streams' bytes; wire.START and wire.FAILURE: one JSON a line)."""

    def __init__(self) -> None:
        self._buf = b""
        self._rank: bytes | None = None  # the rank whose piece is being read
        self._left: int | None = None  # at most this many bytes of the piece are left (None: no limit)
        self._tag = b""  # the piece's tag, until something of the piece was read
        self._frames: dict[bytes, bytearray] = {}  # per rank: the frame being read (its kind first)
        self._pending: dict[tuple[bytes, int], bytes] = {}  # per rank and kind: its line in progress

    def feed(self, data: bytes, final: bool = False) -> list[tuple[int, bytes]]:
        buf = self._buf + data
        events: list[tuple[int, bytes]] = []
        p, n = 0, len(buf)
        while p < n:
            if self._rank is not None:
                p += self._piece(buf, p, events)
                continue
            if buf[p] == ord("["):
                tagged = _TAG.match(buf, p)
                if tagged:
                    self._rank, self._left, self._tag = tagged.group(1), wire.FRAME_MAX, tagged.group(0)
                    p = tagged.end()
                    continue
                if not final and n - p < 64 and b"\n" not in buf[p:]:
                    break  # perhaps a tag cut short
            elif buf[p] == wire.FRAME_START:
                self._rank, self._left, self._tag = _DIRECT, None, b""
                continue
            found = _TEXT_END.search(buf, p) if buf[p] == ord("\n") else _TEXT_END.search(buf, p + 1)
            if found is None:
                if not final and n - p < 65536:
                    break  # the rest of the line is coming
                end = n
            else:
                end = found.end() if found.group() == b"\n" else found.start()
            events.append((TEXT, buf[p:end]))
            p = end
        self._buf = buf[p:]
        return events

    def _piece(self, buf: bytes, p: int, events: list[tuple[int, bytes]]) -> int:
        """Read on in the current rank's piece from `p` (< len(buf)): how many bytes were taken."""
        rank = self._rank
        assert rank is not None
        limit = len(buf) if self._left is None else min(len(buf), p + self._left)
        frame = self._frames.get(rank)
        if frame is None:  # between frames
            if buf[p] != wire.FRAME_START:  # the piece ended here: what follows is not this rank's
                if self._tag:  # a line the rank wrapper wrote itself, behind Open MPI's tag
                    events.append((TEXT, self._tag))
                self._rank = None
                return 0
            self._frames[rank] = bytearray()
            end = p + 1
        else:
            found = buf.find(b"\x1f", p, limit)
            end = limit if found < 0 else found + 1
            frame += buf[p : end if found < 0 else found]
            if found >= 0:
                del self._frames[rank]
                self._complete(rank, bytes(frame), events)
        self._tag = b""
        if self._left is not None:
            self._left -= end - p
            if self._left <= 0:
                self._rank = None
        return end - p

    def _complete(self, rank: bytes, frame: bytes, events: list[tuple[int, bytes]]) -> None:
        if not frame:
            return
        kind, body = frame[0], frame[1:]
        if kind not in wire.KINDS:
            events.append((TEXT, wire.body_lines(body)))
            return
        stream = _PIECE_STREAM.get(kind, kind)
        pending = self._pending.pop((rank, stream), b"") + body
        if kind in _PIECE_STREAM:
            out, pending = pending, b""
        else:
            cut = pending.rfind(b"\x1e") + 1
            out, pending = pending[:cut], pending[cut:]
            if len(pending) > MAX_LINE and stream in _LINES:  # too long to hold: passed on as it is
                keep = 1 if pending.endswith(b"\x1d") else 0  # an escape stays with its digit
                out, pending = out + pending[: len(pending) - keep], pending[len(pending) - keep :]
        if pending:
            self._pending[(rank, stream)] = pending
        if out:
            events.append((stream, wire.body_lines(out)))

    def finish(self) -> list[tuple[int, bytes]]:
        """The stream ended: what is left, frames cut short and lines without their end included."""
        events = self.feed(b"", final=True)
        for rank, frame in list(self._frames.items()):
            self._complete(rank, bytes(frame), events)
        self._frames.clear()
        for (_, stream), pending in self._pending.items():
            if stream in _LINES:
                events.append((stream, wire.body_lines(pending) + b"\n"))
        self._pending.clear()
        self._rank = None
        return events


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


def _ignore(_lines: bytes) -> None:
    pass


class StderrFilter:
    def __init__(self, keep_bytes: int = 16384, inflight: Callable[[bytes], object] = _ignore) -> None:
        self.reader = FrameReader()
        self.inflight = inflight  # the ranks' in-flight reports (wire.INFLIGHT lines), as they come
        self.failures: list[RankFailure] = []
        self.starts: list[RankStart] = []  # each rank's start (the rank wrappers' start frames)
        self._tail: deque[bytes] = deque()
        self._tail_size = 0
        self._keep = keep_bytes
        self.abort_notice: str | None = None  # Open MPI's own word that the job aborts
        self.stall_notice: str | None = None  # Horovod's stall warning (ranks waiting for others)
        self._block: list[str] = []  # lines of the current Open MPI message (between rules of dashes)
        self._partial = b""  # the shown output's last, unfinished line
        self._stdout = bytearray()  # the ranks' stdout lines found since take_stdout()

    def feed(self, data: bytes) -> bytes:
        """What to show on stderr of `data` (the ranks' stdout lines are kept for take_stdout)."""
        return self._route(self.reader.feed(data))

    def flush(self) -> bytes:
        """mpirun's stderr ended: what is left of it."""
        return self._route(self.reader.finish())

    def _route(self, events: list[tuple[int, bytes]]) -> bytes:
        shown = bytearray()
        for kind, data in events:
            if kind == wire.STDOUT:
                self._stdout += data
            elif kind == wire.START:
                self.starts += [s for line in data.splitlines() if (s := RankStart.from_json(line))]
            elif kind == wire.FAILURE:
                self.failures += [f for line in data.splitlines() if (f := RankFailure.from_json(line))]
            elif kind == wire.INFLIGHT:
                self.inflight(data)
            else:  # the ranks' stderr lines and mpirun's own text
                shown += data
        text = bytes(shown)
        self._scan(text)
        self._remember(text)
        return text

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
        """The ranks' stdout lines that came with the stderr fed so far."""
        out, self._stdout = bytes(self._stdout), bytearray()
        return out

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
