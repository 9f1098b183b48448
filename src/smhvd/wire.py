"""What the launcher's processes tell each other through mpirun and the environment, in one place (the two
cross-host protocols keep theirs in link/ and hostenv/): the rank wrapper's frames in mpirun's stderr, the
variables in the ranks' environment, the pre-flight's spec and marks."""

from __future__ import annotations

import json
import re
import signal
from dataclasses import asdict, dataclass

# Frames (docs/output.md): the rank wrapper's stderr is a sequence of FRAME_START KIND BODY FRAME_END, every
# write whole frames and at most FRAME_MAX bytes (atomic: a piece Open MPI reads ends at a frame's end unless
# it is FRAME_MAX bytes long). A BODY never holds a newline (LINE_END stands for it) nor a bare 0x1C-0x1F.
FRAME_MAX = 4096  # PIPE_BUF on Linux, and Open MPI 4.1's read size (ORTE_IOF_BASE_MSG_MAX)
FRAME_START = 0x1C
ESCAPE = 0x1D
LINE_END = 0x1E
FRAME_END = 0x1F
# Kinds: the program's stdout and stderr as lines, the same as pieces shown at once (a line in progress,
# launcher_tag_output=false), and the wrapper's own start and failure reports (one JSON document a line).
STDOUT = ord("O")
STDERR = ord("E")
STDOUT_PIECE = ord("o")
STDERR_PIECE = ord("e")
START = ord("S")
FAILURE = ord("F")
INFLIGHT = ord("I")  # in-flight reports (one JSON document a line: a rank's steps, or its host's signals)
KINDS = frozenset({STDOUT, STDERR, STDOUT_PIECE, STDERR_PIECE, START, FAILURE, INFLIGHT})
_ESCAPES = ((b"\x1d", b"\x1d1"), (b"\x1c", b"\x1d0"), (b"\x1e", b"\x1d2"), (b"\x1f", b"\x1d3"))
_SPECIAL = re.compile(rb"[\x1c-\x1f]")

# The program's argv under mpirun (JSON, from roles/leader.mpirun_rank_command), never on its command line.
RANK_ARGV = "SMHVD_RANK_ARGV"
# "0": the program's lines are passed on whole but untagged (launcher_tag_output).
TAG_OUTPUT = "SMHVD_TAG_OUTPUT"
# OUTPUT_FRAMED: the rank wrapper writes its stderr as frames (above), which the launcher's supervisor reads.
OUTPUT_CHANNEL = "SMHVD_RANK_OUTPUT"
OUTPUT_FRAMED = "records"
# Where each host's `train` serves its ranks' environment: the leader's own directory (hostenv/server.py).
HOSTENV_SERVED_FROM = "SMHVD_HOSTENV"

# In-flight (inflight/, docs/inflight.md): INFLIGHT_POLICY names the policy when it is on (the leader sets it
# for every rank); the rank wrapper then gives its program the write end of a pipe, its number in INFLIGHT_FD,
# on which the program writes its steps as lines (inflight/record.py), and the wrapper passes them on as
# INFLIGHT frames with its rank, host and its samples of what could slow them (inflight/signals.py).
INFLIGHT_POLICY = "SMHVD_INFLIGHT"
INFLIGHT_FD = "SMHVD_INFLIGHT_FD"

# The pre-flight (preflight/): the leader gives its probe what to check as JSON in PREFLIGHT_SPEC (forwarded
# to every host like the job's own variables); each probe writes its findings to stdout as lines
# PREFLIGHT_MARK + one JSON object ({"beat": s}, {"facts": {...}}, {"links": {...}}, {"clock": {...}},
# {"gpu": {...}}, {"done": true}), which mpirun tags with the probe's rank.
PREFLIGHT_SPEC = "SMHVD_PREFLIGHT"
PREFLIGHT_MARK = "smhvd-preflight "
PREFLIGHT_BEAT = 0.5  # seconds between a probe's beats: a host whose beats stop has stopped answering


