"""The process's one event loop, for its whole life: readable and writable files, process exits (a pidfd
each) and timers, waited for in one select, each owner's in a Scope (docs/architecture.md). Once stopped,
nothing more is handled, neither the round's other events nor due timers. A cleanup's wait for processes
(`wait_exits`) has a loop of its own: nothing but its processes is handled while something ends.
"""

from __future__ import annotations

import contextlib
import functools
import os
import selectors
from collections.abc import Callable, Iterable
from typing import Protocol, Self

from smhvd.proc.processes import drain_pipe
from smhvd.proc.timers import Timer, Timers


class HasFileno(Protocol):
    def fileno(self) -> int: ...


File = int | HasFileno


class Closing:
    """What holds fds and gives them back when the `with` block that entered it ends (`close()`)."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Loop(Closing):
    """One select over every open scope's files and timers. A context manager: its end closes it."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._timers: list[Timers] = []  # the open scopes' (one entry a scope: a Timers may be shared)
        self._stopped = False
        self._running = False

    def close(self) -> None:
        self._sel.close()

    def scope(self, timers: Timers | None = None) -> Scope:
        """A new owner's view of the loop, with its own timers (a new Timers unless given)."""
        return Scope(self, self._sel, self._timers, Timers() if timers is None else timers)

    def stop(self) -> None:
        """End `run` once the running callback returns."""
        self._stopped = True

    def stopped(self) -> bool:
        return self._stopped

    def run(self) -> None:
        """Handle every scope's timers and events until a callback calls `stop()`. What a callback raises
        ends the run and is raised here. One run at a time."""
        if self._running:
            raise RuntimeError("the loop is running already: a wait cannot run inside another")
        self._stopped = False
        self._running = True
        try:
            while self._round():
                pass
        finally:
            self._running = False

    def _round(self) -> bool:
        """Fire the due timers, then handle the next events; False once stopped."""
        for timers in list(self._timers):
            timers.fire_due(self.stopped)
            if self._stopped:
                return False
        waits = [t for t in (timers.timeout() for timers in self._timers) if t is not None]
        for key, _ in self._sel.select(min(waits, default=None)):
            if self._sel.get_map().get(key.fd) is not key:  # forgotten by a callback of this round
                continue
            key.data()
            if self._stopped:
                return False
        return True


_PROCESS_LOOP: tuple[int, Loop] | None = None


def process_loop() -> Loop:
    """This process's loop (a forked child gets its own)."""
    global _PROCESS_LOOP  # noqa: PLW0603  (one loop a process, for its whole life: that is the point)
    if _PROCESS_LOOP is None or _PROCESS_LOOP[0] != os.getpid():
        _PROCESS_LOOP = (os.getpid(), Loop())
    return _PROCESS_LOOP[1]


