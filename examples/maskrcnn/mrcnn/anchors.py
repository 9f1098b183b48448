"""RPN training targets, computed on the anchor grid itself (no list of every anchor's box, no dense IoU).

The anchors are those of boxes.np_anchors / the graph's tf_level_anchors: on a level of stride s, cell (i, j)
holds one anchor per aspect ratio, centred at (j * s, i * s), in the order (level, row, column, ratio). The
labels are those of tensorpack's FasterRCNN example (data.py, get_multilevel_rpn_anchor_input and
get_anchor_labels), value for value:
- only anchors lying entirely inside the (unpadded) image are labelled; the others are ignored (-1);
- IoUs are pycocotools' (mask.iou on x, y, w, h, as the example computes them) rounded to float32, and the
  thresholds are compared in float32;
- an anchor is foreground (1) when it is some box's best match (ties included) or its best IoU is >=
  rpn_pos_iou; then background (0) when its best IoU is < rpn_neg_iou, which wins over a best match; the
  rest is ignored. A box that overlaps no anchor inside the image has IoU 0 everywhere, and so (as in the
  example) makes every inside anchor a best match;
- then at most rpn_batch_per_image * rpn_fg_ratio foreground anchors and rpn_batch_per_image minus that many
  background anchors are kept, at random.
The anchors' edges are computed as the example computes them (float64, then rounded to float32); the graph's
differ from them by at most one float32 rounding step.

Why on the grid: an anchor can overlap a box only if its cell lies in a rectangle around the box, so each
box's IoUs are computed for that rectangle of cells only (one small block per level and box), instead of for
every anchor of the image (tens of thousands of them per box on the finest level).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import boxes as B


def cell_anchors(size: float, ratios: Sequence[float]) -> NDArray[Any]:
    """(A, 4) float64: one anchor per ratio (h / w) of area size**2 around the origin, in the arithmetic of
    tensorpack's example (width sqrt(size**2 / ratio), height ratio * width), so that the anchors' float32
    edges are its values exactly."""
    out = []
    for r in ratios:
        w = math.sqrt(size * size / r)
        h = r * w
        out.append([-0.5 * w, -0.5 * h, 0.5 * w, 0.5 * h])
    return np.asarray(out, np.float64)


@dataclass(frozen=True)
class Level:
    stride: int
    rows: int
    cols: int
    cell: NDArray[Any]  # (A, 4) float64: the ratios' anchors around the origin (cell_anchors)
    offset: int  # index of the level's first anchor in the (level, row, column, ratio) order

    @property
    def size(self) -> int:
        return self.rows * self.cols * len(self.cell)

    def edges(self, first: int, last: int, axis: int) -> tuple[NDArray[Any], NDArray[Any]]:
        """(low, high) float32 edges of the anchors of cells first..last-1 on axis 0 (x) or 1 (y): (n, A)."""
        centres = np.arange(first, last, dtype=np.float64)[:, None] * self.stride
        low = (centres + self.cell[None, :, axis]).astype(np.float32)
        high = (centres + self.cell[None, :, axis + 2]).astype(np.float32)
        return low, high


def levels(padded_h: int, padded_w: int, sizes: Sequence[int], ratios: Sequence[float]) -> list[Level]:
    out, offset = [], 0
    shapes = B.level_shapes(padded_h, padded_w)
    for (rows, cols), stride, size in zip(shapes, B.FPN_STRIDES, sizes, strict=True):
        level = Level(stride, rows, cols, cell_anchors(size, ratios), offset)
        out.append(level)
        offset += level.size
    return out


def _span(lo: float, hi: float, stride: int, count: int) -> tuple[int, int]:
    """Cells k (0 <= k < count) with lo < k * stride < hi: the half-open range [first, last)."""
    first = max(math.floor(lo / stride) + 1, 0)
    last = min(math.ceil(hi / stride), count)
    return first, max(first, last)


def _inside(level: Level, h: int, w: int) -> NDArray[Any]:
    """(rows, cols, A) bool: the anchor lies entirely inside the h x w image (tensorpack's condition,
    x1 >= 0, y1 >= 0, x2 <= w, y2 <= h)."""
    x1, x2 = level.edges(0, level.cols, 0)
    y1, y2 = level.edges(0, level.rows, 1)
    ok_x = (x1 >= 0) & (x2 <= w)  # (cols, A)
    ok_y = (y1 >= 0) & (y2 <= h)  # (rows, A)
    return ok_y[:, None, :] & ok_x[None, :, :]


def _xywh(low: NDArray[Any], high: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]]:
    """(start, size, end) in float64 as pycocotools' IoU sees a float32 box: the size is a float32
    difference, the end start + size (not the box's own high edge)."""
    start, size = low.astype(np.float64), (high - low).astype(np.float64)
    return start, size, start + size


@dataclass
class _Match:
    best: NDArray[Any]  # (rows, cols, A) float32 best IoU over the boxes (inside anchors only; 0 elsewhere)
    best_gt: NDArray[Any]  # (rows, cols, A) the first box with that IoU
    inside: NDArray[Any]  # (rows, cols, A) bool
    forced: NDArray[Any]  # (rows, cols, A) bool: some box's best match (inside anchors only)


def _iou_bound(level: Level, box_w: float, box_h: float) -> float:
    """The largest IoU an anchor of the level can have with a box_w x box_h box: at the best placement."""
    aw, ah = level.cell[:, 2] - level.cell[:, 0], level.cell[:, 3] - level.cell[:, 1]
    inter = np.minimum(aw, box_w) * np.minimum(ah, box_h)
    return float((inter / (aw * ah + box_w * box_h - inter)).max())


def _match(levels_: list[Level], h: int, w: int, gt: NDArray[Any], neg_iou: float) -> list[_Match]:
    """Each anchor's best IoU and box, and each box's best matches. A (box, level) pair is skipped when no
    anchor of the level can reach neg_iou nor the box's best IoU on another level: its IoUs could only make
    background anchors that already are, or ignored ones that are not a box's best match (a big box on the
    fine levels, most of the work otherwise)."""
    matches = []
    for level in levels_:
        shape = (level.rows, level.cols, len(level.cell))
        matches.append(
            _Match(
                np.zeros(shape, np.float32), np.zeros(shape, np.int64), _inside(level, h, w),
                np.zeros(shape, bool),
            )
        )  # fmt: skip
    gt = np.asarray(gt, np.float32)
    gx, gw, gxr = _xywh(gt[:, 0], gt[:, 2])
    gy, gh, gyr = _xywh(gt[:, 1], gt[:, 3])
    gt_best = np.zeros(len(gt), np.float32)
    blocks: list[tuple[int, int, slice, slice, NDArray[Any]]] = []
    for g in range(len(gt)):
        area_g = gw[g] * gh[g]
        bounds = [_iou_bound(level, gw[g], gh[g]) for level in levels_]
        for n in sorted(range(len(levels_)), key=lambda k: -bounds[k]):
            if bounds[n] + 1e-6 < min(neg_iou, float(gt_best[g])):
                break  # this level and the rest (lower bounds)
            level, m, s = levels_[n], matches[n], levels_[n].stride
            # cells whose anchor of some ratio overlaps the box
            reach_x, reach_y = float(level.cell[:, 2].max()) + 1, float(level.cell[:, 3].max()) + 1
            c0, c1 = _span(float(gt[g, 0]) - reach_x, float(gt[g, 2]) + reach_x, s, level.cols)
            r0, r1 = _span(float(gt[g, 1]) - reach_y, float(gt[g, 3]) + reach_y, s, level.rows)
            if c0 == c1 or r0 == r1:
                continue
            ax, aw, axr = _xywh(*level.edges(c0, c1, 0))  # (cols, A)
            ay, ah, ayr = _xywh(*level.edges(r0, r1, 1))  # (rows, A)
            iw = np.clip(np.minimum(axr, gxr[g]) - np.maximum(ax, gx[g]), 0, None)
            ih = np.clip(np.minimum(ayr, gyr[g]) - np.maximum(ay, gy[g]), 0, None)
            inter = iw[None, :, :] * ih[:, None, :]  # (rows, cols, A)
            area_a = aw[None, :, :] * ah[:, None, :]
            iou = (inter / (area_a + area_g - inter)).astype(np.float32)
            rows, cols = slice(r0, r1), slice(c0, c1)
            iou *= m.inside[rows, cols]
            better = iou > m.best[rows, cols]
            m.best[rows, cols][better] = iou[better]
            m.best_gt[rows, cols][better] = g
            gt_best[g] = max(gt_best[g], iou.max())
            blocks.append((g, n, rows, cols, iou))
    for g, n, rows, cols, iou in blocks:
        if gt_best[g] > 0:
            matches[n].forced[rows, cols] |= iou == gt_best[g]
    if (gt_best == 0).any():  # a box with IoU 0 everywhere: every inside anchor ties as its best match
        for m in matches:
            m.forced |= m.inside
    return matches


def _subsample(labels: NDArray[Any], value: int, limit: int, rng: np.random.Generator) -> int:
    """Keep at most `limit` anchors labelled `value` (the others become -1, at random): how many stay."""
    idx = np.flatnonzero(labels == value)
    if len(idx) <= limit:
        return len(idx)
    labels[idx] = -1
    labels[idx[rng.choice(len(idx), limit, replace=False)]] = value
    return limit


def anchor_boxes(levels_: list[Level], flat: NDArray[Any]) -> NDArray[Any]:
    """The float32 boxes of the anchors at flat indices of the (level, row, column, ratio) order: (k, 4)."""
    out = np.zeros((len(flat), 4), np.float32)
    offsets = np.array([lv.offset for lv in levels_])
    which = np.searchsorted(offsets, flat, side="right") - 1
    for n, level in enumerate(levels_):
        sel = which == n
        if not sel.any():
            continue
        local = flat[sel] - level.offset
        a_count = len(level.cell)
        a = local % a_count
        col = (local // a_count) % level.cols
        row = local // (a_count * level.cols)
        centres = np.stack([col, row, col, row], axis=1).astype(np.float64) * level.stride
        out[sel] = centres + level.cell[a]
    return out


def labels_before_sampling(h: int, w: int, gt: NDArray[Any], cfg: Any) -> tuple[NDArray[Any], NDArray[Any]]:
    """Every anchor's label (1, 0, -1) before the batch is sampled, and its best box (index into gt; 0 where
    it overlaps none)."""
    lv = levels(-(-h // 32) * 32, -(-w // 32) * 32, cfg.anchor_sizes, cfg.anchor_ratios)
    if len(gt) == 0:
        labels = np.concatenate([np.where(_inside(level, h, w), 0, -1).ravel() for level in lv])
        return labels.astype(np.int32), np.zeros(len(labels), np.int64)
    neg, pos = np.float32(cfg.rpn_neg_iou), np.float32(cfg.rpn_pos_iou)
    parts, best_gt = [], []
    for m in _match(lv, h, w, gt, cfg.rpn_neg_iou):
        label = np.where(m.forced | (m.best >= pos), 1, -1)
        label[m.inside & (m.best < neg)] = 0  # after the foreground: background wins over a best match
        parts.append(label.ravel())
        best_gt.append(m.best_gt.ravel())
    return np.concatenate(parts).astype(np.int32), np.concatenate(best_gt)


def rpn_targets(
    h: int, w: int, gt: NDArray[Any], cfg: Any, rng: np.random.Generator
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Anchor labels (1 fg, 0 bg, -1 ignored) and box deltas (rows of fg anchors, zeros elsewhere) for an
    h x w image with ground-truth boxes `gt` (G, 4), for every anchor of the image padded to a multiple of
    32."""
    labels, best_gt = labels_before_sampling(h, w, gt, cfg)
    num_fg = _subsample(labels, 1, int(cfg.rpn_batch_per_image * cfg.rpn_fg_ratio), rng)
    _subsample(labels, 0, cfg.rpn_batch_per_image - num_fg, rng)
    deltas = np.zeros((len(labels), 4), np.float32)
    fg = np.flatnonzero(labels == 1)
    if len(fg):
        lv = levels(-(-h // 32) * 32, -(-w // 32) * 32, cfg.anchor_sizes, cfg.anchor_ratios)
        deltas[fg] = B.np_encode(np.asarray(gt, np.float32)[best_gt[fg]], anchor_boxes(lv, fg))
    return labels, deltas
