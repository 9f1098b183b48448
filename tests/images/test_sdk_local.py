"""The SageMaker Python SDK v2's local mode trains MNIST on 2 containers of the CPU image, end to end.

Nothing of the SDK is faked: `sagemaker.tensorflow.TensorFlow(image_uri=..., instance_type="local",
instance_count=2, distribution={"mpi": ...}).fit()` runs in its own venv (bin/sdk-venv.sh: sagemaker 2.257,
podman-compose), writes the /opt/ml trees and the compose file itself and starts the containers through the
`docker-compose` on PATH (podman-compose with the daemonless podman configuration). Once with `local_code`
(source_dir mounted at /opt/ml/code, model.tar.gz on the local disk): the lines docs/sdk.md tells a user to
type, run as they are written there; once with the code in S3: a real S3-compatible server (moto_server), to
which the SDK uploads sourcedir.tar.gz, from which the launcher in every container downloads it, and to which
the SDK uploads model.tar.gz, driven by examples/sdk_local_demo.py (`make sdk-local-demo`). Either way the
SavedModel must be in model.tar.gz where the SDK says the model is.
"""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support.ci import in_ci
from support.s3 import s3_client
from support.snippets import doc_snippet

from .helpers import (
    REPO,
    WORK,
    BuiltImage,
    record_timing,
    remove_compose_project,
    run_to_log,
    stop,
    wait_until,
    without_aws,
)

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(1800)]

DEMO = REPO / "examples" / "sdk_local_demo.py"
SDK_PAGE = REPO / "docs" / "sdk.md"


@pytest.fixture(scope="module")
def sdk(engine_env: dict[str, str]) -> tuple[str, dict[str, str]]:
    """(python of the SDK venv, environment with the docker/docker-compose shims first on PATH)."""
    cmd = ["bash", str(REPO / "bin" / "sdk-venv.sh")]  # build/sdk, shared with `make sdk-local-demo`
    if in_ci():
        cmd.append("--install")
    proc = subprocess.run(cmd, env=engine_env, capture_output=True, text=True, timeout=900, check=False)
    if proc.returncode != 0 and "python3-venv is missing" in proc.stderr and not in_ci():
        pytest.skip(proc.stderr.strip())
    assert proc.returncode == 0, f"bin/sdk-venv.sh exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    values = dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)
    env = dict(engine_env, PATH=f"{values['SHIMS']}:{engine_env['PATH']}")
    return values["PYTHON"], env


def address_for_containers() -> str:
    """This machine's own address on its default route: the host's loopback is not reachable from containers
    on a bridge network, while this address is (and from the host itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # no packet is sent: this only picks the source address
            address = str(s.getsockname()[0])
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.fail("no non-loopback address for an S3 server the containers can reach")
    return address


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """moto_server (the project's dev dependency, as in tests/integration/test_code_sources.py)."""
    host = address_for_containers()
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    log = (WORK / "moto-sdk.log").open("w")
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "moto_server"), "-H", host, "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    def accepting() -> bool:
        assert server.poll() is None, f"moto_server exited: {(WORK / 'moto-sdk.log').read_text()[-2000:]}"
        with socket.socket() as s:
            return s.connect_ex((host, port)) == 0

    try:
        wait_until("moto_server to listen", accepting, timeout=60)
        yield f"http://{host}:{port}"
    finally:
        stop(server)
        log.close()


def run_demo(sdk: tuple[str, dict[str, str]], image: str, tmp_path: Path, *extra: str) -> dict[str, object]:
    python, env = sdk
    out = tmp_path / "result.json"
    work = str(tmp_path / "sdk")
    log = WORK / f"sdk-local-{tmp_path.name}.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [
                python,
                str(DEMO),
                "--image",
                image,
                "--work",
                work,
                "--json",
                str(out),
                "--steps-per-epoch",
                "10",
                *extra,
            ],
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=900,
            check=False,
        )
    tail = log.read_text()[-5000:]
    assert out.exists(), f"the SDK demo exited {proc.returncode} without a result (log {log}):\n{tail}"
    result: dict[str, object] = json.loads(out.read_text())
    check_model(result)
    assert proc.returncode == 0, f"the SDK demo exited {proc.returncode} (log {log}):\n{tail}"
    assert "WARNING pre-flight" not in log.read_text(), tail  # `make sdk-local-demo`: no false alarm
    return result


def check_model(result: dict[str, object]) -> None:
    files = result["model_files"]
    assert isinstance(files, list)
    # train_mnist.py: rank 0 saves a SavedModel in <model dir>/1; the SDK packs that dir into model.tar.gz.
    assert "1/saved_model.pb" in files, (
        f"no SavedModel in {result['model_data']} ({files}); the SDK passed the script "
        f"--model_dir {result['model_dir_hyperparameter']}"
    )
    assert any(str(f).startswith("1/variables/") for f in files), files
    assert len(result["containers"]) == 2, result  # type: ignore[arg-type]