class Scope(Closing):
    """One owner's files, process exits and timers on a Loop, until `close` (a context manager's end)."""

    def __init__(self, loop: Loop, sel: selectors.BaseSelector, fired: list[Timers], timers: Timers) -> None:
        self.loop = loop
        self.timers = timers
        self._sel = sel  # the loop's
        self._fired = fired  # the loop's: the Timers it fires, this scope's among them until it closes
        self._keys: dict[int, selectors.SelectorKey] = {}  # fd -> what this scope registered
        self._pidfds: set[int] = set()  # open: those not forgotten yet
        fired.append(timers)

    def close(self) -> None:
        """Forget what this scope still watches, close its pidfds, stop firing its timers. Idempotent."""
        for fd, key in self._keys.items():
            if self._sel.get_map().get(fd) is key:  # not the fd of another owner's file since
                self._sel.unregister(fd)
        self._keys.clear()
        for fd in self._pidfds:
            os.close(fd)
        self._pidfds.clear()
        with contextlib.suppress(ValueError):  # closed already
            self._fired.remove(self.timers)

    def reader(self, file: File, callback: Callable[[], object]) -> None:
        """Call `callback` whenever `file` is readable (also at its end: the callback reads b"" and may
        `forget` it)."""
        self._watch(file, selectors.EVENT_READ, callback)

    def writer(self, file: File, callback: Callable[[], object]) -> None:
        """Call `callback` whenever `file` can be written to (a socket with room in its buffer)."""
        self._watch(file, selectors.EVENT_WRITE, callback)

    def _watch(self, file: File, events: int, callback: Callable[[], object]) -> None:
        key = self._sel.register(file, events, callback)
        self._keys[key.fd] = key

    def forget(self, file: File) -> None:
        """Stop watching `file`; a pidfd of `exit_of` is closed too (the caller's own files stay open)."""
        key = self._sel.unregister(file)
        self._keys.pop(key.fd, None)
        if key.fd in self._pidfds:
            self._pidfds.discard(key.fd)
            os.close(key.fd)

    def exit_of(self, pid: int, callback: Callable[[], object]) -> int:
        """Call `callback` when the process `pid` has exited (a child stays a zombie until its owner reaps
        it). The pidfd, to `forget` (and close) it by; else the scope's end closes it."""
        fd = os.pidfd_open(pid)
        self._pidfds.add(fd)
        try:
            self._watch(fd, selectors.EVENT_READ, callback)
        except BaseException:
            self._pidfds.discard(fd)
            os.close(fd)
            raise
        return fd

    def stop(self) -> None:
        self.loop.stop()

    def run(self) -> None:
        self.loop.run()


def follow_output(
    pid: int,
    fds: Iterable[int],
    on_output: Callable[[int, bytes], object],
    timers: Timers | None = None,
    deadline: float | None = None,
) -> bool:
    """Pass what the process `pid` writes to the pipes `fds` to `on_output(fd, chunk)` until it exits (not
    until every copy of its pipes closes: a child it left may hold them), then what is in them, bounded, and
    True; False when `deadline` (the timers' clock) came first. `timers`: what else runs meanwhile."""
    open_fds = set(fds)
    exited = False
    ends = Timer("follow_output deadline")  # its own handle: the caller's timers (`timers`) keep theirs
    with process_loop().scope(timers) as scope:

        def read(fd: int) -> None:
            chunk = os.read(fd, 65536)
            if chunk:
                on_output(fd, chunk)
            else:
                scope.forget(fd)
                open_fds.discard(fd)

        def exit_() -> None:
            nonlocal exited
            exited = True
            scope.stop()

        for fd in sorted(open_fds):
            scope.reader(fd, functools.partial(read, fd))
        scope.exit_of(pid, exit_)
        if deadline is not None:
            scope.timers.at(ends, deadline, scope.stop)
        scope.run()
        scope.timers.cancel(ends)
    if exited:
        for fd in sorted(open_fds):
            for chunk in drain_pipe(fd):
                on_output(fd, chunk)
    return exited


def wait_exits(pids: Iterable[int], timeout: float) -> bool:
    """Wait until every process of `pids` has exited (children or not: a pidfd each), at most `timeout`
    seconds; True when they all did. A process already gone counts as exited. A cleanup's wait (a step's
    tree, the link sessions, a script at the job's end): on a loop of its own, which watches these processes
    only, so that no other owner's callback runs (and raises a second ending over the first) meanwhile; what
    the others watch waits for the process loop's next wait."""
    ends = Timer("wait_exits deadline")
    with Loop() as own, own.scope() as scope:
        left: dict[int, int] = {}  # pid -> its pidfd

        def exited(pid: int) -> None:
            scope.forget(left.pop(pid))
            if not left:
                scope.stop()

        for pid in set(pids):
            with contextlib.suppress(ProcessLookupError):  # gone already
                left[pid] = scope.exit_of(pid, functools.partial(exited, pid))
        if not left:
            return True
        scope.timers.after(ends, timeout, scope.stop)
        scope.run()
        return not left
