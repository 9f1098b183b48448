"""tensorpack's published COCO Mask R-CNN in the reference script: its 307 arrays load by name and shape into
the coco preset (evaluation and fine-tuning), and each convention that gives an array its meaning is checked
against a numpy reading of tensorpack's definition (examples/FasterRCNN at 1547a54e): AlignPadding in the stem
and the stride-2 convs, fc6's (C, H, W) rows, ROIAlign at the border, the zero-padded mask paste, the coco
preset's sizes and BGR input. (Anchor centres are in test_maskrcnn_boxes.py.)

The by-hand check behind these (tensorpack's own predict path and this script on the same photographs with the
same 307 seeded arrays, every detection matched) is in docs; it needs tensorpack's example, which is not part
of this repository."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from make_standin_weights import load_shapes, seeded_arrays, write_npz
from mrcnn.config import build_config
from mrcnn.evaluation import paste_mask
from mrcnn.model import OUTPUT_NAMES, MaskRCNN, align_pad, box_head, multilevel_roi_align, roi_align, stem
from mrcnn.weights import model_init, pretrained_init
from tensorpack.tfutils.tower import PredictTowerContext

from .test_maskrcnn_ops import bilinear, run_graph

# TensorFlow comes with the layers under test (about 10 s):
# the unit tier (make test-fast) imports none.
pytestmark = pytest.mark.integration

tf1 = tf.compat.v1
# The published file's names and shapes (examples/maskrcnn/published/), as lists like TensorFlow's shapes.
PUBLISHED = {name: list(shape) for name, shape in load_shapes().items()}


@pytest.fixture(scope="module")
def published_npz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("published") / "COCO-R50FPN-MaskRCNN-Standard.npz"
    write_npz(path, seeded_arrays(load_shapes()))  # what make_standin_weights.py writes
    return path


def model_variables(graph: tf.Graph) -> dict[str, list[int]]:
    return {
        v.op.name: v.shape.as_list()
        for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)
        if not v.op.name.startswith("global_step")
    }


def build_inference(
    num_classes: int, overrides: tuple[str, ...] = ()
) -> tuple[tf.Graph, tf.Tensor, list[tf.Tensor]]:
    graph = tf.Graph()
    cfg = build_config("coco", list(overrides))
    with graph.as_default():
        image = tf1.placeholder(tf.uint8, [None, None, 3], "image")
        specs = MaskRCNN(cfg, num_classes).inputs()
        rest = [tf1.placeholder(s.dtype, s.shape, s.name) for s in specs[1:]]
        with PredictTowerContext(""):
            MaskRCNN(cfg, num_classes).build_graph(image, *rest)
        outputs = [graph.get_tensor_by_name(n + ":0") for n in OUTPUT_NAMES]
    return graph, image, outputs


def loaded_counts(lines: list[str]) -> tuple[int, int]:
    """(loaded, total) over the weights report's 'N of M arrays loaded' lines."""
    pairs = [
        tuple(map(int, m.groups()))
        for m in (re.search(r"(\d+) of (\d+) arrays loaded", x) for x in lines)
        if m
    ]
    return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


def test_the_coco_preset_has_exactly_the_published_checkpoints_arrays() -> None:
    graph, _, _ = build_inference(81)
    assert model_variables(graph) == PUBLISHED  # 307 names, each with the published shape


