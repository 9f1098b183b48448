"""The Mask R-CNN script's input pipeline alone, on real full-size JPEGs: images/s per CPU core, next to
tensorpack's own (its FasterRCNN example's TrainingDataPreprocessor) on the same images and annotations, and
how many cores keep 8 GPUs fed at the published rate of tensorpack's Mask R-CNN.

    python benchmarks/maskrcnn_input.py [--tensorpack-example DIR] [--repeats 5] [--passes 3] [--preset coco]

One training example is what each data worker thread makes per image: ours is `mrcnn.data.train_example`
(JPEG decode, resize to the preset's shortest edge, flip with probability 1/2, masks rasterised at the resized
size, RPN anchor labels and deltas); tensorpack's is `TrainingDataPreprocessor.__call__` with the same sizes
(MODE_MASK, MODE_FPN, its packed masks included). Both run here, in one process, in one thread with OpenCV
limited to one thread, timed by the process's CPU time, so the figures are per core; each repeat times
`--passes` passes over the images for one side, then for the other, and the result is the median (and range)
of the repeats. DIR is a copy of tensorpack's examples/FasterRCNN (github.com/tensorpack/tensorpack), which is
not part of this repository; without it, only ours is measured.

Images: make_photos.py's photographs (scikit-image's bundled photos written as JPEG at full size, 384x153 to
1000x872 pixels; COCO's are about 640x480) with their objects; tensorpack's loader takes only polygons for
non-crowd objects, so the RLE-encoded ones are turned into polygons (their outer contours) for both sides.

Reference rate: tensorpack's benchmark of its Mask R-CNN (github.com/tensorpack/benchmarks,
MaskRCNN/README.md: R50-FPN, TRAINER=horovod, 8 V100s, total batch 8) reports "about 50 img/s"; that machine
had 80 CPU threads. The example's own np.bool / np.int (NumPy < 1.24) must be changed to bool / int in DIR.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CODE = REPO / "examples" / "maskrcnn"
sys.path.insert(0, str(CODE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # mrcnn.boxes imports TensorFlow

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from make_photos import generate  # noqa: E402
from mrcnn import anchors, data  # noqa: E402
from mrcnn import boxes as B  # noqa: E402
from mrcnn.config import build_config  # noqa: E402
from pycocotools import mask as mask_utils  # noqa: E402

PUBLISHED_IMAGES_PER_S = 50.0  # tensorpack/benchmarks MaskRCNN/README.md, 8 x V100, TRAINER=horovod
GPUS = 8


def as_polygons(rec: data.Record) -> data.Record:
    """The record with every RLE mask replaced by the polygons of its outer contours (objects left without
    one are dropped)."""
    keep, segs = [], []
    for k, seg in enumerate(rec.segmentations):
        if isinstance(seg, list):
            keep.append(k)
            segs.append(seg)
            continue
        rle = seg if isinstance(seg["counts"], str) else mask_utils.frPyObjects(seg, rec.height, rec.width)
        mask = np.ascontiguousarray(mask_utils.decode(rle), np.uint8)
        contours, _ = cv2.findContours(mask, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
        polys = [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]
        if polys:
            keep.append(k)
            segs.append(polys)
    return replace(rec, boxes=rec.boxes[keep], classes=rec.classes[keep], segmentations=tuple(segs))


def load_records(root: Path) -> list[data.Record]:
    if not (root / "annotations" / "instances_val2017.json").is_file():
        generate(root)
    recs = []
    for split in ("train", "val"):
        ds = data.load_dataset(root / f"{split}2017", None, root / "annotations", split)
        recs += [as_polygons(r) for r in data.records(ds, with_empty=False)]
    return [r for r in recs if len(r.segmentations)]


class Tensorpack:
    """tensorpack's TrainingDataPreprocessor (and its steps) with our preset's sizes, taking our records."""

    def __init__(self, example_dir: Path, cfg: Any, num_classes: int) -> None:
        sys.path.insert(0, str(example_dir))
        import common  # tensorpack's example: its own top-level modules
        from config import config as tp_cfg
        from data import TrainingDataPreprocessor
        from tensorpack.dataflow import imgaug

        tp_cfg.freeze(False)
        tp_cfg.MODE_MASK, tp_cfg.MODE_FPN = True, True
        tp_cfg.DATA.NUM_CATEGORY = num_classes
        tp_cfg.DATA.CLASS_NAMES = ["BG"] + [str(k) for k in range(1, num_classes + 1)]
        tp_cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE = [cfg.short_edge[0], cfg.short_edge[0]]
        tp_cfg.PREPROC.MAX_SIZE = float(cfg.max_size)
        tp_cfg.RPN.ANCHOR_SIZES = tuple(cfg.anchor_sizes)
        tp_cfg.RPN.ANCHOR_RATIOS = tuple(cfg.anchor_ratios)
        tp_cfg.RPN.NUM_ANCHOR = len(cfg.anchor_sizes) * len(cfg.anchor_ratios)
        tp_cfg.RPN.BATCH_PER_IM = cfg.rpn_batch_per_image
        tp_cfg.RPN.FG_RATIO = cfg.rpn_fg_ratio
        tp_cfg.RPN.POSITIVE_ANCHOR_THRESH, tp_cfg.RPN.NEGATIVE_ANCHOR_THRESH = (
            cfg.rpn_pos_iou,
            cfg.rpn_neg_iou,
        )
        tp_cfg.FPN.RESOLUTION_REQUIREMENT = 32
        tp_cfg.freeze()
        self.cfg, self.common, self.imgaug = tp_cfg, common, imgaug
        self.preprocess = TrainingDataPreprocessor(tp_cfg)

    @staticmethod
    def roidb(rec: data.Record) -> dict[str, Any]:
        """The record as tensorpack's COCO loader gives it (float32 boxes, polygons as float32 (n, 2))."""
        return {
            "file_name": rec.path,
            "boxes": rec.boxes.astype(np.float32),
            "class": rec.classes.astype(np.int32),
            "is_crowd": np.zeros(len(rec.boxes), np.int8),
            "segmentation": [
                [np.asarray(p, np.float32).reshape(-1, 2) for p in seg if len(p) >= 6]
                for seg in rec.segmentations
            ],
        }

    def run(self, rec: data.Record) -> Any:
        return self.preprocess(self.roidb(rec))

    def steps(self, rec: data.Record, flip: bool) -> tuple[dict[str, float], dict[str, Any]]:
        """The preprocessor's steps one at a time, as its __call__ runs them with the flip decided: CPU
        seconds of each and what they make (the RPN inputs as they are when the batch is not sampled only
        if the caller raised RPN.BATCH_PER_IM)."""
        roidb, spent, c = self.roidb(rec), {}, self.common
        t = time.process_time()
        im = cv2.imread(rec.path, cv2.IMREAD_COLOR).astype("float32")
        spent["decode"] = time.process_time() - t
        t = time.process_time()
        size, max_size = self.cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE, self.cfg.PREPROC.MAX_SIZE
        aug = self.imgaug.AugmentorList(
            [c.CustomResize(size, max_size), self.imgaug.Flip(horiz=True, prob=1.0 if flip else 0.0)]
        )
        tfms = aug.get_transform(im)
        im = tfms.apply_image(im)
        boxes = c.point4_to_box(tfms.apply_coords(c.box_to_point4(np.copy(roidb["boxes"]))))
        spent["resize and flip"] = time.process_time() - t
        t = time.process_time()
        mask_w = int(np.ceil(im.shape[1] / 8.0) * 8)
        masks = np.asarray(
            [c.polygons_to_mask([tfms.apply_coords(p) for p in polys], im.shape[0], mask_w)
             for polys in roidb["segmentation"]],
            np.uint8,
        )  # fmt: skip
        np.packbits(masks, axis=-1)
        spent["masks"] = time.process_time() - t
        t = time.process_time()
        rpn = self.preprocess.get_multilevel_rpn_anchor_input(im, boxes, roidb["is_crowd"])
        spent["anchor targets"] = time.process_time() - t
        made = {"image": im, "boxes": boxes, "masks": masks[:, :, : im.shape[1]], "rpn": rpn}
        return spent, made

    def unsampled(self, rec: data.Record, flip: bool) -> dict[str, Any]:
        """steps() with the RPN batch not sampled (every anchor's label shows)."""
        self.cfg.freeze(False)
        batch, self.cfg.RPN.BATCH_PER_IM = self.cfg.RPN.BATCH_PER_IM, 10**9
        try:
            return self.steps(rec, flip)[1]
        finally:
            self.cfg.RPN.BATCH_PER_IM = batch
            self.cfg.freeze()


