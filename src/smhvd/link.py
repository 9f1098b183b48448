"""The leader-worker link: how a worker learns that the job started and how it ended.

The leader opens one ssh session per worker running `python -m smhvd.link PORT`. This relay connects to
the worker's `train` over a unix socket in its private directory (named after the sshd port; trusted as a rank
trusts its environment: the directory is this user's alone, and the other end is the `train` whose pid is
written there and that started this relay's sshd: proc/trust.py), prints `ready` (the leader's proof that
the worker is up), then copies the leader's JSON-lines events to it:
`{"event": "start"}` before mpirun starts, `{"event": "alive"}` every HEARTBEAT_INTERVAL while it runs,
`{"event": "end", "exit_code": N, "reason": "..."}` when it ended. If the leader dies, its end of the ssh
session closes and the worker sees the link close without an `end`: it exits at once. If the leader's host
vanishes without closing anything, the heartbeats stop: the worker gives up after SILENCE_LIMIT seconds.
"""

from __future__ import annotations

import os
import sys

from smhvd.errors import EX_UNAVAILABLE, HostEnvError
from smhvd.proc import trust
from smhvd.proc.loop import process_loop
from smhvd.proc.processes import ancestors
from smhvd.proc.waiting import NotYet
from smhvd.wire import READY

CONNECT_TIMEOUT = 5.0  # one attempt: the leader tries again


def relay(port: int) -> int:
    """Runs on the worker, started by the leader over ssh: stdin -> the worker launcher's socket."""
    try:
        sock = trust.connect_trusted(
            trust.directory(port), trust.LINK_SOCKET, CONNECT_TIMEOUT, ancestors(), "the worker's link"
        )
    except (NotYet, HostEnvError) as exc:
        sys.stderr.write(f"smhvd.link: no launcher is waiting on this host ({exc})\n")
        return EX_UNAVAILABLE
    sock.settimeout(None)
    os.write(1, READY)
    with process_loop().scope() as loop:

        def from_leader() -> None:
            data = os.read(0, 65536)
            if data:
                sock.sendall(data)
            else:  # the leader closed the session
                loop.stop()

        def from_worker() -> None:
            if not sock.recv(4096):  # the worker launcher exited
                loop.stop()

        loop.reader(0, from_leader)
        loop.reader(sock, from_worker)
        loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(relay(int(sys.argv[1])))
