#!/usr/bin/env python3
"""Train a small CNN on MNIST or Fashion-MNIST with Horovod and tf.keras, in SageMaker's script mode.

One process per rank: `horovodrun -np 2 python train_mnist.py --epochs 2`, `mpirun -np 2 python ...`, or the
image's `train` launcher (hyperparameters as `--key value`, the SM_* variables, TensorFlow's thread pools
sized for the ranks sharing a host). Rank 0 alone checkpoints every epoch (a restarted job, e.g. managed spot
training, resumes from the latest one, and keeps history.csv beside the checkpoints) and writes the outputs: a
SavedModel in <model-dir>/1, history.csv and metrics.json in <output-data-dir>, and a final
`test_accuracy=... test_loss=...` line.

Every line that differs from single-process Keras code is marked `# Horovod:`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import horovod.tensorflow.keras as hvd
import mnist_data
import tensorflow as tf

# For a SageMaker estimator's metric_definitions: Keras' line per epoch (verbose=2) and the final line.
METRIC_DEFINITIONS = [
    {"Name": "validation:loss", "Regex": r" - val_loss: ([0-9.e+-]+)"},
    {"Name": "validation:accuracy", "Regex": r" - val_accuracy: ([0-9.]+)"},
    {"Name": "test:accuracy", "Regex": r"test_accuracy=([0-9.]+)"},
    {"Name": "test:loss", "Regex": r"test_loss=([0-9.]+)"},
]


HISTORY = "history.csv"  # Keras' CSVLogger: one row per epoch, "epoch" (counted from 0) first


def history_before(text: str, epoch: int) -> str:
    """The history a run resumed at `epoch` continues: the header and the rows of the epochs before it. A row
    that a kill cut short, and rows of epochs the checkpoint does not hold (logged, then killed before the
    checkpoint was saved: that epoch is trained again), are left out. Pure."""
    lines = text.splitlines(keepends=True)
    if not lines or not lines[0].endswith("\n"):
        return ""
    kept = [
        row
        for row in lines[1:]
        if row.endswith("\n") and (first := row.split(",", 1)[0]).isdigit() and int(first) < epoch
    ]
    return lines[0] + "".join(kept)


def parse_args(argv: Sequence[str] | None, env: Mapping[str, str]) -> argparse.Namespace:
    base = Path(env.get("SAGEMAKER_BASE_DIR") or "/opt/ml")
    parser = argparse.ArgumentParser(prog="train_mnist.py", description=__doc__.split("\n\n")[0])

    def option(name: str, **kwargs: Any) -> None:  # SageMaker passes names as typed: `batch_size` too
        parser.add_argument(*dict.fromkeys([f"--{name}", f"--{name.replace('-', '_')}"]), **kwargs)

    option("epochs", type=int, default=2, help="epochs in all (a resumed job stops there too)")
    option("batch-size", type=int, default=64, help="batch size per rank")
    option("learning-rate", type=float, default=0.001, help="Adam's rate for one rank, x ranks")
    option("warmup-epochs", type=float, default=0.25, help="linear warmup to the scaled rate (fractions ok)")
    option("steps-per-epoch", type=int, help="a cap (default: one pass over the data, all ranks)")
    option("dataset", choices=mnist_data.DATASETS, default="mnist", help="data when no channel is given")
    option("seed", type=int, default=1, help="random seed (each rank adds its rank)")
    option("model-dir", help="where rank 0 saves the SavedModel (default $SM_MODEL_DIR)")
    default_checkpoints = env.get("SM_CHECKPOINT_DIR") or base / "checkpoints"
    option("checkpoint-dir", type=Path, default=Path(default_checkpoints), help="checkpoints, resumed from")
    option("output-data-dir", type=Path, default=Path(env.get("SM_OUTPUT_DATA_DIR") or base / "output/data"))
    args = parser.parse_args(argv)
    # SageMaker's TensorFlow estimator always passes --model_dir: an s3:// URI, or in local mode a scratch
    # <base>/shared/model. The model must go to $SM_MODEL_DIR to become model.tar.gz.
    if (args.model_dir or "s3://").startswith(("s3://", f"{base}/shared/")):
        args.model_dir = env.get("SM_MODEL_DIR") or base / "model"
    args.model_dir = Path(args.model_dir)
    return args


def build_model() -> Any:
    """A LeNet-5-style CNN (80k parameters): about 98% on MNIST after one epoch, cheap on a few CPU cores."""
    layers = tf.keras.layers
    return tf.keras.Sequential(
        [
            layers.Input(shape=(28, 28, 1)),
            layers.Conv2D(16, 5, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 5, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
            layers.Dropout(0.3),
            layers.Dense(10, activation="softmax"),
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv, os.environ)
    try:  # the data is read and checked before Horovod starts: bad data fails fast, and nothing is written
        source = mnist_data.resolve_source(args.dataset, os.environ)
        train, test = mnist_data.load(source)
    except mnist_data.DataError as error:
        print(f"train_mnist.py: error: {error}", file=sys.stderr)
        return 2

    hvd.init()  # Horovod: one process per rank, started by mpirun (or the image's `train`)
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:  # Horovod: each rank uses the GPU of its local rank, and only as much memory as it needs
        tf.config.set_visible_devices(gpus[hvd.local_rank()], "GPU")
        tf.config.experimental.set_memory_growth(gpus[hvd.local_rank()], True)
    tf.keras.utils.set_random_seed(args.seed + hvd.rank())  # Horovod: another shuffle order per rank
    chief = hvd.rank() == 0  # Horovod: rank 0 alone prints, checkpoints and writes the outputs
    if chief:
        print(
            f"horovod: {hvd.size()} rank(s); train {len(train.labels)} / test {len(test.labels)} examples"
            f" from {source[0]} and {source[1]}",
            flush=True,
        )

    # Horovod: each rank trains on its own shard; together the ranks make one pass over the data per epoch.
    def shard(split: mnist_data.Split) -> Any:
        return tf.data.Dataset.from_tensor_slices(tuple(split)).shard(hvd.size(), hvd.rank())

    steps = max(1, len(train.labels) // (args.batch_size * hvd.size()))  # Horovod: steps of all ranks
    steps = min(steps, args.steps_per_epoch or steps)
    train_data = shard(train).shuffle(10_000, seed=args.seed + hvd.rank()).repeat().batch(args.batch_size)
    test_data = shard(test).batch(256)

    # Horovod: the rate rises linearly from one rank's to hvd.size() times that over the warmup (Goyal et
    # al., 2017). A schedule of the optimizer's step counter, so it also continues correctly after a resume.
    warmup_steps = max(1, round(args.warmup_epochs * steps))
    learning_rate = tf.keras.optimizers.schedules.PolynomialDecay(
        args.learning_rate, warmup_steps, end_learning_rate=args.learning_rate * hvd.size(), power=1.0
    )
    # Horovod: the optimizer averages the ranks' gradients before applying them.
    optimizer = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(learning_rate))
    model = build_model()
    model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(), metrics=["accuracy"])
    optimizer.build(model.trainable_variables)  # Adam's slots exist now, so a restore fills them all

    # Horovod: rank 0 restores its latest checkpoint (its host holds them); the broadcasts share it.
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    manager = tf.train.CheckpointManager(checkpoint, str(args.checkpoint_dir), max_to_keep=2)
    initial_epoch = 0
    if chief and manager.latest_checkpoint:
        checkpoint.restore(manager.latest_checkpoint).assert_consumed()
        initial_epoch = int(manager.latest_checkpoint.rsplit("-", 1)[1])  # saved as ckpt-<epochs done>
        print(f"resuming from epoch {initial_epoch}: {manager.latest_checkpoint}", flush=True)
    initial_epoch = int(hvd.broadcast(initial_epoch, root_rank=0, name="initial_epoch"))  # Horovod

    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),  # Horovod: after step 1, rank 0's variables
        hvd.callbacks.MetricAverageCallback(),  # Horovod: the epoch's metrics averaged over the ranks' shards
    ]
    # The history is kept beside the checkpoints, which a spot restart gets back (the output directory it
    # does not): each epoch once, the resumed run's after the killed one's.
    history = args.checkpoint_dir / HISTORY
    if chief:  # Horovod: rank 0 alone
        args.output_data_dir.mkdir(parents=True, exist_ok=True)
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        kept = history_before(history.read_text() if history.exists() else "", initial_epoch)
        history.with_suffix(".tmp").write_text(kept)
        history.with_suffix(".tmp").replace(history)  # a kill now leaves the old history or the new one
        callbacks += [
            tf.keras.callbacks.CSVLogger(str(history), append=True),
            tf.keras.callbacks.LambdaCallback(
                on_epoch_end=lambda epoch, _: manager.save(checkpoint_number=epoch + 1)
            ),
        ]
    model.fit(
        train_data,
        epochs=args.epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps,
        validation_data=test_data,
        callbacks=callbacks,
        verbose=2 if chief else 0,  # Horovod: one log
    )

    if chief:  # Horovod: rank 0 alone
        test_loss, test_accuracy = model.evaluate(test.images, test.labels, batch_size=256, verbose=0)
        # An inference SavedModel (serving_default) in <model>/<version>, as TF Serving expects; Model.export
        # exists in Keras 2.13+ and Keras 3 alike (save_format="tf" does not survive Keras 3). It prints the
        # whole signature, captures included (15 lines of tensor specs): one line of ours says where it went.
        with contextlib.redirect_stdout(io.StringIO()):
            model.export(str(args.model_dir / "1"))
        metrics = {
            "test_accuracy": test_accuracy,
            "test_loss": test_loss,
            "epochs": args.epochs,
            "resumed_from_epoch": initial_epoch,
            "world_size": hvd.size(),
            "steps_per_epoch": steps,
            "dataset": args.dataset,
        }
        (args.output_data_dir / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
        shutil.copyfile(history, args.output_data_dir / HISTORY)
        print(f"test_accuracy={test_accuracy:.4f} test_loss={test_loss:.4f}", flush=True)
        print(f"model: SavedModel (serving_default) in {args.model_dir / '1'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
