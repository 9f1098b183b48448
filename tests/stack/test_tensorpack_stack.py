"""The pinned Python stack as the images and the dev setup install it: tensorpack 0.11, patched once by
docker/scripts/patch-tensorpack.py, runs its trainers, callbacks and predictors under TensorFlow 2.15 and
Horovod for any user script (tensorpack's own FasterRCNN example included), not only for ours."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
PATCH = REPO / "docker" / "scripts" / "patch-tensorpack.py"


def patch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("patch_tensorpack", PATCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.integration  # runs the patch script
def test_the_installed_tensorpack_carries_every_edit() -> None:
    argv = [sys.executable, str(PATCH), "--check"]
    check = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_the_patch_refuses_a_tensorpack_it_does_not_know(tmp_path: Path) -> None:
    """A file whose text is neither the release's nor the patched one: an error naming it, nothing written."""
    patch = patch_module()
    copy = tmp_path / "tensorpack"
    shutil.copytree(patch.package_dir(), copy, ignore=shutil.ignore_patterns("__pycache__"))
    trainers = copy / "train" / "trainers.py"
    trainers.write_text(trainers.read_text().replace("tf.compat.v1.global_variables()", "something_else()"))
    with pytest.raises(patch.PatchError, match=r"train/trainers.py: expected 1 occurrence"):
        patch.plan(copy)
    assert "something_else()" in trainers.read_text()


# A tiny ModelDesc trained by tensorpack's HorovodTrainer under `train`, with the callbacks tensorpack's
# FasterRCNN example uses (GPUUtilizationTracker disables itself under MPI) and its AccumGradOptimizer; then
# an OfflinePredictor from the last checkpoint. Every rank writes what it ends with.
HOROVOD_SCRIPT = """
import json, os, sys
import numpy as np
import tensorflow as tf
from tensorpack import ModelDesc, TrainConfig, launch_train_with_config
from tensorpack.callbacks import (Callback, EstimatedTimeLeft, GPUUtilizationTracker, HostMemoryTracker,
                                  ModelSaver, ThroughputTracker)
from tensorpack.dataflow import DataFromGenerator, FixedSizeData
from tensorpack.input_source import QueueInput
from tensorpack.predict import OfflinePredictor, PredictConfig
from tensorpack.tfutils import SmartInit, optimizer
from tensorpack.train import HorovodTrainer
import horovod.tensorflow as hvd

tf1 = tf.compat.v1
tf1.disable_eager_execution()
out = os.environ["SM_OUTPUT_DATA_DIR"]
ckpt = os.path.join(os.environ["SM_MODEL_DIR"], "ckpt")

class Linear(ModelDesc):
    def inputs(self):
        return [tf.TensorSpec((None, 4), tf.float32, "x"), tf.TensorSpec((None,), tf.float32, "y")]
    def build_graph(self, x, y):
        w = tf1.get_variable("w", [4, 1], initializer=tf1.zeros_initializer())
        pred = tf.identity(tf.reshape(tf.matmul(x, w), [-1]), name="pred")
        return tf.reduce_mean(tf.square(pred - y), name="cost")
    def optimizer(self):
        return optimizer.AccumGradOptimizer(tf1.train.GradientDescentOptimizer(0.1), 2)

hvd.init()
rng = np.random.default_rng(hvd.rank())
def batches():
    while True:
        x = rng.normal(size=(8, 4)).astype(np.float32)
        yield [x, x @ np.array([1.0, -2.0, 0.5, 3.0], np.float32)]
class Weights(Callback):
    _chief_only = False  # every rank records its own variables
    def _setup_graph(self):
        (self.tensor,) = [v for v in tf1.global_variables() if v.op.name == "w"]
    def _trigger_epoch(self):
        self.value = self.trainer.sess.run(self.tensor)

trainer = HorovodTrainer(average=True)
weights = Weights()
callbacks = [GPUUtilizationTracker(), ThroughputTracker(samples_per_step=8), EstimatedTimeLeft(median=True),
             HostMemoryTracker(), weights]
if hvd.rank() == 0:
    callbacks.append(ModelSaver(checkpoint_dir=ckpt))
launch_train_with_config(TrainConfig(
    model=Linear(), data=QueueInput(FixedSizeData(DataFromGenerator(batches), 20)), callbacks=callbacks,
    steps_per_epoch=20, max_epoch=3), trainer)
record = {"w": weights.value.ravel().tolist()}
if hvd.rank() == 0:
    last = SmartInit(tf1.train.latest_checkpoint(ckpt))
    predict = OfflinePredictor(PredictConfig(model=Linear(), session_init=last, input_names=["x"],
                                             output_names=["pred"]))
    record["prediction"] = predict(np.eye(4, dtype=np.float32))[0].tolist()
with open(os.path.join(out, f"rank-{hvd.rank()}.json"), "w") as f:
    json.dump(record, f)
"""


