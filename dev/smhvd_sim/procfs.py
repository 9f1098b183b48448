"""What the simulator reads of /proc beyond what the launcher needs (smhvd.proc.processes): a process's
children, the namespaces its hosts' processes live in, and which file a process sees at a path.

A namespace's inode number is freed when the namespace ends and given to the next one made (lowest first):
the hosts of a cluster started after another's teardown get its numbers. A number names a host only while
that host is up."""

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


def file_id(path: Path) -> tuple[int, int] | None:
    """(device, inode) of `path`; None when it is gone."""
    try:
        found = path.stat()
    except OSError:
        return None
    return found.st_dev, found.st_ino


def file_seen_by(pid: int, path: str) -> tuple[int, int] | None:
    """file_id of what `pid` sees at absolute `path`, through its own mount namespace (/proc/PID/root)."""
    return file_id(Path(f"/proc/{pid}/root{path}"))
