"""The record of live clusters in /run/smhvd-cluster: which subnet slot each one holds, and what to remove
when its owner died without tearing down (a bridge, outer veth ends, mountpoints it created)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import secrets
import subprocess
from collections.abc import Iterator
from dataclasses import asdict, dataclass
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
    created_dirs: tuple[str, ...]

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


def remove_created_dirs(record: Record, others: list[Record]) -> None:
    """rmdir the mountpoints this cluster created, unless another live cluster also relies on them."""
    others = [other for other in others if other.cluster_id != record.cluster_id]
    in_use = {path for other in others for path in other.created_dirs}
    for path in record.created_dirs:
        if path not in in_use:
            with contextlib.suppress(OSError):
                Path(path).rmdir()


def release(record: Record) -> None:
    """Remove what the record lists, then the record."""
    remove_links(record.links)
    remove_created_dirs(record, load_all())
    record.path.unlink(missing_ok=True)


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
