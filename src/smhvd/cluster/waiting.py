"""The single waiting helper: a deadline, a backoff, and a message naming what was waited for."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from smhvd.cluster.errors import ClusterError

T = TypeVar("T")


def wait_for(
    check: Callable[[], T | None],
    what: str,
    timeout: float,
    *,
    first_delay: float = 0.005,
    max_delay: float = 0.25,
) -> T:
    """Call ``check`` until it returns something other than None; raise ClusterError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    delay = first_delay
    while True:
        result = check()
        if result is not None:
            return result
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ClusterError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, max_delay)
