"""RPN training targets, computed on the anchor grid itself (no list of every anchor's box, no dense IoU).

The anchors are those of boxes.np_anchors / the graph's tf_level_anchors: on a level of stride s, cell (i, j)
holds one anchor per aspect ratio, centred at (j * s, i * s), in the order (level, row, column, ratio). The
labels follow tensorpack's FasterRCNN example: only anchors lying entirely inside the (unpadded) image are
labelled, the others are ignored (-1); an anchor is foreground (1) when its best IoU with a ground-truth box
is >= rpn_pos_iou, and so is every anchor that is a box's best match (ties included, IoU > 0; kept even below
rpn_neg_iou, as Detectron does, where tensorpack lets the background threshold win); background (0) below
rpn_neg_iou; then at most rpn_batch_per_image * rpn_fg_ratio foreground and the rest of the batch background
are kept at random.

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


@dataclass(frozen=True)
class Level:
    stride: int
    rows: int
    cols: int
    cell: NDArray[Any]  # (A, 4) float32: the ratios' anchors around the origin (boxes.cell_anchors)
    offset: int  # index of the level's first anchor in the (level, row, column, ratio) order

    @property
    def size(self) -> int:
        return self.rows * self.cols * len(self.cell)

    def edges(self, first: int, last: int, axis: int) -> tuple[NDArray[Any], NDArray[Any]]:
        """(low, high) edges of the anchors of cells first..last-1 along an axis (0: x, 1: y), (n, A): float64
        of the float32 values boxes.np_anchors computes, so that IoU ties are decided alike."""
        centres = (np.arange(first, last, dtype=np.float32) * np.float32(self.stride))[:, None]
        low = centres + self.cell[None, :, axis]
        high = centres + self.cell[None, :, axis + 2]
        return low.astype(np.float64), high.astype(np.float64)


def levels(padded_h: int, padded_w: int, sizes: Sequence[int], ratios: Sequence[float]) -> list[Level]:
    out, offset = [], 0
    shapes = B.level_shapes(padded_h, padded_w)
    for (rows, cols), stride, size in zip(shapes, B.FPN_STRIDES, sizes, strict=True):
        level = Level(stride, rows, cols, B.cell_anchors(size, ratios), offset)
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


@dataclass
class _Match:
    best: NDArray[Any]  # (rows, cols, A) best IoU over the boxes (inside anchors only; 0 elsewhere)
    best_gt: NDArray[Any]  # (rows, cols, A) the first box with that IoU
    inside: NDArray[Any]  # (rows, cols, A) bool
    forced: NDArray[Any]  # (rows, cols, A) bool: some box's best match


def _match(levels_: list[Level], h: int, w: int, gt: NDArray[Any]) -> list[_Match]:
    matches = []
    for level in levels_:
        shape = (level.rows, level.cols, len(level.cell))
        matches.append(
            _Match(np.zeros(shape), np.zeros(shape, np.int64), _inside(level, h, w), np.zeros(shape, bool))
        )
    gt = gt.astype(np.float64)
    gt_best = np.zeros(len(gt))
    blocks: list[tuple[int, int, slice, slice, NDArray[Any]]] = []
    for g, (x1, y1, x2, y2) in enumerate(gt):
        area_g = (x2 - x1) * (y2 - y1)
        for n, level in enumerate(levels_):
            m, s = matches[n], level.stride
            # cells whose anchor of some ratio overlaps the box
            reach_x, reach_y = float(level.cell[:, 2].max()) + 1, float(level.cell[:, 3].max()) + 1
            c0, c1 = _span(x1 - reach_x, x2 + reach_x, s, level.cols)
            r0, r1 = _span(y1 - reach_y, y2 + reach_y, s, level.rows)
            if c0 == c1 or r0 == r1:
                continue
            ax1, ax2 = level.edges(c0, c1, 0)  # (cols, A)
            ay1, ay2 = level.edges(r0, r1, 1)  # (rows, A)
            iw = np.clip(np.minimum(ax2, x2) - np.maximum(ax1, x1), 0, None)
            ih = np.clip(np.minimum(ay2, y2) - np.maximum(ay1, y1), 0, None)
            inter = iw[None, :, :] * ih[:, None, :]  # (rows, cols, A), as boxes.np_iou multiplies
            area_a = (ax2 - ax1)[None, :, :] * (ay2 - ay1)[:, None, :]
            iou = inter / (area_a + area_g - inter)
            rows, cols = slice(r0, r1), slice(c0, c1)
            iou *= m.inside[rows, cols]
            better = iou > m.best[rows, cols]
            m.best[rows, cols][better] = iou[better]
            m.best_gt[rows, cols][better] = g
            gt_best[g] = max(gt_best[g], float(iou.max()))
            blocks.append((g, n, rows, cols, iou))
    for g, n, rows, cols, iou in blocks:
        if gt_best[g] > 0:
            matches[n].forced[rows, cols] |= iou == gt_best[g]
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
    """The boxes of the anchors at flat indices of the (level, row, column, ratio) order: (k, 4)."""
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
        centres = np.stack([col, row, col, row], axis=1).astype(np.float32) * np.float32(level.stride)
        out[sel] = centres + level.cell[a]
    return out


def rpn_targets(
    h: int, w: int, gt: NDArray[Any], cfg: Any, rng: np.random.Generator
) -> tuple[NDArray[Any], NDArray[Any]]:
    """Anchor labels (1 fg, 0 bg, -1 ignored) and box deltas (rows of fg anchors, zeros elsewhere) for an
    h x w image with ground-truth boxes `gt` (G, 4), for every anchor of the image padded to a multiple of
    32."""
    padded_h, padded_w = -(-h // 32) * 32, -(-w // 32) * 32
    lv = levels(padded_h, padded_w, cfg.anchor_sizes, cfg.anchor_ratios)
    total = sum(level.size for level in lv)
    deltas = np.zeros((total, 4), np.float32)
    if len(gt) == 0:
        labels = np.concatenate([np.where(_inside(level, h, w), 0, -1).ravel() for level in lv]).astype(
            np.int32
        )
        _subsample(labels, 0, cfg.rpn_batch_per_image, rng)
        return labels, deltas
    matches = _match(lv, h, w, gt)
    parts, best_gt = [], []
    for m in matches:
        label = np.where(m.inside & (m.best < cfg.rpn_neg_iou), 0, -1)
        label[m.forced | (m.best >= cfg.rpn_pos_iou)] = 1
        parts.append(label.ravel())
        best_gt.append(m.best_gt.ravel())
    labels = np.concatenate(parts).astype(np.int32)
    num_fg = _subsample(labels, 1, int(cfg.rpn_batch_per_image * cfg.rpn_fg_ratio), rng)
    _subsample(labels, 0, cfg.rpn_batch_per_image - num_fg, rng)
    fg = np.flatnonzero(labels == 1)
    if len(fg):
        matched = np.concatenate(best_gt)[fg]
        deltas[fg] = B.np_encode(gt[matched].astype(np.float32), anchor_boxes(lv, fg))
    return labels, deltas