def record(result: dict[str, object], mode: str) -> None:
    record_timing(f"sdk-v2-local-{mode}-fit", float(result["fit_seconds"]))  # type: ignore[arg-type]
    for key in ("fit_to_ranks_launched", "fit_to_rank0_running", "last_rank_exit_to_fit_return"):
        value = result[key]
        assert value is not None, f"{key}: a mark was missing from the containers' logs: {result}"
        record_timing(f"sdk-v2-local-{mode}-{key}", float(value))  # type: ignore[arg-type]


def test_the_pages_sdk_v2_local_mode_lines_train_mnist(
    cpu_image: BuiltImage, sdk: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    """docs/sdk.md's SDK v2 local-mode block as a user types it (`local_code`; only the image's name replaced
    by the image under test), from the repository's root, with no AWS account, configuration or region
    anywhere: 2 containers train MNIST, the model is in model.tar.gz where the SDK says, and the log has no
    traceback (the telemetry opt-out) and no container id (the compose shim)."""
    python, sdk_env = sdk
    program = doc_snippet(SDK_PAGE, "sdk-v2-local", {"sagemaker-horovod:cpu": cpu_image.immutable})
    # local mode's files (no container_root) go to the test's TMPDIR
    env, tmp = without_aws(sdk_env, tmp_path)
    try:
        proc, seconds = run_to_log([python, "-c", program], env, REPO, 900, "sdk-v2-snippet.log")
    finally:
        left = [
            x for c in tmp.rglob("docker-compose.yaml") for x in remove_compose_project(env, c.parent.name)
        ]
    record_timing("sdk-v2-local-snippet-fit", seconds, exit_code=proc.returncode)
    out = proc.stdout
    assert proc.returncode == 0, out[-5000:]
    assert not left, f"left in the store: {left}"
    assert "starting 2 processes" in out, out[-3000:]  # one rank on each container
    assert "Traceback" not in out, out[-3000:]
    assert "WARNING pre-flight" not in out, out[-3000:]  # local mode's 64 MB /dev/shm is enough for CPU
    assert not re.search(r"^[0-9a-f]{64}$", out, re.MULTILINE), out[-3000:]  # podman's container ids
    model = re.search(r"^model: file://(\S+)$", out, re.MULTILINE)
    assert model, out[-3000:]
    with tarfile.open(model.group(1)) as tar:
        files = tar.getnames()
    assert "1/saved_model.pb" in files, files  # rank 0's SavedModel, packed by the SDK


def test_sdk_v2_local_mode_trains_mnist_with_code_in_s3(
    cpu_image: BuiltImage, sdk: tuple[str, dict[str, str]], s3_endpoint: str, tmp_path: Path
) -> None:
    result = run_demo(sdk, cpu_image.immutable, tmp_path, "--code-source", "s3", "--s3-endpoint", s3_endpoint)
    job = str(result["job_name"])
    assert result["model_data"] == f"s3://smhvd-sdk-local/output/{job}/output/model.tar.gz"
    # The code went through S3: the SDK uploaded source_dir as sourcedir.tar.gz with the entry point in it.
    s3 = s3_client(s3_endpoint)
    key = f"code/{job}/source/sourcedir.tar.gz"
    body = s3.get_object(Bucket="smhvd-sdk-local", Key=key)["Body"].read()
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        assert "train_mnist.py" in tar.getnames()
    record(result, "s3-code")


# A job whose script fails on every rank: the SDK's fit() must raise with the job's exit code (not succeed).
FAILING_FIT = """
import json, sys, boto3
from sagemaker.local import LocalSession
from sagemaker.tensorflow import TensorFlow

image, code, root = sys.argv[1:4]
boto = boto3.Session(aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1")
opt_out = {"SchemaVersion": "1.0", "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}}}
session = LocalSession(boto_session=boto, default_bucket="unused", sagemaker_config=opt_out)
session.config = {"local": {"local_code": True, "container_root": root}}
estimator = TensorFlow(
    image_uri=image, role="arn:aws:iam::123456789012:role/SageMakerRole", instance_type="local",
    instance_count=2, entry_point="fail.py", source_dir=code, output_path="file://" + root + "/output",
    distribution={"mpi": {"enabled": True, "processes_per_host": 1}}, sagemaker_session=session,
)
try:
    estimator.fit()
except RuntimeError as error:
    print(json.dumps({"raised": str(error)}))
else:
    print(json.dumps({"raised": None}))
"""


def test_sdk_v2_local_mode_fit_raises_when_the_job_fails(
    cpu_image: BuiltImage, sdk: tuple[str, dict[str, str]], tmp_path: Path
) -> None:
    python, env = sdk
    code = tmp_path / "code"
    code.mkdir()
    (code / "fail.py").write_text("import sys\nprint('no data here', file=sys.stderr)\nsys.exit(3)\n")
    root = tmp_path / "sdk"
    root.mkdir()
    proc = subprocess.run(
        [python, "-c", FAILING_FIT, cpu_image.immutable, str(code), str(root)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        raised = json.loads(proc.stdout.strip().splitlines()[-1])["raised"]
        assert raised is not None, "fit() returned as if the job had succeeded"
        assert "exited with code: 3" in raised, raised
    finally:
        left = [
            c
            for compose in root.glob("*/docker-compose.yaml")
            for c in remove_compose_project(env, compose.parent.name)
        ]
    assert not left, f"left in the store: {left}"
