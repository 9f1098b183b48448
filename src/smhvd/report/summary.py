"""The job summary the leader logs at the end of every job and writes to output/data/job-summary.json: hosts,
ranks and where each started, time to the first rank, wall time, each host's exit, the failure, the share of
time in Horovod operations (with its timeline). Pure but `write_summary`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from smhvd.wire import RankStart

FILE_NAME = "job-summary.json"


@dataclass(frozen=True)
class JobSummary:
    hosts: tuple[str, ...]
    ranks: int
    ranks_per_host: Mapping[str, int]  # where ranks really started
    first_rank_seconds: float | None  # `train` start -> first rank running
    wall_seconds: float  # `train` start -> job end
    exit_code: int
    host_exits: Mapping[str, int | str]  # the leader's own code; a worker's: the code it was told
    failure: str | None  # the failure file's first line
    horovod_op_share: (
        float | None
    )  # with horovod_timeline: share of the ranks' time inside Horovod operations
    preflight: Mapping[str, Any] | None = None  # the pre-flight's verdict (preflight/verdict.py), when it ran
    preflight_only: bool = False  # `train preflight`: the check was the job, no script ran
    inflight: Mapping[str, Any] | None = None  # in-flight's verdict (inflight/monitor.py), when it watched

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    def render(self) -> str:
        """One line for the log."""
        if self.preflight_only:
            count = len((self.preflight or {}).get("named") or [])
            text = (
                f"job summary: exit {self.exit_code}; a pre-flight only (no script): "
                f"{len(self.hosts)} host(s) checked, {count} named; wall {self.wall_seconds:.2f}s"
            )
            return text + (f"; failure: {self.failure}" if self.failure else "")
        first = "n/a" if self.first_rank_seconds is None else f"{self.first_rank_seconds:.2f}s"
        per_host = ", ".join(f"{h}:{n}" for h, n in sorted(self.ranks_per_host.items())) or "none started"
        text = (
            f"job summary: exit {self.exit_code}; {self.ranks} rank(s) on {len(self.hosts)} host(s) "
            f"({per_host}); first rank after {first}; wall {self.wall_seconds:.2f}s"
        )
        if self.horovod_op_share is not None:
            text += f"; {self.horovod_op_share:.0%} of rank time in Horovod ops"
        if self.preflight is not None:
            named = self.preflight.get("named") or []
            text += f"; pre-flight: {len(named)} host(s) named" if named else "; pre-flight: ok"
        if self.inflight is not None:
            episodes = self.inflight.get("named") or []
            late = sorted({str(e.get("host")) for e in episodes if isinstance(e, Mapping)})
            text += f"; in-flight: {', '.join(map(str, late))} named" if late else "; in-flight: nobody named"
        if self.failure:
            text += f"; failure: {self.failure}"
        return text


def summarize(
    *,
    hosts: Sequence[str],
    ranks: int,
    starts: Sequence[RankStart],
    started_at: float,
    ended_at: float,
    exit_code: int,
    host_exits: Mapping[str, int | str],
    failure: str | None,
    horovod_op_share: float | None = None,
    preflight: Mapping[str, Any] | None = None,
    preflight_only: bool = False,
    inflight: Mapping[str, Any] | None = None,
) -> JobSummary:
    per_host: dict[str, int] = {}
    for start in starts:
        key = start.host or "?"
        per_host[key] = per_host.get(key, 0) + 1
    first = min((s.at for s in starts), default=None)
    return JobSummary(
        hosts=tuple(hosts),
        ranks=ranks,
        ranks_per_host=per_host,
        first_rank_seconds=None if first is None else round(max(0.0, first - started_at), 3),
        wall_seconds=round(ended_at - started_at, 3),
        exit_code=exit_code,
        host_exits=dict(host_exits),
        failure=failure.splitlines()[0] if failure else None,
        horovod_op_share=horovod_op_share,
        preflight=preflight,
        preflight_only=preflight_only,
        inflight=inflight,
    )


def timeline_events(text: str) -> list[dict[str, object]]:
    """Events of a Horovod timeline (Chrome trace JSON), also when it was cut off mid-write."""
    body = text.strip()
    if not body:
        return []
    try:
        data = json.loads(body)
    except ValueError:
        # Horovod streams "[\n{...},\n{...},\n" and closes the array at shutdown: close it, drop a cut line.
        lines = body.splitlines()
        for end in range(len(lines), 0, -1):
            candidate = "\n".join(lines[:end]).rstrip().rstrip(",") + "]"
            try:
                data = json.loads(candidate)
                break
            except ValueError:
                continue
        else:
            return []
    return [e for e in data if isinstance(e, dict)] if isinstance(data, list) else []


def horovod_op_share(events: Sequence[Mapping[str, object]]) -> float | None:
    """Union of the time any tensor was inside a Horovod operation, over the timeline's span. None: no ops."""
    intervals: list[tuple[float, float]] = []
    open_at: dict[object, float] = {}
    stamps: list[float] = []
    for event in events:
        ts = event.get("ts")
        if not isinstance(ts, int | float):
            continue
        stamps.append(float(ts))
        phase, lane = event.get("ph"), (event.get("pid"), event.get("tid"))
        if phase == "B" and lane not in open_at:
            open_at[lane] = float(ts)
        elif phase == "E" and lane in open_at:
            intervals.append((open_at.pop(lane), float(ts)))
        elif phase == "X" and isinstance(event.get("dur"), int | float):
            intervals.append((float(ts), float(ts) + float(event["dur"])))  # type: ignore[arg-type]
    if not intervals or len(stamps) < 2:
        return None
    span = max(stamps) - min(stamps)
    if span <= 0:
        return None
    return round(min(1.0, union_length(intervals) / span), 4)


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by the intervals (overlaps counted once)."""
    busy = 0.0
    run: list[float] = []  # [start, end] of the run being merged
    for start, end in sorted(intervals):
        if run and start <= run[1]:
            run[1] = max(run[1], end)
            continue
        if run:
            busy += run[1] - run[0]
        run = [start, end]
    if run:
        busy += run[1] - run[0]
    return busy


def write_summary(output_data_dir: Path, summary: JobSummary) -> Path:
    output_data_dir.mkdir(parents=True, exist_ok=True)
    path = output_data_dir / FILE_NAME
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(summary.to_json())
    tmp.replace(path)
    return path
