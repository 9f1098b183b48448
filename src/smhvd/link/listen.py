"""A worker's end of the link: the socket the leader's relay connects to, in this `train`'s private directory
(hostenv/server.claimed), and each connection's words as Events. Only this user's processes are taken."""

from __future__ import annotations

import contextlib
import functools
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from smhvd.errors import HostEnvError
from smhvd.hostenv.trust import LINK_SOCKET, peer_credentials
from smhvd.link import LINKED, Event
from smhvd.proc.loop import Scope

MAX_LINE = 1 << 16  # a connection whose line grows past this is not the leader's: dropped


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    pending: bytes = b""  # the line in progress
    linked: bool = False  # it said `linked`: the leader's link, not an attempt


@contextlib.contextmanager
def listening(place: Path) -> Iterator[socket.socket]:
    """The link socket in `place` (this `train`'s private directory) while the block runs."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    path = place / LINK_SOCKET
    try:
        try:
            server.bind(str(path))
        except OSError as exc:
            raise HostEnvError(f"cannot wait for the leader: {path}: {exc.strerror}") from None
        server.listen(16)
        server.setblocking(False)
        yield server
    finally:
        server.close()
        path.unlink(missing_ok=True)


class Listener:
    """The connections to the link socket, watched on `scope` (a loop's) until it closes."""

    def __init__(
        self,
        server: socket.socket,
        scope: Scope,
        on_event: Callable[[Connection, Event], object],
        on_closed: Callable[[Connection], object],
    ) -> None:
        self.server, self.scope, self.on_event, self.on_closed = server, scope, on_event, on_closed
        self.connections: set[Connection] = set()
        scope.reader(server, self._accept)

    def _accept(self) -> None:
        try:
            conn, _ = self.server.accept()
        except OSError:  # BlockingIOError: taken already; EMFILE: the next round tries again
            return
        if peer_credentials(conn)[1] != os.geteuid():
            conn.close()
            return
        conn.setblocking(False)
        connection = Connection(conn)
        self.connections.add(connection)
        self.scope.reader(conn, functools.partial(self._read, connection))

    def _read(self, connection: Connection) -> None:
        try:
            data = connection.sock.recv(65536)
        except OSError:
            data = b""
        lines = (connection.pending + data).split(b"\n")
        connection.pending = lines.pop()
        if not data or len(connection.pending) > MAX_LINE:
            self.scope.forget(connection.sock)
            connection.sock.close()
            self.connections.discard(connection)
            self.on_closed(connection)
            return
        for line in lines:
            event = Event.decode(line)
            if event is not None:
                connection.linked = connection.linked or event.kind == LINKED
                self.on_event(connection, event)
