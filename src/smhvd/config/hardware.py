"""What this host has: usable CPUs, visible NVIDIA GPUs, network interfaces and routes."""

from __future__ import annotations

import os
import re
import socket
import subprocess
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


def parse_route_device(text: str) -> str | None:
    """The interface in `ip -o route get ADDR` output ("10.0.0.3 dev eth0 src 10.0.0.2 uid 0 ...")."""
    match = re.search(r"(?:^|\s)dev (\S+)", text)
    return match.group(1) if match else None


def route_interface(host: str) -> str | None:
    """The interface that carries this host's traffic to `host` (None: unresolvable or no route)."""
    try:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_STREAM)
    except OSError:
        return None
    if not infos:
        return None
    address = str(infos[0][4][0])
    try:
        proc = subprocess.run(
            ["ip", "-o", "route", "get", address], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_route_device(proc.stdout) if proc.returncode == 0 else None
