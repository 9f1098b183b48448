"""The CPU image, built daemonless from a debootstrap base: what SageMaker and users rely on.

`docker run IMAGE train` runs a 2-process Horovod job from a SageMaker /opt/ml tree; ssh between containers of
the image is key-only; bin/push.sh pushes Docker v2 manifests to a registry that gives the same image back;
bin/build.sh and bin/local-train.sh work through the docker CLI (against podman's API service).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from .helpers import IMAGE_NAME, REPO, WORK, BuiltImage, build_image, record_timing, run

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(3600)]

DOCKER_V2 = "application/vnd.docker.distribution.manifest.v2+json"
GB = 1000**3

# A tiny Horovod Keras job: every rank checks the allreduce, records what it saw, rank 0 saves the model.
TINY_JOB = """
import argparse, json, os, socket
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, required=True)
parser.add_argument("--units", type=int, required=True)
args = parser.parse_args()
hvd.init()
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
data = np.load(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "data.npz"))
x, y = data["x"][hvd.rank()::hvd.size()], data["y"][hvd.rank()::hvd.size()]
model = tf.keras.Sequential([tf.keras.layers.Dense(args.units, activation="relu"), tf.keras.layers.Dense(1)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
history = model.fit(x, y, batch_size=16, epochs=args.epochs, verbose=0,
                    callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])
total = float(hvd.allreduce(tf.constant(float(hvd.rank())), op=hvd.Sum))
out = os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], f"rank-{hvd.rank()}.json")
with open(out, "w") as f:
    json.dump({"rank": hvd.rank(), "size": hvd.size(), "sum_of_ranks": total,
               "epochs": len(history.history["loss"]), "host": os.environ["SM_CURRENT_HOST"]}, f)
if hvd.rank() == 0:
    model.save(os.path.join(os.environ["SM_MODEL_DIR"], "tiny.keras"))
"""


# The MNIST reference script's loader, inside the image, on the data embedded in it (no channel given).
EMBEDDED_DATA = """
import mnist_data
for name in mnist_data.DATASETS:
    train, test = mnist_data.load(mnist_data.resolve_source(name, {}))
    print(name, len(train.labels), len(test.labels))
"""


def podman(env: dict[str, str], *args: str, timeout: float = 600) -> str:
    return run(["podman", *args], env, timeout).stdout


def write_tiny_job(tmp: Path) -> tuple[Path, Path, Path]:
    code = tmp / "code"
    code.mkdir()
    (code / "tiny_job.py").write_text(TINY_JOB)
    data = tmp / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    np.savez(data / "data.npz", x=x, y=x.sum(axis=1, keepdims=True))
    hps = tmp / "hyperparameters.json"
    hps.write_text(json.dumps({"epochs": 2, "units": 8}))
    return code, data, hps


# NCHW convolution, pooling, transposed convolution and their gradients in a graph (tensorpack's FasterRCNN
# example is NCHW throughout): TensorFlow's own CPU kernels refuse NCHW; oneDNN, which the CPU image turns on
# (TF_ENABLE_ONEDNN_OPTS=1), has them.
NCHW_PROBE = """
import tensorflow as tf
@tf.function
def grads(x, w):
    with tf.GradientTape() as tape:
        tape.watch([x, w])
        y = tf.nn.conv2d(x, w, 1, "SAME", data_format="NCHW")
        y = tf.nn.max_pool2d(y, 2, 2, "VALID", data_format="NCHW")
        y = tf.nn.conv2d_transpose(y, tf.ones([2, 2, 4, 4]), [1, 4, 8, 8], 2, data_format="NCHW")
        loss = tf.reduce_sum(y)
    return tape.gradient(loss, [x, w])
