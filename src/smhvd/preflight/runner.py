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
import json
import logging
import re
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from smhvd.errors import Stopped
from smhvd.mpi.command import MpiPlan, build_mpirun_argv
from smhvd.mpi.output import ABORT_SIGNS, first_sentence, parse_mpirun_verdict
from smhvd.preflight import nccl_net
from smhvd.preflight.nccl_net import NcclNet
from smhvd.proc.loop import follow_output
from smhvd.proc.processes import descendants, die_with_parent
from smhvd.proc.signals import SignalWatch
from smhvd.proc.steps import end_tree
from smhvd.proc.timers import Timer, Timers
from smhvd.wire import PREFLIGHT_BEAT, PREFLIGHT_MARK, PREFLIGHT_SPEC

from . import launch
from .facts import HostFacts, is_number, map_of, read_facts
from .launch import PROBE_MODULE, Launch
from .verdict import Findings

log = logging.getLogger("smhvd")
SILENCE = 10.0  # a probe silent this long (20 beats) while another beats has stopped answering
MPIRUN_LINES = 200  # mpirun's own lines kept (its messages are 10-30 lines)
MESSAGE_LIMIT = 1500  # characters of mpirun's message in a reason and the notes
_RULE = re.compile(r"^-{20,}$")  # the border of an Open MPI message
_TAG = re.compile(rb"^\[\d+,(\d+)\]<std(?:out|err)>:")
LOST_DAEMON = "ORTE has lost communication with a remote daemon"  # once: the check runs again (check.py)
_ERROR_WORD = re.compile(r"error|fail|abort", re.IGNORECASE)  # a probe's failing line says it; a warning not


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


def parse_line(line: bytes) -> tuple[int, dict[str, Any]] | None:
    """(rank, finding) of one output line of mpirun (tagged) or of a lone probe (rank 0). Pure."""
    rank = 0
    tag = _TAG.match(line)
    if tag:
        rank = int(tag.group(1))
        line = line[tag.end() :]
    mark = PREFLIGHT_MARK.encode()
    if not line.startswith(mark):
        return None
    try:
        finding = json.loads(line[len(mark) :])
    except ValueError:
        return None
    return (rank, finding) if isinstance(finding, dict) else None


class _Silent(Exception):
    pass


@dataclass
class Collected:
    """Findings by rank as they arrive, and when each rank last spoke (the runner's clock)."""

    hosts: tuple[str, ...]
    clock: Callable[[], float] = time.monotonic
    started: float | None = None  # when the probes' command started (the runner's clock)
    heard: dict[int, float] = field(default_factory=dict)
    first_word: float | None = None
    done: set[int] = field(default_factory=set)
    found: dict[int, dict[str, Any]] = field(default_factory=dict)
    phases: dict[int, dict[str, float]] = field(default_factory=dict)  # rank -> finding -> its probe's time
    other: deque[bytes] = field(default_factory=lambda: deque(maxlen=MPIRUN_LINES))  # mpirun's own lines
    exit_code: int | None = None  # mpirun's, when it exited by itself
    launch: Launch | None = None  # mpirun's launch, as seen when no probe had said a word (launch.py)
    abort_notice: str | None = None  # Open MPI said the job aborts: nothing more will come
    _rest: bytes = b""

    def feed(self, chunk: bytes) -> None:
        self._rest += chunk
        *lines, self._rest = self._rest.split(b"\n")
        now = self.clock()
        for line in lines:
            parsed = parse_line(line)
            if parsed is None:
                if line.strip():
                    self.other.append(line)
                    self._notice_abort()
                continue
            rank, finding = parsed
            if not 0 <= rank < len(self.hosts):
                continue
            self.heard[rank] = now
            self.first_word = now if self.first_word is None else self.first_word
            if finding.get("done"):
                self.done.add(rank)
            kinds = {k: v for k, v in finding.items() if k not in ("beat", "t")}
            self.found.setdefault(rank, {}).update(kinds)
            if isinstance(finding.get("t"), int | float):
                self.phases.setdefault(rank, {}).update(dict.fromkeys(kinds, float(finding["t"])))

    def _notice_abort(self) -> None:
        lines = [line.decode(errors="replace").strip() for line in self.other]
        text = " ".join(" ".join(lines).split())
        if self.abort_notice is None and any(sign in text for sign in ABORT_SIGNS):
            self.abort_notice = first_sentence(lines)

    @property
    def failed(self) -> bool:
        """The probes' MPI job failed: mpirun exited non-zero, or Open MPI said the job aborts."""
        return self.abort_notice is not None or self.exit_code not in (None, 0)

    def silent(self, limit: float) -> list[int]:
        """Ranks not done that have not spoken for `limit` seconds (or at all, that long after the first)."""
        now = self.clock()
        out = []
        for rank in range(len(self.hosts)):
            if rank in self.done:
                continue
            last = self.heard.get(rank, self.first_word)
            if last is not None and now - last > limit:
                out.append(rank)
        return out

    def check(self, limit: float) -> None:
        """Raise _Silent when a rank fell silent while another still speaks, or Open MPI said it aborts."""
        if self.abort_notice is not None:
            raise _Silent
        silent = self.silent(limit)
        now = self.clock()
        speaking = [r for r, at in self.heard.items() if r not in silent and now - at <= limit]
        if silent and (speaking or self.done):
            raise _Silent


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
    except _Silent:
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
        """_Silent (collected.launch set) when mpirun's launch stalled: no probe heard, none started here."""
        if self.limit is None or collected.first_word is not None:
            return
        seconds = time.monotonic() - self.started
        if seconds < self.limit:
            return
        self.limit = None  # one look: a launch that was done (this host's probe ran) is judged at the bound
        seen = launch.inspect(self.mpirun, collected.hosts, seconds, ended_it=True)
        if not seen.probe_ran:
            collected.launch = seen
            raise _Silent


