"""One simulated host: its namespaces around a reaping PID 1, its network link, and what can be done to it
(run a command inside, kill its processes, cut its link, take it down)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd_sim import accounting, procfs
from smhvd_sim.spec import INTERFACE, HostAddress
from smhvd_sim.system import ClusterError, run, wait_for

HOSTINIT = Path(__file__).with_name("hostinit.py")
NAMESPACES = ("--net", "--mount", "--uts", "--ipc", "--pid")
SETUP_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0


@dataclass(frozen=True)
class HostLayout:
    """What one host sees instead of the machine's files: (source, target inside) bind mounts, tmpfs
    mounts with their modes, and directories to create on them."""

    hostname: str
    binds: tuple[tuple[Path, Path], ...]
    tmpfs: tuple[tuple[Path, str], ...]
    dirs: tuple[tuple[Path, str], ...]
    carry: tuple[Path, ...] = ()  # directories under a tmpfs target that must stay visible

    def to_json(self) -> str:
        return json.dumps(
            {
                "hostname": self.hostname,
                "binds": [[str(src), str(dst)] for src, dst in self.binds],
                "tmpfs": [[str(dst), mode] for dst, mode in self.tmpfs],
                "carry": [str(path) for path in self.carry],
                "dirs": [[str(path), mode] for path, mode in self.dirs],
            }
        )


def unshare_argv(config_file: Path, python: str = sys.executable) -> list[str]:
    """The command that creates the host's namespaces and runs its PID 1 (killed if unshare dies) with
    its layout read from ``config_file``."""
    return [
        "unshare",
        *NAMESPACES,
        "--fork",
        "--mount-proc",
        "--propagation",
        "private",
        "--kill-child",
        "--",
        python,
        "-I",
        str(HOSTINIT),
        str(config_file),
    ]


def nsenter_argv(init_pid: int, argv: list[str], workdir: str = "/") -> list[str]:
    """The command that runs ``argv`` inside the host whose PID 1 is ``init_pid`` (host pid)."""
    return [
        "nsenter",
        "--target",
        str(init_pid),
        "--net",
        "--mount",
        "--uts",
        "--ipc",
        "--pid",
        f"--wd={workdir}",
        "--",
        *argv,
    ]


class SimHost:
    """A running simulated host. Create with :meth:`start`; always end with :meth:`stop`."""

    def __init__(self, address: HostAddress, anchor: subprocess.Popen[bytes], init_pid: int) -> None:
        self.address = address
        self.name = address.name
        self._anchor = anchor
        self.init_pid = init_pid
        self.pid_namespace = procfs.namespace_id(init_pid, "pid")
        self.net_namespace = procfs.namespace_id(init_pid, "net")
        self.cpu_group: Path | None = None  # commands join it first (accounting.py), when the cluster has one

    @classmethod
    def start(cls, address: HostAddress, layout: HostLayout, config_file: Path) -> SimHost:
        """Start the host's namespaces and wait until its PID 1 has prepared them (``layout`` is written
        to ``config_file`` for it)."""
        return cls.start_many([(address, layout, config_file)])[0]

    @classmethod
    def start_many(
        cls, plans: Sequence[tuple[HostAddress, HostLayout, Path]], timeout: float = SETUP_TIMEOUT
    ) -> list[SimHost]:
        """Start every host's namespaces at once, then wait for all to be ready (one deadline for all):
        bringing N hosts up costs about one host's set-up, not N. On any failure every host started here is
        taken down again."""
        anchors: list[subprocess.Popen[bytes]] = []
        try:
            for _address, layout, config_file in plans:
                config_file.write_text(layout.to_json())
                anchors.append(
                    subprocess.Popen(
                        unshare_argv(config_file),
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        start_new_session=True,
                    )
                )
            deadline = time.monotonic() + timeout
            hosts = []
            for (address, _layout, _file), anchor in zip(plans, anchors, strict=True):
                _wait_ready(anchor, address.name, deadline, timeout)
                children = wait_for(
                    functools.partial(_children, anchor.pid),
                    f"PID 1 of {address.name} to appear",
                    max(0.0, deadline - time.monotonic()),
                )
                hosts.append(cls(address, anchor, children[0]))
        except BaseException:
            for anchor in anchors:
                anchor.kill()
            for anchor in anchors:
                anchor.wait(STOP_TIMEOUT)
                _close_streams(anchor)
            raise
        return hosts

    def outer_link_commands(self, bridge: str) -> str:
        """``ip -batch`` lines, run outside the hosts, that create the host's veth pair (inner end eth0, in
        its namespace) and put the outer end on ``bridge``."""
        outer = self.address.outer_link
        return (
            f"link add {outer} type veth peer name {INTERFACE} netns {self.init_pid}\n"
            f"link set {outer} master {bridge} up\n"
        )

    def inner_link_argv(self) -> list[str]:
        """The command that runs ``ip -batch -`` inside the host's network namespace."""
        return ["nsenter", "--target", str(self.init_pid), "--net", "ip", "-batch", "-"]

    def inner_link_commands(self) -> str:
        """Its input: address eth0, bring eth0 and lo up (after outer_link_commands ran)."""
        return f"addr add {self.address.address} dev {INTERFACE}\nlink set {INTERFACE} up\nlink set lo up\n"

    def connect(self, bridge: str) -> None:
        """Create the veth pair (inner end eth0), put the outer end on ``bridge``, set the address."""
        run(["ip", "-batch", "-"], stdin=self.outer_link_commands(bridge))
        run(self.inner_link_argv(), stdin=self.inner_link_commands())

    def set_link(self, *, up: bool) -> None:
        """Cut (or restore) the host's network link, as if its cable were pulled."""
        run(["ip", "link", "set", self.address.outer_link, "up" if up else "down"])

    def command(self, argv: list[str], workdir: str = "/") -> list[str]:
        """``argv`` wrapped to run inside this host (in its CPU accounting group, if it has one)."""
        inside = nsenter_argv(self.init_pid, argv, workdir)
        return inside if self.cpu_group is None else accounting.join_argv(self.cpu_group, inside)

    def cpu_seconds(self) -> float | None:
        """CPU seconds used so far by every command started on this host (None without accounting)."""
        return None if self.cpu_group is None else accounting.cpu_seconds(self.cpu_group)

    def processes(self) -> list[int]:
        """Host pids of every process in this host except its PID 1."""
        if self.pid_namespace is None:
            return []
        return [pid for pid in procfs.pids_in_namespace("pid", self.pid_namespace) if pid != self.init_pid]

    def kill_processes(self, signum: int = signal.SIGKILL) -> list[int]:
        """Send ``signum`` to every process of the host (the host stays up, as after an OOM kill)."""
        victims = self.processes()
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return victims

    @property
    def alive(self) -> bool:
        return self._anchor.poll() is None

    def begin_stop(self) -> None:
        """Kill PID 1 (every process in the host's PID namespace dies with it) without waiting: stopping
        many hosts is one signal each, then one wait each (:meth:`stop`)."""
        if self._anchor.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.init_pid, signal.SIGKILL)

    def stop(self) -> None:
        """Take the host down: killing PID 1 kills every process in its PID namespace; the network
        namespace and its veth pair go when the last process has gone."""
        self.begin_stop()
        try:
            self._anchor.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            self._anchor.kill()
            self._anchor.wait(STOP_TIMEOUT)
        _close_streams(self._anchor)


def _close_streams(anchor: subprocess.Popen[bytes]) -> None:
    for stream in (anchor.stdin, anchor.stdout, anchor.stderr):
        if stream is not None:
            stream.close()


def _children(pid: int) -> list[int] | None:
    return procfs.children_of(pid) or None


def _wait_ready(anchor: subprocess.Popen[bytes], host: str, deadline: float, timeout: float) -> None:
    """Read PID 1's READY line before ``deadline`` (time.monotonic()); on failure report its stderr."""
    assert anchor.stdout is not None
    assert anchor.stderr is not None
    ready, _, _ = select.select([anchor.stdout], [], [], max(0.0, deadline - time.monotonic()))
    line = anchor.stdout.readline() if ready else b""
    if line.strip() == b"READY":
        return
    if not ready:
        raise ClusterError(f"{host}: PID 1 did not report ready within {timeout:g} s")
    anchor.wait(STOP_TIMEOUT)
    detail = anchor.stderr.read().decode(errors="replace").strip().splitlines()
    raise ClusterError(f"{host}: {detail[-1] if detail else 'host setup failed: no error output'}")
