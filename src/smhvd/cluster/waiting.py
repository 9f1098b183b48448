"""The cluster tool's waits: the launcher's one bounded wait (smhvd.waiting), raising ClusterError."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from smhvd.cluster.errors import ClusterError
from smhvd.waiting import wait_until

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
    return wait_until(
        check,
        what=what,
        timeout=timeout,
        initial=first_delay,
        maximum=max_delay,
        factor=2.0,
        error=ClusterError,
    )
