"""One engine choice for every script (bin/lib/engine.sh); the machine's extra CAs used the same way by each.

No Docker daemon can run on this machine, so `docker` is a stub: a real script in the test's own directory,
first on PATH, whose `info` fails as a CLI without a daemon does (or, standing for a daemon that answers,
succeeds). Everything else is real: the scripts' --dry-run modes (bin/build.sh, bin/push.sh,
bin/local-train.sh) and bin/sdk-venv.sh --shims-only, with podman and a project store of the test's own
(SMHVD_CONTAINERS_DIR: bin/daemonless-env.sh's store, in tmp_path), into which the test imports a one-file
image under the names the scripts look for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from support.ci import in_ci, need_engine, unavailable
from support.scripts import run_script

pytestmark = pytest.mark.integration  # runs the scripts, podman and (for the SDK venvs) pip

REPO = Path(__file__).resolve().parents[2]
HOST_CA_DIR = Path("/usr/local/share/ca-certificates")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
NO_DAEMON = "docker is installed but no daemon answers `docker info`"

# A docker CLI without a daemon (the stub: no daemon can run here): `info` fails as the real CLI does; any
# other call is recorded and fails, so that a script that used this docker would be seen.
STUB_NO_DAEMON = """#!/bin/sh
echo "docker $*" >>"$(dirname "$0")/calls.log"
if [ "$1" = info ]; then
  echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?" >&2
fi
exit 1
"""
# A docker whose daemon answers (a stub again: it stands for a daemon that cannot run here).
STUB_DAEMON = """#!/bin/sh
echo "docker $*" >>"$(dirname "$0")/calls.log"
[ "$1" = info ] && { echo "Server Version: stub"; exit 0; }
exit 1
"""


def host_ca_files() -> list[Path]:
    return sorted(HOST_CA_DIR.glob("*.crt"))


def pem_count() -> int:
    return sum(p.read_text().count("-----BEGIN CERTIFICATE-----") for p in host_ca_files())


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """PATH with a daemonless docker stub first; a project store of the test's own; no store chosen."""
    need_engine()
    if os.geteuid() != 0:
        unavailable("the project store is rootful (podman as root)")
    stub_dir = tmp_path / "stub-bin"
    stub_dir.mkdir()
    (stub_dir / "docker").write_text(STUB_NO_DAEMON)
    (stub_dir / "docker").chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CONTAINERS_", "DOCKER_"))}
    environ.pop("REGISTRY_AUTH_FILE", None)
    environ["PATH"] = f"{stub_dir}{os.pathsep}{environ['PATH']}"
    environ["SMHVD_CONTAINERS_DIR"] = str(tmp_path / "containers")
    return environ


def answering_daemon(env: dict[str, str]) -> None:
    stub = Path(env["PATH"].split(os.pathsep)[0]) / "docker"
    stub.write_text(STUB_DAEMON)