print("nchw gradients", *(g.shape for g in grads(tf.ones([1, 3, 8, 8]), tf.ones([3, 3, 3, 4]))))
"""


NOT_RUNTIME = ("smhvd_sim", "smhvd_dev", "sagemaker_training", "matplotlib", "pandas", "pytest", "moto")
NOT_RUNTIME_PROBE = (
    "import importlib.util as u;"
    f" print('not runtime, present:', [m for m in {NOT_RUNTIME!r} if u.find_spec(m)])"
)


def test_image_is_a_sagemaker_training_image(cpu_image: BuiltImage, engine_env: dict[str, str]) -> None:
    info = json.loads(podman(engine_env, "image", "inspect", cpu_image.immutable))[0]
    assert info["Config"]["Cmd"] == ["train"]
    assert not info["Config"].get("Entrypoint")
    assert info["Labels"]["org.opencontainers.image.revision"] == cpu_image.commit
    assert info["Labels"]["org.opencontainers.image.version"]
    assert (
        podman(engine_env, "image", "inspect", "--format", "{{.ManifestType}}", cpu_image.immutable).strip()
        == DOCKER_V2
    )
    assert info["Size"] <= 1.5 * GB, f"CPU image is {info['Size'] / GB:.3f} GB, the budget is <= 1.5 GB"
    record_timing("size-cpu", 0, bytes=info["Size"])

    probe = (
        "set -e; command -v train; command -v smhvd-train; test -d /run/sshd; ls /opt/smhvd/examples;"
        " ls /etc/ssh/ssh_host_ed25519_key; passwd -S root; horovodrun --check-build; train --help;"
        f" python -c {shlex.quote(NOT_RUNTIME_PROBE)};"
        f" TF_CPP_MIN_LOG_LEVEL=2 python -c {shlex.quote(NCHW_PROBE)};"
        f" cd /opt/smhvd/examples/mnist && python -c {shlex.quote(EMBEDDED_DATA)}"
    )
    out = podman(engine_env, "run", "--rm", "--network", "none", cpu_image.immutable, "bash", "-c", probe)
    assert "/opt/venv/bin/train" in out
    assert "mnist" in out
    assert "root L " in out  # no password can log in
    for built in ("TensorFlow", "MPI", "Gloo"):
        assert f"[X] {built}" in out, out
    # The runtime image carries the runtime only: no simulator, dev helpers, benchmark or test tools.
    assert "not runtime, present: []" in out, out
    # Both datasets of the MNIST reference script are in the image: a job needs no data channel.
    assert "mnist 60000 10000" in out, out
    assert "fashion_mnist 60000 10000" in out, out
    # tensorpack's NCHW models train on the CPU image as they are.
    assert "nchw gradients (1, 3, 8, 8) (3, 3, 3, 4)" in out, out


# A line of TensorFlow's C++ log at INFO: `2026-11-28 05:06:23.12: I tensorflow/core/util/port.cc:113] ...`
TF_INFO_LINE = re.compile(r"^\S+ \S+: I \S+:\d+\] ", re.MULTILINE)


def test_tensorflows_info_lines_are_off_unless_the_user_asks(
    cpu_image: BuiltImage, engine_env: dict[str, str]
) -> None:
    """docs/output.md: the image's default TF_CPP_MIN_LOG_LEVEL=1 keeps TensorFlow's start-up INFO lines out
    of every rank's log; a user's own value (here 0, as `environment=` or `--env` give it) brings them
    back."""

    def stderr_of(*options: str) -> str:
        probe = "import tensorflow as tf; print(float(tf.reduce_sum(tf.ones([2]))))"
        argv = [
            "podman",
            "run",
            "--rm",
            "--network",
            "none",
            *options,
            cpu_image.immutable,
            "python",
            "-c",
            probe,
        ]
        proc = run(argv, engine_env, 300)
        assert proc.stdout.strip() == "2.0"
        return proc.stderr

    assert TF_INFO_LINE.findall(stderr_of()) == []
    assert TF_INFO_LINE.findall(stderr_of("--env", "TF_CPP_MIN_LOG_LEVEL=0")), "no INFO line at level 0"


def test_preflight_on_its_own_checks_the_container_with_no_false_alarm(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    """`docker run IMAGE preflight` on a machine (no SageMaker tree), with the engine's default /dev/shm
    (podman: 64 MB): a CPU check of one rank needs 4 MB of it (docs/preflight.md), so nobody is named, and
    the summary says what a standalone check did. The README's command, `bin/local-train.sh IMAGE preflight`
    (the engine and store chosen as for every script), passes too; neither prints a pre-flight warning."""
    argv = ["podman", "run", "--rm", "--network", "none", cpu_image.immutable, "preflight"]
    proc = subprocess.run(argv, env=engine_env, capture_output=True, text=True, timeout=120, check=False)
    code, text = proc.returncode, proc.stdout + proc.stderr
    assert code == 0, text
    assert "pre-flight: all 1 host(s) fine" in text, text
    assert "WARNING pre-flight" not in text, text
    assert "a pre-flight only (no script): 1 host(s) checked, 0 named" in text, text
    # The README's command, as a user types it (no --engine: the engine rule chooses podman and the store).
    env = {k: v for k, v in engine_env.items() if not k.startswith("CONTAINERS_")}
    readme = [
        "bash",
        str(REPO / "bin" / "local-train.sh"),
        "--work",
        str(tmp_path / "ml"),
        cpu_image.immutable,
    ]
    proc = subprocess.run(
        [*readme, "preflight"], env=env, capture_output=True, text=True, timeout=300, check=False
    )
    code, text = proc.returncode, proc.stdout + proc.stderr
    assert code == 0, text
    assert "local-train.sh: engine: podman (" in text, text
    assert "pre-flight: all 1 host(s) fine" in text, text
    assert "WARNING pre-flight" not in text, text


def test_ssh_between_containers_of_the_image_is_key_only(
    cpu_image: BuiltImage, engine_env: dict[str, str]
) -> None:
    # Hosts running the same image share host keys and root key: a strict ssh client gets in without a
    # prompt or StrictHostKeyChecking=no; a password never works.
    script = (
        "set -e; /usr/sbin/sshd -p 2222 -o UsePAM=no -o PidFile=/run/sshd-test.pid;"
        " for i in $(seq 50); do [ -s /run/sshd-test.pid ] && break; sleep 0.1; done;"
        " ssh -p 2222 -o BatchMode=yes -o StrictHostKeyChecking=yes algo-2 echo key-login-ok;"
        " if ssh -p 2222 -o BatchMode=yes -o PubkeyAuthentication=no -o PreferredAuthentications=password"
        "    algo-2 true 2>/dev/null; then echo password-login-accepted; else echo password-login-refused; fi"
    )
    out = podman(
        engine_env,
        "run",
        "--rm",
        "--network",
        "none",
        "--add-host",
        "algo-2:127.0.0.1",
        cpu_image.immutable,
        "bash",
        "-c",
        script,
    )
    assert "key-login-ok" in out
    assert "password-login-refused" in out


def test_train_runs_a_two_process_horovod_job(
    cpu_image: BuiltImage, engine_env: dict[str, str], tmp_path: Path
) -> None:
    code, data, hps = write_tiny_job(tmp_path)
    ml = tmp_path / "ml"
    start = time.monotonic()
    run(
        [
            "bash",
            str(REPO / "bin" / "local-train.sh"),
            "--engine",
            "podman",
            "--network",
            "host",
            "--hyperparameters",
            str(hps),
            "--source",
            str(code),
            "--entry-point",
            "tiny_job.py",
            "--channel",
            f"train={data}",
            "--processes-per-host",
            "2",
            "--work",
            str(ml),
            cpu_image.immutable,
        ],
        engine_env,
        900,
        WORK / "local-train-podman.log",
    )
    record_timing("train-2proc-podman", time.monotonic() - start)

    ranks = [json.loads((ml / "output" / "data" / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["size"] for r in ranks] == [2, 2]
    assert [r["sum_of_ranks"] for r in ranks] == [1.0, 1.0]
    assert [r["epochs"] for r in ranks] == [2, 2]  # the hyperparameter reached the script as --epochs 2
    assert {r["host"] for r in ranks} == {"algo-1"}
    assert (ml / "model" / "tiny.keras").stat().st_size > 0
    assert not (ml / "output" / "failure").exists()
    hp_json = json.loads((ml / "input" / "config" / "hyperparameters.json").read_text())
    assert hp_json["epochs"] == "2"
    assert hp_json["sagemaker_program"] == '"tiny_job.py"'


def test_push_to_local_registry_and_pull_back(
    cpu_image: BuiltImage, registry: str, engine_env: dict[str, str], tmp_path: Path
) -> None:
    start = time.monotonic()
    proc = run(
        [
            "bash",
            str(REPO / "bin" / "push.sh"),
            "--engine",
            "podman",
            "--registry",
            registry,
            "--repository",
            "smhvd/train",
            cpu_image.immutable,
        ],
        engine_env,
        1800,
        WORK / "push-podman.log",
    )
    record_timing("push-cpu-podman", time.monotonic() - start)
    tag = cpu_image.immutable.rsplit(":", 1)[1]
    uri = f"{registry}/smhvd/train:{tag}"
    assert proc.stdout.split() == [uri]

    manifest = json.loads(
        run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{uri}"], engine_env, 120).stdout
    )
    # A single-image Docker v2 manifest: no OCI index, no attestation (SageMaker rejects those).
    assert manifest["mediaType"] == DOCKER_V2
    compressed = sum(layer["size"] for layer in manifest["layers"])
    record_timing("size-cpu-compressed", 0, bytes=compressed)

    # Pull every blob back (digests verified by skopeo) and compare the image config with the local image.
    start = time.monotonic()
    run(
        [
            "skopeo",
            "copy",
            "--quiet",
            "--src-tls-verify=false",
            f"docker://{uri}",
            f"dir:{tmp_path / 'pulled'}",
        ],
        engine_env,
        1800,
    )
    record_timing("pull-cpu-skopeo", time.monotonic() - start)
    local_id = podman(engine_env, "image", "inspect", "--format", "{{.Id}}", cpu_image.immutable).strip()
    assert manifest["config"]["digest"] == f"sha256:{local_id}"
    assert (tmp_path / "pulled" / local_id).is_file()
    # podman pulls it as it is, with the project's configuration (bin/local-registry.sh trusts the registry's
    # plain HTTP there): what `podman run`, or an SDK's local mode, does with the pushed URI.
    pulled = podman(engine_env, "pull", "--quiet", uri, timeout=600).strip()
    try:
        assert pulled == local_id
    finally:
        podman(engine_env, "rmi", uri)


FAKE_AWS = r"""#!/usr/bin/env bash
# FAKE aws CLI for the ECR-only branches of bin/push.sh (no ECR API is reachable here). Records its arguments.
echo "$*" >> "$FAKE_AWS_LOG"
case "$1 $2" in
  "sts get-caller-identity") echo 123456789012 ;;
  "ecr describe-repositories")
    [ -e "$FAKE_AWS_STATE/repository" ] || { echo "RepositoryNotFoundException" >&2; exit 254; } ;;
  "ecr create-repository") touch "$FAKE_AWS_STATE/repository" ;;
  "ecr get-login-password") echo fake-ecr-password ;;
  "configure get") echo us-east-1 ;;
  *) echo "fake aws: unexpected call: $*" >&2; exit 1 ;;
