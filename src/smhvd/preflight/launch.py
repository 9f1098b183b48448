"""What the leader can see of an mpirun's launch: whether mpirun started this host's process (the pre-flight's
probe, the job's rank), and which hosts' Open MPI daemons (orted) have connected back to it.

mpirun starts no process anywhere until the daemon on every host has reported to it, over a TCP connection
from that daemon to mpirun (a flat launch: `plm_rsh_no_tree_spawn`). So when no probe speaks and this host's
probe never ran, the launch is waiting on daemons, and a host with no connection to mpirun is where it waits
(each daemon keeps that connection while the job runs, whatever Open MPI's routing tree: measured on 4
simulated hosts with `routed_radix 1`). That is the evidence that names that host and not the leader
(runner._unfinished), and the sign of a launch that stalled, which the check tries once more (check.py). The
job's own mpirun is watched the same way (JobLaunch): a launch still waiting on daemons after LAUNCH_LIMIT is
a warning naming their hosts, where it would otherwise be a silent hang.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd.proc.processes import cmdline, descendants, is_rank_wrapper, runs_module

log = logging.getLogger("smhvd")

PROBE_MODULE = "smhvd.preflight.probe"
LAUNCH_SHARE = 1 / 3  # no probe heard this far into the bound (5 to 20 s): the launch stalled
LAUNCH_LIMIT = 20.0  # seconds; a healthy launch of 32 simulated hosts on 2 cores has its first word in ~3 s
LAUNCH_FLOOR = 5.0  # a short bound (the option) does not end a launch that is merely slow
_ESTABLISHED = "01"


@dataclass(frozen=True)
class Launch:
    """mpirun's launch as seen from the leader after `seconds` with no word from any probe."""

    seconds: float
    probe_ran: bool  # mpirun had started this host's probe: the launch was done, the probes silent
    reached: frozenset[str]  # hosts whose daemon had connected back to mpirun
    ended_it: bool = False  # this ended the attempt (before the bound): the check runs once more

    def waiting_on(self, hosts: Sequence[str]) -> list[str]:
        """The hosts whose daemon mpirun still waited for (the leader's is mpirun itself). Pure."""
        return [h for h in hosts[1:] if h not in self.reached]


def launch_limit(timeout: float) -> float:
    """When no word from any probe means a stalled launch, for the check's bound `timeout` (a limit past the
    bound never ends an attempt). Pure."""
    return min(LAUNCH_LIMIT, max(LAUNCH_FLOOR, timeout * LAUNCH_SHARE))


def stall_reasons(launch: Launch, hosts: Sequence[str]) -> dict[str, str]:
    """Why each host is named when mpirun started no probe: the hosts whose daemon never connected back, or,
    with every daemon connected, the leader (where mpirun runs). Pure."""
    waiting = launch.waiting_on(hosts)
    if waiting:
        why = (
            f"its Open MPI daemon (orted) did not connect back to mpirun within {launch.seconds:.1f}s, so "
            "mpirun started no probe on any host"
        )
        return dict.fromkeys(waiting, why)
    return {
        hosts[0]: f"mpirun started no probe within {launch.seconds:.1f}s, though every host's daemon reported"
    }


def stall_note(launch: Launch, hosts: Sequence[str]) -> str:
    """The first attempt's end, as the check's note says it. Pure."""
    waiting = launch.waiting_on(hosts)
    on = f"no daemon connection from {', '.join(waiting)}" if waiting else "every daemon connected"
    return f"mpirun started no probe within {launch.seconds:.1f}s ({on})"


def inspect(mpirun: int, hosts: Sequence[str], seconds: float, ended_it: bool = False) -> Launch:
    """The launch of the pre-flight's mpirun (pid `mpirun`) as /proc shows it now."""
    probe_ran = any(runs_module(pid, PROBE_MODULE) for pid in descendants(mpirun))
    peers = tcp_peers(mpirun)
    reached = frozenset(h for h in hosts[1:] if addresses(h) & peers)
    return Launch(seconds, probe_ran, reached, ended_it)


class JobLaunch:
    """The job's mpirun, looked at from the leader's heartbeat until its launch is seen done (a rank of it
    runs here, or every daemon has connected back): past LAUNCH_LIMIT with daemons still not connected, one
    warning names their hosts. It ends nothing: a launch that is slow, not stuck, still runs."""

    def __init__(self, hosts: Sequence[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.hosts, self.clock, self.started = tuple(hosts), clock, clock()
        self.done = len(self.hosts) < 2

    def check(self) -> None:
        seconds = self.clock() - self.started
        if self.done or seconds < LAUNCH_LIMIT:
            return
        self.done = True  # one look past the limit: a warning at most once
        mine = descendants()
        mpirun = next((p for p in mine if Path((cmdline(p) or [""])[0]).name == "mpirun"), None)
        if mpirun is None or any(map(is_rank_wrapper, mine)):
            return
        waiting = inspect(mpirun, self.hosts, seconds).waiting_on(self.hosts)
        if waiting:
            log.warning(
                "mpirun has started no rank after %.0fs: it waits for the Open MPI daemon (orted) on %s, "
                "which has not connected back to it (ssh to that host, or orted there, is stuck)",
                seconds,
                ", ".join(waiting),
            )


def addresses(host: str) -> set[str]:
    """The host's addresses (as resolved for ssh and mpirun), or none when it does not resolve now."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return set()
    return {_plain(str(info[4][0])) for info in infos}


def tcp_peers(pid: int) -> set[str]:
    """The remote addresses of the process's established TCP connections (IPv4 and IPv6)."""
    inodes = socket_inodes(pid)
    found: set[str] = set()
    for table in ("tcp", "tcp6"):
        try:
            text = Path(f"/proc/{pid}/net/{table}").read_text()
        except OSError:
            continue
        found |= established_peers(text.splitlines()[1:], inodes)
    return found


def socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return set()
    for fd in fds:
        try:
            target = str(fd.readlink())
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def established_peers(rows: Iterable[str], inodes: set[int]) -> set[str]:
    """Remote addresses of the rows of /proc/PID/net/tcp or tcp6 (header left out) that are established
    connections on one of `inodes`. Pure."""
    found = set()
    for row in rows:
        fields = row.split()
        if len(fields) < 10 or fields[3] != _ESTABLISHED or not fields[9].isdigit():
            continue
        if int(fields[9]) in inodes:
            found.add(_plain(str(_address(fields[2].split(":")[0]))))
    return found


def _address(hexed: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The kernel prints an address as 32-bit words, each in this machine's byte order."""
    raw = bytes.fromhex(hexed)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def _plain(address: str) -> str:
    """An IPv4 address mapped into IPv6 (::ffff:a.b.c.d) as IPv4; any other as it is. Pure."""
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip)
