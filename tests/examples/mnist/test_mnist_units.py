"""The MNIST script's pure parts: data checks, checkpoint files, report formats, arguments. No TensorFlow."""

from __future__ import annotations

import csv
import gzip
import json
import re
import struct
from pathlib import Path

import mnist_checkpoints
import mnist_data
import mnist_report
import numpy as np
import pytest
import train_mnist

# ---- data ------------------------------------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_returns_the_array_written(tmp_path: Path) -> None:
    images = np.arange(3 * 28 * 28, dtype=np.uint32).reshape(3, 28, 28) % 256
    write_idx(tmp_path / "images.gz", images)
    assert np.array_equal(mnist_data.read_idx(tmp_path / "images.gz", expected_ndim=3), images)


def test_read_idx_rejects_wrong_rank_and_truncated_data(tmp_path: Path) -> None:
    write_idx(tmp_path / "labels.gz", np.zeros(5))
    with pytest.raises(
        mnist_data.DataError, match=r"labels\.gz: IDX header says .* 1 dims, expected .* 3 dims"
    ):
        mnist_data.read_idx(tmp_path / "labels.gz", expected_ndim=3)
    with gzip.open(tmp_path / "short.gz", "wb") as stream:
        stream.write(struct.pack(">HBBI", 0, 0x08, 1, 10) + b"\x01\x02")
    with pytest.raises(mnist_data.DataError, match=r"short\.gz: 2 data bytes, header dims \(10,\) need 10"):
        mnist_data.read_idx(tmp_path / "short.gz", expected_ndim=1)


def test_embedded_mnist_is_the_full_real_dataset() -> None:
    train, test = mnist_data.load(mnist_data.resolve_source("mnist", {}))
    assert (len(train), len(test)) == (60000, 10000)
    assert train.images.shape == (60000, 28, 28, 1)
    assert train.images.dtype == np.float32
    assert 0.0 == train.images.min() < train.images.max() == 1.0
    assert train.labels[:8].tolist() == [5, 0, 4, 1, 9, 2, 1, 3]  # the canonical first MNIST labels
    assert np.bincount(test.labels).tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def save_npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def test_channel_npz_accepts_uint8_and_float_with_or_without_channel_axis(tmp_path: Path) -> None:
    pixels = np.full((4, 28, 28), 255, np.uint8)
    labels = np.array([0, 1, 2, 9])
    for name, data in (("a", pixels), ("b", pixels[..., None]), ("c", pixels.astype(np.float64) / 255)):
        split = mnist_data.load_npz(save_npz(tmp_path / f"{name}.npz", data=data, labels=labels))
        assert split.images.shape == (4, 28, 28, 1)
        assert split.images.dtype == np.float32
        assert float(split.images.max()) == 1.0
        assert split.labels.tolist() == [0, 1, 2, 9]


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (
            {"data": np.zeros((2, 28, 28))},
            r"missing array\(s\) labels \(found data; expected 'data' and 'labels'\)",
        ),
        (
            {"data": np.zeros((2, 32, 32)), "labels": np.zeros(2, int)},
            r"'data' has shape \(2, 32, 32\), expected",
        ),
        (
            {"data": np.zeros((2, 28, 28)), "labels": np.zeros(3, int)},
            r"'labels' has shape \(3,\), expected \(2,\)",
        ),
        (
            {"data": np.zeros((2, 28, 28)), "labels": np.array([0, 10])},
            r"labels range 0\.\.10, expected 0\.\.9",
        ),
        (
            {"data": np.zeros((2, 28, 28)), "labels": np.zeros(2)},
            r"'labels' has dtype float64, expected integers",
        ),
        (
            {"data": np.full((2, 28, 28), 2.0), "labels": np.zeros(2, int)},
            r"float pixels must be .* within \[0, 1\]",
        ),
        ({"data": np.zeros((0, 28, 28)), "labels": np.zeros(0, int)}, r"no examples"),
    ],
)
def test_bad_channel_npz_is_rejected_naming_the_file(tmp_path: Path, arrays: dict, message: str) -> None:
    path = save_npz(tmp_path / "train.npz", **arrays)
    with pytest.raises(mnist_data.DataError, match=re.escape(str(path)) + ".*" + message):
        mnist_data.load_npz(path)


