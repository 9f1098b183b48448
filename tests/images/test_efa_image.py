"""EFA in the CPU image: the launcher's probe has its fi_info, and the image's Open MPI takes libfabric (the
efa provider) when the launcher's EFA variables are set. No EFA device exists here: the probe must say so
from fi_info itself (not "fi_info not found"), and Open MPI must select its ofi MTL and then stop, rather than
fall back to TCP (tests/launcher/mpi/test_efa_mpi.py checks the same against this machine's Open MPI)."""

from __future__ import annotations

import json
import shlex

import pytest

from .helpers import BuiltImage, run

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(3600)]

PROBE = """
import json
from smhvd.mpi import efa
found = efa.probe()
print("PROBE", json.dumps({"present": found.present, "detail": found.detail}))
print("ENV", json.dumps(efa.efa_env(efa.EfaProbe(True, "stand-in"), {})))
"""
MPI_INIT = "from mpi4py import MPI; print('size', MPI.COMM_WORLD.Get_size())"


def test_the_probe_runs_and_open_mpi_takes_libfabric_with_the_launchers_variables(
    cpu_image: BuiltImage, engine_env: dict[str, str]
) -> None:
    script = (
        f"python -c {shlex.quote(PROBE)}; "
        "env $(python -c 'from smhvd.mpi import efa; "
        'print(" ".join(f"{k}={v}" for k, v in efa.efa_env(efa.EfaProbe(True, ""), {}).items()))\') '
        "mpirun -np 1 --mca mtl_base_verbose 10 --mca pml_base_verbose 10 "
        f"python -c {shlex.quote(MPI_INIT)} 2>&1 || echo MPIRUN-FAILED"
    )
    cmd = ["podman", "run", "--rm", "--network", "none", cpu_image.immutable, "bash", "-c", script]
    out = run(cmd, engine_env, timeout=300).stdout
    probe = json.loads(out.split("PROBE ", 1)[1].splitlines()[0])
    # fi_info ran and its fi_getinfo found nothing: said in words, not as an errno
    assert probe == {"present": False, "detail": "libfabric's efa provider finds no EFA device"}, probe
    assert json.loads(out.split("ENV ", 1)[1].splitlines()[0])["OMPI_MCA_mtl"] == "ofi"
    assert "Selected component [ofi]" in out, out[-3000:]
    assert "PML cm cannot be selected" in out and "MPIRUN-FAILED" in out, out[-3000:]
