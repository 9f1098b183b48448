"""Inference on images (resize, predict, scale back, paste masks) and COCO evaluation (bbox and segm)."""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from . import boxes as B
from .config import Config
from .data import read_image, resize, resize_scale

STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def linear_weights(coords: NDArray[Any], n: int) -> NDArray[Any]:
    """(len(coords), n): the weights that interpolate linearly between samples 0..n-1 at `coords` (index
    units), 0 outside them."""
    out = np.zeros((len(coords), n))
    lo = np.floor(coords).astype(np.int64)
    frac = coords - lo
    rows = np.arange(len(coords))
    for idx, weight in ((lo, 1.0 - frac), (lo + 1, frac)):
        ok = (idx >= 0) & (idx < n)
        out[rows[ok], idx[ok]] = weight[ok]
    return out


def paste_mask(mask: NDArray[Any], box: NDArray[Any], h: int, w: int, thresh: float = 0.5) -> NDArray[Any]:
    """Binary full-image mask from an R x R probability map covering `box`, as tensorpack's accurate paste
    (its eval._paste_mask): the map zero-padded by one cell and the box grown by that cell, so the mask fades
    out at the box's edge instead of extending its border; bilinear between cell centres, 0 outside."""
    out = np.zeros((h, w), np.uint8)
    r = mask.shape[0]
    padded = np.pad(mask.astype(np.float64), 1)
    grow = (r + 2) / r
    x1, y1, x2, y2 = (float(v) for v in box)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    half_w, half_h = max(x2 - x1, 1e-3) / 2 * grow, max(y2 - y1, 1e-3) / 2 * grow
    gx1, gy1, gx2, gy2 = cx - half_w, cy - half_h, cx + half_w, cy + half_h
    ix1, iy1 = max(math.floor(gx1), 0), max(math.floor(gy1), 0)
    ix2, iy2 = min(math.ceil(gx2), w), min(math.ceil(gy2), h)
    if ix2 <= ix1 or iy2 <= iy1:
        return out
    # Pixel centre x + 0.5 in map cells (cell k's centre at k), interpolated exactly (separably: two small
    # matrix products); an approximate remap flips pixels near the threshold on thin boxes.
    xs = (np.arange(ix1, ix2) + 0.5 - gx1) / (gx2 - gx1) * (r + 2) - 0.5
    ys = (np.arange(iy1, iy2) + 0.5 - gy1) / (gy2 - gy1) * (r + 2) - 0.5
    sampled = linear_weights(ys, r + 2) @ padded @ linear_weights(xs, r + 2).T
    out[iy1:iy2, ix1:ix2] = sampled >= thresh
    return out


def coco_results(
    image_id: int,
    boxes: NDArray[Any],
    scores: NDArray[Any],
    labels: NDArray[Any],
    masks: NDArray[Any] | None,
    category_ids: Sequence[int],
) -> list[dict[str, Any]]:
    """COCO result entries; `labels` are 1-based contiguous classes, `masks` full-image binary (k, h, w)."""
    out = []
    for i in range(len(boxes)):
        x1, y1, x2, y2 = (float(v) for v in boxes[i])
        entry: dict[str, Any] = {
            "image_id": int(image_id),
            "category_id": int(category_ids[int(labels[i]) - 1]),
            "bbox": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
            "score": round(float(scores[i]), 5),
        }
        if masks is not None:
            rle = mask_utils.encode(np.asfortranarray(masks[i].astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            entry["segmentation"] = rle
        out.append(entry)
    return out


def predict_image(
    predictor: Callable[..., Any], path: str, image_id: int, cfg: Config, category_ids: Sequence[int]
) -> list[dict[str, Any]]:
    """Run the model on one image file; results in the original image's coordinates."""
    img = read_image(path)
    h0, w0 = img.shape[:2]
    resized = resize(img, resize_scale(h0, w0, cfg.short_edge[0], cfg.max_size))
    boxes, scores, labels, masks = predictor(resized)  # BGR uint8, as the model takes it
    # One scale for both axes, the geometric mean of the two (they differ only by the resize's rounding), as
    # tensorpack's predict_image: the same model then gives the same boxes to the last decimal.
    scale = math.sqrt(resized.shape[0] / h0 * resized.shape[1] / w0)
    boxes = B.np_clip(boxes / np.float32(scale), h0, w0)
    full = (
        np.stack([paste_mask(m, b, h0, w0) for m, b in zip(masks, boxes, strict=True)])
        if len(boxes)
        else None
    )
    return coco_results(image_id, boxes, scores, labels, full, category_ids)


def coco_evaluate(coco_gt: COCO, results: list[dict[str, Any]], image_ids: Sequence[int]) -> dict[str, Any]:
    """COCOeval bbox and segm summaries (AP in [0, 1]) over `image_ids`."""
    out: dict[str, Any] = {}
    for iou_type in ("bbox", "segm"):
        if not results:
            out[iou_type] = dict.fromkeys(STAT_NAMES, 0.0)
            continue
        with contextlib.redirect_stdout(io.StringIO()) as text:
            dt = coco_gt.loadRes(results)
            ev = COCOeval(coco_gt, dt, iou_type)
            ev.params.imgIds = list(image_ids)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
        # COCOeval reports -1 where a figure is undefined (e.g. no large objects): null in the JSON.
        out[iou_type] = {k: (float(v) if v >= 0 else None) for k, v in zip(STAT_NAMES, ev.stats, strict=True)}
        out[iou_type + "_summary"] = text.getvalue().strip().splitlines()[-12:]
    return out
