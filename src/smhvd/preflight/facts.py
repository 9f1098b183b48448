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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from smhvd.config.hardware import num_cpus, num_gpus
from smhvd.proc.steps import last_line

NVIDIA_SMI_TIMEOUT = 5.0
# The facts' format: a probe of another launcher version writes another (read_facts names the host).
FACTS_VERSION = 2
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
    ]  # python, driver, each of DISTRIBUTIONS installed, mpi and nccl from the probe
    efa_devices: tuple[str, ...]
    time: float = 0.0  # this host's clock (time.time()) when the facts were read
    notes: tuple[str, ...] = field(default_factory=tuple)  # what could not be read
    tools: Mapping[str, str] = field(default_factory=dict)  # a tool that failed (nvidia-smi) -> what it did
    stamp: int = FACTS_VERSION  # which launcher's probe wrote them: read_facts refuses another


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


def gpu_health(smi: str) -> tuple[tuple[GpuHealth, ...], str | None]:
    """Each GPU's health from the nvidia-smi at `smi` (bounded), or what the tool did instead (its output is
    untrusted: bytes that are not UTF-8, no row, a hang or a failure are a finding, never an exception)."""
    argv = [smi, f"--query-gpu={','.join(GPU_QUERY)}", "--format=csv,noheader,nounits"]
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=NVIDIA_SMI_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return (), f"did not finish within {NVIDIA_SMI_TIMEOUT:g}s"
    except OSError as exc:
        return (), f"could not run: {exc}"
    if proc.returncode != 0:
        return (), f"exited {proc.returncode}: {last_line(proc.stderr + proc.stdout)[:120]}"
    try:
        text = proc.stdout.decode()
    except UnicodeDecodeError:
        return (), "printed bytes that are not UTF-8"
    health = parse_gpu_query(text)
    return (health, None) if health else ((), f"printed no GPU's row: {text.strip()[:80]!r}")


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
    smi = shutil.which("nvidia-smi") if gpus else None
    health, problem = gpu_health(smi) if smi else ((), None)
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
        notes=("nvidia-smi not found",) if gpus and not smi else (),
        tools={"nvidia-smi": problem} if problem else {},
    )


# The reading of a probe's facts (JSON: untrusted): each field's test, by name.
def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> bool:
    return _is_int(value) or isinstance(value, float)


def _maybe(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or test(value)


def _list_of(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, list) and all(test(v) for v in value)


def map_of(test: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: isinstance(value, dict) and all(
        isinstance(k, str) and test(v) for k, v in value.items()
    )


def _is_str(value: object) -> bool:
    return isinstance(value, str)


_GPU_FIELDS: dict[str, Callable[[object], bool]] = {
    "index": _is_int,
    "name": _is_str,
    "ecc_uncorrected": _maybe(_is_int),
    "retired_pending": _maybe(lambda v: isinstance(v, bool)),
    "remapped_pending": _maybe(lambda v: isinstance(v, bool)),
    "persistence": _maybe(lambda v: isinstance(v, bool)),
}
_FIELDS: dict[str, Callable[[object], bool]] = {
    "host": _is_str,
    "cpus": _is_int,
    "memory_gb": _maybe(is_number),
    "gpus": _is_int,
    "gpu_health": _list_of(lambda v: isinstance(v, dict) and differences(v, _GPU_FIELDS) == []),
    "shm_free_mb": _maybe(is_number),
    "disk_free_mb": map_of(_maybe(is_number)),
    "versions": map_of(_is_str),
    "efa_devices": _list_of(_is_str),
    "time": is_number,
    "notes": _list_of(_is_str),
    "tools": map_of(_is_str),
    "stamp": _is_int,
}


def differences(value: Mapping[str, object], fields: Mapping[str, Callable[[object], bool]]) -> list[str]:
    """How `value` differs from what `fields` expect: keys missing, unknown here, mistyped. Pure."""
    out = []
    missing = [k for k in fields if k not in value]
    unknown = sorted(k for k in value if k not in fields)
    mistyped = [k for k, test in fields.items() if k in value and not test(value[k])]
    if missing:
        out.append(f"lack {', '.join(missing)}")
    if unknown:
        out.append(f"have {', '.join(unknown)}, unknown here")
    if mistyped:
        out.append(f"have {', '.join(f'{k}={value[k]!r:.40}' for k in mistyped)}, of another type")
    return out


def read_facts(value: object) -> HostFacts | str:
    """A probe's facts (dataclasses.asdict of a HostFacts, through JSON) back, or what differs from this
    launcher's (another launcher version's probe wrote them). Pure; never raises."""
    if not isinstance(value, dict):
        return f"its facts are a {type(value).__name__}, not an object"
    if value.get("stamp") != FACTS_VERSION and _is_int(value.get("stamp")):
        return f"its facts are version {value['stamp']}, this launcher's {FACTS_VERSION}"
    wrong = differences(value, _FIELDS)
    if wrong:
        return "its facts " + "; ".join(wrong)
    return HostFacts(
        **{k: v for k, v in value.items() if k not in ("gpu_health", "efa_devices", "notes")},
        gpu_health=tuple(GpuHealth(**g) for g in value["gpu_health"]),
        efa_devices=tuple(value["efa_devices"]),
        notes=tuple(value["notes"]),
    )