def same_work(tp: Tensorpack, recs: list[data.Record], cfg: Any) -> list[str]:
    """What differs between our training example and tensorpack's for each image, plain and mirrored, with the
    RPN batch not sampled: the image size, boxes, every anchor's label, the foreground anchors' deltas,
    the masks (the images themselves: tensorpack resizes float32, ours uint8; at most 1 apart is expected)."""
    unsampled = replace(cfg, rpn_batch_per_image=10**9)
    out = []
    for rec in recs:
        for flip in (False, True):
            theirs = tp.unsampled(rec, flip)
            made = data.example(rec, unsampled, cfg.short_edge[0], flip, np.random.default_rng(0))
            if made is None:
                out.append(f"{rec.path} flip={flip}: ours made no example")
                continue
            image, labels, deltas, boxes, _, masks = made
            h, w = image.shape[:2]
            levels = anchors.levels(*data.padded_size(h, w), cfg.anchor_sizes, cfg.anchor_ratios)
            tp_labels = np.concatenate(
                [
                    lab[: lv.rows, : lv.cols].ravel()
                    for (lab, _), lv in zip(theirs["rpn"], levels, strict=True)
                ]
            )
            tp_gt = np.concatenate(
                [
                    bx[: lv.rows, : lv.cols].reshape(-1, 4)
                    for (_, bx), lv in zip(theirs["rpn"], levels, strict=True)
                ]
            )
            fg = np.flatnonzero(labels == 1)
            checks = {
                "size": image.shape == theirs["image"].shape,
                "boxes": np.array_equal(boxes, theirs["boxes"]),
                "anchor labels": np.array_equal(labels, tp_labels),
                "deltas": np.array_equal(
                    deltas[fg], B.np_encode(tp_gt[fg], anchors.anchor_boxes(levels, fg))
                ),
                "masks": masks.shape == theirs["masks"].shape and np.array_equal(masks, theirs["masks"]),
                "pixels within 1": np.abs(image.astype(np.float32) - theirs["image"]).max() <= 1,
            }
            out += [f"{Path(rec.path).name} flip={flip}: {k} differ" for k, ok in checks.items() if not ok]
    return out


