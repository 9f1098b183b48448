"""The Mask R-CNN script's input pipeline alone, on real full-size JPEGs: images/s per CPU core, and how many
cores keep 8 GPUs fed at the published rate of tensorpack's Mask R-CNN.

    python benchmarks/maskrcnn_input.py [--seconds 20] [--preset coco] [--workdir build/maskrcnn-input]

One training example is what each data worker thread makes per image: `mrcnn.data.train_example` (JPEG
decode, resize to the preset's shortest edge, flip with probability 1/2, masks rasterised at the resized
size, RPN anchor labels and deltas). It runs here in one thread with OpenCV limited to one thread, timed by
the process's CPU time, so the figure is per core. The per-stage split calls the same functions one at a
time. Images: make_photos.py's training and validation photographs (scikit-image's bundled photos written
as JPEG at full size, 153x384 to 872x1000 pixels; COCO's are about 640x480).

Reference rate: tensorpack's benchmark of its Mask R-CNN (github.com/tensorpack/benchmarks,
MaskRCNN/README.md: R50-FPN, TRAINER=horovod, 8 V100s, total batch 8) reports "about 50 img/s"; that machine
had 80 CPU threads. The cost per image grows with the number of objects (masks, anchor IoUs): COCO has about
7 per image; the per-photo figures show the range.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CODE = REPO / "examples" / "maskrcnn"
sys.path.insert(0, str(CODE))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # mrcnn.boxes imports TensorFlow

import cv2  # noqa: E402
import numpy as np  # noqa: E402
from make_photos import generate  # noqa: E402
from mrcnn import boxes as B  # noqa: E402
from mrcnn import data  # noqa: E402
from mrcnn.config import build_config  # noqa: E402

PUBLISHED_IMAGES_PER_S = 50.0  # tensorpack/benchmarks MaskRCNN/README.md, 8 x V100, TRAINER=horovod
GPUS = 8
COCO_OBJECTS_PER_IMAGE = 7.3  # COCO 2017 train: about 860k instance annotations on 118k images


def cpu_rate(fn: Callable[[], Any], seconds: float) -> tuple[int, float]:
    """Call fn until `seconds` of this process's CPU time have passed: (calls, CPU seconds)."""
    fn()  # warm caches (first decode, lazy imports)
    calls, start = 0, time.process_time()
    while (spent := time.process_time() - start) < seconds:
        fn()
        calls += 1
    return calls, spent


