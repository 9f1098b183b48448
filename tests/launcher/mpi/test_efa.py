"""The EFA decision, from what `fi_info` prints. No EFA device exists on these machines: the outputs below
follow libfabric's two formats (plain `provider: efa` blocks, and `-v` YAML with `prov_name` and `caps`)."""

import pytest

from smhvd.mpi.efa import EfaProbe, efa_env, expected_but_missing, read_probe

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
    ("returncode", "stdout", "stderr", "present", "rdma"),
    [
        (0, VERBOSE_RDMA, "", True, True),
        (0, PLAIN_NO_RDMA, "", True, False),
        (61, "", "fi_getinfo: -61 (No data available)", False, False),  # libfabric without an EFA device
        (0, "provider: tcp\n    fabric: 10.0.0.0/16\n", "", False, False),
        (None, "", "", False, False),  # fi_info not installed
    ],
)
def test_read_probe(returncode, stdout, stderr, present, rdma):
    found = read_probe(returncode, stdout, stderr)
    assert (found.present, found.rdma) == (present, rdma)
    assert found.detail


def test_no_efa_adds_nothing():
    assert efa_env(EfaProbe(False, False, "x"), {}) == {}


# Open MPI's libfabric path (Debian's Open MPI turns its ofi MTL off): tests/launcher/mpi/test_efa_mpi.py
OPEN_MPI_OFI = {"OMPI_MCA_pml": "cm", "OMPI_MCA_mtl": "ofi"}


def test_efa_sets_the_provider_fork_safety_and_rdma_only_when_the_device_does_rdma_read():
    assert efa_env(EfaProbe(True, True, "x"), {}) == {
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        **OPEN_MPI_OFI,
    }
    assert efa_env(EfaProbe(True, False, "x"), {}) == {
        "FI_PROVIDER": "efa",
        "FI_EFA_FORK_SAFE": "1",
        **OPEN_MPI_OFI,
    }


def test_user_values_win():
    user = {"FI_PROVIDER": "tcp", "FI_EFA_USE_DEVICE_RDMA": "0", "OMPI_MCA_pml": "ob1"}
    assert efa_env(EfaProbe(True, True, "x"), user) == {"FI_EFA_FORK_SAFE": "1", "OMPI_MCA_mtl": "ofi"}


def test_warn_only_where_the_instance_type_is_known_to_have_efa():
    missing = EfaProbe(False, False, "x")
    assert expected_but_missing(missing, "ml.p4d.24xlarge")
    assert not expected_but_missing(missing, "ml.c5.xlarge")
    assert not expected_but_missing(missing, None)
    assert not expected_but_missing(EfaProbe(True, True, "x"), "ml.p4d.24xlarge")
