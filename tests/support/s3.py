"""A real S3-compatible server (moto) on loopback for the tests that need S3, a client of it, and the staging
command run against it."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from smhvd.proc.waiting import wait_until


@contextlib.contextmanager
def moto_server(env: Mapping[str, str] | None = None) -> Iterator[int]:
    """A real S3-compatible server (moto_server) on loopback, with `env` added to its environment (e.g.
    INITIAL_NO_AUTH_ACTION_COUNT: IAM checks after that many requests); yields its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **(env or {})},
    )

    def accepting() -> bool | None:
        assert server.poll() is None, "moto_server exited"
        with socket.socket() as s:
            return True if s.connect_ex(("127.0.0.1", port)) == 0 else None

    try:
        wait_until(accepting, what="moto_server to listen", timeout=60)
        yield port
    finally:
        server.terminate()
        server.wait()


@pytest.fixture(scope="module")
def s3_port() -> Iterator[int]:
    """A moto_server for the tests that need S3, one per test module; yields its port."""
    with moto_server() as port:
        yield port


def endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client of the test server (moto accepts any keys)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def user_env(scratch: Path, *, port: int | None, creds: bool = True) -> dict[str, str]:
    """The environment of a user's S3 command: the test server's endpoint and keys, none of this machine's AWS
    configuration (its files would be in `scratch`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {
        "AWS_CONFIG_FILE": str(scratch / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(scratch / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    if port is not None:
        env["AWS_ENDPOINT_URL_S3"] = endpoint(port)
    if creds:
        env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    return env


def stage_coco(
    scratch: Path,
    *args: str,
    port: int | None,
    creds: bool = True,
    timeout: float = 60,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`smhvd-stage-coco ARGS` as a user runs it: endpoint and keys from the environment (`env` wins), none of
    this machine's AWS configuration; its checksum cache in `scratch`."""
    env = {**user_env(scratch, port=port, creds=creds), **(env or {})}
    argv = [sys.executable, "-m", "smhvd_stage.coco", *args, "--checksum-cache", str(scratch / "md5.json")]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
