"""Each host's own environment for the ranks that mpirun starts there.

mpirun starts the ranks on the leader's host itself, with the leader's environment. On every other host they
are started by orted over ssh, whose session has none of what SageMaker set in that container (the estimator's
`environment=`, AWS_ENDPOINT_URL_S3, ...): only the variables mpirun forwards by name. So every host's
`train` serves the environment it computed for ranks on its host (its container's variables, less credentials
unless launcher_forward_aws_credentials, plus its own SM_* values), and the rank wrapper asks for it once at
start and merges: the host's environment below, the leader's forwarded variables (the job's decisions) above
it, and the host's own per-host SM_* values on top.

Who may answer a rank: only its own host's `train`. The socket lives in a directory that `train` creates
itself, owned by its user with mode 0700, under /run for root (a directory only root may write) or /tmp
otherwise, named after the user and the job's port; `train` writes its pid there. A rank trusts the
directory only if it has exactly that owner and mode, and the answer only if the server's credentials
(SO_PEERCRED) are its own uid and the pid written there. A squatter of another user cannot create or enter the
directory; one that created it first is refused by name, by `train` and by the rank alike. The server answers
only processes of its own uid. Nothing is written but the socket and the pid, and all of it is removed when
`train` exits.

A rank started by mpirun under `train` (SERVED set) must get its host's environment: it retries within a
deadline (a loaded host may be slow to accept) and, if there is none, fails with one line. It never runs
with another host's identity.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import stat
import struct
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from smhvd.environment import HOST_KEYS
from smhvd.errors import HostEnvError
from smhvd.proc.processes import is_alive
from smhvd.proc.waiting import NotYet, wait_until
from smhvd.wire import SERVED

FETCH_TIMEOUT = 60.0
BACKLOG = 4096  # every rank of a large host may ask at the same moment (the kernel caps it at somaxconn)
_MAX_BYTES = 64 * 1024 * 1024
SOCKET = "env.sock"
PID_FILE = "train.pid"


def directory(name: str | int, uid: int | None = None) -> Path:
    """Where `train` of this user serves its host's environment: a worker under its port's name (it owns the
    port on its host), the leader under a name of its own for the job (several single-host jobs may share a
    machine), which it gives its ranks in SERVED."""
    uid = os.geteuid() if uid is None else uid
    return (Path("/run") if uid == 0 else Path("/tmp")) / f"smhvd-hostenv-{uid}-{name}"


def leader_directory() -> Path:
    return directory(f"job-{secrets.token_hex(8)}")


def rank_directory(env: Mapping[str, str], port: int) -> Path:
    """The directory a rank asks: the leader's, when the rank runs on the leader's host (it exists there and
    nowhere else: its name is random), else its worker's, named after the port."""
    given = env.get(SERVED, "")
    leaders = Path(given)
    if given and leaders.parent == directory(0).parent and leaders.name.startswith(directory("job-").name):
        with contextlib.suppress(OSError):
            if leaders.is_dir() or leaders.is_symlink():
                return leaders
    return directory(port)


def merge(received: Mapping[str, str], served: Mapping[str, str]) -> dict[str, str]:
    """The rank's environment: host's own < what mpirun forwarded < the host's own per-host SM_* values."""
    env = {**served, **received}
    env.update({k: v for k, v in served.items() if k in HOST_KEYS})
    return env


def peer_credentials(conn: socket.socket) -> tuple[int, int]:
    """(pid, uid) of the process at the other end of a unix socket, from the kernel."""
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    return int(pid), int(uid)


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


def read_pid(path: Path) -> int | None:
    try:
        text = path.read_text()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    return int(text) if text.strip().isdigit() and len(text) < 16 else None


