"""What one host has, gathered in milliseconds with the standard library: CPUs, memory, GPUs (count, and
health as nvidia-smi reports it), /dev/shm, free space where the job writes, library versions and EFA devices.

Nothing here imports the frameworks: versions come from the installed distributions' metadata, the driver's
from /proc, Open MPI's and NCCL's from the probe (which has them loaded). Every reader returns data, never
raises: a fact that cannot be read is None, and the verdict says so.
"""

from __future__ import annotations

import contextlib
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from smhvd.config.hardware import num_cpus, num_gpus

NVIDIA_SMI_TIMEOUT = 10.0
# nvidia-smi --query-gpu fields, in this order (`nvidia-smi --help-query-gpu`).
GPU_QUERY = (
    "index",
    "name",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "persistence_mode",
)
# Distributions whose versions must be equal on every host, by the name the table shows.
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu", "tf-nightly"),
    "horovod": ("horovod",),
    "mpi4py": ("mpi4py",),
    "nccl": ("nvidia-nccl-cu12", "nvidia-nccl-cu13", "nvidia-nccl-cu11"),
    "torch": ("torch",),
}
_DRIVER = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]*)")


@dataclass(frozen=True)
class GpuHealth:
    index: int
    name: str
    ecc_uncorrected: int | None  # volatile uncorrectable ECC errors (None: not supported)
    retired_pending: bool | None  # a retired page waits for a reset
    remapped_pending: bool | None  # a remapped row waits for a reset (A100 and later)
    persistence: bool | None


@dataclass(frozen=True)
class HostFacts:
    host: str
    cpus: int
    memory_gb: float | None
    gpus: int
    gpu_health: tuple[GpuHealth, ...]
    shm_free_mb: float | None
    disk_free_mb: Mapping[str, float | None]  # by place: checkpoints, model, output, tmp
    versions: Mapping[
        str, str
    ]  # python, driver, each of DISTRIBUTIONS installed, open_mpi and nccl from the probe
    efa_devices: tuple[str, ...]
    time: float = 0.0  # this host's clock (time.time()) when the facts were read
    notes: tuple[str, ...] = field(default_factory=tuple)  # what could not be read


def memory_gb(meminfo: str) -> float | None:
    """MemTotal of /proc/meminfo in GB. Pure."""
    match = re.search(r"^MemTotal:\s+(\d+)\s+kB", meminfo, re.MULTILINE)
    return round(int(match.group(1)) * 1024 / 1e9, 1) if match else None


def free_mb(path: Path) -> float | None:
    """Free space (for an unprivileged writer) of the filesystem holding `path`, or of its nearest existing
    parent (the checkpoint directory may not exist yet)."""
    for place in (path, *path.parents):
        with contextlib.suppress(OSError):
            stat = os.statvfs(place)
            return round(stat.f_bavail * stat.f_frsize / 2**20, 1)
    return None


def driver_version(text: str) -> str | None:
    """The NVIDIA kernel module's version from /proc/driver/nvidia/version. Pure."""
    match = _DRIVER.search(text)
    return match.group(1) if match else None


def _int(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def _yes(text: str) -> bool | None:
    value = text.strip().lower()
    return {"yes": True, "enabled": True, "no": False, "disabled": False}.get(value)


def parse_gpu_query(csv: str) -> tuple[GpuHealth, ...]:
    """`nvidia-smi --query-gpu=GPU_QUERY --format=csv,noheader,nounits` output. Pure; "[N/A]" is None."""
    out: list[GpuHealth] = []
    for line in csv.splitlines():
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(GPU_QUERY) or _int(cells[0]) is None:
            continue
        out.append(
            GpuHealth(
                index=int(cells[0]),
                name=cells[1],
                ecc_uncorrected=_int(cells[2]),
                retired_pending=_yes(cells[3]),
                remapped_pending=_yes(cells[4]),
                persistence=_yes(cells[5]),
            )
        )
    return tuple(out)


def gpu_health() -> tuple[tuple[GpuHealth, ...], str | None]:
    """Each GPU's health from nvidia-smi (bounded), and a note when it could not be asked."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return (), "nvidia-smi not found"
    argv = [smi, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return (), f"nvidia-smi: {exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        return (), f"nvidia-smi exited {proc.returncode}: {last[:120]}"
    return parse_gpu_query(proc.stdout), None


def distribution_versions(
    names: Mapping[str, Sequence[str]] = DISTRIBUTIONS, path: Sequence[str] | None = None
) -> dict[str, str]:
    """Installed versions, by the shown name (the first of its distributions found on `path`, sys.path by
    default): the `Version:` of each `NAME-VERSION.dist-info/METADATA`, read directly (importlib.metadata
    parses every header through the email package: 20 ms of each probe's start)."""
    wanted = {re.sub(r"[-_.]+", "_", c).lower(): shown for shown, cs in names.items() for c in cs}
    order = {c: i for i, c in enumerate(wanted)}
    found: dict[str, tuple[int, str]] = {}
    for entry in sys.path if path is None else path:
        with contextlib.suppress(OSError):
            for item in os.scandir(entry or "."):
                if not item.name.endswith(".dist-info"):
                    continue
                key = re.sub(r"[-_.]+", "_", item.name[: -len(".dist-info")].rsplit("-", 1)[0]).lower()
                shown = wanted.get(key)
                if shown is None or (shown in found and found[shown][0] <= order[key]):
                    continue
                version = _metadata_version(Path(item.path) / "METADATA")
                if version:
                    found[shown] = (order[key], version)
    return {shown: version for shown, (_, version) in found.items()}


def _metadata_version(path: Path) -> str | None:
    with contextlib.suppress(OSError), path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
            if not line.strip():
                break  # the headers end at the first empty line
    return None


def efa_devices(sys_class: Path = Path("/sys/class/infiniband")) -> tuple[str, ...]:
    """RDMA devices whose driver is EFA (rdmapNsM on EFA instances)."""
    try:
        entries = sorted(sys_class.iterdir())
    except OSError:
        return ()
    out = []
    for entry in entries:
        with contextlib.suppress(OSError):
            if (entry / "device" / "driver").readlink().name == "efa":
                out.append(entry.name)
    return tuple(out)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def gather(host: str, places: Mapping[str, Path], now: float) -> HostFacts:
    """This host's facts; `places`: where the job writes (checkpoints, model, output, tmp)."""
    gpus = num_gpus()
    health, note = gpu_health() if gpus else ((), None)
    versions = {"python": platform.python_version(), **distribution_versions()}
    driver = driver_version(_read(Path("/proc/driver/nvidia/version")))
    if driver:
        versions["driver"] = driver
    return HostFacts(
        host=host,
        cpus=num_cpus(),
        memory_gb=memory_gb(_read(Path("/proc/meminfo"))),
        gpus=gpus,
        gpu_health=health,
        shm_free_mb=free_mb(Path("/dev/shm")) if Path("/dev/shm").is_dir() else None,
        disk_free_mb={name: free_mb(path) for name, path in places.items()},
        versions=versions,
        efa_devices=efa_devices(),
        time=now,
        notes=(note,) if note else (),
    )
