"""Write a small COCO-2017-layout data set of real photographs with instance masks, offline.

    python make_photos.py --out DIR

The photographs are the sample images that ship inside the scikit-image wheel (skimage/data/, no download),
all public domain or CC0 by their authors' statements in scikit-image's docs: `coins` (Brooklyn Museum, no
known copyright restrictions), `hubble_deep_field` (NASA, public domain), `coffee` (Rachel Michetti, CC0),
`astronaut` (NASA, public domain), `chelsea` (Stefan van der Walt, CC0). The masks are computed from the
pixels, not drawn by hand, so they are as good as the segmentation below (close, not perfect):

- coin (category 1): watershed on the Sobel elevation of `coins`, seeded by dark and bright pixels, holes
  filled; one polygon per coin.
- galaxy (category 2): `hubble_deep_field` thresholded; each blob of >= 100 px is one galaxy as compressed
  RLE; the blobs of 20..99 px together are one crowd region (iscrowd=1, uncompressed RLE, as COCO writes
  crowds).
- cup (category 3): cup, saucer and spoon of `coffee` as one object: OpenCV's GrabCut started from a
  rectangle given here around the dish, its largest component; polygon.

DIR gets train2017/ (the full-size photos: coins as a grayscale JPEG, hubble, coffee, and astronaut without
annotations), val2017/ (crops of coins, hubble and coffee, segmented anew, and chelsea without annotations)
and annotations/instances_{train,val}2017.json: the layout `smhvd-stage-coco` stages. Needs scikit-image
(a dev/test requirement; the training script does not use it).
"""

from __future__ import annotations

import argparse
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from pycocotools import mask as mask_utils

CATEGORIES = ({"id": 1, "name": "coin"}, {"id": 2, "name": "galaxy"}, {"id": 3, "name": "cup"})
COIN, GALAXY, CUP = 1, 2, 3
JPEG_QUALITY = 92

Mask = np.ndarray[Any, np.dtype[np.bool_]]


@dataclass(frozen=True)
class Instance:
    category: int
    mask: Mask
    encoding: str  # "polygon", "rle" (compressed) or "crowd" (uncompressed RLE, iscrowd=1)


@dataclass(frozen=True)
class Photo:
    name: str  # the skimage.data function
    crop: tuple[int, int, int, int] | None  # y0, y1, x0, x1
    segment: Callable[[np.ndarray[Any, Any]], list[Instance]] | None  # None: no objects of our categories


def _components(mask: Mask, min_area: int) -> list[Mask]:
    """The 8-connected components of at least `min_area` pixels of a binary mask, each with holes filled."""
    count, labelled, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
    out = []
    for k in range(1, count):
        x, y, w, h, area = (int(v) for v in stats[k])
        if area < min_area:
            continue
        part = (labelled[y : y + h, x : x + w] == k).astype(np.uint8)
        contours, _ = cv2.findContours(part, cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_NONE)
        cv2.drawContours(part, contours, -1, (1,), thickness=cv2.FILLED)
        full = np.zeros(mask.shape, bool)
        full[y : y + h, x : x + w] = part > 0
        out.append(full)
    return out


def segment_coins(gray: np.ndarray[Any, Any]) -> list[Instance]:
    """Watershed from dark (background) and bright (coin) seeds; OpenCV floods along the colour gradient."""
    markers = np.zeros(gray.shape, np.int32)
    markers[gray < 30] = 1
    markers[gray > 150] = 2
    cv2.watershed(cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR), markers)
    return [Instance(COIN, m, "polygon") for m in _components(markers == 2, 200)]


def segment_galaxies(rgb: np.ndarray[Any, Any]) -> list[Instance]:
    gray = cv2.cvtColor(rgb, cv2.COLOR_RGB2GRAY)
    blobs = _components(gray > 80, 20)
    out = [Instance(GALAXY, m, "rle") for m in blobs if m.sum() >= 100]
    small = [m for m in blobs if m.sum() < 100]
    if small:
        out.append(Instance(GALAXY, np.logical_or.reduce(small), "crowd"))
    return out


def segment_cup(rgb: np.ndarray[Any, Any], rect: tuple[int, int, int, int]) -> list[Instance]:
    """GrabCut started from a hand-given rectangle (x, y, w, h) around the dish; its largest component."""
    state = np.zeros(rgb.shape[:2], np.uint8)
    models = (np.zeros((1, 65)), np.zeros((1, 65)))
    cv2.setRNGSeed(0)  # GrabCut's colour models start from k-means: the same masks on every run
    cv2.grabCut(cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), state, rect, *models, 5, cv2.GC_INIT_WITH_RECT)
    parts = _components((state == cv2.GC_FGD) | (state == cv2.GC_PR_FGD), 1)
    return [Instance(CUP, max(parts, key=lambda m: int(m.sum())), "polygon")] if parts else []


