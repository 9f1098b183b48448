"""The COCO evaluation path: perfect predictions score AP 1.0, damaged ones do not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mrcnn.data import load_dataset, records
from mrcnn.evaluation import coco_evaluate, coco_results

# TensorFlow comes with mrcnn.boxes, under mrcnn.data and mrcnn.evaluation (about 10 s):
# the unit tier (make test-fast) imports none.
pytestmark = pytest.mark.integration


def predictions_from_ground_truth(ds, shift: float = 0.0, drop_masks: bool = False):
    results = []
    for rec in records(ds, with_empty=True):
        anns = ds.coco.imgToAnns[rec.image_id]
        masks = np.stack([ds.coco.annToMask(a) for a in anns])
        if drop_masks:
            masks = np.zeros_like(masks)
        boxes = rec.boxes + np.array([shift, 0, shift, 0], np.float32) * (
            rec.boxes[:, 2:3] - rec.boxes[:, 0:1]
        )
        results += coco_results(rec.image_id, boxes, np.ones(len(boxes)), rec.classes, masks, ds.category_ids)
    return results


def test_perfect_predictions_score_ap_one(shapes: Path) -> None:
    ds = load_dataset(shapes / "val")
    ids = [r.image_id for r in records(ds, with_empty=True)]
    metrics = coco_evaluate(ds.coco, predictions_from_ground_truth(ds), ids)
    assert metrics["bbox"]["AP"] == pytest.approx(1.0)
    assert metrics["segm"]["AP"] == pytest.approx(1.0)


def test_wrong_predictions_score_low(shapes: Path) -> None:
    ds = load_dataset(shapes / "val")
    ids = [r.image_id for r in records(ds, with_empty=True)]
    metrics = coco_evaluate(ds.coco, predictions_from_ground_truth(ds, shift=0.6, drop_masks=True), ids)
    assert metrics["bbox"]["AP"] < 0.2
    assert metrics["segm"]["AP"] == pytest.approx(0.0)
    assert coco_evaluate(ds.coco, [], ids)["bbox"]["AP"] == 0.0
