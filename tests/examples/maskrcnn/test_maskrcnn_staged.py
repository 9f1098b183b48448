"""The layout `smhvd-stage-coco` stages (channels train/ val/ annotations/ pretrained/, as SageMaker downloads
them): annotation discovery, COCO's crowd RLE, grayscale images and images without annotations, the staging
manifest, and pretrained .npz weights matched by name with a report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from mrcnn import data, staged
from mrcnn.config import build_config
from mrcnn.data import DataError
from mrcnn.weights import check_complete, check_pretrained, match_weights, report_lines

from smhvd_stage import manifest as stage_manifest
from smhvd_stage.checksums import Md5Cache, checksum_all
from smhvd_stage.layout import validate

from .conftest import run_script

# TensorFlow comes with mrcnn.boxes, under mrcnn.data and mrcnn.weights (about 10 s):
# the unit tier (make test-fast) imports none.
pytestmark = pytest.mark.integration

CATEGORIES = [{"id": 1, "name": "square"}, {"id": 7, "name": "blob"}]


def write_coco_2017(root: Path) -> None:
    """train2017/ (4 images: colour, grayscale, no annotations, crowd-only), val2017/ (3), annotations/."""
    import cv2

    rng = np.random.default_rng(3)
    for split, count in (("train2017", 4), ("val2017", 3)):
        (root / split).mkdir(parents=True)
        images, anns = [], []
        for i in range(1, count + 1):
            name = f"{i:012d}.jpg"
            img = np.full((48, 64, 3), 40, np.uint8) + rng.integers(0, 20, (48, 64, 3), dtype=np.uint8)
            img[8:30, 8:30] = (200, 60, 60)
            cv2.imwrite(str(root / split / name), img[:, :, 0] if i == 2 else img)  # image 2: grayscale
            images.append({"id": i, "file_name": name, "height": 48, "width": 64})
            if i == 3:  # no annotations
                continue
            if i != 4:
                poly = [8.0, 8.0, 30.0, 8.0, 30.0, 30.0, 8.0, 30.0]
                anns.append({"id": 10 * i, "image_id": i, "category_id": 1, "bbox": [8.0, 8.0, 22.0, 22.0],
                             "area": 484.0, "iscrowd": 0, "segmentation": [poly]})  # fmt: skip
            if i in (1, 4):  # crowd regions in uncompressed RLE, as in COCO; image 4 has nothing else
                rle = {"counts": [40 * 48, 10 * 48, 14 * 48], "size": [48, 64]}
                anns.append({"id": 10 * i + 1, "image_id": i, "category_id": 7, "iscrowd": 1,
                             "bbox": [40, 0, 10, 48], "area": 480.0, "segmentation": rle})  # fmt: skip
        (root / "annotations").mkdir(exist_ok=True)
        doc = {"info": {}, "licenses": [], "images": images, "annotations": anns, "categories": CATEGORIES}
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(doc))


def stage_locally(source: Path, weights: Path, channels_root: Path) -> dict[str, Path]:
    """What SageMaker puts in /opt/ml/input/data after `smhvd-stage-coco` staged `source`: the same plan and
    manifest the tool writes, each key's file copied into its channel directory."""
    layout = validate(source, weights)
    files = checksum_all(layout.files, Md5Cache(None), jobs=2)
    for f in files:
        target = channels_root / f.key
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f.path, target)
    doc = stage_manifest.build("bkt", "coco/", layout, files)
    (channels_root / stage_manifest.MANIFEST_KEY).write_bytes(stage_manifest.encode(doc))
    return {name: channels_root / name for name in ("train", "val", "annotations", "pretrained")}


@pytest.fixture(scope="module")
def channels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("staged")
    write_coco_2017(base / "coco")
    rng = np.random.default_rng(5)
    np.savez(
        base / "ImageNet-R50-AlignPadding.npz",
        **{
            "conv0/W:0": rng.normal(scale=0.1, size=(7, 7, 3, 8)).astype(np.float32),
            "conv0/gn/gamma": np.ones(8, np.float32),
            "linear/W": np.zeros((2048, 1000), np.float32),  # the ImageNet classifier: unused
        },
    )
    return stage_locally(base / "coco", base / "ImageNet-R50-AlignPadding.npz", base / "input" / "data")


