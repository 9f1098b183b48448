"""What holds fds (a loop, a scope on it, an inotify watch) and gives them back at a `with` block's end."""

from __future__ import annotations

from typing import Self


class Closing:
    """A context manager whose end calls `close()`; `__enter__` gives the object itself."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
