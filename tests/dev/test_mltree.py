"""The one /opt/ml tree writer: what the launcher reads back, and its command line (bin/local-train.sh)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from smhvd.config.job import load_job
from smhvd.config.paths import SageMakerPaths
from smhvd_dev.mltree import write_ml_tree

REPO = Path(__file__).resolve().parents[2]


def test_the_launcher_reads_back_what_the_writer_wrote(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    paths = write_ml_tree(
        tmp_path / "ml",
        current_host="algo-2",
        hosts=("algo-1", "algo-2"),
        hyperparameters={"sagemaker_program": "train.py", "epochs": 2},
        channels={"train": data, "test": None},
    )
    job = load_job(paths)
    assert job.resources.current_host == "algo-2"
    assert job.resources.hosts == ("algo-1", "algo-2")
    assert job.user_hyperparameters == {"epochs": 2}
    assert {channel.name for channel in job.channels} == {"train", "test"}
    assert paths.channel_dir("train").resolve() == data.resolve()
    assert paths.channel_dir("test").is_dir()


@pytest.mark.integration  # runs the command
def test_command_line_writes_the_tree_local_train_mounts_over(tmp_path: Path) -> None:
    hps = tmp_path / "hps.json"
    hps.write_text(json.dumps({"epochs": 3, "sagemaker_program": "x.py"}))
    root = tmp_path / "job-1"
    done = subprocess.run(
        [sys.executable, "-m", "smhvd_dev.mltree", str(root), "--hyperparameters", str(hps),
         "--channel", "train", "--hp", "sagemaker_program=train.py",
         "--hp-json", "sagemaker_mpi_num_of_processes_per_host=2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    written = json.loads(SageMakerPaths(root).hyperparameters.read_text())
    assert written["epochs"] == "3"
    assert written["sagemaker_program"] == '"train.py"'
    assert written["sagemaker_mpi_num_of_processes_per_host"] == "2"
    assert written["sagemaker_mpi_enabled"] == "true"
    assert written["sagemaker_job_name"] == '"job-1"'
    assert (root / "input" / "data" / "train").is_dir()
    assert (root / "code").is_dir()


@pytest.mark.integration  # runs the command
def test_command_line_refuses_bad_json_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    hps = tmp_path / "hps.json"
    hps.write_text("{epochs: 3")
    root = tmp_path / "job"
    done = subprocess.run(
        [sys.executable, "-m", "smhvd_dev.mltree", str(root), "--hyperparameters", str(hps)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"mltree: --hyperparameters {hps}: not valid JSON")
    assert len(done.stderr.strip().splitlines()) == 1
    assert not root.exists()


@pytest.mark.integration  # runs the command
def test_command_line_writes_one_hosts_tree_of_several(tmp_path: Path) -> None:
    """bin/local-train.sh --hosts N: one tree per host, each naming itself among all, one job name."""
    root = tmp_path / "job-2" / "algo-2"
    done = subprocess.run(
        [sys.executable, "-m", "smhvd_dev.mltree", str(root), "--current-host", "algo-2",
         "--hosts", "algo-1,algo-2", "--job-name", "job-2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = load_job(SageMakerPaths(root))
    assert (job.resources.current_host, job.resources.hosts) == ("algo-2", ("algo-1", "algo-2"))
    assert json.loads(SageMakerPaths(root).hyperparameters.read_text())["sagemaker_job_name"] == '"job-2"'
    refused = subprocess.run(
        [sys.executable, "-m", "smhvd_dev.mltree", str(tmp_path / "x"), "--current-host", "algo-3",
         "--hosts", "algo-1,algo-2"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr == "mltree: --current-host algo-3: not one of --hosts algo-1,algo-2\n"
    assert not (tmp_path / "x").exists()
