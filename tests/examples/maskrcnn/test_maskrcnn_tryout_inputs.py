"""The two commands that make a Mask R-CNN job runnable offline in minutes (docs/tensorpack-example.md):
make_coco2017.py writes the COCO 2017 layout that staging checks and both Mask R-CNN paths read, and
make_standin_weights.py writes the published model's arrays (names and shapes from the fact file) with seeded
values, the same bytes for the same seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
from make_coco2017 import main as make_coco2017
from make_standin_weights import DEFAULT_FACTS, load_shapes, seeded_arrays
from make_standin_weights import main as make_standin
from mrcnn import data
from pycocotools.coco import COCO

from smhvd_stage.layout import check_weights, validate

# TensorFlow comes with mrcnn.boxes, under mrcnn.data (about 10 s):
# the unit tier (make test-fast) imports none.
pytestmark = pytest.mark.integration

SPLITS = ("train2017", "val2017")
FRESH = "the data set is written into a fresh one"
SMALL = ["--train", "5", "--val", "3", "--size", "96"]


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tryout") / "coco"
    assert (
        make_coco2017(["--out", str(root), "--train", "5", "--val", "3", "--size", "96", "--seed", "4"]) == 0
    )
    return root


def test_the_set_is_the_coco_2017_layout_that_staging_accepts(coco: Path) -> None:
    layout = validate(coco, None)  # smhvd-stage-coco's own check: structure, every referenced image present
    assert [(s.split.image_dir, s.index.images) for s in layout.splits] == [("train2017", 5), ("val2017", 3)]
    assert sorted(p.name for p in coco.iterdir()) == ["annotations", *SPLITS]  # no scratch directory left
    for split in SPLITS:
        gt = COCO(str(coco / "annotations" / f"instances_{split}.json"))
        assert sorted(c["name"] for c in gt.loadCats(gt.getCatIds())) == ["circle", "square", "triangle"]
        for info in gt.loadImgs(gt.getImgIds()):
            img = cv2.imread(str(coco / split / info["file_name"]))
            assert img is not None and img.shape == (info["height"], info["width"], 3) == (96, 96, 3)
        anns = gt.loadAnns(gt.getAnnIds())
        assert anns and len({a["id"] for a in anns}) == len(anns)  # tensorpack asserts unique ids
        for a in anns:
            # tensorpack's loader takes only polygons for non-crowd objects and skips area <= 1
            assert a["iscrowd"] == 0 and a["area"] > 1
            assert isinstance(a["segmentation"], list) and all(len(p) >= 6 for p in a["segmentation"])
            assert gt.annToMask(a).sum() == pytest.approx(a["area"], rel=0.05)


def test_the_reference_script_reads_the_set_as_staged_channels(coco: Path) -> None:
    for split, name in zip(SPLITS, ("train", "val"), strict=True):
        ds = data.load_dataset(coco / split, None, coco / "annotations", name)
        assert ds.annotation_file == coco / "annotations" / f"instances_{split}.json"
        records = data.records(ds, with_empty=False)
        assert records and all(Path(r.path).is_file() and len(r.classes) for r in records)


def test_the_set_is_the_same_bytes_for_the_same_seed(coco: Path, tmp_path: Path) -> None:
    assert make_coco2017(["--out", str(tmp_path / "again"), *SMALL, "--seed", "4"]) == 0
    assert tree_digest(tmp_path / "again") == tree_digest(coco)
    assert make_coco2017(["--out", str(tmp_path / "other"), *SMALL, "--seed", "5"]) == 0
    assert tree_digest(tmp_path / "other") != tree_digest(coco)


def test_a_used_output_directory_is_refused_with_one_line(
    coco: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = tree_digest(coco)
    assert make_coco2017(["--out", str(coco)]) == 2
    err = capsys.readouterr().err
    assert err == f"make_coco2017: error: --out {coco}: not an empty directory ({FRESH})\n"
    assert tree_digest(coco) == before


def test_the_standin_has_every_published_array_and_is_deterministic(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    facts = json.loads(DEFAULT_FACTS.read_text())["arrays"]
    first, second = tmp_path / "a" / "standin.npz", tmp_path / "b" / "standin.npz"
    assert make_standin(["--out", str(first)]) == 0
    assert make_standin(["--out", str(second)]) == 0
    printed = capsys.readouterr().out.splitlines()
    digest = hashlib.sha256(first.read_bytes()).hexdigest()
    assert first.read_bytes() == second.read_bytes()  # same facts, same seed: the same file
    assert printed[0].endswith(f"seed 0, sha256 {digest}") and "STAND-IN" in printed[0]
    assert check_weights(first).arrays == len(facts) == 307  # what smhvd-stage-coco accepts as weights
    with np.load(first) as z:
        assert list(z.keys()) == list(facts)
        assert {k: list(z[k].shape) for k in z} == facts
        assert {z[k].dtype for k in z} == {np.dtype(np.float32)}
        assert all(np.isfinite(z[k]).all() for k in z)
    assert not list(tmp_path.rglob(".*partial"))


def test_the_standin_values_come_from_the_seed(tmp_path: Path) -> None:
    facts = tmp_path / "few.json"
    facts.write_text(json.dumps({"arrays": {"conv0/W": [3, 3, 3, 8], "conv0/bn/gamma": [8], "b": [2]}}))
    paths = [tmp_path / f"{seed}.npz" for seed in (3, 4)]
    for seed, path in zip((3, 4), paths, strict=True):
        assert make_standin(["--out", str(path), "--arrays", str(facts), "--seed", str(seed)]) == 0
    expected = dict(seeded_arrays(load_shapes(facts), seed=3))
    with np.load(paths[0]) as z, np.load(paths[1]) as other:
        for name, value in expected.items():
            np.testing.assert_array_equal(z[name], value)
            assert not np.array_equal(other[name], value)
        assert z["conv0/bn/gamma"].min() >= 0.3 and z["conv0/bn/gamma"].max() <= 0.7


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ('{"arrays": {}}', 'key "arrays": expected an object of array name -> shape, non-empty'),
        (
            '{"arrays": {"conv0/W": [3, 0]}}',
            'key "arrays.conv0/W": expected a list of positive integers, not [3, 0]',
        ),
    ],
)
def test_a_bad_fact_file_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text(content)
    out = tmp_path / "w.npz"
    assert make_standin(["--out", str(out), "--arrays", str(facts)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"make_standin_weights: error: {facts}: {message}") and err.count("\n") == 1
    assert not out.exists()
