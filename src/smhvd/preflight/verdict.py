"""The pre-flight's verdict: from what every host's probe said, which host is wrong and why; the table and the
one-line verdict for the log, and the object for job-summary.json. Pure functions only.

A host that reported is compared with three things: fixed floors (free /dev/shm and disk, clock offset:
options), what its instance type promises (GPUs), and the hosts like it (the median of link and GPU
bandwidths of its kind; the majority of its instance group for GPUs, CPUs, EFA devices and library versions,
the NVIDIA driver only among the hosts that have one, the leader's value breaking a tie; memory within
MEMORY_TOLERANCE of its group's median). Each named host gets one reason: the first rule it breaks, in this
order. Who is named for not finishing (silent, failed, a stalled launch), and on what evidence, is blame.py's
decision: its reasons come in the findings (`silent`, `unfinished`) and are applied here as they are.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from smhvd.config.launcher_options import PreflightOptions
from smhvd.option_spec import key_of
from smhvd.preflight import nccl_net
from smhvd.preflight.facts import HostFacts
from smhvd.preflight.instance_types import EXPECTED_BUSBW_GBPS, gpu_count
from smhvd.preflight.nccl_net import NcclNet
from smhvd.preflight.yardstick import late_trip, median

# /dev/shm a job needs on a host (docs/preflight.md): Open MPI's shared-memory transport maps a segment of
# btl_vader_segment_size (4 MiB) for each rank of the host; NCCL's buffers between the GPUs of a host that are
# not reached peer to peer, and its proxies', take tens of MB a GPU (the container default, 64 MB, fails 8).
OPEN_MPI_SHM_MB = 4.0
NCCL_SHM_MB = 64.0
SHM_FIX = (
    "start the container with more (`docker run --shm-size=1g`, as bin/local-train.sh does; SageMaker's own "
    "instances have plenty) or lower launcher_preflight_min_shm_mb"
)
DISK_FIX = (
    "free space there (SageMaker: the estimator's volume_size) or lower launcher_preflight_min_free_disk_mb"
)
OTHER_VERSION = "runs another version of the launcher"
MEMORY_TOLERANCE = 0.05  # of its group's median: MemTotal varies by the kernel's reserve, a lost DIMM more
ONLY_WHERE_PRESENT = frozenset({"driver"})  # compared only among the hosts that have one


@dataclass(frozen=True)
class Named:
    host: str
    reason: str


@dataclass(frozen=True)
class Findings:
    """What the probes said, by host (a host missing from `facts` never said anything)."""

    hosts: tuple[str, ...]  # the MPI hosts, the leader first
    facts: Mapping[str, HostFacts] = field(default_factory=dict)
    other_version: Mapping[str, str] = field(default_factory=dict)  # host -> what of its findings differs
    nccl_net: Mapping[str, NcclNet] = field(default_factory=dict)  # host -> the network NCCL will use
    ranks_per_host: int = 1
    mpirun_said: str = ""  # mpirun's own message, whole, when its job failed or a host is missing
    blame_notes: tuple[str, ...] = ()  # what the evidence about the hosts that did not finish cannot tell
    first_attempt: str = ""  # how the first attempt ended when it lost a daemon or its launch stalled
    links: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # dst -> src -> MB/s
    # dst -> src -> CPU share: slow links no alone measurement could judge, an end never having had its CPU
    busy_links: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    clock: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # host -> rtt_ms, offset_s
    gpu: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # host -> devices, busbw_gbps, error
    gpu_cluster: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # host -> busbw_gbps, error
    silent: Mapping[str, str] = field(default_factory=dict)  # host -> why it is missing (stopped answering)
    # host -> its probe still ran at the bound with every host answering: named only when nothing else is
    unfinished: Mapping[str, str] = field(default_factory=dict)
    errors: Mapping[str, str] = field(default_factory=dict)  # host -> its probe's error
    groups: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)  # host -> (group, type)
    seconds: float = 0.0
    first_word_seconds: float | None = None  # mpirun's start -> the first word of any probe (its launch)
    phases: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # host -> finding -> probe's time

    def group_of(self, host: str) -> str:
        """The host's instance group ("" without instance groups)."""
        return self.groups.get(host, ("", None))[0]

    def instance_type(self, host: str) -> str | None:
        return self.groups.get(host, ("", None))[1]


