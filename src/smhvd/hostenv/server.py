"""Each host's own environment for the ranks mpirun starts there, `train`'s side: orted starts a worker's
ranks over ssh with only what mpirun forwards, so every `train` holds the environment it computed for its
host's ranks (its container's variables, less credentials unless launcher_forward_aws_credentials, and its own
SM_* values). `claimed` makes `train`'s private directory with its pid; `serving` puts the environment in a
sealed memfd only `train` holds, its number beside the pid (docs/architecture.md).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

from smhvd.errors import HostEnvError
from smhvd.hostenv.trust import (
    ENV_FD,
    LINK_SOCKET,
    PID_FILE,
    directory,
    is_train,
    private_dir_problem,
    read_number,
)
from smhvd.proc.processes import write_all

SEALS = fcntl.F_SEAL_SEAL | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
_OWN_NAMES = (ENV_FD, LINK_SOCKET, PID_FILE, *(f"{name}.tmp" for name in (ENV_FD, PID_FILE)))
UNCLAIMED_AGE = 60.0  # a leader's directory with no pid in it this long after it was made is nobody's


def leader_directory() -> Path:
    return directory(f"job-{secrets.token_hex(8)}")


def reclaim_leaders_leftovers(uid: int | None = None, now: float | None = None) -> list[Path]:
    """Remove (best effort) the job directories of this user's leaders whose `train` is gone (a SIGKILLed one
    could not): only what this module writes there, then the directory if now empty. What it removed."""
    uid = os.geteuid() if uid is None else uid
    now = time.time() if now is None else now
    pattern = directory("job-", uid)
    removed = []
    for path in sorted(pattern.parent.glob(pattern.name + "*")):
        with contextlib.suppress(OSError, ValueError):
            if private_dir_problem(path, uid):
                continue
            pid = read_number(path / PID_FILE)
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
        pid = read_number(path / PID_FILE)
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


def _write(path: Path, text: str) -> None:
    """`text` in `path`, written whole: a rank never reads half of it."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    except OSError as exc:
        where = exc.filename2 or exc.filename or path
        raise HostEnvError(f"cannot serve this host's environment: {where}: {exc.strerror}") from None


@contextlib.contextmanager
def claimed(path: Path) -> Iterator[Path]:
    """This `train`'s private directory `path`, with its pid in it, while the block runs; then removed."""
    _claim(path)
    try:
        _write(path / PID_FILE, str(os.getpid()))
        yield path
    finally:
        _remove_own(path)
        with contextlib.suppress(OSError):
            path.rmdir()


@contextlib.contextmanager
def serving(path: Path, env: Mapping[str, str]) -> Iterator[None]:
    """`env` for this user's ranks in the claimed directory `path` while the block runs: a sealed memfd this
    process holds, its number in ENV_FD."""
    fd = os.memfd_create("smhvd-hostenv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        write_all(fd, json.dumps(dict(env)).encode())
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
        _write(path / ENV_FD, str(fd))
        try:
            yield
        finally:
            (path / ENV_FD).unlink(missing_ok=True)
    finally:
        os.close(fd)
