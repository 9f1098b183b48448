"""A rank's side of its host's environment (the server is roles/hostenv.py, whose docstring says why).

mpirun forwards the leader's variables to every rank; each host's `train` serves the environment it computed
for the ranks on its host. The rank wrapper (rank.py) finds where its own host's `train` serves it
(`rank_directory`, by its SMHVD_SSH_PORT on a worker), asks once (`fetch`: bounded retries, within its
SMHVD_HOSTENV_TIMEOUT; only the `train` that started it may answer) and merges (`merge`). Low on purpose:
the rank imports this, not the roles nor the job's configuration.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Collection, Mapping
from pathlib import Path

from smhvd.env_options import FETCH_TIMEOUT
from smhvd.errors import HostEnvError
from smhvd.proc.trust import ENV_SOCKET, connect_trusted, directory
from smhvd.proc.waiting import NotYet, wait_until
from smhvd.wire import HOSTENV_SERVED_FROM

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
_MAX_BYTES = 64 * 1024 * 1024


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


def fetch(
    path: Path, timeout: float = FETCH_TIMEOUT, ancestors: Collection[int] | None = None
) -> dict[str, str]:
    """This host's environment from its `train` serving in `path`, retried until `timeout` (a rank: its
    SMHVD_HOSTENV_TIMEOUT); HostEnvError if it cannot be had. A rank passes its `ancestors`: only the train
    that started it may answer."""
    return wait_until(
        lambda: fetch_once(path, min(timeout, 5.0), ancestors),
        what=f"this host's environment from its train ({path / ENV_SOCKET})",
        timeout=timeout,
        error=HostEnvError,
    )
