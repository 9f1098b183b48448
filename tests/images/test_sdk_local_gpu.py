"""What the SageMaker Python SDK v2 asks of docker/podman for `instance_type="local_gpu"`, read from the
compose file it writes itself (no GPU here, so nothing is started: stand-ins for `docker`, `docker-compose`
and `podman` keep what they are given and run nothing).

The SDK is real (the venv of bin/sdk-venv.sh, sagemaker 2.257.7) and so is podman-compose 1.6.0, asked with
`--dry-run` what `podman create` it would run for that file. Found: the SDK asks for every GPU with the
Compose spec's device reservation (`capabilities: [gpu]`, `count: all`, no driver), which Docker Compose v2
with the NVIDIA Container Toolkit honours but podman-compose ignores (it needs `driver: nvidia`): the
container would start without a GPU. `local.container_config` `devices: [nvidia.com/gpu=all]` in the SDK's
local config gives podman the CDI device, the same one bin/local-train.sh --gpu passes (and `shm_size` the
/dev/shm NCCL wants, which the SDK leaves at the engine's 64 MB). docs/sdk.md says so.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .helpers import REPO
from .test_sdk_local import sdk  # noqa: F401 (the SDK venv fixture, shared with the local-mode test)

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(3600)]

IMAGE = "localhost/sagemaker-horovod:gpu"
# The SDK's estimator as SageMaker's Horovod samples write it, with instance_type local_gpu; argv[3]
# (optional): the local config's container_config as JSON. Prints the result of each fit() on one line.
DRIVER = """
import json, sys
import boto3
from sagemaker.local import LocalSession
from sagemaker.tensorflow import TensorFlow

work, code = sys.argv[1], sys.argv[2]
boto = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
no_telemetry = {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}
config = {"SchemaVersion": "1.0", "SageMaker": no_telemetry}
session = LocalSession(boto_session=boto, sagemaker_config=config)
local = {"local_code": True, "container_root": work}
if len(sys.argv) > 3:
    local["container_config"] = json.loads(sys.argv[3])
session.config = {"local": local}
for count in (2, 1):
    try:
        TensorFlow(
            image_uri="IMAGE_URI",
            role="arn:aws:iam::123456789012:role/SageMakerRole",
            instance_type="local_gpu",
            instance_count=count,
            entry_point="train.py",
            source_dir=code,
            output_path=f"file://{work}/output",
            distribution={"mpi": {"enabled": True, "processes_per_host": 8,
                                  "custom_mpi_options": "-verbose --NCCL_DEBUG=INFO"}},
            sagemaker_session=session,
        ).fit(logs="None")
        print(f"instance_count={count}: fit returned")
    except RuntimeError as exc:
        print(f"instance_count={count}: RuntimeError: {' '.join(str(exc).split())}")
""".replace("IMAGE_URI", IMAGE)

STANDINS = {
    # `docker compose version` fails: the SDK takes the docker-compose below
    "docker": "#!/bin/sh\necho 'docker: stand-in, no engine' >&2\nexit 1\n",
    # keeps the compose file the SDK wrote, starts nothing
    "docker-compose": (
        "#!/bin/sh\n" "while [ $# -gt 0 ]; do\n" '  [ "$1" = -f ] && cp "$2" "$COMPOSE_OUT"; shift\n' "done\n"
    ),
    # podman-compose --dry-run still asks podman about existing containers and networks: none
    "podman": (
        "#!/bin/sh\n"
        'case "$1" in\n'
        '  ps) echo "[]";;\n'
        '  --version|version) echo "podman version 4.3.1";;\n'
        "esac\n"
    ),
}


def compose_file(sdk_python: str, env: dict[str, str], tmp: Path, *config: str) -> tuple[str, dict]:
    """(the driver's output, the compose file the SDK wrote for its one container) with `config` as the
    local config's container_config."""
    import yaml

    standins = tmp / "standins"
    standins.mkdir(exist_ok=True)
    for name, text in STANDINS.items():
        (standins / name).write_text(text)
        (standins / name).chmod(0o755)
    (tmp / "code").mkdir(exist_ok=True)
    (tmp / "code" / "train.py").write_text("print('not run')\n")
    (tmp / "driver.py").write_text(DRIVER)
    work = tmp / "work"
    work.mkdir(exist_ok=True)
    out = tmp / "docker-compose.yaml"
    run_env = dict(env, PATH=f"{standins}:{env['PATH']}", COMPOSE_OUT=str(out), HOME=str(tmp))
    argv = [sdk_python, str(tmp / "driver.py"), str(work), str(tmp / "code"), *config]
    proc = subprocess.run(argv, env=run_env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout, yaml.safe_load(out.read_text())


def podman_create(sdk_python: str, compose: Path, env: dict[str, str]) -> list[str]:
    """The `podman create` podman-compose 1.6.0 would run for the compose file's service (--dry-run)."""
    standins = compose.parent / "standins"
    argv = [
        str(Path(sdk_python).parent / "podman-compose"),
        "--verbose",
        "--dry-run",
        "-f",
        str(compose),
        "up",
    ]
    proc = subprocess.run(
        argv,
        env=dict(env, PATH=f"{standins}:{env['PATH']}"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "podman create " in line]
    assert len(lines) == 1, proc.stdout[-2000:] + proc.stderr[-3000:]
    return lines[0].split("podman create ", 1)[1].split()


def test_the_sdk_asks_compose_for_every_gpu_of_one_container(sdk, tmp_path: Path) -> None:  # noqa: F811
    python, env = sdk
    output, compose = compose_file(python, env, tmp_path)
    assert [line for line in output.splitlines() if line.startswith("instance_count=")] == [
        "instance_count=2: RuntimeError: Distributed Training in Local GPU is not supported. Set "
        "instance_count to 1.",
        "instance_count=1: fit returned",
    ]
    [(host, service)] = compose["services"].items()
    assert host.startswith("algo-1-")
    assert (service["image"], service["command"]) == (IMAGE, "train")
    assert service["deploy"] == {
        "resources": {"reservations": {"devices": [{"capabilities": ["gpu"], "count": "all"}]}}
    }
    assert "shm_size" not in service and "devices" not in service and "runtime" not in service

    # podman-compose takes a device reservation only with `driver: nvidia`: no GPU would reach the container
    args = podman_create(python, tmp_path / "docker-compose.yaml", env)
    assert args[-2:] == [IMAGE, "train"]
    assert not any(arg.startswith("nvidia.com/gpu") for arg in args)


def test_podman_gets_every_gpu_through_the_local_configs_container_config(sdk, tmp_path: Path) -> None:  # noqa: F811
    python, env = sdk
    _, compose = compose_file(python, env, tmp_path, '{"devices": ["nvidia.com/gpu=all"], "shm_size": "1g"}')
    [service] = compose["services"].values()
    assert (service["devices"], service["shm_size"]) == (["nvidia.com/gpu=all"], "1g")
    args = podman_create(python, tmp_path / "docker-compose.yaml", env)
    given = {flag: args[i + 1] for i, flag in enumerate(args[:-1]) if flag in ("--device", "--shm-size")}
    # the CDI name bin/local-train.sh --gpu passes; NCCL's shared memory (the engines' /dev/shm is 64 MB)
    assert given == {"--device": "nvidia.com/gpu=all", "--shm-size": "1g"}
    assert "nvidia.com/gpu=all" in (REPO / "bin" / "local-train.sh").read_text()
