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


def tensorpack_preprocessor(example_dir: Path, cfg: Any, num_classes: int) -> Callable[[data.Record], Any]:
    """tensorpack's TrainingDataPreprocessor with our preset's sizes, taking our records."""
    sys.path.insert(0, str(example_dir))
    from config import config as tp_cfg  # tensorpack's example: its own top-level modules
    from data import TrainingDataPreprocessor

    tp_cfg.freeze(False)
    tp_cfg.MODE_MASK, tp_cfg.MODE_FPN = True, True
    tp_cfg.DATA.NUM_CATEGORY = num_classes
    tp_cfg.DATA.CLASS_NAMES = ["BG"] + [str(k) for k in range(1, num_classes + 1)]
    tp_cfg.PREPROC.TRAIN_SHORT_EDGE_SIZE = [cfg.short_edge[0], cfg.short_edge[0]]
    tp_cfg.PREPROC.MAX_SIZE = float(cfg.max_size)  # finalize_configs rounds 1333 up to 1344 (ours: too)
    tp_cfg.RPN.NUM_ANCHOR = len(cfg.anchor_sizes) * len(cfg.anchor_ratios)
    tp_cfg.FPN.RESOLUTION_REQUIREMENT = 32
    tp_cfg.freeze()
    preprocess = TrainingDataPreprocessor(tp_cfg)

    def run(rec: data.Record) -> Any:
        roidb = {
            "file_name": rec.path,
            "boxes": rec.boxes.astype(np.float32),
            "class": rec.classes.astype(np.int32),
            "is_crowd": np.zeros(len(rec.boxes), np.int8),
            "segmentation": [
                [np.asarray(p, np.float32).reshape(-1, 2) for p in seg] for seg in rec.segmentations
            ],
        }
        return preprocess(roidb)

    return run


def cpu_seconds(fn: Callable[[data.Record], Any], recs: list[data.Record], passes: int) -> float:
    start = time.process_time()
    for _ in range(passes):
        for rec in recs:
            if fn(rec) is None:
                raise RuntimeError(f"{rec.path}: no training example")
    return time.process_time() - start


def stages(rec: data.Record, cfg: Any, rng: np.random.Generator) -> dict[str, float]:
    """CPU seconds of each step of train_example for one image (flipped), the steps called one at a time."""
    out: dict[str, float] = {}
    t = time.process_time()
    img = data.read_image(rec.path)
    out["decode"] = time.process_time() - t
    t = time.process_time()
    h0, w0 = img.shape[:2]
    scale = data.resize_scale(h0, w0, int(cfg.short_edge[0]), cfg.max_size)
    img = data.resize(img, scale)
    h, w = img.shape[:2]
    out["resize"] = time.process_time() - t
    t = time.process_time()
    cv2.flip(img, 1)
    boxes = data.flip_boxes(rec.boxes * np.float32(scale), w)
    out["flip"] = time.process_time() - t
    t = time.process_time()
    data.masks_of(list(rec.segmentations), h0, w0, scale, (h, w), True)
    out["masks"] = time.process_time() - t
    t = time.process_time()
    anchors.rpn_targets(h, w, boxes, cfg, rng)
    out["anchor targets"] = time.process_time() - t
    return out


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
    if a.tensorpack_example:
        num_classes = max(int(r.classes.max()) for r in recs)
        sides["tensorpack"] = tensorpack_preprocessor(a.tensorpack_example.resolve(), cfg, num_classes)
    for fn in sides.values():  # warm: first decodes, lazy imports, tensorpack's anchor cache
        cpu_seconds(fn, recs, 1)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for _ in range(a.repeats):
        for name, fn in sides.items():
            rates[name].append(a.passes * len(recs) / cpu_seconds(fn, recs, a.passes))

    per_stage: dict[str, float] = {}
    for rec in recs:
        for _ in range(3):
            for name, spent in stages(rec, cfg, rng).items():
                per_stage[name] = per_stage.get(name, 0.0) + spent / (3 * len(recs))
    print(
        "maskrcnn-input: ours, ms of CPU per image: "
        + ", ".join(f"{k} {v * 1000:.1f}" for k, v in per_stage.items())
    )
    result: dict[str, Any] = {
        "date": str(datetime.date.today()),
        "commit": commit,
        "preset": a.preset,
        "images": len(recs),
        "objects": objects,
        "repeats": a.repeats,
        "passes": a.passes,
        "images_per_s_per_core": {k: [round(v, 2) for v in vs] for k, vs in rates.items()},
        "stage_ms_per_image": {k: round(v * 1000, 1) for k, v in per_stage.items()},
    }
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
