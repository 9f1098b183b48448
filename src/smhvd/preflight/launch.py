"""What the leader can see of an mpirun's launch: whether mpirun started this host's process (the pre-flight's
probe, the job's rank), and which hosts' Open MPI daemons (orted) have connected back to it.

mpirun starts no process anywhere until the daemon on every host has reported to it, over a TCP connection
from that daemon to mpirun (a flat launch: `plm_rsh_no_tree_spawn`). So when no probe speaks and this host's
probe never ran, the launch is waiting on daemons, and a host with no connection to mpirun is where it waits
(each daemon keeps that connection while the job runs, whatever Open MPI's routing tree: measured on 4
simulated hosts with `routed_radix 1`). A connection is tied to a host by the addresses of the ssh
connections this launcher holds to that host (tie), never by resolving its name; where that cannot tell
(a daemon connecting from a second address, two names behind one address), the hosts left are not said to
be waiting. That is the evidence that names a host and never the leader (blame.py), and the sign of a
launch that stalled, which the check tries once more (check.py). The job's own mpirun is watched the same
way (JobLaunch): a launch still waiting on daemons after LAUNCH_LIMIT is a warning naming their hosts,
where it would otherwise be a silent hang.
"""

from __future__ import annotations

import ipaddress
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
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
    unknown: frozenset[str] = frozenset()  # hosts whose connection (or lack of one) could not be told

    def waiting_on(self, hosts: Sequence[str]) -> list[str]:
        """The hosts whose daemon mpirun surely still waited for (the leader's is mpirun itself). Pure."""
        return [h for h in hosts[1:] if h not in self.reached and h not in self.unknown]


def launch_limit(timeout: float) -> float:
    """When no word from any probe means a stalled launch, for the check's bound `timeout` (a limit past the
    bound never ends an attempt). Pure."""
    return min(LAUNCH_LIMIT, max(LAUNCH_FLOOR, timeout * LAUNCH_SHARE))


def inspect(mpirun: int, hosts: Sequence[str], seconds: float, ended_it: bool = False) -> Launch:
    """The launch of the pre-flight's mpirun (pid `mpirun`) as /proc shows it now: no name is resolved (a
    resolver may block the loop for seconds); each host's addresses are those of the ssh connections this
    launcher holds to it (its links, mpirun's own ssh)."""
    probe_ran = any(runs_module(pid, PROBE_MODULE) for pid in descendants(mpirun))
    reached, unknown = tie(tcp_peers(mpirun), ssh_addresses(hosts[1:], descendants()), hosts[1:])
    return Launch(seconds, probe_ran, reached, ended_it, unknown)


def tie(
    peers: Sequence[str], known: Mapping[str, Iterable[str]], workers: Sequence[str]
) -> tuple[frozenset[str], frozenset[str]]:
    """(the hosts whose daemon connected back, the hosts that cannot be told) from mpirun's connections'
    remote addresses (one a connection) and each worker's known addresses. A connection from an address
    known for one host alone is that host's; when some connection is from an address known for no host or
    for several (a second interface, another address family, two names behind one address), the hosts left
    cannot be told from one another: none of them is said to be waiting. Pure."""
    owners: dict[str, set[str]] = {}
    for host in workers:
        for address in known.get(host, ()):
            owners.setdefault(address, set()).add(host)
    reached: set[str] = set()
    untold = 0
    for address in peers:
        who = owners.get(address, set())
        if len(who) == 1:
            reached |= who
        else:
            untold += 1
    left = frozenset(h for h in workers if h not in reached)
    return frozenset(reached), left if untold else frozenset()


def ssh_addresses(hosts: Sequence[str], pids: Iterable[int]) -> dict[str, set[str]]:
    """Each host's addresses as this launcher's own ssh processes reach it (`ssh ... HOST ...`: the link
    to a worker, which holds the job's shared connection, or mpirun's ssh): their established peers."""
    names = set(hosts)
    found: dict[str, set[str]] = {}
    for pid in pids:
        argv = cmdline(pid) or []
        if not argv or Path(argv[0]).name != "ssh":
            continue
        for host in {a.rpartition("@")[2] for a in argv[1:]} & names:
            found.setdefault(host, set()).update(tcp_peers(pid))
    return found


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
        seen = inspect(mpirun, self.hosts, seconds)
        waiting = seen.waiting_on(self.hosts)
        if seen.unknown and not waiting:
            log.warning(
                "mpirun has started no rank after %.0fs; which of %s it waits for cannot be told from its "
                "connections (a second address or an alias)",
                seconds,
                ", ".join(sorted(seen.unknown)),
            )
        if waiting:
            log.warning(
                "mpirun has started no rank after %.0fs: it waits for the Open MPI daemon (orted) on %s, "
                "which has not connected back to it (ssh to that host, or orted there, is stuck)",
                seconds,
                ", ".join(waiting),
            )


def tcp_peers(pid: int) -> list[str]:
    """The remote addresses of the process's established TCP connections (IPv4 and IPv6), one a connection."""
    inodes = socket_inodes(pid)
    found: list[str] = []
    for table in ("tcp", "tcp6"):
        try:
            text = Path(f"/proc/{pid}/net/{table}").read_text()
        except OSError:
            continue
        found += established_peers(text.splitlines()[1:], inodes)
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


def established_peers(rows: Iterable[str], inodes: set[int]) -> list[str]:
    """Remote addresses of the rows of /proc/PID/net/tcp or tcp6 (header left out) that are established
    connections on one of `inodes`, one a connection. Pure."""
    found = []
    for row in rows:
        fields = row.split()
        if len(fields) < 10 or fields[3] != _ESTABLISHED or not fields[9].isdigit():
            continue
        if int(fields[9]) in inodes:
            found.append(_plain(str(_address(fields[2].split(":")[0]))))
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
