"""The coco preset trains as tensorpack's examples/FasterRCNN (at 1547a54e) does, step for step, at 1, 2, 8,
16 and 64 ranks: the same learning rate before every step, the same steps that update the weights, the same
weighting of each image's gradient, the same momentum, and the same trainable variables.

tensorpack's side is written down here from its code as facts (nothing of it is imported):
- config.py: TRAIN.BASE_LR = 1e-2, TRAIN.WARMUP = 1000 ("not affected by #GPUs"), TRAIN.WARMUP_INIT_LR = 1e-5,
  TRAIN.STEPS_PER_EPOCH = 500, TRAIN.LR_SCHEDULE = "1x" = [120000, 160000, 180000], TRAIN.WEIGHT_DECAY = 1e-4,
  BACKBONE.FREEZE_AT = 2, BACKBONE.FREEZE_AFFINE = False; NUM_GPUS must divide 8 or be a multiple of 8.
- train.py: init_lr = WARMUP_INIT_LR * min(8 / NUM_GPUS, 1); a step-based ScheduledHyperParamSetter with
  linear interpolation over [(0, init_lr), (WARMUP, BASE_LR)]; an epoch-based one over
  [(int(WARMUP / STEPS_PER_EPOCH + 0.5), BASE_LR)] + [(s * 8 / NUM_GPUS // STEPS_PER_EPOCH,
  BASE_LR * 0.1 ** k)] for the first two entries s of LR_SCHEDULE (k = 1, 2);
  max_epoch = LR_SCHEDULE[-1] * 8 / NUM_GPUS // STEPS_PER_EPOCH;
  HorovodTrainer(average=False): gradients summed over the ranks.
- modeling/generalized_rcnn.py: MomentumOptimizer(learning_rate / 8, 0.9), wrapped in
  AccumGradOptimizer(8 // NUM_GPUS) below 8 GPUs; weight decay l2_regularizer(WEIGHT_DECAY) on '.*/W'.
- tensorpack's callbacks: a setter's value is set before the first step and after each step (step-based) or
  each epoch (epoch-based), from the global step / epoch just reached; a linear setter sets nothing past its
  last point, an exact one only at its points.
"""

from __future__ import annotations

import numpy as np
import pytest
from make_standin_weights import load_shapes
from mrcnn.config import LR_NAME, ConfigError, build_config, scaled_schedule

RANKS = (1, 2, 8, 16, 64)
TP_BASE_LR, TP_WARMUP, TP_WARMUP_INIT_LR, TP_STEPS_PER_EPOCH = 1e-2, 1000, 1e-5, 500
TP_LR_SCHEDULE = (120000, 160000, 180000)
TP_MOMENTUM, TP_LR_DIVISOR = 0.9, 8


