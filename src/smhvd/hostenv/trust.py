"""Whom a process may trust on its own host: `train`'s private directory (exactly its user, mode 0700), the
pid written there (for a rank or the relay: one of its own ancestors), what that process holds, and the
kernel's word (SO_PEERCRED) on the other end of the link's socket. Another user cannot enter the directory;
one that made it first is refused; a process of the same user that is not the client's `train`, by pid.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Collection
from pathlib import Path

from smhvd.errors import HostEnvUnavailable
from smhvd.proc.processes import cmdline, is_alive, process_start_time
from smhvd.proc.waiting import NotYet

# What the directory holds: `train`'s pid, its environment fd's number, and on a worker the link's socket.
PID_FILE = "train.pid"
ENV_FD = "env.fd"  # hostenv/server.py
LINK_SOCKET = "link.sock"  # the leader's relay connects here (link/listen.py, link/relay.py)


def directory(name: str | int, uid: int | None = None) -> Path:
    """`train`'s private directory for this user: a worker's under its port's name (it owns the port on its
    host), the leader's under a name of its own for the job (server.leader_directory)."""
    uid = os.geteuid() if uid is None else uid
    return (Path("/run") if uid == 0 else Path("/tmp")) / f"smhvd-hostenv-{uid}-{name}"


def private_dir_problem(path: Path, uid: int) -> str | None:
    """Why `path` is not a directory only `uid` may use (owner uid, mode 0700, no symlink); None if it is."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != uid:
        return f"{path} belongs to uid {st.st_uid}, not {uid}"
    if st.st_mode & 0o077:
        return f"{path} has mode {stat.S_IMODE(st.st_mode):o}, not 700"
    return None


def read_number(path: Path) -> int | None:
    """The number `train` wrote to `path` (its pid, an fd); None when there is none yet. ValueError when the
    file is there but holds no number, or is not a regular file (a FIFO would block its reader forever)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP: a symlink
        raise ValueError(f"{path} cannot be read: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{path} is not a regular file")
        text = os.read(fd, 32).strip()
    finally:
        os.close(fd)
    if not (text.isdigit() and 0 < len(text) <= 10 and int(text) > 0):
        raise ValueError(f"{path} holds no number")
    return int(text)


def is_train(pid: int, since: float) -> bool:
    """Whether `pid` is a live `train` that was running at `since` (time.time(), when its pid was written):
    a pid of a gone train reused by another process, or by a process started later, is not."""
    if not is_alive(pid):
        return False
    words = cmdline(pid)[:3]
    if not any(w == "train" or w.endswith("/train") or w.startswith("smhvd") for w in words):
        return False
    started = process_start_time(pid)
    return started is None or started <= since + 1.0  # the boot time is known to the second only


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket, from the kernel."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return int(pid), int(uid)


def trusted_pid(path: Path, ancestors: Collection[int] | None, what: str) -> int:
    """The pid of the `train` whose private directory `path` is, when the directory is this user's alone
    (and, given `ancestors`, the pid is one of them). NotYet while there is no directory or pid yet;
    HostEnvUnavailable for anything that must not be trusted. `what` names the thing asked for in messages."""
    try:
        problem = private_dir_problem(path, os.geteuid())
    except FileNotFoundError:
        raise NotYet(f"{path} does not exist") from None
    if problem:
        raise HostEnvUnavailable(f"{what} is not trusted: {problem}")
    pid = trusted_number(path, PID_FILE, what)
    if ancestors is not None and pid not in ancestors:
        raise HostEnvUnavailable(f"{what} is served by pid {pid}, which did not start this process: refused")
    return pid


def trusted_number(path: Path, name: str, what: str) -> int:
    """The number `train` wrote in `path / name`; NotYet while there is none, else HostEnvUnavailable."""
    try:
        number = read_number(path / name)
    except ValueError as exc:
        raise HostEnvUnavailable(f"{what} is not trusted: {exc}") from None
    if number is None:
        raise NotYet(f"no {name} in {path} yet")
    return number


def connect_trusted(
    path: Path, name: str, timeout: float, ancestors: Collection[int] | None, what: str
) -> socket.socket:
    """A connection to the socket `name` in `train`'s private directory `path`, made only when `trusted_pid`
    trusts it and the kernel says the other end is that pid, of this user. NotYet while the server is not
    (yet) there or too busy; HostEnvUnavailable for anything that must not be trusted."""
    pid = trusted_pid(path, ancestors, what)
    conn = _connect(path / name, timeout, what)
    peer_pid, peer_uid = peer_credentials(conn)
    if peer_uid != os.geteuid() or peer_pid != pid:
        conn.close()
        raise HostEnvUnavailable(
            f"{what} was answered by pid {peer_pid} (uid {peer_uid}), not by its train "
            f"(pid {pid}, uid {os.geteuid()}): refused"
        )
    return conn


def _connect(path: Path, timeout: float, what: str) -> socket.socket:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(timeout)
    try:
        conn.connect(str(path))
    except (FileNotFoundError, ConnectionRefusedError, BlockingIOError, TimeoutError) as exc:
        conn.close()
        raise NotYet(f"connect: {exc}") from None
    except OSError as exc:  # not a socket at all, ...
        conn.close()
        raise HostEnvUnavailable(f"{what} is not trusted: {path}: {exc.strerror}") from None
    return conn
