"""A rank's side of in-flight, inside the training script's own process: each step's wall-clock times, when
this rank was ready for the step's collective and (where it is known) when the collective was done, written
as lines to the pipe its rank wrapper gave it (wire.INFLIGHT_FD). A line is `[[SEQ,READY,DONE],...]`, DONE
`null` when unknown.

Imported into the script's process (runscript/run.py), so it imports only modules every interpreter has
loaded (a user's `json.py` beside the script shadows nothing), never blocks (the pipe is non-blocking; what
does not fit is held, bounded, and the oldest steps are dropped) and never raises into the script.
"""

import _thread
import os
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

FLUSH_EVERY = 1.0  # seconds between writes to the pipe (a rank's lines are read about this often)
LINE_MAX = 4000  # bytes a write holds at most: under PIPE_BUF, so a write is whole or refused
HELD_MAX = 10_000  # steps held while the pipe is full; beyond that the oldest are dropped

_current: "list[Recorder]" = []  # this process's Recorder, once start() was called


def step_text(seq: int, ready: float, done: "float | None") -> str:
    """One step as the line's element. Pure."""
    end = "null" if done is None else f"{done:.6f}"
    return f"[{seq},{ready:.6f},{end}]"


def pack(steps: "list[str]", limit: int = LINE_MAX) -> "list[tuple[bytes, int]]":
    """Steps (step_text) as lines of at most `limit` bytes each, with how many steps each holds. Pure."""
    lines: list[tuple[bytes, int]] = []
    batch: list[str] = []
    size = 3
    for text in steps:
        if batch and size + len(text) + 1 > limit:
            lines.append((("[" + ",".join(batch) + "]\n").encode(), len(batch)))
            batch, size = [], 3
        batch.append(text)
        size += len(text) + 1
    if batch:
        lines.append((("[" + ",".join(batch) + "]\n").encode(), len(batch)))
    return lines


class Recorder:
    """Numbers the steps of this rank (0, 1, ...: every rank of a synchronous job takes the same steps) and
    writes them every FLUSH_EVERY seconds."""

    def __init__(self, fd: int, clock: "Callable[[], float]" = time.time) -> None:
        self.fd = fd
        self.clock = clock
        self.seq = 0
        self.held: list[str] = []
        self.flushed_at = time.monotonic()
        self.hooked = False  # a framework's own path records (inflight/tfgraph.py): step() stays out of it
        self.dropped = 0
        self.lock = _thread.allocate_lock()  # TensorFlow records from its own threads

    def step(self, ready: "float | None" = None, done: "float | None" = None) -> None:
        with self.lock:
            at = self.clock() if ready is None else ready
            self.held.append(step_text(self.seq, at, done))
            self.seq += 1
            if len(self.held) > HELD_MAX:
                self.dropped += len(self.held) - HELD_MAX
                del self.held[: len(self.held) - HELD_MAX]
            now = time.monotonic()
            if now - self.flushed_at >= FLUSH_EVERY:
                self.flushed_at = now
                self._flush()

    def _flush(self) -> None:
        sent = 0
        for line, count in pack(self.held):
            try:
                os.write(self.fd, line)
            except BlockingIOError:  # the wrapper is behind: held for the next flush
                break
            except OSError:  # the wrapper is gone: nothing more is recorded
                self.fd = -1
                break
            sent += count
        del self.held[:sent]


def start(fd: int) -> "Recorder | None":
    """This process's recorder, writing to `fd` (made non-blocking, closed on exec); None when `fd` is no
    pipe this process holds."""
    try:
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)
    except OSError:
        return None
    _current[:] = [Recorder(fd)]
    return _current[0]


def current() -> "Recorder | None":
    """The recorder, while it can still write."""
    recorder = _current[0] if _current else None
    return recorder if recorder is not None and recorder.fd >= 0 else None
