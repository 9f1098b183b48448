"""What could slow a rank, sampled by its rank wrapper every SAMPLE_EVERY seconds while the job runs (and by
the first rank's wrapper of each host, what could slow the whole host), as shares of the interval since the
last sample: the rank's CPU-quota throttling (its cgroup's `cpu.stat`), the CPU it used and its time waiting
on block I/O (`/proc/PID/stat`); the host's CPU steal (`/proc/stat`), its CPU, memory and I/O pressure
(`/proc/pressure/*`), its TCP retransmits (`/proc/net/snmp`), and each GPU's clocks as nvidia-smi reports
them (bounded, as the pre-flight runs it).

Each reading is a pure function of the files' text; `Sampler` keeps the previous counters. Whatever cannot be
read (no cgroup quota, no PSI, no GPU) is None, never an error: the verdict compares only what every host has.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SAMPLE_EVERY = 5.0  # seconds between samples (a few small /proc reads a rank; nvidia-smi a host)
GPU_EVERY = 15.0  # seconds between nvidia-smi runs on a host
NVIDIA_SMI_TIMEOUT = 5.0
CGROUP_ROOTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
PSI = ("cpu", "memory", "io")
GPU_QUERY = ("index", "clocks_throttle_reasons.active", "temperature.gpu", "clocks.sm", "clocks.max.sm")
# clocks_throttle_reasons bits that are not a slowdown: GPU idle, application clocks setting.
BENIGN_THROTTLE = 0x1 | 0x2
THROTTLE_NAMES = {
    0x4: "power cap",
    0x8: "HW slowdown",
    0x20: "SW thermal",
    0x40: "HW thermal",
    0x80: "power brake",
}
TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Counters:
    """Cumulative counters at one moment (any of them None when it cannot be read)."""

    at: float  # time.monotonic()
    periods: tuple[int, int] | None = None  # cgroup cpu.stat: (nr_periods, nr_throttled)
    cpu_ticks: int | None = None  # the rank's utime + stime
    io_ticks: int | None = None  # the rank's delayacct_blkio_ticks
    host_cpu: tuple[int, int] | None = None  # /proc/stat: (all ticks, steal ticks)
    pressure: Mapping[str, int] | None = None  # /proc/pressure/*: some total, microseconds
    tcp: tuple[int, int] | None = None  # /proc/net/snmp: (OutSegs, RetransSegs)


def parse_cpu_stat(text: str) -> tuple[int, int] | None:
    """(nr_periods, nr_throttled) of a cgroup's cpu.stat (v1 and v2 name them alike). Pure."""
    fields = dict(line.split(None, 1) for line in text.splitlines() if len(line.split()) == 2)
    try:
        return int(fields["nr_periods"]), int(fields["nr_throttled"])
    except (KeyError, ValueError):
        return None


def cpu_stat_paths(proc_cgroup: str, roots: tuple[str, ...] = CGROUP_ROOTS) -> list[Path]:
    """Where the cpu.stat of a process's cgroup may be, from its /proc/PID/cgroup text: the v1 `cpu`
    controller's hierarchy first, then the v2 one. Pure."""
    paths: list[Path] = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, where = parts
        relative = where.lstrip("/")
        if "cpu" in controllers.split(","):
            paths.append(Path(roots[0], controllers, relative, "cpu.stat"))
        elif controllers == "":
            paths.extend(Path(root, relative, "cpu.stat") for root in roots)
    return paths


def parse_pid_stat(text: str) -> tuple[int, int] | None:
    """(utime + stime, delayacct_blkio_ticks) of /proc/PID/stat. Pure."""
    fields = text[text.rfind(")") + 2 :].split()  # after the command name, which may hold anything
    try:
        return int(fields[11]) + int(fields[12]), int(fields[39])
    except (IndexError, ValueError):
        return None


def parse_proc_stat(text: str) -> tuple[int, int] | None:
    """(all ticks, steal ticks) of /proc/stat's `cpu` line (steal is its 8th number). Pure."""
    for line in text.splitlines():
        fields = line.split()
        if fields[:1] == ["cpu"] and len(fields) >= 9:
            with contextlib.suppress(ValueError):
                ticks = [int(v) for v in fields[1:9]]
                return sum(ticks), ticks[7]
    return None


def parse_snmp(text: str) -> tuple[int, int] | None:
    """(OutSegs, RetransSegs) of /proc/net/snmp's Tcp lines (a header line, then its values). Pure."""
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        return None
    fields = dict(zip(rows[0], rows[1], strict=False))
    try:
        return int(fields["OutSegs"]), int(fields["RetransSegs"])
    except (KeyError, ValueError):
        return None


def parse_pressure(text: str) -> int | None:
    """The `some` line's total (microseconds stalled) of a /proc/pressure file. Pure."""
    for line in text.splitlines():
        if line.startswith("some "):
            for field in line.split()[1:]:
                if field.startswith("total="):
                    with contextlib.suppress(ValueError):
                        return int(field[len("total=") :])
    return None


