"""The leader-worker link (docs/multi-host.md) and its words, JSON lines of one Event each: `linked` (the
leader took this session as its link: one closed before that was an attempt it gave up), `start`, `alive`
every HEARTBEAT_INTERVAL while the job runs, `stop`, and `end` with the exit code and reason. What each means
to a worker, in each of its states: roles/worker.py. A worker's words back, once linked and until the start:
`preparing` (the step it is in, as `reason`), `prepared`, or `end` (why it could not prepare).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# The relay's word that it reached the worker's `train` (the leader finds it in whatever came before it).
READY = b"\x1esmhvd-link ready\n"
HEARTBEAT_INTERVAL = 2.0  # the leader says `alive` this often while the job runs
SILENCE_LIMIT = 10.0  # a worker whose job runs declares the leader lost after this long without a word
LINKED, START, ALIVE, STOP, END = "linked", "start", "alive", "stop", "end"
PREPARING, PREPARED = "preparing", "prepared"  # a worker's, to the leader


@dataclass(frozen=True)
class Event:
    kind: str
    exit_code: int = 0  # `end`
    reason: str = ""  # `end`: the failure file's text, empty on success; `preparing`: the step

    def encode(self) -> bytes:
        fields: dict[str, object] = {"event": self.kind}
        if self.kind == END:
            fields.update(exit_code=self.exit_code, reason=self.reason)
        elif self.kind == PREPARING:
            fields.update(reason=self.reason)
        return json.dumps(fields, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes) -> Event | None:
        """The event of one line; None for anything else (an `end` without an integer code is not one)."""
        try:
            data = json.loads(line)
            kind, code, reason = data["event"], data.get("exit_code", 0), data.get("reason", "")
        except (ValueError, KeyError, TypeError, AttributeError):
            return None
        if not isinstance(kind, str) or isinstance(code, bool) or not isinstance(code, int):
            return None
        return cls(kind, code, reason if isinstance(reason, str) else "")
