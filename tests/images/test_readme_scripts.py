"""Every script the README and docs/ tell a user to run (`bin/....sh`) exists and is executable, as committed:
a fresh clone gets the mode git records, and `eval "$(bin/sdk-venv.sh)"` (docs/sdk.md) must not fail
"Permission denied"."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT_RE = re.compile(r"(?<![\w/.-])bin/[\w.-]+\.sh\b")


def readme_scripts() -> list[str]:
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return sorted({name for page in pages for name in SCRIPT_RE.findall(page.read_text())})


def test_the_user_pages_name_scripts():
    names = readme_scripts()
    assert {"bin/build.sh", "bin/push.sh", "bin/sdk-venv.sh", "bin/sdk-v3-venv.sh"} <= set(names), names


@pytest.mark.integration  # asks git for the committed mode
@pytest.mark.parametrize("name", readme_scripts())
def test_a_script_the_readme_runs_is_executable_on_disk_and_in_git(name):
    path = REPO / name
    assert path.is_file(), f"the README names {name}, which does not exist"
    assert path.stat().st_mode & stat.S_IXUSR and os.access(path, os.X_OK), f"{name} is not executable"
    if shutil.which("git") is None or not (REPO / ".git").exists():
        return  # an unpacked release: the mode on disk is all there is
    staged = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--stage", "--", name],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout.split()
    assert staged, f"{name} is not tracked by git"
    assert (
        staged[0] == "100755"
    ), f"{name} is recorded as {staged[0]} in git: git update-index --chmod=+x {name}"
