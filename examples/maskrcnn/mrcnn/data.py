"""COCO-format data: discovery in a channel directory, loading with pycocotools, augmentation, RPN targets,
and the per-rank tensorpack dataflow that feeds training."""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from numpy.typing import NDArray
from pycocotools import mask as mask_utils
from pycocotools.coco import COCO

from .anchors import rpn_targets
from .config import Config

# ImageNet's statistics, in the BGR order images are decoded and fed in.
PIXEL_MEAN_BGR = np.array([103.53, 116.28, 123.675], np.float32)
PIXEL_STD_BGR = np.array([57.375, 57.12, 58.395], np.float32)


class DataError(ValueError):
    """A data directory or annotation file that cannot be used (the message names it)."""


@dataclass(frozen=True)
class Dataset:
    """A COCO annotation file, the directory its `file_name`s are relative to, and the category mapping."""

    annotation_file: Path
    image_root: Path
    coco: COCO
    category_ids: tuple[int, ...]  # contiguous class k (1-based) <-> COCO category_ids[k - 1]

    @property
    def num_classes(self) -> int:
        """Foreground classes + background."""
        return len(self.category_ids) + 1


def find_annotation_file(
    data_dir: Path, explicit: str | None = None, annotations_dir: Path | None = None, split: str = "train"
) -> Path:
    """The annotation json for a channel: `explicit` (relative to data_dir, else to annotations_dir, where a
    leading `annotations/` may be left out), else the only *.json at the top level or in annotations/ of
    data_dir, else (the staged COCO layout: images in the channel, annotations in their own channel) the only
    `instances_<split>*.json` in annotations_dir."""
    if explicit:
        tried = [data_dir / explicit]
        if annotations_dir is not None:
            tried += [annotations_dir / explicit, annotations_dir / Path(explicit).name]
        found = next((p for p in tried if p.is_file()), None)
        if found is None:
            raise DataError(f"annotation file {' or '.join(map(str, dict.fromkeys(tried)))} does not exist")
        return found
    candidates = sorted(data_dir.glob("*.json")) or sorted((data_dir / "annotations").glob("*.json"))
    if not candidates and annotations_dir is not None:
        pattern = f"instances_{split}*.json"
        candidates = sorted(annotations_dir.glob(pattern))
        if len(candidates) != 1:
            raise DataError(
                f"{annotations_dir}: expected exactly one {pattern} for the images in {data_dir}, "
                f"found {len(candidates)}; name it with --{split}-json"
            )
    if len(candidates) != 1:
        raise DataError(
            f"{data_dir}: expected exactly one COCO annotation *.json (at the top or in annotations/), "
            f"found {len(candidates)}; name it with --train-json/--val-json"
        )
    return candidates[0]


def load_dataset(
    data_dir: Path,
    explicit_json: str | None = None,
    annotations_dir: Path | None = None,
    split: str = "train",
) -> Dataset:
    if not data_dir.is_dir():
        raise DataError(f"data directory {data_dir} does not exist")
    ann = find_annotation_file(data_dir, explicit_json, annotations_dir, split)
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress
        try:
            coco = COCO(str(ann))
        except (ValueError, KeyError, TypeError) as e:
            raise DataError(f"{ann}: not a COCO instances annotation file ({e})") from None
    if not coco.dataset.get("images") or not coco.dataset.get("categories"):
        raise DataError(f"{ann}: expected non-empty 'images' and 'categories'")
    first = coco.dataset["images"][0]["file_name"]
    roots = [data_dir / "images", data_dir, *sorted(p for p in data_dir.iterdir() if p.is_dir())]
    root = next((r for r in roots if (r / first).is_file()), None)
    if root is None:
        raise DataError(
            f"{ann}: image {first!r} not found under {data_dir} (tried images/, ., subdirectories)"
        )
    missing = [i["file_name"] for i in coco.dataset["images"] if not (root / i["file_name"]).is_file()]
    if missing:  # found now, not when a data worker reaches it hours into training
        raise DataError(f"{ann}: image {root / missing[0]} does not exist ({len(missing)} images missing)")
    return Dataset(ann, root, coco, tuple(sorted(coco.getCatIds())))


@dataclass(frozen=True)
class Record:
    """One image's ground truth, category ids mapped to contiguous classes 1..C; crowd regions dropped (as
    tensorpack's example does with its default RPN.CROWD_OVERLAP_THRESH, which disables them)."""

    image_id: int
    path: str
    height: int
    width: int
    boxes: NDArray[Any]  # (G, 4) x1 y1 x2 y2
    classes: NDArray[Any]  # (G,) int64
    segmentations: tuple[Any, ...]  # polygons (list of lists) or RLE, per object


