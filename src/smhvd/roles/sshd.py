"""sshd for worker hosts and the ssh client config the leader uses: generated per run, key-only. The port is
SMHVD_SSH_PORT (env_options.py), which names the worker's private directory too (hostenv/client.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from smhvd.errors import PeerError
from smhvd.proc.created import Created
from smhvd.proc.loop import process_loop
from smhvd.proc.processes import die_with_parent
from smhvd.proc.timers import Timer

HOST_KEY_TYPES = ("ed25519", "ecdsa", "rsa")


def render_sshd_config(port: int, host_keys: Sequence[Path], pid_file: Path) -> str:
    lines = [
        f"Port {port}",
        *(f"HostKey {key}" for key in host_keys),
        f"PidFile {pid_file}",
        "AuthorizedKeysFile %h/.ssh/authorized_keys",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "PermitRootLogin prohibit-password",
        "PermitEmptyPasswords no",
        "UsePAM no",
        "UseDNS no",
        "StrictModes no",  # keys may live on volumes with loose modes; the cluster network is private
        "X11Forwarding no",
        "PrintMotd no",
        "ClientAliveInterval 5",  # a vanished leader is noticed within ~15 s
        "ClientAliveCountMax 3",
        "MaxStartups 256",  # mpirun opens one session per worker at once, plus the leader's link
        "MaxSessions 64",
        "LogLevel ERROR",
    ]
    return "\n".join(lines) + "\n"


# Key exchanges, fastest first: OpenSSH 9's default (sntrup761x25519) costs the client about 80 ms of CPU per
# connection, 14 ms with curve25519, and the leader opens two per worker (3 s at 32 hosts); the sessions only
# carry the launch. Every name is known to OpenSSH 7.4+; a FIPS-only server still finds the NIST ones.
KEX_ALGORITHMS = (
    "curve25519-sha256,curve25519-sha256@libssh.org,ecdh-sha2-nistp256,ecdh-sha2-nistp384,"
    "ecdh-sha2-nistp521,diffie-hellman-group-exchange-sha256,diffie-hellman-group16-sha512,"
    "diffie-hellman-group18-sha512,diffie-hellman-group14-sha256"
)


def render_ssh_config(port: int, control_dir: Path | None = None) -> str:
    """Client side, for the leader's links and for mpirun's orted launches (plm_rsh_args -F). `control_dir`:
    the leader's private run directory, where each link is the master of the connection to its worker
    (docs/multi-host.md)."""
    lines = [
        "Host *",
        f"  Port {port}",
        f"  KexAlgorithms {KEX_ALGORITHMS}",
        "  BatchMode yes",
        "  StrictHostKeyChecking no",  # host keys are per image/instance; the hosts are the job's own
        "  UserKnownHostsFile /dev/null",
        "  LogLevel ERROR",
        "  ConnectTimeout 5",
        "  ServerAliveInterval 5",
        "  ServerAliveCountMax 3",
        "  ForwardAgent no",
        "  ForwardX11 no",
    ]
    if control_dir is not None:  # %C: a hash of the connection, short enough for a socket's path
        lines += ["  ControlMaster auto", f"  ControlPath {control_dir}/cm-%C", "  ControlPersist no"]
    return "\n".join(lines) + "\n"


def host_keys(run_dir: Path, etc: Path = Path("/etc/ssh")) -> list[Path]:
    """The system's host keys, or a key generated for this run when there are none."""
    keys = [etc / f"ssh_host_{kind}_key" for kind in HOST_KEY_TYPES]
    found = [k for k in keys if k.is_file() and os.access(k, os.R_OK)]
    if found:
        return found
    generated = run_dir / "ssh_host_ed25519_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(generated)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return [generated]


def sshd_binary() -> str:
    for candidate in (shutil.which("sshd"), "/usr/sbin/sshd"):
        if candidate and Path(candidate).is_file():
            return str(Path(candidate).resolve())  # sshd re-executes itself: it needs an absolute path
    raise PeerError("sshd not found: install openssh-server (workers of a multi-host job run sshd)")


def start_sshd(run_dir: Path, port: int, timeout: float = 10.0) -> subprocess.Popen[bytes]:
    if os.geteuid() != 0:
        raise PeerError("workers of a multi-host job run sshd, which needs root (as in SageMaker containers)")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # privilege separation directory
    pid_file = run_dir / "sshd.pid"
    config = run_dir / "sshd_config"
    config.write_text(render_sshd_config(port, host_keys(run_dir), pid_file))
    pid_file.unlink(missing_ok=True)  # only the sshd started here may say it listens
    proc = subprocess.Popen(
        [sshd_binary(), "-D", "-e", "-f", str(config)],
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent,  # noqa: PLW1509  (single-threaded here; no orphan sshd)
    )

    try:
        _wait_listening(proc, pid_file, port, timeout)
    except PeerError:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        raise
    return proc


def _wait_listening(proc: subprocess.Popen[bytes], pid_file: Path, port: int, timeout: float) -> None:
    """Until sshd has written its PidFile (it does once its socket is bound): its creation (inotify), sshd's
    exit (PeerError) or the deadline (PeerError), on this process's loop."""

    def exited() -> None:
        raise PeerError(f"sshd exited with code {proc.wait()} at start (port {port} in use?)")

    def timed_out() -> None:
        raise PeerError(
            f"timed out after {timeout:g}s waiting for sshd to listen on port {port} (no {pid_file})"
        )

    with Created(pid_file.parent) as created, process_loop().scope() as scope:

        def appeared() -> None:
            created.drain()
            if pid_file.is_file():
                scope.stop()

        scope.reader(created, appeared)
        scope.exit_of(proc.pid, exited)
        scope.timers.after(Timer("sshd's start"), timeout, timed_out)
        if not pid_file.is_file():  # created before the watch began: no event will say so
            scope.run()
