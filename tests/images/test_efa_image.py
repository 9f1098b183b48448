"""EFA in the CPU image (the GPU image has the same libfabric, and NCCL's plugin: test_gpu_image.py):
libfabric built with its efa provider is the image's only libfabric.so.1, and fi_info and Open MPI's ofi MTL
load it; with the launcher's EFA variables Open MPI selects that MTL. No EFA device exists here: the
launcher's probe says so in words, and Open MPI stops instead of falling back to TCP
(tests/launcher/mpi/test_efa_mpi.py checks the same against this machine's Open MPI)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from .efa_checks import EFA_LIB, assert_one_libfabric_with_efa
from .helpers import BuiltImage, run

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(3600)]


def test_the_image_has_one_libfabric_with_efa_and_open_mpi_links_it(
    cpu_image: BuiltImage, engine_env: dict[str, str]
) -> None:
    assert_one_libfabric_with_efa(cpu_image, engine_env)


PROBE = """
import json
from smhvd.mpi import efa
found = efa.probe()
print("PROBE", json.dumps({"present": found.present, "detail": found.detail}))
print("ENV", json.dumps(efa.efa_env(efa.EfaProbe(True, "stand-in"), {})))
"""
MPI_INIT = "from mpi4py import MPI; print('size', MPI.COMM_WORLD.Get_size())"


def test_the_probe_says_no_device_and_open_mpi_takes_the_one_libfabric_with_the_launchers_variables(
    cpu_image: BuiltImage, engine_env: dict[str, str]
) -> None:
    # The rank runs with the loader's log of what it initialises (LD_DEBUG=files): which libfabric Open MPI's
    # ofi MTL brings into the process. Those lines are kept apart from mpirun's own.
    script = (
        f"python -c {shlex.quote(PROBE)}; "
        "env $(python -c 'from smhvd.mpi import efa; "
        'print(" ".join(f"{k}={v}" for k, v in efa.efa_env(efa.EfaProbe(True, ""), {}).items()))\') '
        "mpirun -np 1 -x LD_DEBUG=files --mca mtl_base_verbose 10 --mca pml_base_verbose 10 "
        f"python -c {shlex.quote(MPI_INIT)} >/tmp/out 2>&1 || echo MPIRUN-FAILED; "
        "grep -E '^ +[0-9]+:.*calling init: .*libfabric' /tmp/out; grep -v -E '^ +[0-9]+:' /tmp/out"
    )
    cmd = ["podman", "run", "--rm", "--network", "none", cpu_image.immutable, "bash", "-c", script]
    out = run(cmd, engine_env, timeout=300).stdout
    probe = json.loads(out.split("PROBE ", 1)[1].splitlines()[0])
    # fi_info ran and found the provider without a device: said in words, not as fi_getinfo's errno
    assert probe == {"present": False, "detail": "libfabric's efa provider finds no EFA device"}, probe
    assert json.loads(out.split("ENV ", 1)[1].splitlines()[0])["OMPI_MCA_mtl"] == "ofi"
    assert "Selected component [ofi]" in out, out[-3000:]
    loaded = re.findall(r"calling init: (\S*libfabric\S*)", out)
    assert loaded and set(loaded) == {f"{EFA_LIB}libfabric.so.1"}, out[-3000:]
    assert "PML cm cannot be selected" in out and "MPIRUN-FAILED" in out, out[-3000:]
