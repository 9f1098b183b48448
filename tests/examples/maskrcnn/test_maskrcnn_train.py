"""The tiny preset trains at np=2 (under mpirun, then through `train`): finite decreasing loss, pretrained
.npz loading, checkpoints, evaluation while training (tensorpack's TRAIN.EVAL_PERIOD) with the COCO lines
that docs/maskrcnn.md's SageMaker metric definitions read, resume from the checkpoints in a job of its own,
export of the model and the COCO evaluation after training."""

from __future__ import annotations

import ast
import json
import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import train_maskrcnn
from mrcnn.evaluation import STAT_NAMES

from smhvd_dev.mltree import write_ml_tree

from .conftest import REPO, cocoeval_stats, run_script, run_train, train_hyperparameters

pytestmark = pytest.mark.integration

STEPS = "steps_per_epoch=10 freeze_at=1"  # frozen stem: its weights must stay exactly the pretrained ones


@dataclass(frozen=True)
class Run:
    base: Path  # the job's /opt/ml
    log: str  # its stdout and stderr


def stats(base: Path) -> list[dict]:
    return json.loads((base / "checkpoints" / "stats.json").read_text())


def check(proc) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def documented_metric_definitions() -> list[dict[str, str]]:
    """The `metric_definitions = [...]` block of docs/maskrcnn.md, as a user copies it."""
    doc = (REPO / "docs" / "maskrcnn.md").read_text()
    found = re.search(r"^metric_definitions = (\[\n.*?\n\])$", doc, re.S | re.M)
    assert found, "docs/maskrcnn.md: no metric_definitions block"
    return ast.literal_eval(found.group(1))


def metric(name: str, log: str) -> list[float]:
    """Every value SageMaker would take from the log with the documented definition `name` (a regex search in
    each line, the first group)."""
    (regex,) = [d["Regex"] for d in documented_metric_definitions() if d["Name"] == name]
    return [float(m.group(1)) for line in log.splitlines() if (m := re.search(regex, line))]


PRETRAINED = {
    "conv0/W": np.random.default_rng(7).normal(scale=0.1, size=(7, 7, 3, 8)).astype(np.float32),
    "conv0/gn/gamma": np.random.default_rng(8).uniform(0.5, 1.5, size=8).astype(np.float32),
}