def store_env(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(REPO / "bin" / "daemonless-env.sh"), "--engine-only"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return env | dict(line.split("=", 1) for line in out.splitlines())


def import_image(env: dict[str, str], tmp_path: Path, *names: str) -> None:
    """A one-file image in the test's project store under `names` (podman import: no registry needed)."""
    rootfs = tmp_path / "rootfs.tar"
    marker = tmp_path / "marker"
    marker.write_text("smhvd test image\n")
    with tarfile.open(rootfs, "w") as tar:
        tar.add(marker, arcname="marker")
    penv = store_env(env)
    subprocess.run(["podman", "import", "-q", str(rootfs), names[0]], env=penv, check=True, timeout=120)
    for name in names[1:]:
        subprocess.run(["podman", "tag", names[0], name], env=penv, check=True, timeout=60)


def script(env: dict[str, str], name: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_script(name, *args, env=env)


def engine_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ": engine: " in line]


def dry_run_argv(stderr: str, name: str) -> str:
    line = next(line for line in stderr.splitlines() if line.startswith(f"{name}: dry run: "))
    return line.removeprefix(f"{name}: dry run: ")


def test_without_a_daemon_every_script_says_podman_and_the_project_store(
    env: dict[str, str], tmp_path: Path
) -> None:
    import_image(env, tmp_path, "localhost/sagemaker-horovod:cpu")
    store = tmp_path / "containers" / "storage"
    expected = f"engine: podman ({NO_DAEMON}); store: {store} (the project's store)"
    runs = {
        "build.sh": script(env, "build.sh", "--dry-run", "cpu"),
        "push.sh": script(
            env, "push.sh", "--dry-run", "--registry", "127.0.0.1:5000", "sagemaker-horovod:cpu"
        ),
        "local-train.sh": script(
            env, "local-train.sh", "--dry-run", "--work", str(tmp_path / "ml"), "sagemaker-horovod:cpu"
        ),
        "sdk-venv.sh": script(env, "sdk-venv.sh", "--shims-only", str(tmp_path / "sdk")),
    }
    for name, proc in runs.items():
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
        assert engine_lines(proc.stderr) == [f"{name}: {expected}"], proc.stderr
    assert dry_run_argv(runs["build.sh"].stderr, "build.sh").startswith("'podman' 'build' ")
    assert dry_run_argv(runs["push.sh"].stderr, "push.sh").startswith("'podman' 'push' '--format' 'v2s2' ")
    assert dry_run_argv(runs["local-train.sh"].stderr, "local-train.sh").startswith("'podman' 'run' ")
    # The docker stub was asked `info` and nothing else.
    calls = (Path(env["PATH"].split(os.pathsep)[0]) / "calls.log").read_text().splitlines()
    assert set(calls) == {"docker info"}, calls


def test_the_sdk_shims_answer_from_the_project_store(env: dict[str, str], tmp_path: Path) -> None:
    import_image(env, tmp_path, "localhost/smhvd-shim-probe:1")
    proc = script(env, "sdk-venv.sh", "--shims-only", str(tmp_path / "sdk"))
    assert proc.returncode == 0, proc.stderr
    shims = tmp_path / "sdk" / "bin"
    # The shims first on PATH, as the SDK's local mode and the notebooks run them; no store in the env.
    shim_env = env | {"PATH": f"{shims}{os.pathsep}{env['PATH']}"}
    images = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        env=shim_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    assert images == ["localhost/smhvd-shim-probe:1"]
    # With the shims on PATH, a script still sees that no Docker daemon is there (the shim is not one).
    build = script(shim_env, "build.sh", "--dry-run", "cpu")
    assert build.returncode == 0, build.stderr
    assert (
        "engine: podman (the docker on PATH is this project's podman shim)" in engine_lines(build.stderr)[0]
    )
    compose = (shims / "docker-compose").read_text()
    assert (
        '"$podman_compose" --in-pod false "${args[@]}" | grep' in compose
    )  # no pod per job: see tests/images


def test_engine_podman_builds_from_the_base_image_in_the_project_store(
    env: dict[str, str], tmp_path: Path
) -> None:
    absent = script(env, "build.sh", "--engine", "podman", "--dry-run", "cpu")
    assert absent.returncode == 0, absent.stderr
    assert "'BASE_IMAGE=" not in dry_run_argv(absent.stderr, "build.sh")
    assert (
        "build.sh: base image: the Dockerfile's docker.io/library/debian:bookworm-slim (no "
        "localhost/debian:bookworm in the store above: bin/make-base-image.sh makes it without Docker Hub)"
    ) in absent.stderr.splitlines()

    import_image(env, tmp_path, "localhost/debian:bookworm")
    for engine in ("podman", "buildah"):
        if engine == "buildah" and shutil.which("buildah") is None:
            continue
        proc = script(env, "build.sh", "--engine", engine, "--dry-run", "cpu")
        assert proc.returncode == 0, proc.stderr
        assert engine_lines(proc.stderr) == [
            f"build.sh: engine: {engine} (--engine {engine}); store: {tmp_path / 'containers' / 'storage'}"
            " (the project's store)"
        ]
        assert "'--build-arg' 'BASE_IMAGE=localhost/debian:bookworm'" in dry_run_argv(proc.stderr, "build.sh")


def test_local_train_names_the_store_when_the_image_is_not_in_it(env: dict[str, str], tmp_path: Path) -> None:
    proc = script(env, "local-train.sh", "--work", str(tmp_path / "ml"), "sagemaker-horovod:cpu")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        "local-train.sh: image sagemaker-horovod:cpu is not in the store above: build it with bin/build.sh "
        "(same engine choice, same store)"
    )
    assert not (tmp_path / "ml").exists()  # nothing made before the check


