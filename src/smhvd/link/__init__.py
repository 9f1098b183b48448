"""The leader-worker link, and its format: how a worker learns that the job started and how it ended.

Every worker runs sshd and listens on a unix socket in its `train`'s private directory from the moment `train`
starts, before the code is fetched (link/listen.py). The leader reaches every worker at once from its own
start (link/connect.py), one ssh session each, running the relay (link/relay.py: started so that nothing
but it can print, it joins the session to the worker's socket and says READY). Both prepare the job
meanwhile, and each hears the other's end at once: a worker that ends before the start closes its link, and
the leader that ends before the start says `end` to every worker it reached.

The leader's words are JSON lines, one Event each: `linked` once it took the session as its link (a session
that closes before it was an attempt the leader gave up), `start` before mpirun starts, `alive` every
HEARTBEAT_INTERVAL while it runs, `stop` when the leader was stopped, and `end` with the job's exit code and
reason. What each word, a closed link or a silence means depends on where the worker is: roles/worker.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

# The relay's word that it reached the worker's `train` (the leader finds it in whatever came before it).
READY = b"\x1esmhvd-link ready\n"
HEARTBEAT_INTERVAL = 2.0  # the leader says `alive` this often while the job runs
SILENCE_LIMIT = 10.0  # a worker whose job runs declares the leader lost after this long without a word
LINKED, START, ALIVE, STOP, END = "linked", "start", "alive", "stop", "end"


@dataclass(frozen=True)
class Event:
    kind: str
    exit_code: int = 0  # `end`
    reason: str = ""  # `end`: the failure file's text, empty on success

    def encode(self) -> bytes:
        fields: dict[str, object] = {"event": self.kind}
        if self.kind == END:
            fields.update(exit_code=self.exit_code, reason=self.reason)
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
