"""Reading the process table from /proc: parents, children, and the processes inside a namespace."""

from __future__ import annotations

from pathlib import Path

PROC = Path("/proc")


def all_pids() -> list[int]:
    """Every process id visible in /proc."""
    return [int(entry.name) for entry in PROC.iterdir() if entry.name.isdigit()]


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid``, or None when the process is gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    # The command name in parentheses may contain spaces: fields after the last ')' are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[1])


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (this kernel may lack /proc/PID/task/TID/children, so scan)."""
    return sorted(child for child in all_pids() if parent_of(child) == pid)


def namespace_id(pid: int, kind: str) -> int | None:
    """The inode identifying the ``kind`` namespace ("net", "pid", ...) of ``pid``; None when gone."""
    try:
        return (PROC / str(pid) / "ns" / kind).stat().st_ino
    except OSError:
        return None


def pids_in_namespace(kind: str, ns_id: int) -> list[int]:
    """Processes whose ``kind`` namespace is ``ns_id``."""
    return sorted(pid for pid in all_pids() if namespace_id(pid, kind) == ns_id)


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


def command_line(pid: int) -> list[str]:
    """The argv of ``pid`` (empty when gone or a kernel thread)."""
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]