def _claim(path: Path) -> None:
    """Create the private directory, or take over one left by a `train` that is gone."""
    uid = os.geteuid()
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    else:
        return
    problem = private_dir_problem(path, uid)
    if problem:
        raise HostEnvError(f"cannot serve this host's environment to its ranks: {problem}")
    pid = read_pid(path / PID_FILE)
    if pid is not None and pid != os.getpid() and is_alive(pid):
        raise HostEnvError(f"cannot serve this host's environment: {path} is in use by pid {pid}"[:300])
    for name in (SOCKET, PID_FILE):
        (path / name).unlink(missing_ok=True)


@contextlib.contextmanager
def serving(path: Path, env: Mapping[str, str]) -> Iterator[None]:
    """Answer this user's processes with `env` as JSON from the directory `path` while the block runs."""
    payload = json.dumps(dict(env)).encode()
    _claim(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stop = threading.Event()
    thread = None
    try:
        server.bind(str(path / SOCKET))
        server.listen(BACKLOG)
        pid_tmp = path / f"{PID_FILE}.tmp"
        pid_tmp.write_text(str(os.getpid()))
        pid_tmp.replace(path / PID_FILE)  # written whole: a rank never reads half a pid

        def answer() -> None:
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except OSError:  # closed: the job is over
                    return
                with conn:
                    if peer_credentials(conn)[1] == os.geteuid():
                        with contextlib.suppress(OSError):
                            conn.sendall(payload)

        thread = threading.Thread(target=answer, name="smhvd-hostenv", daemon=True)
        thread.start()
        yield
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        if thread is not None:
            thread.join(timeout=2)
        for name in (SOCKET, PID_FILE):
            (path / name).unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.rmdir()


def _parse(data: bytes) -> dict[str, str] | None:
    try:
        env = json.loads(data)
    except ValueError:
        return None
    if not isinstance(env, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    return env


def fetch_once(path: Path, timeout: float) -> dict[str, str]:
    """One attempt: NotYet while the server is not (yet) there or too busy; HostEnvError for anything that
    must not be trusted."""
    uid = os.geteuid()
    try:
        problem = private_dir_problem(path, uid)
    except FileNotFoundError:
        raise NotYet(f"{path} does not exist") from None
    if problem:
        raise HostEnvError(f"this host's environment is not trusted: {problem}")
    pid = read_pid(path / PID_FILE)
    if pid is None:
        raise NotYet(f"no {PID_FILE} in {path} yet")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(str(path / SOCKET))
        except (FileNotFoundError, ConnectionRefusedError, BlockingIOError, TimeoutError) as exc:
            raise NotYet(f"connect: {exc}") from None
        peer_pid, peer_uid = peer_credentials(conn)
        if peer_uid != uid or peer_pid != pid:
            raise HostEnvError(
                f"this host's environment was answered by pid {peer_pid} (uid {peer_uid}), not by its train "
                f"(pid {pid}, uid {uid}): refused"
            )
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := conn.recv(1 << 20):
                chunks.append(chunk)
                size += len(chunk)
                if size > _MAX_BYTES:
                    raise HostEnvError(f"this host's environment is larger than {_MAX_BYTES} bytes: refused")
        except TimeoutError:
            raise NotYet("the answer did not come in time") from None
    env = _parse(b"".join(chunks))
    if env is None:
        raise HostEnvError(f"this host's train (pid {pid}) answered something other than an environment")
    return env


def fetch(path: Path, timeout: float | None = None) -> dict[str, str]:
    """This host's environment from its `train` serving in `path`, retried until `timeout` (default:
    SMHVD_HOSTENV_TIMEOUT, else FETCH_TIMEOUT seconds); HostEnvError if it cannot be had."""
    if timeout is None:
        raw = os.environ.get("SMHVD_HOSTENV_TIMEOUT", "")
        timeout = float(raw) if raw.replace(".", "", 1).isdigit() else FETCH_TIMEOUT
    return wait_until(
        lambda: fetch_once(path, min(timeout, 5.0)),
        what=f"this host's environment from its train ({path / SOCKET})",
        timeout=timeout,
        error=HostEnvError,
    )
