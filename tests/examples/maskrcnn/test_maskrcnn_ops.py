"""Graph ops against numpy references: ROIAlign, per-class detection NMS, mask pasting."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from mrcnn import boxes as B
from mrcnn.config import build_config
from mrcnn.evaluation import paste_mask
from mrcnn.model import detections, roi_align

# TensorFlow comes with the operations under test (about 10 s):
# the unit tier (make test-fast) imports none.
pytestmark = pytest.mark.integration

tf1 = tf.compat.v1


def run_graph(build):
    with tf.Graph().as_default():
        out = build()
        with tf1.Session() as sess:
            return sess.run(out)


def bilinear(feat: np.ndarray, y: float, x: float) -> np.ndarray:
    y0, x0 = int(np.floor(y)), int(np.floor(x))
    dy, dx = y - y0, x - x0
    return (
        feat[y0, x0] * (1 - dy) * (1 - dx) + feat[y0, x0 + 1] * (1 - dy) * dx
        + feat[y0 + 1, x0] * dy * (1 - dx) + feat[y0 + 1, x0 + 1] * dy * dx
    )  # fmt: skip


def np_roi_align(feat: np.ndarray, box: np.ndarray, size: int) -> np.ndarray:
    """ROIAlign (aligned, 2x2 samples per bin) written from its definition; box in feature coordinates."""
    x1, y1, x2, y2 = box
    bw, bh = (x2 - x1) / size, (y2 - y1) / size
    out = np.zeros((size, size, feat.shape[2]))
    for i in range(size):
        for j in range(size):
            samples = [
                bilinear(feat, y1 + (i + (a + 0.5) / 2) * bh - 0.5, x1 + (j + (b + 0.5) / 2) * bw - 0.5)
                for a in range(2)
                for b in range(2)
            ]
            out[i, j] = np.mean(samples, axis=0)
    return out


def test_roi_align_matches_the_numpy_definition() -> None:
    rng = np.random.default_rng(0)
    feat = rng.normal(size=(20, 24, 3)).astype(np.float32)
    stride = 8
    # ROIs (image coordinates) whose samples stay inside the map, including sub-pixel and tiny ones.
    rois = np.array(
        [[16, 16, 120, 96], [40.5, 30.25, 60.75, 50.5], [100, 20, 101, 21], [9, 9, 180, 150]], np.float32
    )
    got = run_graph(lambda: roi_align(tf.constant(feat[None]), tf.constant(rois), stride, 7))
    assert got.shape == (4, 7, 7, 3)
    for k, roi in enumerate(rois):
        np.testing.assert_allclose(got[k], np_roi_align(feat, roi / stride, 7), atol=1e-4)


def reference_detections(rois, logits, deltas, hw, cfg):
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    found = []
    for c in range(1, logits.shape[1]):
        boxes = B.np_clip(B.np_decode(deltas[:, c], rois, cfg.frcnn_box_weights), *hw)
        ok = np.nonzero(probs[:, c] > cfg.test_score_thresh)[0]
        for i in B.np_nms(boxes[ok], probs[ok, c], cfg.test_nms_iou):
            found.append((probs[ok[i], c], c, boxes[ok[i]]))
    found.sort(key=lambda t: -t[0])
    return found[: cfg.test_max_detections]


def test_detections_are_per_class_nms_of_decoded_boxes() -> None:
    cfg = build_config("tiny", ["test_max_detections=15"])
    rng = np.random.default_rng(1)
    n, classes, hw = 60, 4, (96.0, 128.0)
    centres = rng.uniform(20, 90, (n, 2))
    rois = np.concatenate([centres - 12, centres + 12], axis=1).astype(np.float32)  # many overlaps
    logits = rng.normal(scale=2.0, size=(n, classes)).astype(np.float32)
    deltas = rng.normal(scale=0.5, size=(n, classes, 4)).astype(np.float32)
    boxes, scores, labels = run_graph(
        lambda: detections(tf.constant(rois), tf.constant(logits), tf.constant(deltas), tf.constant(hw), cfg)
    )
    expected = reference_detections(rois, logits, deltas, hw, cfg)
    assert len(expected) == 15  # the cap applies: the comparison includes the truncation
    np.testing.assert_allclose(scores, [e[0] for e in expected], rtol=1e-5)
    assert labels.tolist() == [e[1] for e in expected]
    np.testing.assert_allclose(boxes, np.stack([e[2] for e in expected]), atol=1e-3)


def test_paste_mask_inverts_roi_sampling() -> None:
    h, w = 64, 80
    yy, xx = np.mgrid[0:h, 0:w]
    full = (((yy - 30) / 14) ** 2 + ((xx - 41) / 20) ** 2 <= 1).astype(np.float32)
    box = np.array([20.0, 15.5, 62.0, 45.0])
    r = 28
    xs = box[0] + (np.arange(r) + 0.5) * (box[2] - box[0]) / r - 0.5
    ys = box[1] + (np.arange(r) + 0.5) * (box[3] - box[1]) / r - 0.5
    small = np.array([[bilinear(full[..., None], y, x)[0] for x in xs] for y in ys])
    pasted = paste_mask(small, box, h, w)
    iou = np.logical_and(pasted, full).sum() / np.logical_or(pasted, full).sum()
    assert iou > 0.95
    assert pasted[:15].sum() == 0 and pasted[:, :20].sum() == 0  # nothing outside the box


def predictor(overrides: list[str]):
    from mrcnn.model import OUTPUT_NAMES, MaskRCNN
    from tensorpack.predict import OfflinePredictor, PredictConfig

    cfg = build_config("tiny", overrides)
    return OfflinePredictor(
        PredictConfig(model=MaskRCNN(cfg, 4), input_names=["image"], output_names=list(OUTPUT_NAMES))
    ), cfg


def test_inference_graph_outputs_are_consistent() -> None:
    image = np.random.default_rng(0).uniform(0, 255, (100, 120, 3)).astype(np.uint8)  # not a multiple of 32
    predict, cfg = predictor([])
    boxes, scores, labels, masks = predict(image)
    k = len(boxes)
    assert 0 < k <= cfg.test_max_detections  # an untrained head scores every class near 1/4 > 0.05
    assert scores.shape == (k,) and labels.shape == (k,) and masks.shape == (k, 14, 14)
    assert np.all(np.diff(scores) <= 0) and np.all(scores > cfg.test_score_thresh)
    assert set(labels.tolist()) <= {1, 2, 3}
    assert np.all(boxes >= 0) and np.all(boxes[:, [0, 2]] <= 120) and np.all(boxes[:, [1, 3]] <= 100)
    assert np.all((masks >= 0) & (masks <= 1))


def test_heads_accept_zero_boxes() -> None:
    """An image without detections (or without foreground ROIs) must not break the graph."""
    from mrcnn.model import box_head, mask_head

    cfg = build_config("tiny", [])
    rng = np.random.default_rng(2)

    def build():
        feats = [
            tf.constant(rng.normal(size=(1, 32 // 2**i, 32 // 2**i, 32)).astype(np.float32)) for i in range(5)
        ]
        rois = tf.zeros([0, 4])
        logits, deltas = box_head(feats, rois, cfg, 4)
        masks = mask_head(feats, rois, tf.zeros([0], tf.int64), cfg, 4)
        with tf.control_dependencies([logits, deltas, masks]):
            init = tf1.global_variables_initializer()
        return init, logits, deltas, masks

    with tf.Graph().as_default():
        init, *outs = build()
        with tf1.Session() as sess:
            sess.run(init)
            logits, deltas, masks = sess.run(outs)
    assert logits.shape == (0, 4) and deltas.shape == (0, 4, 4) and masks.shape == (0, 14, 14)
