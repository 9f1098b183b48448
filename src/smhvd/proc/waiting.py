"""The one way this project waits: a check retried with backoff until a deadline, saying what it awaits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from smhvd.errors import WaitTimeout

T = TypeVar("T")


class NotYet(Exception):
    """Raised by a check to say "not ready yet", with the reason shown if the wait times out."""


def wait_until(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout: float,
    initial: float = 0.02,
    maximum: float = 1.0,
    factor: float = 1.6,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    error: type[Exception] = WaitTimeout,
) -> T:
    """Call `check` until it returns something other than None; raise `error` after `timeout` seconds. A
    check may raise NotYet(reason) instead of returning None; the last reason is quoted in the error."""
    deadline = clock() + timeout
    interval = initial
    last = ""
    while True:
        try:
            result = check()
        except NotYet as exc:
            result, last = None, str(exc)
        if result is not None:
            return result
        remaining = deadline - clock()
        if remaining <= 0:
            suffix = f" (last: {last})" if last else ""
            raise error(f"timed out after {timeout:g}s waiting for {what}{suffix}")
        sleep(min(interval, remaining))
        interval = min(interval * factor, maximum)
