"""Who is named for not finishing the pre-flight, and why: the one home of that decision (verdict.py judges
what the probes that did report said, and adds these reasons as they are).

A host is named only on evidence about that host:
- mpirun's own messages (untagged lines, kept whole by collected.py): the rank or host it says failed, the
  daemon it lost;
- Open MPI's own error log written in a rank's process about its own host (collected.open_mpi_error);
- the probes' typed findings (a probe's `error`);
- what the leader observes: which probes it heard from and when (silence while others beat), and mpirun's
  launch in /proc (launch.py: the daemons that never connected back).
A probe's free text (NCCL_DEBUG=INFO's "Failed to find ..." on a healthy host) is shown, never matched. When
the evidence cannot tell who it is, nobody is named and a note says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from smhvd.mpi.output import parse_mpirun_verdict

from .collected import Collected, mpirun_message, tagged
from .launch import Launch

_SIGNED = re.compile(r"^\s*\[[^\]\s]+:\d+\]\s*")  # "[host:pid] ": who printed the line, not who failed


@dataclass(frozen=True)
class Blame:
    """Hosts named for not finishing (missing: silent, failed, stalled; unfinished: still running at the
    bound with every host answering, named only when nothing else explains it), and notes."""

    missing: dict[str, str] = field(default_factory=dict)
    unfinished: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def blame(collected: Collected, seconds: float, timeout: float, silence: float) -> Blame:
    """Who did not finish, on what evidence. Pure (reads what was collected)."""
    hosts = collected.hosts
    not_done = [r for r in range(len(hosts)) if r not in collected.done]
    if not_done and (collected.failed or set(collected.open_mpi_errors) & set(not_done)):
        return Blame(failed_job(collected, not_done, seconds))
    if collected.launch is not None and not collected.launch.probe_ran and not collected.heard:
        return stalled(collected.launch, hosts)
    return _silence(collected, not_done, seconds, timeout, silence)


def _silence(
    collected: Collected, not_done: Sequence[int], seconds: float, timeout: float, silence: float
) -> Blame:
    """The hosts never heard from, those that stopped answering, and (with neither) those not done."""
    hosts = collected.hosts
    limit = min(silence, timeout)
    silent = set(collected.silent(limit))
    missing: dict[str, str] = {}
    unfinished: dict[str, str] = {}
    for rank in not_done:
        if rank not in collected.heard:
            missing[hosts[rank]] = f"did not answer: no word from its probe in {seconds:.1f}s"
        elif rank in silent:
            missing[hosts[rank]] = f"stopped answering during the pre-flight: no word for {limit:g}s"
        elif not silent and "error" not in collected.found.get(rank, {}):
            unfinished[hosts[rank]] = f"the pre-flight did not finish within {timeout:g}s"
    return Blame(missing, unfinished)


def failed_job(collected: Collected, not_done: Sequence[int], seconds: float) -> dict[str, str]:
    """When the probes' MPI job failed (or hangs on a rank whose Open MPI logged an error), the hosts the
    evidence points at, with why: the host mpirun's own message names, else the ranks whose Open MPI logged
    an error about their own host, else none beyond the probes that reported an error, else the hosts never
    heard from while others were; only with no evidence at all, every host not done."""
    hosts = collected.hosts
    said = mpirun_message(collected.own)
    message = said or f"mpirun exited with code {collected.exit_code}"
    blamed = blamed_host(collected.own, hosts)
    if blamed is not None:
        return {blamed: f"the pre-flight's MPI job failed there: {message}"}
    erring = {r: line for r, line in collected.open_mpi_errors.items() if r in not_done}
    if erring:  # a probe that finished is healthy, whatever Open MPI logged in it
        also = f"; mpirun: {said}" if said else ""
        return {
            hosts[r]: f"Open MPI failed in its probe: {line.decode(errors='replace').split(':', 1)[1]}{also}"
            for r, line in sorted(erring.items())
        }
    if any("error" in collected.found.get(r, {}) for r in not_done):
        return {}  # each probe's own error names its host
    unheard = [r for r in not_done if r not in collected.heard]
    if unheard and len(unheard) < len(hosts):
        why = f"did not answer: no word from its probe in {seconds:.1f}s; mpirun: {message}"
        return {hosts[r]: why for r in unheard}
    return {hosts[r]: f"the pre-flight's MPI job failed: {message}" for r in not_done}


def blamed_host(own: Iterable[bytes], hosts: Sequence[str]) -> str | None:
    """The host mpirun's own text (its untagged lines) names as where the job failed: the rank it says failed
    first (its host), else the first host named on a line other than the one of mpirun's own daemon (`HNP
    daemon`), past the `[host:pid]` with which Open MPI signs what a process prints (mpirun's own warnings
    carry the leader's: `[algo-1:00368] plm:rsh: Warning: setpgid(...) failed`). A rank's output is not read
    here. Pure."""
    text = [_SIGNED.sub("", line.decode(errors="replace")) for line in own if not tagged(line)]
    failed = parse_mpirun_verdict("\n".join(text))
    if failed is not None and failed.host in hosts:
        return failed.host
    if failed is not None and failed.rank is not None and 0 <= failed.rank < len(hosts):
        return hosts[failed.rank]
    for line in text:
        if "HNP" in line:
            continue
        found = [
            (m.start(), h) for h in hosts if (m := re.search(rf"(?<![\w-]){re.escape(h)}(?![\w-])", line))
        ]
        if found:
            return min(found)[1]
    return None


def stalled(launch: Launch, hosts: Sequence[str]) -> Blame:
    """When mpirun started no probe: the hosts whose daemon never connected back are named; with every
    daemon connected, the evidence names nobody (the leader is not the default culprit): a note. Pure."""
    waiting = launch.waiting_on(hosts)
    if waiting:
        why = (
            f"its Open MPI daemon (orted) did not connect back to mpirun within {launch.seconds:.1f}s, so "
            "mpirun started no probe on any host"
        )
        return Blame(dict.fromkeys(waiting, why))
    if launch.unknown:
        return Blame(notes=(stall_note(launch, hosts) + ": no host named",))
    return Blame(
        notes=(
            f"mpirun started no probe within {launch.seconds:.1f}s, though every host's daemon had "
            "connected back: the evidence names no host",
        )
    )


def stall_note(launch: Launch, hosts: Sequence[str]) -> str:
    """A stalled launch in a note: the hosts with no daemon connection, or that cannot be told. Pure."""
    waiting = launch.waiting_on(hosts)
    on = f"no daemon connection from {', '.join(waiting)}" if waiting else "every daemon connected"
    if launch.unknown and not waiting:
        on = f"which daemon connection is whose cannot be told for {', '.join(sorted(launch.unknown))}"
    return f"mpirun started no probe within {launch.seconds:.1f}s ({on})"