@pytest.mark.integration
def test_horovod_trainer_at_np2_through_train(train_job) -> None:  # type: ignore[no-untyped-def]
    job = train_job(HOROVOD_SCRIPT, {"sagemaker_mpi_num_of_processes_per_host": 2})
    result = job.run(timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads((job.paths.output_data_dir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["w"] == ranks[1]["w"]  # Horovod kept the ranks' variables identical
    np.testing.assert_allclose(ranks[0]["w"], [1.0, -2.0, 0.5, 3.0], atol=0.2)  # and they learned
    np.testing.assert_allclose(ranks[0]["prediction"], ranks[0]["w"], atol=1e-5)  # predictor from ModelSaver
    assert "GPUUtilizationTracker is disabled under MPI" in result.stderr + result.stdout


# tensorpack's example-like path on a CPU: an NCHW model (convolutions, pooling, nearest upsampling, a strided
# transposed convolution, ROI crops) with tensorpack layers and argscope, its summaries as the example makes
# them (add_moving_summary, a tf.compat.v1 scalar, a tensor histogram), trained by SimpleTrainer (with
# GraphProfiler for one step) and by SyncMultiGPUTrainerReplicated with one tower (soft placement puts
# '/gpu:0' on the CPU), then predicted by OfflinePredictor and MultiTowerOfflinePredictor. NCHW kernels on a
# CPU need oneDNN: TF_ENABLE_ONEDNN_OPTS=1, which the CPU image sets. The script first lists MODEL_VARIABLES
# of a frozen variable and a BatchNorm in a graph of their own (one process, one TensorFlow import for both).
GRAPH_SCRIPT = """
import sys
import numpy as np
import tensorflow as tf
from tensorpack import ModelDesc, TrainConfig, launch_train_with_config
from tensorpack.callbacks import EnableCallbackIf, GraphProfiler, ModelSaver
from tensorpack.dataflow import DataFromGenerator, FixedSizeData
from tensorpack.input_source import QueueInput
from tensorpack.models import Conv2D, Conv2DTranspose, FixedUnPooling, MaxPooling
from tensorpack.predict import MultiTowerOfflinePredictor, OfflinePredictor, PredictConfig
from tensorpack.tfutils import SmartInit, argscope
from tensorpack.tfutils.summary import add_moving_summary, add_tensor_summary
from tensorpack.train import SimpleTrainer, SyncMultiGPUTrainerReplicated
from tensorpack.utils import logger

from tensorpack.models import BatchNorm
from tensorpack.tfutils.tower import TowerContext
from tensorpack.tfutils.varreplace import freeze_variables

tf1 = tf.compat.v1
tf1.disable_eager_execution()

with tf.Graph().as_default(), TowerContext("", is_training=True):
    with freeze_variables(skip_collection=True):
        tf1.get_variable("frozen", [3])
    BatchNorm("bn", tf1.placeholder(tf.float32, [None, 4]))
    print("model variables:", sorted(v.op.name for v in tf1.get_collection(tf1.GraphKeys.MODEL_VARIABLES)))

class TinyFPN(ModelDesc):
    def inputs(self):
        return [tf.TensorSpec((None, 3, 32, 32), tf.float32, "image"),
                tf.TensorSpec((None,), tf.float32, "y")]
    def build_graph(self, image, y):
        with argscope([Conv2D, MaxPooling, Conv2DTranspose, FixedUnPooling], data_format="channels_first"):
            c2 = Conv2D("c2", image, 8, 3, activation=tf.nn.relu)
            c3 = Conv2D("c3", MaxPooling("pool", c2, 2), 8, 3, activation=tf.nn.relu)
            up = FixedUnPooling("up", c3, 2, unpool_mat=np.ones((2, 2), dtype="float32"))
            p2 = Conv2D("p2", c2 + up, 8, 3)
            mask = Conv2DTranspose("deconv", p2, 4, 2, strides=2)
        nhwc = tf.transpose(p2, [0, 2, 3, 1])
        rois = tf.image.crop_and_resize(nhwc, [[0.1, 0.1, 0.6, 0.7]], [0], [7, 7])
        score = tf.reduce_mean(rois, axis=[1, 2, 3]) + tf.reduce_mean(mask, axis=[1, 2, 3])
        pred = tf.identity(score, name="pred")
        cost = tf.reduce_mean(tf.square(pred - y), name="cost")
        add_moving_summary(cost)
        add_tensor_summary(p2, ["histogram", "rms"], name="p2")
        return cost
    def optimizer(self):
        lr = tf1.get_variable("learning_rate", initializer=0.01, trainable=False)
        tf1.summary.scalar("learning_rate-summary", lr)
        return tf1.train.MomentumOptimizer(lr, 0.9)

def data():
    rng = np.random.default_rng(0)
    while True:
        yield [rng.normal(size=(2, 3, 32, 32)).astype(np.float32), np.ones(2, np.float32)]

outdir = sys.argv[1]
for name, trainer in (("simple", SimpleTrainer()), ("replicated", SyncMultiGPUTrainerReplicated(1))):
    logger.set_logger_dir(f"{outdir}/{name}", "d")  # monitors (stats.json, events) and checkpoints
    callbacks = [ModelSaver()]
    if name == "simple":
        profile = GraphProfiler(dump_tracing=True, dump_event=True)
        callbacks.append(EnableCallbackIf(profile, lambda cb: cb.trainer.global_step == 3))
    with tf.Graph().as_default():
        launch_train_with_config(TrainConfig(
            model=TinyFPN(), data=QueueInput(FixedSizeData(DataFromGenerator(data), 5)),
            callbacks=callbacks, steps_per_epoch=5, max_epoch=2), trainer)
image = np.zeros((1, 3, 32, 32), np.float32)
last = SmartInit(tf1.train.latest_checkpoint(f"{outdir}/simple"))
config = PredictConfig(model=TinyFPN(), session_init=last, input_names=["image"], output_names=["pred"])
single = OfflinePredictor(config)(image)[0]
towers = MultiTowerOfflinePredictor(config, [0]).get_predictors()[0](image)[0]
np.testing.assert_allclose(single, towers, rtol=1e-5)
print("nchw-ok", float(single[0]))
"""


@dataclass(frozen=True)
class GraphRun:
    result: subprocess.CompletedProcess[str]
    outdir: Path


@pytest.fixture(scope="module")
def graph_run(tmp_path_factory: pytest.TempPathFactory) -> GraphRun:
    outdir = tmp_path_factory.mktemp("tensorpack-graph")
    script = outdir / "graph.py"
    script.write_text(GRAPH_SCRIPT)
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    argv = [sys.executable, str(script), str(outdir)]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    return GraphRun(result, outdir)


@pytest.mark.integration
def test_frozen_variables_and_batchnorm_statistics_are_model_variables(graph_run: GraphRun) -> None:
    """tensorpack keeps what is not trained but belongs to the model (frozen layers, BatchNorm's moving
    statistics) in MODEL_VARIABLES; its dumps and loaders rely on it. Under TF 2 (resource variables) its
    isinstance checks missed them until patched."""
    out = graph_run.result.stdout
    assert "model variables: ['bn/mean/EMA', 'bn/variance/EMA', 'frozen']" in out, out[-2000:]
    assert "did not return a Variable" not in graph_run.result.stderr + out


@pytest.mark.integration
def test_an_nchw_model_trains_and_predicts_with_tensorpacks_trainers(graph_run: GraphRun) -> None:
    tmp_path = graph_run.outdir
    assert "nchw-ok" in graph_run.result.stdout
    assert (tmp_path / "replicated" / "checkpoint").is_file()
    # The monitors got the example's kinds of summaries, and GraphProfiler traced its one step.
    last = json.loads((tmp_path / "simple" / "stats.json").read_text())[-1]
    # tensorpack drops the "-summary" suffix of a scalar summary's name
    assert {"cost", "learning_rate", "p2-rms"} <= set(last), sorted(last)
    assert last["learning_rate"] == pytest.approx(0.01)
    assert list((tmp_path / "simple").glob("chrome-trace-*.json"))
