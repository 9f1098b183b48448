"""In-flight with no code in the frameworks the examples use: the script-mode runner (runscript/run.py) under
a real 2-rank mpirun with Horovod, the pipe's end on fd 3 (a file per rank here, the rank wrapper's pipe under
`train`). Rank 1 is made late by a sleep before each step: its steps' waits for the allreduce are shorter than
rank 0's by about that much, for Horovod's Keras DistributedOptimizer and for tensorpack's HorovodTrainer (a
tf.compat.v1 graph in a session)."""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from smhvd import wire
from smhvd.runscript import run as runscript

pytestmark = pytest.mark.integration

LATE = 0.03  # seconds rank 1 sleeps before each step

KERAS = f"""
import time
import numpy as np
import tensorflow as tf
import horovod.tensorflow.keras as hvd

hvd.init()
x = np.random.default_rng(0).random((4096, 16), np.float32)
model = tf.keras.Sequential([tf.keras.layers.Dense(32, activation="relu"), tf.keras.layers.Dense(1)])

class Late(tf.keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        if hvd.rank() == 1:
            time.sleep({LATE})

model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.01)), loss="mse")
model.fit(x, x[:, :1], batch_size=64, epochs=2, verbose=0, callbacks=[Late()])
"""

TENSORPACK = f"""
import time
import numpy as np
import tensorflow as tf
import horovod.tensorflow as hvd
from tensorpack import ModelDesc, TrainConfig, launch_train_with_config
from tensorpack.callbacks import Callback
from tensorpack.dataflow import DataFromGenerator, FixedSizeData
from tensorpack.input_source import QueueInput
from tensorpack.train import HorovodTrainer

tf1 = tf.compat.v1
tf1.disable_eager_execution()
tf.global_variables = tf1.global_variables  # tensorpack 0.11 calls it (what the images' patch does)

class Linear(ModelDesc):
    def inputs(self):
        return [tf.TensorSpec((None, 4), tf.float32, "x"), tf.TensorSpec((None,), tf.float32, "y")]
    def build_graph(self, x, y):
        w = tf1.get_variable("w", [4, 1], initializer=tf1.zeros_initializer())
        return tf.reduce_mean(tf.square(tf.reshape(tf.matmul(x, w), [-1]) - y), name="cost")
    def optimizer(self):
        return tf1.train.GradientDescentOptimizer(0.1)

class Late(Callback):
    _chief_only = False
    def _before_run(self, _):
        if hvd.rank() == 1:
            time.sleep({LATE})

hvd.init()
rng = np.random.default_rng(hvd.rank())
def batches():
    while True:
        x = rng.normal(size=(8, 4)).astype(np.float32)
        yield [x, x.sum(axis=1)]
launch_train_with_config(TrainConfig(
    model=Linear(), data=QueueInput(FixedSizeData(DataFromGenerator(batches), 30)), callbacks=[Late()],
    steps_per_epoch=30, max_epoch=3), HorovodTrainer(average=True))
"""


def recorded_waits(tmp_path: Path, script: str) -> list[dict[int, float]]:
    """Run `script` on 2 ranks; each rank's recorded waits (DONE - READY) by step."""
    (tmp_path / "job.py").write_text(textwrap.dedent(script))
    venv_bin = str(Path(sys.executable).parent)
    shell = f'exec 3>"steps.$OMPI_COMM_WORLD_RANK"; exec "$0" "{runscript.__file__}" job.py'
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        "2",
        "--bind-to",
        "none",
        "-x",
        "PATH",
        "-x",
        wire.INFLIGHT_FD,
    ]
    argv += ["-x", "TF_CPP_MIN_LOG_LEVEL", "bash", "-c", shell, sys.executable]
    env = {
        **os.environ,
        "PATH": f"{venv_bin}:{os.environ['PATH']}",
        wire.INFLIGHT_FD: "3",
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    result = subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-3000:]
    waits = []
    for rank in (0, 1):
        steps = [
            s for line in (tmp_path / f"steps.{rank}").read_text().splitlines() for s in json.loads(line)
        ]
        assert all(done >= ready for _, ready, done in steps)
        waits.append({seq: done - ready for seq, ready, done in steps})
    return waits


@pytest.mark.parametrize("script", [KERAS, TENSORPACK], ids=["keras", "tensorpack"])
def test_the_late_rank_waits_less_for_the_allreduce_by_about_how_late_it_is(
    tmp_path: Path, script: str
) -> None:
    if shutil.which("mpirun") is None:
        pytest.fail("mpirun is not installed (make setup installs Open MPI)")
    first, late = recorded_waits(tmp_path, script)
    common = sorted(set(first) & set(late))[5:]  # past the first steps (graph building, broadcast)
    assert len(common) >= 20
    lateness = statistics.median(first[seq] - late[seq] for seq in common)
    assert LATE * 0.5 < lateness < LATE * 3, lateness
