"""The project's own local-mode runs leave nothing in the user's container store.

The SageMaker SDKs' local mode starts a job through `docker-compose` (here the shim of bin/sdk-venv.sh:
podman-compose with the project store). podman-compose makes a pod per compose project (`pod_<project>`)
unless told not to, and nothing removes it: the image tier alone left 17 empty pods in the store. Here a
compose project shaped like the SDK's (one service per host on the `sagemaker-local` network, `command: train`
replaced by `true`) runs through the real shims and podman-compose; no pod may exist during or after the run,
and the teardown the image tests share (helpers.remove_compose_project) must leave nothing of it. The run's
output shows no container id (podman-compose passes on each one podman prints).

The shims are made for the test by bin/sdk-venv.sh --shims-only with a `docker` first on PATH whose `info`
fails: a stub (a script in the test's directory), as no Docker daemon can run here; it stands for a docker CLI
with a stopped daemon, which must lead to podman behind the shims.
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest

from .helpers import REPO, compose_project_left, remove_compose_project
from .test_sdk_local import sdk  # noqa: F401 (the SDK v2 venv and the shims, shared)

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(600)]

STUB_DOCKER = """#!/bin/sh
[ "$1" = info ] && echo "Cannot connect to the Docker daemon. Is the docker daemon running?" >&2
exit 1
"""

COMPOSE = """\
version: '2.3'
services:
  algo-1-{suffix}:
    image: {image}
    command: ["true"]
    networks:
      sagemaker-local:
        aliases: [algo-1-{suffix}]
  algo-2-{suffix}:
    image: {image}
    command: ["true"]
    networks:
      sagemaker-local:
        aliases: [algo-2-{suffix}]
networks:
  sagemaker-local:
    name: sagemaker-local
"""


def test_a_local_mode_compose_run_leaves_no_pod_and_teardown_leaves_nothing(
    base_image: str,
    sdk: tuple[str, dict[str, str]],  # noqa: F811
    tmp_path: Path,
) -> None:
    python, sdk_env = sdk
    # This test's shims: bin/sdk-venv.sh beside a daemonless docker (the stub); the SDK venv's podman-compose.
    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "docker").write_text(STUB_DOCKER)
    (stub / "docker").chmod(0o755)
    sdk_dir = tmp_path / "sdk"
    sdk_dir.mkdir()
    (sdk_dir / "v2").symlink_to(Path(python).parents[1])  # the venv the sdk fixture made
    fixture_shims = str(Path(python).parents[2] / "bin")  # build/sdk/bin: not on this test's PATH
    rest = [d for d in sdk_env["PATH"].split(os.pathsep) if d != fixture_shims]
    path = os.pathsep.join([str(stub), *rest])
    made = subprocess.run(
        ["bash", str(REPO / "bin" / "sdk-venv.sh"), "--shims-only", str(sdk_dir)],
        env=sdk_env | {"PATH": path},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    assert "engine: podman (docker is installed but no daemon answers `docker info`)" in made.stderr
    env = sdk_env | {"PATH": f"{sdk_dir / 'bin'}{os.pathsep}{path}"}
    # The project: the compose file's directory (lower-case letters and digits, as podman-compose keeps them).
    project = f"smhvdpods{uuid.uuid4().hex[:12]}"
    root = tmp_path / project
    root.mkdir()
    (root / "docker-compose.yaml").write_text(COMPOSE.format(suffix=project[-5:], image=base_image))
    try:
        proc = subprocess.run(
            # the SDK's own command line (sagemaker/local/image.py)
            ["docker-compose", "-f", str(root / "docker-compose.yaml"), "up", "--abort-on-container-exit"],
            env=env,
            cwd=root,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        # podman's container ids (a bare 64-hex line per container created) are not shown to the user
        ids = [
            line for line in (proc.stdout + proc.stderr).splitlines() if re.fullmatch(r"[0-9a-f]{64}", line)
        ]
        assert ids == [], proc.stdout[-3000:]
        left = compose_project_left(env, project)
        assert len([x for x in left if x.startswith("container ")]) == 2, left  # it ran: both containers
        assert not [x for x in left if x.startswith("pod ")], left
    finally:
        left = remove_compose_project(env, project)
    assert not left, f"left in the store: {left}"
