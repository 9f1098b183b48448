"""Running the repository's bin/ scripts as a user does, for the tests of tests/dev."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_script(
    name: str,
    *args: str,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """`bash bin/NAME ARGS...`, its output captured, never raising on its exit code; bounded (a script that
    loops forever fails the test at `timeout`)."""
    return subprocess.run(
        ["bash", str(REPO / "bin" / name), *args],
        env=None if env is None else dict(env),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