@pytest.fixture(scope="module")
def first_run(shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """30 steps at np=2 from a pretrained .npz, evaluating every 2 epochs while training (after epoch 2, and
    after the last one as --eval false means no evaluation follows)."""
    base = tmp_path_factory.mktemp("ml")
    np.savez(base / "backbone.npz", **PRETRAINED)
    proc = run_script(
        ["--preset", "tiny", "--data-dir", str(shapes), "--pretrained", str(base / "backbone.npz"),
         "--config", f"total_steps=30 {STEPS} eval_period=2", "--eval", "false"],
        base / "ml", np_=2,
    )  # fmt: skip
    check(proc)
    return Run(base / "ml", proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def resumed_run(first_run: Run, shapes: Path, tmp_path_factory: pytest.TempPathFactory) -> Run:
    """A second job, through the `train` launcher (SageMaker hyperparameters and channels), on a copy of the
    first one's checkpoints: to step 40, then the evaluation after training."""
    base = tmp_path_factory.mktemp("resumed")
    shutil.copytree(first_run.base / "checkpoints", base / "checkpoints")
    write_ml_tree(
        base,
        hyperparameters=train_hyperparameters(f"total_steps=40 {STEPS}"),
        channels={"train": shapes / "train", "val": shapes / "val"},
    )
    proc = run_train(base)
    check(proc)
    return Run(base, proc.stdout + proc.stderr)


def test_loss_is_finite_and_decreases(first_run: Run) -> None:
    epochs = stats(first_run.base)
    assert [e["global_step"] for e in epochs] == [10, 20, 30]  # 2 ranks x 1 image: tiny's reference batch
    losses = [e["train/loss_epoch_mean"] for e in epochs]
    assert all(math.isfinite(v) for v in losses)
    # An epoch here is 10 steps on a handful of images, sampled by threaded workers: its mean moves 20% from
    # run to run (a fresh clone saw 2.05, 1.40, 1.89). Learning shows as a later epoch well below the first.
    assert min(losses[1:]) < losses[0] * 0.9, losses
    assert metric("train:loss", first_run.log) == pytest.approx(losses, abs=1e-4)


def test_pretrained_npz_is_loaded_and_the_model_exported(first_run: Run) -> None:
    model = np.load(first_run.base / "model" / "model.npz")
    for name, value in PRETRAINED.items():
        np.testing.assert_array_equal(model[name], value)  # frozen: exactly what the .npz held
    assert not [k for k in model.files if "global_step" in k or "Momentum" in k or "learning_rate" in k]
    log = (first_run.base / "checkpoints" / "log.log").read_text()
    assert "weights backbone.npz: backbone: 2 of " in log and "weights backbone.npz: FPN: 0 of " in log
    assert json.loads((first_run.base / "model" / "config.json").read_text())["resnet_width"] == 8
    assert (first_run.base / "checkpoints" / "model-30.index").is_file()


def test_evaluation_while_training_logs_the_lines_sagemaker_metrics_read(first_run: Run) -> None:
    """tensorpack's EVAL_PERIOD: after epochs 2 and 3, both ranks predict half of the 6 validation images each
    and rank 0 logs one line per kind; the documented regexes take exactly the values stats.json records."""
    assert re.findall(r"COCO bbox AP \S+ AP50 \S+ AP75 \S+ \((.*)\)", first_run.log) == [
        "6 images: 3 + 3 by rank; step 20",
        "6 images: 3 + 3 by rank; step 30",
    ]
    recorded = {e["global_step"]: e for e in stats(first_run.base)}
    assert "val/bbox_AP" not in recorded[10]  # not evaluated after epoch 1
    for name, key in (("val:bbox_AP", "val/bbox_AP"), ("val:segm_AP50", "val/segm_AP50")):
        values = metric(name, first_run.log)
        assert values == pytest.approx([recorded[20][key], recorded[30][key]], abs=1e-4), name
    assert len(metric("val:bbox_AP50", first_run.log)) == len(metric("val:segm_AP", first_run.log)) == 2
    assert documented_metric_definitions() == train_maskrcnn.METRIC_DEFINITIONS


def test_resume_through_train_continues_from_the_checkpoint_and_evaluates(resumed_run: Run) -> None:
    log = resumed_run.log
    assert "resuming from" in log and "(step 30)" in log
    assert "Start Epoch 4" in log and "Start Epoch 3 " not in log
    assert [e["global_step"] for e in stats(resumed_run.base)] == [10, 20, 30, 40]
    model = np.load(resumed_run.base / "model" / "model.npz")
    np.testing.assert_array_equal(model["conv0/W"], PRETRAINED["conv0/W"])  # came back from the checkpoint
    metrics = json.loads((resumed_run.base / "output" / "data" / "eval.json").read_text())
    assert (metrics["images"], metrics["images_per_rank"], metrics["step"]) == (6, [3, 3], 40)
    # eval.json is what an independent COCOeval of detections.json against the validation set gives.
    detections = json.loads((resumed_run.base / "output" / "data" / "detections.json").read_text())
    assert detections, "no detection on the 6 validation images"
    assert {d["image_id"] for d in detections} <= set(range(1, 7))
    for kind in ("bbox", "segm"):
        expected = cocoeval_stats(Path(metrics["annotations"]), detections, kind)
        assert [metrics[kind][k] for k in STAT_NAMES] == pytest.approx(expected), kind
    # The lines after training read by the same metric definitions.
    assert metric("val:bbox_AP", log) == pytest.approx([metrics["bbox"]["AP"]], abs=1e-4)
    assert metric("val:segm_AP50", log) == pytest.approx([metrics["segm"]["AP50"]], abs=1e-4)
    assert "COCO segm AP" in log and "(6 images: 3 + 3 by rank; step 40)" in log
