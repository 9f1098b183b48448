"""examples/mnist/upload_mnist.py against a real S3-compatible server (moto) on 127.0.0.1, run as a user runs
it; what it uploads is what train_mnist.py reads from its channels once SageMaker has copied them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import mnist_data
import numpy as np
import pytest
from mnist_helpers import SCRIPT_DIR

from support.s3 import endpoint, s3_client, user_env

pytestmark = pytest.mark.integration

UPLOAD = SCRIPT_DIR / "upload_mnist.py"


def upload(scratch: Path, *args: str, port: int, creds: bool = True) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it, against the test server."""
    env = user_env(scratch, port=port, creds=creds)
    argv = [sys.executable, str(UPLOAD), *args]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_uploaded_files_are_what_the_training_script_reads_from_its_channels(
    tmp_path: Path, s3_port: int
) -> None:
    client = s3_client(endpoint(s3_port))
    client.create_bucket(Bucket="samples")
    result = upload(tmp_path, "s3://samples/data/mnist", port=s3_port)
    assert result.returncode == 0, result.stderr
    channels = json.loads(result.stdout)
    assert channels == {
        "train": "s3://samples/data/mnist/train.npz",
        "test": "s3://samples/data/mnist/test.npz",
    }

    # SageMaker copies each channel's objects into /opt/ml/input/data/<channel>/ (File mode)
    env = {}
    for name, uri in channels.items():
        key = uri.removeprefix("s3://samples/")
        (tmp_path / name).mkdir()
        client.download_file("samples", key, str(tmp_path / name / Path(key).name))
        env[f"SM_CHANNEL_{name.upper()}"] = str(tmp_path / name)
    source = mnist_data.resolve_source("mnist", env)  # what train_mnist.py does with os.environ
    assert source == (tmp_path / "train" / "train.npz", tmp_path / "test" / "test.npz")
    for got, original in zip(
        mnist_data.load(source), mnist_data.load(mnist_data.resolve_source("mnist", {})), strict=True
    ):
        assert np.array_equal(got.images, original.images)
        assert np.array_equal(got.labels, original.labels)
    with np.load(source[0]) as train:  # the samples' arrays and types
        assert (train["data"].shape, train["data"].dtype, train["labels"].shape) == (
            (60000, 28, 28),
            np.uint8,
            (60000,),
        )


@pytest.mark.parametrize(
    ("args", "creds", "code", "message"),
    [
        (
            ("s3://no-such-bucket/mnist",),
            True,
            69,
            "upload_mnist.py: error: s3://no-such-bucket/mnist/train.npz: NoSuchBucket",
        ),
        (
            ("s3://samples/mnist",),
            False,
            77,
            "upload_mnist.py: error: s3://samples/mnist/train.npz: no AWS credentials",
        ),
        (("samples/mnist",), True, 2, "upload_mnist.py: error: 'samples/mnist': expected s3://BUCKET/PREFIX"),
    ],
)
def test_a_failed_upload_is_one_line_and_its_exit_code(
    tmp_path: Path, s3_port: int, args: tuple[str, ...], creds: bool, code: int, message: str
) -> None:
    result = upload(tmp_path, *args, port=s3_port, creds=creds)
    assert (result.returncode, result.stdout) == (code, "")
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1, result.stderr
