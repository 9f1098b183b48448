"""What the leader hears while the probes run: mpirun's output read line by line into evidence kept apart by
who said it.

- a probe's findings (wire.PREFLIGHT_MARK lines, tagged by mpirun with the probe's rank): typed, by rank;
- mpirun's own lines (untagged: mpirun's and its daemons' messages): kept whole, in a buffer of their own
  that a rank's output never evicts (NCCL_DEBUG=INFO prints hundreds of lines a probe);
- a rank's other lines (tagged): shown in a note, never matched, except Open MPI's own error log written in
  that rank's process (`[algo-3:00304] PMIX ERROR: ...`) naming the host the tag says it ran on: a host's
  output can say something only about itself, and only in Open MPI's form (blame.py).
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from smhvd.mpi.output import ABORT_SIGNS, first_sentence
from smhvd.wire import PREFLIGHT_MARK

from .launch import Launch

MPIRUN_LINES = 400  # mpirun's own lines kept (its messages are 10-30 lines): rank output never takes a place
RANK_LINES = 20  # a rank's other lines kept, to show
MESSAGE_LIMIT = 1500  # characters of mpirun's message in a reason and the notes
_RULE = re.compile(r"^-{20,}$")  # the border of an Open MPI message
_TAG = re.compile(rb"^\[\d+,(\d+)\]<std(?:out|err)>:")
# Open MPI's (and PMIx's) own error log, as its libraries write it in a rank's process: "[host:pid] ".
_OPEN_MPI_ERROR = re.compile(
    rb"^\[(?P<host>[^\]\s:]+):\d+\] (?:\[\[\d+,\d+\],\d+\] )?(?:PMIX ERROR|ORTE_ERROR_LOG|OPAL ERROR)"
)


class Silent(Exception):
    """The wait for the probes ends: a rank fell silent, Open MPI said it aborts, or the launch stalled."""


def parse_line(line: bytes) -> tuple[int, dict[str, Any]] | None:
    """(rank, finding) of one output line of mpirun (tagged) or of a lone probe (rank 0). Pure."""
    rank = 0
    tag = _TAG.match(line)
    if tag:
        rank = int(tag.group(1))
        line = line[tag.end() :]
    mark = PREFLIGHT_MARK.encode()
    if not line.startswith(mark):
        return None
    try:
        finding = json.loads(line[len(mark) :])
    except ValueError:
        return None
    return (rank, finding) if isinstance(finding, dict) else None


def tagged(line: bytes) -> bool:
    """Whether mpirun tagged the line as a rank's output (anything else is mpirun's own). Pure."""
    return _TAG.match(line) is not None


def open_mpi_error(line: bytes, hosts: tuple[str, ...]) -> int | None:
    """The rank whose own process logged this Open MPI error about its own host (the tag's rank ran on the
    host the log names), else None: any other text of a rank is no evidence. Pure."""
    tag = _TAG.match(line)
    if tag is None or not 0 <= int(tag.group(1)) < len(hosts):
        return None
    logged = _OPEN_MPI_ERROR.match(line[tag.end() :])
    rank = int(tag.group(1))
    return rank if logged and logged["host"].decode(errors="replace") == hosts[rank] else None


@dataclass
class Collected:
    """Findings by rank as they arrive, and when each rank last spoke (the runner's clock)."""

    hosts: tuple[str, ...]
    clock: Callable[[], float] = time.monotonic
    started: float | None = None  # when the probes' command started (the runner's clock)
    heard: dict[int, float] = field(default_factory=dict)
    first_word: float | None = None
    done: set[int] = field(default_factory=set)
    found: dict[int, dict[str, Any]] = field(default_factory=dict)
    phases: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> finding -> its probe's time
    own: deque[bytes] = field(default_factory=lambda: deque(maxlen=MPIRUN_LINES))  # mpirun's own lines
    rank_lines: deque[bytes] = field(default_factory=lambda: deque(maxlen=RANK_LINES))  # shown, not matched
    open_mpi_errors: dict[int, bytes] = field(default_factory=dict)  # rank -> its first Open MPI error line
    exit_code: int | None = None  # mpirun's, when it exited by itself
    launch: Launch | None = None  # mpirun's launch, as seen when no probe had said a word (launch.py)
    abort_notice: str | None = None  # Open MPI said the job aborts: nothing more will come
    _rest: bytes = b""

    def feed(self, chunk: bytes) -> None:
        self._rest += chunk
        *lines, self._rest = self._rest.split(b"\n")
        now = self.clock()
        for line in lines:
            parsed = parse_line(line)
            if parsed is None:
                self._other(line)
                continue
            rank, finding = parsed
            if not 0 <= rank < len(self.hosts):
                continue
            self.heard[rank] = now
            self.first_word = now if self.first_word is None else self.first_word
            if finding.get("done"):
                self.done.add(rank)
            kinds = {k: v for k, v in finding.items() if k not in ("beat", "t")}
            self.found.setdefault(rank, {}).update(kinds)
            if isinstance(finding.get("t"), int | float):
                self.phases.setdefault(rank, {}).update(dict.fromkeys(kinds, float(finding["t"])))

    def _other(self, line: bytes) -> None:
        """A line that is no finding: mpirun's own (untagged), or a rank's (tagged)."""
        if not line.strip():
            return
        if not tagged(line):
            self.own.append(line)
            self._notice_abort()
            return
        self.rank_lines.append(line)
        rank = open_mpi_error(line, self.hosts)
        if rank is not None:
            self.open_mpi_errors.setdefault(rank, line)

    def _notice_abort(self) -> None:
        lines = [line.decode(errors="replace").strip() for line in self.own]
        text = " ".join(" ".join(lines).split())
        if self.abort_notice is None and any(sign in text for sign in ABORT_SIGNS):
            self.abort_notice = first_sentence(lines)

    @property
    def failed(self) -> bool:
        """The probes' MPI job failed: mpirun exited non-zero, or Open MPI said the job aborts."""
        return self.abort_notice is not None or self.exit_code not in (None, 0)

    def silent(self, limit: float) -> list[int]:
        """Ranks not done that have not spoken for `limit` seconds (or at all, that long after the first)."""
        now = self.clock()
        out = []
        for rank in range(len(self.hosts)):
            if rank in self.done:
                continue
            last = self.heard.get(rank, self.first_word)
            if last is not None and now - last > limit:
                out.append(rank)
        return out

    def check(self, limit: float) -> None:
        """Raise Silent when a rank fell silent while another still speaks, or Open MPI said it aborts."""
        if self.abort_notice is not None:
            raise Silent
        silent = self.silent(limit)
        now = self.clock()
        speaking = [r for r, at in self.heard.items() if r not in silent and now - at <= limit]
        if silent and (speaking or self.done):
            raise Silent


def mpirun_message(lines: Iterable[bytes]) -> str:
    """mpirun's own text, whole, on one line (its messages' borders of dashes left out). Pure."""
    text = [line.decode(errors="replace").strip() for line in lines]
    whole = " ".join(" ".join(line for line in text if line and not _RULE.match(line)).split())
    return whole if len(whole) <= MESSAGE_LIMIT else whole[: MESSAGE_LIMIT - 3] + "..."
