"""Validate a local COCO 2017 directory: pure functions over parsed annotation JSON and a file listing.

The result is a typed, frozen description of what to stage (which local file goes to which key under the
prefix, with its size); checksums are added later (checksums.py), because hashing reads every byte.
"""

from __future__ import annotations

import json
import os
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from .errors import DATA_ERROR, IO_ERROR, NO_INPUT, StageError

MAX_SINGLE_PUT = 5 * 1024**3  # S3's limit for one PutObject; larger files would need multipart (not done)


@dataclass(frozen=True)
class Split:
    """One COCO split: its image directory and annotation file (relative to the source root) and channel."""

    channel: str  # "train" -> s3://BUCKET/PREFIX/train/
    image_dir: str  # "train2017"
    annotation_file: str  # "annotations/instances_train2017.json"


COCO_2017 = (
    Split("train", "train2017", "annotations/instances_train2017.json"),
    Split("val", "val2017", "annotations/instances_val2017.json"),
)
ANNOTATIONS_CHANNEL = "annotations"
PRETRAINED_CHANNEL = "pretrained"


@dataclass(frozen=True)
class LocalFile:
    key: str  # relative to the prefix, e.g. "train/000000000009.jpg"
    path: Path
    size: int


@dataclass(frozen=True)
class AnnotationIndex:
    """What staging needs from one annotation file: the image files it references, and counts to print."""

    file_names: tuple[str, ...]  # in 'images' order, unique
    images: int
    annotations: int
    crowd: int
    categories: int
    images_without_annotations: int


@dataclass(frozen=True)
class SplitSummary:
    split: Split
    index: AnnotationIndex
    unreferenced: int  # files in the image directory that no image entry names (not staged)

    def describe(self) -> str:
        i = self.index
        extra = f"; {self.unreferenced} unreferenced files not staged" if self.unreferenced else ""
        return (
            f"{self.split.channel}: {i.images} images ({i.images_without_annotations} without annotations), "
            f"{i.annotations} annotations ({i.crowd} crowd), {i.categories} categories{extra}"
        )


@dataclass(frozen=True)
class WeightsSummary:
    file: LocalFile
    arrays: int

    def describe(self) -> str:
        return f"{PRETRAINED_CHANNEL}: {self.file.path.name}, {self.arrays} arrays, {self.file.size} bytes"


@dataclass(frozen=True)
class Layout:
    splits: tuple[SplitSummary, ...]
    weights: WeightsSummary | None
    files: tuple[LocalFile, ...]  # sorted by key