def test_missing_or_garbage_npz_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(mnist_data.DataError, match=r"train\.npz: file not found"):
        mnist_data.load_npz(tmp_path / "train.npz")
    (tmp_path / "test.npz").write_text("not a zip")
    with pytest.raises(mnist_data.DataError, match=r"test\.npz: not a readable \.npz file"):
        mnist_data.load_npz(tmp_path / "test.npz")


def test_channels_take_precedence_and_test_npz_may_sit_in_the_train_channel(tmp_path: Path) -> None:
    train_only = mnist_data.resolve_source("mnist", {"SM_CHANNEL_TRAIN": str(tmp_path)})
    assert (train_only.train_npz, train_only.test_npz) == (tmp_path / "train.npz", tmp_path / "test.npz")
    both = mnist_data.resolve_source("fashion_mnist", {"SM_CHANNEL_TRAIN": "/a", "SM_CHANNEL_TEST": "/b"})
    assert (both.train_npz, both.test_npz, both.idx_dir) == (Path("/a/train.npz"), Path("/b/test.npz"), None)
    with pytest.raises(mnist_data.DataError, match="SM_CHANNEL_TEST is set .* but SM_CHANNEL_TRAIN is not"):
        mnist_data.resolve_source("mnist", {"SM_CHANNEL_TEST": "/b"})


def test_shards_are_disjoint_and_cover_the_split() -> None:
    split = mnist_data.Split(np.zeros((11, 28, 28, 1), np.float32), np.arange(11))
    shards = [split.shard(rank, 3).labels.tolist() for rank in range(3)]
    assert shards == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]


# ---- checkpoints -----------------------------------------------------------------------------------------


def fake_state(text: str):
    return lambda prefix: Path(f"{prefix}.data").write_text(text)


def test_latest_checkpoint_is_the_newest_complete_one(tmp_path: Path) -> None:
    assert mnist_checkpoints.latest_checkpoint(tmp_path / "absent") is None
    for epoch in (1, 2, 3):
        mnist_checkpoints.save(tmp_path, epoch, fake_state(f"weights {epoch}"), {"history": [epoch]}, keep=2)
    # Only the two newest stay; a half-written later one (no meta.json, or a temporary) is never picked.
    assert sorted(path.name for path in tmp_path.iterdir()) == ["epoch-0002", "epoch-0003"]
    (tmp_path / "epoch-0004").mkdir()
    (tmp_path / ".tmp-epoch-0005-x").mkdir()
    epoch, path = mnist_checkpoints.latest_checkpoint(tmp_path)
    assert (epoch, path.name) == (3, "epoch-0003")
    assert (path / "state.data").read_text() == "weights 3"
    assert mnist_checkpoints.read_meta(path) == {"epoch": 3, "history": [3]}
    mnist_checkpoints.remove_temporaries(tmp_path)
    assert not (tmp_path / ".tmp-epoch-0005-x").exists()


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path: Path) -> None:
    mnist_checkpoints.save(tmp_path, 1, fake_state("good"), {})

    def crash(prefix: Path) -> None:
        Path(f"{prefix}.data").write_text("partial")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        mnist_checkpoints.save(tmp_path, 2, crash, {})
    assert [path.name for path in tmp_path.iterdir()] == ["epoch-0001"]
    assert mnist_checkpoints.latest_checkpoint(tmp_path) == (1, tmp_path / "epoch-0001")


def test_an_epoch_written_again_replaces_the_old_checkpoint(tmp_path: Path) -> None:
    mnist_checkpoints.save(tmp_path, 2, fake_state("first run"), {})
    mnist_checkpoints.save(tmp_path, 2, fake_state("after resume"), {})
    assert [path.name for path in tmp_path.iterdir()] == ["epoch-0002"]
    assert (tmp_path / "epoch-0002" / "state.data").read_text() == "after resume"


# ---- report ----------------------------------------------------------------------------------------------

ROW = {
    "epoch": 2,
    "train_loss": 0.0612345,
    "train_accuracy": 0.98125,
    "val_loss": 4.5e-05,
    "val_accuracy": 0.9912,
    "images_per_sec": 9412.3,
    "epoch_seconds": 7.25,
    "learning_rate": 0.002,
    "rank_cpu_cores": 0.97,
}


