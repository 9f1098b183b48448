"""Box arithmetic in numpy (data pipeline, tests) and TensorFlow (graph), with the same conventions.

Boxes are float [x1, y1, x2, y2] in continuous pixel coordinates: pixel (i, j) covers [j, j+1) x [i, i+1),
so a box's width is x2 - x1 (no "+1"). Deltas are (dx, dy, dw, dh) relative to a reference box, each
multiplied by a weight (Detectron's convention: (1,1,1,1) for RPN, (10,10,5,5) for the box head).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf
from numpy.typing import NDArray

FPN_STRIDES = (4, 8, 16, 32, 64)


def max_log_scale(max_size: int) -> float:
    """Largest log-scale change a decoded delta may apply (avoids exp overflow early in training), as
    tensorpack's example defines it: log(MAX_SIZE / 16) (model_box.decode_bbox_target)."""
    return math.log(max_size / 16.0)


# The clip of the standard COCO configuration (max size 1344), the default of the decoding functions.
MAX_LOG_SCALE = max_log_scale(1344)


# ----------------------------------------------------------------------------------------------------- numpy
def np_area(boxes: NDArray[Any]) -> NDArray[Any]:
    widths, heights = np.clip(boxes[:, 2] - boxes[:, 0], 0, None), np.clip(boxes[:, 3] - boxes[:, 1], 0, None)
    return np.asarray(widths * heights)


