"""`make demo`: Horovod Keras MNIST through `train`, on a generated /opt/ml tree, with embedded data.

Prints the test accuracy reached; exits non-zero if the job failed or the accuracy is below --min-accuracy.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .mltree import write_ml_tree

REPO = Path(__file__).resolve().parents[2]


def default_scripts_dir() -> Path:
    return Path(os.environ.get("SMHVD_SCRIPTS_DIR") or REPO / "examples")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m smhvd_dev.demo", description=__doc__)
    parser.add_argument("--processes", type=int, default=2, help="Horovod processes on this host (default 2)")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--dataset", default="mnist", choices=["mnist", "fashion_mnist"])
    parser.add_argument("--workdir", type=Path, default=REPO / "build" / "demo", help="where /opt/ml is made")
    parser.add_argument("--scripts-dir", type=Path, default=default_scripts_dir())
    parser.add_argument("--min-accuracy", type=float, default=0.97)
    args = parser.parse_args(argv)

    base = args.workdir / "opt_ml"
    shutil.rmtree(base, ignore_errors=True)  # a fresh job each time (no checkpoint to resume from)
    paths = write_ml_tree(
        base,
        hyperparameters={
            "sagemaker_program": "train_mnist.py",
            "sagemaker_submit_directory": str(args.scripts_dir / "mnist"),
            "sagemaker_mpi_enabled": True,
            "sagemaker_mpi_num_of_processes_per_host": args.processes,
            "epochs": args.epochs,
            "dataset": args.dataset,
        },
    )
    train = Path(sys.executable).parent / "train"
    print(f"demo: {train} with SAGEMAKER_BASE_DIR={base} ({args.processes} processes)", flush=True)
    started = time.monotonic()
    code = subprocess.call([str(train)], env={**os.environ, "SAGEMAKER_BASE_DIR": str(base)})
    elapsed = time.monotonic() - started
    if code != 0:
        failure = paths.failure_file.read_text() if paths.failure_file.exists() else "(no failure file)"
        print(f"demo: train exited {code}: {failure}", file=sys.stderr)
        return code
    metrics = json.loads((paths.output_data_dir / "metrics.json").read_text())
    accuracy = float(metrics["test_accuracy"])
    print(
        f"demo: test accuracy {accuracy:.4f} ({metrics.get('world_size')} processes, "
        f"{metrics.get('epochs')} epoch(s), {elapsed:.0f} s); model in {paths.model_dir}"
    )
    if accuracy < args.min_accuracy:
        print(f"demo: accuracy below {args.min_accuracy}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
