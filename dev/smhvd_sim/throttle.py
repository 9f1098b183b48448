"""One simulated host made slow on purpose, as a throttled instance or a noisy neighbour makes a real one:
every process of the host moved into a CPU cgroup of its own with a quota (`share` of one CPU), and back.

cgroup v1's `cpu` controller (`cpu.cfs_quota_us` over `cpu.cfs_period_us`) where it is mounted, else cgroup
v2's `cpu.max` where the `cpu` controller can be enabled. What the host forks later is in the group too (a
child starts in its parent's cgroup). The launcher reads the group's `cpu.stat` as a real host's
(smhvd/inflight/signals.py): `nr_throttled` of `nr_periods`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from pathlib import Path

from smhvd_sim.system import ClusterError

V1_CPU = Path("/sys/fs/cgroup/cpu")
V2 = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


def _v2_root() -> Path | None:
    controllers = V2 / "cgroup.controllers"
    with contextlib.suppress(OSError):
        if "cpu" in controllers.read_text().split():
            return V2
    return None


def _move(pids: Iterable[int], procs: Path) -> int:
    """Write each pid to a group's cgroup.procs; how many moved (a process may have ended meanwhile)."""
    moved = 0
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, OSError):
            procs.write_text(f"{pid}\n")
            moved += 1
    return moved


class Throttle:
    """A CPU quota on a set of processes (a host's), lifted by `lift` (or leaving the `with` block)."""

    def __init__(self, name: str) -> None:
        v2 = None if V1_CPU.is_dir() else _v2_root()
        if not V1_CPU.is_dir() and v2 is None:
            raise ClusterError("no CPU cgroup controller to throttle a host with (cgroup v1 cpu or v2 cpu)")
        self.v1 = v2 is None
        self.root = V1_CPU if self.v1 else V2
        self.group = self.root / f"smhvd-throttle-{name}"

    def apply(self, pids: Iterable[int], share: float) -> int:
        """Limit `pids` (and what they fork) to `share` of one CPU; how many processes were moved."""
        self.group.mkdir(exist_ok=True)
        quota = max(1000, int(PERIOD_US * share))
        if self.v1:
            (self.group / "cpu.cfs_period_us").write_text(f"{PERIOD_US}\n")
            (self.group / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        else:
            (self.group / "cpu.max").write_text(f"{quota} {PERIOD_US}\n")
        return _move(pids, self.group / "cgroup.procs")

    def lift(self) -> None:
        """Every process back in the root group, and the group removed."""
        if not self.group.is_dir():
            return
        with contextlib.suppress(OSError):
            pids = [int(p) for p in (self.group / "cgroup.procs").read_text().split()]
            _move(pids, self.root / "cgroup.procs")
        with contextlib.suppress(OSError):
            self.group.rmdir()


@contextlib.contextmanager
def throttled(name: str) -> Iterator[Throttle]:
    """A Throttle that is lifted when the block ends, whatever happened in it."""
    throttle = Throttle(name)
    try:
        yield throttle
    finally:
        throttle.lift()
