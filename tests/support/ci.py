"""What CI means to the tests, one rule: CI set to 1, true or yes (any case). Under CI nothing is skipped for
want of a tool or a privilege: a fixture installs what is missing, and what cannot be had fails the test."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[2]


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def unavailable(reason: str) -> NoReturn:
    """Skip the test for `reason` (a missing tool or privilege), or under CI fail it."""
    if in_ci():
        pytest.fail(f"{reason} (under CI nothing is skipped)")
    pytest.skip(reason)


def need_root(what_for: str) -> None:
    """Skip the test unless it runs as root (`what_for` says why it must), or under CI fail it."""
    if os.geteuid() != 0:
        unavailable(f"needs root ({what_for})")


def need_engine() -> None:
    """podman and runc on PATH. Missing: under CI, installed as the image tier installs them
    (bin/daemonless-env.sh --install, apt); else the test is skipped. Whichever test comes first on a new
    machine (tests/dev before tests/images) must not be the one that finds them missing."""
    if shutil.which("podman") is not None and shutil.which("runc") is not None:
        return
    if not in_ci():
        pytest.skip("podman and runc are not installed (bin/daemonless-env.sh --install)")
    need_root("apt-get install of podman and runc")
    with tempfile.TemporaryDirectory(prefix="smhvd-engine-") as state:  # only the tools: no store configured
        subprocess.run(
            ["bash", str(REPO / "bin" / "daemonless-env.sh"), "--install", "--engine-only", state],
            check=True,
            stdout=subprocess.DEVNULL,
            timeout=900,
        )
    if shutil.which("podman") is None or shutil.which("runc") is None:
        pytest.fail("bin/daemonless-env.sh --install left podman or runc missing")
