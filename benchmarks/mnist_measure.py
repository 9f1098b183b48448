#!/usr/bin/env python3
"""The MNIST example, measured: examples/mnist/train_mnist.py with the measuring aids it does not carry.

    python benchmarks/mnist_measure.py [train_mnist.py arguments]      # in place of train_mnist.py

It runs train_mnist.main with one more Keras callback on every rank (its model's fit() is wrapped to add it),
which adds to each epoch's logs (after Horovod's metric averaging, so they are rank 0's own figures in rank
0's history.csv, Keras' CSVLogger):
- images_per_sec: all ranks' images over the wall time of the epoch's training steps (from the start of the
  epoch to the start of its validation: no evaluation, checkpoint or metric averaging inside);
- epoch_seconds: the whole epoch, validation included;
- rank_cpu_cores: this process's CPU seconds over the same training steps (every thread: TensorFlow, Python,
  tf.data, Horovod) divided by their wall seconds, i.e. the cores the rank kept busy.
It also keeps TensorFlow's warnings to rank 0, without Keras' "callback is slow" note, which Horovod's one-off
broadcast of the variables after the first step always triggers; and rank 0 prints the thread variables it got
(`mnist_measure: threads OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1`).

On a simulated cluster, `code_dir()` makes a SageMaker code directory holding the example and this file: its
`sagemaker_program` is "mnist_measure.py".
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EXAMPLE_DIR = HERE.parent / "examples" / "mnist"
PROGRAM = "mnist_measure.py"
SLOW_CALLBACK_NOTE = "is slow compared to the batch time"
THREAD_VARS = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


@dataclass(frozen=True)
class Clocks:
    """Wall seconds and this process's CPU seconds (every thread)."""

    wall: float
    cpu: float

    @staticmethod
    def now() -> Clocks:
        return Clocks(time.monotonic(), time.process_time())

    def elapsed(self) -> Clocks:
        now = Clocks.now()
        return Clocks(now.wall - self.wall, now.cpu - self.cpu)


class EpochTimer:
    """Times each epoch's training steps and adds the figures to the epoch's logs (a Keras callback made by
    `callback()`). `images_per_step` is the batch of all ranks."""

    def __init__(self, images_per_step: int) -> None:
        self.images_per_step = images_per_step
        self.started = Clocks(0.0, 0.0)
        self.training: Clocks | None = None

    def on_epoch_begin(self, epoch: int, logs: Mapping[str, Any] | None = None) -> None:
        self.started, self.training = Clocks.now(), None

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self.training is None:  # the first validation of the epoch: its training steps are over
            self.training = self.started.elapsed()

    def figures(self, steps: int) -> dict[str, float]:
        training = self.training or self.started.elapsed()
        return {
            "images_per_sec": round(self.images_per_step * steps / training.wall, 1),
            "epoch_seconds": round(self.started.elapsed().wall, 3),
            "rank_cpu_cores": round(training.cpu / training.wall, 2),
        }

    def callback(self) -> Any:
        import tensorflow as tf

        keras_callback = tf.keras.callbacks.LambdaCallback(
            on_epoch_begin=self.on_epoch_begin, on_test_begin=self.on_test_begin
        )
        keras_callback.on_epoch_end = lambda epoch, logs: logs.update(
            self.figures(keras_callback.params["steps"])
        )
        return keras_callback


def quiet_tensorflow_logs(is_chief: bool) -> None:
    import tensorflow as tf

    logger = tf.get_logger()
    if not is_chief:
        logger.setLevel(logging.ERROR)
    logger.addFilter(lambda record: SLOW_CALLBACK_NOTE not in record.getMessage())


def code_dir(destination: Path) -> Path:
    """A SageMaker code directory: the example's files and this wrapper (program: PROGRAM)."""
    destination.mkdir(parents=True, exist_ok=True)
    for source in [*EXAMPLE_DIR.glob("*.py"), Path(__file__).resolve()]:
        shutil.copy2(source, destination / source.name)
    return destination


def main(argv: Sequence[str] | None = None) -> int:
    # Beside the example (a code_dir), or in benchmarks/ of the repository.
    example = HERE if (HERE / "train_mnist.py").is_file() else EXAMPLE_DIR
    sys.path.insert(0, str(example))
    import horovod.tensorflow.keras as hvd
    import train_mnist

    args = train_mnist.parse_args(argv, {})
    timer = EpochTimer(images_per_step=0)
    callback = timer.callback()

    def on_train_begin(logs: Mapping[str, Any] | None = None) -> None:  # Horovod is initialised by now
        timer.images_per_step = args.batch_size * hvd.size()
        quiet_tensorflow_logs(hvd.rank() == 0)
        if hvd.rank() == 0:
            threads = " ".join(f"{name}={os.environ.get(name, '')}" for name in THREAD_VARS)
            print(f"mnist_measure: threads {threads}", flush=True)

    callback.on_train_begin = on_train_begin
    build_model = train_mnist.build_model

    def build_timed_model() -> Any:
        """The example's model, whose fit() also runs the timer right after Horovod's metric averaging (so the
        figures reach rank 0's history.csv as rank 0's own): the example itself has no measuring hook."""
        model = build_model()
        fit = model.fit

        def timed_fit(*args: Any, callbacks: Sequence[Any] = (), **kwargs: Any) -> Any:
            listed = list(callbacks)
            averaging = [isinstance(c, hvd.callbacks.MetricAverageCallback) for c in listed]
            listed.insert(averaging.index(True) + 1 if True in averaging else 0, callback)
            return fit(*args, callbacks=listed, **kwargs)

        model.fit = timed_fit
        return model

    train_mnist.build_model = build_timed_model
    return int(train_mnist.main(argv))


if __name__ == "__main__":
    sys.exit(main())
