"""The launcher runs on the Python its pyproject.toml says it needs, and on no older one (issue 46: it said
3.10 while it imported typing.Self and read sys.flags.safe_path, and its ranks run `python -P`: under 3.10
every job exited 70)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from smhvd.roles.leader import rank_command

REPO = Path(__file__).resolve().parents[2]


def oldest_python() -> str:
    """The oldest Python pyproject.toml's requires-python allows (`>=3.N`)."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"]
    found = re.fullmatch(r">=\s*(3\.\d+)", declared)
    assert found, f"requires-python {declared!r}: expected >=3.N"
    return found.group(1)


@pytest.mark.integration  # runs mypy on the launcher (seconds with its cache warm from `make lint`)
def test_the_launcher_type_checks_under_the_oldest_python_it_declares() -> None:
    """mypy reads the standard library as that Python has it: a name it lacks (typing.Self,
    sys.flags.safe_path under 3.10) is an error."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-version", oldest_python(), "src/smhvd"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:]


def test_the_ranks_interpreter_flags_exist_in_the_oldest_python() -> None:
    """`python -P` (the script's directory is not put first on sys.path, so that a `signal.py` beside it
    shadows nothing of the wrapper's) came with 3.11."""
    if "-P" in rank_command(["train.py"]):
        assert tuple(int(part) for part in oldest_python().split(".")) >= (3, 11)
