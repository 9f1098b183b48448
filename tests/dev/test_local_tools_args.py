"""bin/local-train.sh and bin/local-registry.sh check every argument before they create anything (issue 52): a
bad one is one line naming the option and what was expected, exit 2, and no directory made. Fast: the scripts
stop before they look for a container engine, so nothing here needs podman or docker, but the one test that
runs a whole dry run (there `docker` is a stub whose `info` answers: no daemon can run here)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support.scripts import run_script

pytestmark = pytest.mark.integration  # runs the scripts (bash, python3); a second or so in all

REPO = Path(__file__).resolve().parents[2]


def run(
    script: str, *args: str, cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    # bounded: `--hosts 99999999999999999999` once looped forever
    return run_script(script, *args, env=env, cwd=cwd, timeout=60)


@pytest.fixture
def where(tmp_path: Path) -> Path:
    """A code directory, a data directory and one whose name holds ':' (where podman's -v splits)."""
    for name in ("code", "data", "odd:dir"):
        (tmp_path / name).mkdir()
    (tmp_path / "code" / "train.py").write_text("print('hi')\n")
    (tmp_path / "hp.json").write_text('{"epochs": 2}')
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "odd:dir" / "train.py").write_text("print('hi')\n")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--hosts", "99999999999999999999"],
            "--hosts '99999999999999999999': expected a number from 1 to 64",
        ),
        (["--hosts", "9223372036854775808"], "--hosts '9223372036854775808': expected a number from 1 to 64"),
        (["--hosts", "65"], "--hosts '65': expected a number from 1 to 64"),
        (["--processes-per-host", "1025"], "--processes-per-host '1025': expected a number from 1 to 1024"),
        (
            ["--gpu", "--gpus-per-host", "99999999999999999999"],
            "--gpus-per-host '99999999999999999999': expected a number from 1 to 1024",
        ),
        (["--shm-size", "lots"], "--shm-size 'lots': expected a size such as 1g or 512m"),
        (["--hyperparameters", "missing.json"], "--hyperparameters missing.json: no such readable file"),
        (["--hyperparameters", "list.json"], "--hyperparameters list.json: expected a JSON object, got list"),
        (
            ["--source", "odd:dir", "--entry-point", "train.py"],
            "--source {tmp}/odd:dir: a path with ':' cannot be mounted (--volume SRC:DST splits at ':'); "
            "rename or link it",
        ),
        (
            ["--channel", "train=odd:dir"],
            "--channel train {tmp}/odd:dir: a path with ':' cannot be mounted",
        ),
        (["--channel", "train=data", "--channel", "train=code"], "--channel train: given twice"),
        (["--work", "job:1"], "--work {tmp}/job:1: a path with ':' cannot be mounted"),
        (["x:1", "--hosts"], "--hosts needs a number"),
        (["x:1", "--mpi-options"], '--mpi-options needs a value ("" for none)'),
    ],
)
def test_local_train_refuses_a_bad_argument_in_one_line_before_it_creates_anything(
    where: Path, args: list[str], line: str
) -> None:
    work = where / "job"
    work_args = [] if "--work" in args else ["--work", str(work)]
    proc = run(
        "local-train.sh", "--dry-run", *work_args, *args, *([] if "x:1" in args else ["x:1"]), cwd=where
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("local-train.sh: " + line.format(tmp=where)), proc.stderr
    assert not work.exists() and not (where / "job:1").exists()
    assert not (where / "build").exists()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--port", "99999999999999999999"],
            "--port '99999999999999999999': expected a port number (1-65535)",
        ),
        (["--port", "65536"], "--port '65536': expected a port number (1-65535)"),
        (["--port"], "--port needs a number (1-65535)"),
        (["--dir", "file"], "--dir file: not a directory"),
    ],
)
def test_local_registry_refuses_a_bad_argument_in_one_line_before_it_creates_anything(
    tmp_path: Path, args: list[str], line: str
) -> None:
    (tmp_path / "file").write_text("")
    before = sorted(tmp_path.iterdir())
    proc = run("local-registry.sh", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"local-registry.sh: {line}"], proc.stderr
    assert sorted(tmp_path.iterdir()) == before


STUB_DAEMON = """#!/bin/sh
echo "docker $*" >>"$(dirname "$0")/calls.log"
[ "$1" = info ] && exit 0
exit 1
"""


def answering_docker(tmp_path: Path) -> dict[str, str]:
    """The environment with a `docker` first on PATH whose `info` answers: a stand-in for a daemon (none can
    run here); every call is recorded in calls.log beside it."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "docker").write_text(STUB_DAEMON)
    (stub / "docker").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONTAINERS_", "DOCKER_"))}
    env["PATH"] = f"{stub}{os.pathsep}{env['PATH']}"
    return env


@pytest.mark.skipif(Path("/proc/driver/nvidia/version").exists(), reason="this machine has an NVIDIA driver")
def test_gpu_without_a_driver_is_one_line_with_the_fix_and_exit_69(tmp_path: Path) -> None:
    """README's stand-alone pre-flight line on a machine without a GPU (it was podman's 126, `unresolvable
    CDI devices nvidia.com/gpu=all`). podman's branch (a driver, no CDI spec) needs a driver: not run here."""
    env = answering_docker(tmp_path)
    work = tmp_path / "job"
    proc = run(
        "local-train.sh",
        "--gpu",
        "--work",
        str(work),
        "sagemaker-horovod:gpu",
        "preflight",
        cwd=REPO,
        env=env,
    )
    assert proc.returncode == 69, proc.stderr
    assert proc.stderr.splitlines()[-1] == (
        "local-train.sh: --gpu: no NVIDIA driver on this machine (/proc/driver/nvidia/version is missing): "
        "drop --gpu to check or run on the CPU (e.g. local-train.sh sagemaker-horovod:gpu preflight)"
    )
    assert not work.exists()
    assert "docker run" not in (tmp_path / "bin" / "calls.log").read_text()


def test_hyperparameters_from_a_process_substitution_are_read_once_for_every_host(tmp_path: Path) -> None:
    """`--hyperparameters <(echo ...)`, as a user types it in bash: the pipe is read once, every host's tree
    gets the values (it was refused: `/dev/fd/63: no such file`)."""
    env = answering_docker(tmp_path)
    work = tmp_path / "job"
    line = (
        f"bin/local-train.sh --dry-run --hosts 2 --work {work} "
        """--hyperparameters <(echo '{"epochs": 2, "sagemaker_program": "train.py"}') sagemaker-horovod:cpu"""
    )
    proc = subprocess.run(
        ["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    for host in ("algo-1", "algo-2"):
        hps = json.loads((work / host / "input" / "config" / "hyperparameters.json").read_text())
        assert (hps["epochs"], hps["sagemaker_program"]) == ("2", '"train.py"'), hps
