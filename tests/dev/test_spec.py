"""Pure parts of the cluster tool: names, addresses, the files each host sees, argument parsing."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from smhvd_dev.mltree import resource_config
from smhvd_sim import registry
from smhvd_sim.cli import _fault, build_parser, exit_status, expand_faults, spec_from_args
from smhvd_sim.hosttrees import write_host_tree
from smhvd_sim.jobs import Fault, HostResult, exit_code_of
from smhvd_sim.spec import (
    ClusterSpec,
    HostAddress,
    encode_hyperparameter,
    host_addresses,
    hosts_file,
)
from smhvd_sim.system import ClusterError


def test_host_addresses_are_unique_on_the_slot_subnet_and_link_names_fit() -> None:
    addresses = host_addresses(64, "abc123", 7)
    assert addresses[0] == HostAddress(
        name="algo-1", index=1, address=ipaddress.IPv4Interface("10.231.7.11/24"), outer_link="smhvdabc123h1"
    )
    assert addresses[-1].address == ipaddress.IPv4Interface("10.231.7.74/24")
    assert [a.name for a in addresses] == [f"algo-{k}" for k in range(1, 65)]
    assert len({a.address.ip for a in addresses}) == 64
    assert len({a.outer_link for a in addresses}) == 64
    assert all(len(a.outer_link) <= 15 for a in addresses)


def test_hosts_file_maps_every_host_to_its_eth0_address() -> None:
    text = hosts_file(host_addresses(2, "abc123", 0))
    assert "10.231.0.11\talgo-1\n" in text
    assert "10.231.0.12\talgo-2\n" in text
    assert text.startswith("127.0.0.1\tlocalhost\n")


def test_resource_config_names_the_current_host_and_all_hosts() -> None:
    config = resource_config("algo-2", ["algo-1", "algo-2"], "ml.c5.xlarge")
    assert config["current_host"] == "algo-2"
    assert config["hosts"] == ["algo-1", "algo-2"]
    assert config["network_interface_name"] == "eth0"
    assert config["instance_groups"] == [
        {
            "instance_group_name": "homogeneousCluster",
            "instance_type": "ml.c5.xlarge",
            "hosts": ["algo-2", "algo-1"],
        }
    ]


@pytest.mark.parametrize(
    ("given", "written"),
    [("2", "2"), ("0.5", "0.5"), ("true", "true"), ("mnist.py", '"mnist.py"'), ('"quoted"', '"quoted"')],
)
def test_hyperparameters_are_encoded_as_the_sdk_writes_them(given: str, written: str) -> None:
    assert encode_hyperparameter(given) == written


def test_spec_rejects_bad_host_counts_and_unencoded_values(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="hosts: expected 2 to 64, got 65"):
        ClusterSpec(hosts=65, workdir=tmp_path)
    with pytest.raises(ClusterError, match="hosts: expected 2 to 64, got 1"):
        ClusterSpec(hosts=1, workdir=tmp_path)
    with pytest.raises(ClusterError, match="hyperparameters\\['epochs'\\]"):
        ClusterSpec(hosts=2, workdir=tmp_path, hyperparameters={"epochs": 2})  # type: ignore[dict-item]


def test_ml_tree_has_config_channels_code_and_output_dirs(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.bin").write_bytes(b"x")
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text("print(1)\n")
    spec = ClusterSpec(
        hosts=2,
        workdir=tmp_path,
        hyperparameters={"sagemaker_program": '"train.py"'},
        channels={"train": data},
        code_dir=code,
    )
    root = tmp_path / "tree"
    write_host_tree(root, spec, "algo-2")
    config = root / "input" / "config"
    assert json.loads((config / "resourceconfig.json").read_text())["current_host"] == "algo-2"
    assert json.loads((config / "hyperparameters.json").read_text()) == {
        "sagemaker_program": '"train.py"',
        "sagemaker_submit_directory": '"/opt/ml/code"',
    }
    assert json.loads((config / "inputdataconfig.json").read_text())["train"]["TrainingInputMode"] == "File"
    assert (root / "input" / "data" / "train" / "a.bin").read_bytes() == b"x"
    assert (root / "code" / "train.py").exists()
    assert (root / "model").is_dir()
    assert (root / "output" / "data").is_dir()


def test_missing_channel_directory_is_a_one_line_error(tmp_path: Path) -> None:
    spec = ClusterSpec(hosts=2, workdir=tmp_path, channels={"train": tmp_path / "nope"})
    with pytest.raises(ClusterError, match=r"channel train: .*nope is not a directory"):
        write_host_tree(tmp_path / "tree", spec, "algo-1")


def test_cli_builds_the_spec_and_expands_faults(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["run", "-n", "3", "--workdir", str(tmp_path), "--hp", "epochs=2", "--hp", "sagemaker_program=t.py",
         "--fault", "all:term@5", "--", "train"]
    )  # fmt: skip
    spec = spec_from_args(args)
    assert spec.hyperparameters == {"epochs": "2", "sagemaker_program": '"t.py"'}
    assert spec.hosts == 3
    assert expand_faults(args.fault, spec.host_names) == [Fault(f"algo-{k}", "term", 5.0) for k in (1, 2, 3)]


def test_bad_fault_is_rejected() -> None:
    with pytest.raises(Exception, match="kind must be one of"):
        _fault("algo-2:explode@1")


def test_exit_codes_and_run_status(tmp_path: Path) -> None:
    assert exit_code_of(-9) == 137
    assert exit_code_of(3) == 3

    def result(code: int | None, timed_out: bool = False) -> HostResult:
        return HostResult("algo-1", code, 0.0, 1.0, tmp_path, timed_out)

    assert exit_status({"a": result(0), "b": result(0)}) == 0
    assert exit_status({"a": result(0), "b": result(1)}) == 1
    assert exit_status({"a": result(0), "b": result(None)}) == 0
    assert exit_status({"a": result(None, timed_out=True)}) == 124


def test_free_slot_is_the_lowest_one_no_live_cluster_holds() -> None:
    def record(slot: int) -> registry.Record:
        return registry.Record(cluster_id=f"c{slot}", owner_pid=1, slot=slot, links=(), created_dirs=())

    assert registry.free_slot([]) == 0
    assert registry.free_slot([record(0), record(1), record(3)]) == 2