def test_metric_definitions_extract_each_value_from_the_epoch_line() -> None:
    line = mnist_report.epoch_line(ROW) + " " + mnist_report.final_line(0.99123, 0.0301)
    found = {}
    for definition in mnist_report.METRIC_DEFINITIONS:
        matches = re.findall(definition["Regex"], line)
        assert len(matches) == 1, (definition, line)
        found[definition["Name"]] = float(matches[0])
    assert found == {
        "train:loss": pytest.approx(0.0612345),
        "train:accuracy": pytest.approx(0.98125),
        "validation:loss": pytest.approx(4.5e-05),
        "validation:accuracy": pytest.approx(0.9912),
        "train:images_per_sec": pytest.approx(9412.3),
        "train:rank_cpu_cores": pytest.approx(0.97),
        "test:accuracy": pytest.approx(0.9912, abs=1e-4),
        "test:loss": pytest.approx(0.0301),
    }


def test_history_csv_and_metrics_json_round_trip(tmp_path: Path) -> None:
    rows = [{**ROW, "epoch": 1}, ROW]
    mnist_report.write_history_csv(tmp_path / "out" / "history.csv", rows)
    with (tmp_path / "out" / "history.csv").open() as stream:
        read = list(csv.DictReader(stream))
    assert [row["epoch"] for row in read] == ["1", "2"]
    assert list(read[0]) == list(mnist_report.EPOCH_FIELDS)
    mnist_report.write_metrics_json(tmp_path / "out" / "metrics.json", {"test_accuracy": 0.5, "epochs": 2})
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == {"test_accuracy": 0.5, "epochs": 2}
    assert sorted(path.name for path in (tmp_path / "out").iterdir()) == ["history.csv", "metrics.json"]


# ---- arguments -------------------------------------------------------------------------------------------


def test_defaults_follow_the_sagemaker_environment() -> None:
    env = {"SAGEMAKER_BASE_DIR": "/job", "SM_MODEL_DIR": "/job/model", "SM_OUTPUT_DATA_DIR": "/job/out"}
    args = train_mnist.parse_args([], env)
    assert (args.model_dir, args.output_data_dir, args.checkpoint_dir) == (
        Path("/job/model"),
        Path("/job/out"),
        Path("/job/checkpoints"),
    )
    assert train_mnist.parse_args([], {}).checkpoint_dir == Path("/opt/ml/checkpoints")
    assert train_mnist.parse_args([], {"SM_CHECKPOINT_DIR": "/ckpt"}).checkpoint_dir == Path("/ckpt")


def test_an_s3_model_dir_from_the_tensorflow_estimator_means_the_local_model_dir() -> None:
    env = {"SM_MODEL_DIR": "/opt/ml/model"}
    assert train_mnist.parse_args(["--model_dir", "s3://bucket/job/model"], env).model_dir == Path(
        "/opt/ml/model"
    )
    assert train_mnist.parse_args(["--model-dir", "/elsewhere"], env).model_dir == Path("/elsewhere")


def test_hyperparameters_in_either_spelling() -> None:
    args = train_mnist.parse_args(
        ["--batch_size", "32", "--learning-rate", "0.01", "--steps-per-epoch", "5"], {}
    )
    assert (args.batch_size, args.learning_rate, args.steps_per_epoch) == (32, 0.01, 5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "2", "--optimiser", "sgd"], "unrecognized arguments: --optimiser sgd"),
        (["--epochs", "0"], "argument --epochs: expected an integer >= 1, got 0"),
        (["--dataset", "cifar10"], "argument --dataset: invalid choice: 'cifar10'"),
    ],
)
def test_bad_arguments_exit_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_mnist.parse_args(argv, {})
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_thread_counts_share_the_cores_unless_the_user_says_otherwise() -> None:
    assert train_mnist.thread_counts({}, cpus=8, local_ranks=2) == (4, 2)
    assert train_mnist.thread_counts({}, cpus=2, local_ranks=2) == (1, 1)
    assert train_mnist.thread_counts({"OMP_NUM_THREADS": "3"}, cpus=8, local_ranks=1) == (3, 2)
    env = {"OMP_NUM_THREADS": "3", "TF_NUM_INTRAOP_THREADS": "5", "TF_NUM_INTEROP_THREADS": "1"}
    assert train_mnist.thread_counts(env, cpus=8, local_ranks=1) == (5, 1)