@dataclass(frozen=True)
class Verdict:
    named: tuple[Named, ...]
    rows: tuple[Mapping[str, Any], ...]
    medians: Mapping[str, float | None]
    notes: tuple[str, ...]
    seconds: float
    first_word_seconds: float | None = None

    @property
    def ok(self) -> bool:
        return not self.named

    def line(self) -> str:
        """The one-line verdict."""
        took = f"{self.seconds:.1f}s"
        if self.ok:
            return f"pre-flight: all {len(self.rows)} host(s) fine ({took})"
        shown = "; ".join(f"{n.host}: {n.reason}" for n in self.named)
        return f"pre-flight: {len(self.named)} of {len(self.rows)} host(s) named ({took}): {shown}"

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "named": [{"host": n.host, "reason": n.reason} for n in self.named],
            "hosts": {row["host"]: dict(row) for row in self.rows},
            "medians": dict(self.medians),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
            "first_word_seconds": None
            if self.first_word_seconds is None
            else round(self.first_word_seconds, 3),
        }


def _majority(values: Mapping[str, object], reference: str) -> object:
    """The most common value; on a tie, the reference host's."""
    counts = Counter(values.values()).most_common()
    if not counts:
        return None
    top = [value for value, count in counts if count == counts[0][1]]
    return values[reference] if len(top) > 1 and reference in values else top[0]


def _odd_ones(values: Mapping[str, object], reference: str, say: str) -> dict[str, str]:
    """Hosts whose value differs from the majority, each with `say` formatted with {value} and {usual}."""
    usual = _majority(values, reference)
    return {h: say.format(value=v, usual=usual) for h, v in values.items() if v != usual}


def slow_links(
    links: Mapping[str, Mapping[str, float]],
    ratio: float,
    group_of: Mapping[str, str] | None = None,
    busy: Mapping[str, Mapping[str, float]] | None = None,
) -> tuple[dict[str, str], list[str], float | None]:
    """Hosts to name for links below ratio x the median of their kind, notes for the slow links no host
    explains, and the median of all. A link's kind is the pair of its ends' instance groups (`group_of`):
    links are compared within a group and between a pair of groups, so that groups unlike by design name
    nobody. A host whose slow links reach two or more other hosts is named for them (the most partners
    first, each link explained once): its NIC, its link or its CPU is what they share. A slow link left over,
    or both directions between two hosts, is a path between them that names neither: a note. A slow link
    in `busy` (dst -> src -> CPU share) was never measured with both ends on a CPU: a note, not evidence."""
    every = {(src, dst): mb for dst, by_src in links.items() for src, mb in by_src.items()}
    med = median(list(every.values()))
    if med is None:
        return {}, [], None
    usual = _link_medians(every, group_of or {})
    unjudged = {(src, dst): share for dst, by_src in (busy or {}).items() for src, share in by_src.items()}
    slow = {link: mb for link, mb in every.items() if mb < ratio * usual[link]}
    left = {link: mb for link, mb in slow.items() if link not in unjudged}
    named: dict[str, str] = {}
    while left:
        partners: dict[str, set[str]] = {}
        for src, dst in left:
            partners.setdefault(src, set()).add(dst)
            partners.setdefault(dst, set()).add(src)
        host, others = max(sorted(partners.items()), key=lambda item: len(item[1]))
        if len(others) < 2:
            break
        mine = sorted((link, mb) for link, mb in left.items() if host in link)
        shown = ", ".join(f"{src}->{dst} {mb:g} MB/s" for (src, dst), mb in mine)
        named[host] = f"slow network: {shown}; median link {usual[mine[0][0]]:g} MB/s"
        left = {link: mb for link, mb in left.items() if host not in link}
    notes = [
        f"slow link {src}->{dst} {mb:g} MB/s, median link {usual[(src, dst)]:g} MB/s (one path: neither host "
        "named)"
        for (src, dst), mb in sorted(left.items())
    ]
    notes += [
        f"slow link {src}->{dst} {mb:g} MB/s not judged: measured alone, an end had its CPU "
        f"{unjudged[(src, dst)]:.0%} of the time at best (the host's other work held it)"
        for (src, dst), mb in sorted(slow.items())
        if (src, dst) in unjudged
    ]
    return named, notes, med


def _link_medians(
    every: Mapping[tuple[str, str], float], group_of: Mapping[str, str]
) -> dict[tuple[str, str], float]:
    """Each link's yardstick: the median of the links of its kind (the pair of its ends' groups). Pure."""
    kind = {link: tuple(sorted(group_of.get(h, "") for h in link)) for link in every}
    by_kind: dict[tuple[str, ...], list[float]] = {}
    for link, mb in every.items():
        by_kind.setdefault(kind[link], []).append(mb)
    return {link: statistics.median(by_kind[kind[link]]) for link in every}


