"""How a command runs on another host of the job: over ssh, with the job's client configuration."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def ssh_command(ssh_config: Path, host: str, remote: Sequence[str]) -> list[str]:
    """ssh hands the remote command to the remote shell: quoted here (host names are validated, no leading
    '-'). Pure."""
    return ["ssh", "-F", str(ssh_config), host, shlex.join(remote)]