def tensorpack_learning_rates(num_gpus: int) -> np.ndarray:
    """tensorpack's `learning_rate` variable during every step of its training, by replaying its two
    setters as its trainer calls them."""
    factor = 8.0 / num_gpus
    init_lr = TP_WARMUP_INIT_LR * min(factor, 1.0)
    warmup = [(0, init_lr), (TP_WARMUP, TP_BASE_LR)]
    by_epoch = [(int(TP_WARMUP / TP_STEPS_PER_EPOCH + 0.5), TP_BASE_LR)] + [
        (int(s * factor // TP_STEPS_PER_EPOCH), TP_BASE_LR * 0.1 ** (k + 1))
        for k, s in enumerate(TP_LR_SCHEDULE[:-1])
    ]
    max_epoch = int(TP_LR_SCHEDULE[-1] * factor // TP_STEPS_PER_EPOCH)

    def linear(point: int) -> float | None:
        (p0, v0), (p1, v1) = warmup
        if point in (p0, p1):
            return v0 if point == p0 else v1
        return (point - p0) / (p1 - p0) * (v1 - v0) + v0 if p0 < point < p1 else None

    out = np.empty(max_epoch * TP_STEPS_PER_EPOCH)
    lr, step = linear(0), 0  # set before training (the epoch setter has no point at epoch 0)
    for epoch in range(1, max_epoch + 1):
        for _ in range(TP_STEPS_PER_EPOCH):
            out[step] = lr
            step += 1
            lr = linear(step) if linear(step) is not None else lr
        lr = next((v for e, v in by_epoch if e == epoch), lr)
    return out


@pytest.mark.parametrize("ranks", RANKS)
def test_the_learning_rate_before_every_step_is_tensorpacks(ranks: int) -> None:
    schedule = scaled_schedule(build_config("coco", []), ranks)
    expected = tensorpack_learning_rates(ranks)
    assert schedule.total_steps == len(expected)  # the same number of steps: 1.44M at 1 rank, 22.5k at 64
    ours = np.fromiter(map(schedule.learning_rate, range(schedule.total_steps)), float, len(expected))
    worst = float(np.max(np.abs(ours - expected) / expected))  # (numpy.testing would run lscpu on import)
    assert worst <= 1e-12, worst
    # How the rate is applied: / 8 to the sum of the ranks' gradients, accumulated below 8 ranks.
    assert (schedule.lr_divisor, schedule.accumulate) == (TP_LR_DIVISOR, max(1, 8 // ranks))


def test_the_schedule_at_16_ranks_in_numbers() -> None:
    """A reader's check of the replay above: 16 ranks halve the steps and double each step's images."""
    lr = tensorpack_learning_rates(16)
    assert len(lr) == 90000
    assert lr[0] == pytest.approx(1e-5 * 0.5) and lr[500] == pytest.approx((1e-2 - 5e-6) / 2 + 5e-6)
    assert lr[1000] == lr[59999] == pytest.approx(1e-2)
    assert lr[60000] == lr[79999] == pytest.approx(1e-3) and lr[80000] == lr[-1] == pytest.approx(1e-4)


@pytest.mark.integration  # builds a TensorFlow graph
@pytest.mark.parametrize("ranks", RANKS)
def test_each_step_updates_the_weights_as_tensorpacks_optimizer(ranks: int) -> None:
    """Our optimizer on one weight, fed each step the sum over `ranks` ranks of gradient 1 (what Horovod's
    allreduce with average=False gives), the learning rate set before each step as the trainer's schedule
    callback does: the weight moves exactly as tensorpack's Momentum(lr / 8) behind AccumGrad(8 // ranks)."""
    import tensorflow as tf
    from mrcnn.model import make_optimizer

    tf1 = tf.compat.v1
    schedule = scaled_schedule(build_config("coco", []), ranks)
    lr_tp = tensorpack_learning_rates(ranks)
    steps = 3 * max(1, 8 // ranks)
    with tf.Graph().as_default():
        w = tf1.get_variable("w", initializer=np.float64(1.0))
        grad = tf1.placeholder(tf.float64, [])
        train = make_optimizer(schedule, 0.9).apply_gradients([(grad, w)])
        lr_var = next(v for v in tf1.global_variables() if v.op.name == LR_NAME)
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            ours = []
            for t in range(steps):
                lr_var.load(schedule.learning_rate(t), sess)
                sess.run(train, {grad: float(ranks)})
                ours.append(sess.run(w))
    # tensorpack: gradients accumulate over k steps; every k-th step Momentum applies their sum at lr / 8.
    k, weight, velocity, accumulated, expected = max(1, 8 // ranks), 1.0, 0.0, 0.0, []
    for t in range(steps):
        accumulated += ranks
        if (t + 1) % k == 0:
            velocity = TP_MOMENTUM * velocity + accumulated
            weight -= np.float32(lr_tp[t]) / np.float32(TP_LR_DIVISOR) * velocity
            accumulated = 0.0
        expected.append(weight)
    np.testing.assert_allclose(ours, expected, rtol=1e-6)
    assert (
        ours[k - 2] == 1.0 if k > 1 else ours[0] < 1.0
    )  # below 8 ranks the first k - 1 steps only accumulate


def test_a_batch_that_does_not_divide_the_schedules_is_refused() -> None:
    with pytest.raises(ConfigError, match="config key 'schedule_batch': 8 images per step .* 3 images"):
        scaled_schedule(build_config("coco", []), 3)
    assert scaled_schedule(build_config("coco", []), 24).accumulate == 1  # above 8: any count sums


@pytest.mark.integration  # builds the coco preset's TensorFlow graph
def test_trainable_variables_are_tensorpacks() -> None:
    """tensorpack trains every array of the Standard model but the BatchNorm statistics and the stages before
    FREEZE_AT = 2 (stem and group0): with FREEZE_AFFINE = False the 84 gamma/beta of group1-3 train."""
    import tensorflow as tf

    from .test_maskrcnn_tensorpack import build_inference

    tf1 = tf.compat.v1
    published = load_shapes()
    trained = {n for n in published if not n.endswith("/EMA") and not n.startswith(("conv0/", "group0/"))}
    affine = {n for n in trained if n.endswith(("/gamma", "/beta"))}
    assert len(affine) == 84
    graph, _, _ = build_inference(81)
    assert {v.op.name for v in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)} == trained
    graph, _, _ = build_inference(81, ("freeze_affine=true",))
    assert {v.op.name for v in graph.get_collection(tf1.GraphKeys.TRAINABLE_VARIABLES)} == trained - affine
    with pytest.raises(ConfigError, match="'freeze_affine': only with norm=FreezeBN"):
        build_config("coco", ["norm=GN", "freeze_affine=true"])