def test_staged_channels_load_with_crowd_grayscale_and_empty_images(channels: dict[str, Path]) -> None:
    ds = data.load_dataset(channels["train"], None, channels["annotations"], "train")
    assert ds.annotation_file == channels["annotations"] / "instances_train2017.json"
    assert ds.image_root == channels["train"]
    assert ds.category_ids == (1, 7)
    training = data.records(ds, with_empty=False)
    assert [r.image_id for r in training] == [1, 2]  # 3 has no annotations, 4 only a crowd region
    assert [r.classes.tolist() for r in training] == [[1], [1]]  # crowd regions are not training targets
    assert [r.image_id for r in data.records(ds, with_empty=True)] == [1, 2, 3, 4]
    gray = data.read_image(training[1].path)
    assert gray.shape == (48, 64, 3) and (gray[..., 0] == gray[..., 1]).all()
    cfg = build_config("tiny", [])
    for rec in training:
        example = data.train_example(rec, cfg, np.random.default_rng(0))
        assert example is not None and example[0].shape[2] == 3
    val = data.load_dataset(
        channels["val"], "annotations/instances_val2017.json", channels["annotations"], "val"
    )
    assert val.annotation_file == channels["annotations"] / "instances_val2017.json"
    crowd = [a for a in val.coco.dataset["annotations"] if a["iscrowd"]]
    assert val.coco.annToMask(crowd[0]).sum() == 10 * 48  # pycocotools reads the uncompressed RLE


def test_annotation_discovery_errors_name_the_directory(channels: dict[str, Path], tmp_path: Path) -> None:
    (tmp_path / "ann").mkdir()
    with pytest.raises(
        DataError, match=r"ann: expected exactly one instances_val\*\.json for the images in .*"
    ):
        data.load_dataset(channels["val"], None, tmp_path / "ann", "val")
    with pytest.raises(DataError, match="annotation file .*nope.json does not exist"):
        data.load_dataset(channels["val"], "nope.json", channels["annotations"], "val")
    images = tmp_path / "images"
    shutil.copytree(channels["train"], images)
    (images / "000000000003.jpg").unlink()
    with pytest.raises(DataError, match=r"image .*000000000003.jpg does not exist \(1 images missing\)"):
        data.load_dataset(images, None, channels["annotations"], "train")


def test_staging_manifest_is_checked(channels: dict[str, Path], tmp_path: Path) -> None:
    line = staged.check_manifest(channels["annotations"], channels)
    assert line == (
        f"staging manifest {channels['annotations'] / '_manifest.json'}: every listed file present with its "
        "size (2 annotations, 1 pretrained, 4 train, 3 val)"
    )
    assert staged.check_manifest(tmp_path, channels) is None  # not staged by the tool: nothing to check
    copy = {name: tmp_path / name for name in channels}
    for name, path in channels.items():
        shutil.copytree(path, copy[name])
    (copy["val"] / "000000000002.jpg").write_bytes(b"truncated")
    with pytest.raises(DataError) as e:
        staged.check_manifest(copy["annotations"], copy)
    assert str(e.value) == (
        f"{copy['val'] / '000000000002.jpg'}: 9 bytes, but the staging manifest "
        f"{copy['annotations'] / '_manifest.json'} lists val/000000000002.jpg with "
        f"{(channels['val'] / '000000000002.jpg').stat().st_size} bytes"
    )
    (copy["train"] / "000000000001.jpg").unlink()
    with pytest.raises(DataError, match=r"000000000001.jpg: missing, but the staging manifest"):
        staged.check_manifest(copy["annotations"], copy)


def test_weights_are_matched_by_name_with_a_report_per_part() -> None:
    model = {
        "conv0/W": (7, 7, 3, 8),
        "conv0/gn/gamma": (8,),
        "fpn/lateral_1x1_c2/W": (1, 1, 8, 4),
        "group0/block0/conv1/W": (1, 1, 8, 2),
    }
    file = {
        "conv0/W:0": (7, 7, 3, 8),
        "conv0/gn/gamma": (8,),
        "group0/block0/conv1/W": (8, 2),
        "linear/W": (4, 2),
    }
    m = match_weights(file, model)
    assert m.matched == ("conv0/W", "conv0/gn/gamma", "group0/block0/conv1/W")  # (8, 2) fits (1, 1, 8, 2)
    assert (m.unused, m.missing, m.misfit) == (("linear/W",), ("fpn/lateral_1x1_c2/W",), ())
    assert report_lines(Path("w.npz"), m) == [
        "weights w.npz: backbone: 3 of 3 arrays loaded",
        "weights w.npz: FPN: 0 of 1 arrays loaded; 1 not in the file keep their initialisation",
        "weights w.npz: 1 arrays unused (linear/W)",
    ]
    check_pretrained(Path("w.npz"), m, tuple(model))
    with pytest.raises(DataError, match=r"model w.npz: 1 of the model's variables are not in the file "):
        check_complete(Path("w.npz"), m)  # evaluation refuses what would predict from random weights
    wrong = match_weights({"conv0/W": (7, 7, 3, 64)}, model)
    with pytest.raises(
        DataError, match=r"array 'conv0/W' has shape \(7, 7, 3, 64\), the model's variable has "
    ):
        check_pretrained(Path("w.npz"), wrong, tuple(model))
    none = match_weights({"resnet_v1_50/conv1/weights": (7, 7, 3, 64)}, model)
    with pytest.raises(DataError) as e:
        check_pretrained(Path("w.npz"), none, tuple(sorted(model)))
    assert str(e.value) == (
        "pretrained weights w.npz: no array name matches a model variable (the file has "
        "resnet_v1_50/conv1/weights; the model has conv0/W, conv0/gn/gamma, fpn/lateral_1x1_c2/W, ...): "
        "expected a tensorpack-format ResNet or Mask R-CNN .npz"
    )


