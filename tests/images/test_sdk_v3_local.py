"""SageMaker Python SDK v3 end to end: `ModelTrainer` in its local container mode runs our CPU image.

Real everywhere: the SDK (sagemaker 3.x in its own venv, bin/sdk-v3-venv.sh) writes the config files, the
sm_drivers channel and the compose file, and starts 2 containers of the image through `docker-compose`
(podman-compose behind the shims of bin/sdk-venv.sh). The MNIST reference script trains a few steps with
`distributed=MPI(...)` and `source_code=SourceCode(...)`: the image's BASH_ENV hands v3's
`bash -c ...sm_train.sh` to our launcher, which must run 2 ranks over both containers (v3's own driver
would start 1) and leave the model where the SDK collects it (<root>/compressed_artifacts/model.tar.gz).
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import textwrap
import time
from pathlib import Path

import pytest

from .helpers import REPO, WORK, BuiltImage, in_ci, record_timing

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(1800)]

MNIST_DIR = REPO / "src" / "scripts" / "mnist"
JOB_TIMEOUT = 600.0


def _key_values(out: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


@pytest.fixture(scope="session")
def sdk_v3(engine_env: dict[str, str]) -> dict[str, str]:
    """The v3 SDK's python and an environment whose PATH starts with the docker/docker-compose shims."""
    flags = ["--install"] if in_ci() else []
    try:
        v3 = subprocess.run(
            ["bash", str(REPO / "bin" / "sdk-v3-venv.sh"), *flags],
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        ).stdout
        shims = subprocess.run(
            ["bash", str(REPO / "bin" / "sdk-venv.sh"), *flags],
            capture_output=True,
            text=True,
            check=True,
            timeout=900,
        ).stdout
    except subprocess.CalledProcessError as exc:
        if in_ci():
            raise
        pytest.skip(f"the SDK venvs could not be made: {exc.stderr[-500:]}")
    env = dict(engine_env)
    env["PATH"] = f"{_key_values(shims)['SHIMS']}{os.pathsep}{env['PATH']}"
    env["SDK_PYTHON"] = _key_values(v3)["PYTHON"]
    env["PYTHONUNBUFFERED"] = "1"
    env.pop("AWS_PROFILE", None)
    return env


# Run by the SDK's python: the user's code as in the SDK's documentation, nothing of ours but the image.
TRAINER = textwrap.dedent(
    """
    import sys
    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import Compute, SourceCode
    from sagemaker.train.distributed import MPI
    from sagemaker.train.model_trainer import Mode

    image, code, root = sys.argv[1:4]
    trainer = ModelTrainer(
        training_mode=Mode.LOCAL_CONTAINER,
        training_image=image,
        local_container_root=root,
        compute=Compute(instance_type="local_cpu", instance_count=2),
        source_code=SourceCode(source_dir=code, entry_script="train_mnist.py"),
        distributed=MPI(
            process_count_per_node=1, mpi_additional_options=["--mca", "mpi_yield_when_idle", "1"]
        ),
        hyperparameters={"epochs": 1, "steps_per_epoch": 5, "batch_size": 32},
    )
    trainer.train()
    """
)


def test_model_trainer_local_mpi_runs_through_our_launcher(
    cpu_image: BuiltImage, sdk_v3: dict[str, str], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    log = WORK / "sdk-v3-local.log"
    start = time.monotonic()
    proc = subprocess.run(
        [sdk_v3["SDK_PYTHON"], str(script), cpu_image.immutable, str(MNIST_DIR), str(root)],
        env=sdk_v3,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=JOB_TIMEOUT,
        check=False,
    )
    seconds = time.monotonic() - start
    WORK.mkdir(parents=True, exist_ok=True)
    log.write_text(proc.stdout)
    record_timing("sdk-v3-local-mpi", seconds, exit_code=proc.returncode)
    out = proc.stdout
    assert proc.returncode == 0, f"ModelTrainer.train() failed (log {log}):\n{out[-4000:]}"

    # Our launcher ran the job on both containers, not v3's drivers: its log lines, its MPI plan over 2 hosts
    # with v3's options, and no sign of mpi_driver.py (which would log "Running MPI Driver" and start 1 rank).
    assert "[smhvd" in out, out[-3000:]
    assert "SDK v3 ModelTrainer job: running train_mnist.py MPI, 1 process(es) per host on 2 host(s)" in out
    assert "starting 2 processes" in out, out[-3000:]
    assert "mpi_yield_when_idle" in out
    assert "Running MPI Driver" not in out
    assert "'ethwe' is not an interface of this host" in out  # v3 local mode's resourceconfig, overcome

    # Where the SDK puts the trained model: <root>/compressed_artifacts/model.tar.gz (and output.tar.gz).
    artifacts = root / "compressed_artifacts"
    with tarfile.open(artifacts / "model.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("saved_model.pb") for n in names), names
    with tarfile.open(artifacts / "output.tar.gz") as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("metrics.json"))
        extracted = tar.extractfile(member)
        assert extracted is not None
        metrics = json.load(extracted)
        failure = [m.name for m in tar.getmembers() if m.name.endswith("failure")]
    assert metrics["world_size"] == 2  # both containers trained: v3's own driver runs -np 1
    assert metrics["steps_per_epoch"] == 5  # v3's hyperparameters reached the script
    assert failure == []