def escape(data: bytes) -> bytes:
    """`data` without a byte of 0x1C-0x1F (each written as ESCAPE and a digit). Pure."""
    if _SPECIAL.search(data) is None:
        return data
    for raw, escaped in _ESCAPES:
        data = data.replace(raw, escaped)
    return data


def unescape(data: bytes) -> bytes:
    """The inverse of escape. Pure."""
    if b"\x1d" not in data:
        return data
    for raw, escaped in reversed(_ESCAPES):  # ESCAPE itself last: what it gives back is never read again
        data = data.replace(escaped, raw)
    return data


def frames(kind: int, data: bytes) -> list[bytes]:
    """`data` (one stream's bytes, or JSON lines) as frames of at most FRAME_MAX bytes each. Pure."""
    body = escape(data).replace(b"\n", b"\x1e")
    room = FRAME_MAX - 3
    head = bytes((FRAME_START, kind))
    out: list[bytes] = []
    start = 0
    while start < len(body):
        end = min(start + room, len(body))
        if end < len(body) and body[end - 1] == ESCAPE:
            end -= 1  # an escape and its digit stay in one frame
        out.append(head + body[start:end] + b"\x1f")
        start = end
    return out


def writes(encoded: list[bytes]) -> list[bytes]:
    """Frames (`encoded`) packed into writes of at most FRAME_MAX bytes, each holding whole frames. Pure."""
    out: list[bytes] = []
    batch = b""
    for frame in encoded:
        if len(batch) + len(frame) > FRAME_MAX:
            out.append(batch)
            batch = b""
        batch += frame
    if batch:
        out.append(batch)
    return out


def body_lines(body: bytes) -> bytes:
    """A frame body's bytes as the stream had them (LINE_END back to newlines, escapes undone). Pure."""
    return unescape(body.replace(b"\x1e", b"\n"))


@dataclass(frozen=True)
class RankStart:
    """A rank wrapper's start (START frames), for the job summary."""

    rank: int | None
    host: str | None
    at: float  # wall clock (time.time()) when the rank wrapper started the script

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode() + b"\n"

    @classmethod
    def from_json(cls, line: bytes) -> RankStart | None:
        try:
            data = json.loads(line)
            rank, host, at = data.get("rank"), data.get("host"), data.get("at")
        except (ValueError, AttributeError):
            return None
        if not isinstance(at, int | float) or not (rank is None or isinstance(rank, int)):
            return None
        return cls(rank=rank, host=host if isinstance(host, str) else None, at=float(at))


@dataclass(frozen=True)
class RankFailure:
    """A failed rank (FAILURE frames, or mpirun's own account of it): the leader takes the first as the
    job's root cause (report/failure.py)."""

    rank: int | None
    host: str | None
    exit_code: int | None = None  # when the process exited
    signal: int | None = None  # when it was killed by a signal
    stderr_tail: str = ""

    def headline(self) -> str:
        who = "rank ?" if self.rank is None else f"rank {self.rank}"
        if self.host:
            who += f" on {self.host}"
        if self.signal is not None:
            try:
                name = signal.Signals(self.signal).name
            except ValueError:
                name = f"signal {self.signal}"
            return f"{who} was killed by signal {self.signal} ({name})"
        return f"{who} exited with code {self.exit_code}"

    def to_json(self) -> bytes:
        """One line of JSON: any size, any characters."""
        text = json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)
        return text.encode("utf-8", errors="backslashreplace") + b"\n"

    @classmethod
    def from_json(cls, line: bytes) -> RankFailure | None:
        try:
            data = json.loads(line)
            fields = {key: data.get(key) for key in ("rank", "host", "exit_code", "signal")}
            return cls(**fields, stderr_tail=str(data.get("stderr_tail") or ""))
        except (ValueError, TypeError, AttributeError):
            return None
