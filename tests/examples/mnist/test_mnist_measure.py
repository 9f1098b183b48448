"""The benchmarks' measuring aids for the MNIST example (benchmarks/mnist_measure.py), without training: the
figures an epoch timer derives from its clocks, and the code directory for simulated clusters."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mnist_helpers import REPO, SCRIPT_DIR

sys.path.insert(0, str(REPO / "benchmarks"))
import mnist_measure


def test_figures_are_the_training_steps_rates_and_the_whole_epochs_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    readings = iter(
        [
            mnist_measure.Clocks(wall=100.0, cpu=10.0),  # epoch begins
            mnist_measure.Clocks(wall=104.0, cpu=16.0),  # validation begins: 4 s of steps, 6 CPU-s
            mnist_measure.Clocks(wall=105.5, cpu=17.5),  # epoch ends
        ]
    )
    monkeypatch.setattr(mnist_measure.Clocks, "now", staticmethod(lambda: next(readings)))
    timer = mnist_measure.EpochTimer(images_per_step=128)
    timer.on_epoch_begin(0)
    timer.on_test_begin()
    timer.on_test_begin()  # a second validation pass changes nothing
    assert timer.figures(steps=50) == {
        "images_per_sec": 1600.0,  # 50 steps x 128 images / 4 s
        "epoch_seconds": 5.5,
        "rank_cpu_cores": 1.5,
    }


def test_code_dir_holds_the_example_and_the_wrapper(tmp_path: Path) -> None:
    code = mnist_measure.code_dir(tmp_path / "code")
    example = {"mnist_data.py", "train_mnist.py", "upload_mnist.py"}  # examples/mnist, written out
    assert {path.name for path in code.iterdir()} == example | {"mnist_measure.py"}
    for name in example:
        assert (code / name).read_bytes() == (SCRIPT_DIR / name).read_bytes()
    assert (code / "mnist_measure.py").read_bytes() == (REPO / "benchmarks" / "mnist_measure.py").read_bytes()
    assert (code / mnist_measure.PROGRAM).is_file()  # the program the benchmark's jobs run is there
