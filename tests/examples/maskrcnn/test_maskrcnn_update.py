"""One training step at 2 ranks through `train` moves the weights as one step of tensorpack's
HorovodTrainer(average=False) with its MomentumOptimizer(learning_rate / 8) would (here / schedule_batch, 2
for the tiny preset): w1 = w0 - learning_rate / 2 * (g_rank0 + g_rank1), the momentum buffer starting at
zero. The two ranks' gradients are computed here, in this process, from the same weights and the same two
examples.

The job's randomness is switched off so that both sides see the same inputs: no flip, every labelled anchor
in the RPN batch and every ROI in the box batch (the ROIs' order stays random, which only reorders sums).
FreezeBN with freeze_at=2, as the coco preset: gamma/beta train from group1 on (tensorpack's
FREEZE_AFFINE=False), the stem and group0 stay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
import train_maskrcnn
from make_shapes import generate
from mrcnn import data, dist
from mrcnn.config import build_config, scaled_schedule
from mrcnn.model import MaskRCNN
from mrcnn.weights import is_model_variable
from tensorpack.tfutils.tower import TowerContext

from smhvd_dev.mltree import write_ml_tree

from .conftest import run_train, train_hyperparameters

pytestmark = pytest.mark.integration
tf1 = tf.compat.v1

CONFIG = (
    "norm=FreezeBN freeze_at=2 flip=false rpn_batch_per_image=8192 frcnn_batch_per_image=4096 "
    "total_steps=1 steps_per_epoch=1 warmup_init_lr=0.2 data_workers=1"
)


def gradients_and_weights(cfg, ds: data.Dataset, recs: list[data.Record]) -> tuple[dict, dict, dict]:
    """(initial weights, the sum over both ranks' first examples of each trainable variable's gradient,
    trainable flags), from a training graph built here with freshly initialised variables."""
    model = MaskRCNN(cfg, ds.num_classes)
    with tf.Graph().as_default():
        inputs = [tf1.placeholder(s.dtype, s.shape, s.name) for s in model.inputs()]
        with TowerContext("", is_training=True):
            cost = model.build_graph(*inputs)
        trainable = tf1.trainable_variables()
        grads = tf.gradients(cost, trainable)
        with tf1.Session(config=train_maskrcnn.session_config(dist.World(0, 1, 0, 1, None))) as sess:
            sess.run(tf1.global_variables_initializer())
            weights = {v.op.name: sess.run(v) for v in tf1.global_variables() if is_model_variable(v.op.name)}
            summed = {v.op.name: np.zeros(v.shape, np.float64) for v in trainable}
            for rank in (0, 1):
                flow = data.train_dataflow(recs, cfg, rank, 2)  # what the job's rank reads
                flow.reset_state()
                example = next(iter(flow))
                values = sess.run(grads, dict(zip(inputs, example, strict=True)))
                for v, g in zip(trainable, values, strict=True):
                    summed[v.op.name] += g
    return weights, summed, {v.op.name for v in trainable}


def test_one_step_moves_the_weights_by_the_ranks_summed_gradients(tmp_path: Path) -> None:
    generate(tmp_path / "train", 2, size=128, seed=5)
    cfg = build_config("tiny", CONFIG.split())
    ds = data.load_dataset(tmp_path / "train")
    recs = data.records(ds, with_empty=False)
    assert len(recs) == 2
    w0, summed, trainable = gradients_and_weights(cfg, ds, recs)
    (tmp_path / "pretrained").mkdir()
    np.savez(tmp_path / "pretrained" / "w0.npz", **w0)

    base = tmp_path / "ml"
    write_ml_tree(
        base,
        hyperparameters=train_hyperparameters(CONFIG),
        channels={"train": tmp_path / "train", "pretrained": tmp_path / "pretrained"},
    )
    proc = run_train(base)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w1 = dict(np.load(base / "model" / "model.npz"))
    assert sorted(w1) == sorted(w0)

    schedule = scaled_schedule(cfg, 2)
    rate = np.float32(schedule.learning_rate(0)) / np.float32(schedule.lr_divisor)  # 0.2 / 2 at step 0
    moved = {n: w1[n].astype(np.float64) - w0[n] for n in trainable}
    expected = {n: -float(rate) * summed[n] for n in trainable}
    for name in set(w0) - trainable:  # the frozen stem and group0, FreezeBN's statistics
        np.testing.assert_array_equal(w1[name], w0[name], err_msg=name)
    assert any(n.startswith("group1/") and n.endswith("/bn/gamma") for n in trainable)
    assert not any(n.startswith(("conv0/", "group0/")) for n in trainable)
    flat_moved = np.concatenate([moved[n].ravel() for n in sorted(trainable)])
    flat_expected = np.concatenate([expected[n].ravel() for n in sorted(trainable)])
    # One number that tells a sum (1.0) from an average (0.5) or no step (0): the least-squares scale.
    scale = float(flat_moved @ flat_expected / (flat_expected @ flat_expected))
    assert scale == pytest.approx(1.0, abs=2e-3)
    # Every variable: float32 sums in another order (and ROIs in another order) differ in the last digits.
    tolerance = 1e-3 * np.abs(flat_expected).max()
    for name in sorted(trainable):
        np.testing.assert_allclose(moved[name], expected[name], rtol=1e-2, atol=tolerance, err_msg=name)
