"""In-flight through `train` on a real 2-host simulated cluster (docs/inflight.md): the host that slows every
step is named while it happens, with its cause, and no other host; it gets its end line when it recovers;
nothing is named before the slowdown. Horovod's Keras MNIST example measured with no code (a CPU quota on
algo-2's processes from the middle of the job), and an mpi4py loop through `inflight.step()` (its ranks on
algo-2 wait for data for a while)."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pytest

from smhvd_sim import Cluster
from smhvd_sim.jobs import HostProcess
from smhvd_sim.system import wait_for
from smhvd_sim.throttle import throttled
from support.cluster import JOB_HOSTS, MakeCluster

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

MNIST = Path(__file__).resolve().parents[3] / "examples" / "mnist"
NAMED = re.compile(r"\[smhvd (\d\d:\d\d:\d\d)\] WARNING in-flight: (\S+) slows every step: (.*)")
JOB_TIMEOUT = 420.0


def summary(cluster: Cluster) -> dict[str, object]:
    path = cluster.ml_dir("algo-1") / "output" / "data" / "job-summary.json"
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return {}


def judged_steps(cluster: Cluster) -> int:
    found = summary(cluster)
    inflight = found.get("inflight") if found.get("running") else None
    return int(inflight.get("steps", 0)) if isinstance(inflight, dict) else 0


def start(cluster: Cluster) -> dict[str, HostProcess]:
    return {host: cluster.start(host, ["train"], end_host_on_exit=True) for host in JOB_HOSTS}


def named_lines(process: HostProcess) -> list[str]:
    return [line for line in process.log.read_text(errors="replace").splitlines() if NAMED.search(line)]


def test_a_host_given_a_cpu_quota_mid_job_is_named_with_its_cause_and_its_recovery_is_said(
    make_cluster: MakeCluster,
) -> None:
    hyperparameters = {
        "sagemaker_program": json.dumps("train_mnist.py"),
        "sagemaker_mpi_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": "1",
        # 1800 steps: on a quiet machine about 80 a second, so that after the mid-run summary (every 10 s)
        # shows the first steps and the throttle has done its work, steps are left for the recovery line
        "epochs": "12",
        "steps_per_epoch": "150",
    }
    cluster = make_cluster(2, code_dir=MNIST, hyperparameters=hyperparameters)
    processes = start(cluster)
    leader = processes["algo-1"]
    wait_for(lambda: True if judged_steps(cluster) >= 100 else None, "100 judged steps", 240)
    assert named_lines(leader) == []  # healthy so far: nobody named
    with throttled(f"test-{cluster.spec.workdir.name}") as throttle:
        slowed_at = time.monotonic()
        assert throttle.apply(cluster.host("algo-2").processes(), 0.1) > 0
        wait_for(lambda: named_lines(leader) or None, "algo-2 named", 90)
        named_after = time.monotonic() - slowed_at
    (line,) = named_lines(leader)
    host, text = NAMED.search(line).group(2, 3)  # type: ignore[union-attr]
    assert host == "algo-2"
    assert named_after < 60
    assert re.match(
        r"its ranks reach the allreduce \d+\.\d\d s after the others \(median of \d+ steps; ", text
    )
    assert "algo-2: CPU throttled " in text and "(its cgroup's CPU quota)" in text
    assert {h: p.wait(JOB_TIMEOUT) for h, p in processes.items()} == dict.fromkeys(JOB_HOSTS, 0)
    log = leader.log.read_text(errors="replace")
    assert "INFO in-flight: algo-2 no longer slows the steps" in log
    assert named_lines(leader) == [line]  # one line when it starts, never a flood
    final = summary(cluster)
    assert "running" not in final
    inflight = final["inflight"]
    assert isinstance(inflight, dict)
    assert [(e["host"], e["until_seconds"] is not None) for e in inflight["named"]] == [("algo-2", True)]
    assert inflight["hosts"]["algo-2"]["signals"]["throttled"] > 0
    assert processes["algo-2"].log.read_text(errors="replace").count("in-flight") == 0  # the leader's alone


def test_an_mpi4py_loop_that_calls_inflight_step_names_the_host_whose_data_is_late(
    make_cluster: MakeCluster, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(Path(__file__).resolve().parents[2] / "support" / "stepping_job.py", code)
    arguments = {"steps": 700, "compute": 0.05, "slow-from": 250, "slow-until": 450, "slow-host": "algo-2"}
    hyperparameters = {
        "sagemaker_program": json.dumps("stepping_job.py"),
        "sagemaker_mpi_enabled": "true",
        "slow-extra": "0.15",
        **{key: json.dumps(str(value)) for key, value in arguments.items()},
    }
    cluster = make_cluster(2, code_dir=code, hyperparameters=hyperparameters)
    processes = start(cluster)
    assert {h: p.wait(JOB_TIMEOUT) for h, p in processes.items()} == dict.fromkeys(JOB_HOSTS, 0)
    log = processes["algo-1"].log.read_text(errors="replace")
    assert "stepping_job: 700 steps" in log
    (line,) = named_lines(processes["algo-1"])
    host, text = NAMED.search(line).group(2, 3)  # type: ignore[union-attr]
    assert host == "algo-2"
    assert text.startswith("its ranks reach the step's collective 0.1")
    assert "INFO in-flight: algo-2 no longer slows the steps" in log
    named = summary(cluster)["inflight"]["named"]  # type: ignore[index]
    assert [e["host"] for e in named] == ["algo-2"]
    # named while it happened: after the slow steps began (250 x ~0.05 s in), before they ended
    assert named[0]["since_seconds"] < named[0]["until_seconds"]
