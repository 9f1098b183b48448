"""Which host makes every step wait, from the ranks' steps (record.py) as they come; pure but for the
state it keeps, bounded (docs/inflight.md).

Every rank numbers its steps alike (a synchronous job takes the same steps everywhere). A step is judged
once every rank that still reports has reported it. For each host: its last rank's READY and, where every
rank of it knows the step's DONE, its least wait for the collective (DONE - READY). A host's lateness at a
step:

- with waits (Horovod, tensorpack): the median wait of the other hosts less its own, clock-free: a host that
  reaches the collective last waits least for it;
- with READY alone (inflight.step()): its READY less the others' median, on the hosts' wall clocks; a step
  where a host looks later than the step's own length is not judged (a clock that moved, not a straggler),
  and a host is named only when the job's steps slowed as much as it is late (is_late).

The others are the host's own instance group when two or more of it report, else every host. A host is named
when, in the last WINDOW seconds of judged steps, it was the last in at least NAME_SHARE of them and its
median lateness is at least max(FLOOR, STEP_SHARE x the median step time); it is no longer named when either
falls to RECOVER_SHARE or half the margin. Steps slower than SLOW_RATIO x the job's first minute with nobody
late are said as such.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

WINDOW = 30.0  # seconds of judged steps a verdict reads
MIN_STEPS = 8  # steps a window needs before it names anybody
NAME_SHARE, RECOVER_SHARE = 0.6, 0.4  # share of the window's steps a host was the last in
FLOOR = 0.010  # seconds: a lateness below this is never named
STEP_SHARE = 0.2  # ... nor one below this share of the median step time
STALE = 30.0  # seconds (or 3 steps, if longer): a rank silent this long while others report is left out
BASELINE = 60.0  # seconds of the job's first judged steps that set its own pace
WARMUP_STEPS = 5  # the first steps (graph building, caches) set nothing
SLOW_RATIO, SLOW_END_RATIO = 1.5, 1.25
HELD_STEPS = 20_000  # steps held while waiting for a rank that lags, at most (the oldest are dropped)

Rank = tuple[str, int]  # (host, rank)


@dataclass(frozen=True)
class HostStep:
    ready: float  # its last rank's READY
    wait: float | None  # its least DONE - READY, when every rank of it knows DONE
    mark: float  # DONE when known, else READY: what steps are timed by


@dataclass(frozen=True)
class Judged:
    at: float  # when it was judged (the leader's monotonic clock)
    seq: int
    lateness: Mapping[str, float]
    period: float | None  # the step's length: the median host's time since the previous step
    consistent: bool = True  # False: a host looked later than the step itself (its clock moved)
    by_wait: bool = True  # judged by the waits for the collective (else by READY on the hosts' clocks)


def host_steps(entries: Mapping[Rank, tuple[float, float | None]]) -> dict[str, HostStep]:
    """One step's entries of every rank, per host. Pure."""
    per_host: dict[str, list[tuple[float, float | None]]] = {}
    for (host, _), entry in entries.items():
        per_host.setdefault(host, []).append(entry)
    out: dict[str, HostStep] = {}
    for host, times in per_host.items():
        ready = max(r for r, _ in times)
        waits = [d - r for r, d in times if d is not None]
        wait = min(waits) if len(waits) == len(times) else None
        done = [d for _, d in times if d is not None]
        out[host] = HostStep(ready, wait, min(done) if wait is not None else ready)
    return out


def peers(host: str, hosts: Iterable[str], groups: Mapping[str, str]) -> list[str]:
    """The hosts `host` is compared with: its instance group's others when there are any, else all. Pure."""
    others = [h for h in hosts if h != host]
    same = [h for h in others if groups.get(h) == groups.get(host)]
    return same or others


def lateness(steps: Mapping[str, HostStep], groups: Mapping[str, str]) -> dict[str, float]:
    """Each host's lateness at one step, in seconds (module docstring). Pure."""
    if len(steps) < 2:
        return {}
    waits = {h: s.wait for h, s in steps.items() if s.wait is not None}
    out: dict[str, float] = {}
    for host, own in steps.items():
        others = peers(host, steps, groups)
        if len(waits) == len(steps):
            out[host] = statistics.median(waits[h] for h in others) - waits[host]
        else:
            out[host] = own.ready - statistics.median(steps[h].ready for h in others)
    return out


def period(now: Mapping[str, HostStep], before: Mapping[str, HostStep] | None) -> float | None:
    """The step's length: the median over hosts of the time since their previous step. Pure."""
    if not before:
        return None
    spans = [now[h].mark - before[h].mark for h in now if h in before]
    return statistics.median(spans) if spans else None


@dataclass
class Steps:
    """The steps reported and not judged yet, and how far each rank has reported."""

    pending: dict[int, dict[Rank, tuple[float, float | None]]] = field(default_factory=dict)
    reported: dict[Rank, tuple[int, float]] = field(default_factory=dict)  # rank -> (highest seq, at)
    next_seq: int = 0
    dropped: int = 0

    def add(self, rank: Rank, steps: Sequence[Sequence[Any]], now: float) -> None:
        top = self.reported.get(rank, (-1, now))[0]
        for seq, ready, done in steps:
            if seq >= self.next_seq:
                self.pending.setdefault(seq, {})[rank] = (float(ready), None if done is None else float(done))
            top = max(top, seq)
        self.reported[rank] = (top, now)
        if len(self.pending) > HELD_STEPS + HELD_STEPS // 10:  # trimmed in batches: one sort a batch
            for seq in sorted(self.pending)[: len(self.pending) - HELD_STEPS]:
                del self.pending[seq]
                self.dropped += 1

    def active(self, stale: float) -> list[Rank]:
        """The ranks that still report: none silent for `stale` seconds while another reported since."""
        freshest = max((at for _, at in self.reported.values()), default=0.0)
        return [r for r, (_, at) in self.reported.items() if freshest - at < stale]

    def ready_steps(self, stale: float) -> list[tuple[int, dict[Rank, tuple[float, float | None]]]]:
        """The steps every active rank has reported, in order, taken out."""
        ranks = self.active(stale)
        if not ranks:
            return []
        upto = min(self.reported[r][0] for r in ranks)
        out = []
        for seq in sorted(s for s in self.pending if s <= upto):
            entries = self.pending.pop(seq)
            out.append((seq, {r: t for r, t in entries.items() if r in ranks}))
        self.next_seq = max(self.next_seq, upto + 1)
        return out