def test_a_daemon_that_answers_is_used(env: dict[str, str], tmp_path: Path) -> None:
    answering_daemon(env)
    build = script(env, "build.sh", "--dry-run", "cpu")
    assert build.returncode == 0, build.stderr
    assert engine_lines(build.stderr) == [
        "build.sh: engine: docker (its daemon answers `docker info`); store: the Docker daemon's"
    ]
    assert dry_run_argv(build.stderr, "build.sh").startswith("'docker' 'build' ")
    shims = script(env, "sdk-venv.sh", "--shims-only", str(tmp_path / "sdk"))
    assert shims.returncode == 0, shims.stderr
    assert list((tmp_path / "sdk" / "bin").iterdir()) == []  # the SDK uses that docker itself


def test_engine_docker_without_a_daemon_is_one_line(env: dict[str, str]) -> None:
    proc = script(env, "build.sh", "--engine", "docker", "--dry-run", "cpu")
    assert proc.returncode == 2
    assert proc.stderr == (
        "build.sh: --engine docker: no daemon answers `docker info` (without --engine: podman with the "
        "project's store)\n"
    )


def test_an_unknown_engine_is_one_line(env: dict[str, str]) -> None:
    proc = script(env, "local-train.sh", "--engine", "buildah", "--dry-run", "x:1")
    assert proc.returncode == 2
    assert proc.stderr == "local-train.sh: --engine must be one of: docker podman (got 'buildah')\n"


# --- The machine's extra CA certificates (a proxy that re-signs TLS), found once, used by every script. ---


@pytest.fixture
def host_cas() -> list[Path]:
    files = host_ca_files()
    if not files:
        if in_ci():
            pytest.fail(f"CI runs behind a TLS-re-signing proxy: no *.crt in {HOST_CA_DIR}")
        pytest.skip(f"this machine has no extra CA certificates ({HOST_CA_DIR}/*.crt)")
    return files


def test_the_build_trusts_the_machines_extra_cas_by_default(
    env: dict[str, str], host_cas: list[Path]
) -> None:
    proc = script(env, "build.sh", "--dry-run", "cpu")
    assert proc.returncode == 0, proc.stderr
    argv = dry_run_argv(proc.stderr, "build.sh")
    assert f"'--build-arg' 'EXTRA_CA_CERTS=<{pem_count()} PEM certificate(s)>'" in argv
    assert (
        f"build.sh: trusting this machine's extra CA certificates while downloading: {HOST_CA_DIR}/*.crt"
        in proc.stderr.splitlines()
    )
    explicit = script(env, "build.sh", "--dry-run", "--extra-ca", str(host_cas[0]), "cpu")
    first = host_cas[0].read_text().count("-----BEGIN CERTIFICATE-----")
    assert f"EXTRA_CA_CERTS=<{first} PEM certificate(s)>'" in dry_run_argv(explicit.stderr, "build.sh")


