"""One event loop for the launcher's waits: readable and writable files (pipes, sockets, the SignalWatch fd),
process exits (a pidfd each: no SIGCHLD handler, no polling) and timers (timers.Timers), all waited for in one
select.

A wait registers what it reacts to, each with a callback, and runs the loop until a callback calls `stop()`.
Each round fires the timers that are due, then waits for the next event (at most until the next timer) and
calls each ready file's callback. Once `stop()` was called nothing more is handled: neither the rest of the
round's events nor due timers. A pidfd is closed when it is forgotten, or else when the loop ends.

`follow_output` is the one wait "read this process's output until it exits". Which waits run on a loop, and
how it came to replace their own loops: docs/architecture.md.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Protocol

from smhvd.proc.processes import drain_pipe
from smhvd.proc.timers import Timer, Timers


class HasFileno(Protocol):
    def fileno(self) -> int: ...


File = int | HasFileno


class Loop:
    """A context manager: the pidfds it opened and has not forgotten yet are closed when it ends."""

    def __init__(self, timers: Timers | None = None) -> None:
        self.timers = Timers() if timers is None else timers
        self._sel = selectors.DefaultSelector()
        self._pidfds: set[int] = set()  # open: those not forgotten yet
        self._stopped = False

    def __enter__(self) -> Loop:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._sel.close()
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()

    def reader(self, file: File, callback: Callable[[], object]) -> None:
        """Call `callback` whenever `file` is readable (also at its end: the callback reads b"" and may
        `forget` it)."""
        self._sel.register(file, selectors.EVENT_READ, callback)

    def writer(self, file: File, callback: Callable[[], object]) -> None:
        """Call `callback` whenever `file` can be written to (a socket with room in its buffer)."""
        self._sel.register(file, selectors.EVENT_WRITE, callback)

    def forget(self, file: File) -> None:
        """Stop watching `file`; a pidfd of `exit_of` is closed too (the caller's own files stay open)."""
        self._sel.unregister(file)
        if isinstance(file, int) and file in self._pidfds:
            self._pidfds.discard(file)
            os.close(file)

    def exit_of(self, pid: int, callback: Callable[[], object]) -> int:
        """Call `callback` when the child `pid` has exited (it stays a zombie until its owner reaps it). The
        pidfd, to `forget` it by: forgetting closes it (else the loop's end does), so a loop that watches
        many processes in turn (a worker's ssh attempts, retried) holds one fd a process it still watches."""
        fd = os.pidfd_open(pid)
        self._pidfds.add(fd)
        self._sel.register(fd, selectors.EVENT_READ, callback)
        return fd

    def stop(self) -> None:
        """End `run` once the running callback returns."""
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped

    def run(self) -> None:
        """Handle timers and events until a callback calls `stop()`. What a callback raises ends the loop and
        is raised here."""
        self._stopped = False
        while self._round():
            pass

    def _round(self) -> bool:
        """Fire the due timers, then handle the next events; False once stopped."""
        self.timers.fire_due()
        if self.stopped():
            return False
        for key, _ in self._sel.select(self.timers.timeout()):
            if self._sel.get_map().get(key.fd) is not key:  # forgotten by a callback of this round
                continue
            key.data()
            if self.stopped():
                return False
        return True


def follow_output(
    pid: int,
    fds: Iterable[int],
    on_output: Callable[[int, bytes], object],
    timers: Timers | None = None,
    deadline: float | None = None,
) -> bool:
    """Pass what the process `pid` writes to the pipes `fds` to `on_output(fd, chunk)` as it comes, until the
    process exits: not until every copy of its pipes closes (a child it left running may hold them and write
    forever); then what is already in the pipes, bounded, and True. False when `deadline` (the timers' clock)
    came first. `timers`: what else the wait does meanwhile."""
    open_fds = set(fds)
    exited = False
    ends = Timer("follow_output deadline")  # its own handle: the caller's timers (`timers`) keep theirs
    with Loop(timers) as loop:

        def read(fd: int) -> None:
            chunk = os.read(fd, 65536)
            if chunk:
                on_output(fd, chunk)
            else:
                loop.forget(fd)
                open_fds.discard(fd)

        def exit_() -> None:
            nonlocal exited
            exited = True
            loop.stop()

        for fd in sorted(open_fds):
            loop.reader(fd, functools.partial(read, fd))
        loop.exit_of(pid, exit_)
        if deadline is not None:
            loop.timers.at(ends, deadline, loop.stop)
        loop.run()
        loop.timers.cancel(ends)
    if exited:
        for fd in sorted(open_fds):
            for chunk in drain_pipe(fd):
                on_output(fd, chunk)
    return exited


def wait_exits(pids: Iterable[int], timeout: float) -> bool:
    """Wait until every process of `pids` has exited (children or not: a pidfd each), at most `timeout`
    seconds; True when they all did. A process already gone counts as exited."""
    ends = Timer("wait_exits deadline")
    with Loop() as loop:
        left: dict[int, int] = {}  # pid -> its pidfd

        def exited(pid: int) -> None:
            loop.forget(left.pop(pid))
            if not left:
                loop.stop()

        for pid in set(pids):
            with contextlib.suppress(ProcessLookupError):  # gone already
                left[pid] = loop.exit_of(pid, functools.partial(exited, pid))
        if not left:
            return True
        loop.timers.after(ends, timeout, loop.stop)
        loop.run()
        return not left
