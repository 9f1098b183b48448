"""The MNIST notebooks (examples/notebooks/) run for real, by the command a user types, `make notebooks`, so
they never rot.

`make notebooks` (bin/run-notebooks.sh) makes the SDK venvs with a Jupyter kernel and executes both notebooks,
SDK v2 first, each in its own venv's kernel (nbclient), in local mode: 2 containers of the image each, through
the docker-compose shim (podman-compose). What the test adds is what a user may add: the image under test
(`--image`, instead of building `sagemaker-horovod:cpu`), a short run (`--parameters`: the hyperparameters),
and an output directory of its own. Nothing of AWS is configured: no keys, no region, no SDK config file (the
notebooks set what local mode needs themselves), and TMPDIR is the test's, so the job files the notebooks'
local mode makes are the test's to look at; every container and pod of those jobs must be gone at the end
(the notebooks' last cell removes them).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .helpers import (
    REPO,
    BuiltImage,
    compose_project_left,
    record_timing,
    remove_compose_project,
    run_to_log,
    without_aws,
)

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(1800)]

SHORT_RUN = {"HYPERPARAMETERS": {"epochs": 1, "steps_per_epoch": 5, "batch_size": 32}}
V3_MARK = "run-notebooks.sh: mnist_sdk_v3.ipynb with "


def model_files(output: str) -> list[str]:
    line = next(line for line in output.splitlines() if line.startswith("model files: "))
    return list(json.loads(line.removeprefix("model files: ").replace("'", '"')))


def test_make_notebooks_runs_both_in_local_mode_and_leaves_nothing(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    parameters = tmp_path / "parameters.json"
    parameters.write_text(json.dumps(SHORT_RUN))
    out = tmp_path / "notebooks"
    env, tmp = without_aws(engine_env, tmp_path)
    args = f"--image {cpu_image.immutable} --parameters {parameters} --out {out}"
    notebooks = ["make", "-s", "notebooks", f"NOTEBOOKS_ARGS={args}"]
    proc, seconds = run_to_log(notebooks, env, REPO, 1500, "make-notebooks.log")
    record_timing("make-notebooks", seconds, exit_code=proc.returncode)
    # The notebooks' local-mode jobs: a compose file each under their container roots (in TMPDIR).
    projects = {p.parent.name for p in tmp.rglob("docker-compose.yaml")}
    left = {project: compose_project_left(env, project) for project in projects}
    for project in projects:
        remove_compose_project(env, project)  # whatever the outcome: the store stays clean
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert len(projects) == 2, projects  # one job per notebook
    assert not any(left.values()), f"the notebooks left these in the store: {left}"

    v2, v3 = proc.stdout.split(V3_MARK, 1)
    assert "starting 2 processes" in v2, v2[-3000:]  # our launcher, one rank on each container
    assert "-x NCCL_DEBUG=INFO" in v2  # the samples' --NCCL_DEBUG=INFO, as mpirun takes it
    assert "starting 2 processes" in v3, v3[-3000:]
    for part in (v2, v3):
        assert "1/saved_model.pb" in model_files(part)
        assert "removed the containers of 1 local job(s)" in part
        assert "Traceback" not in part, part[-3000:]  # e.g. telemetry calls that cannot reach AWS
        assert "WARNING pre-flight" not in part, part[-3000:]  # no false alarm on local mode's containers
    for name in ("mnist_sdk_v2", "mnist_sdk_v3"):  # the executed notebooks, outputs included
        assert (out / f"{name}.ipynb").is_file()
