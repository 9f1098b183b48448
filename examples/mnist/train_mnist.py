#!/usr/bin/env python3
"""Train a small CNN on MNIST or Fashion-MNIST with Horovod and tf.keras, per SageMaker's script mode.

Run it as one process per rank: `mpirun -np 2 python train_mnist.py --epochs 2`, `horovodrun -np 2 ...`, or
through the SageMaker launcher (`train`), which passes hyperparameters as `--key value` and sets SM_* vars.

The Horovod practices it shows: hvd.init(); one GPU per local rank (memory growth) when there are GPUs; the
learning rate scaled by the number of ranks with a linear warmup; hvd.DistributedOptimizer; initial variables
broadcast from rank 0; metrics averaged over ranks; every rank reads its own shard and the steps per epoch are
divided by the number of ranks; rank 0 alone logs, checkpoints and writes files; on restart rank 0 finds the
latest checkpoint and broadcasts the epoch to resume from.

Outputs: a SavedModel in <model-dir>/1 (rank 0 only); per-epoch checkpoints in <checkpoint-dir>; training
curves (history.csv, history.png) and metrics.json in <output-data-dir>; one `key=value` metric line per epoch
and a final `test_accuracy=... test_loss=...` line on stdout.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mnist_checkpoints
import mnist_data
import mnist_report

PROGRAM = "train_mnist.py"
SAVED_MODEL_VERSION = (
    "1"  # TensorFlow Serving (and SageMaker's TF serving container) expects <model>/<version>/
)


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    """Every option also accepts the underscore spelling (SageMaker passes hyperparameter names as typed)."""
    base = Path(env.get("SAGEMAKER_BASE_DIR") or "/opt/ml")
    parser = argparse.ArgumentParser(prog=PROGRAM, description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=_positive_int, default=2, help="epochs to train (default 2)")
    parser.add_argument(
        "--batch-size",
        "--batch_size",
        type=_positive_int,
        default=64,
        help="batch size PER RANK (default 64)",
    )
    parser.add_argument(
        "--learning-rate",
        "--learning_rate",
        type=_positive_float,
        default=0.001,
        help="Adam learning rate for one rank; the run uses it times the number of ranks (default 0.001)",
    )
    parser.add_argument(
        "--warmup-epochs",
        "--warmup_epochs",
        type=_non_negative_float,
        default=0.25,
        help="epochs (fractions allowed) to ramp the learning rate from base to base*ranks (default 0.25)",
    )
    parser.add_argument(
        "--steps-per-epoch",
        "--steps_per_epoch",
        type=_positive_int,
        default=None,
        help="cap on steps per epoch (default: one pass over the data, divided over the ranks)",
    )
    parser.add_argument(
        "--dataset", choices=mnist_data.DATASETS, default="mnist", help="embedded data to use"
    )
    parser.add_argument("--seed", type=int, default=1, help="random seed (each rank adds its rank)")
    parser.add_argument(
        "--model-dir",
        "--model_dir",
        default=None,
        help="where rank 0 saves the SavedModel (default $SM_MODEL_DIR); an s3:// URI, which SageMaker's "
        "TensorFlow estimator passes by default, means $SM_MODEL_DIR too: SageMaker uploads it",
    )
    parser.add_argument(
        "--checkpoint-dir",
        "--checkpoint_dir",
        type=Path,
        default=Path(env.get("SM_CHECKPOINT_DIR") or base / "checkpoints"),
        help="per-epoch checkpoints, resumed from on restart "
        "(default $SM_CHECKPOINT_DIR, else $SAGEMAKER_BASE_DIR/checkpoints, else /opt/ml/checkpoints)",
    )
    parser.add_argument(
        "--output-data-dir",
        "--output_data_dir",
        type=Path,
        default=Path(env.get("SM_OUTPUT_DATA_DIR") or base / "output" / "data"),
        help="metrics.json, history.csv, history.png (default $SM_OUTPUT_DATA_DIR)",
    )
    args = parser.parse_args(argv)
    local_model_dir = Path(env.get("SM_MODEL_DIR") or base / "model")
    # The SDK's TensorFlow estimator always passes --model_dir: an s3:// URI on SageMaker, and in local mode
    # with local_code /opt/ml/shared/model, a scratch directory it deletes afterwards. Neither is where the
    # model must go to become model.tar.gz: that is $SM_MODEL_DIR.
    sdk_default = args.model_dir is not None and (
        args.model_dir.startswith("s3://") or Path(args.model_dir).is_relative_to(base / "shared")
    )
    args.model_dir = local_model_dir if args.model_dir is None or sdk_default else Path(args.model_dir)
    return args


def thread_counts(env: Mapping[str, str], cpus: int, local_ranks: int) -> tuple[int, int]:
    """(intra-op, inter-op) TensorFlow threads: the user's TF_NUM_*/OMP_NUM_THREADS, else a fair share.

    Ranks on one host share its cores; TensorFlow's default (all cores per rank) oversubscribes them.
    """
    share = max(1, cpus // max(1, local_ranks))
    intra = int(env.get("TF_NUM_INTRAOP_THREADS") or env.get("OMP_NUM_THREADS") or share)
    inter = int(env.get("TF_NUM_INTEROP_THREADS") or min(2, share))
    return max(1, intra), max(1, inter)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, os.environ)
    try:
        # Data is read and checked before TensorFlow is imported: bad input fails in about a second.
        source = mnist_data.resolve_source(args.dataset, os.environ)
        train_split, test_split = mnist_data.load(source)
    except mnist_data.DataError as error:
        print(f"{PROGRAM}: error: {error}", file=sys.stderr, flush=True)
        return 2
    return train(args, source, train_split, test_split)


def train(
    args: argparse.Namespace,
    source: mnist_data.DataSource,
    train_split: mnist_data.Split,
    test_split: mnist_data.Split,
) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # keep TensorFlow's INFO banners out of the job log
    import horovod.tensorflow as hvd_core
    import horovod.tensorflow.keras as hvd
    import tensorflow as tf

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    is_chief = rank == 0

    intra, inter = thread_counts(os.environ, len(os.sched_getaffinity(0)), hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    gpus = tf.config.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.set_visible_devices(gpus[hvd.local_rank() % len(gpus)], "GPU")
    tf.keras.utils.set_random_seed(args.seed + rank)

    quiet_tensorflow_logs(tf, is_chief)

    def log(message: str) -> None:
        if is_chief:
            print(message, flush=True)

    log(
        f"horovod: {size} rank(s), {hvd.local_size()} on this host; {len(gpus)} GPU(s); "
        f"TensorFlow threads intra={intra} inter={inter}; data: {source.description}; "
        f"train {len(train_split)} / test {len(test_split)} examples"
    )

    # Each rank trains on its own shard; together the ranks make one pass over the data per epoch.
    train_shard = train_split.shard(rank, size)
    test_shard = test_split.shard(rank, size)
    steps_per_epoch = max(1, len(train_split) // (args.batch_size * size))
    if args.steps_per_epoch is not None:
        steps_per_epoch = min(steps_per_epoch, args.steps_per_epoch)
    train_data, test_data = input_pipelines(tf, train_shard, test_shard, args.batch_size, args.seed + rank)

    scaled_lr = args.learning_rate * size
    schedule = make_warmup_schedule(tf)(
        base_lr=args.learning_rate,
        scaled_lr=scaled_lr,
        warmup_steps=round(args.warmup_epochs * steps_per_epoch),
    )
    model = build_model(tf)
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(learning_rate=schedule))
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        metrics=["accuracy"],
    )
    optimizer.build(model.trainable_variables)  # create Adam's slots now so a checkpoint restores them all
    state = tf.train.Checkpoint(model=model, optimizer=optimizer)

    # Resume: rank 0 alone looks (only its host is sure to hold the checkpoints), then tells every rank.
    resume_epoch, history = 0, []
    if is_chief:
        mnist_checkpoints.remove_temporaries(args.checkpoint_dir)
        found = mnist_checkpoints.latest_checkpoint(args.checkpoint_dir)
        if found is not None:
            resume_epoch, checkpoint = found
            try:
                state.read(str(checkpoint / mnist_checkpoints.STATE_PREFIX)).assert_consumed()
            except (AssertionError, ValueError, tf.errors.OpError) as error:
                raise SystemExit(
                    f"{PROGRAM}: error: checkpoint {checkpoint} does not fit this model ({error}); "
                    "remove it or give another --checkpoint-dir"
                ) from error
            history = list(mnist_checkpoints.read_meta(checkpoint).get("history", []))[:resume_epoch]
            log(f"resuming from epoch {resume_epoch}: {checkpoint}")
    resume_epoch = int(hvd_core.broadcast_object(resume_epoch, root_rank=0, name="resume_epoch"))
    # The restored weights and optimizer state reach the other ranks through the broadcast callback below.

    def save_checkpoint(epoch: int) -> None:
        mnist_checkpoints.save(
            args.checkpoint_dir,
            epoch,
            lambda prefix: state.write(str(prefix)),
            {"history": history, "world_size": size, "dataset": args.dataset},
        )

    verbosity = keras_verbosity(is_chief, os.environ)
    callbacks: list[Any] = [
        # After the first step, rank 0's variables (fresh or restored) overwrite every other rank's.
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        # Epoch-end metrics (loss, accuracy, validation) averaged over the ranks' shards.
        hvd.callbacks.MetricAverageCallback(),
        make_epoch_reporter(tf)(
            images_per_step=args.batch_size * size,
            steps_per_epoch=steps_per_epoch,
            schedule=schedule,
            history=history,
            on_epoch=save_checkpoint if is_chief else None,
            log=log,
            after_progress_bar=verbosity == 1,
        ),
    ]
    started = time.monotonic()
    if resume_epoch < args.epochs:
        model.fit(
            train_data,
            epochs=args.epochs,
            initial_epoch=resume_epoch,
            steps_per_epoch=steps_per_epoch,
            validation_data=test_data,
            callbacks=callbacks,
            verbose=verbosity,
        )
    else:
        log(f"checkpoint already at epoch {resume_epoch} >= --epochs {args.epochs}: nothing to train")
    train_seconds = time.monotonic() - started

    # Exact test metrics over the whole test set: every rank evaluates its shard, sums are allreduced.
    loss, accuracy = model.evaluate(test_data, verbose=0)
    totals = hvd_core.allreduce(
        tf.constant([loss * len(test_shard), accuracy * len(test_shard), len(test_shard)], tf.float64),
        op=hvd_core.Sum,
        name="test_totals",
    ).numpy()
    test_loss, test_accuracy = float(totals[0] / totals[2]), float(totals[1] / totals[2])

    if is_chief:
        save_model(model, args.model_dir)
        metrics = {
            "test_accuracy": test_accuracy,
            "test_loss": test_loss,
            "epochs": args.epochs,
            "resumed_from_epoch": resume_epoch,
            "world_size": size,
            "dataset": args.dataset,
            "batch_size_per_rank": args.batch_size,
            "learning_rate": scaled_lr,
            "steps_per_epoch": steps_per_epoch,
            "train_seconds": round(train_seconds, 3),
            "images_per_sec": history[-1]["images_per_sec"] if history else None,
        }
        mnist_report.write_metrics_json(args.output_data_dir / "metrics.json", metrics)
        if history:
            mnist_report.write_history_csv(args.output_data_dir / "history.csv", history)
            mnist_report.plot_history(
                args.output_data_dir / "history.png", history, f"{args.dataset}, {size} rank(s)"
            )
        log(mnist_report.final_line(test_accuracy, test_loss))
    return 0


def quiet_tensorflow_logs(tf: Any, is_chief: bool) -> None:
    """Warnings from rank 0 only; and not Keras' "callback is slow" note, which Horovod's one-off broadcast of
    the variables after the first step always triggers."""
    logger = tf.get_logger()
    if not is_chief:
        logger.setLevel(logging.ERROR)
    logger.addFilter(lambda record: "is slow compared to the batch time" not in record.getMessage())


def keras_verbosity(is_chief: bool, env: Mapping[str, str]) -> int:
    """Rank 0 shows Keras' progress bar on a terminal; in a SageMaker job log, one summary line per epoch."""
    if not is_chief:
        return 0
    in_sagemaker_job = "SM_TRAINING_ENV" in env or "SM_CURRENT_HOST" in env
    return 1 if sys.stdout.isatty() and not in_sagemaker_job else 2


