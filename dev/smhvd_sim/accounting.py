"""CPU time per simulated host: one cgroup (v2) per host, which every command started on the host joins before
it enters the host's namespaces, so the group counts everything the command forks or leaves behind (a daemon
re-parented to the host's PID 1 included). The hosts share the machine's cores: a host's CPU seconds say what
it would cost on an instance of its own, which its wall time on a shared machine does not.

Optional: without a writable cgroup v2 hierarchy (``cgroup2`` in /proc/self/mountinfo) the cluster runs the
same and reports no CPU time. cpu.stat exists in every v2 group whether or not the cpu controller is on.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from pathlib import Path

from smhvd_sim.system import ClusterError, wait_for

MOUNTINFO = Path("/proc/self/mountinfo")
OWN_CGROUP = Path("/proc/self/cgroup")
REMOVE_TIMEOUT = 10.0
# Joins the group named by $1, then becomes the command (same pid): `sh -c JOIN_SCRIPT GROUP argv...`.
JOIN_SCRIPT = 'echo 0 > "$1/cgroup.procs" && shift && exec "$@"'


def own_group(mountinfo: str, cgroup: str) -> Path | None:
    """This process's cgroup v2 directory, from the texts of /proc/self/mountinfo and /proc/self/cgroup."""
    mount = next(
        (
            Path(fields[4])
            for line in mountinfo.splitlines()
            if (fields := line.split()) and " - cgroup2 " in line
        ),
        None,
    )
    path = next((line[3:] for line in cgroup.splitlines() if line.startswith("0::")), None)
    if mount is None or path is None:
        return None
    return mount / path.lstrip("/")


def create_groups(cluster_id: str, hosts: Sequence[str]) -> tuple[Path, ...]:
    """Create ``smhvd-<id>/<host>`` under this process's v2 group; return the directories made, deepest
    first (empty when there is no usable hierarchy)."""
    try:
        base = own_group(MOUNTINFO.read_text(), OWN_CGROUP.read_text())
    except OSError:
        return ()
    if base is None or not (base / "cgroup.procs").exists():
        return ()
    root = base / f"smhvd-{cluster_id}"
    try:
        root.mkdir()
        for host in hosts:
            (root / host).mkdir()
    except OSError:
        remove_groups([*(root / host for host in hosts), root])
        return ()
    return (*(root / host for host in hosts), root)


def remove_groups(groups: Sequence[Path]) -> None:
    """rmdir each group (deepest first), waiting a little for its last processes to be gone."""
    for group in groups:
        if not group.is_dir():
            continue
        with contextlib.suppress(ClusterError):
            wait_for(functools.partial(_rmdir, group), f"cgroup {group} to empty", REMOVE_TIMEOUT)


def _rmdir(group: Path) -> bool | None:
    try:
        group.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return None  # busy: processes still leaving
    return True


def join_argv(group: Path, argv: Sequence[str]) -> list[str]:
    """``argv`` run so that it joins ``group`` first (before it forks anything)."""
    return ["sh", "-c", JOIN_SCRIPT, "smhvd-join", str(group), *argv]


def cpu_seconds(group: Path) -> float | None:
    """User + system CPU seconds of every process that was ever in ``group`` (None if unreadable)."""
    try:
        text = (group / "cpu.stat").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value) / 1e6
    return None