def _gpu_reasons(findings: Findings, ratio: float) -> tuple[dict[str, str], float | None]:
    reasons: dict[str, str] = {}
    busbw: dict[str, float] = {
        h: float(g["busbw_gbps"]) for h, g in findings.gpu.items() if g.get("busbw_gbps") is not None
    }
    med = median(list(busbw.values()))
    for host, value in busbw.items():
        instance_type = findings.instance_type(host)
        expected = EXPECTED_BUSBW_GBPS.get(instance_type or "")
        group = findings.group_of(host)
        peers = [v for h, v in busbw.items() if findings.group_of(h) == group]  # its group's: like with like
        usual = median(peers)
        if expected is not None and value < ratio * expected:
            reasons[host] = (
                f"GPU all_reduce bus bandwidth {value:g} GB/s; {instance_type} reaches ~{expected:g}"
            )
        elif usual is not None and len(peers) > 2 and value < ratio * usual:
            reasons[host] = f"GPU all_reduce bus bandwidth {value:g} GB/s; median of its group {usual:g} GB/s"
    for host, g in findings.gpu_cluster.items():
        if g.get("error"):
            reasons.setdefault(host, f"NCCL all_reduce across the hosts failed here: {g['error']}")
    for host, g in findings.gpu.items():
        known = findings.facts.get(host)
        if g.get("error") and known is not None and known.gpus:
            reasons.setdefault(host, f"GPUs visible but NCCL failed: {g['error']}")
    return reasons, med


def shm_need_mb(ranks_per_host: int, gpus: int) -> float:
    """The /dev/shm (MB) a host's ranks need: Open MPI's segment per rank, NCCL's share per GPU in use (one
    a rank) when several are (one GPU has no peer on its host). Pure."""
    return ranks_per_host * OPEN_MPI_SHM_MB + _local_gpus(ranks_per_host, gpus) * NCCL_SHM_MB


def _local_gpus(ranks_per_host: int, gpus: int) -> int:
    """The GPUs NCCL connects within a host: one a rank, none when it is alone there. Pure."""
    used = min(gpus, ranks_per_host)
    return used if used > 1 else 0


def shm_reason(shm: float, ranks_per_host: int, gpus: int, wanted: float | None) -> str | None:
    """Why this much free /dev/shm is too little for the job (None: enough). `wanted`: the option, which
    replaces the need derived from the job. Pure."""
    if wanted is not None:
        need, why = wanted, key_of(PreflightOptions, "min_shm_mb")
    else:
        need, local = shm_need_mb(ranks_per_host, gpus), _local_gpus(ranks_per_host, gpus)
        why = f"{ranks_per_host} rank(s) x {OPEN_MPI_SHM_MB:g} MB for Open MPI"
        if local:
            why += f", {local} GPU(s) x {NCCL_SHM_MB:g} MB for NCCL"
    if shm >= need:
        return None
    return f"/dev/shm has {shm:g} MB free; this job needs {need:g} MB ({why}): {SHM_FIX}"


def _host_reasons(findings: Findings, options: PreflightOptions, facts: HostFacts, host: str) -> list[str]:
    """What is wrong with one host by itself (floors, its instance type, its GPUs' health and tools)."""
    out: list[str] = []
    instance_type = findings.instance_type(host)
    expected = gpu_count(instance_type)
    if expected is not None and facts.gpus != expected:
        out.append(f"{facts.gpus} GPU(s) visible; {instance_type} has {expected}")
    out += [f"{tool} {what}" for tool, what in sorted(facts.tools.items())]
    for gpu in facts.gpu_health:
        if gpu.ecc_uncorrected:
            out.append(f"GPU {gpu.index}: {gpu.ecc_uncorrected} uncorrectable ECC error(s)")
        if gpu.retired_pending or gpu.remapped_pending:
            out.append(f"GPU {gpu.index}: retired/remapped memory pending a reset")
    if facts.shm_free_mb is not None:
        shm = shm_reason(facts.shm_free_mb, findings.ranks_per_host, facts.gpus, options.min_shm_mb)
        out += [shm] if shm else []
    for place, free in facts.disk_free_mb.items():
        if free is not None and free < options.min_free_disk_mb:
            out.append(
                f"{place}: {free:g} MB free; at least {options.min_free_disk_mb:g} MB wanted: {DISK_FIX}"
            )
    net = findings.nccl_net.get(host)
    falls_back = nccl_net.socket_reason(net, instance_type) if net is not None else None
    if falls_back:
        out.append(f"NCCL on {host} falls back to sockets: {falls_back}")
    pinned = nccl_net.memlock_reason(net, instance_type) if net is not None else None
    out += [pinned] if pinned else []
    offset = findings.clock.get(host, {}).get("offset_s")
    if offset is not None and abs(offset) > options.max_clock_offset:
        out.append(f"clock {offset:+g}s from the leader's; at most {options.max_clock_offset:g}s")
    return out


