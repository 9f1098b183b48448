"""Shared fixtures: a SageMaker /opt/ml tree with a code directory, and running the real `train` on it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from smhvd.mltree import write_ml_tree
from smhvd.paths import SageMakerPaths

REPO = Path(__file__).resolve().parent.parent
TRAIN = Path(sys.executable).parent / "train"


@dataclass
class TrainJob:
    paths: SageMakerPaths
    code: Path

    def run(
        self, timeout: float = 240, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TRAIN)],
            env={**os.environ, "SAGEMAKER_BASE_DIR": str(self.paths.base), **(env or {})},
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def failure(self) -> str | None:
        path = self.paths.failure_file
        return path.read_text() if path.exists() else None


@pytest.fixture
def train_job(tmp_path):
    """make(script_text, hyperparameters, program='train.py') -> TrainJob (SDK-encoded hyperparameters)."""

    def make(
        script: str,
        hyperparameters: dict[str, object] | None = None,
        program: str = "train.py",
        **tree: object,
    ) -> TrainJob:
        code = tmp_path / "code"
        code.mkdir(exist_ok=True)
        (code / program).write_text(textwrap.dedent(script))
        hps = {
            "sagemaker_program": program,
            "sagemaker_submit_directory": str(code),
            **(hyperparameters or {}),
        }
        paths = write_ml_tree(tmp_path / "ml", hyperparameters=hps, **tree)  # type: ignore[arg-type]
        return TrainJob(paths, code)

    return make
