"""Shared fixtures: a SageMaker /opt/ml tree with a code directory and running the real `train` on it; the
S3 server and the simulated cluster (from support/, registered here so that every test folder sees them).

Test folders mirror the project's parts: launcher/ (src/smhvd, its subfolders src/smhvd's: config/, mpi/,
preflight/, proc/, report/, roles/, runscript/), stage/ (src/smhvd_stage), dev/ (dev/: the
simulator and the tree writer), examples/ (examples/), images/ (docker/ and bin/, the images and SDK clients).
A test's tier is its marker: integration (real processes), cluster (network namespaces), images (image
builds)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from smhvd.config.paths import SageMakerPaths
from smhvd_dev.mltree import write_ml_tree
from support.cluster import cluster_tools, code_dir, launch, make_cluster
from support.s3 import s3_port

__all__ = [
    "cluster_tools",
    "code_dir",
    "launch",
    "make_cluster",
    "s3_port",
]  # fixtures, registered by this import

REPO = Path(__file__).resolve().parent.parent
TRAIN = Path(sys.executable).parent / "train"


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.import_plugin("support.tiers")  # lists unit tests that start processes (tiers.py)


@dataclass
class TrainJob:
    paths: SageMakerPaths
    code: Path

    def env(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        """This machine's environment with the job's /opt/ml root (and `extra`)."""
        return {**os.environ, "SAGEMAKER_BASE_DIR": str(self.paths.base), **(extra or {})}

    def run(
        self, timeout: float = 240, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(TRAIN)], env=self.env(env), capture_output=True, text=True, timeout=timeout, check=False
        )

    def run_bytes(
        self, timeout: float = 240, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        """As run, with stdout and stderr as the bytes they are."""
        return subprocess.run(
            [str(TRAIN)], env=self.env(env), capture_output=True, timeout=timeout, check=False
        )

    def start(self, stdout: int | None = subprocess.PIPE) -> subprocess.Popen[str]:
        """`train` in the background, its stdout (as asked) and stderr piped, as text."""
        return subprocess.Popen(
            [str(TRAIN)], env=self.env(), stdout=stdout, stderr=subprocess.PIPE, text=True
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
