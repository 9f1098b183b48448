"""What Open MPI does with the variables the launcher gives the ranks when the probe finds EFA: this machine's
Open MPI is the images' (Debian's 4.1, with its /etc/openmpi/openmpi-mca-params.conf), and so is libfabric.

No EFA device exists here. So the check is what Open MPI chooses, from its own verbose selection log:
without the launcher's variables the ofi MTL (libfabric, hence EFA) is never even asked (Debian's
configuration turns it off: MPI runs over TCP); with them it is selected, and with no EFA device behind it
the job fails loudly instead of quietly running over TCP.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from smhvd.mpi.efa import EfaProbe, efa_env

pytestmark = pytest.mark.integration

MPI_INIT = "from mpi4py import MPI; print('size', MPI.COMM_WORLD.Get_size())"


def mpirun_with(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One rank that calls MPI_Init, with Open MPI's MTL and PML selection logged."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_MCA_", "FI_"))} | extra
    argv = ["mpirun", "--allow-run-as-root", "-np", "1", "--mca", "mtl_base_verbose", "10"]
    argv += ["--mca", "pml_base_verbose", "10", sys.executable, "-c", MPI_INIT]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_without_efa_debians_open_mpi_never_asks_libfabric():
    result = mpirun_with({})
    assert result.returncode == 0, result.stderr
    assert "size 1" in result.stdout
    assert "Querying component [ofi]" not in result.stdout + result.stderr


def test_with_the_launchers_efa_variables_open_mpi_takes_libfabric_or_fails():
    added = efa_env(EfaProbe(present=True, detail="stand-in: no EFA device here"), {})
    result = mpirun_with(added)
    log = result.stdout + result.stderr
    assert "Selected component [ofi]" in log, log[-3000:]
    assert "PML cm cannot be selected" in log  # no EFA device behind it: the job stops, it does not use TCP
    assert result.returncode != 0 and "size 1" not in result.stdout
