import json

import pytest

from smhvd.config.job import Hardware, load_job, validate_job
from smhvd.environment import training_env
from smhvd.errors import ConfigError
from smhvd.launch import rank_env
from smhvd_dev.mltree import write_ml_tree


def make_job(tmp_path, hps=None, hosts=("algo-1",), current="algo-1", cpus=2, gpus=0):
    paths = write_ml_tree(
        tmp_path / "ml",
        current_host=current,
        hosts=hosts,
        hyperparameters=hps or {},
        channels={"train": None, "test": None},
    )
    return load_job(paths, Hardware(cpus=cpus, gpus=gpus))


def test_sm_variables(tmp_path):
    job = make_job(
        tmp_path, {"epochs": 2, "name": "run a", "sagemaker_job_name": "j-1"}, hosts=("algo-2", "algo-1")
    )
    env = training_env(job, tmp_path / "code", "train.py", "s3://b/k.tar.gz")
    base = str(tmp_path / "ml")
    assert env["SM_HOSTS"] == '["algo-1","algo-2"]'
    assert env["SM_CURRENT_HOST"] == "algo-1"
    assert env["SM_NETWORK_INTERFACE_NAME"] == "eth0"
    assert env["SM_CHANNELS"] == '["test","train"]'
    assert env["SM_CHANNEL_TRAIN"] == base + "/input/data/train"
    assert env["SM_MODEL_DIR"] == base + "/model"
    assert env["SM_OUTPUT_DATA_DIR"] == base + "/output/data"
    assert env["SM_OUTPUT_DIR"] == base + "/output"
    assert env["SM_INPUT_DIR"] == base + "/input"
    assert env["SM_INPUT_CONFIG_DIR"] == base + "/input/config"
    assert env["SM_HP_EPOCHS"] == "2" and env["SM_HP_NAME"] == "run a"
    assert json.loads(env["SM_HPS"]) == {"epochs": 2, "name": "run a"}
    assert json.loads(env["SM_USER_ARGS"]) == ["--epochs", "2", "--name", "run a"]
    assert env["SM_NUM_CPUS"] == "2" and env["SM_NUM_GPUS"] == "0"
    assert env["SM_USER_ENTRY_POINT"] == "train.py" and env["SM_MODULE_DIR"] == "s3://b/k.tar.gz"
    assert env["SM_JOB_NAME"] == "j-1"
    assert json.loads(env["SM_RESOURCE_CONFIG"])["hosts"] == ["algo-2", "algo-1"]
    assert json.loads(env["SM_INPUT_DATA_CONFIG"])["train"]["TrainingInputMode"] == "File"
    summary = json.loads(env["SM_TRAINING_ENV"])
    assert summary["current_host"] == "algo-1" and summary["hyperparameters"] == {
        "epochs": 2,
        "name": "run a",
    }
    assert env["SAGEMAKER_BASE_DIR"] == base


def test_rank_env_threads_credentials_and_horovod(tmp_path):
    job = make_job(tmp_path, {"sagemaker_mpi_num_of_processes_per_host": 2, "horovod_timeline": True})
    base = {"PATH": "/bin", "AWS_SECRET_ACCESS_KEY": "s", "OMP_NUM_THREADS": "3"}
    env = rank_env(job, base, {"SM_HOSTS": "[]"})
    assert "AWS_SECRET_ACCESS_KEY" not in env
    assert env["OMP_NUM_THREADS"] == "3"  # the user's choice wins
    assert env["TF_NUM_INTRAOP_THREADS"] == "1" and env["TF_NUM_INTEROP_THREADS"] == "1"  # 2 cpus / 2 ranks
    assert env["HOROVOD_TIMELINE"].endswith("/output/data/horovod_timeline.json")
    assert env["PYTHONUNBUFFERED"] == "1"
    one = make_job(tmp_path / "one", {"launcher_forward_aws_credentials": True})
    env = rank_env(one, base, {})
    assert env["AWS_SECRET_ACCESS_KEY"] == "s" and "TF_NUM_INTRAOP_THREADS" not in env


def test_processes_per_host_defaults_to_gpus(tmp_path):
    assert make_job(tmp_path / "a", gpus=8).processes_per_host == 8
    assert make_job(tmp_path / "b", gpus=0).processes_per_host == 1
    job = make_job(
        tmp_path / "c",
        {"sagemaker_mpi_num_of_processes_per_host": 4, "sagemaker_mpi_num_processes": 6},
        hosts=("algo-1", "algo-2"),
        gpus=8,
    )
    assert (job.processes_per_host, job.num_processes) == (4, 6)


def test_cross_file_validation(tmp_path):
    with pytest.raises(
        ConfigError, match=r"sagemaker_mpi_num_processes: expected at most 2 \(1 per host x 2 hosts\)"
    ):
        make_job(tmp_path / "a", {"sagemaker_mpi_num_processes": 3}, hosts=("algo-1", "algo-2"))
    job = make_job(tmp_path / "b", hosts=("algo-1",))
    multi = type(job)(
        **{
            **job.__dict__,
            "resources": type(job.resources)(
                current_host="algo-1", hosts=("algo-1", "algo-2"), network_interface_name="eth9"
            ),
        }
    )
    with pytest.raises(
        ConfigError, match=r"network_interface_name: expected an interface of this host \(eth0, lo\)"
    ):
        validate_job(multi, {"lo", "eth0"})


@pytest.mark.parametrize(
    ("given", "expected"),
    [({}, 20), ({"sagemaker_container_log_level": 10}, 10), ({"sagemaker_container_log_level": 0}, 0)],
)
def test_sm_log_level_is_the_sdks_container_log_level_0_included(tmp_path, given, expected):
    env = training_env(make_job(tmp_path, given), tmp_path / "code", "train.py", "")
    assert (env["SM_LOG_LEVEL"], json.loads(env["SM_TRAINING_ENV"])["log_level"]) == (str(expected), expected)


def test_in_flight_reaches_the_ranks_only_when_on_with_hosts_to_compare(tmp_path):
    """docs/inflight.md: on by default with several MPI hosts; off, or one host, nothing is set (the rank
    wrapper then makes no pipe and the script imports nothing of it)."""
    two = ("algo-1", "algo-2")
    on = rank_env(make_job(tmp_path / "on", hosts=two), {}, {})
    off = rank_env(make_job(tmp_path / "off", {"launcher_inflight": "off"}, hosts=two), {}, {})
    alone = rank_env(make_job(tmp_path / "alone"), {}, {})
    assert on["SMHVD_INFLIGHT"] == "warn"
    assert "SMHVD_INFLIGHT" not in off and "SMHVD_INFLIGHT" not in alone
    with pytest.raises(ConfigError, match="launcher_inflight"):
        make_job(tmp_path / "bad", {"launcher_inflight": "fail"}, hosts=two)
