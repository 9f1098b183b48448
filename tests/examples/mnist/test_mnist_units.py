"""The MNIST example's pure parts: data checks and arguments (no training)."""

from __future__ import annotations

import gzip
import itertools
import re
import struct
from pathlib import Path
from types import ModuleType

import mnist_data
import numpy as np
import pytest
from mnist_helpers import SCRIPT_DIR

# ---- data ------------------------------------------------------------------------------------------------


def write_idx(path: Path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as stream:
        stream.write(header + array.astype(np.uint8).tobytes())


def test_read_idx_returns_the_array_written(tmp_path: Path) -> None:
    images = np.arange(3 * 28 * 28, dtype=np.uint32).reshape(3, 28, 28) % 256
    write_idx(tmp_path / "images.gz", images)
    assert np.array_equal(mnist_data.read_idx(tmp_path / "images.gz"), images)


def test_read_idx_rejects_truncated_data_and_other_dtypes(tmp_path: Path) -> None:
    with gzip.open(tmp_path / "short.gz", "wb") as stream:
        stream.write(struct.pack(">HBBI", 0, 0x08, 1, 10) + b"\x01\x02")
    with pytest.raises(mnist_data.DataError, match=r"short\.gz: not an IDX file .*dims \[10\]"):
        mnist_data.read_idx(tmp_path / "short.gz")
    with gzip.open(tmp_path / "floats.gz", "wb") as stream:
        stream.write(struct.pack(">HBBI", 0, 0x0D, 1, 1) + b"\x00\x00\x00\x00")
    with pytest.raises(mnist_data.DataError, match=r"floats\.gz: not an IDX file of unsigned bytes"):
        mnist_data.read_idx(tmp_path / "floats.gz")
    (tmp_path / "plain.gz").write_text("not gzip")
    with pytest.raises(mnist_data.DataError, match=r"plain\.gz: not a readable gzip file"):
        mnist_data.read_idx(tmp_path / "plain.gz")


def test_embedded_mnist_is_the_full_real_dataset() -> None:
    train, test = mnist_data.load(mnist_data.resolve_source("mnist", {}))
    assert (len(train.labels), len(test.labels)) == (60000, 10000)
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
        split = mnist_data.load_file(save_npz(tmp_path / f"{name}.npz", data=data, labels=labels))
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
            r"pixels must be integers 0\.\.255 or floats within \[0, 1\] \(dtype float64\)",
        ),
        (
            {"data": np.full((2, 28, 28), 256), "labels": np.zeros(2, int)},
            r"pixels must be integers 0\.\.255",
        ),
        ({"data": np.zeros((0, 28, 28)), "labels": np.zeros(0, int)}, r"no examples"),
    ],
)
def test_bad_channel_npz_is_rejected_naming_the_file(tmp_path: Path, arrays: dict, message: str) -> None:
    path = save_npz(tmp_path / "train.npz", **arrays)
    with pytest.raises(mnist_data.DataError, match=re.escape(str(path)) + ".*" + message):
        mnist_data.load_file(path)


def test_missing_or_garbage_npz_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(mnist_data.DataError, match=r"train\.npz: file not found"):
        mnist_data.load_file(tmp_path / "train.npz")
    (tmp_path / "test.npz").write_text("not a zip")
    with pytest.raises(mnist_data.DataError, match=r"test\.npz: not a readable \.npz file"):
        mnist_data.load_file(tmp_path / "test.npz")
    np.save(tmp_path / "single.npy", np.zeros(3))
    (tmp_path / "single.npy").rename(tmp_path / "single.npz")
    with pytest.raises(mnist_data.DataError, match=r"single\.npz: a single array"):
        mnist_data.load_file(tmp_path / "single.npz")


def test_channels_take_precedence_and_test_npz_may_sit_in_the_train_channel(tmp_path: Path) -> None:
    assert mnist_data.resolve_source("mnist", {"SM_CHANNEL_TRAIN": str(tmp_path)}) == (
        tmp_path / "train.npz",
        tmp_path / "test.npz",
    )
    both = mnist_data.resolve_source("fashion_mnist", {"SM_CHANNEL_TRAIN": "/a", "SM_CHANNEL_TEST": "/b"})
    assert both == (Path("/a/train.npz"), Path("/b/test.npz"))
    with pytest.raises(mnist_data.DataError, match="SM_CHANNEL_TEST is set .* but SM_CHANNEL_TRAIN is not"):
        mnist_data.resolve_source("mnist", {"SM_CHANNEL_TEST": "/b"})
    with pytest.raises(mnist_data.DataError, match="unknown dataset 'cifar10'"):
        mnist_data.resolve_source("cifar10", {})


