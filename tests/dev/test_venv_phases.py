"""bin/sdk-venv.sh and bin/sdk-v3-venv.sh say what they do while they run (issue 52): they ran 32 s and 192 s
without a line of their own. Both make their venv with bin/lib/pinned-venv.sh, run here for real (python3 -m
venv, pip) on a one-file wheel the test writes, so no index is reached and the test takes seconds; a venv
that is up to date is said so by bin/sdk-v3-venv.sh itself, run as a user types it."""

from __future__ import annotations

import re
import subprocess
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # python3 -m venv and pip, a few seconds

REPO = Path(__file__).resolve().parents[2]
LIB = REPO / "bin" / "lib" / "pinned-venv.sh"


def tiny_wheel(where: Path) -> Path:
    """A pure-Python wheel of one empty module (pip installs it without an index)."""
    wheel = where / "tiny-0.1-py3-none-any.whl"
    files = {
        "tiny/__init__.py": "",
        "tiny-0.1.dist-info/METADATA": "Metadata-Version: 2.1\nName: tiny\nVersion: 0.1\n",
        "tiny-0.1.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    files["tiny-0.1.dist-info/RECORD"] = "".join(
        f"{name},,\n" for name in [*files, "tiny-0.1.dist-info/RECORD"]
    )
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return wheel


def bash(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script, "bash", *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_each_long_step_says_what_it_does_and_how_long_it_took(tmp_path: Path) -> None:
    venv = tmp_path / "v3"
    run = f'set -euo pipefail; source "{LIB}"; pinned_venv sdk-v3-venv.sh 0 "$1" "$2"'
    first = bash(run, str(venv), str(tiny_wheel(tmp_path)))
    assert first.returncode == 0, first.stderr
    lines = first.stderr.splitlines()
    made, pip = f"python3 -m venv {venv}", f"pip install {tmp_path}/tiny-0.1-py3-none-any.whl"
    assert lines[0] == f"sdk-v3-venv.sh: {made} ...", lines
    assert re.fullmatch(rf"sdk-v3-venv\.sh: {re.escape(made)}: \d+ s", lines[1]), lines
    assert lines[2].startswith(f"sdk-v3-venv.sh: {pip} (minutes the first time"), lines
    assert re.fullmatch(r"sdk-v3-venv\.sh: pip install .*: \d+ s", lines[3]), lines
    assert (venv / "bin" / "python").exists()
    # The same pins again: nothing to do, and it says so
    again = bash(run, str(venv), str(tmp_path / "tiny-0.1-py3-none-any.whl"))
    assert again.returncode == 0, again.stderr
    assert again.stderr.splitlines() == [
        f"sdk-v3-venv.sh: {venv} is up to date ({tmp_path}/tiny-0.1-py3-none-any.whl)"
    ]
    # A step that fails says which, and after how long (an extra package that does not exist)
    extra = f'set -euo pipefail; source "{LIB}"; pinned_extra sdk-v3-venv.sh "$1" "$2"'
    failed = bash(extra, str(venv), str(tmp_path / "missing-0.1-py3-none-any.whl"))
    assert failed.returncode != 0
    assert re.search(
        r"^sdk-v3-venv\.sh: pip install .*missing.*: failed \(exit \d+\) after \d+ s$", failed.stderr, re.M
    )


def test_the_script_says_when_its_venv_is_up_to_date(tmp_path: Path) -> None:
    version = re.search(r"^SAGEMAKER_VERSION=(\S+)$", (REPO / "bin" / "sdk-v3-venv.sh").read_text(), re.M)
    assert version
    venv = tmp_path / "v3"
    venv.mkdir()
    (venv / f".stamp-sagemaker=={version.group(1)}-").touch()  # what pinned_venv leaves once the pins are in
    proc = subprocess.run(
        ["bash", str(REPO / "bin" / "sdk-v3-venv.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        f"sdk-v3-venv.sh: {venv} is up to date (sagemaker=={version.group(1)})"
    ]
    assert proc.stdout == f"PYTHON={venv}/bin/python\n"