TRAIN = (
    Photo("coins", None, segment_coins),
    Photo("hubble_deep_field", None, segment_galaxies),
    Photo("coffee", None, functools.partial(segment_cup, rect=(70, 5, 500, 390))),
    Photo("astronaut", None, None),
)
VAL = (
    Photo("coins", (150, 303, 0, 384), segment_coins),
    Photo("hubble_deep_field", (400, 872, 450, 1000), segment_galaxies),
    Photo("coffee", (0, 400, 80, 480), functools.partial(segment_cup, rect=(0, 5, 400, 390))),
    Photo("chelsea", None, None),
)


def load_photo(name: str) -> np.ndarray[Any, Any]:
    """The photo as uint8 (H, W) grayscale or (H, W, 3) RGB, from the files inside the skimage wheel."""
    from skimage import data as skdata

    img = np.asarray(getattr(skdata, name)())
    if img.ndim == 3:
        img = img[:, :, :3]
    return img.astype(np.uint8)


def uncompressed_rle(mask: Mask) -> dict[str, Any]:
    """COCO's uncompressed RLE: run lengths over the column-major pixels, starting with a run of zeros."""
    flat = np.asfortranarray(mask).ravel(order="F").astype(np.int8)
    edges = np.flatnonzero(np.diff(flat)) + 1
    bounds = np.concatenate([[0], edges, [flat.size]])
    counts = np.diff(bounds).tolist()
    if flat[0]:
        counts = [0, *counts]
    return {"counts": counts, "size": list(mask.shape)}


def polygons(mask: Mask) -> list[list[float]]:
    """The outer contours as COCO polygons [x0, y0, x1, y1, ...] (at least 3 points each)."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [c.reshape(-1).astype(float).tolist() for c in contours if len(c) >= 3]


def annotation(inst: Instance, ann_id: int, image_id: int) -> dict[str, Any] | None:
    h, w = inst.mask.shape
    segmentation: Any
    if inst.encoding == "polygon":
        segmentation = polygons(inst.mask)
        if not segmentation:
            return None
        rle = mask_utils.merge(mask_utils.frPyObjects(segmentation, h, w))
    else:
        rle = mask_utils.encode(np.asfortranarray(inst.mask.astype(np.uint8)))
        if inst.encoding == "rle":
            segmentation = {"counts": rle["counts"].decode("ascii"), "size": [h, w]}
        else:
            segmentation = uncompressed_rle(inst.mask)
    area = float(mask_utils.area(rle))
    if area < 1:
        return None
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": inst.category,
        "segmentation": segmentation,
        "area": area,
        "bbox": [float(v) for v in mask_utils.toBbox(rle)],
        "iscrowd": int(inst.encoding == "crowd"),
    }


def write_split(out: Path, split: str, photos: tuple[Photo, ...], first_id: int) -> Path:
    (out / split).mkdir(parents=True, exist_ok=True)
    images: list[dict[str, Any]] = []
    anns: list[dict[str, Any]] = []
    for i, photo in enumerate(photos):
        image_id = first_id + i
        img = load_photo(photo.name)
        if photo.crop is not None:
            y0, y1, x0, x1 = photo.crop
            img = img[y0:y1, x0:x1]
        img = np.ascontiguousarray(img)
        name = f"{image_id:012d}.jpg"
        bgr = img if img.ndim == 2 else cv2.cvtColor(img, cv2.COLOR_RGB2BGR)
        if not cv2.imwrite(str(out / split / name), bgr, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY]):
            raise OSError(f"cannot write {out / split / name}")
        h, w = img.shape[:2]
        images.append({"id": image_id, "file_name": name, "height": h, "width": w, "source": photo.name})
        for inst in photo.segment(img) if photo.segment else []:
            entry = annotation(inst, first_id * 1000 + len(anns) + 1, image_id)
            if entry is not None:
                anns.append(entry)
    doc = {
        "info": {"description": "scikit-image sample photographs, masks by thresholding/watershed"},
        "licenses": [],
        "images": images,
        "annotations": anns,
        "categories": [dict(c, supercategory="thing") for c in CATEGORIES],
    }
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    path = out / "annotations" / f"instances_{split}.json"
    path.write_text(json.dumps(doc))
    return path


def generate(out: Path) -> dict[str, Path]:
    """Write train2017/, val2017/ and annotations/ under `out`; returns the annotation files by split."""
    return {
        "train2017": write_split(out, "train2017", TRAIN, first_id=1),
        "val2017": write_split(out, "val2017", VAL, first_id=101),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory (COCO 2017 layout)")
    a = p.parse_args(argv)
    for split, path in generate(a.out).items():
        doc = json.loads(path.read_text())
        crowd = sum(x["iscrowd"] for x in doc["annotations"])
        print(f"{split}: {len(doc['images'])} images, {len(doc['annotations'])} annotations ({crowd} crowd)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
