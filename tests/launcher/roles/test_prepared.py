"""A job starts only when every host has prepared it (issue 53.1): `train` on a real 2-host simulated cluster,
black-box. A worker says when it has prepared (its code, its `pip install -r requirements.txt`, its EFA
probe), or why it could not; the leader starts the pre-flight and the job only then, says meanwhile whom it
waits for and what that host is doing, and at its bound names that host and its step in the failure file.

Before, a worker's link said ready from its start: with algo-2's install slower than the leader's, the job
(and the pre-flight) started while algo-2's pip still ran (the first test's rank 0 ran 7.6 s before algo-2's
build ended; the second's job started and failed 'rank 1 on algo-2 exited with code 69'); a worker whose pip
failed was only 'algo-2 ended before the job started (its link closed)', 69."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from smhvd_sim import Cluster
from smhvd_sim.jobs import HostProcess
from support.cluster import Launch, slow_build

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

HOSTS = ("algo-1", "algo-2")
BUILD_SECONDS = 8.0  # algo-2's install is this much slower than the leader's


def log_of(process: HostProcess) -> str:
    process.finish_output()
    return process.log.read_text()


def output(cluster: Cluster, host: str) -> Path:
    return cluster.ml_dir(host) / "output"


def test_the_job_starts_only_once_a_slower_worker_has_prepared(launch: Launch) -> None:
    cluster, processes = launch(
        "ok", prepare=lambda c: {"algo-2": slow_build(c, "algo-2", BUILD_SECONDS)}, sagemaker_preflight="fail"
    )
    codes = {host: process.wait(240) for host, process in processes.items()}
    leader = log_of(processes["algo-1"])
    assert codes == dict.fromkeys(HOSTS, 0), leader + log_of(processes["algo-2"])
    built = float((output(cluster, "algo-2") / "built").read_text())
    rank0 = output(cluster, "algo-1") / "data" / "rank-0.json"
    assert json.loads(rank0.read_text())["host"] == "algo-1"
    print(f"\nrank 0 started {rank0.stat().st_mtime - built:.2f} s after algo-2's build ended")
    assert rank0.stat().st_mtime > built  # the leader's rank waited for algo-2's install
    assert re.search(r"INFO waiting for .*algo-2.*: pip install -r requirements.txt", leader), leader


def test_a_worker_that_has_not_prepared_at_the_bound_is_named_with_its_step(launch: Launch) -> None:
    """algo-2's build never ends: the leader ends the job a little before the workers' own bound
    (launcher_leader_timeout_seconds 10: at 7.5 s), naming algo-2 and its step; algo-2 ends with that."""
    cluster, processes = launch(
        "ok", prepare=lambda c: {"algo-2": slow_build(c, "algo-2")}, launcher_leader_timeout_seconds=10
    )
    codes = {host: process.wait(240) for host, process in processes.items()}
    assert codes == dict.fromkeys(HOSTS, 69), log_of(processes["algo-1"]) + log_of(processes["algo-2"])
    reason = (output(cluster, "algo-1") / "failure").read_text().splitlines()[0]
    expected = "not every worker prepared the job within 7.5s (launcher_leader_timeout_seconds): algo-2: pip "
    assert reason.startswith(expected + "install -r requirements.txt, "), reason
    worker = (output(cluster, "algo-2") / "failure").read_text()
    assert worker.startswith(f"the leader algo-1 ended the job before it started (exit 69): {reason}")
    took = (processes["algo-1"].ended or 0.0) - processes["algo-1"].started
    print(f"\na worker not prepared: the leader exited after {took:.2f} s (exit 69)")
    assert all(process.result().left_running == () for process in processes.values())


def test_a_worker_whose_pip_fails_is_the_jobs_cause(launch: Launch) -> None:
    def workers_requirements(cluster: Cluster) -> None:
        (cluster.ml_dir("algo-2") / "code" / "requirements.txt").write_text("--no-index\nsmhvd-no-such-pkg\n")

    cluster, processes = launch("ok", prepare=workers_requirements)
    codes = {host: process.wait(240) for host, process in processes.items()}
    assert codes == dict.fromkeys(HOSTS, 70), log_of(processes["algo-1"]) + log_of(processes["algo-2"])
    reason = (output(cluster, "algo-1") / "failure").read_text().splitlines()[0]
    cause = "algo-2 could not prepare the job (exit 70): /opt/ml/code/requirements.txt: pip install failed"
    assert reason.startswith(cause + " (exit 1)"), reason
