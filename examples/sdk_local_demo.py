#!/usr/bin/env python3
"""Train MNIST on 2 local containers of this project's image with the SageMaker Python SDK v2's local mode.

The SDK's own code does everything a user's notebook would: it writes each container's /opt/ml tree and a
compose file, starts the containers through `docker-compose` (here podman-compose behind that name, made by
bin/sdk-venv.sh), streams their logs, and packs the model into model.tar.gz where it puts models. Run it with
the SDK venv's python and the shims first on PATH (`make sdk-local-demo` does both):

    eval "$(bin/sdk-venv.sh)"   # -> PYTHON=... SHIMS=...
    PATH="$SHIMS:$PATH" "$PYTHON" examples/sdk_local_demo.py --image localhost/sagemaker-horovod:cpu

`--code-source local` (default): `local_code`, the SDK mounts source_dir at /opt/ml/code and keeps the model
on the local disk. `--code-source s3 --s3-endpoint URL`: the SDK uploads source_dir as sourcedir.tar.gz to
that S3-compatible endpoint (moto_server in the tests), the launcher in each container downloads it, and the
SDK uploads model.tar.gz there. The endpoint must be reachable from the containers too (not the host's
loopback).

Printed at the end (and written to --json): where the model is, and two latencies: the SDK's fit() call until
the first rank runs, and the last rank's exit until fit() returns.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import tarfile
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parents[1]
MNIST_SCRIPTS = REPO / "examples" / "mnist"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"  # local mode never assumes it
BUCKET = "smhvd-sdk-local"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--image", required=True, help="the local image, e.g. localhost/sagemaker-horovod:cpu")
    p.add_argument("--code-source", choices=["local", "s3"], default="local")
    p.add_argument("--s3-endpoint", default=None, help="S3-compatible endpoint (for --code-source s3)")
    p.add_argument("--source-dir", type=Path, default=MNIST_SCRIPTS, help="code dir with train_mnist.py")
    p.add_argument("--instance-count", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps-per-epoch", type=int, default=20, help="cap per epoch: keeps the demo short")
    p.add_argument("--work", type=Path, default=REPO / "build" / "sdk-local-demo", help="SDK container root")
    p.add_argument("--json", type=Path, default=None, help="write the result here as JSON")
    p.add_argument("--keep-containers", action="store_true", help="leave the stopped containers behind")
    args = p.parse_args(argv)
    if args.code_source == "s3" and not args.s3_endpoint:
        p.error("--code-source s3 needs --s3-endpoint")
    return args


def podman(*args: str) -> str:
    """The shimmed `docker` (podman with the private configuration) from PATH."""
    proc = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"docker {' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc.stdout


def epoch(text: str) -> float:
    """Epoch seconds from RFC 3339 (`podman logs -t`) or podman's `2026-11-23 10:41:07.1 +0000 UTC`."""
    text = text.strip()
    if "T" in text.split()[0]:
        stamp = text.split()[0].replace("Z", "+00:00")
        head, _, rest = stamp.partition(".")
        frac, zone = (rest[: rest.index("+")], rest[rest.index("+") :]) if "+" in rest else (rest, "+00:00")
        if not rest:
            head, zone, frac = stamp[:19], stamp[19:] or "+00:00", "0"
        return datetime.fromisoformat(head + zone).timestamp() + float(f"0.{frac or 0}")
    date, clock, offset = text.split()[:3]
    whole, _, frac = clock.partition(".")
    return datetime.strptime(f"{date} {whole} {offset}", "%Y-%m-%d %H:%M:%S %z").timestamp() + float(
        f"0.{frac or 0}"
    )


def job_containers(work: Path) -> list[str]:
    """The containers podman-compose made for the SDK's compose file(s) under `work` (label: the project)."""
    names = []
    for compose in work.glob("*/docker-compose.yaml"):
        out = podman(
            "ps", "-a", "--filter", f"label=io.podman.compose.project={compose.parent.name}", "--format",
            "{{.Names}}",
        )  # fmt: skip
        names += out.split()
    return sorted(names)


def timeline(containers: list[str]) -> dict[str, float]:
    """Epoch times, from the containers' timestamped logs and states: ranks started, rank 0 up, job ended."""
    marks: dict[str, float] = {}
    for name in containers:
        state = json.loads(podman("inspect", name))[0]["State"]
        started, finished = epoch(state["StartedAt"]), epoch(state["FinishedAt"])
        marks["first_container_started"] = min(marks.get("first_container_started", started), started)
        marks["last_container_exited"] = max(marks.get("last_container_exited", finished), finished)
        for line in podman("logs", "--timestamps", name).splitlines():
            stamp, _, message = line.partition(" ")
            if "starting" in message and "processes:" in message:
                marks["ranks_launched"] = epoch(stamp)  # the leader runs mpirun
            elif "horovod:" in message and "rank(s)" in message:
                marks["rank0_running"] = epoch(stamp)  # rank 0 past hvd.init(): every rank is up
            elif "job succeeded" in message or "job stopped" in message:
                marks["last_rank_exited"] = epoch(stamp)  # mpirun returned: every rank has exited
    return marks


