"""The leader's side of the pre-flight: run the probe on every MPI host (one process a host, under the job's
own mpirun command line, so over the job's transport; directly on a one-host job), read each host's findings
as they come, and end it within its bounds:

- every probe said `done`: the verdict at once;
- a host falls silent (no beat for `silence` seconds, or none at all that long after the first host spoke)
  while another still beats: it stopped answering; the probes are ended and it is named, never waited for;
- no probe has said a word a third of the way into the bound (5 to 20 s: launch.launch_limit) and mpirun has
  not started this host's probe: its launch stalled (launch.py); it is ended, and the check tries once more;
- the bound (launcher_preflight_timeout_seconds) passes: hosts still silent are named, else those not done.

Whatever ended it, the probe's process tree is gone when this returns (proc/steps.end_tree).
"""

from __future__ import annotations

import dataclasses
import logging
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from smhvd.errors import Stopped
from smhvd.mpi.command import MpiPlan, build_mpirun_argv
from smhvd.preflight import nccl_net
from smhvd.preflight.nccl_net import NcclNet
from smhvd.proc.loop import follow_output
from smhvd.proc.processes import descendants, die_with_parent
from smhvd.proc.signals import SignalWatch
from smhvd.proc.steps import end_tree
from smhvd.proc.timers import Timer, Timers
from smhvd.wire import PREFLIGHT_BEAT, PREFLIGHT_SPEC

from . import launch
from .blame import blame, stall_note
from .collected import Collected, Silent, mpirun_message
from .facts import HostFacts, is_number, map_of, read_facts
from .launch import PROBE_MODULE
from .verdict import Findings

log = logging.getLogger("smhvd")
SILENCE = 10.0  # a probe silent this long (20 beats) while another beats has stopped answering
LOST_DAEMON = "ORTE has lost communication with a remote daemon"  # once: the check runs again (check.py)


def probe_program() -> list[str]:
    return [sys.executable, "-P", "-m", PROBE_MODULE]


def probe_argv(plan: MpiPlan, hosts: Sequence[str], run_dir: Path) -> list[str]:
    """The job's mpirun command line (its transport, interfaces and the user's options), one probe a host."""
    probe = dataclasses.replace(
        plan,
        num_processes=len(hosts),
        hostfile=run_dir / "preflight-hostfile",
        hosts=tuple(hosts),
        slots=1,
        workdir=Path("/"),
        program=tuple(probe_program()),
        forward=tuple(sorted({*plan.forward, PREFLIGHT_SPEC})),
        yield_when_idle=True,  # one probe a host; where hosts share cores, a wait must not hold one
    )
    probe.hostfile.write_text(probe.hostfile_text)
    return build_mpirun_argv(probe)


def run_probes(
    argv: Sequence[str],
    env: Mapping[str, str],
    hosts: Sequence[str],
    timeout: float,
    silence: float = SILENCE,
    signals: SignalWatch | None = None,
    launch_limit: float | None = None,
) -> tuple[Collected, float]:
    """Run the probe command to its end or its bounds; what each rank said, and the seconds it took.
    `signals` (the leader's SignalWatch): a stop ends the pre-flight with Stopped. `launch_limit` (mpirun
    over several hosts): no word from any probe by then, and this host's probe not started, ends it."""
    started = time.monotonic()
    collected = Collected(tuple(hosts), started=started)
    before = set(descendants())
    proc = subprocess.Popen(
        list(argv),
        env=dict(env),
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509  (nothing of the pre-flight outlives the launcher)
    )
    assert proc.stdout is not None
    try:
        timers = _watching(
            collected, min(silence, timeout), signals, _Launching(proc.pid, started, launch_limit)
        )
        if follow_output(
            proc.pid,
            [proc.stdout.fileno()],
            lambda _fd, chunk: collected.feed(chunk),
            timers,
            started + timeout,
        ):
            collected.exit_code = proc.poll()
        elif launch_limit is not None and collected.first_word is None:  # the bound, and not a word
            collected.launch = launch.inspect(proc.pid, hosts, time.monotonic() - started)
    except Silent:
        pass
    finally:
        end_tree(proc, before)
        proc.stdout.close()
    collected.feed(b"\n")
    return collected, time.monotonic() - started


@dataclass
class _Launching:
    """The launch's watch: once, at `limit` seconds with no word from any probe, a look at mpirun."""

    mpirun: int
    started: float
    limit: float | None

    def check(self, collected: Collected) -> None:
        """Silent (collected.launch set) when mpirun's launch stalled: no probe heard, none started here."""
        if self.limit is None or collected.first_word is not None:
            return
        seconds = time.monotonic() - self.started
        if seconds < self.limit:
            return
        self.limit = None  # one look: a launch that was done (this host's probe ran) is judged at the bound
        seen = launch.inspect(self.mpirun, collected.hosts, seconds, ended_it=True)
        if not seen.probe_ran:
            collected.launch = seen
            raise Silent


def _watching(
    collected: Collected, limit: float, signals: SignalWatch | None, launching: _Launching
) -> Timers:
    """What the wait for the probes does meanwhile, every half beat: end it when a rank fell silent, Open
    MPI said it aborts or the launch stalled (Silent), or on a stop (Stopped)."""

    def check() -> None:
        if signals is not None and signals.stop_requested():
            raise Stopped("stopped during the pre-flight")
        collected.check(limit)
        launching.check(collected)

    timers = Timers()
    timers.every(Timer("pre-flight checks"), PREFLIGHT_BEAT / 2, check)
    return timers