def input_pipelines(
    tf: Any, train_shard: mnist_data.Split, test_shard: mnist_data.Split, batch_size: int, seed: int
) -> tuple[Any, Any]:
    """Training: this rank's shard reshuffled every pass, endless (Keras counts steps); test: one pass."""
    train_data = (
        tf.data.Dataset.from_tensor_slices((train_shard.images, train_shard.labels))
        .shuffle(len(train_shard), seed=seed, reshuffle_each_iteration=True)
        .repeat()
        .batch(batch_size, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )
    test_data = (
        tf.data.Dataset.from_tensor_slices((test_shard.images, test_shard.labels))
        .batch(256)
        .prefetch(tf.data.AUTOTUNE)
    )
    return train_data, test_data


def build_model(tf: Any) -> Any:
    """A LeNet-5-style CNN (80k parameters): about 99% on MNIST, and cheap to train on a few CPU cores."""
    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input(shape=(*mnist_data.IMAGE_SHAPE, 1)),
            layers.Conv2D(16, 5, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 5, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.3),
            layers.Dense(mnist_data.NUM_CLASSES, activation="softmax"),
        ]
    )


def make_warmup_schedule(tf: Any) -> Any:
    """Linear ramp from the one-rank rate to the scaled rate over the first steps (Goyal et al., 2017).

    A step-based schedule rather than Horovod's per-epoch warmup callback: it also works for warmups shorter
    than an epoch and, as a function of the optimizer's step counter, it continues correctly after a resume.
    """

    @tf.keras.saving.register_keras_serializable(package="train_mnist")
    class WarmupSchedule(tf.keras.optimizers.schedules.LearningRateSchedule):  # type: ignore[misc,name-defined]
        def __init__(self, base_lr: float, scaled_lr: float, warmup_steps: int) -> None:
            self.base_lr = base_lr
            self.scaled_lr = scaled_lr
            self.warmup_steps = warmup_steps

        def __call__(self, step: Any) -> Any:
            if self.warmup_steps <= 0:
                return tf.constant(self.scaled_lr, tf.float32)
            progress = tf.minimum(tf.cast(step, tf.float32) / float(self.warmup_steps), 1.0)
            return self.base_lr + (self.scaled_lr - self.base_lr) * progress

        def get_config(self) -> dict[str, Any]:
            return {"base_lr": self.base_lr, "scaled_lr": self.scaled_lr, "warmup_steps": self.warmup_steps}

    return WarmupSchedule


