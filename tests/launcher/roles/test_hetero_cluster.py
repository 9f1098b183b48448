"""A heterogeneous cluster on 3 simulated hosts: instance group "gpu" (algo-1, algo-2) runs the MPI job, group
"data" (algo-3) runs the script once, as the sagemaker-training toolkit does, and ends with the job."""

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
from smhvd_sim.system import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

HOSTS = ("algo-1", "algo-2", "algo-3")
GROUPS = {"gpu": ["algo-2", "algo-1"], "data": ["algo-3"]}  # unsorted, as SageMaker lists them


class Launch(Protocol):
    def __call__(self, **hyperparameters: object) -> tuple[Cluster, dict[str, HostProcess]]: ...


@pytest.fixture
def launch(cluster_tools: None, tmp_path: Path, code_dir: Path) -> Iterator[Launch]:
    clusters: list[Cluster] = []
    code = code_dir

    def start(**hyperparameters: object) -> tuple[Cluster, dict[str, HostProcess]]:
        hps = {"sagemaker_program": "probe_job.py", "sagemaker_distribution_instance_groups": ["gpu"]}
        spec = ClusterSpec(
            hosts=3,
            workdir=tmp_path / f"cluster{len(clusters)}",
            code_dir=code,
            hyperparameters={k: json.dumps(v) for k, v in (hps | hyperparameters).items()},
        )
        cluster = Cluster(spec)
        clusters.append(cluster)
        cluster.up()
        for host in HOSTS:
            path = cluster.ml_dir(host) / "input" / "config" / "resourceconfig.json"
            config = json.loads(path.read_text())
            config["current_group_name"] = next(name for name, hosts in GROUPS.items() if host in hosts)
            config["instance_groups"] = [
                {"instance_group_name": name, "instance_type": "ml.c5.xlarge", "hosts": hosts}
                for name, hosts in GROUPS.items()
            ]
            path.write_text(json.dumps(config))
        exited = threading.Event()
        processes = {
            host: cluster.start(host, ["train"], exited=exited, end_host_on_exit=True) for host in HOSTS
        }
        return cluster, processes

    yield start
    for cluster in clusters:
        cluster.down()
        assert cluster.leftovers() == []


def data_dir(cluster: Cluster, host: str) -> Path:
    return cluster.ml_dir(host) / "output" / "data"


def log_of(processes: dict[str, HostProcess], host: str) -> str:
    processes[host].finish_output()
    return processes[host].log.read_text()


def test_mpi_runs_on_the_distribution_group_and_the_other_host_runs_the_script_once(launch: Launch) -> None:
    # The data host's script would run 120 s: it is stopped when the MPI job ends.
    cluster, processes = launch(
        mode="ok", allreduce="true", outside_seconds=120, record="SM_CURRENT_INSTANCE_GROUP"
    )
    started = time.monotonic()
    codes = {host: process.wait(120) for host, process in processes.items()}
    assert codes == {"algo-1": 0, "algo-2": 0, "algo-3": 0}, log_of(processes, "algo-1") + log_of(
        processes, "algo-3"
    )
    assert time.monotonic() - started < 60
    ranks = {host: sorted(p.name for p in data_dir(cluster, host).glob("rank-*.json")) for host in HOSTS}
    assert ranks == {"algo-1": ["rank-0.json"], "algo-2": ["rank-1.json"], "algo-3": []}
    assert [
        json.loads(p.read_text())["allreduce"] for h in HOSTS for p in data_dir(cluster, h).glob("rank-*")
    ] == [
        3,
        3,
    ]
    outside = json.loads((data_dir(cluster, "algo-3") / "outside.json").read_text())
    assert outside["env"] == {"SM_CURRENT_INSTANCE_GROUP": "data"}
    assert "the job ended: stopping the script on algo-3" in log_of(processes, "algo-3")
    assert (cluster.ml_dir("algo-3") / "checkpoints" / "rank--1").exists()  # it got SIGTERM, not SIGKILL
    summary = json.loads((data_dir(cluster, "algo-1") / "job-summary.json").read_text())
    assert summary["hosts"] == ["algo-1", "algo-2"]
    assert summary["host_exits"] == {"algo-1": 0, "algo-2": 0, "algo-3": 0}


def test_a_rank_crash_ends_every_host_including_the_one_outside_mpi(launch: Launch) -> None:
    cluster, processes = launch(mode="crash", crash_host="algo-2", outside_seconds=300)
    started = time.monotonic()
    codes = {host: process.wait(120) for host, process in processes.items()}
    assert codes == {"algo-1": 3, "algo-2": 3, "algo-3": 3}, log_of(processes, "algo-1")
    assert time.monotonic() - started < 60
    for host in HOSTS:
        failure = (cluster.ml_dir(host) / "output" / "failure").read_text()
        assert failure.startswith("rank 1 on algo-2 exited with code 3")
        assert processes[host].result().left_running == ()


def test_a_failing_script_outside_mpi_fails_its_host_at_once(launch: Launch) -> None:
    # It fails once the job runs (like every host, a host outside MPI must be up when the job starts: the
    # leader links to it first).
    cluster, processes = launch(mode="sleep", seconds=300, outside_seconds=8, outside_exit=5)
    code = processes["algo-3"].wait(90)
    assert code == 5
    failure = (cluster.ml_dir("algo-3") / "output" / "failure").read_text()
    assert failure == "the script on algo-3 (outside the MPI instance groups) exited with code 5"
    mpi_hosts = ("algo-1", "algo-2")
    wait_for(
        lambda: all(list(data_dir(cluster, h).glob("rank-*.json")) for h in mpi_hosts) or None,
        "both MPI ranks to run",
        60,
    )
    assert all(processes[h].popen.poll() is None for h in mpi_hosts)  # the MPI job goes on until stopped
    processes["algo-1"].send_signal(15)  # a stop that reaches only the leader stops every host's ranks
    assert {h: processes[h].wait(60) for h in mpi_hosts} == {"algo-1": 143, "algo-2": 143}
