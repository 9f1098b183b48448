"""smhvd-stage-coco's documented exits that test_stage_coco.py does not reach, run as users run it: 74 (a
local file could not be read)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.s3 import stage_coco

pytestmark = pytest.mark.integration


def write_small_coco(root: Path) -> None:
    """The smallest COCO 2017 layout the tool accepts: one image per split, one category, no annotations."""
    for split in ("train2017", "val2017"):
        (root / split).mkdir(parents=True)
        (root / split / "000000000001.jpg").write_bytes(b"\xff\xd8 not decoded by the tool \xff\xd9")
        instances = {
            "images": [{"id": 1, "file_name": "000000000001.jpg", "width": 4, "height": 4}],
            "annotations": [],
            "categories": [{"id": 1, "name": "shape"}],
        }
        (root / "annotations").mkdir(exist_ok=True)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(instances))


def test_an_image_that_cannot_be_read_is_74_and_one_line(tmp_path: Path) -> None:
    """A symbolic link to a disk that is gone (datasets are often link farms): root reads any file, so this
    is how a read fails here. Nothing reaches S3 (no endpoint, no credentials: the tool stops before)."""
    root = tmp_path / "coco"
    write_small_coco(root)
    image = root / "val2017" / "000000000001.jpg"
    image.unlink()
    image.symlink_to(tmp_path / "unmounted" / "000000000001.jpg")
    result = stage_coco(tmp_path, str(root), "s3://bucket/coco", port=None, creds=False)
    assert result.returncode == 74, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines()[-1] == (
        f"smhvd-stage-coco: error: {image}: cannot stat (No such file or directory)"
    )


def test_the_small_layout_is_valid(tmp_path: Path) -> None:
    """The same tree with its image in place passes every local check and stops only at S3 (no credentials:
    77): the 74 above comes from the link alone."""
    root = tmp_path / "coco"
    write_small_coco(root)
    result = stage_coco(tmp_path, str(root), "s3://bucket/coco", port=None, creds=False)
    assert result.returncode == 77, result.stderr
    assert "smhvd-stage-coco: 4 files, " in result.stderr, result.stderr
