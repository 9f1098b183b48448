"""A typo in a `sagemaker_` hyperparameter is never silent (issue 52): `train` runs the job as before (the
SDKs send `sagemaker_` keys of their own, so an unknown one cannot be refused) and logs one warning naming
the closest key it knows. Real `train`, real mpirun, one host."""

import pytest

pytestmark = pytest.mark.integration

QUIET = "print('script ran')\n"


def _warnings(stderr: str) -> list[str]:
    return [line.split("] WARNING ", 1)[1] for line in stderr.splitlines() if "] WARNING " in line]


def test_a_typo_in_a_sagemaker_key_is_a_warning_naming_the_key_meant(train_job):
    job = train_job(QUIET, {"sagemaker_prefligh": "fail", "sagemaker_mpi_num_of_process_per_host": 2})
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert "script ran" in result.stdout + result.stderr
    warnings = [w for w in _warnings(result.stderr) if "not a key the launcher reads" in w]
    assert warnings == [
        "hyperparameters.json: sagemaker_mpi_num_of_process_per_host: not a key the launcher reads or the "
        "SageMaker SDKs send, ignored (the closest known key: sagemaker_mpi_num_of_processes_per_host)",
        "hyperparameters.json: sagemaker_prefligh: not a key the launcher reads or the SageMaker SDKs send, "
        "ignored (the closest known key: sagemaker_preflight)",
    ], result.stderr


def test_the_keys_the_sdk_sends_pass_without_a_warning(train_job):
    sent = {  # what SDK v2's TensorFlow estimator sends for an MPI job (docs/sdk.md), and a tuner's keys
        "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_custom_mpi_options": "",
        "sagemaker_container_log_level": 20,
        "sagemaker_job_name": "tf-2026-12-08",
        "sagemaker_region": "eu-west-1",
        "sagemaker_estimator_class_name": "TensorFlow",
        "sagemaker_estimator_module": "sagemaker.tensorflow.estimator",
    }
    result = train_job(QUIET, sent).run()
    assert result.returncode == 0, result.stderr
    assert not [w for w in _warnings(result.stderr) if "not a key the launcher reads" in w], result.stderr
