"""What SageMaker (and the SDK's local mode) does to every container, on a 2-host simulated cluster:
variables set in each host's own environment, MPI options copied from AWS examples, and an interface name
that the hosts do not have. Each test runs `train` on both hosts, as SageMaker does."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest

from smhvd_sim import Cluster, ClusterSpec
from smhvd_sim.jobs import HostProcess

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

HOSTS = ("algo-1", "algo-2")


class Launch(Protocol):
    def __call__(
        self,
        host_env: dict[str, dict[str, str]],
        interface: str = "eth0",
        **hyperparameters: object,
    ) -> tuple[Cluster, dict[str, HostProcess]]: ...


@pytest.fixture
def launch(cluster_tools: None, tmp_path: Path, code_dir: Path) -> Iterator[Launch]:
    clusters: list[Cluster] = []
    code = code_dir

    def start(
        host_env: dict[str, dict[str, str]], interface: str = "eth0", **hyperparameters: object
    ) -> tuple[Cluster, dict[str, HostProcess]]:
        spec = ClusterSpec(
            hosts=2,
            workdir=tmp_path / f"cluster{len(clusters)}",
            code_dir=code,
            hyperparameters={"sagemaker_program": json.dumps("probe_job.py")}
            | {key: json.dumps(value) for key, value in hyperparameters.items()},
        )
        cluster = Cluster(spec)
        clusters.append(cluster)
        cluster.up()
        for host in HOSTS:  # as SageMaker writes it, with the interface under test
            path = cluster.ml_dir(host) / "input" / "config" / "resourceconfig.json"
            path.write_text(json.dumps(json.loads(path.read_text()) | {"network_interface_name": interface}))
        exited = threading.Event()
        processes = {
            host: cluster.start(
                host, ["train"], env=host_env.get(host, {}), exited=exited, end_host_on_exit=True
            )
            for host in HOSTS
        }
        return cluster, processes

    yield start
    for cluster in clusters:
        cluster.down()
        assert cluster.leftovers() == []


def records(cluster: Cluster) -> dict[str, list[dict[str, object]]]:
    return {
        host: [
            json.loads(p.read_text()) for p in (cluster.ml_dir(host) / "output" / "data").glob("rank-*.json")
        ]
        for host in HOSTS
    }


def log_of(processes: dict[str, HostProcess], host: str) -> str:
    processes[host].finish_output()
    return processes[host].log.read_text()


def test_each_rank_gets_its_own_containers_environment_and_never_its_credentials(launch: Launch) -> None:
    # What SageMaker sets in every container (estimator environment=, endpoints), and a credential.
    host_env = {
        host: {
            "USER_FLAG": f"set-in-{host}",
            "AWS_ENDPOINT_URL_S3": f"http://s3.{host}.test",
            "AWS_SECRET_ACCESS_KEY": "must-not-reach-ranks",
        }
        for host in HOSTS
    }
    host_env["algo-2"]["ONLY_ON_WORKER"] = "worker-value"
    names = "USER_FLAG,AWS_ENDPOINT_URL_S3,AWS_SECRET_ACCESS_KEY,ONLY_ON_WORKER,SM_CURRENT_HOST"
    cluster, processes = launch(host_env, mode="ok", record=names, allreduce="true")
    codes = {host: process.wait(120) for host, process in processes.items()}
    assert codes == {"algo-1": 0, "algo-2": 0}, log_of(processes, "algo-1") + log_of(processes, "algo-2")
    seen = {host: [r["env"] for r in recs] for host, recs in records(cluster).items()}
    assert seen == {
        "algo-1": [
            {
                "USER_FLAG": "set-in-algo-1",
                "AWS_ENDPOINT_URL_S3": "http://s3.algo-1.test",
                "AWS_SECRET_ACCESS_KEY": None,
                "ONLY_ON_WORKER": None,
                "SM_CURRENT_HOST": "algo-1",
            }
        ],
        "algo-2": [
            {
                "USER_FLAG": "set-in-algo-2",
                "AWS_ENDPOINT_URL_S3": "http://s3.algo-2.test",
                "AWS_SECRET_ACCESS_KEY": None,
                "ONLY_ON_WORKER": "worker-value",
                "SM_CURRENT_HOST": "algo-2",
            }
        ],
    }


def test_an_interface_exclude_list_from_aws_examples_runs_instead_of_hanging(launch: Launch) -> None:
    started = time.monotonic()
    cluster, processes = launch(
        {}, mode="ok", allreduce="true", sagemaker_mpi_custom_mpi_options="--mca btl_tcp_if_exclude lo"
    )
    codes = {host: process.wait(120) for host, process in processes.items()}
    assert codes == {"algo-1": 0, "algo-2": 0}, log_of(processes, "algo-1")
    assert [r["allreduce"] for recs in records(cluster).values() for r in recs] == [3, 3]  # 1 + 2
    summary = json.loads((cluster.ml_dir("algo-1") / "output" / "data" / "job-summary.json").read_text())
    assert summary["ranks_per_host"] == {"algo-1": 1, "algo-2": 1}
    assert summary["host_exits"] == {"algo-1": 0, "algo-2": 0}
    assert time.monotonic() - started < 90
    leader_log = log_of(processes, "algo-1")
    assert "btl_tcp_if_exclude lo" in leader_log and "btl_tcp_if_include" not in leader_log


def test_an_interface_the_hosts_lack_falls_back_to_the_one_routing_to_the_peers(launch: Launch) -> None:
    # SDK v3 local mode writes "ethwe", which no container has.
    cluster, processes = launch(
        {}, interface="ethwe", mode="ok", allreduce="true", record="SM_NETWORK_INTERFACE_NAME"
    )
    codes = {host: process.wait(120) for host, process in processes.items()}
    assert codes == {"algo-1": 0, "algo-2": 0}, log_of(processes, "algo-1")
    assert {host: [r["env"] for r in recs] for host, recs in records(cluster).items()} == {
        host: [{"SM_NETWORK_INTERFACE_NAME": "eth0"}] for host in HOSTS
    }
    for host in HOSTS:
        assert "network_interface_name 'ethwe' is not an interface of this host; using eth0" in log_of(
            processes, host
        )


def test_ranks_that_cannot_reach_each_other_end_the_job_within_seconds(launch: Launch) -> None:
    # Both interface lists given by the user: Open MPI's TCP transport refuses to start, MPI aborts, and
    # mpirun itself then hangs (on SageMaker: until max_run). The launcher must end the job.
    started = time.monotonic()
    cluster, processes = launch(
        {},
        mode="ok",
        allreduce="true",
        sagemaker_mpi_custom_mpi_options="--mca btl_tcp_if_include eth0 --mca btl_tcp_if_exclude lo",
    )
    codes = {host: process.wait(180) for host, process in processes.items()}
    elapsed = time.monotonic() - started
    # Open MPI prints its notice, the ranks' MPI calls fail and smhvd.runscript ends them with exit 1. Whether
    # mpirun then exits by itself within the launcher's 5 s after the notice (exit 1, every run seen on a
    # quiet machine) or does not (the launcher ends it: exit 76) is Open MPI's timing and the machine's load,
    # not the launcher's choice, and nothing a test can fix from outside. Both ends are documented (README,
    # exit codes), so each is checked for its own meaning: the headline says the launcher ended mpirun
    # exactly when the code is 76. (The 76 path on its own, every time: test_documented_exits.py.)
    code = codes["algo-1"]
    assert code in (1, 76), log_of(processes, "algo-1")
    assert codes["algo-2"] == code  # the worker ends with the leader's verdict
    # The abort notice, then at most 5 s of grace and 3 s to SIGKILL: 150 s is far above any loaded
    # machine's cluster start and job, and far below the hang it guards against (until max_run).
    assert elapsed < 150
    for host in HOSTS:
        failure = (cluster.ml_dir(host) / "output" / "failure").read_text()
        headline = failure.splitlines()[0]
        assert headline.startswith(
            "MPI aborted the job: At least one pair of MPI processes are unable to reach each other for MPI "
            "communications"
        ), failure
        assert headline.endswith(" (mpirun hung after it; ended by the launcher)") == (code == 76), failure
        assert processes[host].result().left_running == ()
    # Evidence follows the headline, within SageMaker's 1024 characters (which lines of the interleaved
    # output of both hosts make the tail varies from run to run).
    assert len(failure) <= 1024 and len(failure.splitlines()) > 1
