"""What the simulator reads of /proc beyond what the launcher needs (smhvd.proc.processes): a process's
children and the namespaces its hosts' processes live in."""

from __future__ import annotations

from pathlib import Path

from smhvd.proc.processes import read_process_table


def children_of(pid: int) -> list[int]:
    """Direct children of `pid` (a kernel may lack /proc/PID/task/TID/children, so the table is scanned)."""
    return sorted(child for child, (ppid, _) in read_process_table().items() if ppid == pid)


def namespace_id(pid: int, kind: str) -> int | None:
    """The inode naming the `kind` namespace ("net", "pid", ...) of `pid`; None when it is gone."""
    try:
        return Path(f"/proc/{pid}/ns/{kind}").stat().st_ino
    except OSError:
        return None


def pids_in_namespace(kind: str, ns_id: int) -> list[int]:
    """Processes whose `kind` namespace is `ns_id`."""
    return sorted(pid for pid in read_process_table() if namespace_id(pid, kind) == ns_id)
