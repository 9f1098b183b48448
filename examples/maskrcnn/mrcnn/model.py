"""Mask R-CNN with a ResNet-FPN backbone as a tensorpack ModelDesc (TensorFlow 1 graph mode, NHWC, one
image per rank).

Variable names, shapes and meanings follow tensorpack's FasterRCNN example (examples/FasterRCNN, its
Standard R50-FPN Mask R-CNN), so that its ImageNet ResNets and its published COCO models load by name and
predict what they predict there. Its conventions, kept here where they decide what a weight means:
- "AlignPadding": the stem, the pooling and every stride-2 3x3 conv pad explicitly (more at the top/left) and
  convolve VALID, instead of TensorFlow's SAME (which pads more at the bottom/right);
- anchors centred at (j, i) * stride (boxes.py);
- the box head reads ROI features flattened in (C, H, W) order (tensorpack's graph is NCHW): fc6's rows;
- ROIAlign samples a map padded by one border-replicated pixel (no zeros past the border);
- box decoding clips log-scales at log(max_size / 16).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from tensorpack import ModelDesc
from tensorpack.models import Conv2D, Conv2DTranspose, FullyConnected
from tensorpack.models.regularize import regularize_cost
from tensorpack.tfutils.summary import add_moving_summary
from tensorpack.tfutils.tower import get_current_tower_context
from tensorpack.tfutils.varreplace import freeze_variables

from . import boxes as B
from .config import LR_NAME, Config, Schedule
from .data import PIXEL_MEAN_BGR, PIXEL_STD_BGR

tf1 = tf.compat.v1
CONV_INIT = tf1.variance_scaling_initializer(scale=2.0, mode="fan_out", distribution="untruncated_normal")
HEAD_INIT = tf1.variance_scaling_initializer(scale=1.0, mode="fan_in", distribution="uniform")
OUTPUT_NAMES = ("output/boxes", "output/scores", "output/labels", "output/masks")


# ------------------------------------------------------------------------------------------------ backbone
def normalize(x: tf.Tensor, cfg: Config) -> tf.Tensor:
    """The configured normalisation, in the current variable scope."""
    c = int(x.shape[-1])
    if cfg.norm == "FreezeBN":
        # The statistics are never updated; gamma/beta train unless freeze_affine (tensorpack's FreezeBN: a
        # BatchNorm in inference mode whose affine is trainable), or the stage is frozen (freeze_variables).
        affine = not cfg.freeze_affine
        with tf1.variable_scope("bn"):
            gamma = tf1.get_variable("gamma", [c], initializer=tf1.ones_initializer(), trainable=affine)
            beta = tf1.get_variable("beta", [c], initializer=tf1.zeros_initializer(), trainable=affine)
            mean = tf1.get_variable("mean/EMA", [c], initializer=tf1.zeros_initializer(), trainable=False)
            var = tf1.get_variable("variance/EMA", [c], initializer=tf1.ones_initializer(), trainable=False)
            mul = gamma * tf.math.rsqrt(var + 1e-5)
            return x * mul + (beta - mean * mul)
    if cfg.norm == "GN":
        groups = min(cfg.gn_groups, c)
        with tf1.variable_scope("gn"):
            shape = tf.shape(x)
            g = tf.reshape(x, [shape[0], shape[1], shape[2], groups, c // groups])
            mean, var = tf.nn.moments(g, axes=[1, 2, 4], keepdims=True)
            g = (g - mean) * tf.math.rsqrt(var + 1e-5)
            x = tf.reshape(g, shape)
            gamma = tf1.get_variable("gamma", [c], initializer=tf1.ones_initializer())
            beta = tf1.get_variable("beta", [c], initializer=tf1.zeros_initializer())
            return x * gamma + beta
    return x


def conv_norm(
    name: str,
    x: tf.Tensor,
    ch: int,
    k: int,
    cfg: Config,
    stride: int = 1,
    relu: bool = True,
    padding: str = "SAME",
) -> tf.Tensor:
    bias = cfg.norm == "None"
    x = Conv2D(name, x, ch, k, strides=stride, padding=padding, use_bias=bias, kernel_initializer=CONV_INIT)
    with tf1.variable_scope(name):  # reopened: the norm's variables live next to the conv's (name/bn/...)
        x = normalize(x, cfg)
    return tf.nn.relu(x) if relu else x


def align_pad(x: tf.Tensor, before: int, after: int) -> tf.Tensor:
    """Pad rows and columns of an NHWC map `before` at the top/left and `after` at the bottom/right, for a
    VALID conv or pool: tensorpack's "AlignPadding" (TF_PAD_MODE=False), its published models' padding."""
    return tf.pad(x, [[0, 0], [before, after], [before, after], [0, 0]])


def bottleneck(x: tf.Tensor, ch: int, stride: int, cfg: Config) -> tf.Tensor:
    shortcut = x
    if int(x.shape[-1]) != ch * 4 or stride != 1:  # a strided 1x1 conv samples rows/columns 0, 2, 4...
        shortcut = conv_norm("convshortcut", x, ch * 4, 1, cfg, stride=stride, relu=False)
    x = conv_norm("conv1", x, ch, 1, cfg)
    if stride == 1:
        x = conv_norm("conv2", x, ch, 3, cfg)
    else:
        x = conv_norm("conv2", align_pad(x, 1, 0), ch, 3, cfg, stride=stride, padding="VALID")
    x = conv_norm("conv3", x, ch * 4, 1, cfg, relu=False)
    return tf.nn.relu(x + shortcut)


def stem(image: tf.Tensor, cfg: Config) -> tf.Tensor:
    """7x7 stride-2 conv and 3x3 stride-2 max-pool (stride 4): output (i, j) is centred on input (4i, 4j)."""
    x = conv_norm("conv0", align_pad(image, 3, 2), cfg.resnet_width, 7, cfg, stride=2, padding="VALID")
    return tf.nn.max_pool2d(align_pad(x, 1, 0), 3, 2, "VALID")  # zeros pad: harmless after the ReLU


def resnet(image: tf.Tensor, cfg: Config) -> list[tf.Tensor]:
    """C2..C5 (strides 4, 8, 16, 32) of a bottleneck ResNet; stages before cfg.freeze_at are not trained."""
    outputs = []
    with freeze_variables(stop_gradient=False, skip_collection=cfg.freeze_at >= 1):
        x = stem(image, cfg)
    if cfg.freeze_at >= 1:
        x = tf.stop_gradient(x)
    for i, blocks in enumerate(cfg.resnet_blocks):
        frozen = cfg.freeze_at >= i + 2
        with freeze_variables(stop_gradient=False, skip_collection=frozen), tf1.variable_scope(f"group{i}"):
            for j in range(blocks):
                with tf1.variable_scope(f"block{j}"):
                    x = bottleneck(x, cfg.resnet_width * 2**i, 2 if (j == 0 and i > 0) else 1, cfg)
        if frozen:
            x = tf.stop_gradient(x)
        outputs.append(x)
    return outputs


def fpn(features: Sequence[tf.Tensor], cfg: Config) -> list[tf.Tensor]:
    """P2..P6 from C2..C5: 1x1 laterals, nearest top-down upsampling, 3x3 smoothing; P6 subsamples P5."""
    ch = cfg.fpn_channels
    with tf1.variable_scope("fpn"):
        lateral = [
            Conv2D(f"lateral_1x1_c{i + 2}", c, ch, 1, kernel_initializer=HEAD_INIT)
            for i, c in enumerate(features)
        ]
        merged = [lateral[3]]
        for lat in reversed(lateral[:3]):
            up = tf.repeat(tf.repeat(merged[0], 2, axis=1), 2, axis=2)
            merged.insert(0, lat + up)
        p = [
            Conv2D(f"posthoc_3x3_p{i + 2}", m, ch, 3, kernel_initializer=HEAD_INIT)
            for i, m in enumerate(merged)
        ]
    p.append(tf.nn.max_pool2d(p[3], 1, 2, "SAME"))
    return p


# ------------------------------------------------------------------------------------------------------ RPN
def rpn_head(feature: tf.Tensor, ch: int, num_anchors: int) -> tuple[tf.Tensor, tf.Tensor]:
    """Objectness logits (h*w*A,) and box deltas (h*w*A, 4) of one level; weights shared across levels."""
    init = tf1.random_normal_initializer(stddev=0.01)
    with tf1.variable_scope("rpn", reuse=tf1.AUTO_REUSE):
        h = Conv2D("conv0", feature, ch, 3, activation=tf.nn.relu, kernel_initializer=init)
        logits = Conv2D("class", h, num_anchors, 1, kernel_initializer=init)
        deltas = Conv2D("box", h, num_anchors * 4, 1, kernel_initializer=init)
    return tf.reshape(logits, [-1]), tf.reshape(deltas, [-1, 4])


def smooth_l1(x: tf.Tensor, beta: float) -> tf.Tensor:
    ax = tf.abs(x)
    return tf.where(ax < beta, 0.5 * ax * ax / beta, ax - 0.5 * beta)


def rpn_losses(
    logits: tf.Tensor, deltas: tf.Tensor, labels: tf.Tensor, targets: tf.Tensor, batch: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """Sums over the sampled anchors divided by the anchor batch size (tensorpack's normalisation: an image
    with fewer valid anchors weighs less, rather than each of its anchors more)."""
    valid = labels >= 0
    cls = tf.nn.sigmoid_cross_entropy_with_logits(
        labels=tf.cast(tf.boolean_mask(labels, valid), tf.float32), logits=tf.boolean_mask(logits, valid)
    )
    fg = tf.equal(labels, 1)
    box = smooth_l1(tf.boolean_mask(deltas, fg) - tf.boolean_mask(targets, fg), 1.0 / 9)
    return (
        tf.identity(tf.reduce_sum(cls) / float(batch), name="rpn_cls_loss"),
        tf.identity(tf.reduce_sum(box) / float(batch), name="rpn_box_loss"),
    )


def proposals(
    logits: Sequence[tf.Tensor],
    deltas: Sequence[tf.Tensor],
    anchors: Sequence[tf.Tensor],
    image_hw: tf.Tensor,
    pre_k: int,
    post_k: int,
    nms_iou: float,
    clip: float,
) -> tf.Tensor:
    """Top `pre_k` anchors per level, decoded (log-scales clipped at `clip`), clipped to the image and NMS-ed
    per level; the best `post_k` overall."""
    all_boxes, all_scores = [], []
    for lg, dl, an in zip(logits, deltas, anchors, strict=True):
        scores, idx = tf.nn.top_k(lg, tf.minimum(pre_k, tf.size(lg)), sorted=False)
        bx = B.tf_clip(B.tf_decode(tf.gather(dl, idx), tf.gather(an, idx), clip=clip), image_hw)
        keep = tf.image.non_max_suppression(bx, scores, pre_k, iou_threshold=nms_iou)
        all_boxes.append(tf.gather(bx, keep))
        all_scores.append(tf.gather(scores, keep))
    scores = tf.concat(all_scores, 0)
    _, idx = tf.nn.top_k(scores, tf.minimum(post_k, tf.size(scores)), sorted=True)
    return tf.stop_gradient(tf.gather(tf.concat(all_boxes, 0), idx))


# ------------------------------------------------------------------------------------------------ ROIAlign
def aligned_crop_boxes(rois: tf.Tensor, scale: float, hw: tf.Tensor, samples: int) -> tf.Tensor:
    """Normalised [y1, x1, y2, x2] boxes for tf.image.crop_and_resize so that its `samples` x `samples` grid
    lands on the centres of equal sub-bins of each ROI (pixel-centre aligned, as in ROIAlign)."""
    x1, y1, x2, y2 = tf.unstack(rois * scale, axis=1)
    bw, bh = (x2 - x1) / samples, (y2 - y1) / samples
    h = tf.maximum(tf.cast(hw[0], tf.float32) - 1.0, 1.0)
    w = tf.maximum(tf.cast(hw[1], tf.float32) - 1.0, 1.0)
    # Continuous coordinate u is index u - 0.5; the first/last samples sit half a sub-bin inside the box.
    return tf.stack(
        [
            (y1 + 0.5 * bh - 0.5) / h,
            (x1 + 0.5 * bw - 0.5) / w,
            (y2 - 0.5 * bh - 0.5) / h,
            (x2 - 0.5 * bw - 0.5) / w,
        ],
        axis=1,
    )


def roi_align(feature: tf.Tensor, rois: tf.Tensor, stride: int, size: int) -> tf.Tensor:
    """ROIAlign with 2x2 samples per bin: (n, size, size, C) from a (1, H, W, C) feature map.

    As tensorpack's (model_box.roi_align): the map is padded by one border-replicated pixel and the boxes
    shifted by it, so a sample past the border reads the border, not zero (what crop_and_resize gives)."""
    padded = tf.pad(feature, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="SYMMETRIC")
    crop = aligned_crop_boxes(rois / float(stride) + 1.0, 1.0, tf.shape(padded)[1:3], 2 * size)
    crops = tf.image.crop_and_resize(
        padded, crop, tf.zeros([tf.shape(rois)[0]], tf.int32), [2 * size, 2 * size]
    )
    return tf.nn.avg_pool2d(crops, 2, 2, "VALID")


def multilevel_roi_align(features: Sequence[tf.Tensor], rois: tf.Tensor, size: int) -> tf.Tensor:
    """ROIAlign from P2..P5, each ROI on level floor(4 + log2(sqrt(area) / 224)) (FPN paper, eq. 1)."""
    level = tf.floor(4 + tf.math.log(tf.sqrt(B.tf_area(rois)) / 224.0 + 1e-6) / np.log(2.0))
    level = tf.cast(tf.clip_by_value(level, 2, 5), tf.int32)
    outs, order = [], []
    for i, feature in enumerate(features[:4]):
        idx = tf.reshape(tf.where(tf.equal(level, i + 2)), [-1])
        outs.append(roi_align(feature, tf.gather(rois, idx), 2 ** (i + 2), size))
        order.append(idx)
    return tf.gather(tf.concat(outs, 0), tf.math.invert_permutation(tf.cast(tf.concat(order, 0), tf.int32)))


# ------------------------------------------------------------------------------------------------ heads
def sample_rois(
    proposed: tf.Tensor, gt_boxes: tf.Tensor, gt_labels: tf.Tensor, cfg: Config
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
    """Training ROIs (proposals + ground truth): fg (IoU >= threshold) first, then bg; their labels, the
    ground-truth index of each fg ROI and the number of fg ROIs."""
    rois = tf.concat([proposed, gt_boxes], 0)
    iou = B.tf_iou(rois, gt_boxes)
    best_gt = tf.argmax(iou, axis=1, output_type=tf.int32)
    is_fg = tf.reduce_max(iou, axis=1) >= cfg.frcnn_fg_iou
    fg = tf.random.shuffle(tf.reshape(tf.where(is_fg), [-1]))
    bg = tf.random.shuffle(tf.reshape(tf.where(tf.logical_not(is_fg)), [-1]))
    num_fg = tf.minimum(int(cfg.frcnn_batch_per_image * cfg.frcnn_fg_ratio), tf.size(fg))
    num_bg = tf.minimum(cfg.frcnn_batch_per_image - num_fg, tf.size(bg))
    idx = tf.concat([fg[:num_fg], bg[:num_bg]], 0)
    fg_gt = tf.gather(best_gt, fg[:num_fg])
    labels = tf.concat([tf.gather(gt_labels, fg_gt), tf.zeros([num_bg], tf.int64)], 0)
    return tf.stop_gradient(tf.gather(rois, idx)), tf.stop_gradient(labels), fg_gt, num_fg


def box_head(
    features: Sequence[tf.Tensor], rois: tf.Tensor, cfg: Config, num_classes: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """Class logits (n, K) and class-specific box deltas (n, K, 4) for K = classes + background."""
    # fc6 reads each ROI's features in (C, H, W) order, as tensorpack's NCHW graph flattens them: a checkpoint
    # of its loads by shape in any order, and only this order gives its fc6 rows their meaning.
    x = tf.transpose(multilevel_roi_align(features, rois, 7), [0, 3, 1, 2])
    with tf1.variable_scope("fastrcnn", reuse=tf1.AUTO_REUSE):
        x = FullyConnected("fc6", x, cfg.frcnn_fc_dim, activation=tf.nn.relu, kernel_initializer=HEAD_INIT)
        x = FullyConnected("fc7", x, cfg.frcnn_fc_dim, activation=tf.nn.relu, kernel_initializer=HEAD_INIT)
        with tf1.variable_scope("outputs"):
            logits = FullyConnected(
                "class", x, num_classes, kernel_initializer=tf1.random_normal_initializer(stddev=0.01)
            )
            deltas = FullyConnected(
                "box", x, num_classes * 4, kernel_initializer=tf1.random_normal_initializer(stddev=0.001)
            )
    return logits, tf.reshape(deltas, [-1, num_classes, 4])


def mask_head(
    features: Sequence[tf.Tensor], rois: tf.Tensor, classes: tf.Tensor, cfg: Config, num_classes: int
) -> tf.Tensor:
    """Mask logits (n, R, R) of each ROI for its class (1-based)."""
    x = multilevel_roi_align(features, rois, cfg.mask_resolution // 2)
    with tf1.variable_scope("maskrcnn", reuse=tf1.AUTO_REUSE):
        for i in range(cfg.mask_convs):
            x = Conv2D(
                f"fcn{i}", x, cfg.mask_channels, 3, activation=tf.nn.relu, kernel_initializer=CONV_INIT
            )
        x = Conv2DTranspose("deconv", x, cfg.mask_channels, 2, strides=2, activation=tf.nn.relu,
                            kernel_initializer=CONV_INIT)  # fmt: skip
        x = Conv2D(
            "conv", x, num_classes - 1, 1, kernel_initializer=tf1.random_normal_initializer(stddev=0.001)
        )
    x = tf.transpose(x, [0, 3, 1, 2])  # (n, C, R, R)
    pick = tf.stack([tf.range(tf.shape(x)[0]), tf.cast(classes, tf.int32) - 1], axis=1)
    return tf.gather_nd(x, pick)


def detections(
    rois: tf.Tensor, logits: tf.Tensor, deltas: tf.Tensor, image_hw: tf.Tensor, cfg: Config
) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Per-class decoding and NMS: boxes (k, 4), scores (k,), 1-based labels (k,), best first."""
    num_fg = tf.shape(logits)[1] - 1
    scores = tf.nn.softmax(logits)[:, 1:]
    n = tf.shape(rois)[0]
    refs = tf.reshape(tf.tile(tf.expand_dims(rois, 1), [1, num_fg, 1]), [-1, 4])
    clip = B.max_log_scale(cfg.max_size)
    decoded = B.tf_clip(
        B.tf_decode(tf.reshape(deltas[:, 1:], [-1, 4]), refs, cfg.frcnn_box_weights, clip), image_hw
    )
    yxyx = tf.gather(tf.reshape(decoded, [n, num_fg, 4]), [1, 0, 3, 2], axis=2)
    out_boxes, out_scores, out_classes, valid = tf.image.combined_non_max_suppression(
        tf.expand_dims(yxyx, 0),
        tf.expand_dims(scores, 0),
        max_output_size_per_class=cfg.test_max_detections,
        max_total_size=cfg.test_max_detections,
        iou_threshold=cfg.test_nms_iou,
        score_threshold=cfg.test_score_thresh,
        clip_boxes=False,
    )
    k = valid[0]
    boxes = tf.gather(out_boxes[0, :k], [1, 0, 3, 2], axis=1)
    return boxes, out_scores[0, :k], tf.cast(out_classes[0, :k], tf.int64) + 1


