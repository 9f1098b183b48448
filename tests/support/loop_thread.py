"""A test's own event loop run in a thread while a block runs: for what `train` serves on its loop (the host
environment's server) while the test itself blocks as a rank would (a fetch)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from smhvd.proc.loop import Loop


@contextlib.contextmanager
def running(loop: Loop) -> Iterator[None]:
    """Run `loop` in a thread until the block ends; what a callback raised is raised at the block's end."""
    wake_r, wake_w = socket.socketpair()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            loop.run()
        except BaseException as exc:  # given to the test's thread
            raised.append(exc)

    with wake_r, wake_w, loop.scope() as scope:
        scope.reader(wake_r, scope.stop)
        thread = threading.Thread(target=run, name="test-loop", daemon=True)
        thread.start()
        try:
            yield
        finally:
            wake_w.send(b"x")
            thread.join(30)
    assert not thread.is_alive(), "the test's loop did not stop within 30 s"
    if raised:
        raise raised[0]
