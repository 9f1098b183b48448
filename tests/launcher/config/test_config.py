import json
import logging

import pytest

from smhvd.cli import configure_logging
from smhvd.config.sagemaker_files import (
    InstanceGroup,
    ResourceConfig,
    parse_input_data_config,
    parse_resource_config,
    read_json,
)
from smhvd.env_options import log_level
from smhvd.errors import ConfigError

# A current file (p4d, two hosts, instance group listing hosts out of order), an old one, SDK local mode.
CURRENT = {
    "current_host": "algo-2",
    "current_instance_type": "ml.p4d.24xlarge",
    "current_group_name": "homogeneousCluster",
    "hosts": ["algo-1", "algo-2"],
    "instance_groups": [
        {
            "instance_group_name": "homogeneousCluster",
            "instance_type": "ml.p4d.24xlarge",
            "hosts": ["algo-2", "algo-1"],
        }
    ],
    "network_interface_name": "eth0",
}


def test_current_shape_parses_completely():
    assert parse_resource_config(CURRENT) == ResourceConfig(
        current_host="algo-2",
        hosts=("algo-1", "algo-2"),
        network_interface_name="eth0",
        current_instance_type="ml.p4d.24xlarge",
        instance_groups=(InstanceGroup("homogeneousCluster", "ml.p4d.24xlarge", ("algo-2", "algo-1")),),
    )


def test_leader_is_first_sorted_host_whatever_the_file_order():
    config = parse_resource_config(
        {"current_host": "algo-3", "hosts": ["algo-3", "algo-10", "algo-1"], "network_interface_name": "eth1"}
    )
    assert config.hosts == ("algo-1", "algo-10", "algo-3")  # sorted: the leader (Job.leader) is the first
    assert config.instance_groups == ()
    assert config.network_interface_name == "eth1"


def test_sdk_local_mode_hosts():
    config = parse_resource_config(
        {"current_host": "algo-1-xk3z9", "hosts": ["algo-2-ab12c", "algo-1-xk3z9"]}
    )
    assert config.hosts == ("algo-1-xk3z9", "algo-2-ab12c") and config.current_host == config.hosts[0]
    assert config.network_interface_name is None


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([], "resourceconfig.json: expected a JSON object, got 'list'"),
        ({"hosts": ["algo-1"]}, "resourceconfig.json: current_host: expected the name of this host"),
        ({"current_host": "algo-1"}, "resourceconfig.json: hosts: expected the list of all hosts of the job"),
        (
            {"current_host": "algo-3", "hosts": ["algo-1", "algo-2"]},
            "resourceconfig.json: current_host: expected one of hosts ['algo-1', 'algo-2'], got 'algo-3'",
        ),
        (
            {"current_host": "algo-1", "hosts": []},
            "resourceconfig.json: hosts: expected a non-empty list of host names, got []",
        ),
        (
            {"current_host": "algo-1", "hosts": ["algo-1", "algo-1"]},
            "resourceconfig.json: hosts: expected distinct host names, got ['algo-1', 'algo-1']",
        ),
        (
            {"current_host": "algo-1", "hosts": ["algo-1", "-oProxyCommand=x"]},
            "resourceconfig.json: hosts[1]: expected a host name (letters, digits, '.', '-', '_'), "
            "got '-oProxyCommand=x'",
        ),
        (
            {"current_host": "algo-1", "hosts": ["algo-1"], "network_interface_name": 5},
            "resourceconfig.json: network_interface_name: expected a non-empty string, got 5",
        ),
        (
            {
                "current_host": "algo-1",
                "hosts": ["algo-1"],
                "instance_groups": [{"instance_group_name": "g", "instance_type": "t", "hosts": ["algo-9"]}],
            },
            "resourceconfig.json: instance_groups[0].hosts: expected hosts listed in 'hosts' ['algo-1'], "
            "got ['algo-9']",
        ),
    ],
)
def test_bad_resource_config_names_file_key_and_expectation(data, expected):
    with pytest.raises(ConfigError) as err:
        parse_resource_config(data)
    assert str(err.value) == expected


def test_read_json_errors_name_the_path(tmp_path):
    bad = tmp_path / "resourceconfig.json"
    bad.write_text('{"current_host": ')
    with pytest.raises(ConfigError, match=r"resourceconfig.json: expected valid JSON \(line 1 column 18"):
        read_json(bad, required=True)
    with pytest.raises(ConfigError, match=r"missing.json: expected the file to exist"):
        read_json(tmp_path / "missing.json", required=True)
    assert read_json(tmp_path / "missing.json", required=False) == {}


def test_input_data_config_channels_sorted_and_validated():
    channels = parse_input_data_config(
        {
            "train": {
                "ContentType": "application/x-npz",
                "TrainingInputMode": "File",
                "S3DistributionType": "FullyReplicated",
                "RecordWrapperType": "None",
            },
            "eval": {"TrainingInputMode": "File"},
        }
    )
    assert [c.name for c in channels] == ["eval", "train"]
    assert channels[1].content_type == "application/x-npz"
    assert channels[1].distribution == "FullyReplicated"
    with pytest.raises(
        ConfigError, match="train.TrainingInputMode: expected File, Pipe or FastFile, got 'Stream'"
    ):
        parse_input_data_config({"train": {"TrainingInputMode": "Stream"}})
    with pytest.raises(ConfigError, match="expected a JSON object"):
        parse_input_data_config(json.loads('["train"]'))


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("abc", ">= 1"), ("0", ">= 1"), ("22.5", ">= 1"), ("70000", "<= 65535"), ("-22", ">= 1")],
)
def test_a_bad_ssh_port_is_a_configuration_error(raw, expected):
    from smhvd.env_options import read_env_options
    from smhvd.errors import EX_CONFIG, ConfigError

    with pytest.raises(ConfigError) as err:
        read_env_options({"SMHVD_SSH_PORT": raw})
    assert str(err.value) == f"environment: SMHVD_SSH_PORT: expected an integer {expected}, got {raw!r}"
    assert err.value.exit_code == EX_CONFIG  # 78, like every other bad setting (it was 69, "unavailable")
    assert read_env_options({"SMHVD_SSH_PORT": "2222"}).ssh_port == 2222
    assert read_env_options({}).ssh_port == read_env_options({"SMHVD_SSH_PORT": ""}).ssh_port == 22


@pytest.mark.parametrize(
    ("text", "debug", "info"), [("0", True, True), ("10", True, True), ("info", False, True)]
)
def test_the_launcher_log_level_0_logs_every_record(text, debug, info):
    # logging.NOTSET on a named logger would defer to the root logger's WARNING: the lowest level, least shown
    logger = logging.getLogger("smhvd")
    saved = (logger.level, logger.handlers[:], logger.propagate)
    try:
        configure_logging(log_level(text))
        assert (logger.isEnabledFor(logging.DEBUG), logger.isEnabledFor(logging.INFO)) == (debug, info)
    finally:
        logger.setLevel(saved[0])
        logger.handlers[:] = saved[1]
        logger.propagate = saved[2]