def test_a_local_job_trusts_the_machines_ca_bundle(
    env: dict[str, str], host_cas: list[Path], tmp_path: Path
) -> None:
    import_image(env, tmp_path, "localhost/sagemaker-horovod:cpu")
    proc = script(env, "local-train.sh", "--dry-run", "--work", str(tmp_path / "ml"), "sagemaker-horovod:cpu")
    assert proc.returncode == 0, proc.stderr
    argv = dry_run_argv(proc.stderr, "local-train.sh")
    mounted = "/etc/ssl/certs/smhvd-host-ca-bundle.crt"
    assert f"'--volume' '{HOST_CA_BUNDLE}:{mounted}:ro'" in argv
    for key in ("PIP_CERT", "AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        assert f"'--env' '{key}={mounted}'" in argv
    # The user's --env comes after, so it wins.
    user = script(
        env,
        "local-train.sh",
        "--dry-run",
        "--work",
        str(tmp_path / "ml2"),
        "--env",
        "PIP_CERT=/mine.pem",
        "sagemaker-horovod:cpu",
    )
    user_argv = dry_run_argv(user.stderr, "local-train.sh")
    assert user_argv.index("'PIP_CERT=/mine.pem'") > user_argv.index(f"'PIP_CERT={mounted}'")


def test_the_sdk_venvs_pip_reaches_pypi_through_the_proxy(
    env: dict[str, str], host_cas: list[Path], tmp_path: Path
) -> None:
    """pinned_venv (bin/sdk-venv.sh, bin/sdk-v3-venv.sh) with no pip configuration at all gives pip the
    machine's bundle and installs from PyPI through the proxy. (A pip with its own CA list, certifi's, fails
    there; Debian's venv pip is patched to read the system store, so that failure cannot be shown here.)"""
    bare = {k: v for k, v in env.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    venv = tmp_path / "venv"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            'source "$1"; pinned_venv probe 0 "$2" six==1.16.0',
            "bash",
            str(REPO / "bin" / "lib" / "pinned-venv.sh"),
            str(venv),
        ],
        env=bare,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"probe: pip trusts this machine's CA bundle {HOST_CA_BUNDLE} (extra CAs in {HOST_CA_DIR})" in (
        proc.stderr.splitlines()
    )
    assert re.search(
        r"^six-1\.16\.0\.dist-info$", "\n".join(p.name for p in venv.glob("lib/*/site-packages/*")), re.M
    )


# --- bin/local-train.sh --hosts N and bin/push.sh to a registry on this machine: what they would run. ---


def test_local_train_with_hosts_gives_each_its_tree_name_and_gpus(
    env: dict[str, str], tmp_path: Path
) -> None:
    import_image(env, tmp_path, "localhost/sagemaker-horovod:gpu")
    work = tmp_path / "job"
    args = ["--dry-run", "--hosts", "2", "--gpu", "--gpus-per-host", "2", "--work", str(work)]
    proc = script(env, "local-train.sh", *args, "sagemaker-horovod:gpu", "preflight")
    assert proc.returncode == 0, proc.stderr
    runs = [line for line in proc.stderr.splitlines() if line.startswith("local-train.sh: dry run: ")]
    assert len(runs) == 2, proc.stderr
    network = re.search(r"'--network' '([^']+)'", runs[0])
    assert network and f"'--network' '{network.group(1)}'" in runs[1]  # one network, both hosts
    for k, (argv, gpus) in enumerate(zip(runs, ("'0' '1'", "'2' '3'"), strict=True), start=1):
        host = f"algo-{k}"
        assert f"'--volume' '{work / host}:/opt/ml'" in argv
        assert f"'--network-alias' '{host}' '--hostname' '{host}'" in argv
        devices = re.findall(r"'--device' 'nvidia.com/gpu=(\d+)'", argv)
        assert " ".join(f"'{d}'" for d in devices) == gpus
        assert argv.endswith("'sagemaker-horovod:gpu' 'preflight'"), argv
        config = json.loads((work / host / "input" / "config" / "resourceconfig.json").read_text())
        assert (config["current_host"], config["hosts"]) == (host, ["algo-1", "algo-2"])
    # docker: one --gpus value naming the devices (a quoted CSV field, as docker's --gpus reads it)
    answering_daemon(env)
    docker = script(env, "local-train.sh", *args[:-1], str(tmp_path / "job2"), "--engine", "docker", "x:1")
    assert docker.returncode == 0, docker.stderr
    assert "'--gpus' '\"device=2,3\"'" in docker.stderr.splitlines()[-1], docker.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hosts", "0"], "--hosts '0': expected a number from 1 to 64"),
        (["--hosts", "2", "--network", "host"], "--network host: 2 hosts need a network of their own"),
        (["--gpus-per-host", "1"], "--gpus-per-host needs --gpu"),
        (["x:1", "serve"], "'serve': expected train or preflight after the image"),
    ],
)
def test_local_train_refuses_in_one_line(env: dict[str, str], args: list[str], message: str) -> None:
    proc = script(env, "local-train.sh", "--dry-run", *args, "x:1")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1].startswith(f"local-train.sh: {message}"), proc.stderr


