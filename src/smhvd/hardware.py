"""What this host has: CPUs usable by this process and NVIDIA GPUs visible to it."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

_DEV_GPU = re.compile(r"^nvidia[0-9]+$")


def num_cpus() -> int:
    return len(os.sched_getaffinity(0)) or 1


def count_gpus(driver_entries: list[str], dev_entries: list[str]) -> int:
    """GPUs from the driver's /proc listing, else from the /dev/nvidiaN device nodes."""
    if driver_entries:
        return len(driver_entries)
    return sum(1 for name in dev_entries if _DEV_GPU.match(name))


def num_gpus(proc: Path = Path("/proc/driver/nvidia/gpus"), dev: Path = Path("/dev")) -> int:
    try:
        driver = [p.name for p in proc.iterdir()]
    except OSError:
        driver = []
    try:
        devices = [p.name for p in dev.iterdir() if p.name.startswith("nvidia")]
    except OSError:
        devices = []
    return count_gpus(driver, devices)


def interface_names() -> set[str]:
    return {name for _, name in socket.if_nameindex()}
