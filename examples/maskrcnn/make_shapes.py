"""Generate a synthetic COCO-format instance segmentation data set: coloured shapes with polygon masks.

    python make_shapes.py --out DIR --n 64 [--size 128] [--seed 0]

writes DIR/annotations.json (COCO instances format: images, annotations with polygon `segmentation`, bbox,
area, iscrowd=0, categories circle/square/triangle) and DIR/images/NNNNN.png. Shapes do not overlap, so each
polygon is exactly the visible object and perfect predictions score AP 1.0.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from numpy.typing import NDArray

CATEGORIES = ("circle", "square", "triangle")


def _polygon(kind: str, cx: float, cy: float, r: float, angle: float) -> NDArray[Any]:
    corners = {"circle": 24, "square": 4, "triangle": 3}[kind]
    t = angle + np.arange(corners) * 2 * math.pi / corners
    return np.stack([cx + r * np.cos(t), cy + r * np.sin(t)], axis=1)


def make_image(
    rng: np.random.Generator, size: int, max_shapes: int
) -> tuple[NDArray[Any], list[dict[str, Any]]]:
    """One image (BGR uint8) and its objects: category index and polygon [x0, y0, x1, y1, ...]."""
    img = np.empty((size, size, 3), np.uint8)
    img[:] = rng.integers(0, 90, size=3)
    img += rng.integers(0, 25, size=img.shape, dtype=np.uint8)
    objects: list[dict[str, Any]] = []
    placed: list[tuple[float, float, float]] = []
    for _ in range(50):  # rejection sampling of non-overlapping discs
        if len(objects) >= rng.integers(1, max_shapes + 1):
            break
        r = float(rng.uniform(size * 0.08, size * 0.22))
        cx, cy = (float(v) for v in rng.uniform(r + 1, size - r - 1, size=2))
        if any(math.hypot(cx - x, cy - y) < r + q + 2 for x, y, q in placed):
            continue
        placed.append((cx, cy, r))
        cat = int(rng.integers(len(CATEGORIES)))
        poly = _polygon(CATEGORIES[cat], cx, cy, r, float(rng.uniform(0, 2 * math.pi)))
        # Round to what is drawn so that polygon, mask and pixels agree exactly.
        pts = np.round(poly).astype(np.int32)
        colour = tuple(int(c) for c in rng.integers(120, 256, size=3))
        cv2.fillPoly(img, [pts], colour)
        objects.append({"category": cat, "polygon": pts.astype(float).ravel().tolist()})
    return img, objects


def generate(out: Path, n: int, size: int = 128, seed: int = 0, max_shapes: int = 3) -> Path:
    """Write the data set; returns the annotation file's path."""
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    images: list[dict[str, Any]] = []
    annotations: list[dict[str, Any]] = []
    for i in range(n):
        img, objects = make_image(rng, size, max_shapes)
        name = f"{i:05d}.png"
        if not cv2.imwrite(str(out / "images" / name), img):
            raise OSError(f"cannot write {out / 'images' / name}")
        images.append({"id": i + 1, "file_name": name, "height": size, "width": size})
        for obj in objects:
            rle = mask_utils.merge(mask_utils.frPyObjects([obj["polygon"]], size, size))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": obj["category"] + 1,
                    "segmentation": [obj["polygon"]],
                    "area": float(mask_utils.area(rle)),
                    "bbox": [float(v) for v in mask_utils.toBbox(rle)],
                    "iscrowd": 0,
                }
            )
    doc = {
        "info": {"description": f"synthetic shapes, seed {seed}"},
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": c, "supercategory": "shape"} for i, c in enumerate(CATEGORIES)],
    }
    path = out / "annotations.json"
    path.write_text(json.dumps(doc))
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--n", type=int, default=64, help="number of images")
    p.add_argument("--size", type=int, default=128, help="image side in pixels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-shapes", type=int, default=3)
    a = p.parse_args(argv)
    if a.n < 1 or a.size < 32:
        p.error("--n must be >= 1 and --size >= 32")
    path = generate(a.out, a.n, a.size, a.seed, a.max_shapes)
    print(f"wrote {a.n} images and {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
