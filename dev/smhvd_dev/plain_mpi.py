"""A training script run without the launcher, for the example tests and the benchmarks that compare against
it: plain `python` at one rank, Open MPI's mpirun at more, with what the launcher also sets on few cores (no
binding, yield when idle). One place, so that the tests and the benchmarks run the same command.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path


def mpirun_argv(processes: int, program: Sequence[str]) -> list[str]:
    """`program` as `processes` ranks of one host under mpirun (as root too; more ranks than cores)."""
    return [
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        str(processes),
        "--bind-to",
        "none",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        *program,
    ]


def script_argv(script: Path, args: Sequence[str], processes: int) -> list[str]:
    """`python SCRIPT ARGS` at one rank, under mpirun (mpirun_argv) at more."""
    program = [sys.executable, str(script), *args]
    return program if processes == 1 else mpirun_argv(processes, program)
