"""Why a host is late, from the samples of its ranks' wrappers (signals.py) over the last SIGNAL_WINDOW
seconds, each against the median of the other hosts of its instance group (like with like). Pure.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

SIGNAL_WINDOW = 60.0


@dataclass(frozen=True)
class Sample:
    at: float  # the leader's monotonic clock when it came
    rank: int | None
    values: Mapping[str, Any]  # signals.rates() of one interval, "gpu" included where sampled


@dataclass(frozen=True)
class Cause:
    """A reading that stands out: at least `least`, and `above` more than the others' median."""

    key: str
    least: float
    above: float
    text: Callable[[float], str]


# Rank readings (the worst rank of the host counts) and host readings (its first rank's wrapper samples them).
RANK_CAUSES = (
    Cause(
        "throttled", 0.2, 0.2, lambda v: f"CPU throttled {v:.0%} of the last 60 s (its cgroup's CPU quota)"
    ),
    Cause("io_wait", 0.2, 0.2, lambda v: f"its ranks waited on disk {v:.0%} of the last 60 s"),
)
HOST_CAUSES = (
    Cause("steal", 0.05, 0.05, lambda v: f"CPU steal {v:.0%} of the last 60 s (the hypervisor ran others)"),
    Cause("pressure.cpu", 0.2, 0.2, lambda v: f"CPU pressure {v:.0%} (tasks waited for a CPU)"),
    Cause("pressure.memory", 0.1, 0.1, lambda v: f"memory pressure {v:.0%} (stalled on reclaim or swap)"),
    Cause("pressure.io", 0.2, 0.2, lambda v: f"I/O pressure {v:.0%} (tasks stalled on I/O)"),
    Cause("retransmits", 0.01, 0.01, lambda v: f"TCP retransmitted {v:.1%} of its segments (a lossy link)"),
)


def reading(values: Mapping[str, Any], key: str) -> float | None:
    """`key` (dotted: "pressure.io") of one sample. Pure."""
    value: Any = values
    for part in key.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def host_reading(samples: Sequence[Sample], key: str, per_rank: bool) -> float | None:
    """A host's mean of `key` over its samples; of its worst rank when `per_rank`. Pure."""
    by_rank: dict[int | None, list[float]] = {}
    for sample in samples:
        value = reading(sample.values, key)
        if value is not None:
            by_rank.setdefault(sample.rank if per_rank else None, []).append(value)
    means = [statistics.fmean(v) for v in by_rank.values()]
    return max(means) if means else None


def gpu_slowdown(samples: Sequence[Sample]) -> str | None:
    """The latest sample's GPUs whose clocks are slowed, as words. Pure."""
    for sample in reversed(samples):
        gpus = sample.values.get("gpu")
        if not isinstance(gpus, list):
            continue
        slowed = [g for g in gpus if isinstance(g, Mapping) and g.get("slowdown")]
        if not slowed:
            return None
        parts = []
        for gpu in slowed:
            text = f"GPU {gpu.get('index')} clocks slowed ({', '.join(map(str, gpu['slowdown']))})"
            if isinstance(gpu.get("temperature"), int | float):
                text += f", {gpu['temperature']:.0f} C"
            if isinstance(gpu.get("sm_clock_ratio"), int | float):
                text += f", SM clock at {gpu['sm_clock_ratio']:.0%} of its most"
            parts.append(text)
        return "; ".join(parts)
    return None


def explain(host: str, samples: Mapping[str, Sequence[Sample]], others: Iterable[str]) -> str:
    """Why `host` is late, as one clause, from what stands out against `others` (its group). Pure."""
    found: list[str] = []
    gpu = gpu_slowdown(samples.get(host, ()))
    if gpu:
        found.append(gpu)
    for causes, per_rank in ((RANK_CAUSES, True), (HOST_CAUSES, False)):
        for cause in causes:
            own = host_reading(samples.get(host, ()), cause.key, per_rank)
            theirs = [
                v for h in others if (v := host_reading(samples.get(h, ()), cause.key, per_rank)) is not None
            ]
            base = statistics.median(theirs) if theirs else 0.0
            if own is not None and own >= cause.least and own - base >= cause.above:
                found.append(cause.text(own))
    if found:
        return f"{host}: " + "; ".join(found)
    return (
        f"{host}: no cause seen there (its CPU quota, steal, pressure, disk and GPU clocks are the others')"
    )


def summary_of(samples: Sequence[Sample]) -> dict[str, float | None]:
    """A host's readings over its samples, for job-summary.json. Pure."""
    out: dict[str, float | None] = {}
    for causes, per_rank in ((RANK_CAUSES, True), (HOST_CAUSES, False)):
        for cause in causes:
            value = host_reading(samples, cause.key, per_rank)
            out[cause.key] = None if value is None else round(value, 4)
    return out