def _watching(
    collected: Collected, limit: float, signals: SignalWatch | None, launching: _Launching
) -> Timers:
    """What the wait for the probes does meanwhile, every half beat: end it when a rank fell silent, Open
    MPI said it aborts or the launch stalled (_Silent), or on a stop (Stopped)."""

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
    missing, unfinished = _unfinished(collected, seconds, timeout, silence)
    said = mpirun_message(collected.other)
    by_host = {hosts[r]: f for r, f in collected.found.items()}
    typed = read_findings(by_host)
    clock = by_host.get(hosts[0], {}).get("clock")
    return dataclasses.replace(
        typed,
        hosts=tuple(hosts),
        clock=clock if isinstance(clock, dict) and _is_clock(clock) else {},
        silent=missing,
        unfinished=unfinished,
        errors={h: str(f["error"]) for h, f in by_host.items() if f.get("error")},
        groups=groups,
        seconds=seconds,
        first_word_seconds=_since(collected.started, collected.first_word),
        phases={hosts[r]: p for r, p in collected.phases.items()},
        ranks_per_host=ranks_per_host,
        mpirun_said=said if said and (missing or collected.exit_code not in (None, 0)) else "",
    )


def _since(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else end - start


def _unfinished(
    collected: Collected, seconds: float, timeout: float, silence: float
) -> tuple[dict[str, str], dict[str, str]]:
    """Hosts missing (silent, or where the probes' MPI job failed) and hosts that ran to the bound; why."""
    hosts = collected.hosts
    not_done = [r for r in range(len(hosts)) if r not in collected.done]
    # A probe's own error line is evidence too when mpirun hangs on it to the bound (the other probes wait in
    # MPI_Init for the one that failed, and none is heard from): the line's host is named, not every host.
    if not_done and (collected.failed or probe_error_host(collected.other, hosts) is not None):
        return _blame(collected, not_done, seconds), {}
    if collected.launch is not None and not collected.launch.probe_ran and not collected.heard:
        return launch.stall_reasons(collected.launch, hosts), {}  # the hosts mpirun's launch waited on
    silent = set(collected.silent(min(silence, timeout)))
    missing: dict[str, str] = {}
    unfinished: dict[str, str] = {}
    for rank in not_done:
        if rank not in collected.heard:
            missing[hosts[rank]] = f"did not answer: no word from its probe in {seconds:.1f}s"
        elif rank in silent:
            missing[hosts[rank]] = (
                f"stopped answering during the pre-flight: no word for {min(silence, timeout):g}s"
            )
        elif not silent and "error" not in collected.found.get(rank, {}):
            unfinished[hosts[rank]] = f"the pre-flight did not finish within {timeout:g}s"
    return missing, unfinished


def _blame(collected: Collected, not_done: Sequence[int], seconds: float) -> dict[str, str]:
    """When the probes' MPI job failed, the hosts the evidence points at, with why: the host mpirun's own
    message names (a lost daemon or rank, where it ran), else none beyond the probes that reported an error,
    else the hosts never heard from while others were; only with no evidence at all, every host not done."""
    hosts = collected.hosts
    message = mpirun_message(collected.other) or f"mpirun exited with code {collected.exit_code}"
    blamed = blamed_host(collected.other, hosts)
    if blamed is not None:
        return {blamed: f"the pre-flight's MPI job failed there: {message}"}
    if any("error" in collected.found.get(r, {}) for r in not_done):
        return {}  # each probe's own error names its host
    unheard = [r for r in not_done if r not in collected.heard]
    if unheard and len(unheard) < len(hosts):
        why = f"did not answer: no word from its probe in {seconds:.1f}s; mpirun: {message}"
        return {hosts[r]: why for r in unheard}
    return {hosts[r]: f"the pre-flight's MPI job failed: {message}" for r in not_done}


def lost_daemon(collected: Collected) -> str | None:
    """mpirun's message when the probes' MPI job ended because mpirun lost one of its daemons before every
    probe was done, else None: a connection that dropped once, which the check's second attempt tells from
    a host that cannot keep one (seen on compose networks, where the job's own mpirun then ran). Pure."""
    said = mpirun_message(collected.other)
    unfinished = len(collected.done) < len(collected.hosts)
    return said if collected.failed and unfinished and LOST_DAEMON in said else None


def stalled_launch(collected: Collected) -> str | None:
    """How the attempt ended when mpirun's launch stalled before the bound (no probe started anywhere), else
    None: once, the check runs again (check.py); seen once in SDK local mode, where the job's own mpirun then
    ran. Pure."""
    seen = collected.launch
    if seen is None or seen.probe_ran or not seen.ended_it:
        return None
    return launch.stall_note(seen, collected.hosts)


def mpirun_message(lines: Iterable[bytes]) -> str:
    """mpirun's own text, whole, on one line (its messages' borders of dashes left out). Pure."""
    text = [line.decode(errors="replace").strip() for line in lines]
    whole = " ".join(" ".join(line for line in text if line and not _RULE.match(line)).split())
    return whole if len(whole) <= MESSAGE_LIMIT else whole[: MESSAGE_LIMIT - 3] + "..."


def probe_error_host(lines: Iterable[bytes], hosts: Sequence[str]) -> str | None:
    """The host whose probe printed the first error line (Open MPI's, from MPI_Init: mpirun tags it with the
    rank; a healthy probe's warning is not one), else None. Pure."""
    for line in lines:
        tag = _TAG.match(line)
        if tag and int(tag.group(1)) < len(hosts) and _ERROR_WORD.search(line.decode(errors="replace")):
            return hosts[int(tag.group(1))]
    return None


def blamed_host(lines: Iterable[bytes], hosts: Sequence[str]) -> str | None:
    """The host mpirun's own text names as where the job failed: the rank it says failed first (its host),
    else the rank whose probe printed the first error line (mpirun tags it; a healthy probe's warning is not
    one), else the first host named on a line other than the one of mpirun's own daemon (`HNP daemon`).
    Pure."""
    raw = list(lines)
    text = [line.decode(errors="replace") for line in raw]
    failed = parse_mpirun_verdict("\n".join(text))
    if failed is not None and failed.host in hosts:
        return failed.host
    if failed is not None and failed.rank is not None and 0 <= failed.rank < len(hosts):
        return hosts[failed.rank]
    erring = probe_error_host(raw, hosts)
    if erring is not None:
        return erring
    for line in text:
        if "HNP" in line:
            continue
        found = [
            (m.start(), h) for h in hosts if (m := re.search(rf"(?<![\w-]){re.escape(h)}(?![\w-])", line))
        ]
        if found:
            return min(found)[1]
    return None


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
