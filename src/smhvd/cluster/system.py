"""Running system tools (ip, ssh-keygen) as argv lists, with failures turned into one-line errors."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from smhvd.cluster.errors import ClusterError

REQUIRED_TOOLS = ("unshare", "nsenter", "ip", "mount", "ssh-keygen")


def run(argv: list[str], *, stdin: str | None = None, timeout: float = 30.0) -> str:
    """Run ``argv``; return its stdout, or raise ClusterError naming the command and its stderr."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        raise ClusterError(f"{argv[0]}: not found on PATH") from exc
    except subprocess.TimeoutExpired as exc:
        raise ClusterError(f"{shlex.join(argv)}: no answer within {timeout:g} s") from exc
    if done.returncode != 0:
        detail = done.stderr.strip().splitlines()[-1:] or ["no error output"]
        raise ClusterError(f"{shlex.join(argv)} failed with exit {done.returncode}: {detail[0]}")
    return done.stdout


def check_prerequisites() -> None:
    """Fail early, with one line, when not root or when a needed tool is missing."""
    if os.geteuid() != 0:
        raise ClusterError("the simulated cluster needs root (network and mount namespaces, a bridge)")
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if missing:
        raise ClusterError(
            f"missing tools: {', '.join(missing)}"
            " (Debian: apt-get install iproute2 util-linux mount openssh-client)"
        )