def np_iou(a: NDArray[Any], b: NDArray[Any]) -> NDArray[Any]:
    """Pairwise IoU, shape (len(a), len(b))."""
    x1 = np.maximum(a[:, None, 0], b[None, :, 0])
    y1 = np.maximum(a[:, None, 1], b[None, :, 1])
    x2 = np.minimum(a[:, None, 2], b[None, :, 2])
    y2 = np.minimum(a[:, None, 3], b[None, :, 3])
    inter = np.clip(x2 - x1, 0, None) * np.clip(y2 - y1, 0, None)
    union = np_area(a)[:, None] + np_area(b)[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def np_encode(
    boxes: NDArray[Any], refs: NDArray[Any], weights: Sequence[float] = (1, 1, 1, 1)
) -> NDArray[Any]:
    """Deltas that turn `refs` into `boxes` (row by row)."""
    rw, rh = refs[:, 2] - refs[:, 0], refs[:, 3] - refs[:, 1]
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    wx, wy, ww, wh = weights
    deltas = np.stack(
        [
            wx * ((boxes[:, 0] + 0.5 * bw) - (refs[:, 0] + 0.5 * rw)) / rw,
            wy * ((boxes[:, 1] + 0.5 * bh) - (refs[:, 1] + 0.5 * rh)) / rh,
            ww * np.log(bw / rw),
            wh * np.log(bh / rh),
        ],
        axis=1,
    )
    return np.asarray(deltas, np.float32)


def np_decode(
    deltas: NDArray[Any],
    refs: NDArray[Any],
    weights: Sequence[float] = (1, 1, 1, 1),
    clip: float = MAX_LOG_SCALE,
) -> NDArray[Any]:
    rw, rh = refs[:, 2] - refs[:, 0], refs[:, 3] - refs[:, 1]
    cx, cy = refs[:, 0] + 0.5 * rw, refs[:, 1] + 0.5 * rh
    wx, wy, ww, wh = weights
    dw = np.minimum(deltas[:, 2] / ww, clip)
    dh = np.minimum(deltas[:, 3] / wh, clip)
    ncx, ncy = cx + deltas[:, 0] / wx * rw, cy + deltas[:, 1] / wy * rh
    nw, nh = rw * np.exp(dw), rh * np.exp(dh)
    decoded = np.stack([ncx - 0.5 * nw, ncy - 0.5 * nh, ncx + 0.5 * nw, ncy + 0.5 * nh], axis=1)
    return np.asarray(decoded, np.float32)


def np_nms(boxes: NDArray[Any], scores: NDArray[Any], iou: float) -> list[int]:
    """Greedy NMS (reference implementation): indices kept, by decreasing score."""
    order = list(np.argsort(-scores, kind="stable"))
    keep: list[int] = []
    while order:
        i = order.pop(0)
        keep.append(int(i))
        order = [j for j in order if np_iou(boxes[i : i + 1], boxes[j : j + 1])[0, 0] <= iou]
    return keep


def cell_anchors(size: float, ratios: Sequence[float]) -> NDArray[Any]:
    """Anchors of one size and each aspect ratio (h/w), centred on the origin, shape (A, 4)."""
    out = []
    for r in ratios:
        w = size / math.sqrt(r)
        h = size * math.sqrt(r)
        out.append([-w / 2, -h / 2, w / 2, h / 2])
    return np.asarray(out, dtype=np.float32)


def level_shapes(padded_h: int, padded_w: int) -> list[tuple[int, int]]:
    """Feature map sizes of P2..P6 for an image padded to a multiple of 32 (P6 is P5 subsampled by 2)."""
    shapes = [(padded_h // s, padded_w // s) for s in FPN_STRIDES[:4]]
    shapes.append(((padded_h // 32 + 1) // 2, (padded_w // 32 + 1) // 2))
    return shapes


def np_anchors(padded_h: int, padded_w: int, sizes: Sequence[int], ratios: Sequence[float]) -> NDArray[Any]:
    """All anchors of all FPN levels in the graph's order (level, row, column, ratio), shape (N, 4).

    The anchor of cell (i, j) on a level of stride s is centred at (j * s, i * s), as in tensorpack's
    FasterRCNN example (model_rpn.get_all_anchors), whose published COCO models were trained so."""
    out = []
    for (fh, fw), stride, size in zip(level_shapes(padded_h, padded_w), FPN_STRIDES, sizes, strict=True):
        ys, xs = np.meshgrid(np.arange(fh), np.arange(fw), indexing="ij")
        centres = np.stack([xs, ys, xs, ys], axis=-1).astype(np.float32) * stride  # (fh, fw, 4)
        out.append((centres[:, :, None, :] + cell_anchors(size, ratios)[None, None]).reshape(-1, 4))
    return np.concatenate(out, axis=0)


def np_clip(boxes: NDArray[Any], h: float, w: float) -> NDArray[Any]:
    return np.stack(
        [
            np.clip(boxes[:, 0], 0, w),
            np.clip(boxes[:, 1], 0, h),
            np.clip(boxes[:, 2], 0, w),
            np.clip(boxes[:, 3], 0, h),
        ],
        axis=1,
    )


# ------------------------------------------------------------------------------------------------ TensorFlow
def tf_area(boxes: tf.Tensor) -> tf.Tensor:
    x1, y1, x2, y2 = tf.unstack(boxes, axis=1)
    return tf.maximum(x2 - x1, 0.0) * tf.maximum(y2 - y1, 0.0)


def tf_iou(a: tf.Tensor, b: tf.Tensor) -> tf.Tensor:
    ax1, ay1, ax2, ay2 = tf.split(a, 4, axis=1)  # (n, 1) each
    bx1, by1, bx2, by2 = tf.split(b, 4, axis=1)
    iw = tf.maximum(tf.minimum(ax2, tf.transpose(bx2)) - tf.maximum(ax1, tf.transpose(bx1)), 0.0)
    ih = tf.maximum(tf.minimum(ay2, tf.transpose(by2)) - tf.maximum(ay1, tf.transpose(by1)), 0.0)
    inter = iw * ih
    union = tf.expand_dims(tf_area(a), 1) + tf.expand_dims(tf_area(b), 0) - inter
    return tf.where(union > 0, inter / tf.maximum(union, 1e-12), tf.zeros_like(inter))


def tf_encode(boxes: tf.Tensor, refs: tf.Tensor, weights: Sequence[float] = (1, 1, 1, 1)) -> tf.Tensor:
    rw, rh = refs[:, 2] - refs[:, 0], refs[:, 3] - refs[:, 1]
    bw, bh = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    wx, wy, ww, wh = weights
    return tf.stack(
        [
            wx * ((boxes[:, 0] + 0.5 * bw) - (refs[:, 0] + 0.5 * rw)) / rw,
            wy * ((boxes[:, 1] + 0.5 * bh) - (refs[:, 1] + 0.5 * rh)) / rh,
            ww * tf.math.log(bw / rw),
            wh * tf.math.log(bh / rh),
        ],
        axis=1,
    )


def tf_decode(
    deltas: tf.Tensor, refs: tf.Tensor, weights: Sequence[float] = (1, 1, 1, 1), clip: float = MAX_LOG_SCALE
) -> tf.Tensor:
    rw, rh = refs[:, 2] - refs[:, 0], refs[:, 3] - refs[:, 1]
    cx, cy = refs[:, 0] + 0.5 * rw, refs[:, 1] + 0.5 * rh
    wx, wy, ww, wh = weights
    dw = tf.minimum(deltas[:, 2] / ww, clip)
    dh = tf.minimum(deltas[:, 3] / wh, clip)
    ncx, ncy = cx + deltas[:, 0] / wx * rw, cy + deltas[:, 1] / wy * rh
    nw, nh = rw * tf.exp(dw), rh * tf.exp(dh)
    return tf.stack([ncx - 0.5 * nw, ncy - 0.5 * nh, ncx + 0.5 * nw, ncy + 0.5 * nh], axis=1)


def tf_clip(boxes: tf.Tensor, hw: tf.Tensor) -> tf.Tensor:
    """Clip to an image of float shape hw = [h, w]."""
    h, w = hw[0], hw[1]
    x1, y1, x2, y2 = tf.unstack(boxes, axis=1)
    return tf.stack(
        [tf.clip_by_value(x1, 0.0, w), tf.clip_by_value(y1, 0.0, h), tf.clip_by_value(x2, 0.0, w),
         tf.clip_by_value(y2, 0.0, h)],
        axis=1,
    )  # fmt: skip


def tf_level_anchors(feature_hw: tf.Tensor, stride: int, size: float, ratios: Sequence[float]) -> tf.Tensor:
    """Anchors of one level for a feature map of dynamic shape feature_hw = [h, w]: (h*w*A, 4)."""
    ys = tf.cast(tf.range(feature_hw[0]), tf.float32) * stride
    xs = tf.cast(tf.range(feature_hw[1]), tf.float32) * stride
    gy, gx = tf.meshgrid(ys, xs, indexing="ij")
    centres = tf.stack([gx, gy, gx, gy], axis=-1)  # (h, w, 4)
    anchors = tf.expand_dims(centres, 2) + tf.constant(cell_anchors(size, ratios))[None, None]
    return tf.reshape(anchors, [-1, 4])