def share(
    before: tuple[int, int] | int | None, after: tuple[int, int] | int | None, scale: float
) -> float | None:
    """A counter's growth over `scale`, or a (whole, part) pair's part over whole; None when unknown or the
    counter went back (a reset). Pure."""
    if before is None or after is None:
        return None
    if isinstance(before, tuple) and isinstance(after, tuple):
        whole, part = after[0] - before[0], after[1] - before[1]
        return None if whole <= 0 or part < 0 else round(part / whole, 4)
    if not (isinstance(before, int) and isinstance(after, int)):
        return None
    grown = after - before
    return None if grown < 0 or scale <= 0 else round(grown / scale, 4)


def rates(before: Counters, after: Counters) -> dict[str, Any]:
    """The shares of the interval between two samples (docs/inflight.md). Pure."""
    seconds = after.at - before.at
    out: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "throttled": share(before.periods, after.periods, 0.0),
        "cpu": share(before.cpu_ticks, after.cpu_ticks, seconds * TICKS),
        "io_wait": share(before.io_ticks, after.io_ticks, seconds * TICKS),
    }
    if after.host_cpu is not None:
        out["steal"] = share(before.host_cpu, after.host_cpu, 0.0)
    if after.tcp is not None:
        out["retransmits"] = share(before.tcp, after.tcp, 0.0)
    if after.pressure is not None and before.pressure is not None:
        out["pressure"] = {
            kind: share(before.pressure.get(kind), after.pressure.get(kind), seconds * 1e6)
            for kind in after.pressure
        }
    return out


def _read(path: Path | str) -> str | None:
    try:
        return Path(path).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _cgroup_periods(pid: int) -> tuple[int, int] | None:
    for path in cpu_stat_paths(_read(f"/proc/{pid}/cgroup") or ""):
        found = parse_cpu_stat(_read(path) or "")
        if found is not None:
            return found
    return None


def read_counters(pid: int, host_wide: bool, clock: Callable[[], float] = time.monotonic) -> Counters:
    """This moment's counters of process `pid` (and of this host, `host_wide`)."""
    own = parse_pid_stat(_read(f"/proc/{pid}/stat") or "")
    host_cpu = parse_proc_stat(_read("/proc/stat") or "") if host_wide else None
    pressure: dict[str, int] | None = None
    if host_wide:
        found = {kind: parse_pressure(_read(f"/proc/pressure/{kind}") or "") for kind in PSI}
        pressure = {kind: value for kind, value in found.items() if value is not None} or None
    return Counters(
        at=clock(),
        periods=_cgroup_periods(pid),
        cpu_ticks=own[0] if own else None,
        io_ticks=own[1] if own else None,
        host_cpu=host_cpu,
        pressure=pressure,
        tcp=parse_snmp(_read("/proc/net/snmp") or "") if host_wide else None,
    )


def parse_gpu_clocks(csv: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` rows: each GPU's slowdown reasons
    (the throttle bits that are not idle or application clocks), temperature and SM clock against its most.
    Pure; a row that does not parse is left out."""
    out: list[dict[str, Any]] = []
    for line in csv.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(GPU_QUERY):
            continue
        try:
            index, reasons = int(cells[0]), int(cells[1], 16)
        except ValueError:
            continue
        slow = reasons & ~BENIGN_THROTTLE
        out.append(
            {
                "index": index,
                "slowdown": [name for bit, name in THROTTLE_NAMES.items() if slow & bit],
                "temperature": _number(cells[2]),
                "sm_clock_ratio": _ratio(_number(cells[3]), _number(cells[4])),
            }
        )
    return out


def _number(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None  # "[N/A]", "[Not Supported]"


def _ratio(part: float | None, whole: float | None) -> float | None:
    return None if part is None or not whole else round(part / whole, 3)


def gpu_clocks(smi: str) -> list[dict[str, Any]] | None:
    """Each GPU's clocks from the nvidia-smi at `smi`, bounded; None when it did not answer."""
    argv = [smi, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if proc.returncode != 0:
        return None
    return parse_gpu_clocks(proc.stdout.decode(errors="replace")) or None


class Sampler:
    """One rank's samples: each call gives the shares since the previous one (None the first time)."""

    def __init__(self, pid: int, host_wide: bool) -> None:
        self.pid, self.host_wide = pid, host_wide
        self.last = read_counters(pid, host_wide)
        self.smi = shutil.which("nvidia-smi") if host_wide else None
        self.gpu_at = -GPU_EVERY

    def sample(self) -> dict[str, Any]:
        now = read_counters(self.pid, self.host_wide)
        out = rates(self.last, now)
        self.last = now
        if self.smi is not None and now.at - self.gpu_at >= GPU_EVERY:
            self.gpu_at = now.at
            out["gpu"] = gpu_clocks(self.smi)
        return out
