"""The pure parts of smhvd-stage-coco: layout checks, the plan, the diff against a listing, the manifest."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from smhvd_stage import errors
from smhvd_stage import manifest as M
from smhvd_stage.checksums import Md5Cache, StagedFile, checksum_all, md5_file
from smhvd_stage.errors import StageError
from smhvd_stage.layout import (
    COCO_2017,
    AnnotationIndex,
    Layout,
    LocalFile,
    check_weights,
    index_annotations,
    parse_json,
    plan_split,
)
from smhvd_stage.progress import Progress
from smhvd_stage.remote import Diff, RemoteObject, diff, matches, parse_s3_uri

SRC = "annotations/instances_val2017.json"


def coco(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 4, "height": 3},
            {"id": 2, "file_name": "b.jpg", "width": 4, "height": 3},
            {"id": 7, "file_name": "c.jpg", "width": 4, "height": 3},
        ],
        "annotations": [
            {
                "id": 1,
                "image_id": 1,
                "category_id": 5,
                "bbox": [0, 0, 2, 2],
                "segmentation": [[0, 0, 2, 0, 2, 2]],
            },
            {
                "id": 2,
                "image_id": 1,
                "category_id": 5,
                "bbox": [0.5, 0, 1, 1],
                "iscrowd": 1,
                "segmentation": {"counts": [1, 2, 9], "size": [3, 4]},
            },
            {"id": 3, "image_id": 7, "category_id": 9, "bbox": [0, 0, 1, 1], "segmentation": []},
        ],
        "categories": [{"id": 5, "name": "x"}, {"id": 9, "name": "y"}],
    }
    return data | overrides


def test_index_counts_crowd_and_images_without_annotations():
    assert index_annotations(coco(), SRC) == AnnotationIndex(
        file_names=("a.jpg", "b.jpg", "c.jpg"),
        images=3,
        annotations=3,
        crowd=1,
        categories=2,
        images_without_annotations=1,
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "expected a JSON object with 'images', 'annotations', 'categories'"),
        (coco(images={}), "expected a list 'images' (is this a COCO instances file?)"),
        (coco(categories=[]), "'categories' is empty"),
        (
            coco(images=[{"id": 1, "file_name": "../a.jpg", "width": 1, "height": 1}]),
            "image id 1: 'file_name' must be a relative path, got '../a.jpg'",
        ),
        (
            coco(images=[{"id": 1, "file_name": "a.jpg", "width": 0, "height": 1}]),
            "image id 1: 'width' must be positive",
        ),
        (
            coco(images=[{"id": "1", "file_name": "a.jpg", "width": 1, "height": 1}]),
            "image: expected an integer 'id', got '1'",
        ),
        (
            coco(annotations=[{"id": 4, "image_id": 3, "category_id": 5, "bbox": [0, 0, 1, 1]}]),
            "annotation id 4: image_id 3 is not in 'images'",
        ),
        (
            coco(annotations=[{"id": 4, "image_id": 1, "category_id": 6, "bbox": [0, 0, 1, 1]}]),
            "annotation id 4: category_id 6 is not in 'categories'",
        ),
        (
            coco(annotations=[{"id": 4, "image_id": 1, "category_id": 5, "bbox": [0, 0, 1]}]),
            "annotation id 4: expected 'bbox' [x, y, w, h], got [0, 0, 1]",
        ),
        (
            coco(annotations=[{"id": 4, "image_id": 1, "category_id": 5, "bbox": [0, 0, 1, 1]}]),
            "annotation id 4: expected 'segmentation' polygons or RLE, got None",
        ),
        (
            coco(
                annotations=[
                    {"id": 4, "image_id": 1, "category_id": 5, "bbox": [0, 0, 1, 1], "segmentation": []}
                    | {"iscrowd": 2}
                ]
            ),
            "annotation id 4: 'iscrowd' must be 0 or 1, got 2",
        ),
    ],
)
def test_index_rejects_with_one_line_naming_the_file(data, message):
    with pytest.raises(StageError) as e:
        index_annotations(data, SRC)
    assert str(e.value) == f"{SRC}: {message}"
    assert e.value.code == errors.DATA_ERROR


def test_parse_json_error_names_the_file():
    with pytest.raises(StageError) as e:
        parse_json(b'{"images": [', SRC)
    assert str(e.value).startswith(f"{SRC}: not valid JSON (Expecting value: line 1")
    assert e.value.code == errors.DATA_ERROR


def test_plan_split_maps_files_to_channel_keys():
    index = index_annotations(coco(), SRC)
    summary, files = plan_split(
        COCO_2017[1], index, Path("/d"), {"a.jpg": 1, "b.jpg": 2, "c.jpg": 3, "z.txt": 4}
    )
    assert files == (
        LocalFile("val/a.jpg", Path("/d/val2017/a.jpg"), 1),
        LocalFile("val/b.jpg", Path("/d/val2017/b.jpg"), 2),
        LocalFile("val/c.jpg", Path("/d/val2017/c.jpg"), 3),
    )
    assert summary.unreferenced == 1
    assert summary.describe() == (
        "val: 3 images (1 without annotations), 3 annotations (1 crowd), 2 categories; "
        "1 unreferenced files not staged"
    )


def test_plan_split_missing_and_empty_images():
    index = index_annotations(coco(), SRC)
    with pytest.raises(StageError) as e:
        plan_split(COCO_2017[1], index, Path("/d"), {"a.jpg": 1})
    assert str(e.value) == f"val2017/b.jpg: missing (referenced by {SRC}); 2 of 3 referenced images missing"
    assert e.value.code == errors.NO_INPUT
    with pytest.raises(StageError) as e:
        plan_split(COCO_2017[1], index, Path("/d"), {"a.jpg": 1, "b.jpg": 0, "c.jpg": 1})
    assert str(e.value) == "val2017/b.jpg: empty file; 1 empty images"


def test_check_weights(tmp_path):
    path = tmp_path / "w.npz"
    np.savez(path, **{"conv0/W": np.zeros(2), "group0/block0/conv1/W": np.zeros(1)})
    summary = check_weights(path)
    assert (summary.arrays, summary.file.key) == (2, "pretrained/w.npz")
    path.write_bytes(b"PK not really")
    with pytest.raises(StageError, match=r"w.npz: not a NumPy .npz archive") as e:
        check_weights(path)
    assert e.value.code == errors.DATA_ERROR
    with pytest.raises(StageError, match=r"nope.npz: missing") as e:
        check_weights(tmp_path / "nope.npz")
    assert e.value.code == errors.NO_INPUT


@pytest.mark.parametrize(
    ("uri", "parsed"),
    [
        ("s3://bkt", ("bkt", "")),
        ("s3://bkt/", ("bkt", "")),
        ("s3://my.bucket-1/coco/2017/", ("my.bucket-1", "coco/2017/")),
        ("s3://bkt/coco", ("bkt", "coco/")),
    ],
)
def test_parse_s3_uri(uri, parsed):
    assert parse_s3_uri(uri) == parsed


@pytest.mark.parametrize(
    "uri", ["bkt/coco", "s3://", "s3://ab", "s3://Upper/x", "s3://bkt/a//b", "http://bkt/x"]
)
def test_parse_s3_uri_rejects(uri):
    with pytest.raises(StageError) as e:
        parse_s3_uri(uri)
    assert e.value.code == errors.USAGE


def staged(key: str, data: bytes) -> StagedFile:
    import hashlib

    return StagedFile(key, Path(key), len(data), hashlib.md5(data).hexdigest())


def test_diff_by_size_and_etag():
    a, b, c, d, e = (staged(k, k.encode() * 3) for k in ("a", "b", "c", "d", "e"))
    remote = {
        "a": RemoteObject(a.size, a.md5),  # the same object
        "b": RemoteObject(b.size + 1, b.md5),  # other size
        "c": RemoteObject(c.size, "0" * 32),  # single-part, other content
        "d": RemoteObject(d.size, "0123abcd" * 4 + "-2"),  # multipart: ask the md5 metadata
        "old/x": RemoteObject(1, "0" * 32),
        "_manifest.json": RemoteObject(1, "0" * 32),
    }
    assert diff([a, b, c, d, e], remote, ignore={"_manifest.json"}) == Diff(
        upload=(b, c, e), same=(a,), check=(d,), extra=("old/x",)
    )


def test_matches_uses_stored_md5_then_single_part_etag():
    f = staged("k", b"data")
    assert matches(f, (f.size, f.md5, "whatever-3"))
    assert matches(f, (f.size, None, f.md5))
    assert not matches(f, (f.size, "0" * 32, f.md5))  # metadata wins over a coincidental ETag
    assert not matches(f, (f.size + 1, f.md5, f.md5))
    assert not matches(f, None)


def test_content_md5_is_base64_of_the_digest():
    assert staged("k", b"").content_md5 == "1B2M2Y8AsgTpgAmY7PhCfg=="


def layout_of(files: tuple[StagedFile, ...]) -> Layout:
    return Layout(splits=(), weights=None, files=tuple(LocalFile(f.key, f.path, f.size) for f in files))


def test_manifest_round_trip_and_inputs_text():
    files = (staged("annotations/x.json", b"{}"), staged("train/a.jpg", b"jpg"))
    doc = M.build("bkt", "p/", layout_of(files), files)
    assert doc["files"] == {f.key: {"size": f.size, "md5": f.md5} for f in files}
    assert doc["channels"] == {"annotations": "s3://bkt/p/annotations/"}
    assert M.same_files(M.encode(doc), doc)
    other = M.build("bkt", "p/", layout_of(files[:1]), files[:1])
    assert not M.same_files(M.encode(other), doc)
    assert not M.same_files(b"{broken", doc)
    assert not M.same_files(None, doc)
    text = M.inputs_text({"train": "s3://bkt/p/train/", "val": "s3://bkt/p/val/"})
    assert text == 'inputs = {\n    "train": "s3://bkt/p/train/",\n    "val": "s3://bkt/p/val/",\n}'


def test_md5_cache_skips_reading_unchanged_files(tmp_path):
    path = tmp_path / "a.bin"
    path.write_bytes(b"abc")
    cache_file = tmp_path / "cache" / "md5.json"
    first = checksum_all([LocalFile("k", path, 3)], Md5Cache(cache_file), jobs=2)
    assert first[0].md5 == md5_file(path) == "900150983cd24fb0d6963f7d28e17f72"
    st = path.stat()
    cached = json.loads(cache_file.read_text())
    cached[str(path.resolve())] = [st.st_size, st.st_mtime_ns, "f" * 32]  # a cache hit is not re-read
    cache_file.write_text(json.dumps(cached))
    assert checksum_all([LocalFile("k", path, 3)], Md5Cache(cache_file), jobs=1)[0].md5 == "f" * 32
    path.write_bytes(b"abcd")  # size changed since the listing: an error, not a stale checksum
    with pytest.raises(StageError, match="changed while staging"):
        checksum_all([LocalFile("k", path, 3)], Md5Cache(cache_file), jobs=1)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_redraws_one_line_on_a_tty():
    out, clock = io.StringIO(), FakeClock()
    p = Progress("uploaded", 3, 3000, out, tty=True, clock=clock)
    clock.now = 1.0
    p.advance(1000)
    p.advance(1000)  # within the redraw interval: not drawn
    clock.now = 2.0
    p.advance(1000)
    p.close()
    assert out.getvalue() == (
        "\ruploaded 1/3 files, 1.0 KB/3.0 KB, 1.0 KB/s\x1b[K"
        "\ruploaded 3/3 files, 3.0 KB/3.0 KB, 1.5 KB/s\x1b[K\n"
    )


def test_progress_prints_tenths_when_not_a_tty():
    out = io.StringIO()
    p = Progress("uploaded", 20, 20, out, tty=False, clock=FakeClock())
    for _ in range(20):
        p.advance(1)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 10
    assert lines[0].startswith("uploaded 2/20 files, 2 B/20 B")
    quiet = io.StringIO()
    q = Progress("checksums", 2, 2, quiet, tty=False, lines=False)
    q.advance(1)
    q.close()
    assert quiet.getvalue() == ""


def test_unpack_once_and_never_outside_the_directory(tmp_path):
    import zipfile

    from smhvd_stage.download import unpack

    archive = tmp_path / "val2017.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("val2017/a.jpg", b"jpg")
    root = tmp_path / "coco"
    root.mkdir()
    assert unpack(archive, root)
    assert (root / "val2017" / "a.jpg").read_bytes() == b"jpg"
    assert not unpack(archive, root)  # the marker says it is done
    evil = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil, "w") as z:
        z.writestr("../outside.txt", b"x")
    with pytest.raises(StageError, match=r"evil.zip: refusing member '../outside.txt'") as e:
        unpack(evil, root)
    assert e.value.code == errors.DATA_ERROR
    assert not (tmp_path / "outside.txt").exists()
    (tmp_path / "broken.zip").write_bytes(b"PK not a zip")
    with pytest.raises(StageError, match="broken.zip: not a zip archive"):
        unpack(tmp_path / "broken.zip", root)
