"""Fixtures for the MNIST example's tests; its directory goes on sys.path (the tests import its modules)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from mnist_helpers import SCRIPT_DIR, Job

if str(SCRIPT_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPT_DIR))


@pytest.fixture
def job(tmp_path: Path) -> Job:
    return Job(tmp_path / "ml")


@pytest.fixture(scope="session")
def mnist_subset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Real MNIST cut down to 6000 train / 1000 test examples, as a user uploads it: <dir>/train/train.npz and
    <dir>/test/test.npz (uint8 pixels), one directory per SageMaker channel."""
    import mnist_data

    train, test = mnist_data.load(mnist_data.resolve_source("mnist", {}))
    directory = tmp_path_factory.mktemp("mnist-npz")
    for name, split, count in (("train", train, 6000), ("test", test, 1000)):
        images = np.rint(split.images[:count, :, :, 0] * 255).astype(np.uint8)
        (directory / name).mkdir()
        np.savez_compressed(directory / name / f"{name}.npz", data=images, labels=split.labels[:count])
    return directory
