"""A rank's side of its host's environment (the server is roles/hostenv.py, whose docstring says why).

mpirun forwards the leader's variables to every rank; each host's `train` serves the environment it computed
for the ranks on its host. The rank wrapper (rank.py) finds where its own host's `train` serves it
(`rank_directory`), asks once (`fetch`: bounded retries, only the `train` that started it may answer) and
merges (`merge`). Low on purpose: the rank imports this, not the roles nor the job's configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path

from smhvd.errors import ConfigError, HostEnvError
from smhvd.proc.trust import ENV_SOCKET, connect_trusted, directory
from smhvd.proc.waiting import NotYet, wait_until
from smhvd.wire import HOSTENV_TIMEOUT, SERVED, SSH_PORT

# The variables that differ between hosts (environment.host_env sets them): per host, never the leader's.
HOST_KEYS = frozenset(
    {
        "SM_CURRENT_HOST",
        "SM_NUM_CPUS",
        "SM_NUM_GPUS",
        "SM_RESOURCE_CONFIG",
        "SM_TRAINING_ENV",
        "SM_NETWORK_INTERFACE_NAME",
        "SM_CURRENT_INSTANCE_TYPE",
        "SM_CURRENT_INSTANCE_GROUP",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS",
    }
)
DEFAULT_PORT = 22
FETCH_TIMEOUT = 60.0
MAX_FETCH_TIMEOUT = 86400.0
_MAX_BYTES = 64 * 1024 * 1024


def ssh_port(env: Mapping[str, str]) -> int:
    """SMHVD_SSH_PORT: every worker's sshd port, which also names `train`'s private directory there."""
    raw = env.get(SSH_PORT, str(DEFAULT_PORT))
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ConfigError("environment", SSH_PORT, "a TCP port number (1-65535)", raw)
    return int(raw)


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


def fetch_once(path: Path, timeout: float, ancestors: Collection[int] | None = None) -> dict[str, str]:
    """One attempt: NotYet while the server is not (yet) there or too busy; HostEnvError for anything that
    must not be trusted."""
    what = "this host's environment"
    with connect_trusted(path, ENV_SOCKET, timeout, ancestors, what) as conn:
        chunks: list[bytes] = []
        size = 0
        try:
            while chunk := conn.recv(1 << 20):
                chunks.append(chunk)
                size += len(chunk)
                if size > _MAX_BYTES:
                    raise HostEnvError(f"{what} is larger than {_MAX_BYTES} bytes: refused")
        except TimeoutError:
            raise NotYet("the answer did not come in time") from None
        except ConnectionResetError:
            raise NotYet("the answer was cut short") from None
    env = _parse(b"".join(chunks))
    if env is None:
        raise HostEnvError(f"this host's train ({path}) answered something other than an environment")
    return env


def fetch_timeout(env: Mapping[str, str]) -> float:
    """SMHVD_HOSTENV_TIMEOUT (seconds a rank waits for its host's environment), else FETCH_TIMEOUT; `train`
    checks it at start (ConfigError: exit 78), so that no rank falls back on another value silently."""
    raw = env.get(HOSTENV_TIMEOUT)
    if raw is None:
        return FETCH_TIMEOUT
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value <= MAX_FETCH_TIMEOUT:
        raise ConfigError(
            "environment", HOSTENV_TIMEOUT, f"seconds, a number in (0, {MAX_FETCH_TIMEOUT:g}]", raw
        )
    return value


def fetch(
    path: Path, timeout: float | None = None, ancestors: Collection[int] | None = None
) -> dict[str, str]:
    """This host's environment from its `train` serving in `path`, retried until `timeout` (default:
    SMHVD_HOSTENV_TIMEOUT, else FETCH_TIMEOUT seconds); HostEnvError if it cannot be had. A rank passes its
    `ancestors`: only the train that started it may answer."""
    if timeout is None:
        timeout = fetch_timeout(os.environ)
    return wait_until(
        lambda: fetch_once(path, min(timeout, 5.0), ancestors),
        what=f"this host's environment from its train ({path / ENV_SOCKET})",
        timeout=timeout,
        error=HostEnvError,
    )
