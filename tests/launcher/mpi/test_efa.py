"""The EFA decision, from what `fi_info` prints. No EFA device exists on these machines: the outputs below
follow libfabric's two formats (plain `provider: efa` blocks, and `-v` YAML with `prov_name` and `caps`)."""

import pytest

from smhvd.mpi import efa
from smhvd.mpi.efa import NO_DEVICE, EfaProbe, efa_env, expected_but_missing, read_probe

VERBOSE_RDMA = """---
fi_info:
    caps: [ FI_MSG, FI_RMA, FI_TAGGED, FI_RECV, FI_SEND, FI_READ, FI_WRITE, FI_REMOTE_READ, FI_SOURCE ]
    ep_attr:
        type: FI_EP_RDM
        protocol: FI_PROTO_EFA
    fabric_attr:
        name: efa
        prov_name: efa
"""
PLAIN_NO_RDMA = """provider: efa
    fabric: efa
    domain: efa_0-rdm
    version: 120.10
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
"""


@pytest.mark.parametrize(
    ("returncode", "stdout", "stderr", "present", "detail"),
    [
        (0, VERBOSE_RDMA, "", True, "libfabric's efa provider answers"),
        (0, PLAIN_NO_RDMA, "", True, "libfabric's efa provider answers"),
        # what the images' fi_info prints where there is no EFA device: said in words, not as an errno
        (61, "", "fi_getinfo: -61 (No data available)", False, NO_DEVICE),
        (0, "provider: tcp\n    fabric: 10.0.0.0/16\n", "", False, "fi_info -p efa: fabric: 10.0.0.0/16"),
        (
            1,
            "",
            "fi_getinfo: -22 (Invalid argument)\n",
            False,
            "fi_info -p efa: fi_getinfo: -22 (Invalid argument)",
        ),
        (None, "", "", False, "fi_info not found (no libfabric)"),
    ],
)
def test_read_probe(returncode, stdout, stderr, present, detail):
    assert read_probe(returncode, stdout, stderr) == EfaProbe(present, detail)


def test_no_efa_adds_nothing():
    assert efa_env(EfaProbe(False, "x"), {}) == {}


# Open MPI's libfabric path (Debian's Open MPI turns its ofi MTL off): tests/launcher/mpi/test_efa_mpi.py
OPEN_MPI_OFI = {"OMPI_MCA_pml": "cm", "OMPI_MCA_mtl": "ofi"}


def test_efa_sets_the_provider_fork_safety_and_open_mpis_libfabric_path_and_nothing_else():
    # Nothing for RDMA read or NCCL's protocol: libfabric and aws-ofi-nccl decide those themselves (efa.py)
    assert efa_env(EfaProbe(True, "x"), {}) == {"FI_PROVIDER": "efa", "FI_EFA_FORK_SAFE": "1", **OPEN_MPI_OFI}


def test_user_values_win():
    user = {"FI_PROVIDER": "tcp", "OMPI_MCA_pml": "ob1"}
    assert efa_env(EfaProbe(True, "x"), user) == {"FI_EFA_FORK_SAFE": "1", "OMPI_MCA_mtl": "ofi"}


def test_warn_only_where_the_instance_type_is_known_to_have_efa():
    missing = EfaProbe(False, "x")
    assert expected_but_missing(missing, "ml.p4d.24xlarge")
    assert not expected_but_missing(missing, "ml.c5.xlarge")
    assert not expected_but_missing(missing, None)
    assert not expected_but_missing(EfaProbe(True, "x"), "ml.p4d.24xlarge")


def test_the_start_line_says_what_the_ranks_really_get_when_custom_mpi_options_override_it():
    """Issue 51.4: `-x FI_PROVIDER=tcp` in custom_mpi_options wins over the launcher's FI_PROVIDER=efa (mpirun
    gives -x values over the environment's): the line says so instead of promising EFA."""
    found = efa.EfaProbe(True, "libfabric's efa provider answers")
    added = efa.efa_env(found, {})
    assert efa.ranks_line(found, added, ()) == (
        "EFA: libfabric's efa provider answers; ranks get FI_EFA_FORK_SAFE=1 FI_PROVIDER=efa "
        "OMPI_MCA_mtl=ofi OMPI_MCA_pml=cm"
    )
    options = (
        "-x",
        "FI_PROVIDER=efa",
        "-x",
        "FI_PROVIDER=tcp",
        "--mca",
        "btl",
        "tcp,self",
        "-x",
        "NCCL_DEBUG",
    )
    assert efa.options_set(options) == {"FI_PROVIDER": "tcp"}
    assert efa.ranks_line(found, added, options) == (
        "EFA: libfabric's efa provider answers; ranks get FI_EFA_FORK_SAFE=1 OMPI_MCA_mtl=ofi "
        "OMPI_MCA_pml=cm; custom_mpi_options sets FI_PROVIDER=tcp (the ranks' libfabric uses tcp, not EFA)"
    )
    assert efa.ranks_line(efa.EfaProbe(False, "fi_info not found (no libfabric)"), {}, options) == (
        "EFA: none (fi_info not found (no libfabric))"
    )
