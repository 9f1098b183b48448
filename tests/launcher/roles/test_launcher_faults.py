"""The launcher (`train`) on a real 2-host simulated cluster, as SageMaker runs it: success, a rank crash
on a worker, a worker that never comes up, the leader killed mid-job, and SIGTERM to every host (how
SageMaker stops a job). Each test bounds how long hosts take to exit with a bound only a hang (or the wait
the test guards against) crosses, not a slow machine: how fast they exit is benchmarks/cluster_faults.py's.
Lower bounds assert that the launcher waited as long as it was told to."""

from __future__ import annotations

import json
import signal
import time

import pytest

from smhvd_sim.jobs import HostProcess
from support.cluster import JOB_HOSTS, Launch, wait_ranks_running

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

HOSTS = JOB_HOSTS


def wait_all(processes: dict[str, HostProcess], timeout: float) -> dict[str, int]:
    return {host: process.wait(timeout) for host, process in processes.items()}


def log_of(processes: dict[str, HostProcess], host: str) -> str:
    processes[host].finish_output()
    return processes[host].log.read_text()


def test_job_succeeds_with_ranks_on_both_hosts_each_seeing_its_own_host(launch: Launch) -> None:
    cluster, processes = launch("ok")
    codes = wait_all(processes, 120)
    assert codes == {"algo-1": 0, "algo-2": 0}, log_of(processes, "algo-1")
    records = {
        host: [
            json.loads(p.read_text()) for p in (cluster.ml_dir(host) / "output" / "data").glob("rank-*.json")
        ]
        for host in HOSTS
    }
    assert {host: [(r["host"], r["sm_current_host"]) for r in recs] for host, recs in records.items()} == {
        "algo-1": [("algo-1", "algo-1")],
        "algo-2": [("algo-2", "algo-2")],
    }
    # every rank's lines reach the leader's log whole, tagged with its rank and host
    leader_log = log_of(processes, "algo-1")
    assert "[0,algo-1]<stdout>: rank 0 running on algo-1\n" in leader_log
    assert "[1,algo-2]<stdout>: rank 1 running on algo-2\n" in leader_log
    # The worker ends with the job: its exit 0 can only come from the leader's verdict over the link (a lost
    # link or a silent leader is a failure), and it does not linger after it (the toolkit's worker sleeps 30
    # s; the bound only catches such a wait, a loaded machine stays far below it).
    assert processes["algo-2"].ended is not None
    assert processes["algo-1"].ended is not None
    assert processes["algo-2"].ended - processes["algo-1"].ended < 25.0
    assert all(process.result().left_running == () for process in processes.values())
    # The leader's check of the worker's sshd port is not an error in the worker's log (sshd logs a
    # connection closed before the client said who it is: "kex_exchange_identification: ...").
    assert "Connection closed" not in log_of(processes, "algo-2"), log_of(processes, "algo-2")


def test_rank_crash_on_worker_fails_every_host_and_names_it(launch: Launch) -> None:
    cluster, processes = launch("crash", crash_host="algo-2")
    started = time.time()
    codes = wait_all(processes, 240)
    last_exit = max(process.ended or 0.0 for process in processes.values())
    assert codes["algo-1"] != 0
    assert codes["algo-2"] != 0
    assert last_exit - started < 150  # the other rank would run for 300 s
    failure = (cluster.ml_dir("algo-1") / "output" / "failure").read_text()
    assert "rank 1 on algo-2 exited with code 3" in failure
    assert "probe-crash-marker: rank 1 on algo-2 gives up" in failure
    assert all(process.result().left_running == () for process in processes.values())


@pytest.mark.parametrize(("crash_host", "rank"), [("algo-1", 0), ("algo-2", 1)])
def test_a_rank_raising_after_mpi_init_ends_the_job_on_every_host(
    launch: Launch, crash_host: str, rank: int
) -> None:
    """The other rank waits in a barrier and the raising one would wait in MPI_Finalize: without
    smhvd.runscript the job hangs until max_run."""
    cluster, processes = launch("raise", crash_host=crash_host)
    started = time.time()
    codes = wait_all(processes, 150)
    assert codes == {"algo-1": 1, "algo-2": 1}, log_of(processes, "algo-1")
    assert max(process.ended or 0.0 for process in processes.values()) - started < 120  # hung: until max_run
    failure = (cluster.ml_dir("algo-1") / "output" / "failure").read_text()
    assert failure.startswith(f"rank {rank} on {crash_host} exited with code 1\n"), failure
    assert failure.rstrip().endswith(f"ValueError: probe-raise-marker: rank {rank} on {crash_host}")
    assert "runpy" not in failure  # the script's own traceback, as `python script.py` prints it
    assert all(process.result().left_running == () for process in processes.values())


def test_worker_never_up_fails_the_leader_within_its_timeout(launch: Launch) -> None:
    cluster, processes = launch("ok", down=("algo-2",), launcher_peer_timeout_seconds=5)
    codes = wait_all(processes, 240)
    assert codes["algo-1"] != 0
    # From just before `train` was started (the test's own clock could be read after its wait began): it
    # waited the 5 s it was told, and not the default 600 s (launcher_peer_timeout_seconds).
    elapsed = (processes["algo-1"].ended or 0.0) - processes["algo-1"].started
    assert 5.0 <= elapsed < 120.0
    failure = (cluster.ml_dir("algo-1") / "output" / "failure").read_text()
    assert "algo-2" in failure
    assert not list((cluster.ml_dir("algo-1") / "output" / "data").glob("rank-*.json"))  # no rank started


def test_leader_killed_mid_job_ends_the_workers(launch: Launch) -> None:
    cluster, processes = launch("sleep")
    wait_ranks_running(cluster)
    killed_at = time.time()
    cluster.host("algo-1").kill_processes(signal.SIGKILL)
    code = processes["algo-2"].wait(120)
    assert code != 0
    # The closed link at once, or else the leader's silence (10 s) or ssh's keepalive (15 s): a worker that
    # noticed none of them would wait until max_run. 60 s is 4 times the latest of them.
    assert (processes["algo-2"].ended or 0.0) - killed_at < 60.0
    failure = (cluster.ml_dir("algo-2") / "output" / "failure").read_text()
    assert "algo-1" in failure
    assert processes["algo-2"].result().left_running == ()


def test_sigterm_to_every_host_reaches_the_ranks_and_everything_exits(launch: Launch) -> None:
    cluster, processes = launch("sleep")
    wait_ranks_running(cluster)
    stopped_at = time.time()
    for process in processes.values():
        process.send_signal(signal.SIGTERM)
    wait_all(processes, 150)
    # Within SageMaker's 120 s between SIGTERM and SIGKILL, with room to spare: the ranks would sleep 300 s
    # and a worker without the leader's verdict waits 110 s (STOP_GRACE) before it gives up.
    assert max(process.ended or 0.0 for process in processes.values()) - stopped_at < 100.0
    for host, rank in (("algo-1", 0), ("algo-2", 1)):
        checkpoint = cluster.ml_dir(host) / "checkpoints" / f"rank-{rank}"
        assert checkpoint.read_text().startswith(f"rank {rank} on {host} stopped")
        assert processes[host].result().left_running == ()
