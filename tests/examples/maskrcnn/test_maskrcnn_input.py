"""The training input pipeline: RPN targets on the anchor grid against a dense reading of tensorpack's
get_anchor_labels (every anchor inside the image, pycocotools' IoU in float32 as its np_iou returns it, labels
set in its order), aligned with the graph's anchors; a datapoint's shapes and mirroring. (The benchmark,
`make bench-maskrcnn-input` with tensorpack's example, compares whole examples with tensorpack's own code.)"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from mrcnn import anchors as A
from mrcnn import boxes as B
from mrcnn import data
from mrcnn.config import build_config
from pycocotools import mask as mask_utils

# mrcnn.anchors and mrcnn.data take their box arithmetic from mrcnn.boxes, which imports TensorFlow (about
# 10 s): the unit tier (make test-fast) imports none (docs/development.md), though these tests run no graph.
pytestmark = pytest.mark.integration


def dense_anchors(h: int, w: int, cfg) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Every anchor in the graph's order (level, row, column, ratio), float32, in the arithmetic of
    tensorpack's model_rpn.get_all_anchors: a cell's anchor w = sqrt(size^2 / ratio), h = ratio * w, halved
    in float64, plus float32 shifts of j * stride."""
    shapes = B.level_shapes(*data.padded_size(h, w))
    out = []
    for (rows, cols), stride, size in zip(shapes, B.FPN_STRIDES, cfg.anchor_sizes, strict=True):
        cell = []
        for r in cfg.anchor_ratios:
            aw = math.sqrt(size * size / r)
            cell.append([-aw, -r * aw, aw, r * aw])
        half = np.asarray(cell) * 0.5
        ys, xs = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        shifts = (np.stack([xs, ys, xs, ys], axis=-1) * stride).astype(np.float32)
        out.append((shifts[:, :, None, :] + half[None, None]).reshape(-1, 4).astype(np.float32))
    return np.concatenate(out)


def reference_labels(h: int, w: int, gt: np.ndarray, cfg) -> tuple[np.ndarray, np.ndarray]:  # type: ignore[no-untyped-def]
    """Before sampling: every anchor's label (-1 outside the image; inside: a box's best matches (ties
    included) and IoU >= rpn_pos_iou 1, then IoU < rpn_neg_iou 0, which wins) and its best box."""
    boxes = dense_anchors(h, w, cfg)
    inside = (boxes[:, 0] >= 0) & (boxes[:, 1] >= 0) & (boxes[:, 2] <= w) & (boxes[:, 3] <= h)

    def xywh(b: np.ndarray) -> np.ndarray:
        return np.concatenate([b[:, :2], b[:, 2:] - b[:, :2]], axis=1)

    iou = mask_utils.iou(xywh(boxes[inside]), xywh(gt), np.zeros(len(gt), bool)).astype(np.float32)
    best = iou.max(axis=1)
    inner = np.full(len(best), -1, np.int32)
    inner[np.where(iou == iou.max(axis=0, keepdims=True))[0]] = 1
    inner[best >= cfg.rpn_pos_iou] = 1
    inner[best < cfg.rpn_neg_iou] = 0
    labels = np.full(len(boxes), -1, np.int32)
    labels[inside] = inner
    best_gt = np.zeros(len(boxes), np.int64)
    best_gt[inside] = iou.argmax(axis=1)
    return labels, best_gt


def random_gt(rng: np.random.Generator, n: int, h: int, w: int) -> np.ndarray:
    x1, y1 = rng.uniform(0, w - 8, n), rng.uniform(0, h - 8, n)
    bw, bh = rng.uniform(4, w / 2, n), rng.uniform(4, h / 2, n)
    return np.stack([x1, y1, np.minimum(x1 + bw, w), np.minimum(y1 + bh, h)], 1).astype(np.float32)