# ------------------------------------------------------------------------------------------------ model
class MaskRCNN(ModelDesc):  # type: ignore[misc]  # tensorpack has no type information: its classes are Any
    def __init__(self, cfg: Config, num_classes: int, schedule: Schedule | None = None) -> None:
        self.cfg = cfg
        self.num_classes = num_classes
        self.schedule = schedule

    def inputs(self) -> list[tf.TensorSpec]:
        return [
            tf.TensorSpec((None, None, 3), tf.uint8, "image"),  # BGR as decoded, unpadded
            tf.TensorSpec((None,), tf.int32, "anchor_labels"),
            tf.TensorSpec((None, 4), tf.float32, "anchor_deltas"),
            tf.TensorSpec((None, 4), tf.float32, "gt_boxes"),
            tf.TensorSpec((None,), tf.int64, "gt_labels"),
            tf.TensorSpec((None, None, None), tf.uint8, "gt_masks"),
        ]

    def build_graph(
        self,
        image: tf.Tensor,
        anchor_labels: tf.Tensor,
        anchor_deltas: tf.Tensor,
        gt_boxes: tf.Tensor,
        gt_labels: tf.Tensor,
        gt_masks: tf.Tensor,
    ) -> tf.Tensor:
        cfg = self.cfg
        training = get_current_tower_context().is_training
        hw = tf.shape(image)[:2]
        image_hw = tf.cast(hw, tf.float32)
        x = (tf.cast(image, tf.float32) - PIXEL_MEAN_BGR) / PIXEL_STD_BGR
        if not cfg.bgr_input:  # a backbone trained on RGB
            x = tf.reverse(x, axis=[-1])
        pad = (32 - hw % 32) % 32
        x = tf.expand_dims(tf.pad(x, [[0, pad[0]], [0, pad[1]], [0, 0]]), 0)
        features = fpn(resnet(x, cfg), cfg)

        num_anchors = len(cfg.anchor_ratios)
        heads = [rpn_head(p, cfg.fpn_channels, num_anchors) for p in features]
        anchors = [
            B.tf_level_anchors(tf.shape(p)[1:3], stride, size, cfg.anchor_ratios)
            for p, stride, size in zip(features, B.FPN_STRIDES, cfg.anchor_sizes, strict=True)
        ]
        logits, deltas = [h[0] for h in heads], [h[1] for h in heads]
        pre_k = cfg.rpn_train_pre_nms_topk if training else cfg.rpn_test_pre_nms_topk
        post_k = cfg.rpn_train_post_nms_topk if training else cfg.rpn_test_post_nms_topk
        clip = B.max_log_scale(cfg.max_size)
        proposed = proposals(logits, deltas, anchors, image_hw, pre_k, post_k, cfg.rpn_nms_iou, clip)

        if not training:
            box_logits, box_deltas = box_head(features, proposed, cfg, self.num_classes)
            boxes, scores, labels = detections(proposed, box_logits, box_deltas, image_hw, cfg)
            masks = tf.sigmoid(mask_head(features, boxes, labels, cfg, self.num_classes))
            tf.identity(boxes, name=OUTPUT_NAMES[0])
            tf.identity(scores, name=OUTPUT_NAMES[1])
            tf.identity(labels, name=OUTPUT_NAMES[2])
            tf.identity(masks, name=OUTPUT_NAMES[3])
            return None

        rpn_cls, rpn_box = rpn_losses(
            tf.concat(logits, 0), tf.concat(deltas, 0), anchor_labels, anchor_deltas, cfg.rpn_batch_per_image
        )
        rois, roi_labels, fg_gt, num_fg = sample_rois(proposed, gt_boxes, gt_labels, cfg)
        box_logits, box_deltas = box_head(features, rois, cfg, self.num_classes)
        frcnn_cls = tf.reduce_mean(
            tf.nn.sparse_softmax_cross_entropy_with_logits(labels=roi_labels, logits=box_logits),
            name="frcnn_cls_loss",
        )
        fg_rois = rois[:num_fg]
        fg_labels = roi_labels[:num_fg]
        fg_deltas = tf.gather_nd(
            box_deltas[:num_fg], tf.stack([tf.range(num_fg), tf.cast(fg_labels, tf.int32)], 1)
        )
        targets = B.tf_encode(tf.gather(gt_boxes, fg_gt), fg_rois, cfg.frcnn_box_weights)
        frcnn_box = tf.truediv(  # L1, as tensorpack's fastrcnn_losses
            tf.reduce_sum(tf.abs(fg_deltas - targets)),
            tf.cast(tf.maximum(tf.size(roi_labels), 1), tf.float32),
            name="frcnn_box_loss",
        )

        mask_logits = mask_head(features, fg_rois, fg_labels, cfg, self.num_classes)
        res = cfg.mask_resolution
        crop = aligned_crop_boxes(fg_rois, 1.0, tf.shape(gt_masks)[1:3], res)
        mask_targets = tf.image.crop_and_resize(
            tf.cast(tf.expand_dims(gt_masks, 3), tf.float32), crop, fg_gt, [res, res]
        )
        # Soft targets (the bilinear samples of the binary mask), as tensorpack's.
        mask_targets = tf.stop_gradient(mask_targets[..., 0])
        mask_ce = tf.nn.sigmoid_cross_entropy_with_logits(labels=mask_targets, logits=mask_logits)
        mask_loss = tf.truediv(
            tf.reduce_sum(mask_ce), tf.cast(tf.maximum(tf.size(mask_ce), 1), tf.float32), name="mask_loss"
        )

        wd = regularize_cost(".*/W", tf.keras.regularizers.l2(cfg.weight_decay / 2), name="wd_cost")
        total = tf.add_n([rpn_cls, rpn_box, frcnn_cls, frcnn_box, mask_loss, wd], name="total_cost")
        fg_fraction = tf.truediv(
            tf.cast(num_fg, tf.float32), tf.cast(tf.size(roi_labels), tf.float32), name="fg_fraction"
        )
        add_moving_summary(rpn_cls, rpn_box, frcnn_cls, frcnn_box, mask_loss, wd, total, fg_fraction)
        return total

    def optimizer(self) -> Any:  # a tf.compat.v1.train.Optimizer
        """Momentum on `learning_rate / lr_divisor` (the variable is set before each step by the trainer's
        schedule callback), over gradients summed across ranks; accumulated over `accumulate` steps when the
        batch is below the schedule's (tensorpack's AccumGradOptimizer, as its example does below 8 GPUs)."""
        if self.schedule is None:
            raise ValueError("MaskRCNN.optimizer needs a schedule")
        return make_optimizer(self.schedule, self.cfg.momentum)


