"""What docs/multi-host.md and docs/configuration.md promise on a real 2-host simulated cluster and no other
test reaches: a worker whose leader's host vanishes (no word, no closed connection: the heartbeat's silence
limit), a worker whose leader never starts the job (exit 69), and the variables that reach the ranks on other
hosts (launcher_forward_env, launcher_forward_aws_credentials)."""

from __future__ import annotations

import json

import pytest

from smhvd_sim import Cluster
from support.cluster import JOB_HOSTS, Launch, wait_ranks_running

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

EX_UNAVAILABLE = 69  # README: the leader never started the job, or was lost


def test_a_leader_whose_host_vanishes_is_given_up_after_its_silence(launch: Launch) -> None:
    """The leader's network is cut mid-job (as a host that loses power: no FIN, no RST): the worker hears
    nothing more and gives up after the heartbeat's silence limit, naming the leader."""
    cluster, processes = launch("sleep")
    wait_ranks_running(cluster)
    cluster.host("algo-1").set_link(up=False)
    assert processes["algo-2"].wait(120) == EX_UNAVAILABLE
    failure = (cluster.ml_dir("algo-2") / "output" / "failure").read_text()
    assert failure.startswith("lost the leader algo-1 during the job: no word from it for "), failure
    assert "(leader host down or unreachable)" in failure
    assert processes["algo-2"].result().left_running == ()


def test_a_leader_that_never_starts_the_job_ends_the_worker_with_69(launch: Launch) -> None:
    cluster, processes = launch("ok", down=("algo-1",), launcher_leader_timeout_seconds=3)
    assert processes["algo-2"].wait(120) == EX_UNAVAILABLE
    failure = (cluster.ml_dir("algo-2") / "output" / "failure").read_text()
    assert failure == "the leader algo-1 did not start the job within 3s (launcher_leader_timeout_seconds)"
    assert not list((cluster.ml_dir("algo-2") / "output" / "data").glob("rank-*.json"))  # no rank ran


def recorded(cluster: Cluster) -> dict[str, dict[str, str | None]]:
    """Each rank's recorded variables, by host (one rank per host)."""
    found = {}
    for host in JOB_HOSTS:
        (record,) = (cluster.ml_dir(host) / "output" / "data").glob("rank-*.json")
        found[host] = json.loads(record.read_text())["env"]
    return found


LEADER_ONLY = {"MYAPP_MODE": "fast", "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret"}
RECORD = "MYAPP_MODE,AWS_ACCESS_KEY_ID,AWS_SECRET_ACCESS_KEY"


@pytest.mark.parametrize("forward", [False, True], ids=["default", "forwarded"])
def test_variables_reach_the_ranks_on_other_hosts_only_as_configured(launch: Launch, forward: bool) -> None:
    """Variables set in the leader's container only. By default a variable outside the allow-list stays on
    its host and credentials reach no rank; with launcher_forward_env (a PREFIX* pattern) and
    launcher_forward_aws_credentials=true they reach every rank, the worker's too."""
    options: dict[str, object] = (
        {"launcher_forward_env": "MYAPP_*", "launcher_forward_aws_credentials": True} if forward else {}
    )
    cluster, processes = launch("ok", env={"algo-1": LEADER_ONLY}, record=RECORD, **options)
    assert {host: process.wait(120) for host, process in processes.items()} == {"algo-1": 0, "algo-2": 0}
    if forward:
        assert recorded(cluster) == dict.fromkeys(JOB_HOSTS, LEADER_ONLY)
    else:
        none = dict.fromkeys(LEADER_ONLY)
        assert recorded(cluster) == {"algo-1": none | {"MYAPP_MODE": "fast"}, "algo-2": none}