def test_push_to_a_registry_on_this_machine_is_plain_http_on_any_port(
    env: dict[str, str], tmp_path: Path
) -> None:
    import_image(env, tmp_path, "localhost/sagemaker-horovod:cpu")
    for registry, plain in (
        ("127.0.0.1:5013", True),
        ("localhost:5017", True),
        ("registry.example:5000", False),
    ):
        proc = script(env, "push.sh", "--dry-run", "--registry", registry, "sagemaker-horovod:cpu")
        assert proc.returncode == 0, proc.stderr
        assert ("'--tls-verify=false'" in dry_run_argv(proc.stderr, "push.sh")) == plain, (
            registry,
            proc.stderr,
        )


def test_a_cached_build_names_only_its_own_tags(env: dict[str, str], tmp_path: Path) -> None:
    """Issue 52: podman prints `Successfully tagged X` for every name a cached image already has, so the
    user's bin/build.sh listed the image tests' names. bin/build.sh passes the build's output through
    own_tags; here a real podman build of a one-line Dockerfile, cached under the tests' name, then built
    under the user's."""
    import_image(env, tmp_path, "localhost/tiny:base")
    (tmp_path / "Dockerfile").write_text("FROM localhost/tiny:base\nLABEL smhvd.test=1\n")
    penv = store_env(env)
    build = ["podman", "build", "--format", "docker", "--layers", str(tmp_path)]
    subprocess.run(
        [*build[:-1], "-t", "sagemaker-horovod-test:cpu-1", build[-1]], env=penv, check=True, timeout=300
    )
    filtered = f'source "{REPO}/bin/lib/phase.sh"; set -o pipefail; ' '"${@:3}" 2>&1 | own_tags "$1" "$2"'
    proc = subprocess.run(
        [
            "bash",
            "-c",
            filtered,
            "bash",
            "sagemaker-horovod:cpu-1",
            "sagemaker-horovod:cpu",
            *build[:-1],
            "-t",
            "sagemaker-horovod:cpu-1",
            "-t",
            "sagemaker-horovod:cpu",
            build[-1],
        ],
        env=penv,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    tagged = [line for line in proc.stdout.splitlines() if line.startswith("Successfully tagged ")]
    assert tagged == [
        "Successfully tagged localhost/sagemaker-horovod:cpu-1",
        "Successfully tagged localhost/sagemaker-horovod:cpu",
    ], proc.stdout
    # what podman itself printed: the tests' name too (the reason for the filter)
    plain = subprocess.run(
        [*build[:-1], "-t", "sagemaker-horovod:cpu", build[-1]],
        env=penv,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "Successfully tagged localhost/sagemaker-horovod-test:cpu-1" in plain.stdout, plain.stdout