# ---- arguments (imports the script: TensorFlow and Horovod load, about 10 s: integration tier) -------------


@pytest.fixture(scope="module")
def train_mnist() -> ModuleType:
    import train_mnist

    return train_mnist


@pytest.mark.integration
def test_defaults_follow_the_sagemaker_environment(train_mnist: ModuleType) -> None:
    env = {"SAGEMAKER_BASE_DIR": "/job", "SM_MODEL_DIR": "/job/model", "SM_OUTPUT_DATA_DIR": "/job/out"}
    args = train_mnist.parse_args([], env)
    assert (args.model_dir, args.output_data_dir, args.checkpoint_dir) == (
        Path("/job/model"),
        Path("/job/out"),
        Path("/job/checkpoints"),
    )
    defaults = train_mnist.parse_args([], {})
    assert (defaults.model_dir, defaults.output_data_dir, defaults.checkpoint_dir) == (
        Path("/opt/ml/model"),
        Path("/opt/ml/output/data"),
        Path("/opt/ml/checkpoints"),
    )
    assert train_mnist.parse_args([], {"SM_CHECKPOINT_DIR": "/ckpt"}).checkpoint_dir == Path("/ckpt")


@pytest.mark.integration
def test_the_tensorflow_estimators_model_dir_means_the_local_model_dir(train_mnist: ModuleType) -> None:
    env = {"SM_MODEL_DIR": "/opt/ml/model"}
    for sdk_value in ("s3://bucket/job/model", "/opt/ml/shared/model"):  # SageMaker; SDK local mode
        assert train_mnist.parse_args(["--model_dir", sdk_value], env).model_dir == Path("/opt/ml/model")
    assert train_mnist.parse_args(["--model-dir", "/elsewhere"], env).model_dir == Path("/elsewhere")


@pytest.mark.integration
def test_hyperparameters_in_either_spelling(train_mnist: ModuleType) -> None:
    args = train_mnist.parse_args(
        ["--batch_size", "32", "--learning-rate", "0.01", "--steps_per_epoch", "5"], {}
    )
    assert (args.batch_size, args.learning_rate, args.steps_per_epoch) == (32, 0.01, 5)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--epochs", "2", "--optimiser", "sgd"], "unrecognized arguments: --optimiser sgd"),
        (["--epochs", "two"], "argument --epochs: invalid int value: 'two'"),
        (["--dataset", "cifar10"], "argument --dataset: invalid choice: 'cifar10'"),
    ],
)
@pytest.mark.integration
def test_bad_arguments_exit_2_with_a_clear_message(
    train_mnist: ModuleType,
    argv: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        train_mnist.parse_args(argv, {})
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.integration
def test_the_argument_table_of_docs_mnist_md_is_the_scripts(train_mnist: ModuleType) -> None:
    text = (SCRIPT_DIR.parents[1] / "docs" / "mnist.md").read_text()
    lines = text.split("| argument | default | meaning |\n", 1)[1].splitlines()[1:]
    rows = {}
    for line in itertools.takewhile(lambda row: row.startswith("|"), lines):
        name, default, _meaning = (cell.strip().strip("`") for cell in line.strip("|").split(" | ", 2))
        rows[name.removeprefix("--").replace("-", "_")] = default
    defaults = vars(train_mnist.parse_args([], {}))
    assert sorted(rows) == sorted(defaults)  # every argument, no other
    literal = {key: value for key, value in rows.items() if not value.startswith("$")}  # $SM_*: see above
    assert literal == {key: "one pass" if defaults[key] is None else str(defaults[key]) for key in literal}


@pytest.mark.integration
def test_a_resumed_history_keeps_the_epochs_its_checkpoint_holds(train_mnist: ModuleType) -> None:
    header = "epoch,accuracy,loss\n"
    rows = [f"{epoch},0.9,0.1\n" for epoch in range(4)]
    # Killed after epoch 2's row was logged, before its checkpoint: resumed at 2, rows 0 and 1 are kept.
    assert train_mnist.history_before(header + "".join(rows[:3]), 2) == header + rows[0] + rows[1]
    # A row cut by the kill is dropped, whatever its epoch; so is a header cut short, and no history at all.
    assert train_mnist.history_before(header + rows[0] + "1,0.9", 4) == header + rows[0]
    assert train_mnist.history_before("epoch,accu", 4) == ""
    assert train_mnist.history_before("", 3) == ""
    # A fresh job (no checkpoint: epoch 0) starts a new history even beside an old one.
    assert train_mnist.history_before(header + "".join(rows), 0) == header
