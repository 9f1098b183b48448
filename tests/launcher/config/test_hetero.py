"""Heterogeneous clusters: where MPI runs, from resourceconfig instance groups and the SDK hyperparameter."""

import json

import pytest

from smhvd.config.instance_groups import Placement, group_env, placement
from smhvd.config.launcher_options import parse_launcher_options
from smhvd.config.sagemaker_files import parse_resource_config
from smhvd.errors import ConfigError

RAW = {
    "current_host": "algo-3",
    "current_group_name": "data",
    "hosts": ["algo-1", "algo-2", "algo-3"],
    "instance_groups": [
        {"instance_group_name": "data", "instance_type": "ml.c5.18xlarge", "hosts": ["algo-3"]},
        {"instance_group_name": "gpu", "instance_type": "ml.p4d.24xlarge", "hosts": ["algo-2", "algo-1"]},
    ],
    "network_interface_name": "eth0",
}
RESOURCES = parse_resource_config(RAW)


def test_mpi_runs_over_the_distribution_groups_hosts_sorted():
    where = placement(RESOURCES, RAW, ("gpu",))
    assert where == Placement(
        mpi_hosts=("algo-1", "algo-2"), current_group="data", distribution_groups=("gpu",)
    )


def test_without_the_hyperparameter_or_groups_every_host_runs_mpi():
    assert placement(RESOURCES, RAW, ()).mpi_hosts == ("algo-1", "algo-2", "algo-3")
    old = {k: v for k, v in RAW.items() if k not in ("instance_groups", "current_group_name")}
    where = placement(parse_resource_config(old), old, ("gpu",))
    assert where == Placement(("algo-1", "algo-2", "algo-3"), None, ())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            ["gpus"],
            r"expected names of instance groups in resourceconfig.json \['data', 'gpu'\], got \['gpus'\]",
        ),
        ([1], r"expected a list of instance group names, got \[1\]"),
        ({"gpu": 1}, r"expected a list of instance group names"),
    ],
)
def test_bad_group_names_are_config_errors(value, message):
    def where():
        options = parse_launcher_options({"sagemaker_distribution_instance_groups": value})
        return placement(RESOURCES, RAW, options.mpi.distribution_groups)

    with pytest.raises(ConfigError, match="sagemaker_distribution_instance_groups: " + message):
        where()


@pytest.mark.parametrize(
    ("value", "groups"),
    [(["gpu", "data", "gpu"], ("gpu", "data")), ('["gpu"]', ("gpu",)), ("gpu", ("gpu",)), ([], ())],
)
def test_the_hyperparameter_is_read_as_the_option_declares_it(value, groups):
    options = parse_launcher_options({"sagemaker_distribution_instance_groups": value})
    assert options.mpi.distribution_groups == groups


def test_the_toolkits_instance_group_variables():
    where = placement(RESOURCES, RAW, ("gpu",))
    assert group_env(RESOURCES, where) == {
        "SM_CURRENT_INSTANCE_GROUP": "data",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": json.dumps(["algo-3"]),
        "SM_INSTANCE_GROUPS": json.dumps(["data", "gpu"]),
        "SM_DISTRIBUTION_INSTANCE_GROUPS": json.dumps(["gpu"]),
        "SM_IS_HETERO": "true",
    }
