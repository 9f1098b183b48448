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
import re
import subprocess
import tarfile
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.ci import in_ci
from support.snippets import doc_snippet

from .helpers import REPO, BuiltImage, record_timing, remove_compose_project, run_to_log

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(1800)]

SDK_PAGE = REPO / "docs" / "sdk.md"
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
# argv: IMAGE ROOT SPEC (JSON: hyperparameters; optional: source_dir + entry_script or command, mpi,
# channels).
TRAINER = textwrap.dedent(
    """
    import json, sys
    from sagemaker.train import ModelTrainer
    from sagemaker.train.configs import Compute, InputData, SourceCode
    from sagemaker.train.distributed import MPI
    from sagemaker.train.model_trainer import Mode

    image, root, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    kwargs = dict(
        training_mode=Mode.LOCAL_CONTAINER,
        training_image=image,
        local_container_root=root,
        compute=Compute(instance_type="local_cpu", instance_count=2),
        hyperparameters=spec["hyperparameters"],
    )
    if "command" in spec:
        kwargs["source_code"] = SourceCode(source_dir=spec["source_dir"], command=spec["command"])
    elif "source_dir" in spec:
        kwargs["source_code"] = SourceCode(source_dir=spec["source_dir"], entry_script=spec["entry_script"])
    if "mpi" in spec:
        kwargs["distributed"] = MPI(**spec["mpi"])
    if "channels" in spec:
        channels = spec["channels"].items()
        kwargs["input_data_config"] = [InputData(channel_name=k, data_source=v) for k, v in channels]
    try:
        ModelTrainer(**kwargs).train()
    except Exception as exc:
        print(f"TRAIN-FAILED {type(exc).__name__}: {exc}", flush=True)
        sys.exit(3)
    """
)


@dataclass(frozen=True)
class Run:
    exit_code: int
    out: str
    root: Path
    seconds: float

    @property
    def artifacts(self) -> Path:
        """Where the SDK's local mode puts model.tar.gz and output.tar.gz."""
        return self.root / "compressed_artifacts"

    def output_file(self, suffix: str) -> bytes | None:
        with tarfile.open(self.artifacts / "output.tar.gz") as tar:
            for member in tar.getmembers():
                if member.name.endswith(suffix):
                    extracted = tar.extractfile(member)
                    return extracted.read() if extracted else None
        return None


def run_trainer(sdk: dict[str, str], image: str, tmp_path: Path, name: str, spec: dict[str, object]) -> Run:
    # The compose file goes in the root: its directory's name is the compose project, which names and labels
    # the containers. A name of its own per run (lower-case letters and digits, as podman-compose keeps
    # them): the containers of this run, and only those, are removed afterwards.
    root = tmp_path / f"sdkv3{uuid.uuid4().hex[:12]}"
    root.mkdir()
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    return run_sdk(sdk, [str(script), image, str(root), json.dumps(spec)], tmp_path, root, name)


def run_sdk(sdk: dict[str, str], argv: list[str], cwd: Path, root: Path, name: str) -> Run:
    """The SDK's python with `argv` in `cwd`; then the containers of the compose project(s) the SDK wrote
    under `root` are removed, and must be all that is left of them."""
    try:  # the SDK's own time: the removal below is the test's
        proc, seconds = run_to_log([sdk["SDK_PYTHON"], *argv], sdk, cwd, JOB_TIMEOUT, f"sdk-v3-{name}.log")
    finally:
        projects = {compose.parent.name for compose in root.rglob("docker-compose.yaml")}
        left = [x for project in sorted(projects) for x in remove_compose_project(sdk, project)]
    assert not left, f"the job under {root} left these in the store: {left}"
    record_timing(f"sdk-v3-local-{name}", seconds, exit_code=proc.returncode)
    return Run(proc.returncode, proc.stdout, root, seconds)


def test_the_pages_model_trainer_lines_run_mpi_through_our_launcher(
    cpu_image: BuiltImage, sdk_v3: dict[str, str], tmp_path: Path
) -> None:
    """docs/sdk.md's v3 local-mode block as a user types it, run from a directory with the repository's
    examples/ (the block's relative paths), only the image's name replaced by the image under test."""
    program = doc_snippet(SDK_PAGE, "sdk-v3-local", {"sagemaker-horovod:cpu": cpu_image.immutable})
    (tmp_path / "examples").symlink_to(REPO / "examples")
    root = tmp_path / "build" / "sdk-v3-local"  # the block's local_container_root, relative to its directory
    run = run_sdk(sdk_v3, ["-c", program], tmp_path, root, "snippet")
    out = run.out
    assert run.exit_code == 0, f"the page's ModelTrainer lines failed:\n{out[-4000:]}"

    # Our launcher ran the job on both containers, not v3's drivers: its log lines, its MPI plan over 2 hosts
    # with v3's options, and no sign of mpi_driver.py (which would log "Running MPI Driver" and start 1 rank).
    assert "[smhvd" in out, out[-3000:]
    assert "SDK v3 ModelTrainer job: running train_mnist.py MPI, 1 process(es) per host on 2 host(s)" in out
    assert "starting 2 processes" in out, out[-3000:]
    assert "NCCL_DEBUG=WARN" in out  # mpi_additional_options reached mpirun
    assert "Running MPI Driver" not in out
    # v3 local mode's resourceconfig names 'ethwe': overcome, and said in docs/sdk.md, not in every run's log
    assert "'ethwe' is not an interface of this host" not in out
    assert "Traceback" not in out, out[-3000:]

    # Where the SDK puts the trained model: <root>/compressed_artifacts/model.tar.gz (and output.tar.gz).
    with tarfile.open(run.artifacts / "model.tar.gz") as tar:
        names = tar.getnames()
    assert any(n.endswith("saved_model.pb") for n in names), names
    metrics_json = run.output_file("metrics.json")
    assert metrics_json is not None
    metrics = json.loads(metrics_json)
    assert metrics["world_size"] == 2  # both containers trained: v3's own driver runs -np 1
    assert metrics["steps_per_epoch"] == 10  # v3's hyperparameters reached the script
    assert run.output_file("failure") is None


