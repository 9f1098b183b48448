"""PID 1 of one simulated host: prepares the host's mount and UTS namespaces, then reaps orphans.

Run by ``unshare`` inside the host's new namespaces as ``python -I hostinit.py CONFIG_FILE``; it imports
nothing from the project. It prints READY once the host is prepared and then lives until its stdin closes
(the cluster tool exited, however it died) or it gets SIGTERM/SIGINT/SIGHUP. When it exits, the kernel
kills every process in the host's PID namespace, which is how a host is torn down.

CONFIG_FILE holds JSON: {"hostname": str, "binds": [[src, dst], ...], "tmpfs": [[dst, mode], ...],
"carry": [path, ...], "dirs": [[path, mode], ...]}: bind mounts first (their sources may live under a path a
tmpfs hides next), then tmpfs mounts, then the "carry" paths (which a tmpfs would hide, such as a Python
environment under /tmp) bound back at the same place, then directories created on them (/run/sshd).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from types import FrameType


def _mount(argv: list[str], pass_fds: tuple[int, ...] = ()) -> None:
    done = subprocess.run(["mount", *argv], capture_output=True, text=True, check=False, pass_fds=pass_fds)
    if done.returncode != 0:
        first = (done.stderr.strip().splitlines() or ["no error output"])[0]  # then only "see dmesg(1)"
        raise OSError(f"mount {' '.join(argv)}: {first}")


def prepare(config: dict[str, object]) -> None:
    """Hostname, bind mounts, tmpfs mounts, carried paths, directories: in that order."""
    socket.sethostname(str(config["hostname"]))
    for src, dst in config["binds"]:  # type: ignore[attr-defined]
        _mount(["--bind", src, dst])
    # Directories opened before a tmpfs covers them stay reachable through /proc/self/fd afterwards.
    carried = {path: os.open(path, os.O_PATH | os.O_DIRECTORY) for path in config.get("carry", [])}  # type: ignore[attr-defined]
    for dst, mode in config["tmpfs"]:  # type: ignore[attr-defined]
        _mount(["-t", "tmpfs", "-o", f"mode={mode},nosuid,nodev", "tmpfs", dst])
    for path, fd in carried.items():
        Path(path).mkdir(parents=True, exist_ok=True)
        # --no-canonicalize: resolved as a path, the fd link would name the covered directory again
        _mount(["--no-canonicalize", "--bind", f"/proc/self/fd/{fd}", path], pass_fds=(fd,))
        os.close(fd)
    for path, mode in config["dirs"]:  # type: ignore[attr-defined]
        Path(path).mkdir(parents=True, exist_ok=True)
        Path(path).chmod(int(mode, 8))


def _reap(_signum: int, _frame: FrameType | None) -> None:
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _stop(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def main() -> int:
    try:
        prepare(json.loads(Path(sys.argv[1]).read_text()))
    except (OSError, KeyError, ValueError, IndexError) as exc:
        print(f"host setup failed: {exc}", file=sys.stderr, flush=True)
        return 1
    signal.signal(signal.SIGCHLD, _reap)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stop)
    print("READY", flush=True)
    _reap(signal.SIGCHLD, None)
    while os.read(0, 4096):
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