def stages(rec: data.Record, cfg: Any, rng: np.random.Generator) -> dict[str, float]:
    """CPU seconds of each step of train_example for one image, the steps called one at a time."""
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
    masks = np.stack([data.rasterize(s, h0, w0, scale, (h, w)) for s in rec.segmentations])
    out["masks"] = time.process_time() - t
    t = time.process_time()
    img, masks = np.ascontiguousarray(img[:, ::-1]), np.ascontiguousarray(masks[:, :, ::-1])
    out["flip+copy"] = time.process_time() - t
    t = time.process_time()
    anchors = B.np_anchors(*data.padded_size(h, w), cfg.anchor_sizes, cfg.anchor_ratios)
    data.rpn_targets(anchors, rec.boxes * np.float32(scale), cfg, rng)
    out["anchor targets"] = time.process_time() - t
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20.0, help="CPU seconds of the end-to-end measurement")
    p.add_argument("--preset", default="coco", help="config preset whose image size is used (coco)")
    p.add_argument("--workdir", type=Path, default=REPO / "build" / "maskrcnn-input")
    a = p.parse_args(argv)
    cv2.setNumThreads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    cfg = build_config(a.preset, [])
    root = a.workdir / "photos"
    if not (root / "annotations" / "instances_val2017.json").is_file():
        generate(root)
    recs = []
    for split in ("train", "val"):
        ds = data.load_dataset(root / f"{split}2017", None, root / "annotations", split)
        recs += data.records(ds, with_empty=False)
    rng = np.random.default_rng(0)
    sizes = ", ".join(f"{r.width}x{r.height} ({len(r.segmentations)} objects)" for r in recs)
    print(f"maskrcnn-input: {len(recs)} JPEGs at full size: {sizes}")
    print(f"maskrcnn-input: preset {a.preset}: short edge {cfg.short_edge}, max size {cfg.max_size}")

    per_stage: dict[str, float] = {}
    for rec in recs:
        for _ in range(3):
            for name, spent in stages(rec, cfg, rng).items():
                per_stage[name] = per_stage.get(name, 0.0) + spent / (3 * len(recs))
    per_photo, fit = {}, []
    for rec in recs:
        n, spent = cpu_rate(lambda rec=rec: data.train_example(rec, cfg, rng), a.seconds / 10)
        per_photo[f"{rec.width}x{rec.height}, {len(rec.segmentations)} objects"] = round(1000 * spent / n, 1)
        fit.append((len(rec.segmentations), spent / n))
    # CPU time per image ~ base + per-object cost (masks, anchor IoUs): the estimate at COCO's mean count.
    per_object, base = np.polyfit([f[0] for f in fit], [f[1] for f in fit], 1)
    coco_rate = 1.0 / (base + per_object * COCO_OBJECTS_PER_IMAGE)
    step = iter(range(1 << 62))

    def one() -> None:
        rec = recs[next(step) % len(recs)]
        if data.train_example(rec, cfg, rng) is None:
            raise RuntimeError(f"{rec.path}: no training example")

    calls, spent = cpu_rate(one, a.seconds)
    rate = calls / spent
    cores = PUBLISHED_IMAGES_PER_S / rate
    result = {
        "preset": a.preset,
        "images": [{"file": r.path, "width": r.width, "height": r.height} for r in recs],
        "examples": calls,
        "cpu_seconds": round(spent, 2),
        "images_per_s_per_core": round(rate, 2),
        "stage_ms_per_image": {k: round(v * 1000, 1) for k, v in per_stage.items()},
        "train_example_ms_per_photo": per_photo,
        "published_images_per_s_8_gpus": PUBLISHED_IMAGES_PER_S,
        "cores_to_feed_8_gpus": round(cores, 1),
        "fit_ms_base_and_per_object": [round(base * 1000, 1), round(per_object * 1000, 2)],
        "estimate_images_per_s_per_core_at_coco_objects": round(coco_rate, 1),
        "estimate_cores_to_feed_8_gpus_at_coco_objects": round(PUBLISHED_IMAGES_PER_S / coco_rate, 1),
    }
    split = ", ".join(f"{k} {v * 1000:.1f}" for k, v in per_stage.items())
    print(f"maskrcnn-input: per image, ms of CPU: {split}")
    for photo, ms in per_photo.items():
        print(f"maskrcnn-input: train_example on {photo}: {ms} ms of CPU")
    print(
        f"maskrcnn-input: train_example: {calls} images in {spent:.1f} CPU s = {rate:.1f} images/s per core"
    )
    print(
        f"maskrcnn-input: {GPUS} GPUs at {PUBLISHED_IMAGES_PER_S:g} images/s need {cores:.1f} cores of input "
        f"pipeline ({PUBLISHED_IMAGES_PER_S:g} / {rate:.1f}); {cores / GPUS:.2f} per GPU"
    )
    print(
        f"maskrcnn-input: estimate at COCO's {COCO_OBJECTS_PER_IMAGE} objects per image "
        f"(fit {base * 1000:.1f} ms"
        f" + {per_object * 1000:.2f} ms per object): {coco_rate:.1f} images/s per core, "
        f"{PUBLISHED_IMAGES_PER_S / coco_rate:.1f} cores for {GPUS} GPUs"
    )
    a.workdir.mkdir(parents=True, exist_ok=True)
    (a.workdir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"maskrcnn-input: wrote {a.workdir / 'result.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