def make_optimizer(schedule: Schedule, momentum: float) -> Any:
    lr = tf1.get_variable(LR_NAME, initializer=0.0, trainable=False)
    tf1.summary.scalar("learning_rate-summary", lr)
    opt = tf1.train.MomentumOptimizer(lr / float(schedule.lr_divisor), momentum)
    return accumulating(opt, schedule.accumulate) if schedule.accumulate > 1 else opt


def accumulating(opt: Any, steps: int) -> Any:
    """`opt` applied on every `steps`-th step to the sum of the gradients of the last `steps` steps (what
    tensorpack's AccumGradOptimizer is documented to do, with the same slot names `<var>/AccumGrad`). Its own
    class reads the step counter without ordering the read after the increment: under TF 2's resource
    variables that applies an update at step 0 (seen here); this one orders every read."""
    from tensorpack.tfutils.optimizer import ProxyOptimizer

    class _Accumulating(ProxyOptimizer):  # type: ignore[misc]  # tensorpack has no type information: Any
        def apply_gradients(self, grads_and_vars: Any, global_step: Any = None, name: Any = None) -> Any:
            pairs = [(g, v) for g, v in grads_and_vars if g is not None]
            with tf.control_dependencies(None):
                slots = [self._zeros_slot(v, "accum", self._name) for _, v in pairs]
                with tf1.variable_scope(self._name):
                    counter = tf1.get_variable("counter", initializer=0, trainable=False)
            added = [s.assign_add(g) for s, (g, _) in zip(slots, pairs, strict=True)]
            with tf.control_dependencies(added):
                due = tf.equal(tf.math.floormod(counter.assign_add(1), steps), 0)

            def apply() -> Any:
                update = self._opt.apply_gradients(
                    [(s.read_value(), v) for s, (_, v) in zip(slots, pairs, strict=False)]
                )
                with tf.control_dependencies([update]):
                    return tf.group(*[s.assign(tf.zeros_like(s)) for s in slots])

            with tf.control_dependencies([due]):
                return tf.cond(due, apply, tf.no_op, name=name or "accumulate_or_apply")

    return _Accumulating(opt, "AccumGrad")