def _members(
    facts: Mapping[str, HostFacts], groups: Mapping[str, tuple[str, str | None]], leader: str
) -> list[tuple[str, dict[str, HostFacts], str]]:
    """Each instance group's (name, its hosts' facts, its reference host: the leader's group's is the
    leader). Pure."""
    group_of = {h: groups.get(h, ("", None))[0] for h in facts}
    out = []
    for group in sorted(set(group_of.values())):
        members = {h: f for h, f in facts.items() if group_of[h] == group}
        out.append((group, members, leader if leader in members else min(members)))
    return out


def _where(group: str) -> str:
    return f"the other hosts of {group}" if group else "the other hosts"


def _group_reasons(
    facts: Mapping[str, HostFacts], groups: Mapping[str, tuple[str, str | None]], leader: str
) -> dict[str, list[str]]:
    """Hosts unlike the majority of their instance group: GPUs, CPUs, EFA devices; memory beyond a
    tolerance of its group's median (MemTotal differs by what the kernel reserves)."""
    out: dict[str, list[str]] = {}
    for group, members, ref in _members(facts, groups, leader):
        values: dict[str, dict[str, object]] = {
            "GPU(s) visible": {h: f.gpus for h, f in members.items()},
            "CPUs": {h: f.cpus for h, f in members.items()},
            "EFA device(s)": {h: len(f.efa_devices) for h, f in members.items()},
        }
        for what, by_host in values.items():
            say = f"{{value}} {what}; {_where(group)} have {{usual}}"
            for host, why in _odd_ones(by_host, ref, say).items():
                out.setdefault(host, []).append(why)
        memory = {h: f.memory_gb for h, f in members.items() if f.memory_gb is not None}
        for host, why in memory_reasons(memory, _where(group)).items():
            out.setdefault(host, []).append(why)
    return out


def memory_reasons(memory_gb: Mapping[str, float], where: str) -> dict[str, str]:
    """Hosts whose memory is more than MEMORY_TOLERANCE off the median of their group's (`memory_gb`, one
    group's hosts). Pure."""
    usual = median(memory_gb.values())
    if usual is None or len(memory_gb) < 2:
        return {}
    return {
        h: f"{gb:g} GB of memory; {where} have {usual:g}"
        for h, gb in memory_gb.items()
        if abs(gb - usual) > MEMORY_TOLERANCE * usual
    }


def _version_reasons(
    facts: Mapping[str, HostFacts], groups: Mapping[str, tuple[str, str | None]], leader: str
) -> dict[str, list[str]]:
    """Hosts whose library versions differ from the majority of their instance group; the NVIDIA driver
    only among the hosts that have one (a CPU host has none, and is no evidence against a GPU host)."""
    out: dict[str, list[str]] = {}
    for group, members, ref in _members(facts, groups, leader):
        names = sorted({name for f in members.values() for name in f.versions})
        for name in names:
            values = {h: f.versions.get(name, "none") for h, f in members.items()}
            if name in ONLY_WHERE_PRESENT:
                values = {h: v for h, v in values.items() if v != "none"}
            say = f"{name} {{value}}; {_where(group)} have {{usual}}"
            for host, why in _odd_ones(values, ref, say).items():
                out.setdefault(host, []).append(why)
    return out


def _latency_reasons(
    clock: Mapping[str, Mapping[str, float]], ratio: float
) -> tuple[dict[str, str], float | None]:
    """Hosts whose round trip from the leader is late (yardstick.late_trip)."""
    trips = {h: c["rtt_ms"] for h, c in clock.items() if c.get("rtt_ms") is not None}
    med = median(list(trips.values()))
    if med is None or len(trips) < 3:
        return {}, med
    return {
        h: f"round trip from the leader {trip:g} ms; median {med:g} ms"
        for h, trip in trips.items()
        if late_trip(trip, med, ratio)
    }, med


def _mpirun_notes(findings: Findings) -> tuple[str, ...]:
    """What mpirun said when the probes' job failed, and when its first attempt did. Pure."""
    said: tuple[str, ...] = (f"mpirun said: {findings.mpirun_said}",) if findings.mpirun_said else ()
    if findings.first_attempt:
        said += (f"the check ran twice; its first attempt ended with: {findings.first_attempt}",)
    return said


