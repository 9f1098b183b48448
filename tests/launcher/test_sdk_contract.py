"""What the SageMaker Python SDK sets, honoured by `train` on one host (real mpirun, real ranks)."""

import json
import os

import pytest

pytestmark = pytest.mark.integration

QUIET = "import sys; print('script ran', file=sys.stderr)\n"


def _levels(stderr: str) -> set[str]:
    """Levels of the launcher's own log lines ("[smhvd HH:MM:SS] LEVEL message")."""
    return {
        line.split("] ", 1)[1].split(" ", 1)[0] for line in stderr.splitlines() if line.startswith("[smhvd ")
    }


@pytest.mark.parametrize(
    ("container_log_level", "env", "seen", "unseen"),
    [
        ("10", {}, {"DEBUG", "INFO"}, set()),  # logging.DEBUG from container_log_level=logging.DEBUG
        ("30", {}, set(), {"DEBUG", "INFO"}),
        ("10", {"SMHVD_LOG_LEVEL": "INFO"}, {"INFO"}, {"DEBUG"}),  # the launcher's own setting wins
    ],
)
def test_the_sdk_container_log_level_sets_the_launcher_log_level(
    train_job, container_log_level, env, seen, unseen
):
    job = train_job(QUIET, {"sagemaker_container_log_level": container_log_level})
    result = job.run(env={"SMHVD_LOG_LEVEL": "", **env})
    assert result.returncode == 0, result.stderr
    assert "script ran" in result.stderr
    levels = _levels(result.stderr)
    assert seen <= levels and not (unseen & levels), result.stderr


FI_INFO_EFA = """#!/bin/sh
# Stand-in for libfabric's fi_info on a machine with an EFA device (none exists here).
cat <<'OUT'
---
fi_info:
    caps: [ FI_MSG, FI_RMA, FI_TAGGED, FI_RECV, FI_SEND, FI_READ, FI_REMOTE_READ ]
    fabric_attr:
        prov_name: efa
OUT
"""
RECORD_FI = """
import json, os
keys = ("FI_PROVIDER", "FI_EFA_USE_DEVICE_RDMA", "FI_EFA_FORK_SAFE")
path = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "fi.json")
open(path, "w").write(json.dumps({k: os.environ.get(k) for k in keys}))
"""


@pytest.fixture
def fi_info_on_path(tmp_path):
    """A PATH whose fi_info reports an EFA provider with RDMA read (a stand-in: no EFA device here)."""
    bin_dir = tmp_path / "fi-bin"
    bin_dir.mkdir()
    (bin_dir / "fi_info").write_text(FI_INFO_EFA)
    (bin_dir / "fi_info").chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


def test_efa_found_on_the_machine_reaches_the_ranks_and_user_values_win(train_job, fi_info_on_path):
    job = train_job(RECORD_FI)
    result = job.run(env={"PATH": fi_info_on_path, "FI_EFA_FORK_SAFE": "0"})
    assert result.returncode == 0, result.stderr
    seen = json.loads((job.paths.output_data_dir / "fi.json").read_text())
    assert seen == {"FI_PROVIDER": "efa", "FI_EFA_USE_DEVICE_RDMA": None, "FI_EFA_FORK_SAFE": "0"}
    line = "EFA: libfabric's efa provider answers; ranks get FI_PROVIDER=efa OMPI_MCA_mtl=ofi OMPI_MCA_pml=cm"
    assert line in result.stderr


def test_an_efa_instance_type_without_efa_is_warned_about(train_job):
    job = train_job(RECORD_FI, instance_type="ml.p4d.24xlarge")
    result = job.run(env={"PATH": "/usr/bin:/bin:" + os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    assert json.loads((job.paths.output_data_dir / "fi.json").read_text())["FI_PROVIDER"] is None
    assert "WARNING EFA: ml.p4d.24xlarge has EFA but none is usable here (fi_info not found" in result.stderr


HOROVOD_STEPS = """
import horovod.tensorflow as hvd
import tensorflow as tf
hvd.init()
for step in range(20):
    hvd.allreduce(tf.constant([float(hvd.rank())] * 1000), name=f"t{step % 3}")
"""


def test_every_job_ends_with_a_summary_on_stderr_and_in_output_data(train_job):
    job = train_job(HOROVOD_STEPS, {"sagemaker_mpi_num_of_processes_per_host": 2, "horovod_timeline": "true"})
    result = job.run()
    assert result.returncode == 0, result.stderr
    summary = json.loads((job.paths.output_data_dir / "job-summary.json").read_text())
    assert summary["hosts"] == ["algo-1"] and summary["ranks"] == 2
    assert summary["ranks_per_host"] == {"algo-1": 2}  # from each rank's own start report
    assert 0 < summary["first_rank_seconds"] < summary["wall_seconds"]
    assert summary["exit_code"] == 0 and summary["host_exits"] == {"algo-1": 0} and summary["failure"] is None
    assert 0 < summary["horovod_op_share"] <= 1  # measured from the real Horovod timeline
    assert "job summary: exit 0; 2 rank(s) on 1 host(s) (algo-1:2)" in result.stderr
    assert "@@smhvd-rank-start@@" not in result.stderr  # markers are consumed, not shown


def test_a_failed_jobs_summary_names_the_failure(train_job):
    job = train_job("import sys; sys.exit(4)")
    result = job.run()
    assert result.returncode == 4
    summary = json.loads((job.paths.output_data_dir / "job-summary.json").read_text())
    assert summary["exit_code"] == 4
    assert summary["failure"] == "rank 0 on algo-1 exited with code 4" == job.failure().splitlines()[0]