def cpu_seconds(fn: Callable[[data.Record], Any], recs: list[data.Record], passes: int) -> float:
    start = time.process_time()
    for _ in range(passes):
        for rec in recs:
            if fn(rec) is None:
                raise RuntimeError(f"{rec.path}: no training example")
    return time.process_time() - start


def stages(rec: data.Record, cfg: Any, rng: np.random.Generator) -> dict[str, float]:
    """CPU seconds of each step of our example for one image (mirrored), the steps called one at a time."""
    out: dict[str, float] = {}
    t = time.process_time()
    img = data.read_image(rec.path)
    out["decode"] = time.process_time() - t
    t = time.process_time()
    h0, w0 = img.shape[:2]
    h, w = data.resized_shape(h0, w0, int(cfg.short_edge[0]), cfg.max_size)
    img = cv2.flip(cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR), 1)
    scale_xy = (w / w0, h / h0)
    boxes = data.flip_boxes(rec.boxes * np.array([*scale_xy, *scale_xy], np.float32), w)
    out["resize and flip"] = time.process_time() - t
    t = time.process_time()
    data.masks_of(list(rec.segmentations), h0, w0, scale_xy, (h, w), True)
    out["masks"] = time.process_time() - t
    t = time.process_time()
    anchors.rpn_targets(h, w, boxes, cfg, rng)
    out["anchor targets"] = time.process_time() - t
    return out


