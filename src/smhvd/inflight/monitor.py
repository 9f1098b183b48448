"""The leader's in-flight watch while the job runs (docs/inflight.md): the ranks' reports read as they come,
judged at every heartbeat (verdict.py), one line when a host starts to slow every step and one when it stops
(explain.py says why), a line a metric regex can read every METRIC_EVERY, and the `inflight` key of
job-summary.json kept current every SUMMARY_EVERY while the job runs.
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smhvd.inflight.explain import SIGNAL_WINDOW, Sample, explain, summary_of
from smhvd.inflight.forward import valid_steps
from smhvd.inflight.verdict import (
    SLOW_END_RATIO,
    SLOW_RATIO,
    HostView,
    Verdict,
    has_recovered,
    is_late,
    margin,
    peers,
)

log = logging.getLogger("smhvd")
SUMMARY_EVERY = 10.0  # seconds between writes of job-summary.json while the job runs
METRIC_EVERY = 60.0  # seconds between metric lines
SLOW_HOLD = 15.0  # seconds steps must stay slow with nobody late before it is said
SLOW_FLOOR = (
    0.05  # seconds a step must have slowed by (beside SLOW_RATIO) to be said: not a busy machine's noise
)
METRIC_LINE = (
    "in-flight: slowest host {host} lateness_seconds={late:.4f} step_seconds={step:.4f} steps={steps}"
)
METRIC_REGEX = r"in-flight: slowest host \S+ lateness_seconds=([0-9.]+)"  # docs/inflight.md


@dataclass
class Episode:
    host: str
    reason: str
    since: float  # seconds from the job's start
    lateness: float
    until: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "reason": self.reason,
            "since_seconds": round(self.since, 1),
            "lateness_seconds": round(self.lateness, 4),
            "until_seconds": None if self.until is None else round(self.until, 1),
        }


def report_of(line: bytes) -> tuple[str, int, dict[str, Any]] | None:
    """A rank wrapper's INFLIGHT line as (host, rank, document), or None: it crossed mpirun as any rank's
    output does, so nothing of it is trusted. Pure."""
    try:
        document = json.loads(line)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    host, rank = document.get("host"), document.get("rank")
    if not isinstance(host, str) or not isinstance(rank, int) or isinstance(rank, bool):
        return None
    return host, rank, document


class Monitor:
    """One job's in-flight watch, on the leader: `feed` takes INFLIGHT lines, `tick` judges them."""

    def __init__(
        self,
        groups: Mapping[str, str],
        summary_file: Path | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.verdict = Verdict(groups=groups)
        self.summary_file, self.clock = summary_file, clock
        self.started = clock()
        self.samples: dict[str, deque[Sample]] = {}
        self.episodes: list[Episode] = []
        self.open: dict[str, Episode] = {}  # host -> its episode while named
        self.slow_since: float | None = None  # steps slow with nobody late, since (job seconds)
        self.slow_said: float | None = None  # ... and said at (job seconds)
        self.clock_said = False
        self.last_views: dict[str, HostView] = {}  # the last window that had steps (the summary's)
        self.written_at = self.metric_at = self.started

    def feed(self, lines: bytes) -> None:
        now = self.clock()
        for line in lines.splitlines():
            found = report_of(line)
            if found is None:
                continue
            host, rank, document = found
            if "steps" in document:
                valid = valid_steps(document["steps"])
                if valid is not None:
                    self.verdict.add((host, rank), valid, now)
            elif isinstance(document.get("signals"), dict):
                kept = self.samples.setdefault(host, deque())
                kept.append(Sample(now, rank, document["signals"]))
                while kept and kept[0].at < now - SIGNAL_WINDOW:
                    kept.popleft()

    def tick(self) -> None:
        """Judge what came, say what changed, and keep the summary current."""
        now = self.clock()
        self.verdict.judge(now)
        step = self.verdict.step_seconds()
        views = self.verdict.views()
        self.last_views = views or self.last_views
        by_wait, baseline = self.verdict.by_wait(), self.verdict.baseline
        for host, view in sorted(views.items()):
            if host not in self.open and is_late(view, step, by_wait=by_wait, baseline=baseline):
                self._named(host, view.lateness, view.steps, step)
        for host in sorted(self.open):
            if has_recovered(views.get(host), step):
                self._recovered(host, views[host].lateness, views[host].steps)
        self._slow_without_host(step, views)
        self._clocks()
        if now - self.metric_at >= METRIC_EVERY and views and step:
            self.metric_at = now
            slowest = max(views, key=lambda h: views[h].lateness)
            log.info(
                METRIC_LINE.format(
                    host=slowest, late=max(0.0, views[slowest].lateness), step=step, steps=self.verdict.count
                )
            )
        if self.summary_file is not None and now - self.written_at >= SUMMARY_EVERY:
            self.written_at = now
            self.write_running()

    def _pace(self, step: float | None) -> str:
        baseline = self.verdict.baseline
        if step and baseline:
            return f"steps {step / baseline:.1f}x the job's first minute"
        return f"steps of {step:.3f} s" if step else "step time unknown"

    def _named(self, host: str, lateness: float, steps: int, step: float | None) -> None:
        what = "allreduce" if self.verdict.by_wait() else "step's collective"
        others = peers(host, set(self.samples) | {host}, self.verdict.groups)
        why = explain(host, self.samples, others)
        line = (
            f"in-flight: {host} slows every step: its ranks reach the {what} {lateness:.2f} s after the "
            f"others (median of {steps} steps; {self._pace(step)}); {why}"
        )
        log.warning("%s", line)
        episode = Episode(host, line.removeprefix("in-flight: "), self.clock() - self.started, lateness)
        self.open[host] = episode
        self.episodes.append(episode)

    def _recovered(self, host: str, lateness: float, steps: int) -> None:
        episode = self.open.pop(host)
        episode.until = self.clock() - self.started
        log.info(
            "in-flight: %s no longer slows the steps (its ranks are %.3f s late, median of %d steps; "
            "named for %.0f s)",
            host,
            lateness,
            steps,
            episode.until - episode.since,
        )

    def _slow_without_host(self, step: float | None, views: Mapping[str, HostView]) -> None:
        """Steps slower than the job's first minute, and for SLOW_HOLD no host near being named."""
        baseline, now = self.verdict.baseline, self.clock() - self.started
        if not step or not baseline:
            return
        ratio = step / baseline
        candidate = self.open or any(v.lateness >= margin(step) / 2 for v in views.values())
        slowed = ratio >= SLOW_RATIO and step - baseline >= SLOW_FLOOR and not candidate
        if self.slow_said is None:
            self.slow_since = (self.slow_since or now) if slowed else None
            if self.slow_since is not None and now - self.slow_since >= SLOW_HOLD:
                self.slow_said = now
                log.warning(
                    "in-flight: steps are %.1fx the job's first minute (%.3f s against %.3f s) and no host "
                    "is late: every host waits in the collective itself (a link, the network, or a shared "
                    "cause)",
                    ratio,
                    step,
                    baseline,
                )
        elif ratio < SLOW_END_RATIO or candidate:
            self.slow_said = self.slow_since = None
            log.info("in-flight: steps are %.1fx the job's first minute now", ratio)

    def _clocks(self) -> None:
        window = self.verdict.judged
        if self.clock_said or len(window) < 8 or sum(not j.consistent for j in window) * 2 < len(window):
            return
        self.clock_said = True
        log.warning(
            "in-flight: the hosts' clocks disagree by more than a step: steps timed by inflight.step() "
            "are not judged while they do (nobody is named on them)"
        )

    def to_json(self) -> dict[str, Any]:
        """The `inflight` key of job-summary.json: hosts as of the last window that had steps."""
        views = self.verdict.views() or self.last_views
        hosts: dict[str, Any] = {}
        for host in sorted(set(views) | set(self.samples)):
            view = views.get(host)
            hosts[host] = {
                "lateness_seconds": None if view is None else round(view.lateness, 4),
                "last_share": None if view is None else round(view.last_share, 3),
                "signals": summary_of(list(self.samples.get(host, ()))),
            }
        step, baseline = self.verdict.step_seconds(), self.verdict.baseline
        return {
            "named": [e.to_json() for e in self.episodes],
            "hosts": hosts,
            "steps": self.verdict.count,
            "step_seconds": None if step is None else round(step, 4),
            "baseline_step_seconds": None if baseline is None else round(baseline, 4),
            "unjudged_steps": self.verdict.inconsistent,
        }

    def write_running(self) -> None:
        """job-summary.json while the job runs: `running` and `inflight` (the end writes the whole one)."""
        assert self.summary_file is not None
        text = json.dumps({"running": True, "inflight": self.to_json()}, indent=2, sort_keys=True) + "\n"
        tmp = self.summary_file.with_suffix(".json.tmp")
        try:
            self.summary_file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(text)
            tmp.replace(self.summary_file)
        except OSError as exc:
            log.debug("in-flight: could not write %s: %s", self.summary_file, exc)
