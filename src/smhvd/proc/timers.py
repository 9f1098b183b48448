"""The timers of one event loop: deadlines, each with its callback and a handle (`Timer`, compared by
identity: two owners on one loop never replace each other's) to set it again or cancel it by. The clock is a
parameter (tests drive timers with a fake one)."""

from __future__ import annotations

import time
from collections.abc import Callable


class Timer:
    """A handle on one timer of a Timers; the label is for reading only."""

    __slots__ = ("label",)

    def __init__(self, label: str) -> None:
        self.label = label

    def __repr__(self) -> str:
        return f"Timer({self.label!r})"


class Timers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._due: dict[Timer, tuple[float, Callable[[], object]]] = {}

    def after(self, timer: Timer, delay: float, callback: Callable[[], object]) -> None:
        """Call `callback` `delay` seconds from now; replaces what `timer` was set to, if anything."""
        self.at(timer, self.clock() + delay, callback)

    def at(self, timer: Timer, when: float, callback: Callable[[], object]) -> None:
        """Call `callback` once the clock reads `when`; replaces what `timer` was set to, if anything."""
        self._due[timer] = (when, callback)

    def every(self, timer: Timer, interval: float, callback: Callable[[], object]) -> None:
        """Call `callback` every `interval` seconds, the first time `interval` from now."""

        def again() -> None:
            callback()
            self.after(timer, interval, again)

        self.after(timer, interval, again)

    def cancel(self, timer: Timer) -> None:
        self._due.pop(timer, None)

    def pending(self, timer: Timer) -> bool:
        return timer in self._due

    def timeout(self) -> float | None:
        """Seconds until the earliest deadline (0 when one has passed); None without timers."""
        if not self._due:
            return None
        return max(0.0, min(when for when, _ in self._due.values()) - self.clock())

    def fire_due(self, stopped: Callable[[], bool] = lambda: False) -> None:
        """Call every callback whose deadline has come, earliest first, each once (it is removed before it
        runs, so that it may set itself again), until one of them stops the loop (`stopped()`)."""
        if not self._due:
            return
        now = self.clock()
        for timer, entry in sorted(self._due.items(), key=lambda item: item[1][0]):
            if stopped():
                return
            if entry[0] <= now and self._due.get(timer) is entry:  # not cancelled or set again meanwhile
                del self._due[timer]
                entry[1]()
