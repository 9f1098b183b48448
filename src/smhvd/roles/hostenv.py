"""Each host's own environment for the ranks that mpirun starts there.

mpirun starts the ranks on the leader's host itself, with the leader's environment. On every other host they
are started by orted over ssh, whose session has none of what SageMaker set in that container (the estimator's
`environment=`, AWS_ENDPOINT_URL_S3, ...): only the variables mpirun forwards by name. So every host's
`train` serves the environment it computed for ranks on its host (its container's variables, less credentials
unless launcher_forward_aws_credentials, plus its own SM_* values), and the rank wrapper asks for it once at
start and merges: the host's environment below, the leader's forwarded variables (the job's decisions) above
it, and the host's own per-host SM_* values on top.

Who may answer a rank: only its own host's `train`, from its private directory (proc/trust.py: the
directory's owner and mode, the pid written there, the kernel's word on the other end, the rank's ancestors).
The server answers only processes of its own uid, each without waiting for another (a client that does not
read is dropped after SEND_TIMEOUT). Nothing is written but the sockets and the pid, and all of it is removed
when `train` exits. A worker's link socket (the leader's relay connects to it: link.py, roles/worker.py)
lives in the same directory and is trusted the same way.

A rank started by mpirun under `train` (wire.HOSTENV_SERVED_FROM set) must get its host's environment: it
retries within a deadline (a loaded host may be slow to accept) and, if there is none, fails with one line.
It never runs with another host's identity. That side, the client, is hostenv_client.py: low, so that a rank
imports neither this module nor the job's configuration.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from smhvd.errors import HostEnvError
from smhvd.proc.loop import Loop, Scope, process_loop
from smhvd.proc.timers import Timer
from smhvd.proc.trust import (
    ENV_SOCKET,
    LINK_SOCKET,
    PID_FILE,
    directory,
    is_train,
    peer_credentials,
    private_dir_problem,
    read_pid,
)

BACKLOG = 4096  # every rank of a large host may ask at the same moment (the kernel caps it at somaxconn)
SEND_TIMEOUT = 10.0  # a client that takes nothing of its answer for this long is dropped
MAX_PENDING = 1024  # answers being sent at once; more connections wait in the listen queue
_OWN_NAMES = (ENV_SOCKET, LINK_SOCKET, PID_FILE, PID_FILE + ".tmp")  # all `train` ever writes there


def leader_directory() -> Path:
    return directory(f"job-{secrets.token_hex(8)}")


UNCLAIMED_AGE = 60.0  # a leader's directory with no pid in it this long after it was made is nobody's


def reclaim_leaders_leftovers(uid: int | None = None, now: float | None = None) -> list[Path]:
    """Remove the job directories of this user's leaders whose `train` is gone (killed by SIGKILL, it could
    not remove its own): only what this module writes there, then the directory if that left it empty.
    Best effort: what cannot be read or removed stays. Returns the directories removed."""
    uid = os.geteuid() if uid is None else uid
    now = time.time() if now is None else now
    pattern = directory("job-", uid)
    removed = []
    for path in sorted(pattern.parent.glob(pattern.name + "*")):
        with contextlib.suppress(OSError, ValueError):
            if private_dir_problem(path, uid):
                continue
            pid = read_pid(path / PID_FILE)
            if pid is None and now - os.lstat(path).st_mtime < UNCLAIMED_AGE:
                continue  # a train that has just made it and not yet written its pid
            if pid is not None and is_train(pid, os.lstat(path / PID_FILE).st_mtime):
                continue
            _remove_own(path)
            path.rmdir()
            removed.append(path)
    return removed


def _claim(path: Path) -> None:
    """Create the private directory, or take over one left by a `train` that is gone."""
    uid = os.geteuid()
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as exc:  # a read-only /run, no such parent, no permission
        raise HostEnvError(
            f"cannot serve this host's environment: cannot create {path}: {exc.strerror}"
        ) from None
    else:
        return
    problem = private_dir_problem(path, uid)
    if problem:
        raise HostEnvError(f"cannot serve this host's environment to its ranks: {problem}")
    try:
        pid = read_pid(path / PID_FILE)
        written = os.lstat(path / PID_FILE).st_mtime if pid is not None else 0.0
    except (ValueError, OSError):
        pid = None  # not written by a train: nobody's
    if pid is not None and pid != os.getpid() and is_train(pid, written):
        raise HostEnvError(f"cannot serve this host's environment: {path} is in use by pid {pid}"[:300])
    _remove_own(path)


def _remove_own(path: Path) -> None:
    for name in _OWN_NAMES:
        with contextlib.suppress(IsADirectoryError):  # not ours: the directory is then left in place
            (path / name).unlink(missing_ok=True)


@contextlib.contextmanager
def serving(path: Path, env: Mapping[str, str], loop: Loop | None = None) -> Iterator[None]:
    """Answer this user's processes with `env` as JSON from the directory `path` while the block runs,
    whenever `loop` (this process's by default) runs: the block's waits run it (the supervisor's, the
    pre-flight's, the worker's), and the ranks ask only while one of them does."""
    payload = json.dumps(dict(env)).encode()
    _claim(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:  # an entry of another kind in the way (a directory named env.sock), ...
            server.bind(str(path / ENV_SOCKET))
            server.listen(BACKLOG)
            server.setblocking(False)
        except OSError as exc:
            raise HostEnvError(
                f"cannot serve this host's environment: {path / ENV_SOCKET}: {exc.strerror}"
            ) from None
        pid_tmp = path / f"{PID_FILE}.tmp"
        try:
            pid_tmp.write_text(str(os.getpid()))
            pid_tmp.replace(path / PID_FILE)  # written whole: a rank never reads half a pid
        except OSError as exc:
            where = exc.filename2 or exc.filename or path
            raise HostEnvError(f"cannot serve this host's environment: {where}: {exc.strerror}") from None
        with (loop or process_loop()).scope() as scope:
            answers = _answer_all(scope, server, payload)
            try:
                yield
            finally:
                answers.drop_all()
    finally:
        server.close()
        _remove_own(path)
        with contextlib.suppress(OSError):
            path.rmdir()


def _answer_all(scope: Scope, server: socket.socket, payload: bytes) -> _Answers:
    """Send `payload` to every connection of this user, none waiting for another: each answer goes out in
    non-blocking writes, and a client that takes nothing for SEND_TIMEOUT is dropped. At most MAX_PENDING
    answers at once: more connections wait in the listen queue."""
    answers = _Answers(scope, payload)

    def accept() -> None:
        answers.accept(server)
        if len(answers.pending) >= MAX_PENDING:
            scope.forget(server)

    def changed() -> None:  # an answer ended: below MAX_PENDING again, accept again
        if len(answers.pending) == MAX_PENDING - 1:
            scope.reader(server, accept)

    answers.on_drop = changed
    scope.reader(server, accept)
    return answers


class _Answers:
    """The answers being sent: what is left of each, and until when its client may take nothing (the `late`
    timer is set for the earliest of these deadlines)."""

    def __init__(self, loop: Scope, payload: bytes) -> None:
        self.loop = loop
        self.late = Timer("late answers")
        self.payload = payload
        self.pending: dict[socket.socket, tuple[memoryview, float]] = {}
        self.on_drop: Callable[[], object] = lambda: None

    def accept(self, server: socket.socket) -> None:
        try:
            conn, _ = server.accept()
        except OSError:  # BlockingIOError: taken already; EMFILE: the next round tries again
            return
        if peer_credentials(conn)[1] != os.geteuid():
            conn.close()
            return
        conn.setblocking(False)
        self.pending[conn] = (memoryview(self.payload), time.monotonic() + SEND_TIMEOUT)
        self.loop.writer(conn, functools.partial(self.send, conn))
        self._arm()

    def send(self, conn: socket.socket) -> None:
        view, _ = self.pending[conn]
        try:
            sent = conn.send(view)
        except BlockingIOError:
            return
        except OSError:  # the client hung up
            sent = len(view)
        if sent == len(view):
            self.drop(conn)
        else:
            self.pending[conn] = (view[sent:], time.monotonic() + SEND_TIMEOUT)

    def drop(self, conn: socket.socket) -> None:
        self.loop.forget(conn)
        del self.pending[conn]
        conn.close()
        self.on_drop()

    def _arm(self) -> None:
        """Set the `late` timer, if it is not set, for the earliest deadline. Deadlines only move later (each
        is now + SEND_TIMEOUT when set), so the timer never fires after a client's; when it fires,
        _drop_late drops who is late and sets it again."""
        if self.pending and not self.loop.timers.pending(self.late):
            self.loop.timers.at(self.late, min(d for _, d in self.pending.values()), self._drop_late)

    def _drop_late(self) -> None:
        now = time.monotonic()
        for conn, (_, deadline) in list(self.pending.items()):
            if deadline <= now:
                self.drop(conn)
        self._arm()

    def drop_all(self) -> None:
        for conn in list(self.pending):
            self.drop(conn)