def clipped_box(bbox: list[float], width: int, height: int) -> tuple[float, float, float, float]:
    """A COCO [x, y, w, h] as x1, y1, x2, y2 clipped to the image."""
    x, y, w, h = map(float, bbox)
    return (min(max(x, 0), width), min(max(y, 0), height), min(max(x + w, 0), width),
            min(max(y + h, 0), height))  # fmt: skip


def records(ds: Dataset, with_empty: bool) -> list[Record]:
    """The images' ground truth. An object is kept, as tensorpack's COCO loader keeps it, when it is not
    crowd nor marked `ignore`, its area is > 1 and its box clipped to the image is not empty."""
    cat_to_class = {c: i + 1 for i, c in enumerate(ds.category_ids)}
    out = []
    for img_id in sorted(ds.coco.getImgIds()):
        info = ds.coco.imgs[img_id]
        width, height = int(info["width"]), int(info["height"])
        anns, kept = [], []
        for a in ds.coco.imgToAnns.get(img_id, []):
            if a.get("iscrowd", 0) or a.get("ignore", 0) == 1:
                continue
            box = clipped_box(a["bbox"], width, height)
            if (
                a.get("area", (box[2] - box[0]) * (box[3] - box[1])) > 1
                and box[2] > box[0]
                and box[3] > box[1]
            ):
                anns.append(a)
                kept.append(box)
        if not anns and not with_empty:
            continue
        bx = np.array(kept, np.float32).reshape(-1, 4)
        out.append(
            Record(
                image_id=img_id,
                path=str(ds.image_root / info["file_name"]),
                height=height,
                width=width,
                boxes=bx,
                classes=np.array([cat_to_class[a["category_id"]] for a in anns], np.int64),
                segmentations=tuple(a["segmentation"] for a in anns),
            )
        )
    return out


def read_image(path: str) -> NDArray[Any]:
    """BGR uint8, as OpenCV decodes it (and as the model takes it: no conversion)."""
    bgr = cv2.imread(path, cv2.IMREAD_COLOR)
    if bgr is None:
        raise DataError(f"cannot read image {path}")
    return np.asarray(bgr)


def resized_shape(h: int, w: int, short_edge: int, max_size: int) -> tuple[int, int]:
    """(height, width) of an h x w image resized so that its short edge is `short_edge` without the long edge
    exceeding `max_size`, rounded as tensorpack's example rounds them (common.CustomResize)."""
    scale = short_edge / min(h, w)
    new_h, new_w = (float(short_edge), scale * w) if h < w else (scale * h, float(short_edge))
    if max(new_h, new_w) > max_size:
        shrink = max_size / max(new_h, new_w)
        new_h, new_w = new_h * shrink, new_w * shrink
    return int(new_h + 0.5), int(new_w + 0.5)


def resize_scale(h: int, w: int, short_edge: int, max_size: int) -> float:
    """Scale that makes the short edge `short_edge` without the long edge exceeding `max_size`."""
    return min(short_edge / min(h, w), max_size / max(h, w))


def resize(img: NDArray[Any], scale: float) -> NDArray[Any]:
    h, w = img.shape[:2]
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(cv2.resize(img, size, interpolation=cv2.INTER_LINEAR))


