"""Each host's own environment for the ranks that orted starts there.

mpirun starts the ranks on the leader's host itself, with the leader's environment. On every other host they
are started by orted over ssh, whose session has none of what SageMaker set in that container (the estimator's
`environment=`, AWS_ENDPOINT_URL_S3, ...): only the variables mpirun forwards by name. So a worker's `train`
serves the environment it computed for ranks on its host (its container's variables, less credentials unless
launcher_forward_aws_credentials, plus its own SM_* values) over an abstract unix socket in its network
namespace, named after the sshd port like the link. The rank wrapper asks for it once at start and merges:
the host's environment below, the leader's forwarded variables (the job's decisions) above it, and the host's
own per-host SM_* values on top.

Nothing is written to disk and nothing travels on a command line: the socket answers only processes of the
same user (SO_PEERCRED), and it is gone when the worker's `train` exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import struct
import threading
from collections.abc import Iterator, Mapping

from smhvd.environment import HOST_KEYS

FETCH_TIMEOUT = 5.0
_MAX_BYTES = 64 * 1024 * 1024


def socket_name(port: int) -> str:
    return f"\0smhvd-hostenv-{port}"


def merge(received: Mapping[str, str], served: Mapping[str, str]) -> dict[str, str]:
    """The rank's environment: host's own < what mpirun forwarded < the host's own per-host SM_* values."""
    env = {**served, **received}
    env.update({k: v for k, v in served.items() if k in HOST_KEYS})
    return env


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return int(uid)


@contextlib.contextmanager
def serving(port: int, env: Mapping[str, str]) -> Iterator[None]:
    """Answer every same-user connection with `env` as JSON while the block runs."""
    payload = json.dumps(dict(env)).encode()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(socket_name(port))  # the caller already owns the port's link socket: no other launcher here
    server.listen(64)
    stop = threading.Event()

    def answer() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the job is over
                return
            with conn:
                if _peer_uid(conn) == os.getuid():
                    with contextlib.suppress(OSError):
                        conn.sendall(payload)

    thread = threading.Thread(target=answer, name="smhvd-hostenv", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(timeout=2)


def fetch(port: int, timeout: float = FETCH_TIMEOUT) -> dict[str, str] | None:
    """This host's environment from its `train`; None where no worker serves one (leader, plain mpirun)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        try:
            conn.connect(socket_name(port))
        except (ConnectionRefusedError, FileNotFoundError):
            return None
        chunks: list[bytes] = []
        size = 0
        while chunk := conn.recv(1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_BYTES:
                return None
    try:
        env = json.loads(b"".join(chunks))
    except ValueError:
        return None
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        return None
    return env