@pytest.mark.parametrize(("h", "w", "n", "seed"), [(128, 128, 2, 0), (100, 170, 9, 1), (800, 1067, 25, 2)])
def test_rpn_targets_equal_the_dense_reference_before_sampling(h: int, w: int, n: int, seed: int) -> None:
    cfg = build_config("coco" if h > 200 else "tiny", [])
    huge = replace(cfg, rpn_batch_per_image=10**9, rpn_fg_ratio=0.5)  # no sampling: every label shows
    gt = random_gt(np.random.default_rng(seed), n, h, w)
    labels, deltas = A.rpn_targets(h, w, gt, huge, np.random.default_rng(0))
    expected, best_gt = reference_labels(h, w, gt, cfg)
    np.testing.assert_array_equal(labels, expected)
    fg = labels == 1
    assert fg.any()
    anchors = dense_anchors(h, w, cfg)
    np.testing.assert_allclose(B.np_decode(deltas[fg], anchors[fg]), gt[best_gt[fg]], atol=1e-2)
    assert not deltas[~fg].any()


def test_rpn_targets_sample_the_anchor_batch() -> None:
    cfg = build_config("coco", [])
    gt = random_gt(np.random.default_rng(5), 60, 800, 1200)
    candidates, _ = A.labels_before_sampling(800, 1200, gt, cfg)
    assert (candidates == 1).sum() > cfg.rpn_batch_per_image * cfg.rpn_fg_ratio  # more than can be kept
    labels, _ = A.rpn_targets(800, 1200, gt, cfg, np.random.default_rng(1))
    fg, bg = int((labels == 1).sum()), int((labels == 0).sum())
    assert fg == cfg.rpn_batch_per_image * cfg.rpn_fg_ratio
    assert set(np.flatnonzero(labels == 1)) <= set(np.flatnonzero(candidates == 1))
    assert fg + bg == cfg.rpn_batch_per_image
    other, _ = A.rpn_targets(800, 1200, gt, cfg, np.random.default_rng(2))
    assert not np.array_equal(labels, other)  # sampled at random


def test_an_image_without_boxes_has_only_background_inside() -> None:
    cfg = build_config("tiny", [])
    labels, deltas = A.rpn_targets(100, 120, np.zeros((0, 4), np.float32), cfg, np.random.default_rng(0))
    assert (labels == 0).sum() == cfg.rpn_batch_per_image and not (labels == 1).any()
    assert (
        len(labels) == len(B.np_anchors(128, 128, cfg.anchor_sizes, cfg.anchor_ratios)) and not deltas.any()
    )


def test_anchor_boxes_from_flat_indices_are_the_graphs_anchors() -> None:
    cfg = build_config("coco", [])
    levels = A.levels(224, 320, cfg.anchor_sizes, cfg.anchor_ratios)
    everything = B.np_anchors(224, 320, cfg.anchor_sizes, cfg.anchor_ratios)
    assert sum(level.size for level in levels) == len(everything)
    flat = np.random.default_rng(0).choice(len(everything), 500, replace=False)
    np.testing.assert_allclose(A.anchor_boxes(levels, flat), everything[flat], atol=1e-4)


def test_a_mirrored_example_mirrors_image_boxes_and_masks(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import cv2

    img = np.zeros((60, 80, 3), np.uint8)
    img[10:30, 5:25] = (255, 0, 0)  # a blue square (BGR) at the left
    cv2.imwrite(str(tmp_path / "a.png"), img)
    rec = data.Record(
        image_id=1, path=str(tmp_path / "a.png"), height=60, width=80,
        boxes=np.array([[5, 10, 25, 30]], np.float32), classes=np.array([1], np.int64),
        segmentations=([[5, 10, 25, 10, 25, 30, 5, 30]],),
    )  # fmt: skip
    cfg = replace(build_config("tiny", []), short_edge=(60,), max_size=128)
    flips = {}
    for seed in range(8):
        image, _, _, boxes, classes, masks = data.train_example(rec, cfg, np.random.default_rng(seed))
        assert image.dtype == np.uint8 and masks.shape == (1, 60, 80) and classes.tolist() == [1]
        mirrored = bool(image[20, 70, 0] == 255)
        flips[mirrored] = (boxes[0].tolist(), masks[0])
        assert (image[20, 15, 0] == 255) != mirrored
    assert set(flips) == {True, False}  # both happen
    np.testing.assert_allclose(flips[True][0], [55, 10, 75, 30])
    np.testing.assert_array_equal(flips[True][1], flips[False][1][:, ::-1])
    assert flips[False][1][10:30, 5:25].all() and flips[False][1].sum() == 400