def test_fine_tuning_re_initialises_only_the_class_specific_outputs() -> None:
    """A COCO model (81 classes with background) onto a 3-class data set: the classifier, box regressor and
    mask predictor are left at their initialisation and said so; any other misfit is an error."""
    model = {
        "fastrcnn/fc6/W": (12544, 1024),
        "fastrcnn/outputs/class/W": (1024, 4),
        "fastrcnn/outputs/class/b": (4,),
        "fastrcnn/outputs/box/W": (1024, 16),
        "maskrcnn/conv/W": (1, 1, 256, 3),
        "maskrcnn/deconv/W": (2, 2, 256, 256),
    }
    file = {
        "fastrcnn/fc6/W": (12544, 1024),
        "fastrcnn/outputs/class/W": (1024, 81),
        "fastrcnn/outputs/class/b": (81,),
        "fastrcnn/outputs/box/W": (1024, 324),
        "maskrcnn/conv/W": (1, 1, 256, 80),
        "maskrcnn/deconv/W": (2, 2, 256, 256),
    }
    m = match_weights(file, model)
    assert m.matched == ("fastrcnn/fc6/W", "maskrcnn/deconv/W")
    assert [n for n, _, _ in m.skipped] == [
        "fastrcnn/outputs/box/W", "fastrcnn/outputs/class/W", "fastrcnn/outputs/class/b", "maskrcnn/conv/W",
    ]  # fmt: skip
    check_pretrained(Path("coco.npz"), m, tuple(model))
    assert report_lines(Path("coco.npz"), m) == [
        "weights coco.npz: box head: 1 of 1 arrays loaded",
        "weights coco.npz: box outputs: 0 of 3 arrays loaded; 3 re-initialised for another class count: "
        "81 classes (with background) in the file, 4 in the model",
        "weights coco.npz: mask head: 1 of 1 arrays loaded",
        "weights coco.npz: mask outputs: 0 of 1 arrays loaded; 1 re-initialised for another class count",
    ]
    with pytest.raises(DataError, match=r"81 classes \(with background\) in the file, 4 in the model"):
        check_complete(Path("coco.npz"), m)  # evaluating it on this data set would be meaningless
    wider = match_weights({**file, "fastrcnn/fc6/W": (12544, 512)}, model)
    with pytest.raises(DataError, match=r"'fastrcnn/fc6/W' has shape \(12544, 512\)"):
        check_pretrained(Path("coco.npz"), wider, tuple(model))


def test_training_and_evaluation_from_the_staged_channels(channels: dict[str, Path], tmp_path: Path) -> None:
    """Two steps of the tiny preset from SM_CHANNEL_* as SageMaker sets them, then COCOeval on val2017
    (a crowd region, a grayscale image, an image without annotations)."""
    env = {f"SM_CHANNEL_{name.upper()}": str(path) for name, path in channels.items()}
    proc = run_script(
        ["--preset", "tiny", "--config", "total_steps=2 steps_per_epoch=2 data_workers=1"],
        tmp_path / "ml",
        env=env,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "staging manifest" in log and "(2 annotations, 1 pretrained, 4 train, 3 val)" in log
    assert "weights ImageNet-R50-AlignPadding.npz: backbone: 2 of " in log
    assert "weights ImageNet-R50-AlignPadding.npz: 1 arrays unused (linear/W)" in log
    metrics = json.loads((tmp_path / "ml" / "output" / "data" / "eval.json").read_text())
    assert metrics["images"] == 3
    assert metrics["annotations"] == str(channels["annotations"] / "instances_val2017.json")


def test_weights_without_a_matching_name_fail_with_one_line(
    channels: dict[str, Path], tmp_path: Path
) -> None:
    other = tmp_path / "pretrained"
    other.mkdir()
    np.savez(other / "resnet50.npz", **{"resnet_v1_50/conv1/weights": np.zeros((7, 7, 3, 64), np.float32)})
    env = {f"SM_CHANNEL_{name.upper()}": str(path) for name, path in channels.items()}
    env["SM_CHANNEL_PRETRAINED"] = str(other)
    env["SM_CHANNEL_ANNOTATIONS"] = str(tmp_path / "annotations")
    shutil.copytree(channels["annotations"], tmp_path / "annotations")
    (tmp_path / "annotations" / "_manifest.json").unlink()  # other weights than the staged ones
    proc = run_script(
        ["--preset", "tiny", "--config", "total_steps=2", "--eval", "false"], tmp_path / "ml", env=env
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"train_maskrcnn: error: pretrained weights {other / 'resnet50.npz'}: no array name "
    )
    assert not (tmp_path / "ml" / "model" / "model.npz").exists()
