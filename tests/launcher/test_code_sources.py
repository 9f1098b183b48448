"""Where the training code comes from: s3:// (a real S3-compatible server: moto), requirements.txt."""

import io
import tarfile

import pytest

from support.s3 import s3_client

pytestmark = pytest.mark.integration

SCRIPT = b"import os; open(os.path.join(os.environ['SM_MODEL_DIR'], 'done'), 'w').write('ok')\n"


def tar_bytes(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@pytest.fixture(scope="module")
def s3_server(s3_port):
    """The moto server's endpoint URL."""
    return f"http://127.0.0.1:{s3_port}"


@pytest.fixture
def s3_env(s3_server):
    return {
        "AWS_ENDPOINT_URL_S3": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }


def upload(env, bucket, key, data):
    s3 = s3_client(env["AWS_ENDPOINT_URL_S3"])
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key=key, Body=data)


def test_code_from_s3(train_job, s3_env):
    upload(s3_env, "jobs", "j1/source/sourcedir.tar.gz", tar_bytes({"entry.py": SCRIPT}))
    job = train_job(
        "",
        {
            "sagemaker_program": "entry.py",
            "sagemaker_submit_directory": "s3://jobs/j1/source/sourcedir.tar.gz",
            "sagemaker_mpi_num_of_processes_per_host": 1,
        },
    )
    result = job.run(env=s3_env)
    assert result.returncode == 0, result.stderr
    assert (job.paths.model_dir / "done").read_text() == "ok"
    assert (job.paths.code_dir / "entry.py").read_bytes() == SCRIPT


def test_missing_s3_code_is_a_clear_error(train_job, s3_env):
    upload(s3_env, "jobs2", "other", b"x")
    job = train_job("", {"sagemaker_submit_directory": "s3://jobs2/nope/sourcedir.tar.gz"})
    result = job.run(env=s3_env)
    assert result.returncode == 66
    assert job.failure().startswith(
        "sagemaker_submit_directory: could not download s3://jobs2/nope/sourcedir.tar.gz:"
    )


def test_program_from_env_and_code_dir(train_job, tmp_path):
    job = train_job("", {"sagemaker_submit_directory": None, "sagemaker_program": None})
    raw = job.paths.hyperparameters
    raw.write_text("{}")
    job.paths.code_dir.mkdir(parents=True, exist_ok=True)
    (job.paths.code_dir / "run.py").write_bytes(SCRIPT)
    result = job.run(env={"SAGEMAKER_PROGRAM": "run.py"})
    assert result.returncode == 0, result.stderr
    assert (job.paths.model_dir / "done").exists()


def test_requirements_are_installed_and_a_failure_names_the_file(train_job):
    job = train_job(SCRIPT.decode(), {"sagemaker_mpi_num_of_processes_per_host": 1})
    (job.code / "requirements.txt").write_text("numpy==1.26.4\n")  # present: pip runs and finds it satisfied
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert "installed " + str(job.code / "requirements.txt") in result.stderr
    (job.code / "requirements.txt").write_text("./no-such-package.whl\n")
    (job.paths.model_dir / "done").unlink()
    result = job.run()
    assert result.returncode == 70
    assert job.failure().startswith(f"{job.code / 'requirements.txt'}: pip install failed (exit 1)")
    assert not (job.paths.model_dir / "done").exists()
