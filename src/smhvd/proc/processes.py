"""Process-tree utilities: child subreaper, descendants from /proc, this host's ranks, signalling a tree."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

KILL_ROUNDS = 50  # kill_descendants' rounds at most: each takes what was forked or re-parented since the last
DRAIN_LIMIT = 1 << 20  # after a program exited: at most this much of what is already in its output pipe
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_SET_PTRACER = 0x59616D61  # Yama
_PR_SET_PTRACER_ANY = ctypes.c_ulong(-1).value
_libc = ctypes.CDLL(None, use_errno=True)


def _prctl(option: int, value: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def become_subreaper() -> None:
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """For preexec_fn: the child gets `sig` when its parent dies (no orphans left running)."""
    _prctl(_PR_SET_PDEATHSIG, int(sig))


def rank_program_preexec() -> None:
    """For a rank's program: die with the rank wrapper, and let a stack dumper that is not its ancestor
    (py-spy, started by the launcher) read it where Yama restricts ptrace to ancestors."""
    die_with_parent()
    with contextlib.suppress(OSError):  # no Yama: nothing to allow
        _prctl(_PR_SET_PTRACER, _PR_SET_PTRACER_ANY)


def read_process_table(proc: Path = Path("/proc")) -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) for every visible process."""
    table: dict[int, tuple[int, str]] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit() and (fields := _stat_fields(entry / "stat")):
            table[int(entry.name)] = (int(fields[1]), fields[0])
    return table


def _stat_fields(stat_file: Path) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, ppid, ...); empty once it is gone."""
    try:
        stat = stat_file.read_text()
    except OSError:
        return []
    # The command name is in parentheses and may contain spaces: split after the last ')'.
    return stat[stat.rfind(")") + 2 :].split()


def descendants_of(root: int, table: Mapping[int, tuple[int, str]]) -> list[int]:
    """All descendants of `root` (children before grandchildren)."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, frontier = [], [root]
    while frontier:
        frontier = [child for pid in frontier for child in sorted(children.get(pid, ()))]
        found += frontier
    return found


def descendants(root: int | None = None) -> list[int]:
    return descendants_of(os.getpid() if root is None else root, read_process_table())


def own_trees(table: Mapping[int, tuple[int, str]]) -> set[int]:
    """This process's children in its own session and everything below them, in `table` (the same look at
    /proc the caller judges by: what is forked between two looks would be in one and not the other): what it
    started itself (a worker's sshd, the leader's ssh sessions). An orphan re-parented to it (a daemon a step
    left) comes from another session: a step runs in a session of its own."""
    me, mine = os.getpid(), os.getsid(0)
    own = set()
    for pid, (ppid, _) in table.items():
        if ppid == me and (fields := _stat_fields(Path(f"/proc/{pid}/stat"))) and int(fields[3]) == mine:
            own |= {pid, *descendants_of(pid, table)}
    return own


def not_own_since(before: set[int]) -> list[int]:
    """Descendants not in `before`, less this process's own trees (the links, a worker's sshd and what it
    forks meanwhile), both from one look at /proc: what forks between two looks would be in one only."""
    table = read_process_table()
    own = own_trees(table)
    return [pid for pid in descendants_of(os.getpid(), table) if pid not in before and pid not in own]


RANK_MODULE = "smhvd.rank"  # the rank wrapper: `python -P -m smhvd.rank ...`


def runs_module(pid: int, module: str) -> bool:
    """The process is `python [-P|-I ...] -m module ...`."""
    return module in cmdline(pid)[1:4]


def is_rank_wrapper(pid: int) -> bool:
    return runs_module(pid, RANK_MODULE)


def local_ranks() -> list[int]:
    """Rank wrappers started on this host by this launcher (directly, by mpirun or by orted)."""
    return [pid for pid in descendants() if is_rank_wrapper(pid)]


def terminate_local_ranks() -> int:
    """SIGTERM to this host's ranks (the leader's and every worker's one way to stop them); how many."""
    ranks = local_ranks()
    signal_pids(ranks, signal.SIGTERM)
    return len(ranks)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def ancestors(pid: int | None = None) -> frozenset[int]:
    """The processes above `pid` (default: this one), its parent up to the first process of its pid
    namespace. A launcher is a child subreaper: what it started stays below it even when a process in between
    daemonizes."""
    found: set[int] = set()
    current = os.getpid() if pid is None else pid
    while (fields := _stat_fields(Path(f"/proc/{current}/stat"))) and (parent := int(fields[1])) > 0:
        if parent in found:
            break
        found.add(parent)
        current = parent
    return frozenset(found)


def process_start_time(pid: int, proc: Path = Path("/proc")) -> float | None:
    """When `pid` started (time.time(), to the second); None when it is gone or cannot be read."""
    fields = _stat_fields(proc / str(pid) / "stat")
    try:
        boot = next(
            float(line.split()[1])
            for line in (proc / "stat").read_text().splitlines()
            if line.startswith("btime ")
        )
        return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return None


def state(pid: int) -> str | None:
    """`pid`'s state letter in /proc/PID/stat (R, S, T stopped, Z zombie...); None once it is gone."""
    fields = _stat_fields(Path(f"/proc/{pid}/stat"))
    return fields[0] if fields else None


def is_alive(pid: int) -> bool:
    return state(pid) not in (None, "Z")


def reap_orphans(keep: Iterable[int]) -> list[int]:
    """Reap zombie children that are not ours to wait for (re-parented orphans). Returns the reaped pids."""
    keep_set = set(keep)
    me = os.getpid()
    reaped = []
    for pid, (ppid, state) in read_process_table().items():
        if ppid == me and state == "Z" and pid not in keep_set:
            try:
                os.waitpid(pid, os.WNOHANG)
                reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped


def signal_pids(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def kill_descendants() -> None:
    """SIGKILL every descendant, round after round (what a dying process forked after a round's look, and is
    then re-parented here, the subreaper), its children reaped: what is left when a role ends must not
    outlive it."""
    me = os.getpid()
    for _ in range(KILL_ROUNDS):
        table = read_process_table()
        alive = [pid for pid in descendants_of(me, table) if table[pid][1] != "Z"]
        if not alive:
            break
        signal_pids(reversed(alive), signal.SIGKILL)
        for pid in alive:  # the kernel's word that each child died (its children re-parented), not a sleep
            if table[pid][0] == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
    reap_orphans(())


def write_all(fd: int, data: bytes) -> None:
    """All of `data` to `fd` (a blocking write may take it in parts)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def drain_pipe(fd: int) -> Iterator[bytes]:
    """What is already in the pipe `fd` once its writer exited, bounded: a process the writer left behind may
    hold the pipe open and keep writing."""
    os.set_blocking(fd, False)
    drained = 0
    with contextlib.suppress(BlockingIOError):
        while drained < DRAIN_LIMIT and (chunk := os.read(fd, 65536)):
            drained += len(chunk)
            yield chunk