def step_table(
    names: list[str], tp: Tensorpack | None, recs: list[data.Record], cfg: Any, rng: np.random.Generator
) -> dict[str, dict[str, float]]:
    """CPU seconds per image of each step, for each side, printed as a table."""
    per_stage: dict[str, dict[str, float]] = {name: {} for name in names}
    for rec in recs:
        for _ in range(3):
            runs = {"ours": stages(rec, cfg, rng)}
            if tp is not None:
                runs["tensorpack"] = tp.steps(rec, flip=True)[0]
            for name, spent in runs.items():
                for step, seconds in spent.items():
                    per_stage[name][step] = per_stage[name].get(step, 0.0) + seconds / (3 * len(recs))
    print("maskrcnn-input: ms of CPU per image, by step (mirrored, mean of 3 per image):")
    print("maskrcnn-input:   " + f"{'':<16}" + "".join(f"{name:>12}" for name in names))
    for step in per_stage["ours"]:
        row = "".join(f"{per_stage[name][step] * 1000:12.1f}" for name in names)
        print(f"maskrcnn-input:   {step:<16}{row}")
    return per_stage


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--tensorpack-example", type=Path, help="a copy of tensorpack's examples/FasterRCNN")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per side (median, range)")
    p.add_argument("--passes", type=int, default=3, help="passes over the images per repeat")
    p.add_argument("--preset", default="coco", help="config preset whose image size is used (coco)")
    p.add_argument("--workdir", type=Path, default=REPO / "build" / "maskrcnn-input")
    a = p.parse_args(argv)
    cv2.setNumThreads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    cfg = replace(build_config(a.preset, []), flip=True)
    recs = load_records(a.workdir / "photos")
    objects = sum(len(r.segmentations) for r in recs)
    sizes = ", ".join(f"{r.width}x{r.height} ({len(r.segmentations)})" for r in recs)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    load = os.getloadavg()[0]
    print(f"maskrcnn-input: {datetime.date.today()} commit {commit or '?'}, load average {load:.2f}")
    print(f"maskrcnn-input: {len(recs)} JPEGs, {objects} objects (width x height (objects)): {sizes}")
    print(f"maskrcnn-input: preset {a.preset}: short edge {cfg.short_edge[0]}, max size {cfg.max_size}")

    rng = np.random.default_rng(0)
    sides: dict[str, Callable[[data.Record], Any]] = {"ours": lambda rec: data.train_example(rec, cfg, rng)}
    tp = None
    if a.tensorpack_example:
        num_classes = max(int(r.classes.max()) for r in recs)
        tp = Tensorpack(a.tensorpack_example.resolve(), cfg, num_classes)
        sides["tensorpack"] = tp.run
        differences = same_work(tp, recs, cfg)
        print(
            f"maskrcnn-input: same work: {2 * len(recs)} examples (each image plain and mirrored, the RPN "
            "batch not sampled) against tensorpack's: "
            + ("image sizes, boxes, every anchor's label, fg deltas, masks equal, pixels within 1"
               if not differences else "DIFFER: " + "; ".join(differences))
        )  # fmt: skip
    for fn in sides.values():  # warm: first decodes, lazy imports, tensorpack's anchor cache
        cpu_seconds(fn, recs, 1)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(a.repeats):
        for name, fn in sides.items():
            rates[name].append(a.passes * len(recs) / cpu_seconds(fn, recs, a.passes))

    per_stage = step_table(list(sides), tp, recs, cfg, rng)
    result: dict[str, Any] = {
        "date": str(datetime.date.today()),
        "commit": commit,
        "preset": a.preset,
        "images": len(recs),
        "objects": objects,
        "repeats": a.repeats,
        "passes": a.passes,
        "images_per_s_per_core": {k: [round(v, 2) for v in vs] for k, vs in rates.items()},
        "step_ms_per_image": {
            name: {k: round(v * 1000, 1) for k, v in steps.items()} for name, steps in per_stage.items()
        },
    }
    if tp is not None:
        result["same_work_differences"] = differences
    for name, values in rates.items():
        print(f"maskrcnn-input: {name}: {spread(values)} images/s per core (median of {a.repeats})")
    ours = statistics.median(rates["ours"])
    if "tensorpack" in rates:
        ratio = ours / statistics.median(rates["tensorpack"])
        result["ratio_ours_to_tensorpack"] = round(ratio, 2)
        print(f"maskrcnn-input: ours / tensorpack's, per core: {ratio:.2f}")
    per_gpu = PUBLISHED_IMAGES_PER_S / GPUS
    result["cores_per_gpu"] = round(per_gpu / ours, 2)
    print(
        f"maskrcnn-input: {GPUS} GPUs at {PUBLISHED_IMAGES_PER_S:g} images/s ({per_gpu:g} per GPU) need "
        f"{per_gpu / ours:.2f} cores of our input pipeline per GPU, "
        f"{PUBLISHED_IMAGES_PER_S / ours:.1f} in all"
    )
    a.workdir.mkdir(parents=True, exist_ok=True)
    (a.workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"maskrcnn-input: wrote {a.workdir / 'result.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
