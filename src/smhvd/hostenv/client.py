"""A rank's side of its host's environment: where its `train` holds it (`rank_directory`), read only from the
`train` that started it (`fetch`), merged (`merge`); without it a rank fails in one line (HostEnvUnavailable).
Low on purpose: the rank imports neither the roles nor the job's configuration."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from collections.abc import Collection, Mapping
from pathlib import Path

from smhvd.env_options import FETCH_TIMEOUT
from smhvd.errors import HostEnvUnavailable
from smhvd.hostenv.trust import ENV_FD, directory, trusted_number, trusted_pid
from smhvd.proc.waiting import NotYet, wait_until
from smhvd.wire import HOSTENV_SERVED_FROM

# The variables that differ between hosts (environment.host_env sets them): per host, never the leader's.
HOST_KEYS = frozenset(
    (
        "SM_CURRENT_HOST SM_NUM_CPUS SM_NUM_GPUS SM_RESOURCE_CONFIG SM_TRAINING_ENV SM_CURRENT_INSTANCE_TYPE "
        "SM_NETWORK_INTERFACE_NAME SM_CURRENT_INSTANCE_GROUP SM_CURRENT_INSTANCE_GROUP_HOSTS"
    ).split()
)
_MAX_BYTES = 64 * 1024 * 1024
SEALED = fcntl.F_SEAL_WRITE  # what hostenv/server.py always sets


def rank_directory(env: Mapping[str, str], port: int) -> Path:
    """The directory a rank asks: the leader's, when the rank runs on the leader's host (it exists there and
    nowhere else: its name is random), else its worker's, named after the port."""
    given = env.get(HOSTENV_SERVED_FROM, "")
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


def _parse(data: bytes) -> dict[str, str] | None:
    try:
        env = json.loads(data)
    except ValueError:
        return None
    if not isinstance(env, dict):
        return None
    for name, value in env.items():  # what a process environment can hold
        if not isinstance(name, str) or not isinstance(value, str):
            return None
        if not name or "=" in name or "\0" in name or "\0" in value:
            return None
    return env


def fetch_once(path: Path, ancestors: Collection[int] | None = None) -> dict[str, str]:
    """One look: NotYet while there is nothing to read; HostEnvUnavailable for what must not be trusted."""
    what = "this host's environment"
    pid = trusted_pid(path, ancestors, what)
    data = _read_held(pid, trusted_number(path, ENV_FD, what), what)
    env = _parse(data)
    if env is None:
        raise HostEnvUnavailable(f"this host's train ({path}) holds something other than an environment")
    return env


def _read_held(pid: int, fd: int, what: str) -> bytes:
    """What process `pid` holds in its fd `fd`: only a sealed memfd (what hostenv/server.py makes) is read."""
    try:
        held = os.open(f"/proc/{pid}/fd/{fd}", os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NotYet(f"pid {pid} holds no fd {fd}") from None
    except OSError as exc:
        raise HostEnvUnavailable(f"{what} is not trusted: pid {pid}, fd {fd}: {exc.strerror}") from None
    try:
        try:
            sealed = stat.S_ISREG(os.fstat(held).st_mode) and fcntl.fcntl(held, fcntl.F_GET_SEALS) & SEALED
        except OSError:
            sealed = False
        if not sealed:
            raise HostEnvUnavailable(f"{what} is not trusted: fd {fd} of pid {pid} is not what train holds")
        chunks, size = [], 0
        while chunk := os.read(held, 1 << 20):
            chunks.append(chunk)
            size += len(chunk)
            if size > _MAX_BYTES:
                raise HostEnvUnavailable(f"{what} is larger than {_MAX_BYTES} bytes: refused")
        return b"".join(chunks)
    finally:
        os.close(held)


def fetch(
    path: Path, timeout: float = FETCH_TIMEOUT, ancestors: Collection[int] | None = None
) -> dict[str, str]:
    """This host's environment from its `train`'s directory `path`, retried until `timeout` while there is
    none yet; HostEnvUnavailable if it cannot be had. Given `ancestors`, only one of them is trusted."""
    return wait_until(
        lambda: fetch_once(path, ancestors),
        what=f"this host's environment from its train ({path})",
        timeout=timeout,
        error=HostEnvUnavailable,
    )
