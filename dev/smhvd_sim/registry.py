"""The record of live clusters in /run/smhvd-cluster: which subnet slot each one holds, where its hosts mount
their files, and what to remove when it ends or its owner died without tearing down (a bridge, outer veth
ends, mountpoints it created).

A mountpoint the machine lacks (/root/.ssh, /opt/ml) is created by the first cluster that needs it, and other
clusters started meanwhile mount onto the same directory. Removing it while they run would take their files
away: the kernel detaches every mount on a directory removed in another mount namespace, so their hosts lose
/root/.ssh (sshd: "Permission denied (publickey)") or /opt/ml. A cluster that ends hands such a directory to
a live cluster that mounts onto it (or below it), which removes it in turn."""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from smhvd.proc import processes

REGISTRY = Path("/run/smhvd-cluster")


@dataclass(frozen=True)
class Record:
    """One live (or abandoned) cluster."""

    cluster_id: str
    owner_pid: int
    slot: int
    links: tuple[str, ...]
    created_dirs: tuple[str, ...]  # deepest first, for rmdir
    mountpoints: tuple[str, ...] = ()  # where its hosts mount (created by it or not)

    @property
    def path(self) -> Path:
        return REGISTRY / f"{self.cluster_id}.json"

    def save(self) -> None:
        REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.path)


def load_all() -> list[Record]:
    records = []
    for path in sorted(REGISTRY.glob("*.json")) if REGISTRY.is_dir() else []:
        try:
            raw = json.loads(path.read_text())
            records.append(
                Record(
                    cluster_id=str(raw["cluster_id"]),
                    owner_pid=int(raw["owner_pid"]),
                    slot=int(raw["slot"]),
                    links=tuple(raw["links"]),
                    created_dirs=tuple(raw["created_dirs"]),
                    mountpoints=tuple(raw.get("mountpoints", ())),  # absent from older records
                )
            )
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
    return records


def new_cluster_id() -> str:
    return secrets.token_hex(3)


def free_slot(records: list[Record]) -> int:
    used = {record.slot for record in records}
    return next(slot for slot in range(256) if slot not in used)


def remove_links(links: tuple[str, ...]) -> None:
    """Delete links that still exist (veth ends vanish with their namespace; the bridge never does)."""
    for link in links:
        if Path("/sys/class/net", link).exists():
            subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


def _holds(directory: str, mountpoint: str) -> bool:
    return Path(mountpoint).is_relative_to(directory)


def remove_created_dirs(record: Record, others: list[Record]) -> None:
    """rmdir the mountpoints this cluster created; one that another live cluster mounts onto (or below) is
    added to that cluster's record instead, to be removed when it ends."""
    live = [
        other
        for other in others
        if other.cluster_id != record.cluster_id and processes.is_alive(other.owner_pid)
    ]
    handed: dict[str, list[str]] = {}
    for path in record.created_dirs:
        user = next((o for o in live if any(_holds(path, m) for m in o.mountpoints)), None)
        if user is not None:
            handed.setdefault(user.cluster_id, []).append(path)
        elif not any(path in other.created_dirs for other in live):
            with contextlib.suppress(OSError):
                Path(path).rmdir()
    for other in live:
        if other.cluster_id in handed:
            more = tuple(p for p in handed[other.cluster_id] if p not in other.created_dirs)
            replace(other, created_dirs=other.created_dirs + more).save()


def release(record: Record) -> None:
    """Remove what the record lists as saved (directories may have been handed to it since it was made;
    it hands on what live clusters still mount), then the record."""
    records = load_all()
    saved = next((stored for stored in records if stored.cluster_id == record.cluster_id), record)
    remove_links(saved.links)
    remove_created_dirs(saved, records)
    saved.path.unlink(missing_ok=True)


def clean_abandoned() -> list[str]:
    """Release clusters whose owner process is gone; return their ids."""
    abandoned = [record for record in load_all() if not processes.is_alive(record.owner_pid)]
    for record in abandoned:
        release(record)
    return [record.cluster_id for record in abandoned]


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serialise slot allocation and stale-cluster cleanup between concurrent cluster tools."""
    REGISTRY.mkdir(mode=0o700, parents=True, exist_ok=True)
    with (REGISTRY / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
