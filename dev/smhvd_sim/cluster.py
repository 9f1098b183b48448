"""The cluster: brings hosts algo-1..algo-N up on a private bridge, runs commands on them, and tears
everything down (processes, namespaces, links, bridge, mountpoints it created) whatever happens."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType, TracebackType
from typing import TextIO

from smhvd.proc import processes
from smhvd_sim import accounting, procfs, registry
from smhvd_sim.host import HostLayout, SimHost
from smhvd_sim.hosttrees import write_host_tree
from smhvd_sim.jobs import Fault, HostProcess, HostResult, await_hosts
from smhvd_sim.spec import (
    DEFAULT_ML_PATH,
    LINK_PREFIX,
    ClusterSpec,
    HostAddress,
    bridge_name,
    host_addresses,
    hosts_file,
)
from smhvd_sim.system import ClusterError, Interrupted, check_prerequisites, run, run_each, wait_for

STANDARD_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
SSH_CLIENT_CONFIG = (
    "Host algo-*\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n"
)
ETC_ENVIRONMENT = Path("/etc/environment")
SSH_DIR = Path("/root/.ssh")
# bash runs ~/.bashrc for every command sshd starts. The machine's own (e.g. `pyenv init`, whose rehash takes
# a lock that every host shares and that a killed session leaves behind for 60 s) must not run on the
# simulated hosts: each gets the empty rc of a fresh container instead.
ROOT_BASHRC = Path("/root/.bashrc")
HOST_BASHRC = "# smhvd-cluster host: a fresh container's empty rc, not the machine's\n"
LINK_GONE_TIMEOUT = 10.0


class Cluster:
    """Use as a context manager: ``with Cluster(spec) as cluster: cluster.run([...])``."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.hosts: dict[str, SimHost] = {}
        self.addresses: list[HostAddress] = []
        self.bridge = ""
        self._record: registry.Record | None = None
        self._net_namespaces: list[int] = []
        self._cgroups: tuple[Path, ...] = ()  # CPU accounting groups (accounting.py), deepest first
        self._cpu_groups: dict[str, Path] = {}  # host -> its group (none without cgroup v2)
        self._previous_handlers: dict[int, object] = {}

    # ----- paths -----
    def host_dir(self, host: str) -> Path:
        return self.spec.workdir / host

    def ml_dir(self, host: str) -> Path:
        """The host's /opt/ml tree as seen from outside the cluster."""
        return self.host_dir(host) / "opt-ml"

    @property
    def leader(self) -> str:
        return sorted(self.spec.host_names)[0]

    # ----- lifecycle -----
    def __enter__(self) -> Cluster:
        """Bring the cluster up; until __exit__, SIGTERM and SIGINT raise Interrupted (in the main thread),
        so that being stopped tears the cluster down like an error does."""
        self._previous_handlers = _raise_on_stop_signals()
        try:
            self.up()
        except BaseException:
            _restore_handlers(self._previous_handlers)
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.down()
        finally:
            _restore_handlers(self._previous_handlers)

    def up(self) -> None:
        """Bring every host up; on any failure, undo what was done and raise ClusterError."""
        check_prerequisites()
        try:
            self._allocate()
            self._prepare_files()
            # Every host starts at once (its PID 1 sets up its mounts meanwhile); one `ip -batch` creates
            # every veth pair on the bridge; each host's eth0 is then addressed from inside, in parallel.
            plans = [
                (address, self._layout(address.name), self.host_dir(address.name) / "hostinit.json")
                for address in self.addresses
            ]
            started = SimHost.start_many(plans)
            self.hosts = {host.name: host for host in started}
            for host in started:
                host.cpu_group = self._cpu_groups.get(host.name)
            self._net_namespaces = [ns for host in started if (ns := host.net_namespace)]
            links = "".join(host.outer_link_commands(self.bridge) for host in started)
            run(
                ["ip", "-batch", "-"],
                stdin=f"link add {self.bridge} type bridge\nlink set {self.bridge} up\n{links}",
            )
            run_each([(host.inner_link_argv(), host.inner_link_commands()) for host in started])
        except BaseException:
            self.down()
            raise

    def _allocate(self) -> None:
        with registry.locked():
            registry.clean_abandoned()
            records = registry.load_all()
            cluster_id = registry.new_cluster_id()
            slot = registry.free_slot(records)
            self.addresses = host_addresses(self.spec.hosts, cluster_id, slot)
            self.bridge = bridge_name(cluster_id)
            self._cgroups = accounting.create_groups(cluster_id, self.spec.host_names)
            self._cpu_groups = {group.name: group for group in self._cgroups[:-1]}
            mountpoints = [self.spec.ml_path, SSH_DIR]
            made = _make_mountpoints(mountpoints)
            # cgroups first: each directory is removed with rmdir, deepest first
            created = [str(path) for path in (*self._cgroups, *made)]
            self._record = registry.Record(
                cluster_id=cluster_id,
                owner_pid=os.getpid(),
                slot=slot,
                links=(self.bridge, *(address.outer_link for address in self.addresses)),
                created_dirs=tuple(created),
                mountpoints=tuple(str(path) for path in mountpoints),
            )
            self._record.save()

    def _prepare_files(self) -> None:
        workdir = self.spec.workdir
        workdir.mkdir(parents=True, exist_ok=True)
        key = workdir / "cluster-key" / "id_ed25519"
        if not key.exists():
            key.parent.mkdir(mode=0o700, exist_ok=True)
            run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "smhvd-cluster", "-f", str(key)])
        public = key.with_suffix(".pub").read_text()
        etc_hosts = hosts_file(self.addresses)
        for name in self.spec.host_names:
            host_dir = self.host_dir(name)
            etc = host_dir / "etc"
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(etc_hosts)
            if ETC_ENVIRONMENT.exists():
                shutil.copyfile(ETC_ENVIRONMENT, etc / "environment")
            (etc / "bashrc").write_text(HOST_BASHRC)
            ssh = host_dir / "ssh"
            ssh.mkdir(mode=0o700, exist_ok=True)
            shutil.copyfile(key, ssh / "id_ed25519")
            (ssh / "id_ed25519").chmod(0o600)
            (ssh / "id_ed25519.pub").write_text(public)
            (ssh / "authorized_keys").write_text(public)
            (ssh / "authorized_keys").chmod(0o600)
            if self.spec.ssh_client_config:
                (ssh / "config").write_text(SSH_CLIENT_CONFIG)
            write_host_tree(self.ml_dir(name), self.spec, name)

    def _layout(self, name: str) -> HostLayout:
        etc = self.host_dir(name) / "etc"
        binds = [(etc / "hosts", Path("/etc/hosts")), (self.host_dir(name) / "ssh", SSH_DIR)]
        if ETC_ENVIRONMENT.exists():
            binds.append((etc / "environment", ETC_ENVIRONMENT))
        if ROOT_BASHRC.exists():
            binds.append((etc / "bashrc", ROOT_BASHRC))
        binds.append((self.ml_dir(name), self.spec.ml_path))
        binds.extend(self.spec.extra_binds)
        tmpfs = [(Path("/run"), "0755"), (Path("/dev/shm"), "1777")]
        carry: tuple[Path, ...] = ()
        if self.spec.private_tmp:
            tmpfs.append((Path("/tmp"), "1777"))
            # The Python environment the hosts run (and the project, for an editable install) stay visible
            # when they live under /tmp, as in a CI checkout there.
            carry = tuple(path for path in _software_paths() if path.is_relative_to("/tmp"))
        return HostLayout(
            hostname=name,
            binds=tuple(binds),
            tmpfs=tuple(tmpfs),
            dirs=((Path("/run/sshd"), "0755"),),
            carry=carry,
        )

    def down(self) -> None:
        """Tear everything down; safe to call more than once and after a partial up()."""
        for host in self.hosts.values():
            host.begin_stop()  # every PID 1 killed at once; then one wait each
        for host in self.hosts.values():
            host.stop()
        self.hosts.clear()
        if self._record is not None:
            outer = [address.outer_link for address in self.addresses]
            # Links still present after the deadline are deleted by release() below.
            with contextlib.suppress(ClusterError):
                wait_for(
                    lambda: None if any(Path("/sys/class/net", link).exists() for link in outer) else True,
                    "the hosts' veth links to vanish with their namespaces",
                    LINK_GONE_TIMEOUT,
                )
            accounting.remove_groups(self._cgroups)  # before release(): it waits for their last processes
            with registry.locked():
                registry.release(self._record)
            self._record = None

    # ----- running commands -----
    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """A container-like environment: nothing inherited from the caller but what is listed here."""
        prefix = self.spec.path_prefix or (str(Path(sys.executable).parent),)
        env = {
            "PATH": ":".join((*prefix, *STANDARD_PATH)),
            "HOME": "/root",
            "USER": "root",
            "LOGNAME": "root",
            "LANG": "C.UTF-8",
        }
        if self.spec.ml_path != DEFAULT_ML_PATH:
            env["SAGEMAKER_BASE_DIR"] = str(self.spec.ml_path)
        env.update(self.spec.env)
        env.update(extra or {})
        return env

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by each host's commands (empty without accounting: no cgroup v2)."""
        return {
            name: seconds for name, host in self.hosts.items() if (seconds := host.cpu_seconds()) is not None
        }

    def host(self, name: str) -> SimHost:
        try:
            return self.hosts[name]
        except KeyError:
            raise ClusterError(f"no host {name!r} (hosts: {', '.join(self.hosts)})") from None

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log: Path | None = None,
        echo: TextIO | None = None,
        exited: threading.Event | None = None,
        end_host_on_exit: bool = False,
    ) -> HostProcess:
        """Start ``argv`` inside host ``name`` (cwd /, the cluster's environment plus ``env``). With
        ``end_host_on_exit``, the host is treated as a container whose main process is ``argv``: when it
        exits, what it left running is recorded and killed."""
        return HostProcess(
            self.host(name),
            argv,
            self.env(env),
            log or self.host_dir(name) / "train.log",
            echo,
            exited,
            end_host_on_exit,
        )

    def exec(self, name: str, argv: Sequence[str], *, timeout: float = 60.0) -> tuple[int, str]:
        """Run a short command inside host ``name``; return its exit code and combined output."""
        return _run_captured(self.host(name).command(list(argv)), self.env(), timeout)

    def run(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        down: Sequence[str] = (),
        faults: Sequence[Fault] = (),
        timeout: float = 600.0,
        grace: float = 10.0,
        echo: TextIO | None = None,
    ) -> dict[str, HostResult]:
        """Run ``argv`` on every host except those in ``down`` at once, as SageMaker starts ``train`` on
        every instance; wait for all, applying ``faults``; return each host's result (by host name).
        Each host behaves as a container whose main process is ``argv``: what it leaves running when it
        exits is recorded (HostResult.left_running) and killed."""
        for name in [*down, *(fault.host for fault in faults)]:
            self.host(name)
        exited = threading.Event()
        processes = {
            name: self.start(name, argv, env=env, echo=echo, exited=exited, end_host_on_exit=True)
            for name in self.spec.host_names
            if name not in down
        }
        timed_out = await_hosts(
            processes, self.hosts, timeout=timeout, faults=faults, grace=grace, exited=exited
        )
        for process in processes.values():
            process.finish_output()
        now = time.time()
        results = {name: process.result(timed_out[name]) for name, process in processes.items()}
        for name in down:
            results[name] = HostResult(name, None, now, None, self.host_dir(name) / "train.log")
        return dict(sorted(results.items()))

    # ----- checks -----
    def leftovers(self) -> list[str]:
        """What is still present of this cluster after down(): the answer must be empty. A process counts
        when it is in one of the hosts' network namespaces and sees that host's own /etc/hosts file: the
        namespace numbers alone may already name the hosts of a cluster started since (procfs.py)."""
        own_files = {
            procfs.file_id(self.host_dir(name) / "etc" / "hosts") for name in self.spec.host_names
        } - {None}
        found = [
            f"process {pid} ({' '.join(processes.cmdline(pid))[:60]})"
            for pid in list(processes.read_process_table())
            if procfs.namespace_id(pid, "net") in self._net_namespaces
            and procfs.file_seen_by(pid, "/etc/hosts") in own_files
        ]
        found += [
            f"link {link.name}"
            for link in Path("/sys/class/net").iterdir()
            if link.name == self.bridge or link.name.startswith(f"{self.bridge}h")
        ]
        cluster_id = self.bridge.removeprefix(LINK_PREFIX)
        found += [f"registry record {path}" for path in registry.REGISTRY.glob(f"{cluster_id}.json")]
        found += [f"cgroup {group}" for group in self._cgroups if group.exists()]
        return found


def _software_paths() -> list[Path]:
    """Where the hosts' software lives: the Python environment and the directory holding this package."""
    return sorted({Path(sys.prefix).resolve(), Path(__file__).resolve().parents[2]})


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise Interrupted(signal.Signals(signum).name)


def _raise_on_stop_signals() -> dict[int, object]:
    """Install Interrupted-raising handlers for SIGTERM/SIGINT; return the previous ones (none off the
    main thread, where Python cannot install handlers)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.signal(signum, _interrupt) for signum in (signal.SIGTERM, signal.SIGINT)}


def _restore_handlers(previous: dict[int, object]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)  # type: ignore[arg-type]


def _make_mountpoints(paths: Sequence[Path]) -> list[Path]:
    """Create missing mountpoints (and parents); return what was created, deepest first, for rmdir."""
    created: list[Path] = []
    for path in paths:
        missing = [parent for parent in [path, *path.parents] if not parent.exists()]
        path.mkdir(parents=True, exist_ok=True)
        created.extend(missing)
    return created


def _run_captured(argv: list[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    done = subprocess.run(
        argv,
        env=dict(env),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr
