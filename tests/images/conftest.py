"""Fixtures of the image tier: everything real, no Docker engine needed.

- a daemonless container toolchain (buildah/podman + runc, overlay storage) configured privately by
  bin/daemonless-env.sh, its layer store in the machine's cache (~/.cache/smhvd/containers-netavark, shared
  by every checkout; CI=true: missing tools are apt-installed, never skipped);
- a Debian base image made with debootstrap from the Debian mirror (bin/make-base-image.sh, cached);
- the CPU and GPU images built FROM it by bin/build.sh (warm layer cache: a rebuild takes seconds);
- a local registry (the CNCF distribution registry) on a free port of 127.0.0.1 (bin/local-registry.sh);
- podman's Docker-compatible API service, so the docker CLI and scripts written for docker run for real.

Build and run durations are appended to build/images-test/timings.jsonl (figures for the README).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from support.ci import in_ci, unavailable

from .helpers import (
    REPO,
    TOOLS,
    WORK,
    BuiltImage,
    build_image,
    record_timing,
    run,
    stop,
    wait_until,
)

# The GPU image build is part of the tier (cold it is the longest step; warm, seconds). For a quicker local
# run of the CPU part only: SMHVD_SKIP_GPU_IMAGE=1 (ignored in CI, which runs everything).
SKIP_GPU = os.environ.get("SMHVD_SKIP_GPU_IMAGE") == "1" and not in_ci()
collect_ignore = ["test_gpu_image.py"] if SKIP_GPU else []


@pytest.fixture(scope="session")
def engine_env() -> dict[str, str]:
    """Environment selecting the private podman/buildah configuration (tools installed in CI)."""
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    cmd = ["bash", str(REPO / "bin" / "daemonless-env.sh")]
    if missing:
        if not in_ci():
            pytest.skip(f"{', '.join(missing)} not installed: run bin/daemonless-env.sh --install (CI does)")
        cmd.append("--install")
    if os.geteuid() != 0:
        unavailable("the image tier runs buildah/podman as root (rootful overlay storage)")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=900).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        key, _, value = line.partition("=")
        env[key] = value
    # Only the image under test, never a user's or the CI's Docker config.
    env["DOCKER_CONFIG"] = str(WORK / "docker-config")
    return env


@pytest.fixture(scope="session")
def base_image(engine_env: dict[str, str]) -> str:
    tag = "localhost/debian:bookworm"
    start = time.monotonic()
    run(
        ["bash", str(REPO / "bin" / "make-base-image.sh"), "--tag", tag],
        engine_env,
        900,
        WORK / "base-image.log",
    )
    record_timing("base-image", time.monotonic() - start)
    return tag


@pytest.fixture(scope="session")
def cpu_image(engine_env: dict[str, str], base_image: str) -> BuiltImage:
    return build_image("cpu", base_image, engine_env)


@pytest.fixture(scope="session")
def registry(engine_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real registry (docker-registry serve) on 127.0.0.1, plain HTTP, empty at start, started as a user
    starts one (bin/local-registry.sh, `make registry`): the project's podman configuration then reaches it
    over plain HTTP, and --stop forgets it again.

    Its port is the first free one of 5010-5019 (the range this tier's registries take: another test run, or a
    user's registry, may hold 5000)."""
    port = next((p for p in REGISTRY_PORTS if port_is_free(p)), None)
    if port is None:
        pytest.fail(f"no free port in {REGISTRY_PORTS[0]}-{REGISTRY_PORTS[-1]} for the test registry")
    script = ["bash", str(REPO / "bin" / "local-registry.sh"), "--port", str(port)]
    root = tmp_path_factory.mktemp("registry")
    addr = run([*script, "--dir", str(root)], engine_env, 60).stdout.strip()
    assert addr == f"127.0.0.1:{port}", addr
    try:
        yield addr
    finally:
        run([*script, "--dir", str(root), "--stop"], engine_env, 60)


REGISTRY_PORTS = range(5010, 5020)


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


@pytest.fixture(scope="session")
def docker_env(engine_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """The docker CLI pointed at `podman system service` (same image store as buildah/podman above)."""
    if shutil.which("docker") is None:
        if not in_ci():
            pytest.skip("the docker CLI is not installed (apt-get install docker.io; CI installs it)")
        subprocess.run(
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "docker.io"],
            env=dict(engine_env, DEBIAN_FRONTEND="noninteractive"),
            check=True,
            timeout=900,
        )
    sock = WORK / "podman.sock"
    sock.unlink(missing_ok=True)
    WORK.mkdir(parents=True, exist_ok=True)
    log = (WORK / "podman-service.log").open("w")
    proc = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{sock}"],
        env=engine_env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    env = dict(engine_env, DOCKER_HOST=f"unix://{sock}", DOCKER_BUILDKIT="0")

    def answers() -> bool:
        assert (
            proc.poll() is None
        ), f"podman system service exited {proc.returncode}: see {WORK / 'podman-service.log'}"
        return (
            subprocess.run(
                ["docker", "version"], env=env, capture_output=True, check=False, timeout=30
            ).returncode
            == 0
        )

    try:
        wait_until("podman's Docker API to answer `docker version`", answers, timeout=60)
        yield env
    finally:
        stop(proc)
        log.close()
        sock.unlink(missing_ok=True)


@pytest.fixture
def podman_network(engine_env: dict[str, str]) -> Iterator[str]:
    """A podman bridge network of its own (aardvark-dns resolves --network-alias names); removed after."""
    name = f"smhvd-test-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    run(["podman", "network", "create", name], engine_env, 60)
    try:
        yield name
    finally:
        subprocess.run(
            ["podman", "network", "rm", "--force", name],
            env=engine_env,
            capture_output=True,
            timeout=120,
            check=False,
        )
