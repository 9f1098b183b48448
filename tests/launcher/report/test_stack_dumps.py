"""Hung jobs: stack dumps of every rank on every host (py-spy), on a 2-host simulated cluster where rank 0
waits in an allreduce that rank 1 never joins. Triggers: no output for launcher_hang_dump_seconds, SIGUSR1
to the leader's `train`, and the stop (SIGTERM) that ends the job. A dump never ends a healthy job."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

from smhvd_sim import Cluster, ClusterSpec
from smhvd_sim.system import wait_for

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

JOB = Path(__file__).parents[2] / "support" / "deadlock_job.py"
HOSTS = ("algo-1", "algo-2")
WAITING = "rank 0 on algo-1 in _allreduce (horovod/tensorflow/mpi_ops.py:"
ELSEWHERE = "rank 1 on algo-2 in busy_elsewhere (deadlock_job.py:17)"


def summary_lines(cluster: Cluster) -> list[str]:
    path = cluster.ml_dir("algo-1") / "output" / "data" / "stacks" / "summary.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_dumps_name_the_allreduce_and_the_other_ranks_frame_on_every_trigger(
    cluster_tools: None, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    shutil.copy(JOB, code / "deadlock_job.py")
    spec = ClusterSpec(
        hosts=2,
        workdir=tmp_path / "cluster",
        code_dir=code,
        hyperparameters={
            "sagemaker_program": json.dumps("deadlock_job.py"),
            "launcher_hang_dump_seconds": json.dumps(4),
        },
    )
    cluster = Cluster(spec)
    cluster.up()
    try:
        exited = threading.Event()
        processes = {h: cluster.start(h, ["train"], exited=exited, end_host_on_exit=True) for h in HOSTS}

        # 1. Silence: both ranks printed their last line, then nothing for 4 s. (A silence while TensorFlow
        # loads may be dumped first: each silence after new output is dumped once.)
        def silent_in_deadlock() -> str | None:
            found = [line for line in summary_lines(cluster) if WAITING in line and ELSEWHERE in line]
            return found[0] if found else None

        first = wait_for(silent_in_deadlock, "a silence-triggered dump showing the deadlock", 120)
        assert first.startswith("stack dump (no output from any rank for 4s): "), first
        for host, rank in (("algo-1", 0), ("algo-2", 1)):  # each host's dump file, on that host
            text = (
                cluster.ml_dir(host) / "output" / "data" / "stacks" / f"{host}-rank{rank}.txt"
            ).read_text()
            assert ("_allreduce" if rank == 0 else "busy_elsewhere") in text

        # 2. On demand: SIGUSR1 to the leader's train. The job is not harmed.
        processes["algo-1"].send_signal(signal.SIGUSR1)
        on_demand = wait_for(
            lambda: next((x for x in summary_lines(cluster) if x.startswith("stack dump (SIGUSR1)")), None),
            "the SIGUSR1 stack dump",
            60,
        )
        assert WAITING in on_demand and ELSEWHERE in on_demand
        assert all(p.popen.poll() is None for p in processes.values())

        # 3. The stop: every host gets SIGTERM, as from SageMaker at max_run.
        stopped_at = time.monotonic()
        for process in processes.values():
            process.send_signal(signal.SIGTERM)
        codes = {h: p.wait(120) for h, p in processes.items()}
        assert codes == {"algo-1": 143, "algo-2": 143}
        assert time.monotonic() - stopped_at < 30
        failure = (cluster.ml_dir("algo-1") / "output" / "failure").read_text()
        first, dump = failure.splitlines()[:2]
        assert first.startswith("stopped by SIGTERM while the script ran"), failure
        assert dump.startswith("stack dump (stopped by SIGTERM): ") and WAITING in dump, failure
        assert all(p.result().left_running == () for p in processes.values())
    finally:
        cluster.down()
    assert cluster.leftovers() == []
