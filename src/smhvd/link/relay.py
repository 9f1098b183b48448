"""The relay, on a worker: the leader's ssh session joined to the worker's `train` over the link socket in its
private directory (trusted as a rank trusts its environment: hostenv/trust.py). It says READY, then copies the
leader's words to it and its words back, until either end closes. Nothing may print before READY: Python
starts isolated and without `site` (`-I -S`: no .pth, sitecustomize or PYTHON* variable), and what the remote
shell prints first (a chatty rc file) the leader skips (link/connect.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from smhvd.errors import EX_UNAVAILABLE, HostEnvUnavailable
from smhvd.hostenv import trust
from smhvd.link import READY
from smhvd.proc.loop import process_loop
from smhvd.proc.processes import ancestors, write_all
from smhvd.proc.waiting import NotYet

CONNECT_TIMEOUT = 5.0  # one attempt: the leader tries again
# `python -I -S -c BOOT ROOT PORT`: ROOT (the directory that holds the package smhvd) is put on the path.
BOOT = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from smhvd.link.relay import main; sys.exit(main(sys.argv[2:]))"
)


def command(port: int) -> list[str]:
    """The relay's argv on a worker: this interpreter and this launcher (every host runs the same image)."""
    return [sys.executable, "-I", "-S", "-c", BOOT, str(Path(__file__).resolve().parents[2]), str(port)]


def relay(port: int) -> int:
    """stdin (the leader's words) -> the worker's `train` -> stdout (its words back), until either end
    closes."""
    try:
        sock = trust.connect_trusted(
            trust.directory(port), trust.LINK_SOCKET, CONNECT_TIMEOUT, ancestors(), "the worker's link"
        )
    except (NotYet, HostEnvUnavailable) as exc:
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
            data = sock.recv(4096)
            if data:  # its words to the leader (how its preparation goes)
                write_all(1, data)
            else:  # the worker's `train` exited
                loop.stop()

        loop.reader(0, from_leader)
        loop.reader(sock, from_worker)
        loop.run()
    return 0


def main(args: list[str]) -> int:
    if len(args) != 1 or not args[0].isdigit():
        sys.stderr.write("usage: python -m smhvd.link.relay PORT\n")
        return 64
    return relay(int(args[0]))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
