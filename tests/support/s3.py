"""A real S3-compatible server (moto) on loopback, for the tests that need S3."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from smhvd.proc.waiting import wait_until


@pytest.fixture(scope="module")
def s3_port() -> Iterator[int]:
    """A real S3-compatible server (moto_server) on loopback, one per test module; yields its port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
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