def padded_size(h: int, w: int) -> tuple[int, int]:
    return (-(-h // 32) * 32, -(-w // 32) * 32)


def flip_boxes(boxes: NDArray[Any], w: int) -> NDArray[Any]:
    """Boxes of an image of width w mirrored left-right."""
    return np.stack([w - boxes[:, 2], boxes[:, 1], w - boxes[:, 0], boxes[:, 3]], axis=1)


def rasterize(
    segmentation: Any, h0: int, w0: int, scale_xy: tuple[float, float], out_hw: tuple[int, int], flip: bool
) -> NDArray[Any]:
    """A binary mask at the resized image size, mirrored left-right when `flip`. Polygons are scaled (and
    mirrored) before rasterising, in float32 as tensorpack's example transforms them: no copy of a mirrored
    mask, and the same pixels as its masks."""
    h, w = out_hw
    if isinstance(segmentation, list):
        scale = np.array(scale_xy, np.float32)
        polys = []
        for p in segmentation:
            if len(p) < 6:
                continue
            xy = np.asarray(p, np.float32).reshape(-1, 2) * scale
            if flip:
                xy[:, 0] = np.float32(w) - xy[:, 0]
            polys.append(xy.ravel().tolist())
        if not polys:  # degenerate annotation: no area
            return np.zeros((h, w), np.uint8)
        return np.asarray(mask_utils.decode(mask_utils.merge(mask_utils.frPyObjects(polys, h, w))))
    rle = (
        segmentation
        if isinstance(segmentation["counts"], str)
        else mask_utils.frPyObjects(segmentation, h0, w0)
    )
    m = np.asarray(cv2.resize(mask_utils.decode(rle), (w, h), interpolation=cv2.INTER_NEAREST))
    return m[:, ::-1] if flip else m


def masks_of(
    segmentations: list[Any],
    h0: int,
    w0: int,
    scale_xy: tuple[float, float],
    out_hw: tuple[int, int],
    flip: bool,
) -> NDArray[Any]:
    """(G, h, w) uint8, each object's mask written once into the batch array. pycocotools decodes in column
    order: OpenCV's transpose turns that into rows 5x faster than a NumPy copy."""
    out = np.empty((len(segmentations), *out_hw), np.uint8)
    for k, seg in enumerate(segmentations):
        mask = rasterize(seg, h0, w0, scale_xy, out_hw, flip)
        if mask.flags.f_contiguous and not mask.flags.c_contiguous:
            cv2.transpose(mask.T, dst=out[k])
        else:
            out[k] = mask
    return out


def train_example(rec: Record, cfg: Config, rng: np.random.Generator) -> list[NDArray[Any]] | None:
    """One training datapoint: [image (BGR uint8), anchor_labels, anchor_deltas, gt_boxes, gt_labels,
    gt_masks]: the image resized to a random short edge of cfg.short_edge and mirrored with probability 1/2,
    the boxes and masks with it, RPN targets for every anchor (mrcnn/anchors.py). None (the image is
    skipped) when no box is left or no anchor is background, as tensorpack's example skips such images."""
    short_edge = int(rng.choice(cfg.short_edge))
    return example(rec, cfg, short_edge, bool(cfg.flip and rng.random() < 0.5), rng)


def example(
    rec: Record, cfg: Config, short_edge: int, flip: bool, rng: np.random.Generator
) -> list[NDArray[Any]] | None:
    """train_example with its random choices made: the short edge, mirrored or not (`rng` samples the RPN
    batch)."""
    img = read_image(rec.path)
    h0, w0 = img.shape[:2]
    h, w = resized_shape(h0, w0, short_edge, cfg.max_size)
    img = np.asarray(cv2.resize(img, (w, h), interpolation=cv2.INTER_LINEAR))
    scale_xy = (w / w0, h / h0)  # each axis by its own ratio, as the pixels moved
    boxes = rec.boxes * np.array([*scale_xy, *scale_xy], np.float32)
    if flip:
        img = np.asarray(cv2.flip(img, 1))
        boxes = flip_boxes(boxes, w)
    keep = np.flatnonzero((boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1]))
    if not len(keep):
        return None
    boxes = np.ascontiguousarray(boxes[keep], np.float32)
    labels, deltas = rpn_targets(h, w, boxes, cfg, rng)
    if not (labels == 0).any():
        return None
    masks = masks_of([rec.segmentations[k] for k in keep], h0, w0, scale_xy, (h, w), flip)
    return [img, labels, deltas, boxes, rec.classes[keep], masks]


def train_dataflow(recs: list[Record], cfg: Config, rank: int, size: int) -> Any:
    """This rank's shard, shuffled every pass, decoded and augmented by `cfg.data_workers` threads."""
    from tensorpack.dataflow import DataFromList, MapData, MultiThreadMapData

    shard = recs[rank::size]
    if not shard:
        raise DataError(f"rank {rank}: no training images in its shard ({len(recs)} images for {size} ranks)")
    rng = np.random.default_rng(cfg.seed + 1000 * rank)
    ds = DataFromList(shard, shuffle=True)

    def fn(rec: Record) -> list[NDArray[Any]] | None:
        return train_example(rec, cfg, np.random.default_rng(rng.integers(1 << 62)))

    if cfg.data_workers > 1:
        return MultiThreadMapData(
            ds, num_thread=cfg.data_workers, map_func=fn, buffer_size=8 * cfg.data_workers
        )
    return MapData(ds, fn)
