"""Helpers of the image tier: paths, a bounded wait, timing records, running commands, building images."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORK = REPO / "build" / "images-test"
EXTRA_CA_DIR = Path("/usr/local/share/ca-certificates")
TOOLS = ("buildah", "podman", "skopeo", "runc", "docker-registry", "debootstrap", "shellcheck")
IMAGE_NAME = "localhost/sagemaker-horovod-test"


def wait_until(what: str, probe: Callable[[], bool], timeout: float, first_delay: float = 0.05) -> None:
    """Poll `probe` with exponential backoff until true; fail after `timeout` seconds saying what for."""
    deadline = time.monotonic() + timeout
    delay = first_delay
    while not probe():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


def stop(proc: subprocess.Popen[bytes], timeout: float = 15) -> None:
    """End a background server: SIGTERM, then SIGKILL after `timeout` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def record_timing(event: str, seconds: float, **extra: object) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    entry = {
        "event": event,
        "seconds": round(seconds, 1),
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    entry.update(extra)
    with (WORK / "timings.jsonl").open("a") as f:
        f.write(json.dumps(entry) + "\n")


def run(
    cmd: list[str], env: dict[str, str], timeout: float, log: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `cmd`; on failure show its output (or the log's tail) in the assertion message."""
    if log is None:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        detail = proc.stdout[-3000:] + proc.stderr[-3000:]
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("w") as f:
            proc = subprocess.run(
                cmd, env=env, stdout=subprocess.PIPE, stderr=f, text=True, timeout=timeout, check=False
            )
        detail = f"(log {log})\n" + log.read_text()[-4000:]
    assert proc.returncode == 0, f"{' '.join(cmd)} exited {proc.returncode}:\n{detail}"
    return proc


def run_to_log(
    argv: list[str], env: dict[str, str], cwd: Path, timeout: float, log_name: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run `argv` with its stdout and stderr as one stream (as a user's terminal shows them), kept in
    WORK/log_name; returns the process and how long it ran."""
    start = time.monotonic()
    proc = subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    seconds = time.monotonic() - start
    WORK.mkdir(parents=True, exist_ok=True)
    (WORK / log_name).write_text(proc.stdout)
    return proc, seconds


def without_aws(env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    """`env` as on a machine with no AWS account, configuration or region (files that do not exist), and a
    TMPDIR of the test's own (returned too), where an SDK's local mode writes the job files that the test
    then looks at and removes."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    clean = {k: v for k, v in env.items() if not k.startswith("AWS_")} | {
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "TMPDIR": str(tmp),
        "PYTHONUNBUFFERED": "1",
    }
    return clean, tmp


def compose_project_left(env: dict[str, str], project: str) -> list[str]:
    """What a compose project still holds in the store: its containers (podman-compose labels each with the
    project) and the pod podman-compose makes per project unless run with --in-pod false (pod_<project>)."""
    label = f"label=io.podman.compose.project={project}"
    ps = ["podman", "ps", "-a", "-q", "--filter", label]
    containers = subprocess.run(ps, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    pods = ["podman", "pod", "ps", "-q", "--filter", f"name=^pod_{project}$"]
    pod_ids = subprocess.run(pods, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    return [f"container {c}" for c in containers.split()] + [
        f"pod pod_{project} ({p})" for p in pod_ids.split()
    ]


def remove_compose_project(env: dict[str, str], project: str) -> list[str]:
    """Remove what one compose project left in the store (local mode removes none of its stopped containers,
    as Docker Compose); returns what is still there afterwards, which a test asserts is nothing."""
    label = f"label=io.podman.compose.project={project}"
    if compose_project_left(env, project):
        for cmd in (
            ["podman", "rm", "--force", "--filter", label],
            ["podman", "pod", "rm", "--force", "--ignore", f"pod_{project}"],
        ):
            subprocess.run(cmd, env=env, capture_output=True, timeout=120, check=False)
    return compose_project_left(env, project)


@dataclass(frozen=True)
class BuiltImage:
    immutable: str  # NAME:FLAVOR-GITSHA
    moving: str  # NAME:FLAVOR
    image_id: str
    commit: str  # git HEAD when the build started (what the revision label must say)
    seconds: float


def build_image(
    flavor: str,
    base: str,
    env: dict[str, str],
    engine: str = "buildah",
    name: str = IMAGE_NAME,
    timeout: float = 3600,
) -> BuiltImage:
    cmd = ["bash", str(REPO / "bin" / "build.sh"), "--engine", engine, "--name", name, "--base-image", base]
    # This machine's HTTPS proxy CA (absent on most machines): passed the way a corporate-proxy user would.
    if any(EXTRA_CA_DIR.glob("*.crt")):
        cmd += ["--extra-ca", str(EXTRA_CA_DIR)]
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    start = time.monotonic()
    proc = run([*cmd, flavor], env, timeout, WORK / f"build-{flavor}-{engine}.log")
    seconds = time.monotonic() - start
    refs = proc.stdout.split()
    assert len(refs) == 2, f"bin/build.sh should print two image references, printed {proc.stdout!r}"
    # every build step's line says how long the build has run (a long step is never silent)
    steps = (WORK / f"build-{flavor}-{engine}.log").read_text()
    assert re.search(r"^\[ *\d+ s\] (\[\d+/\d+\] )?STEP \d+/\d+: ", steps, re.MULTILINE), steps[-2000:]
    record_timing(f"build-{flavor}-{engine}", seconds)
    image_id = run(["podman", "image", "inspect", "--format", "{{.Id}}", refs[0]], env, 60).stdout.strip()
    return BuiltImage(immutable=refs[0], moving=refs[1], image_id=image_id, commit=commit, seconds=seconds)