def saved_model_files(tar_bytes: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(tar_bytes), mode="r:gz") as tar:
        return sorted(m.name for m in tar.getmembers())


def report(estimator, session, containers: list[str], called: float, returned: float) -> dict[str, object]:
    """Where the model is and what it holds, and the latencies around the ranks (epoch times -> seconds)."""
    import sagemaker

    model_data = estimator.model_data
    uri = urlparse(model_data)
    if uri.scheme == "s3":
        body = session.s3_client.get_object(Bucket=uri.netloc, Key=uri.path.lstrip("/"))["Body"].read()
    else:
        body = Path(uri.netloc + uri.path).read_bytes()
    marks = timeline(containers)

    def since_fit(mark: str) -> float | None:
        return round(marks[mark] - called, 2) if mark in marks else None

    def until_return(mark: str) -> float | None:
        return round(returned - marks[mark], 2) if mark in marks else None

    return {
        "sagemaker_version": sagemaker.__version__,
        "job_name": estimator.latest_training_job.name,
        "model_data": model_data,
        "model_files": saved_model_files(body),
        # What the TensorFlow estimator told the script (--model_dir): where a script may export its model.
        "model_dir_hyperparameter": json.loads(estimator.hyperparameters().get("model_dir", "null")),
        "containers": containers,
        "fit_seconds": round(returned - called, 2),
        "fit_to_first_container_started": since_fit("first_container_started"),
        "fit_to_ranks_launched": since_fit("ranks_launched"),
        "fit_to_rank0_running": since_fit("rank0_running"),
        "last_rank_exit_to_fit_return": until_return("last_rank_exited"),
        "last_container_exit_to_fit_return": until_return("last_container_exited"),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for tool in ("docker", "docker-compose"):
        if shutil.which(tool) is None:
            sys.exit(f"sdk_local_demo: no `{tool}` on PATH: put the shims of bin/sdk-venv.sh first on PATH")
    import boto3
    from sagemaker.local import LocalSession
    from sagemaker.tensorflow import TensorFlow

    args.work.mkdir(parents=True, exist_ok=True)
    work = args.work.resolve()
    # Dummy long-lived keys: local mode passes them to the containers; no instance-metadata lookups.
    boto = boto3.Session(
        aws_access_key_id="testing",
        aws_secret_access_key="testing",  # noqa: S106 (a dummy key for a local S3 server)
        region_name="us-east-1",
    )
    session = LocalSession(
        boto_session=boto,
        s3_endpoint_url=args.s3_endpoint,
        default_bucket=BUCKET,
        sagemaker_config={
            "SchemaVersion": "1.0",
            "SageMaker": {"PythonSDK": {"Modules": {"TelemetryOptOut": True}}},
        },
    )
    session.config = {"local": {"local_code": args.code_source == "local", "container_root": str(work)}}
    if args.code_source == "s3":
        session.s3_client.create_bucket(Bucket=BUCKET)
        output_path, code_location = f"s3://{BUCKET}/output", f"s3://{BUCKET}/code"
    else:
        output_path, code_location = f"file://{work}/output", None

    estimator = TensorFlow(
        image_uri=args.image,  # with image_uri, framework_version/py_version are not needed
        role=ROLE,
        instance_type="local",
        instance_count=args.instance_count,
        entry_point="train_mnist.py",
        source_dir=str(args.source_dir.resolve()),
        distribution={
            "mpi": {
                "enabled": True,
                "processes_per_host": 1,
                "custom_mpi_options": "--mca btl_tcp_if_exclude lo",
            }
        },
        hyperparameters={"epochs": args.epochs, "steps_per_epoch": args.steps_per_epoch},
        output_path=output_path,
        code_location=code_location,
        sagemaker_session=session,
        base_job_name="smhvd-sdk-local",
    )
    before = set(job_containers(work))
    called = time.time()
    try:
        estimator.fit(wait=True)  # raises when a container fails (the job's exit code)
        returned = time.time()
        containers = [c for c in job_containers(work) if c not in before]
        result = report(estimator, session, containers, called, returned)
    finally:
        # Local mode leaves the stopped containers behind (as with Docker Compose): remove this job's.
        if not args.keep_containers:
            leftovers = [c for c in job_containers(work) if c not in before]
            if leftovers:
                rm = ["docker", "rm", "--force", *leftovers]
                subprocess.run(rm, capture_output=True, timeout=120, check=False)
    result["code_source"] = args.code_source
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    files = result["model_files"]
    saved = any(str(name).endswith("saved_model.pb") for name in files)  # type: ignore[attr-defined]
    print(
        f"sdk-local-demo: {args.instance_count} containers, code from {args.code_source}: fit() took "
        f"{result['fit_seconds']} s; fit() -> first rank running {result['fit_to_ranks_launched']} s "
        f"(rank 0 past hvd.init() at {result['fit_to_rank0_running']} s); last rank exit -> fit() returns "
        f"{result['last_rank_exit_to_fit_return']} s"
    )
    print(f"sdk-local-demo: model {result['model_data']} ({'SavedModel' if saved else 'NO SavedModel'})")
    return 0 if saved else 1


if __name__ == "__main__":
    sys.exit(main())