@dataclass(frozen=True)
class Clocks:
    """Wall seconds and this process's CPU seconds (every thread: TensorFlow, Python, tf.data, Horovod)."""

    wall: float
    cpu: float

    @staticmethod
    def now() -> Clocks:
        return Clocks(time.monotonic(), time.process_time())

    def elapsed(self) -> Clocks:
        now = Clocks.now()
        return Clocks(now.wall - self.wall, now.cpu - self.cpu)


def make_epoch_reporter(tf: Any) -> Any:
    """A callback that times each epoch's training steps, records the averaged metrics and reports them."""

    class EpochReporter(tf.keras.callbacks.Callback):  # type: ignore[misc,name-defined]
        def __init__(
            self,
            images_per_step: int,
            steps_per_epoch: int,
            schedule: Any,
            history: list[dict[str, Any]],
            on_epoch: Any,
            log: Any,
            after_progress_bar: bool,
        ) -> None:
            super().__init__()
            self.images_per_step = images_per_step
            self.steps_per_epoch = steps_per_epoch
            self.schedule = schedule
            self.history = history
            self.on_epoch = on_epoch
            self.log = log
            self.after_progress_bar = after_progress_bar
            self.epoch_started = Clocks(0.0, 0.0)
            self.training: Clocks | None = None  # the training steps' share of the epoch

        def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
            self.epoch_started = Clocks.now()
            self.training = None

        def on_test_begin(self, logs: Any = None) -> None:  # validation starts: the training steps are over
            if self.training is None:
                self.training = self.epoch_started.elapsed()

        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            logs = logs or {}
            training = self.training or self.epoch_started.elapsed()
            seconds = training.wall
            row = {
                "epoch": epoch + 1,
                "train_loss": float(logs["loss"]),
                "train_accuracy": float(logs["accuracy"]),
                "val_loss": float(logs["val_loss"]),
                "val_accuracy": float(logs["val_accuracy"]),
                "images_per_sec": round(self.images_per_step * self.steps_per_epoch / seconds, 1),
                "epoch_seconds": round(self.epoch_started.elapsed().wall, 3),
                "learning_rate": float(self.schedule(self.model.optimizer.iterations)),
                # Cores this rank kept busy during the training steps (TensorFlow, Python, tf.data, Horovod).
                "rank_cpu_cores": round(training.cpu / seconds, 2),
            }
            self.history.append(row)
            # A progress bar leaves its line open: start the metric line on a line of its own.
            self.log(("\n" if self.after_progress_bar else "") + mnist_report.epoch_line(row))
            if self.on_epoch is not None:
                self.on_epoch(epoch + 1)

    return EpochReporter


def save_model(model: Any, model_dir: Path) -> None:
    """SavedModel for serving (no optimizer), written beside its final place and renamed into it."""
    model_dir.mkdir(parents=True, exist_ok=True)
    final = model_dir / SAVED_MODEL_VERSION
    temporary = model_dir / f".tmp-{SAVED_MODEL_VERSION}-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    model.save(str(temporary), include_optimizer=False, save_format="tf")
    if final.exists():
        shutil.rmtree(final)
    temporary.replace(final)


if __name__ == "__main__":
    sys.exit(main())
