"""Running the MNIST example for real: one rank through plain `python`, two through Open MPI's `mpirun` with
what the launcher also sets on few cores (no binding, yield when idle, one TensorFlow thread a rank: the
script leaves threads to its launcher).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd.config.paths import SageMakerPaths
from smhvd_dev import plain_mpi

REPO = Path(__file__).resolve().parents[3]
SCRIPT_DIR = REPO / "examples" / "mnist"
SCRIPT = SCRIPT_DIR / "train_mnist.py"
MEASURE = REPO / "benchmarks" / "mnist_measure.py"  # the example with the benchmarks' timings
RUN_TIMEOUT = 420  # seconds for one training run on a loaded 2-core machine (they take 20-60 s when quiet)


@dataclass(frozen=True)
class Job(SageMakerPaths):
    """Directories of one run, laid out as SageMaker lays out /opt/ml (the launcher's own layout)."""

    @property
    def root(self) -> Path:
        return self.base

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The caller's environment without SM_* variables (none leak from a real job), rooted at this job."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("SM_")}
        env.update(
            SAGEMAKER_BASE_DIR=str(self.root),
            SM_MODEL_DIR=str(self.model_dir),
            SM_OUTPUT_DATA_DIR=str(self.output_data_dir),
            PYTHONUNBUFFERED="1",
            OMP_NUM_THREADS="1",
            TF_NUM_INTRAOP_THREADS="1",
            TF_NUM_INTEROP_THREADS="1",
        )
        env.update(extra or {})
        return env


def mpirun_argv(processes: int, script_args: Sequence[str], script: Path = SCRIPT) -> list[str]:
    return plain_mpi.mpirun_argv(processes, [sys.executable, str(script), *script_args])


def run_script(
    job: Job,
    script_args: Sequence[str],
    processes: int = 2,
    extra_env: Mapping[str, str] | None = None,
    script: Path = SCRIPT,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        plain_mpi.script_argv(script, script_args, processes),
        env=job.env(extra_env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
