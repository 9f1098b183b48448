"""Fixtures for the Mask R-CNN reference script: its package on sys.path, synthetic data, running it."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SCRIPT_DIR = REPO / "examples" / "maskrcnn"
SCRIPT = SCRIPT_DIR / "train_maskrcnn.py"
if str(SCRIPT_DIR) not in sys.path:
    sys.path.insert(0, str(SCRIPT_DIR))

from make_shapes import generate  # noqa: E402


@pytest.fixture(scope="session")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir with train/ (24 images) and val/ (6 images) synthetic COCO shapes."""
    root = tmp_path_factory.mktemp("shapes")
    generate(root / "train", 24, size=128, seed=1)
    generate(root / "val", 6, size=128, seed=2)
    return root


def mpirun_argv(np_: int) -> list[str]:
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise RuntimeError("mpirun not found: run `make setup` (installs Open MPI)")
    return [
        mpirun, "--allow-run-as-root", "-np", str(np_), "--bind-to", "none",
        "--mca", "mpi_yield_when_idle", "1", "-x", "OMP_NUM_THREADS=1", "-x", "SAGEMAKER_BASE_DIR",
        "-x", "PATH",
    ]  # fmt: skip


def run_script(
    args: list[str], base: Path, np_: int = 1, timeout: float = 420, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The training script as `np_` MPI ranks (or one plain process), SAGEMAKER_BASE_DIR=base, plus `env`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "OMPI_", "PMI_"))} | (env or {})
    env["SAGEMAKER_BASE_DIR"] = str(base)
    prefix = mpirun_argv(np_) if np_ > 1 else []
    return subprocess.run(
        [*prefix, sys.executable, str(SCRIPT), *args],
        env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def run_train(base: Path, timeout: float = 420) -> subprocess.CompletedProcess[str]:
    """The project's `train` launcher on the /opt/ml tree at `base`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SM_", "OMPI_", "PMI_"))}
    env["SAGEMAKER_BASE_DIR"] = str(base)
    train = Path(sys.executable).parent / "train"
    return subprocess.run([str(train)], env=env, capture_output=True, text=True, timeout=timeout, check=False)


def train_hyperparameters(config: str) -> dict[str, object]:
    """The SageMaker hyperparameters of a tiny-preset job of the script at 2 processes per host."""
    return {
        "sagemaker_program": SCRIPT.name,
        "sagemaker_submit_directory": str(SCRIPT_DIR),
        "sagemaker_mpi_enabled": True,
        "sagemaker_mpi_num_of_processes_per_host": 2,
        "preset": "tiny",
        "config": config,
    }


def cocoeval_stats(annotation_file: Path, detections: list[dict], kind: str) -> list[float | None]:
    """pycocotools' own summary of `detections` (bbox or segm) against the annotations, -1 as None: what
    eval.json must hold, computed without the script."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(annotation_file))
        ev = COCOeval(gt, gt.loadRes(detections), kind)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return [float(v) if v >= 0 else None for v in ev.stats]
