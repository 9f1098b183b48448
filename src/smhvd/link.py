"""The leader-worker link: how a worker learns that the job started and how it ended.

The leader opens one ssh session per worker running `python -m smhvd.link PORT`. This relay connects to
the worker's `train` over an abstract unix socket (per network namespace, named after the sshd port), prints
`ready` (the leader's proof that the worker is up), then copies the leader's JSON-lines events to it:
`{"event": "start"}` before mpirun starts, `{"event": "alive"}` every HEARTBEAT_INTERVAL while it runs,
`{"event": "end", "exit_code": N, "reason": "..."}` when it ended. If the leader dies, its end of the ssh
session closes and the worker sees the link close without an `end`: it exits at once. If the leader's host
vanishes without closing anything, the heartbeats stop: the worker gives up after SILENCE_LIMIT seconds.
"""

from __future__ import annotations

import os
import selectors
import socket
import sys

from smhvd.errors import EX_UNAVAILABLE
from smhvd.wire import READY, link_socket_name


def relay(port: int) -> int:
    """Runs on the worker, started by the leader over ssh: stdin -> the worker launcher's socket."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(link_socket_name(port))
    except OSError as exc:
        sys.stderr.write(f"smhvd.link: no launcher is waiting on this host ({exc.strerror})\n")
        return EX_UNAVAILABLE
    os.write(1, READY)
    sel = selectors.DefaultSelector()
    sel.register(0, selectors.EVENT_READ)
    sel.register(sock, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj == 0:
                data = os.read(0, 65536)
                if not data:  # the leader closed the session
                    return 0
                sock.sendall(data)
            elif not sock.recv(4096):  # the worker launcher exited
                return 0


if __name__ == "__main__":
    sys.exit(relay(int(sys.argv[1])))
