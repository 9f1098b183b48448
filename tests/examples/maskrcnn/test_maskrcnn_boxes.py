"""Box arithmetic, anchors and RPN targets: numpy against brute force, TensorFlow against numpy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import tensorflow as tf
from mrcnn import boxes as B

pytestmark = pytest.mark.integration  # imports TensorFlow (the unit tier does not: docs/development.md)

tf1 = tf.compat.v1


def run_graph(build):
    with tf.Graph().as_default():
        out = build()
        with tf1.Session() as sess:
            return sess.run(out)


def random_boxes(rng: np.random.Generator, n: int, size: float = 200.0) -> np.ndarray:
    xy = rng.uniform(0, size, (n, 2))
    wh = rng.uniform(2, size / 2, (n, 2))
    return np.concatenate([xy, xy + wh], axis=1).astype(np.float32)


def test_encode_decode_round_trip_numpy_and_tf() -> None:
    rng = np.random.default_rng(0)
    boxes, refs = random_boxes(rng, 50), random_boxes(rng, 50)
    weights = (10.0, 10.0, 5.0, 5.0)
    deltas = B.np_encode(boxes, refs, weights)
    np.testing.assert_allclose(B.np_decode(deltas, refs, weights), boxes, rtol=1e-4, atol=1e-3)
    # By hand: a 6x6 box centred at (5, 7) against the 10x10 reference centred at (5, 5): centre shift
    # (0, 2) / 10 x 10, scale log(6 / 10) x 5; a box twice the reference's size and shifted by half of it.
    by_hand = B.np_encode(np.array([[2, 4, 8, 10], [0, 0, 20, 20]], np.float32),
                          np.array([[0, 0, 10, 10]] * 2, np.float32), weights)  # fmt: skip
    expected = [[0, 2, 5 * np.log(0.6), 5 * np.log(0.6)], [5, 5, 5 * np.log(2), 5 * np.log(2)]]
    np.testing.assert_allclose(by_hand, expected, rtol=1e-6)
    tf_deltas, tf_back = run_graph(
        lambda: (B.tf_encode(tf.constant(boxes), tf.constant(refs), weights),
                 B.tf_decode(tf.constant(deltas), tf.constant(refs), weights))
    )  # fmt: skip
    np.testing.assert_allclose(tf_deltas, deltas, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(tf_back, boxes, rtol=1e-4, atol=1e-3)


def test_decode_caps_the_scale_change() -> None:
    refs = np.array([[0, 0, 10, 10]], np.float32)
    out = B.np_decode(np.array([[0, 0, 100, 100]], np.float32), refs)
    assert np.all(np.isfinite(out))
    assert out[0, 2] - out[0, 0] == pytest.approx(10 * np.exp(B.MAX_LOG_SCALE), rel=1e-4)


def brute_iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union


def test_iou_matches_brute_force_numpy_and_tf() -> None:
    rng = np.random.default_rng(1)
    a, b = random_boxes(rng, 20, 60), random_boxes(rng, 15, 60)
    expected = np.array([[brute_iou(x, y) for y in b] for x in a])
    assert expected.max() > 0.3 and expected.min() == 0.0  # the sample has overlaps and disjoint pairs
    np.testing.assert_allclose(B.np_iou(a, b), expected, atol=1e-6)
    np.testing.assert_allclose(
        run_graph(lambda: B.tf_iou(tf.constant(a), tf.constant(b))), expected, atol=1e-5
    )
    assert B.np_iou(a[:1], a[:1])[0, 0] == pytest.approx(1.0)


def test_anchors_cover_every_level_cell_with_the_configured_shapes() -> None:
    sizes, ratios = (16, 32, 64, 128, 256), (0.5, 1.0, 2.0)
    anchors = B.np_anchors(96, 128, sizes, ratios)
    shapes = B.level_shapes(96, 128)
    assert shapes == [(24, 32), (12, 16), (6, 8), (3, 4), (2, 2)]
    assert len(anchors) == sum(h * w for h, w in shapes) * len(ratios)
    # First level: cell (row 0, col 1) is the second group of A anchors, centred at (1, 0) * stride 4
    # (tensorpack's convention: cell (i, j) at (j, i) * stride, not at the cell's centre).
    cell = anchors[3:6]
    np.testing.assert_allclose((cell[:, :2] + cell[:, 2:]) / 2, [[4.0, 0.0]] * 3)
    w, h = cell[:, 2] - cell[:, 0], cell[:, 3] - cell[:, 1]
    np.testing.assert_allclose(np.sqrt(w * h), 16.0, rtol=1e-5)
    np.testing.assert_allclose(h / w, ratios, rtol=1e-5)
    # Last level (stride 64, size 256).
    last = anchors[-3:]
    np.testing.assert_allclose(
        np.sqrt((last[:, 2] - last[:, 0]) * (last[:, 3] - last[:, 1])), 256.0, rtol=1e-5
    )
    np.testing.assert_allclose((last[:, :2] + last[:, 2:]) / 2, [[64.0, 64.0]] * 3)


def test_graph_anchors_equal_numpy_anchors() -> None:
    sizes, ratios = (32, 64, 128, 256, 512), (0.5, 1.0, 2.0)
    shapes = B.level_shapes(160, 224)
    tf_anchors = run_graph(
        lambda: tf.concat(
            [
                B.tf_level_anchors(tf.constant(s), st, sz, ratios)
                for s, st, sz in zip(shapes, B.FPN_STRIDES, sizes, strict=False)
            ],
            0,
        )
    )
    np.testing.assert_allclose(tf_anchors, B.np_anchors(160, 224, sizes, ratios), atol=1e-4)
    # By hand: P2..P6 of a 160x224 image have 40x56, 20x28, 10x14, 5x7 and 3x4 cells, 3 anchors each; the
    # first cell's are centred at (0, 0) with area 32^2 and height/width 0.5, 1, 2.
    assert len(tf_anchors) == 3 * (40 * 56 + 20 * 28 + 10 * 14 + 5 * 7 + 3 * 4)
    r = 32 / np.sqrt(2) / 2
    first = [[-2 * r, -r, 2 * r, r], [-16, -16, 16, 16], [-r, -2 * r, r, 2 * r]]
    np.testing.assert_allclose(tf_anchors[:3], first, rtol=1e-5)


def test_reference_nms_keeps_the_best_of_each_overlapping_group() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 10, 9]], np.float32)
    scores = np.array([0.9, 0.95, 0.5, 0.1], np.float32)
    assert B.np_nms(boxes, scores, 0.5) == [1, 2]
    assert B.np_nms(boxes, scores, 0.99) == [1, 0, 2, 3]
    # Brute force: kept boxes pairwise below the threshold, every dropped one overlaps a better kept one.
    rng = np.random.default_rng(3)
    bx, sc = random_boxes(rng, 60, 100), rng.random(60).astype(np.float32)
    keep = B.np_nms(bx, sc, 0.4)
    for i, j in itertools.combinations(keep, 2):
        assert brute_iou(bx[i], bx[j]) <= 0.4
    for d in set(range(60)) - set(keep):
        assert any(sc[k] >= sc[d] and brute_iou(bx[k], bx[d]) > 0.4 for k in keep)