def findings_of(
    collected: Collected,
    seconds: float,
    timeout: float,
    silence: float,
    groups: Mapping[str, tuple[str, str | None]],
    ranks_per_host: int = 1,
) -> Findings:
    """What the probes said, by host, read as this launcher's findings (a host whose findings are not is
    named as another version), with a reason for each host that did not finish. Pure; never raises."""
    hosts = collected.hosts
    named = blame(collected, seconds, timeout, silence)
    said = mpirun_message(collected.own)
    by_host = {hosts[r]: f for r, f in collected.found.items()}
    typed = read_findings(by_host)
    clock = by_host.get(hosts[0], {}).get("clock")
    return dataclasses.replace(
        typed,
        hosts=tuple(hosts),
        clock=clock if isinstance(clock, dict) and _is_clock(clock) else {},
        silent=named.missing,
        unfinished=named.unfinished,
        blame_notes=named.notes + _rank_lines(collected),
        errors={h: str(f["error"]) for h, f in by_host.items() if f.get("error")},
        groups=groups,
        seconds=seconds,
        first_word_seconds=_since(collected.started, collected.first_word),
        phases={hosts[r]: p for r, p in collected.phases.items()},
        ranks_per_host=ranks_per_host,
        mpirun_said=said if said and (named.missing or collected.exit_code not in (None, 0)) else "",
    )


def _rank_lines(collected: Collected) -> tuple[str, ...]:
    """A probe's last lines other than its findings, shown (never matched) when a host did not finish."""
    if len(collected.done) == len(collected.hosts) or not collected.rank_lines:
        return ()
    return (f"the probes' last other lines: {mpirun_message(collected.rank_lines)}",)


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def lost_daemon(collected: Collected) -> str | None:
    """mpirun's message when the probes' MPI job ended because mpirun lost one of its daemons before every
    probe was done, else None: a connection that dropped once, which the check's second attempt tells from
    a host that cannot keep one (seen on compose networks, where the job's own mpirun then ran). Pure."""
    said = mpirun_message(collected.own)
    unfinished = len(collected.done) < len(collected.hosts)
    return said if collected.failed and unfinished and LOST_DAEMON in said else None


def stalled_launch(collected: Collected) -> str | None:
    """How the attempt ended when mpirun's launch stalled before the bound (no probe started anywhere), else
    None: once, the check runs again (check.py); seen once in SDK local mode, where the job's own mpirun then
    ran. Pure."""
    seen = collected.launch
    if seen is None or seen.probe_ran or not seen.ended_it:
        return None
    return stall_note(seen, collected.hosts)


_is_links = map_of(is_number)  # a probe's link figures: MB/s by host


_is_clock = map_of(lambda c: isinstance(c, dict) and all(is_number(c.get(k)) for k in ("rtt_ms", "offset_s")))


def _gpu_or_none(value: object) -> dict[str, Any] | None:
    """A GPU finding ({devices, nccl, algbw_gbps, busbw_gbps, ranks, error}, each optional), or None."""
    if not isinstance(value, dict):
        return None
    figures_ok = all(
        is_number(value[k]) for k in ("devices", "algbw_gbps", "busbw_gbps", "ranks") if k in value
    )
    texts_ok = all(isinstance(value[k], str) for k in ("nccl", "error") if k in value)
    return value if figures_ok and texts_ok else None


def read_findings(by_host: Mapping[str, Mapping[str, Any]]) -> Findings:
    """Each host's facts, links, GPU and NCCL-network findings, typed; a host with one that is not this
    launcher's (missing, extra or mistyped) is in `other_version` with what differs. Pure."""
    facts: dict[str, HostFacts] = {}
    other: dict[str, str] = {}
    links: dict[str, dict[str, float]] = {}
    busy: dict[str, dict[str, float]] = {}
    gpus: dict[str, dict[str, Any]] = {}
    cluster: dict[str, dict[str, Any]] = {}
    nets: dict[str, NcclNet] = {}
    for host, found in by_host.items():
        read = read_facts(found["facts"]) if "facts" in found else None
        if isinstance(read, str):
            other[host] = read
        elif read is not None:
            facts[host] = read
        for key, into in (("links", links), ("busy_links", busy)):
            if key in found and _is_links(found[key]):
                into[host] = found[key]
            elif key in found:
                other.setdefault(host, f"its {key} are not numbers by host: {found[key]!r:.60}")
        for key, into in (("gpu", gpus), ("gpu_cluster", cluster)):
            gpu = _gpu_or_none(found.get(key))
            if gpu is not None:
                into[host] = gpu
            elif key in found:
                other.setdefault(host, f"its GPU finding is not this launcher's: {found[key]!r:.60}")
        net = nccl_net.from_fact(found.get("nccl_net"))
        if net is not None:
            nets[host] = net
        elif "nccl_net" in found:
            other.setdefault(
                host, f"its NCCL network finding is not this launcher's: {found['nccl_net']!r:.60}"
            )
    return Findings(
        hosts=(),
        facts=facts,
        other_version=other,
        links=links,
        busy_links=busy,
        gpu=gpus,
        gpu_cluster=cluster,
        nccl_net=nets,
    )
