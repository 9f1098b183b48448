"""The whole chain, pure and fast: an /opt/ml tree -> the job -> the mpirun plan -> the argv, by equality.

One host and two (the interface options, a custom option replacing a default, the drop list, and
NCCL_SOCKET_IFNAME already set in the environment). The interface is `lo`, which every host has.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from smhvd.config.job import Hardware, load_job
from smhvd.mpi.command import MpiPlan, build_mpirun_argv, plan_for
from smhvd_dev.mltree import write_ml_tree

PROGRAM = ("/venv/bin/python", "-m", "smhvd.rank")
HARDWARE = Hardware(cpus=4, gpus=0)
START = ["mpirun", "--allow-run-as-root", "--tag-output"]
DEFAULTS = [
    "--bind-to", "none", "--map-by", "slot",
    "--mca", "orte_abort_on_non_zero_status", "1", "--mca", "odls_base_sigkill_timeout", "0",
]  # fmt: skip


def argv_for(tmp_path: Path, hosts: tuple[str, ...], env: dict[str, str], **hps: object) -> list[str]:
    paths = write_ml_tree(
        tmp_path / "ml",
        current_host=hosts[0],
        hosts=hosts,
        network_interface_name="lo",
        hyperparameters={"sagemaker_program": "train.py", **hps},
    )
    job = load_job(paths, HARDWARE)
    return build_mpirun_argv(plan_for(job, PROGRAM, env, Path("/run/smhvd"), Path("/opt/ml/code")))


def test_one_host_runs_two_processes_with_the_defaults_and_forwards_by_name(tmp_path: Path) -> None:
    env = {"PATH": "/bin", "SM_HOSTS": '["algo-1"]', "SECRET": "x", "AWS_SECRET_ACCESS_KEY": "k"}
    argv = argv_for(tmp_path, ("algo-1",), env, sagemaker_mpi_num_of_processes_per_host=2)
    assert argv == [
        *START, "-np", "2", "--hostfile", "/run/smhvd/hostfile", "-wdir", "/opt/ml/code", *DEFAULTS,
        "-x", "PATH", "-x", "SM_HOSTS", *PROGRAM,
    ]  # fmt: skip


def test_two_hosts_pin_the_interface_and_reach_workers_with_the_jobs_ssh_config(tmp_path: Path) -> None:
    argv = argv_for(tmp_path, ("algo-1", "algo-2"), {"PATH": "/bin"})
    assert argv == [
        *START, "-np", "2", "--hostfile", "/run/smhvd/hostfile", "-wdir", "/opt/ml/code", *DEFAULTS,
        "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
        "-x", "NCCL_SOCKET_IFNAME=lo",
        "--mca", "plm_rsh_args", "-F /run/smhvd/ssh_config", "--mca", "plm_rsh_no_tree_spawn", "1",
        "-x", "PATH", *PROGRAM,
    ]  # fmt: skip


def test_two_hosts_with_a_custom_exclude_list_a_dropped_default_and_the_users_nccl_interface(
    tmp_path: Path,
) -> None:
    argv = argv_for(
        tmp_path,
        ("algo-1", "algo-2"),
        {"PATH": "/bin", "NCCL_SOCKET_IFNAME": "ens5"},
        sagemaker_mpi_num_of_processes_per_host=2,
        sagemaker_mpi_custom_mpi_options="--mca btl_tcp_if_exclude docker0 --report-bindings",
        launcher_drop_mpi_defaults="odls_base_sigkill_timeout,plm_rsh_no_tree_spawn",
    )
    assert argv == [
        *START, "-np", "4", "--hostfile", "/run/smhvd/hostfile", "-wdir", "/opt/ml/code",
        "--bind-to", "none", "--map-by", "slot", "--mca", "orte_abort_on_non_zero_status", "1",
        "--mca", "oob_tcp_if_include", "lo",
        "--mca", "plm_rsh_args", "-F /run/smhvd/ssh_config",
        "-x", "NCCL_SOCKET_IFNAME", "-x", "PATH",
        "--mca", "btl_tcp_if_exclude", "docker0", "--report-bindings", *PROGRAM,
    ]  # fmt: skip


def plan_of(tmp_path: Path, hosts: tuple[str, ...]) -> MpiPlan:
    paths = write_ml_tree(
        tmp_path / "ml",
        current_host=hosts[0],
        hosts=hosts,
        network_interface_name="lo",
        hyperparameters={"sagemaker_program": "train.py", "sagemaker_mpi_num_of_processes_per_host": 3},
    )
    return plan_for(load_job(paths, HARDWARE), PROGRAM, {}, Path("/run/smhvd"), Path("/opt/ml/code"))


def test_the_plan_owns_the_hostfile_and_the_one_multi_host_decision(tmp_path: Path) -> None:
    one = plan_of(tmp_path / "one", ("algo-1",))
    assert (one.multi_host, one.hostfile, one.hostfile_text) == (
        False,
        Path("/run/smhvd/hostfile"),
        "localhost slots=3\n",
    )
    assert one.ssh_config is None and one.interface is None
    two = plan_of(tmp_path / "two", ("algo-2", "algo-1"))
    assert (two.multi_host, two.hostfile_text) == (True, "algo-1 slots=3\nalgo-2 slots=3\n")
    assert two.ssh_config == Path("/run/smhvd/ssh_config") and two.interface == "lo"
    with pytest.raises(ValueError, match="ssh config"):
        replace(two, ssh_config=None)
