#!/usr/bin/env python3
"""MNIST reference script: time to 99% test accuracy at 1 and 2 ranks, and Horovod's overhead at 1 rank.

1. Convergence: examples/mnist/train_mnist.py, run by benchmarks/mnist_measure.py (which adds per-epoch
   timings to history.csv), on the full MNIST set with its default hyperparameters (batch 64 per rank,
   learning rate 0.001 x ranks), --max-epochs epochs, at np=1 (plain python) and np=2 (mpirun, no binding,
   yield when idle, one thread per rank as the launcher sets). Reports the first epoch whose test accuracy
   (the per-epoch validation on the 10k test set) reaches --target, the training seconds up to it, the
   process wall time and images/s.
2. Overhead at np=1: the script's model, input pipeline and optimizer (TensorFlow's default threads) with
   Horovod (hvd.init at size 1, DistributedOptimizer, broadcast and metric-averaging callbacks) against the
   same without Horovod (this file's --overhead-worker mode). Runs alternate, --repeats pairs of 3 epochs;
   epochs 2-3 count (no tracing, no first-step broadcast). Compares median images/s (wall) and CPU
   milliseconds per image (all threads; much steadier than wall time when other processes share the cores).

Usage: python benchmarks/mnist_convergence.py [--max-epochs 12] [--repeats 3] [--skip-convergence]
Figures go to stdout and, as JSON, to build/bench/mnist_convergence.json. Needs a quiet machine to mean much.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from smhvd_dev.plain_mpi import script_argv

REPO = Path(__file__).resolve().parents[1]
SCRIPT_DIR = REPO / "examples" / "mnist"
SCRIPT = REPO / "benchmarks" / "mnist_measure.py"  # train_mnist.py with per-epoch timings
RESULTS = REPO / "build" / "bench" / "mnist_convergence.json"


def run_script(processes: int, args: list[str], workdir: Path) -> tuple[float, list[dict[str, float]], dict]:
    """(wall seconds, per-epoch rows of history.csv, metrics.json) of one run in a fresh job directory."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("SM_")}
    env["SAGEMAKER_BASE_DIR"] = str(workdir)
    # As the launcher does (the script leaves threads to it): each rank's share of the cores.
    share = str(max(1, len(os.sched_getaffinity(0)) // processes))
    for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        env.setdefault(name, share)
    started = time.monotonic()
    result = subprocess.run(
        script_argv(SCRIPT, args, processes),
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    wall = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"benchmark: {SCRIPT.name} exited {result.returncode}:\n{result.stderr[-3000:]}")
    with (workdir / "output" / "data" / "history.csv").open() as stream:
        history = [{key: float(value) for key, value in row.items()} for row in csv.DictReader(stream)]
    metrics = json.loads((workdir / "output" / "data" / "metrics.json").read_text())
    return wall, history, metrics


def convergence(processes: int, max_epochs: int, target: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mnist-bench-") as workdir:
        wall, history, metrics = run_script(processes, ["--epochs", str(max_epochs)], Path(workdir))
    reached = next((row for row in history if row["val_accuracy"] >= target), None)
    epochs_to_target = int(reached["epoch"]) + 1 if reached else None  # Keras' CSVLogger counts from 0
    train_seconds_to_target = (
        sum(row["epoch_seconds"] for row in history[:epochs_to_target]) if epochs_to_target else None
    )
    return {
        "processes": processes,
        "epochs_run": len(history),
        "epochs_to_target": epochs_to_target,
        "train_seconds_to_target": train_seconds_to_target,
        "wall_seconds": round(wall, 1),
        "final_test_accuracy": metrics["test_accuracy"],
        "best_test_accuracy": max(row["val_accuracy"] for row in history),
        "images_per_sec_median": statistics.median(row["images_per_sec"] for row in history[1:] or history),
        "val_accuracy_by_epoch": [round(row["val_accuracy"], 4) for row in history],
    }


def overhead_worker(use_horovod: bool, epochs: int, steps: int, out: Path) -> None:
    """The script's model, input pipeline (rebuilt here as the script builds it), optimizer and warmup at one
    rank, with or without Horovod (hvd.init, DistributedOptimizer, broadcast and metric-averaging callbacks):
    nothing else differs. Writes the wall and CPU seconds (all the process's threads, Horovod's background
    thread included) of each epoch's training steps."""
    sys.path.insert(0, str(SCRIPT_DIR))
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    import mnist_data
    import tensorflow as tf
    import train_mnist
    from mnist_measure import EpochTimer

    callbacks: list[Any] = []
    wrap = lambda optimizer: optimizer  # noqa: E731
    if use_horovod:
        import horovod.tensorflow.keras as hvd

        hvd.init()
        callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback()]
        wrap = hvd.DistributedOptimizer
    defaults = train_mnist.parse_args([], {})
    tf.keras.utils.set_random_seed(defaults.seed)
    train, test = mnist_data.load(mnist_data.resolve_source("mnist", {}))
    train_data = (
        tf.data.Dataset.from_tensor_slices((train.images, train.labels))
        .shuffle(10_000, seed=defaults.seed)
        .repeat()
        .batch(defaults.batch_size)
    )
    test_data = tf.data.Dataset.from_tensor_slices((test.images, test.labels)).batch(256)
    schedule = tf.keras.optimizers.schedules.PolynomialDecay(
        defaults.learning_rate,
        max(1, round(defaults.warmup_epochs * steps)),
        end_learning_rate=defaults.learning_rate,  # x 1 rank
        power=1.0,
    )
    model = train_mnist.build_model()
    model.compile(
        optimizer=wrap(tf.keras.optimizers.Adam(schedule)),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy"],
    )
    timer = EpochTimer(images_per_step=defaults.batch_size)
    timings: list[dict[str, float]] = []

    def record(epoch: int, logs: Any) -> None:
        assert timer.training is not None
        timings.append({"wall_seconds": timer.training.wall, "cpu_seconds": timer.training.cpu})

    model.fit(
        train_data,
        epochs=epochs,
        steps_per_epoch=steps,
        validation_data=test_data,
        callbacks=[*callbacks, timer.callback(), tf.keras.callbacks.LambdaCallback(on_epoch_end=record)],
        verbose=0,
    )
    out.write_text(json.dumps({"images_per_epoch": steps * defaults.batch_size, "epochs": timings}))


def overhead(steps: int, repeats: int) -> dict[str, Any]:
    """Alternating runs; epochs after the first (no tracing, no first-step broadcast) count."""
    runs: dict[str, list[dict[str, float]]] = {"horovod": [], "plain": []}
    for _ in range(repeats):
        for variant in ("horovod", "plain"):
            with tempfile.TemporaryDirectory(prefix="mnist-bench-") as workdir:
                out = Path(workdir) / "timings.json"
                argv = [sys.executable, __file__, "--overhead-worker", variant, "--steps", str(steps)]
                subprocess.run([*argv, "--out", str(out)], check=True, timeout=3600)
                measured = json.loads(out.read_text())
            for epoch in measured["epochs"][1:]:
                runs[variant].append(
                    {
                        "images_per_sec": measured["images_per_epoch"] / epoch["wall_seconds"],
                        "cpu_ms_per_image": 1000 * epoch["cpu_seconds"] / measured["images_per_epoch"],
                    }
                )
    summary: dict[str, Any] = {"steps_per_epoch": steps, "repeats": repeats}
    for variant, rows in runs.items():
        summary[variant] = {
            "images_per_sec_median": round(statistics.median(r["images_per_sec"] for r in rows), 1),
            "cpu_ms_per_image_median": round(statistics.median(r["cpu_ms_per_image"] for r in rows), 4),
            "images_per_sec_all": [round(r["images_per_sec"]) for r in rows],
        }
    hvd, plain = summary["horovod"], summary["plain"]
    summary["wall_overhead_percent"] = round(
        100
        * (plain["images_per_sec_median"] - hvd["images_per_sec_median"])
        / plain["images_per_sec_median"],
        2,
    )
    summary["cpu_overhead_percent"] = round(
        100
        * (hvd["cpu_ms_per_image_median"] - plain["cpu_ms_per_image_median"])
        / plain["cpu_ms_per_image_median"],
        2,
    )
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-epochs", type=int, default=12)
    parser.add_argument("--target", type=float, default=0.99)
    parser.add_argument("--repeats", type=int, default=3, help="Horovod/plain pairs for the overhead")
    parser.add_argument("--steps", type=int, default=400, help="steps per epoch in the overhead runs")
    parser.add_argument("--skip-convergence", action="store_true")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--overhead-worker", choices=("horovod", "plain"), help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.overhead_worker:
        overhead_worker(args.overhead_worker == "horovod", 3, args.steps, args.out)
        return 0

    results: dict[str, Any] = {
        "target": args.target,
        "cpus": len(os.sched_getaffinity(0)),
        "load_average_at_start": os.getloadavg(),
    }
    if not args.skip_convergence:
        results["convergence"] = []
        for processes in (1, 2):
            row = convergence(processes, args.max_epochs, args.target)
            results["convergence"].append(row)
            print(
                f"np={processes}: {args.target:.1%} test accuracy after epoch {row['epochs_to_target']} "
                f"({row['train_seconds_to_target']} s of training); best {row['best_test_accuracy']:.4f}; "
                f"{row['images_per_sec_median']:.0f} images/s; {row['epochs_run']} epochs in "
                f"{row['wall_seconds']} s wall; per epoch {row['val_accuracy_by_epoch']}",
                flush=True,
            )
        one, two = results["convergence"]
        if one["train_seconds_to_target"] and two["train_seconds_to_target"]:
            speedup = one["train_seconds_to_target"] / two["train_seconds_to_target"]
            results["speedup_np2_time_to_target"] = round(speedup, 2)
            print(f"np=2 reaches the target {speedup:.2f}x faster than np=1 (training seconds)")
        results["throughput_ratio_np2_np1"] = round(
            two["images_per_sec_median"] / one["images_per_sec_median"], 2
        )
        print(f"throughput np=2 / np=1: {results['throughput_ratio_np2_np1']:.2f}x")
    if not args.skip_overhead:
        results["overhead"] = overhead(args.steps, args.repeats)
        row = results["overhead"]
        hvd, plain = row["horovod"], row["plain"]
        print(
            f"Horovod at np=1 against the same training without Horovod (target <= 3%): "
            f"{hvd['images_per_sec_median']:.0f} vs {plain['images_per_sec_median']:.0f} "
            f"images/s, wall overhead {row['wall_overhead_percent']:.1f}%; "
            f"{hvd['cpu_ms_per_image_median']:.3f} vs {plain['cpu_ms_per_image_median']:.3f} "
            f"CPU ms/image, CPU overhead {row['cpu_overhead_percent']:.1f}%; all runs (images/s): "
            f"{hvd['images_per_sec_all']} vs {plain['images_per_sec_all']}"
        )
    results["load_average_at_end"] = os.getloadavg()
    print(f"load average (1/5/15 min): start {results['load_average_at_start']}, end {os.getloadavg()}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=1))
    print(f"results: {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
