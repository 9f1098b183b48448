"""The yardsticks both sides of the pre-flight apply: the probe (network.py, to decide what to measure again)
and the verdict (verdict.py, to decide whom to name). Pure functions only; nothing of MPI or the launcher."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

RTT_FLOOR_MS = 1.0  # a round trip is named only this far above the median too (scheduling noise)


def late_trip(trip_ms: float, median_ms: float | None, ratio: float) -> bool:
    """A round trip that names its host: above median / ratio, and RTT_FLOOR_MS above the median (on a
    quiet network a few microseconds more is no finding). Pure."""
    return median_ms is not None and trip_ms * ratio > median_ms and trip_ms > median_ms + RTT_FLOOR_MS


def median(values: Iterable[float | None]) -> float | None:
    """The median of the values that are known; None when none is. Pure."""
    data = [v for v in values if v is not None]
    return statistics.median(data) if data else None
