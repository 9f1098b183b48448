"""Many simulated hosts: the simulator brings them up together and takes them down without a trace, and the
launcher's job runs on 16 of them (one shared cluster: started, every rank on its own host, a crash on the
last host ending every host, torn down and checked). Ranks are plain mpi4py (tests/support/probe_job.py),
not TensorFlow: what is tested is the launch, not the framework. How long each part takes is measured by
`make bench-scale`, not asserted here; the bounds below only catch a hang."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from smhvd.proc import processes
from smhvd_sim import Cluster, ClusterError, ClusterSpec
from smhvd_sim.host import HostLayout, SimHost
from smhvd_sim.spec import MAX_HOSTS, host_addresses
from smhvd_sim.system import wait_for
from support.ci import unavailable
from support.cluster import MakeCluster

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

JOB_HOSTS = 16
# Each host connects to the next one's TCP port 9, where nothing listens: "connection refused" can only come
# from the peer's own kernel, so it proves the path over the bridge (an unreachable peer times out).
RING_CHECK = """
import socket, sys
me = socket.gethostname()
peer = f"algo-{int(me.split('-')[1]) % int(sys.argv[1]) + 1}"
try:
    socket.create_connection((peer, 9), timeout=5)
except ConnectionRefusedError:
    print(f"{me} reached {peer}")
    sys.exit(0)
except OSError as exc:
    print(f"{me} cannot reach {peer}: {exc}")
sys.exit(1)
"""


def test_the_largest_cluster_comes_up_every_host_reaches_the_next_and_nothing_is_left(
    cluster_tools: None, tmp_path: Path
) -> None:
    cluster = Cluster(ClusterSpec(hosts=MAX_HOSTS, workdir=tmp_path))
    with cluster:
        names = cluster.spec.host_names
        assert len({host.net_namespace for host in cluster.hosts.values()}) == MAX_HOSTS
        results = cluster.run([sys.executable, "-c", RING_CHECK, str(MAX_HOSTS)], timeout=120)
        logs = {host: result.log.read_text().strip() for host, result in results.items()}
        assert {host: result.exit_code for host, result in results.items()} == dict.fromkeys(names, 0), logs
        assert logs["algo-64"] == "algo-64 reached algo-1"
        host_pids = [host.init_pid for host in cluster.hosts.values()]
    assert cluster.leftovers() == []
    assert not any(processes.is_alive(pid) for pid in host_pids)


def test_a_host_that_fails_its_setup_takes_every_host_started_with_it_down(
    cluster_tools: None, tmp_path: Path
) -> None:
    def layout(name: str, broken: bool) -> HostLayout:
        source = tmp_path / ("missing" if broken else "hosts")
        return HostLayout(hostname=name, binds=((source, Path("/etc/hosts")),), tmpfs=(), dirs=())

    (tmp_path / "hosts").write_text("127.0.0.1\tlocalhost\n")
    plans = [
        (address, layout(address.name, broken=address.name == "algo-3"), tmp_path / f"{address.name}.json")
        for address in host_addresses(4, "test01", 1)
    ]
    with pytest.raises(
        ClusterError, match="algo-3: host setup failed: mount --bind .*/missing .*does not exist"
    ):
        SimHost.start_many(plans)
    started = [
        pid
        for pid in list(processes.read_process_table())
        if str(tmp_path) in " ".join(processes.cmdline(pid))
    ]
    assert started == []


def test_each_host_counts_the_cpu_of_what_runs_on_it_and_only_that(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    if not cluster.cpu_seconds():
        unavailable("no cgroup v2 hierarchy here: the cluster runs without CPU accounting")
    before = cluster.cpu_seconds()
    # The work is done by a daemon the command leaves behind (as orted is): it still counts for its host. It
    # burns 0.5 s of its own CPU time, whatever the machine's speed.
    busy = (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n"
        "    while time.process_time() < 0.5:\n        sum(range(10_000))\n    os._exit(0)\n"
    )
    code, out = cluster.exec("algo-2", [sys.executable, "-c", busy])
    assert code == 0, out
    wait_for(lambda: None if cluster.host("algo-2").processes() else True, "the daemon on algo-2 to end", 60)
    after = cluster.cpu_seconds()
    used = {host: after[host] - before[host] for host in after}
    assert used["algo-2"] >= 0.45
    assert used["algo-1"] < 0.05


# ----- the launcher's job on 16 hosts -----
@pytest.fixture(scope="module")
def job_cluster(cluster_tools: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One 16-host cluster for the module's jobs; torn down and checked at the end."""
    workdir = tmp_path_factory.mktemp("scale")
    code = workdir / "code"
    code.mkdir()
    shutil.copy(Path(__file__).parents[1] / "support" / "probe_job.py", code / "probe_job.py")
    cluster = Cluster(ClusterSpec(hosts=JOB_HOSTS, workdir=workdir / "cluster", code_dir=code))
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()
    assert cluster.leftovers() == []


def run_job(cluster: Cluster, **hyperparameters: str) -> dict[str, int | None]:
    """`train` on every host at once with the probe job; each host's exit code."""
    for host in cluster.spec.host_names:
        shutil.rmtree(cluster.ml_dir(host) / "output", ignore_errors=True)
        (cluster.ml_dir(host) / "output" / "data").mkdir(parents=True)
        path = cluster.ml_dir(host) / "input" / "config" / "hyperparameters.json"
        config = {
            "sagemaker_program": json.dumps("probe_job.py"),
            "sagemaker_mpi_enabled": "true",
            **{key: json.dumps(value) for key, value in hyperparameters.items()},
        }
        path.write_text(json.dumps(config))
    results = cluster.run(["train"], timeout=240, grace=5.0)
    assert all(result.left_running == () for result in results.values())
    return {host: result.exit_code for host, result in results.items()}


def test_a_job_on_16_hosts_runs_one_rank_on_each_host(job_cluster: Cluster) -> None:
    exits = run_job(job_cluster, mode="ok", allreduce="true")
    names = job_cluster.spec.host_names
    assert exits == dict.fromkeys(names, 0), (job_cluster.host_dir("algo-1") / "train.log").read_text()[
        -3000:
    ]
    records = [
        json.loads(path.read_text())
        for host in names
        for path in (job_cluster.ml_dir(host) / "output" / "data").glob("rank-*.json")
    ]
    assert sorted(record["rank"] for record in records) == list(range(JOB_HOSTS))
    assert sorted((record["host"], record["sm_current_host"]) for record in records) == sorted(
        (host, host) for host in names
    )
    assert {record["allreduce"] for record in records} == {JOB_HOSTS * (JOB_HOSTS + 1) // 2}


def test_a_crash_on_the_last_of_16_hosts_ends_every_host_and_names_it(job_cluster: Cluster) -> None:
    last = f"algo-{JOB_HOSTS}"
    exits = run_job(job_cluster, mode="crash", crash_host=last)  # the other ranks would sleep 300 s
    assert exits == dict.fromkeys(job_cluster.spec.host_names, 3)
    failure = (job_cluster.ml_dir("algo-1") / "output" / "failure").read_text()
    assert f"on {last} exited with code 3" in failure
    assert "probe-crash-marker: rank" in failure
