"""One stream of a rank's program as lines: bytes in, whole lines out, each tagged `[RANK,HOST]<stdout>: `
(Open MPI's --tag-output form, with the host; untagged with launcher_tag_output=false: bytes as they came).
A line in progress is shown as docs/output.md's "Progress bars" says; a line longer than MAX_PIECE goes on in
pieces the leader joins again (mpi/output.py). Pure but for the clock the caller passes.
"""

from __future__ import annotations

from dataclasses import dataclass

PROGRESS_EVERY = 0.5  # a line in progress is shown this long after it changed, and at most this often
MAX_PIECE = 1 << 16  # a line with no end in sight goes on in pieces of about this size


def tag(rank: int | None, host: str | None, stream: str) -> bytes:
    """`[RANK,HOST]<stream>: `. Pure."""
    return f"[{'?' if rank is None else rank},{host or '?'}]<{stream}>: ".encode()


def visible(line: bytes) -> bytes:
    """What a terminal shows of a line rewritten with carriage returns: the text after the last one (before
    it, when the line ends with one). Pure."""
    if b"\r" not in line:
        return line
    for segment in reversed(line.split(b"\r")):
        if segment:
            return segment
    return b""


@dataclass(frozen=True)
class Out:
    """What a stream passes on: `lines` (whole lines, or the start of a long one: the leader holds what
    follows its last newline until the rest comes) and `in_progress` (untagged: a line in progress, shown as
    is before its end comes)."""

    lines: bytes = b""
    in_progress: bytes = b""


NOTHING = Out()


class Lines:
    """One stream of the program (stdout or stderr): `feed` its bytes, ask `progress` when `due`, and
    `finish` when it ends."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix  # b"": untagged, bytes kept exactly
        self.partial = b""  # the line in progress
        self.continuing = False  # the start of the line in progress went on already (a long line)
        self.due: float | None = None  # when the line in progress is shown next
        self.shown_at = float("-inf")  # when it was last shown
        self.shown = b""  # what was shown of it

    def feed(self, chunk: bytes, now: float) -> Out:
        data = self.partial + chunk
        end = data.rfind(b"\n")
        out = b""
        if end >= 0:
            out = self._whole(data[:end])
            data = data[end + 1 :]
            self.shown = b""
            self.due = None
            self.shown_at = float("-inf")
        if self.prefix and data.count(b"\r") > 1:  # tagged, a rewritten line keeps what it may still show
            data = b"\r".join(data.split(b"\r")[-2:])
        self.partial = data
        if len(self.partial) > MAX_PIECE:  # no end in sight: its start goes on now, joined by the leader
            out += (b"" if self.continuing else self.prefix) + self.partial
            self.partial = b""
            self.continuing = True
            self.due = None
        elif self.partial and self.due is None and not self.continuing:
            self.due = max(now, self.shown_at) + PROGRESS_EVERY
        return Out(lines=out) if out else NOTHING

    def _whole(self, text: bytes) -> bytes:
        """Complete lines (`text` without its last newline) as they go on."""
        first = b"" if self.continuing else self.prefix
        self.continuing = False
        if not self.prefix:
            return text + b"\n"
        if b"\r" in text:
            text = b"\n".join(visible(line) for line in text.split(b"\n"))
        return first + text.replace(b"\n", b"\n" + self.prefix) + b"\n"

    def progress(self, now: float) -> Out:
        """The line in progress, when it is due to be shown."""
        if self.due is None or now < self.due:
            return NOTHING
        self.due = None
        self.shown_at = now
        if not self.prefix:  # untagged: its bytes so far, as they are
            data, self.partial = self.partial, b""
            return Out(in_progress=data)
        state = visible(self.partial)
        if not state or state == self.shown:
            return NOTHING
        self.shown = state
        return Out(lines=self.prefix + state + b"\n")

    def finish(self) -> Out:
        """The stream ended: its unfinished last line, ended with a newline."""
        if not self.partial and not self.continuing:
            return NOTHING
        data, self.partial = self.partial, b""
        self.due = None
        out = self._whole(data)
        return Out(lines=out)
