"""Mask R-CNN on CPU: seconds per training step (tiny and coco presets) and an overfit run to bbox AP >= 0.5.

    python benchmarks/maskrcnn_bench.py [--skip-coco] [--skip-overfit] [--workdir build/maskrcnn-bench]

s/step is the median over the epochs after the first (the first one includes graph optimisation and queue
warm-up). The overfit run trains the tiny preset at np=2 on 16 synthetic images, evaluates on the same images
after each chunk of steps (resuming from the chunk's checkpoint) and stops once bbox AP >= the target; the
time reported is the sum of the jobs' wall times, restarts and evaluations included. Results are also written
as JSON to <workdir>/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CODE = REPO / "examples" / "maskrcnn"
sys.path.insert(0, str(CODE))

from make_shapes import generate  # noqa: E402

MPIRUN = ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--mca", "mpi_yield_when_idle", "1",
          "-x", "OMP_NUM_THREADS=1", "-x", "SAGEMAKER_BASE_DIR"]  # fmt: skip


def run(args: list[str], base: Path, np_: int, timeout: float = 3600) -> float:
    """The script as np_ ranks; returns the wall time; raises with the log tail on failure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "OMPI_", "PMI_"))}
    env["SAGEMAKER_BASE_DIR"] = str(base)
    prefix = [*MPIRUN, "-np", str(np_)] if np_ > 1 else []
    t0 = time.monotonic()
    proc = subprocess.run(
        [*prefix, sys.executable, str(CODE / "train_maskrcnn.py"), *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"training failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    return time.monotonic() - t0


def seconds_per_step(base: Path) -> float:
    stats = json.loads((base / "checkpoints" / "stats.json").read_text())
    values = [e["train/sec_per_step"] for e in stats[1:]]
    return statistics.median(values)


def bench_speed(name: str, preset: str, data: Path, work: Path, np_: int, config: str) -> dict[str, float]:
    base = work / f"speed-{name}"
    shutil.rmtree(base, ignore_errors=True)
    wall = run(
        ["--preset", preset, "--data-dir", str(data), "--config", config, "--eval", "false"], base, np_
    )
    result = {"seconds_per_step": seconds_per_step(base), "processes": np_, "job_seconds": wall}
    print(f"{name}: {result['seconds_per_step']:.3f} s/step at np={np_} (job {wall:.0f} s)", flush=True)
    return result


def bench_overfit(data: Path, work: Path, target: float, chunk: int, max_steps: int) -> dict[str, object]:
    base = work / "overfit"
    shutil.rmtree(base, ignore_errors=True)
    total, wall, history = 0, 0.0, []
    while total < max_steps:
        total += chunk
        wall += run(
            ["--preset", "tiny", "--train-dir", str(data), "--val-dir", str(data),
             "--config", f"total_steps={total} steps_per_epoch=50"],
            base, 2,
        )  # fmt: skip
        ap = json.loads((base / "output" / "data" / "eval.json").read_text())["bbox"]["AP"]
        history.append({"steps": total, "bbox_AP": ap, "seconds": round(wall, 1)})
        print(f"overfit: {total} steps, bbox AP {ap:.3f}, {wall:.0f} s so far", flush=True)
        if ap >= target:
            break
    segm = json.loads((base / "output" / "data" / "eval.json").read_text())["segm"]["AP"]
    return {"target_bbox_AP": target, "reached": history[-1]["bbox_AP"] >= target, "steps": total,
            "seconds": round(wall, 1), "final_segm_AP": segm, "history": history}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=REPO / "build" / "maskrcnn-bench")
    p.add_argument("--skip-coco", action="store_true", help="skip the standard (ResNet-50, 800 px) preset")
    p.add_argument("--skip-overfit", action="store_true")
    p.add_argument("--target-ap", type=float, default=0.5)
    p.add_argument("--chunk", type=int, default=150, help="steps between evaluations in the overfit run")
    p.add_argument("--max-steps", type=int, default=900)
    a = p.parse_args(argv)

    work = a.workdir
    work.mkdir(parents=True, exist_ok=True)
    small, overfit, large = work / "data-128", work / "data-overfit", work / "data-512"
    if not (small / "train" / "annotations.json").is_file():
        generate(small / "train", 32, size=128, seed=1)
    if not (overfit / "annotations.json").is_file():
        generate(overfit, 16, size=128, seed=3)
    if not a.skip_coco and not (large / "train" / "annotations.json").is_file():
        generate(large / "train", 4, size=512, seed=4)

    results: dict[str, object] = {"cpus": os.cpu_count(), "load_average_at_start": os.getloadavg()[0]}
    results["tiny_np1"] = bench_speed(
        "tiny np=1",
        "tiny",
        small,
        work,
        1,
        "total_steps=30 steps_per_epoch=20",  # 60 steps: 2 at np=1
    )
    results["tiny_np2"] = bench_speed(
        "tiny np=2", "tiny", small, work, 2, "total_steps=60 steps_per_epoch=20"
    )
    if not a.skip_coco:
        # The standard preset's model and image size; the schedule is cut to 6 steps at a batch of 1 image.
        results["coco_np1"] = bench_speed(
            "coco (R50-FPN, 800 px) np=1", "coco", large, work, 1,
            "total_steps=6 steps_per_epoch=2 schedule_batch=1 base_lr=0.00125 warmup_steps=2 data_workers=1",
        )  # fmt: skip
    if not a.skip_overfit:
        results["overfit"] = bench_overfit(overfit, work, a.target_ap, a.chunk, a.max_steps)
        o = results["overfit"]
        print(
            f"overfit: bbox AP {o['history'][-1]['bbox_AP']:.3f} (target {a.target_ap}) "
            f"after {o['steps']} steps at np=2 in {o['seconds']:.0f} s; segm AP {o['final_segm_AP']:.3f}"
        )
    (work / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
