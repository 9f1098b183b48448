"""The MNIST notebooks (examples/notebooks/) run for real in local mode against the CPU image, so they never
rot.

Each notebook's code cells run in order, as one program, with the SDK's own python (SDK v2: bin/sdk-venv.sh,
v3: bin/sdk-v3-venv.sh); after the cell tagged `parameters`, the test's values (the image under test, a short
run, a container root of its own) are assigned, as papermill would. Local mode starts 2 containers of the
image through the docker-compose shim (podman-compose); the notebook's last cell prints model.tar.gz's files.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from support.notebooks import NOTEBOOKS, notebook_program

from .helpers import WORK, BuiltImage, record_timing, remove_compose_project
from .test_sdk_local import sdk  # noqa: F401 (the fixtures of the SDK venvs, shared)
from .test_sdk_v3_local import sdk_v3  # noqa: F401

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(1800)]

# The SDKs' defaults config (under the test's HOME): no telemetry calls from a machine without internet
SDK_DEFAULTS = "SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n"


def run_notebook(name: str, python: str, env: dict[str, str], image: str, tmp: Path) -> str:
    """Run the notebook in local mode; its output. The containers it made are removed afterwards."""
    home, root = tmp / "home", tmp / "root"
    (home / ".config" / "sagemaker").mkdir(parents=True)
    (home / ".config" / "sagemaker" / "config.yaml").write_text(SDK_DEFAULTS)
    root.mkdir()
    parameters = {
        "IMAGE": image,
        "HYPERPARAMETERS": {"epochs": 1, "steps_per_epoch": 5, "batch_size": 32},
        "CONTAINER_ROOT": str(root),
    }
    program = tmp / f"{name}.py"
    program.write_text(notebook_program(NOTEBOOKS / f"{name}.ipynb", parameters))
    run_env = {k: v for k, v in env.items() if not k.startswith("AWS_")} | {
        "HOME": str(home),
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "PYTHONUNBUFFERED": "1",
    }
    started = time.monotonic()
    try:
        proc = subprocess.run(
            [python, str(program)],
            env=run_env,
            cwd=NOTEBOOKS,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=900,
            check=False,
        )
    finally:
        # the compose project is the directory of the compose file: v3 writes it in the root, v2 below it
        projects = {p.parent.name for p in root.rglob("docker-compose.yaml")} | {root.name}
        left = [c for project in projects for c in remove_compose_project(env, project)]
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / f"notebook-{name}.log").write_text(proc.stdout)
    record_timing(f"notebook-{name}", time.monotonic() - started, exit_code=proc.returncode)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert not left, f"left in the store: {left}"
    return proc.stdout


def model_files(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith("model files: "))
    return json.loads(line.removeprefix("model files: ").replace("'", '"'))


def test_the_sdk_v2_notebook_trains_in_local_mode(
    cpu_image: BuiltImage,
    sdk: tuple[str, dict[str, str]],  # noqa: F811
    tmp_path: Path,
) -> None:
    python, env = sdk
    out = run_notebook("mnist_sdk_v2", python, env, cpu_image.immutable, tmp_path)
    assert "starting 2 processes" in out, out[-3000:]  # our launcher, one rank on each container
    assert "-x NCCL_DEBUG=INFO" in out  # the samples' --NCCL_DEBUG=INFO, as mpirun takes it
    assert "1/saved_model.pb" in model_files(out)


def test_the_sdk_v3_notebook_trains_in_local_mode(
    cpu_image: BuiltImage,
    sdk_v3: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    out = run_notebook("mnist_sdk_v3", sdk_v3["SDK_PYTHON"], sdk_v3, cpu_image.immutable, tmp_path)
    assert "starting 2 processes" in out, out[-3000:]
    assert "1/saved_model.pb" in model_files(out)
