"""Each host's own environment for its ranks (hostenv), and the interface a host really has (job)."""

import dataclasses
import json
import os
import socket
import threading

import pytest

from smhvd.config.hardware import parse_route_device
from smhvd.config.job import Hardware, Job, with_usable_interface
from smhvd.config.launcher_options import parse_launcher_options
from smhvd.config.sagemaker_files import parse_resource_config, read_json
from smhvd.roles import hostenv
from smhvd_dev.mltree import write_ml_tree


def test_merge_host_env_below_the_leaders_forwarded_values_and_own_host_values_on_top():
    served = {  # what the worker's train computed for its ranks
        "USER_FLAG": "worker",
        "AWS_ENDPOINT_URL_S3": "http://s3.local",
        "HOROVOD_CYCLE_TIME": "1",
        "SM_CURRENT_HOST": "algo-2",
        "SM_NUM_CPUS": "4",
    }
    received = {  # what orted gave the rank: mpirun's forwarded names, ORTE's own variables
        "HOROVOD_CYCLE_TIME": "5",
        "SM_CURRENT_HOST": "algo-1",
        "SM_NUM_CPUS": "8",
        "OMPI_COMM_WORLD_RANK": "1",
    }
    assert hostenv.merge(received, served) == {
        "USER_FLAG": "worker",
        "AWS_ENDPOINT_URL_S3": "http://s3.local",
        "HOROVOD_CYCLE_TIME": "5",
        "SM_CURRENT_HOST": "algo-2",
        "SM_NUM_CPUS": "4",
        "OMPI_COMM_WORLD_RANK": "1",
    }


def test_a_served_environment_reaches_a_client_and_nothing_is_served_after_the_block():
    port = 40000 + os.getpid() % 20000
    env = {"A": "1", "MULTI": "line\nbreak", "UNICODE": "\u00e9"}
    assert hostenv.fetch(port) is None
    with hostenv.serving(port, env):
        assert hostenv.fetch(port) == env
        assert hostenv.fetch(port) == env  # every rank asks once
    assert hostenv.fetch(port) is None


def test_a_garbled_answer_counts_as_none():
    port = 40000 + (os.getpid() + 1) % 20000
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(hostenv.socket_name(port))
        server.listen(1)

        def answer_garbage():
            conn, _ = server.accept()
            with conn:
                conn.sendall(json.dumps({"A": 1}).encode())  # values must be strings

        thread = threading.Thread(target=answer_garbage)
        thread.start()
        assert hostenv.fetch(port) is None
        thread.join()


@pytest.mark.parametrize(
    ("text", "device"),
    [
        ("10.89.0.3 dev eth0 src 10.89.0.2 uid 0 \\    cache ", "eth0"),
        ("local 127.0.0.1 dev lo table local src 127.0.0.1 uid 0", "lo"),
        ("10.1.2.3 via 10.0.0.1 dev ens5 src 10.0.0.7 uid 0", "ens5"),
        ("RTNETLINK answers: Network is unreachable", None),
        ("", None),
    ],
)
def test_route_device(text, device):
    assert parse_route_device(text) == device


def _job(tmp_path, interface):
    paths = write_ml_tree(
        tmp_path / "ml",
        current_host="algo-2",
        hosts=("algo-1", "algo-2", "algo-3"),
        network_interface_name=interface,
    )
    return Job(
        paths=paths,
        resources=parse_resource_config(read_json(paths.resource_config, required=True)),
        channels=(),
        raw_resources={},
        raw_input_data={},
        user_hyperparameters={},
        options=parse_launcher_options({}),
        hardware=Hardware(cpus=2, gpus=0),
    )


def test_a_named_interface_the_host_has_is_kept(tmp_path):
    job = _job(tmp_path, "eth0")
    assert with_usable_interface(job, {"lo", "eth0"}, lambda host: pytest.fail("no lookup needed")) is job


def test_a_missing_interface_becomes_the_one_routing_to_the_other_hosts(tmp_path, caplog):
    job = _job(tmp_path, "ethwe")
    asked = []

    def route(host):
        asked.append(host)
        return {"algo-1": None, "algo-3": "eth0"}[host]  # algo-1 does not resolve yet

    fixed = with_usable_interface(job, {"lo", "eth0"}, route)
    assert fixed == dataclasses.replace(
        job, resources=dataclasses.replace(job.resources, network_interface_name="eth0")
    )
    assert asked == ["algo-1", "algo-3"]  # never the host itself
    assert "network_interface_name 'ethwe' is not an interface of this host; using eth0" in caplog.text


def test_without_a_route_the_job_is_unchanged_for_validation_to_report(tmp_path):
    job = _job(tmp_path, "ethwe")
    assert with_usable_interface(job, {"lo", "eth0"}, lambda host: None, wait=0.05) is job
    assert with_usable_interface(job, {"lo", "eth0"}, lambda host: "docker0", wait=0.05) is job