def test_all_307_arrays_load_through_the_evaluation_path_and_predict(published_npz: Path) -> None:
    graph, image, outputs = build_inference(81)
    lines: list[str] = []
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        model_init(published_npz, lines.append).init(sess)
        values = {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
        stored = np.load(published_npz)
        for name in ("conv0/W", "fastrcnn/fc6/W", "fastrcnn/outputs/class/b", "maskrcnn/conv/W"):
            np.testing.assert_array_equal(sess.run(values[name]), stored[name])
        photo = np.random.default_rng(1).uniform(0, 255, (96, 160, 3)).astype(np.uint8)
        boxes, scores, labels, masks = sess.run(outputs, {image: photo})
    assert loaded_counts(lines) == (307, 307), lines
    assert not any("unused" in x or "initialisation" in x for x in lines), lines
    assert boxes.shape == (len(scores), 4) and masks.shape == (len(scores), 28, 28)
    assert set(labels.tolist()) <= set(range(1, 81))


def test_fine_tuning_loads_what_fits_and_re_initialises_the_class_outputs(published_npz: Path) -> None:
    """The COCO model onto a 3-class data set: 301 arrays load, the 6 class-specific ones keep their
    initialisation, and the log says which, part by part."""
    graph, _, _ = build_inference(4)
    lines: list[str] = []
    with graph.as_default(), tf1.Session(graph=graph) as sess:
        sess.run(tf1.global_variables_initializer())
        values = {v.op.name: v for v in graph.get_collection(tf1.GraphKeys.GLOBAL_VARIABLES)}
        initial = sess.run(values["fastrcnn/outputs/class/W"])
        pretrained_init(published_npz, lines.append).init(sess)
        stored = np.load(published_npz)
        np.testing.assert_array_equal(sess.run(values["fastrcnn/fc7/W"]), stored["fastrcnn/fc7/W"])
        np.testing.assert_array_equal(sess.run(values["fastrcnn/outputs/class/W"]), initial)
    assert loaded_counts(lines) == (301, 307), lines
    assert f"weights {published_npz.name}: backbone: 265 of 265 arrays loaded" in lines
    assert (
        f"weights {published_npz.name}: box outputs: 0 of 4 arrays loaded; 4 re-initialised for another "
        "class count: 81 classes (with background) in the file, 4 in the model"
    ) in lines
    assert f"weights {published_npz.name}: mask outputs: 0 of 2 arrays loaded; 2 re-initialised" in " ".join(
        lines
    )


def test_the_coco_preset_uses_tensorpacks_sizes_and_colour_order() -> None:
    cfg = build_config("coco", [])
    assert cfg.bgr_input  # the published models take BGR
    assert (
        cfg.max_size == 1344
    )  # 1333 rounded up to the FPN's multiple of 32, as tensorpack's finalize_configs
    assert build_config("coco", ["max_size=1333"]).max_size == 1344
    assert cfg.rpn_train_pre_nms_topk == cfg.rpn_train_post_nms_topk == 2000
    assert (cfg.rpn_test_pre_nms_topk, cfg.rpn_test_post_nms_topk) == (1000, 1000)


def np_conv_centre_tap(x: np.ndarray, stride: int, before: int, after: int, k: int) -> np.ndarray:
    """Output (i, j) of a k x k conv whose kernel is the identity at its centre, over x padded `before` at the
    top/left and `after` at the bottom/right, VALID: the input pixel the window is centred on."""
    padded = np.pad(x, [(before, after), (before, after), (0, 0)])
    n_h = (padded.shape[0] - k) // stride + 1
    n_w = (padded.shape[1] - k) // stride + 1
    return padded[k // 2 : k // 2 + stride * n_h : stride, k // 2 : k // 2 + stride * n_w : stride]


def np_max_pool(x: np.ndarray, before: int, after: int) -> np.ndarray:
    padded = np.pad(x, [(before, after), (before, after), (0, 0)])
    n_h, n_w = (padded.shape[0] - 3) // 2 + 1, (padded.shape[1] - 3) // 2 + 1
    return np.array(
        [
            [padded[2 * i : 2 * i + 3, 2 * j : 2 * j + 3].max(axis=(0, 1)) for j in range(n_w)]
            for i in range(n_h)
        ]
    )


def test_the_stem_pads_as_tensorpacks_align_padding() -> None:
    """tensorpack (TF_PAD_MODE=False): pad 3 before and 2 after, 7x7 stride-2 VALID conv; pad 1 before,
    3x3 stride-2 VALID max-pool. TensorFlow's SAME would centre every output one pixel lower and further
    right."""
    cfg = build_config("tiny", ["norm=None", "resnet_width=3"])
    x = np.random.default_rng(3).uniform(0, 1, (1, 32, 64, 3)).astype(np.float32)
    kernel = np.zeros((7, 7, 3, 3), np.float32)
    kernel[3, 3] = np.eye(3)

    with tf.Graph().as_default():
        out = stem(tf.constant(x), cfg)
        variables = {v.op.name: v for v in tf1.global_variables()}
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            # The kernel is set in a run of its own: a control dependency on the output orders only the final
            # identity after the assignment, not the convolution's read of the kernel (it failed at times).
            variables["conv0/W"].load(kernel, sess)
            variables["conv0/b"].load(np.zeros(3, np.float32), sess)
            got = sess.run(out)[0]
    conv = np.maximum(np_conv_centre_tap(x[0], 2, 3, 2, 7), 0)  # conv0's ReLU
    np.testing.assert_allclose(got, np_max_pool(conv, 1, 0), atol=1e-6)
    assert got.shape == (8, 16, 3)


def test_a_stride_2_conv_pads_one_before() -> None:
    """The stride-2 3x3 conv of a bottleneck: pad 1 before, none after, VALID: output (i, j) is centred on
    input (2i, 2j); SAME on an even size would centre it on (2i+1, 2j+1)."""
    x = np.random.default_rng(4).normal(size=(1, 16, 12, 2)).astype(np.float32)
    kernel = np.zeros((3, 3, 2, 2), np.float32)
    kernel[1, 1] = np.eye(2)
    got = run_graph(lambda: tf.nn.conv2d(align_pad(tf.constant(x), 1, 0), kernel, 2, "VALID"))[0]
    np.testing.assert_allclose(got, x[0, ::2, ::2], atol=1e-6)
    np.testing.assert_allclose(got, np_conv_centre_tap(x[0], 2, 1, 0, 3), atol=1e-6)


def np_roi_align_border(feat: np.ndarray, box: np.ndarray, size: int) -> np.ndarray:
    """ROIAlign as tensorpack defines it at the border: the map padded by one replicated pixel, so a sample up
    to one pixel outside reads the border value; farther out, zero."""
    h, w = feat.shape[:2]
    padded = np.pad(feat, [(1, 1), (1, 1), (0, 0)], mode="edge")
    x1, y1, x2, y2 = box
    bw, bh = (x2 - x1) / size, (y2 - y1) / size
    out = np.zeros((size, size, feat.shape[2]))
    for i in range(size):
        for j in range(size):
            samples = []
            for a in range(2):
                for b in range(2):
                    y = y1 + (i + (a + 0.5) / 2) * bh - 0.5 + 1  # in the padded map
                    x = x1 + (j + (b + 0.5) / 2) * bw - 0.5 + 1
                    inside = 0 <= y <= h + 1 and 0 <= x <= w + 1
                    safe = np.pad(padded, [(0, 1), (0, 1), (0, 0)], mode="edge")  # bilinear reads y0+1
                    samples.append(bilinear(safe, y, x) if inside else np.zeros(feat.shape[2]))
            out[i, j] = np.mean(samples, axis=0)
    return out


def test_roi_align_reads_the_border_past_the_edge_of_the_map() -> None:
    rng = np.random.default_rng(5)
    feat = rng.normal(size=(10, 12, 2)).astype(np.float32) + 3.0  # far from zero: a zero read shows
    stride = 4
    rois = np.array([[0, 0, 20, 16], [30, 20, 48, 40], [-2, -2, 8, 6], [0.5, 35.0, 47.9, 39.9]], np.float32)
    got = run_graph(lambda: roi_align(tf.constant(feat[None]), tf.constant(rois), stride, 7))
    for k, roi in enumerate(rois):
        np.testing.assert_allclose(got[k], np_roi_align_border(feat, roi / stride, 7), atol=1e-4)
    assert got[0].min() > 0.5  # the corner ROI's outer samples read the border, not zero


def test_fc6_reads_roi_features_in_channel_row_column_order() -> None:
    """The published fc6 rows are indexed (c, h, w) (tensorpack's NCHW flatten): with the same kernel, the box
    head's fc6 equals relu(features in CHW order @ W + b)."""
    cfg = build_config("tiny", ["frcnn_fc_dim=5"])
    rng = np.random.default_rng(6)
    feats_np = [rng.normal(size=(1, 32 // 2**i, 32 // 2**i, 4)).astype(np.float32) for i in range(5)]
    rois_np = np.array([[10, 12, 50, 60], [0, 0, 120, 100]], np.float32)
    kernel = rng.normal(size=(4 * 7 * 7, 5)).astype(np.float32)
    with tf.Graph().as_default():
        feats = [tf.constant(f) for f in feats_np]
        rois = tf.constant(rois_np)
        box_head(feats, rois, cfg, 3)
        fc6 = tf1.get_default_graph().get_tensor_by_name("fastrcnn/fc6/output:0")
        roi_features = multilevel_roi_align(feats, rois, 7)  # (n, 7, 7, C)
        variables = {v.op.name: v for v in tf1.global_variables()}
        with tf1.Session() as sess:
            sess.run(tf1.global_variables_initializer())
            sess.run(variables["fastrcnn/fc6/W"].assign(kernel))
            got, pooled = sess.run([fc6, roi_features])
            bias = sess.run(variables["fastrcnn/fc6/b"])
    chw = pooled.transpose(0, 3, 1, 2).reshape(2, -1)
    np.testing.assert_allclose(got, np.maximum(chw @ kernel + bias, 0), rtol=1e-4, atol=1e-4)
    hwc = pooled.reshape(2, -1)
    assert not np.allclose(got, np.maximum(hwc @ kernel + bias, 0), atol=1e-2)  # the order matters


def test_an_all_ones_mask_pastes_to_its_box() -> None:
    """tensorpack pads the 28x28 mask with zeros by one cell and grows the box by that cell: the 0.5 level of
    an all-ones mask falls on the box's edges, so along the middle row and column the pasted mask holds the
    pixels whose centres are in the box (replicating the border would add about a pixel on every side), and
    nothing outside the box is set (bilinear rounds the corners inwards)."""
    box = np.array([10.3, 20.7, 50.2, 60.9])
    pasted = paste_mask(np.ones((28, 28), np.float32), box, 80, 70).astype(bool)
    ys, xs = np.mgrid[0:80, 0:70] + 0.5
    inside = (xs > box[0]) & (xs < box[2]) & (ys > box[1]) & (ys < box[3])
    np.testing.assert_array_equal(pasted[40], inside[40])
    np.testing.assert_array_equal(pasted[:, 30], inside[:, 30])
    assert not (pasted & ~inside).any()
