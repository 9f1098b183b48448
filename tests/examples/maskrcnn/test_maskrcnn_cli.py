"""Configuration parsing and the script's answers to bad input (in-process, no training)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf
import train_maskrcnn
from mrcnn.config import ConfigError, build_config

# TensorFlow comes with train_maskrcnn (about 10 s):
# the unit tier (make test-fast) imports none.
pytestmark = pytest.mark.integration


def test_preset_and_overrides() -> None:
    cfg = build_config("tiny", ["total_steps=7", "anchor_sizes=8,16,32,64,128", "flip=false", "norm=None"])
    assert (cfg.total_steps, cfg.anchor_sizes, cfg.flip, cfg.norm) == (7, (8, 16, 32, 64, 128), False, "None")
    assert build_config("coco", []).resnet_blocks == (3, 4, 6, 3)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("nope=1", "unknown config key 'nope'"),
        ("total_steps=many", "config key 'total_steps': cannot parse 'many' as int"),
        ("norm=BN", "config key 'norm'"),
        ("total_steps", "expected KEY=VALUE"),
        ("resnet_blocks=3,4", "config key 'resnet_blocks'"),
    ],
)
def test_bad_overrides_name_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_config("tiny", [override])


def test_script_rejects_bad_input_with_one_line(tmp_path: Path, shapes: Path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(tmp_path / "ml"))
    for name in ("SM_CHANNEL_TRAIN", "SM_CHANNEL_VAL", "SM_CHANNEL_PRETRAINED", "SM_CHANNEL_ANNOTATIONS"):
        monkeypatch.delenv(name, raising=False)
    cases = [
        (["--preset", "huge"], "unknown preset 'huge'"),
        (["--preset", "tiny", "--config", "total_steps=2 bogus=1"], "unknown config key 'bogus'"),
        (["--preset", "tiny", "--train-dir", str(tmp_path / "missing")], "does not exist"),
        (["--preset", "tiny"], "no training data"),
        (["--preset", "tiny", "--data-dir", str(tmp_path), "--pretrained", str(tmp_path / "w.npz")],
         "pretrained weights"),
        (["--preset", "tiny", "--data-dir", str(tmp_path), "--eval", "maybe"], "--eval: expected true"),
    ]  # fmt: skip
    (tmp_path / "empty" / "train").mkdir(parents=True)
    (tmp_path / "badval").mkdir()
    (tmp_path / "badval" / "annotations.json").write_text('{"images": [], "annotations": []}')
    cases += [
        (["--preset", "tiny", "--data-dir", str(tmp_path / "empty")], "expected exactly one COCO annotation"),
        # A broken validation set is found before training starts, not after it.
        (["--preset", "tiny", "--data-dir", str(shapes), "--val-dir", str(tmp_path / "badval")],
         "expected non-empty 'images' and 'categories'"),
        (["--preset", "tiny", "--eval-only", "true"], "--eval-only needs validation data"),
    ]  # fmt: skip
    for argv, message in cases:
        assert train_maskrcnn.main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, (argv, err)
    assert not (tmp_path / "ml").exists()  # nothing half-done
    assert tf.executing_eagerly()  # bad input is rejected before any process-wide TensorFlow switch


def test_evaluation_while_training_follows_tensorpacks_eval_period() -> None:
    """tensorpack evaluates after every EVAL_PERIOD-th epoch and after the last one; here the last one is left
    to the evaluation after training when that runs, and a resumed job starts counting at its first epoch."""
    assert train_maskrcnn.eval_epochs(0, 1, 10, final_eval=False) == ()
    assert train_maskrcnn.eval_epochs(50, 1, 360, final_eval=False) == (*range(50, 351, 50), 360)
    assert train_maskrcnn.eval_epochs(2, 1, 6, final_eval=True) == (2, 4)
    assert train_maskrcnn.eval_epochs(2, 1, 6, final_eval=False) == (2, 4, 6)
    assert train_maskrcnn.eval_epochs(2, 5, 9, final_eval=True) == (6, 8)
