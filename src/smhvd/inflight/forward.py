"""In the rank wrapper: the program's step lines (record.py) and this rank's samples (signals.py), passed on
as INFLIGHT frames, one JSON document a line, with the rank and host they are of:
`{"rank": R, "host": H, "steps": [[SEQ, READY, DONE], ...]}` and `{"rank": R, "host": H, "local_rank": L,
"signals": {...}}`. The program is the user's: a line that is not steps is dropped, never passed on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from smhvd import wire
from smhvd.inflight.signals import Sampler

LINE_MAX = 1 << 16  # a line in progress longer than this is not the recorder's: dropped
STEPS_MAX = 1000  # steps a line may hold


def _time(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse_steps(line: bytes) -> list[list[Any]] | None:
    """A recorder's line as its steps, or None when it is not one. Pure."""
    try:
        return valid_steps(json.loads(line))
    except ValueError:
        return None


def valid_steps(steps: object) -> list[list[Any]] | None:
    """`steps` when it is a list of [SEQ, READY, DONE] (DONE a time or None), else None. Pure."""
    if not isinstance(steps, list) or not 0 < len(steps) <= STEPS_MAX:
        return None
    for item in steps:
        if not (isinstance(item, list) and len(item) == 3):
            return None
        seq, ready, done = item
        if not (isinstance(seq, int) and not isinstance(seq, bool) and seq >= 0 and _time(ready)):
            return None
        if done is not None and not _time(done):
            return None
    return steps


class Forward:
    """One rank's in-flight reports to `send(kind, data)` (the rank wrapper's Sink)."""

    def __init__(
        self,
        send: Callable[[int, bytes], object],
        rank: int | None,
        host: str | None,
        local_rank: int | None,
        pid: int,
    ) -> None:
        self.send, self.rank, self.host, self.local_rank = send, rank, host, local_rank
        self.pending = b""
        self.sampler = Sampler(pid, host_wide=local_rank == 0)

    def _report(self, **fields: Any) -> None:
        document = {"rank": self.rank, "host": self.host, **fields}
        self.send(wire.INFLIGHT, json.dumps(document, separators=(",", ":")).encode() + b"\n")

    def feed(self, chunk: bytes) -> None:
        """The program wrote `chunk` on its in-flight pipe."""
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()
        if len(self.pending) > LINE_MAX:
            self.pending = b""
        for line in lines:
            steps = parse_steps(line)
            if steps is not None:
                self._report(steps=steps)

    def sample(self) -> None:
        """Every signals.SAMPLE_EVERY seconds while the program runs."""
        self._report(local_rank=self.local_rank, signals=self.sampler.sample())
