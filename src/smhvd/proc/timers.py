"""The timers of one event loop: named deadlines, each with its callback. The loop waits (in select) at most
until the earliest deadline, then fires what is due; a callback may set timers again (a heartbeat re-arms
itself). The clock is a parameter: tests drive a loop's timers with a fake one.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Timers:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._due: dict[str, tuple[float, Callable[[], object]]] = {}

    def after(self, name: str, delay: float, callback: Callable[[], object]) -> None:
        """Call `callback` `delay` seconds from now; replaces the timer of that name if there is one."""
        self.at(name, self.clock() + delay, callback)

    def at(self, name: str, when: float, callback: Callable[[], object]) -> None:
        """Call `callback` once the clock reads `when`; replaces the timer of that name if there is one."""
        self._due[name] = (when, callback)

    def every(self, name: str, interval: float, callback: Callable[[], object]) -> None:
        """Call `callback` every `interval` seconds, the first time `interval` from now."""

        def again() -> None:
            callback()
            self.after(name, interval, again)

        self.after(name, interval, again)

    def cancel(self, name: str) -> None:
        self._due.pop(name, None)

    def pending(self, name: str) -> bool:
        return name in self._due

    def timeout(self) -> float | None:
        """Seconds until the earliest deadline (0 when one has passed); None without timers: wait for
        events only."""
        if not self._due:
            return None
        return max(0.0, min(when for when, _ in self._due.values()) - self.clock())

    def fire_due(self) -> None:
        """Call every callback whose deadline has come, earliest first, each once (it is removed before it
        runs, so that it may set itself again)."""
        if not self._due:
            return
        now = self.clock()
        for name, entry in sorted(self._due.items(), key=lambda item: item[1][0]):
            if entry[0] <= now and self._due.get(name) is entry:  # not cancelled or set again meanwhile
                del self._due[name]
                entry[1]()
