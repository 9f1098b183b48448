"""Helpers shared by the cluster tier's tests: a test sshd and ssh client options."""

from __future__ import annotations

from collections.abc import Callable

from smhvd.cluster import Cluster
from smhvd.cluster.jobs import HostProcess
from smhvd.cluster.waiting import wait_for

MakeCluster = Callable[..., Cluster]
SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "BatchMode=yes", "-o", "LogLevel=ERROR",
]  # fmt: skip


def sshd_argv(port: int = 22) -> list[str]:
    """A test sshd needing no config file (hosts have private /tmp): every setting on the command line."""
    return [
        "/usr/sbin/sshd", "-D", "-e", "-f", "/dev/null",
        "-o", f"Port={port}",
        "-o", "HostKey=/etc/ssh/ssh_host_ed25519_key",
        "-o", "UsePAM=no",
        "-o", "UseDNS=no",
        "-o", "PermitRootLogin=prohibit-password",
        "-o", "AuthorizedKeysFile=.ssh/authorized_keys",
        "-o", "PidFile=/run/test-sshd.pid",
    ]  # fmt: skip


def start_sshd(cluster: Cluster, host: str) -> HostProcess:
    """Start sshd in ``host`` and wait until it listens (it writes its PidFile after binding)."""
    process = cluster.start(host, sshd_argv(), log=cluster.host_dir(host) / "sshd.log")
    wait_for(
        lambda: True if cluster.exec(host, ["test", "-s", "/run/test-sshd.pid"])[0] == 0 else None,
        f"sshd on {host} to listen",
        15.0,
    )
    return process
