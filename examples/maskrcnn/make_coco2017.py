"""Write a tiny data set in the COCO 2017 layout, offline, for trying a Mask R-CNN job in minutes.

    python make_coco2017.py --out DIR [--source shapes] [--train 16] [--val 4] [--size 160] [--seed 0]
    python make_coco2017.py --out DIR --source photos

DIR gets the layout of the official COCO 2017 download, which `smhvd-stage-coco` stages and both Mask R-CNN
paths read (this directory's train_maskrcnn.py from the staged channels, tensorpack's examples/FasterRCNN
from `DATA.BASEDIR`):

    DIR/annotations/instances_train2017.json   DIR/train2017/*.png (or *.jpg)
    DIR/annotations/instances_val2017.json     DIR/val2017/...

- `shapes` (the default): make_shapes.py's synthetic coloured circles, squares and triangles, polygon masks
  only (the only kind tensorpack's COCO loader accepts for non-crowd objects), square images of --size
  pixels, categories 1-3; train and val are drawn with different seeds (--seed and --seed + 1).
- `photos`: make_photos.py's scikit-image photographs (coins, galaxies, a cup; polygons, compressed RLE and a
  crowd region; needs scikit-image). Its RLE objects are refused by tensorpack's loader: use it with this
  directory's train_maskrcnn.py.

DIR must be empty or absent. Needs OpenCV and pycocotools (the venv of `make setup`, or the image).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import make_photos
import make_shapes

SPLITS = ("train2017", "val2017")


class LayoutError(ValueError):
    """An output directory that cannot be used (the message names it)."""


def annotation_file(out: Path, split: str) -> Path:
    return out / "annotations" / f"instances_{split}.json"


def check_empty(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise LayoutError(f"--out {out}: not an empty directory (the data set is written into a fresh one)")


def write_shapes(out: Path, counts: dict[str, int], size: int, seed: int) -> None:
    """make_shapes.py's DIR/images/ + DIR/annotations.json per split, moved into the COCO 2017 layout."""
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    for offset, split in enumerate(SPLITS):
        scratch = out / f".{split}.partial"
        written = make_shapes.generate(scratch, counts[split], size=size, seed=seed + offset)
        doc = json.loads(written.read_text())
        doc["info"]["description"] += f", {split} of the COCO 2017 layout"
        annotation_file(out, split).write_text(json.dumps(doc))
        (scratch / "images").replace(out / split)
        shutil.rmtree(scratch)


def generate(out: Path, source: str, counts: dict[str, int], size: int, seed: int) -> dict[str, Path]:
    """Write the set; returns the annotation file of each split."""
    check_empty(out)
    if source == "photos":
        make_photos.generate(out)
    else:
        write_shapes(out, counts, size, seed)
    return {split: annotation_file(out, split) for split in SPLITS}


def summary(out: Path, split: str, path: Path) -> str:
    doc = json.loads(path.read_text())
    return (
        f"{out / split}/: {len(doc['images'])} images, {len(doc['annotations'])} annotations"
        f" ({len(doc['categories'])} categories) in {path}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="output directory (empty or absent)")
    p.add_argument("--source", choices=("shapes", "photos"), default="shapes", help="default: shapes")
    p.add_argument("--train", type=int, default=16, help="shapes: training images (default 16)")
    p.add_argument("--val", type=int, default=4, help="shapes: validation images (default 4)")
    p.add_argument("--size", type=int, default=160, help="shapes: image side in pixels (default 160)")
    p.add_argument("--seed", type=int, default=0, help="shapes: seed of train2017 (val2017: seed + 1)")
    a = p.parse_args(argv)
    if a.train < 1 or a.val < 1 or a.size < 32:
        p.error("--train and --val must be >= 1 and --size >= 32")
    try:
        files = generate(a.out, a.source, {"train2017": a.train, "val2017": a.val}, a.size, a.seed)
    except LayoutError as e:
        print(f"make_coco2017: error: {e}", file=sys.stderr)
        return 2
    for split, path in files.items():
        print(summary(a.out, split, path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