def judge_step(
    seq: int,
    steps: Mapping[str, HostStep],
    before: Mapping[str, HostStep] | None,
    groups: Mapping[str, str],
    at: float,
) -> Judged:
    """One step judged. Pure."""
    late = lateness(steps, groups)
    length = period(steps, before)
    by_ready = any(s.wait is None for s in steps.values())
    consistent = not (by_ready and length is not None and any(abs(v) > length for v in late.values()))
    return Judged(at=at, seq=seq, lateness=late, period=length, consistent=consistent, by_wait=not by_ready)


@dataclass(frozen=True)
class HostView:
    """A host over a window: its median lateness, the share of steps it was the last in, and of how many."""

    lateness: float
    last_share: float
    steps: int


def host_views(window: Sequence[Judged]) -> dict[str, HostView]:
    """Each host over `window` (its consistent steps). Pure."""
    values: dict[str, list[float]] = {}
    last: dict[str, int] = {}
    for judged in window:
        if not judged.consistent or not judged.lateness:
            continue
        for host, value in judged.lateness.items():
            values.setdefault(host, []).append(value)
        slowest = max(judged.lateness, key=lambda h: judged.lateness[h])
        if judged.lateness[slowest] > 0:
            last[slowest] = last.get(slowest, 0) + 1
    return {
        host: HostView(statistics.median(v), last.get(host, 0) / len(v), len(v)) for host, v in values.items()
    }


def margin(step_seconds: float | None) -> float:
    """The lateness that matters against the step time. Pure."""
    return max(FLOOR, STEP_SHARE * step_seconds) if step_seconds else FLOOR


def is_late(
    view: HostView, step_seconds: float | None, *, by_wait: bool = True, baseline: float | None = None
) -> bool:
    """Late by a margin that matters, in most steps of the window. Judged on the hosts' clocks (READY alone),
    also only when the job's steps slowed by at least half that lateness against its first minute: a clock
    that moved by less than a step makes a host look late without slowing any step. Pure."""
    late = view.steps >= MIN_STEPS and view.last_share >= NAME_SHARE and view.lateness >= margin(step_seconds)
    if not late or by_wait:
        return late
    return baseline is not None and step_seconds is not None and step_seconds - baseline >= view.lateness / 2


def has_recovered(view: HostView | None, step_seconds: float | None) -> bool:
    if view is None or view.steps < MIN_STEPS:
        return False
    return view.last_share < RECOVER_SHARE or view.lateness < margin(step_seconds) / 2


def median_or_none(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


@dataclass
class Verdict:
    """The job's steps judged as they come, and who is late now (`named`)."""

    groups: Mapping[str, str] = field(default_factory=dict)  # host -> instance group
    steps: Steps = field(default_factory=Steps)
    judged: deque[Judged] = field(default_factory=deque)
    count: int = 0  # steps judged in all
    inconsistent: int = 0  # of them, steps a host's clock made unjudgeable
    previous: dict[str, HostStep] | None = None
    previous_seq: int = -1
    first_at: float | None = None  # when the first step past the warm-up was judged
    baseline_periods: list[float] = field(default_factory=list)
    named: set[str] = field(default_factory=set)

    def add(self, rank: Rank, steps: Sequence[Sequence[Any]], now: float) -> None:
        self.steps.add(rank, steps, now)

    def judge(self, now: float) -> None:
        """Judge what every rank has reported; forget what fell out of the window."""
        stale = max(STALE, 3 * (self.step_seconds() or 0.0))  # a slow step is no silence
        for seq, entries in self.steps.ready_steps(stale):
            current = host_steps(entries)
            before = self.previous if seq == self.previous_seq + 1 else None
            judged = judge_step(seq, current, before, self.groups, now)
            self.previous, self.previous_seq = current, seq
            self.count += 1
            self.inconsistent += 0 if judged.consistent else 1
            self._baseline(judged, now)
            self.judged.append(judged)
        while self.judged and self.judged[0].at < now - WINDOW:
            self.judged.popleft()

    def _baseline(self, judged: Judged, now: float) -> None:
        if self.count <= WARMUP_STEPS or judged.period is None:
            return
        self.first_at = now if self.first_at is None else self.first_at
        if now - self.first_at <= BASELINE:
            self.baseline_periods.append(judged.period)

    @property
    def baseline(self) -> float | None:
        """The median step time of the job's first minute (after its warm-up)."""
        return statistics.median(self.baseline_periods) if self.baseline_periods else None

    def step_seconds(self) -> float | None:
        """The median step time of the window."""
        return median_or_none(j.period for j in self.judged if j.consistent)

    def views(self) -> dict[str, HostView]:
        return host_views(self.judged)

    def by_wait(self) -> bool:
        """The window was judged by the waits for the collective (no clock compared across hosts)."""
        return all(j.by_wait for j in self.judged)