def parse_json(raw: bytes, source: str) -> Any:
    """json.loads with every way it fails as one StageError: bad bytes or syntax, nesting beyond Python's
    recursion limit, an integer of more digits than Python converts."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise StageError(f"{source}: not valid JSON (nested too deeply)", DATA_ERROR) from None
    except ValueError as e:  # UnicodeDecodeError, JSONDecodeError, "Exceeds the limit (4300 digits) ..."
        raise StageError(f"{source}: not valid JSON ({e})", DATA_ERROR) from None


def _fail(source: str, what: str) -> StageError:
    return StageError(f"{source}: {what}", DATA_ERROR)


def _int(item: Mapping[str, Any], field: str, source: str, where: str) -> int:
    value = item.get(field)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(source, f"{where}: expected an integer '{field}', got {value!r}")
    return value


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _safe_relative(name: str) -> bool:
    p = PurePosixPath(name)
    return bool(name) and not p.is_absolute() and ".." not in p.parts and "\\" not in name


def _categories(data: list[Any], source: str) -> set[int]:
    categories: set[int] = set()
    for c in data:
        if not isinstance(c, dict):
            raise _fail(source, f"categories: expected objects, got {c!r}")
        categories.add(_int(c, "id", source, "category"))
    if not categories:
        raise _fail(source, "'categories' is empty")
    return categories


def _images(data: list[Any], source: str) -> dict[int, str]:
    image_ids: dict[int, str] = {}
    for img in data:
        if not isinstance(img, dict):
            raise _fail(source, f"images: expected objects, got {img!r}")
        image_id = _int(img, "id", source, "image")
        where = f"image id {image_id}"
        name = img.get("file_name")
        if not isinstance(name, str) or not _safe_relative(name):
            raise _fail(source, f"{where}: 'file_name' must be a relative path, got {name!r}")
        for field in ("width", "height"):
            if _int(img, field, source, where) <= 0:
                raise _fail(source, f"{where}: '{field}' must be positive")
        if image_id in image_ids:
            raise _fail(source, f"{where}: duplicate image id")
        image_ids[image_id] = name
    return image_ids


def _annotation(
    ann: Any, source: str, image_ids: Mapping[int, str], categories: set[int]
) -> tuple[int, bool]:
    """(image id, is crowd) of one checked annotation."""
    if not isinstance(ann, dict):
        raise _fail(source, f"annotations: expected objects, got {ann!r}")
    where = f"annotation id {ann.get('id')!r}"
    image_id = _int(ann, "image_id", source, where)
    if image_id not in image_ids:
        raise _fail(source, f"{where}: image_id {image_id} is not in 'images'")
    category = _int(ann, "category_id", source, where)
    if category not in categories:
        raise _fail(source, f"{where}: category_id {category} is not in 'categories'")
    bbox = ann.get("bbox")
    if not (isinstance(bbox, list) and len(bbox) == 4 and all(_number(v) for v in bbox)):
        raise _fail(source, f"{where}: expected 'bbox' [x, y, w, h], got {bbox!r}")
    if not isinstance(ann.get("segmentation"), list | dict):
        raise _fail(
            source, f"{where}: expected 'segmentation' polygons or RLE, got {ann.get('segmentation')!r}"
        )
    crowd = ann.get("iscrowd", 0)
    if crowd not in (0, 1) or isinstance(crowd, bool):
        raise _fail(source, f"{where}: 'iscrowd' must be 0 or 1, got {crowd!r}")
    return image_id, crowd == 1


def index_annotations(data: Any, source: str) -> AnnotationIndex:
    """Check the structure of a COCO instances file (as parsed JSON) and index what staging needs."""
    if not isinstance(data, dict):
        raise _fail(source, "expected a JSON object with 'images', 'annotations', 'categories'")
    for field in ("images", "annotations", "categories"):
        if not isinstance(data.get(field), list):
            raise _fail(source, f"expected a list '{field}' (is this a COCO instances file?)")
    categories = _categories(data["categories"], source)
    image_ids = _images(data["images"], source)
    checked = [_annotation(a, source, image_ids, categories) for a in data["annotations"]]
    annotated = {image_id for image_id, _crowd in checked}
    return AnnotationIndex(
        file_names=tuple(dict.fromkeys(image_ids.values())),
        images=len(image_ids),
        annotations=len(checked),
        crowd=sum(crowd for _id, crowd in checked),
        categories=len(categories),
        images_without_annotations=len(image_ids) - len(annotated),
    )


def plan_split(
    split: Split, index: AnnotationIndex, root: Path, listing: Mapping[str, int]
) -> tuple[SplitSummary, tuple[LocalFile, ...]]:
    """Map every referenced image to a key; `listing` is the image directory's files (relative name -> size).

    A missing or empty image is an error naming the first one and the total, so nothing is staged."""
    missing = [n for n in index.file_names if n not in listing]
    if missing:
        raise StageError(
            f"{split.image_dir}/{missing[0]}: missing (referenced by {split.annotation_file}); "
            f"{len(missing)} of {len(index.file_names)} referenced images missing",
            NO_INPUT,
        )
    empty = [n for n in index.file_names if listing[n] == 0]
    if empty:
        raise StageError(f"{split.image_dir}/{empty[0]}: empty file; {len(empty)} empty images", DATA_ERROR)
    files = tuple(
        LocalFile(f"{split.channel}/{n}", root / split.image_dir / n, listing[n]) for n in index.file_names
    )
    unreferenced = len(set(listing) - set(index.file_names))
    return SplitSummary(split, index, unreferenced), files


def list_files(directory: Path) -> dict[str, int]:
    """Every regular file under `directory`: POSIX relative name -> size."""
    if not directory.is_dir():
        raise StageError(f"{directory}: no such directory", NO_INPUT)
    out: dict[str, int] = {}
    for dirpath, _dirs, filenames in os.walk(directory):
        base = Path(dirpath)
        for name in filenames:
            path = base / name
            try:
                st = path.stat()
            except OSError as e:
                raise StageError(f"{path}: cannot stat ({e.strerror})", IO_ERROR) from None
            out[path.relative_to(directory).as_posix()] = st.st_size
    return out


def read_bytes(path: Path, what: str) -> bytes:
    if not path.is_file():
        raise StageError(f"{path}: missing ({what})", NO_INPUT)
    try:
        return path.read_bytes()
    except OSError as e:
        raise StageError(f"{path}: cannot read ({e.strerror})", IO_ERROR) from None


def check_weights(path: Path) -> WeightsSummary:
    """A NumPy .npz (a zip of .npy members) with at least one array; its members are not decompressed."""
    if not path.is_file():
        raise StageError(f"{path}: missing (pretrained weights .npz)", NO_INPUT)
    try:
        with zipfile.ZipFile(path) as z:
            members = z.namelist()
    except (zipfile.BadZipFile, OSError) as e:
        raise StageError(f"{path}: not a NumPy .npz archive ({e})", DATA_ERROR) from None
    arrays = [m for m in members if m.endswith(".npy")]
    if not arrays or len(arrays) != len(members):
        raise StageError(f"{path}: not a NumPy .npz archive (expected only .npy members)", DATA_ERROR)
    return WeightsSummary(
        LocalFile(f"{PRETRAINED_CHANNEL}/{path.name}", path, path.stat().st_size), len(arrays)
    )


def validate(root: Path, weights: Path | None, splits: Sequence[Split] = COCO_2017) -> Layout:
    """Check a COCO-2017-layout directory (+ a weights file) and list what to stage, or raise StageError."""
    if not root.is_dir():
        raise StageError(f"{root}: no such directory (expected train2017/, val2017/, annotations/)", NO_INPUT)
    summaries: list[SplitSummary] = []
    files: list[LocalFile] = []
    for split in splits:
        ann_path = root / split.annotation_file
        raw = read_bytes(ann_path, "COCO instances annotations")
        index = index_annotations(parse_json(raw, split.annotation_file), split.annotation_file)
        del raw
        summary, images = plan_split(split, index, root, list_files(root / split.image_dir))
        summaries.append(summary)
        files.extend(images)
        name = PurePosixPath(split.annotation_file).name
        files.append(LocalFile(f"{ANNOTATIONS_CHANNEL}/{name}", ann_path, ann_path.stat().st_size))
    weights_summary = check_weights(weights) if weights is not None else None
    if weights_summary is not None:
        files.append(weights_summary.file)
    too_big = next((f for f in files if f.size > MAX_SINGLE_PUT), None)
    if too_big is not None:
        raise StageError(
            f"{too_big.path}: {too_big.size} bytes is over the 5 GiB single-PUT limit", DATA_ERROR
        )
    return Layout(tuple(summaries), weights_summary, tuple(sorted(files, key=lambda f: f.key)))