def judge(findings: Findings, options: PreflightOptions) -> Verdict:
    hosts = findings.hosts
    leader = hosts[0]
    reasons: dict[str, list[str]] = {h: [] for h in hosts}
    for host, silent in findings.silent.items():
        reasons[host].append(silent)
    for host, error in findings.errors.items():
        reasons[host].append(f"its probe failed: {error}")
    for host, differs in findings.other_version.items():
        reasons[host].append(f"{OTHER_VERSION}: {differs}")
    facts = {h: f for h, f in findings.facts.items() if h in reasons}
    for host, f in facts.items():
        reasons[host] += _host_reasons(findings, options, f, host)
    for more in (
        _group_reasons(facts, findings.groups, leader),
        _version_reasons(facts, findings.groups, leader),
    ):
        for host, why in more.items():
            reasons[host] += why
    group_of = {h: findings.group_of(h) for h in hosts}
    link_named, link_notes, link_median = slow_links(
        findings.links, options.min_ratio, group_of, findings.busy_links
    )
    rtt_named, rtt_median = _latency_reasons(findings.clock, options.min_ratio)
    gpu_named, gpu_median = _gpu_reasons(findings, options.min_ratio)
    for named_by in (link_named, rtt_named, gpu_named):
        for host, reason in named_by.items():
            if host in reasons:
                reasons[host].append(reason)
    if not any(reasons.values()):
        for host, late in findings.unfinished.items():
            reasons[host].append(late)
    named = tuple(Named(h, why[0]) for h, why in reasons.items() if why)
    rows = tuple(_row(findings, h, reasons[h]) for h in hosts)
    notes = tuple(sorted({f"{h}: {note}" for h, f in facts.items() for note in f.notes})) + tuple(link_notes)
    notes += findings.blame_notes + _mpirun_notes(findings)
    medians = {"link_mb_s": link_median, "rtt_ms": rtt_median, "gpu_busbw_gbps": gpu_median}
    if findings.gpu_cluster:
        medians["cluster_busbw_gbps"] = median(g.get("busbw_gbps") for g in findings.gpu_cluster.values())
    return Verdict(named, rows, medians, notes, findings.seconds, findings.first_word_seconds)


def _row(findings: Findings, host: str, reasons: Sequence[str]) -> dict[str, Any]:
    f = findings.facts.get(host)
    into = findings.links.get(host, {})
    out_of = [by_src[host] for by_src in findings.links.values() if host in by_src]
    clock = findings.clock.get(host, {})
    net = findings.nccl_net.get(host)
    return {
        "host": host,
        "cpus": f.cpus if f else None,
        "memory_gb": f.memory_gb if f else None,
        "gpus": f.gpus if f else None,
        "shm_free_mb": f.shm_free_mb if f else None,
        "disk_free_mb": dict(f.disk_free_mb) if f else {},
        "link_in_mb_s": min(into.values()) if into else None,
        "link_out_mb_s": min(out_of) if out_of else None,
        "rtt_ms": clock.get("rtt_ms"),
        "clock_offset_s": clock.get("offset_s"),
        "gpu_busbw_gbps": findings.gpu.get(host, {}).get("busbw_gbps"),
        "nccl_net": nccl_net.cell(net) if net is not None else None,
        "versions": dict(f.versions) if f else {},
        "efa_devices": len(f.efa_devices) if f else 0,
        "probe_seconds": dict(findings.phases.get(host, {})),
        "verdict": "ok" if not reasons else "NAMED",
        "reasons": list(reasons),
    }


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


COLUMNS = (
    ("host", "host"),
    ("cpus", "cpus"),
    ("memory_gb", "mem GB"),
    ("gpus", "gpus"),
    ("shm_free_mb", "shm MB"),
    ("disk", "min disk MB"),
    ("link_in_mb_s", "in MB/s"),
    ("link_out_mb_s", "out MB/s"),
    ("rtt_ms", "rtt ms"),
    ("clock_offset_s", "clock s"),
    ("gpu_busbw_gbps", "gpu GB/s"),
    ("nccl_net", "NCCL network"),
    ("verdict", "verdict"),
)


def table(verdict: Verdict) -> str:
    """One row a host (links: the slowest into and out of it), the medians, then each reason."""
    rows = []
    for row in verdict.rows:
        disks = [v for v in row["disk_free_mb"].values() if v is not None]
        cells = {**row, "disk": min(disks) if disks else None}
        rows.append([_cell(cells[key]) for key, _ in COLUMNS])
    heads = [title for _, title in COLUMNS]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    medians = ", ".join(f"{k} {_cell(v)}" for k, v in verdict.medians.items() if v is not None)
    if medians:
        lines.append(f"medians: {medians}")
    lines += [f"{n.host}: {n.reason}" for n in verdict.named]
    lines += [f"note: {note}" for note in verdict.notes]
    return "\n".join(lines)
