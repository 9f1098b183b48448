"""`make maskrcnn-demo`: the tiny Mask R-CNN on synthetic shapes through `train` (2 processes), then COCOeval.

Generates COCO-format shapes (train + val channels), writes a SageMaker /opt/ml tree under build/ whose
hyperparameters are JSON-encoded strings as the SDK writes them, runs the real launcher, and prints the
figures from the job's eval.json. Run it again to see the job resume from its checkpoints (--fresh restarts).
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

from smhvd_dev.mltree import write_ml_tree

REPO = Path(__file__).resolve().parents[1]
CODE = REPO / "examples" / "maskrcnn"
sys.path.insert(0, str(CODE))

from make_shapes import generate  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=REPO / "build" / "maskrcnn-demo")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--train-images", type=int, default=64)
    p.add_argument("--val-images", type=int, default=16)
    p.add_argument("--config", default="total_steps=300 steps_per_epoch=50", help="KEY=VALUE overrides")
    p.add_argument("--fresh", action="store_true", help="delete earlier checkpoints first")
    a = p.parse_args(argv)

    data = a.workdir / "data"
    if not (data / "train" / "annotations.json").is_file():
        generate(data / "train", a.train_images, seed=1)
        generate(data / "val", a.val_images, seed=2)
    base = a.workdir / "opt_ml"
    if a.fresh:
        shutil.rmtree(base, ignore_errors=True)
    paths = write_ml_tree(
        base,
        hyperparameters={
            "sagemaker_program": "train_maskrcnn.py",
            "sagemaker_submit_directory": str(CODE),
            "sagemaker_mpi_enabled": True,
            "sagemaker_mpi_num_of_processes_per_host": a.processes,
            "preset": "tiny",
            "config": a.config,
        },
        channels={"train": data / "train", "val": data / "val"},
    )
    train = Path(sys.executable).parent / "train"
    print(f"maskrcnn-demo: {train} with SAGEMAKER_BASE_DIR={base} ({a.processes} processes)", flush=True)
    started = time.monotonic()
    code = subprocess.call([str(train)], env={**os.environ, "SAGEMAKER_BASE_DIR": str(base)})
    elapsed = time.monotonic() - started
    if code != 0:
        failure = paths.failure_file.read_text() if paths.failure_file.exists() else "(no failure file)"
        print(f"maskrcnn-demo: train exited {code}: {failure}", file=sys.stderr)
        return code
    metrics = json.loads((paths.output_data_dir / "eval.json").read_text())
    stats = json.loads((paths.checkpoint_dir / "stats.json").read_text())
    losses = [e["train/loss_epoch_mean"] for e in stats if "train/loss_epoch_mean" in e]
    speed = [e["train/sec_per_step"] for e in stats if "train/sec_per_step" in e]
    print(
        f"maskrcnn-demo: {stats[-1]['global_step']} steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"{min(speed):.3f} s/step; COCO bbox AP {metrics['bbox']['AP']:.3f} "
        f"(AP50 {metrics['bbox']['AP50']:.3f}), "
        f"segm AP {metrics['segm']['AP']:.3f} (AP50 {metrics['segm']['AP50']:.3f}) on {metrics['images']} "
        f"val images; job {elapsed:.0f} s; model {paths.model_dir / 'model.npz'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