esac
"""


def test_push_ecr_branches_with_a_fake_aws_cli(
    cpu_image: BuiltImage, registry: str, engine_env: dict[str, str], tmp_path: Path
) -> None:
    # The AWS API is faked (nothing else can answer here); the login and the push are real, against the local
    # registry standing in for an ECR endpoint (--ecr).
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(FAKE_AWS)
    (bin_dir / "aws").chmod(0o755)
    env = dict(
        engine_env,
        PATH=f"{bin_dir}:{engine_env['PATH']}",
        FAKE_AWS_LOG=str(tmp_path / "aws.log"),
        FAKE_AWS_STATE=str(tmp_path),
        REGISTRY_AUTH_FILE=str(tmp_path / "auth.json"),
    )
    env.pop("AWS_REGION", None)
    env.pop("AWS_DEFAULT_REGION", None)
    env.pop("AWS_ACCOUNT_ID", None)
    cmd = [
        "bash",
        str(REPO / "bin" / "push.sh"),
        "--engine",
        "podman",
        "--registry",
        registry,
        "--ecr",
        "--repository",
        "smhvd/ecr-test",
        cpu_image.immutable,
    ]
    pushed = [run(cmd, env, 1800, WORK / "push-ecr-fake.log") for _ in range(2)]  # the second finds the repo
    calls = (tmp_path / "aws.log").read_text().splitlines()
    assert sum(c.startswith("ecr create-repository") for c in calls) == 1, calls
    assert sum(c.startswith("ecr get-login-password") for c in calls) == 2, calls
    assert any("--repository-name smhvd/ecr-test" in c for c in calls)
    auth = json.loads((tmp_path / "auth.json").read_text())["auths"][registry]["auth"]
    assert base64.b64decode(auth).decode() == "AWS:fake-ecr-password"
    # The image is in the registry under the printed URI: the local image's config, a Docker v2 manifest.
    uri = f"{registry}/smhvd/ecr-test:{cpu_image.immutable.rsplit(':', 1)[1]}"
    assert [proc.stdout.split() for proc in pushed] == [[uri], [uri]]
    inspect = ["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{uri}"]
    manifest = json.loads(run(inspect, engine_env, 120).stdout)
    assert manifest["mediaType"] == DOCKER_V2
    assert manifest["config"]["digest"] == f"sha256:{cpu_image.image_id}"


def test_docker_cli_builds_and_runs_through_podman_service(
    cpu_image: BuiltImage, base_image: str, docker_env: dict[str, str], tmp_path: Path
) -> None:
    # Same Dockerfile and build arguments through the docker CLI: every expensive layer comes from the cache.
    again = build_image("cpu", base_image, docker_env, engine="docker", name=IMAGE_NAME + "-docker")
    before = json.loads(run(["podman", "image", "inspect", cpu_image.image_id], docker_env, 60).stdout)[0]
    after = json.loads(run(["podman", "image", "inspect", again.image_id], docker_env, 60).stdout)[0]
    assert len(before["RootFS"]["Layers"]) >= 5
    # The runtime and venv layers are shared; only the launcher layers may differ.
    shared = len(os.path.commonprefix([before["RootFS"]["Layers"], after["RootFS"]["Layers"]]))
    assert shared >= len(before["RootFS"]["Layers"]) - 3
    assert after["Config"]["Cmd"] == ["train"]

    # A failing job through the docker CLI: non-zero exit, the script's error in output/failure.
    code = tmp_path / "code"
    code.mkdir()
    (code / "fail.py").write_text(
        "import sys\nprint('no such dataset: /data/x', file=sys.stderr)\nsys.exit(3)\n"
    )
    ml = tmp_path / "ml"
    proc = subprocess.run(
        [
            "bash",
            str(REPO / "bin" / "local-train.sh"),
            "--engine",
            "docker",
            "--network",
            "host",
            "--source",
            str(code),
            "--entry-point",
            "fail.py",
            "--work",
            str(ml),
            again.moving,
        ],
        env=docker_env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode != 0, proc.stderr
    failure = (ml / "output" / "failure").read_text()
    assert "no such dataset: /data/x" in failure
    assert "the job failed" in proc.stderr


def test_rebuild_after_a_src_change_reuses_the_venv(
    cpu_image: BuiltImage, base_image: str, engine_env: dict[str, str], tmp_path: Path
) -> None:
    # A copy of the build context with one new launcher module: only the last stage's launcher layers rebuild.
    ctx = tmp_path / "ctx"
    for name in ("docker", "requirements", "src", "bin", "examples"):
        shutil.copytree(REPO / name, ctx / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE", ".dockerignore"):
        shutil.copy2(REPO / name, ctx / name)
    (ctx / "src" / "smhvd" / "rebuild_probe.py").write_text("MARK = 'rebuilt'\n")
    start = time.monotonic()
    cmd = [
        "bash",
        str(ctx / "bin" / "build.sh"),
        "--engine",
        "buildah",
        "--name",
        IMAGE_NAME + "-rebuild",
        "--base-image",
        base_image,
    ]
    if any(Path("/usr/local/share/ca-certificates").glob("*.crt")):
        cmd += ["--extra-ca", "/usr/local/share/ca-certificates"]
    proc = run([*cmd, "cpu"], engine_env, 1800, WORK / "rebuild-src-change.log")
    seconds = time.monotonic() - start
    record_timing("rebuild-cpu-after-src-change", seconds)
    ref = proc.stdout.split()[1]
    try:
        out = podman(
            engine_env,
            "run",
            "--rm",
            "--network",
            "none",
            ref,
            "python",
            "-c",
            "import smhvd.rebuild_probe as p; print(p.MARK)",
        )
        assert out.strip() == "rebuilt"
        before = json.loads(podman(engine_env, "image", "inspect", cpu_image.immutable))[0]["RootFS"][
            "Layers"
        ]
        after = json.loads(podman(engine_env, "image", "inspect", ref))[0]["RootFS"]["Layers"]
        # Shared: base, OS, ssh, venv, scripts, pyproject; rebuilt: the sources and the launcher install (a
        # re-label by bin/build.sh may add one empty layer at the end).
        shared = len(os.path.commonprefix([before, after]))
        assert shared >= len(before) - 3, "a src/ change rebuilt more than the launcher layers"
        assert before != after
    finally:
        subprocess.run(
            ["podman", "rmi", "--force", *proc.stdout.split()],
            env=engine_env,
            capture_output=True,
            check=False,
            timeout=120,
        )