# A rank that fails on algo-2 while rank 0 would run past the run's JOB_TIMEOUT: the job must end with the
# failing rank, its exit code and its stderr in the failure file the SDK collects.
FAILING = """
import os, sys, time
if os.environ.get("OMPI_COMM_WORLD_RANK") == "1":
    print("rank 1 gives up: no data", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(3600)
"""


def test_a_failing_rank_ends_the_job_fast_with_our_failure_file(
    cpu_image: BuiltImage, sdk_v3: dict[str, str], tmp_path: Path
) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "fail.py").write_text(FAILING)
    spec = {
        "source_dir": str(code),
        "entry_script": "fail.py",
        "mpi": {"process_count_per_node": 1},
        "hyperparameters": {},
    }
    run = run_trainer(sdk_v3, cpu_image.immutable, tmp_path, "failure", spec)
    assert run.exit_code == 3 and "TRAIN-FAILED RuntimeError" in run.out, run.out[-3000:]
    assert "[smhvd" in run.out and "Running MPI Driver" not in run.out
    # Ended by the failing rank, not by rank 0's hour: run_trainer would have timed out (how long it took is
    # in build/images-test/timings.jsonl, sdk-v3-local-failure).
    failure = run.output_file("failure")
    assert failure is not None, run.out[-3000:]
    assert re.match(rb"rank 1 on algo-\S+ exited with code 3\n", failure), failure
    assert b"rank 1 gives up: no data" in failure, failure


# Rank 0 writes the world size where the model goes (mpi4py only: no TensorFlow start-up to wait for).
WORLD = """
import os
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 0:
    with open(os.path.join(os.environ["SM_MODEL_DIR"], "world.txt"), "w") as f:
        f.write(f"{MPI.COMM_WORLD.Get_size()} {os.environ['SM_HP_GREETING']}")
"""


def test_without_source_code_the_image_runs_train_as_for_any_sdk(
    cpu_image: BuiltImage, sdk_v3: dict[str, str], tmp_path: Path
) -> None:
    """No source_code: v3 gives the container no entrypoint and no drivers (the image's `train` runs), and the
    launcher's own hyperparameters select the code (here from an input channel) and the MPI job;
    `distributed=` needs source_code (the SDK refuses it alone)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "world.py").write_text(WORLD)
    spec = {
        "channels": {"code": str(code)},
        "hyperparameters": {
            "sagemaker_program": "world.py",
            "sagemaker_submit_directory": "/opt/ml/input/data/code",
            "sagemaker_mpi_num_of_processes_per_host": 1,
            "greeting": "hello",
        },
    }
    (tmp_path / "refused").mkdir()
    refused = run_trainer(sdk_v3, cpu_image.immutable, tmp_path / "refused", "refused", spec | {"mpi": {}})
    assert refused.exit_code == 3 and "TRAIN-FAILED" in refused.out, refused.out[-2000:]
    run = run_trainer(sdk_v3, cpu_image.immutable, tmp_path, "no-source-code", spec)
    assert run.exit_code == 0, run.out[-4000:]
    assert "starting 2 processes" in run.out and "SDK v3 ModelTrainer job" not in run.out
    with tarfile.open(run.artifacts / "model.tar.gz") as tar:
        member = tar.extractfile("world.txt")
        assert member is not None
        assert member.read() == b"2 hello"


def test_a_command_job_is_left_to_v3s_own_script(
    cpu_image: BuiltImage, sdk_v3: dict[str, str], tmp_path: Path
) -> None:
    """SourceCode(command=...): a shell command of the user's, which v3 evals on every host; `train` hands the
    container back to v3's sm_train.sh unchanged (and without the BASH_ENV hook, so no loop)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "README").write_text("a command job needs a source_dir\n")
    spec = {"source_dir": str(code), "command": "python -c 'print(6*7)'", "hyperparameters": {}}
    run = run_trainer(sdk_v3, cpu_image.immutable, tmp_path, "command", spec)
    assert run.exit_code == 0, run.out[-3000:]
    assert "left to v3's sm_train.sh: SourceCode.command" in run.out
    assert "Training Container Execution Completed" in run.out
    printed = [line for line in run.out.splitlines() if line.rstrip().endswith(" 42")]
    assert len(printed) == 2, run.out[-3000:]  # once per host, as v3 does it


def test_a_failing_command_job_ends_with_the_commands_exit_code(
    cpu_image: BuiltImage, sdk_v3: dict[str, str], tmp_path: Path
) -> None:
    """The hand-back to v3's sm_train.sh keeps what the command's failure means: its exit code is the
    container's, which the SDK's local mode reports (docker-compose's exit code is the first container's)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "README").write_text("a command job needs a source_dir\n")
    spec = {"source_dir": str(code), "command": "python -c 'import sys; sys.exit(7)'", "hyperparameters": {}}
    run = run_trainer(sdk_v3, cpu_image.immutable, tmp_path, "command-fails", spec)
    assert "left to v3's sm_train.sh: SourceCode.command" in run.out, run.out[-3000:]
    assert run.exit_code == 3 and "TRAIN-FAILED RuntimeError" in run.out, run.out[-3000:]  # the SDK raised
    assert re.search(r"Process exited with code: 7\b", run.out), run.out[-3000:]
