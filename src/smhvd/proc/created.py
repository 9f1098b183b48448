"""A directory's new entries as an fd the loop waits on: inotify, through ctypes (the standard library has no
binding). sshd says it listens by writing its PidFile (roles/sshd.py)."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

from smhvd.proc.loop import Closing

_IN_CREATE = 0x00000100
_IN_MOVED_TO = 0x00000080
_libc = ctypes.CDLL(None, use_errno=True)


class Created(Closing):
    """Readable whenever an entry was created in (or moved into) `directory` since the last `drain`. A
    context manager: its end closes the fd."""

    def __init__(self, directory: Path) -> None:
        fd: int = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)  # IN_NONBLOCK, IN_CLOEXEC
        if fd < 0:
            raise _error("inotify_init1", directory)
        self._fd: int = fd
        if _libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CREATE | _IN_MOVED_TO) < 0:
            exc = _error("inotify_add_watch", directory)
            os.close(fd)
            raise exc

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> None:
        """Take the events that made it readable (what was created is for the caller to look at)."""
        try:
            while os.read(self._fd, 65536):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def _error(call: str, directory: Path) -> OSError:
    errno = ctypes.get_errno()
    return OSError(errno, f"{call}: {os.strerror(errno)}", str(directory))
