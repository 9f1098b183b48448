"""The simulated-cluster tier's fixtures and helpers: prerequisites (installed under CI, support/ci.py; else
the tier is skipped), a cluster factory that always tears down and checks nothing is left, a test sshd and
ssh options."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Protocol

import pytest

from smhvd_sim import Cluster, ClusterSpec
from smhvd_sim.jobs import HostProcess
from smhvd_sim.system import wait_for
from support.ci import in_ci, unavailable

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


SBIN_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/local/sbin", "/usr/sbin", "/sbin"])
# tool -> Debian package that provides it
TOOLS = {
    "unshare": "util-linux",
    "nsenter": "util-linux",
    "mount": "mount",
    "ip": "iproute2",
    "ssh-keygen": "openssh-client",
    "ssh": "openssh-client",
    "sshd": "openssh-server",
    "mpirun": "openmpi-bin",
}


def ensure_tools(tools: dict[str, str]) -> None:
    """Skip when root or a tool is missing; under CI install the tools instead (and fail if not root)."""
    if os.geteuid() != 0:
        unavailable("the cluster tier needs root (network namespaces)")
    missing = sorted(
        {package for tool, package in tools.items() if shutil.which(tool, path=SBIN_PATH) is None}
    )
    if not missing:
        return
    if not in_ci():
        pytest.skip(f"missing packages: {' '.join(missing)} (CI=true installs them)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing], check=True, env=env
    )


@pytest.fixture(scope="session")
def cluster_tools() -> None:
    ensure_tools(TOOLS)
    if not Path("/etc/ssh/ssh_host_ed25519_key").exists():
        subprocess.run(["ssh-keygen", "-A"], check=True)


@pytest.fixture
def code_dir(tmp_path: Path) -> Path:
    """A job's code directory holding the probe training script (probe_job.py)."""
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(Path(__file__).with_name("probe_job.py"), code / "probe_job.py")
    return code


@pytest.fixture
def make_cluster(cluster_tools: None, tmp_path: Path) -> Iterator[MakeCluster]:
    """make_cluster(hosts=2, **spec_fields) -> a cluster that is up; torn down and checked afterwards."""
    clusters: list[Cluster] = []

    def make(hosts: int = 2, **fields: object) -> Cluster:
        spec = ClusterSpec(hosts=hosts, workdir=tmp_path / f"cluster{len(clusters)}", **fields)  # type: ignore[arg-type]
        cluster = Cluster(spec)
        clusters.append(cluster)
        cluster.up()
        return cluster

    yield make
    for cluster in clusters:
        cluster.down()
        assert cluster.leftovers() == []


JOB_HOSTS = ("algo-1", "algo-2")


Prepare = Callable[[Cluster], Mapping[str, Mapping[str, str]] | None]


class Launch(Protocol):
    def __call__(
        self,
        mode: str,
        down: tuple[str, ...] = (),
        env: Mapping[str, Mapping[str, str]] | None = None,
        prepare: Prepare | None = None,
        **hyperparameters: object,
    ) -> tuple[Cluster, dict[str, HostProcess]]: ...


@pytest.fixture
def launch(cluster_tools: None, tmp_path: Path, code_dir: Path) -> Iterator[Launch]:
    """launch(mode, down=(), env={host: variables}, prepare=None, **hyperparameters) -> (cluster, {host:
    HostProcess}): `train` started on each of 2 hosts not in `down` (with that host's extra variables), the
    probe job (probe_job.py) in `mode`, SDK-encoded hyperparameters; `prepare(cluster)` runs first, once the
    cluster is up (it may return more variables by host). The cluster is torn down (and checked) after."""
    clusters: list[Cluster] = []

    def start(
        mode: str,
        down: tuple[str, ...] = (),
        env: Mapping[str, Mapping[str, str]] | None = None,
        prepare: Prepare | None = None,
        **hyperparameters: object,
    ) -> tuple[Cluster, dict[str, HostProcess]]:
        spec = ClusterSpec(
            hosts=len(JOB_HOSTS),
            workdir=tmp_path / "cluster",
            code_dir=code_dir,
            hyperparameters={"sagemaker_program": json.dumps("probe_job.py"), "mode": json.dumps(mode)}
            | {key: json.dumps(value) for key, value in hyperparameters.items()},
        )
        cluster = Cluster(spec)
        clusters.append(cluster)
        cluster.up()
        more = (prepare(cluster) if prepare else None) or {}
        exited = threading.Event()
        processes = {
            host: cluster.start(
                host,
                ["train"],
                env={**(env or {}).get(host, {}), **more.get(host, {})},
                exited=exited,
                end_host_on_exit=True,
            )
            for host in JOB_HOSTS
            if host not in down
        }
        return cluster, processes

    yield start
    for cluster in clusters:
        cluster.down()
        assert cluster.leftovers() == []


RANKS_TIMEOUT = 60.0  # train start -> the probe job's ranks running, on a loaded machine


def wait_ranks_running(cluster: Cluster, count: int = 2) -> None:
    """Until `count` ranks of the probe job wrote their record (they run)."""

    def running() -> bool | None:
        found = [
            path
            for host in JOB_HOSTS
            for path in (cluster.ml_dir(host) / "output" / "data").glob("rank-*.json")
        ]
        return True if len(found) >= count else None

    wait_for(running, f"{count} ranks of the probe job to run", RANKS_TIMEOUT)


# A local package whose build (its wheel) ignores SIGTERM, as a long native build can for a while, and takes
# `seconds`: pip's step takes STOP_GRACE to end. The build says it started in /opt/ml/output/building and when
# it ended in /opt/ml/output/built (time.time(); both seen from outside the host).
SLOW_BUILD = """
import pathlib, signal, sys, time
import setuptools
if "bdist_wheel" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    pathlib.Path("/opt/ml/output/building").touch()
    time.sleep({seconds})
    pathlib.Path("/opt/ml/output/built").write_text(repr(time.time()))
setuptools.setup(name="slowpkg", version="1.0", py_modules=[])
"""


def slow_build(cluster: Cluster, host: str, seconds: float = 300.0) -> dict[str, str]:
    """`host`'s requirements.txt is a local package whose build ignores SIGTERM and takes `seconds`; the
    variables that build it with the launcher's own setuptools (the hosts have no index to fetch one from)
    and install it under the host's own /opt/ml (never into the shared venv)."""
    package = cluster.ml_dir(host) / "code" / "slowpkg"
    package.mkdir()
    (package / "setup.py").write_text(SLOW_BUILD.format(seconds=seconds))
    (cluster.ml_dir(host) / "code" / "requirements.txt").write_text("--no-index\n./slowpkg\n")
    return {"PIP_NO_BUILD_ISOLATION": "0", "PIP_TARGET": "/opt/ml/output/site"}


def wait_building(cluster: Cluster, host: str) -> None:
    building = cluster.ml_dir(host) / "output" / "building"
    wait_for(lambda: building.exists() or None, f"{host}'s pip to build the slow package", 120)
