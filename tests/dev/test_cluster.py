"""The simulated cluster itself, on real namespaces: what each host sees, ssh and mpirun between hosts,
faults, and that teardown leaves nothing behind whatever happens."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smhvd.proc import processes
from smhvd_sim import Cluster, ClusterSpec, registry
from smhvd_sim.host import HostLayout, SimHost
from smhvd_sim.jobs import Fault
from smhvd_sim.spec import host_addresses
from smhvd_sim.system import wait_for
from support.cluster import SSH_OPTIONS, MakeCluster, start_sshd

pytestmark = [pytest.mark.cluster, pytest.mark.integration]


def test_each_host_has_its_name_address_tree_and_no_default_route(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    addresses = {address.name: str(address.address.ip) for address in cluster.addresses}
    for host in ("algo-1", "algo-2", "algo-3"):
        code, out = cluster.exec(host, ["hostname"])
        assert (code, out.strip()) == (0, host)
        code, out = cluster.exec(host, ["getent", "hosts", "algo-1", "algo-2", "algo-3"])
        assert code == 0
        assert {line.split()[1]: line.split()[0] for line in out.splitlines()} == addresses
        code, out = cluster.exec(host, ["ip", "-o", "-4", "addr", "show", "dev", "eth0"])
        assert code == 0
        assert f"inet {addresses[host]}/24" in out
        code, out = cluster.exec(host, ["ip", "route"])
        assert "default" not in out
        config = json.loads(cluster.exec(host, ["cat", "/opt/ml/input/config/resourceconfig.json"])[1])
        assert config["current_host"] == host
        assert config["hosts"] == ["algo-1", "algo-2", "algo-3"]


def test_hosts_have_private_processes_tmp_and_etc(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    code, out = cluster.exec("algo-1", ["ps", "-eo", "pid=,args="])
    assert code == 0
    pids = {int(line.split()[0]): line.split(None, 1)[1] for line in out.splitlines()}
    assert "hostinit.py" in pids[1]
    assert len(pids) == 2  # PID 1 and ps itself: nothing of the machine or of algo-2
    assert (
        cluster.exec("algo-1", ["sh", "-c", "echo one > /tmp/mark && echo A=1 >> /etc/environment"])[0] == 0
    )
    assert cluster.exec("algo-2", ["test", "-e", "/tmp/mark"])[0] == 1
    assert "A=1" not in Path("/etc/environment").read_text()
    assert cluster.exec("algo-2", ["test", "-d", "/run/sshd"])[0] == 0


def test_ssh_from_one_host_to_another(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    start_sshd(cluster, "algo-2")
    code, out = cluster.exec("algo-1", ["ssh", *SSH_OPTIONS, "algo-2", "hostname"])
    assert (code, out.strip()) == (0, "algo-2")


def test_mpirun_runs_communicating_ranks_on_two_hosts(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    start_sshd(cluster, "algo-2")
    script = (
        "import socket; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print('rank', c.rank, socket.gethostname(), c.allreduce(c.rank + 1), flush=True)"
    )
    code, out = cluster.exec(
        "algo-1",
        ["mpirun", "--allow-run-as-root", "-np", "2", "-H", "algo-1:1,algo-2:1", "--bind-to", "none",
         "-x", "PATH", "--mca", "plm_rsh_args", " ".join(SSH_OPTIONS), sys.executable, "-c", script],
        timeout=120,
    )  # fmt: skip
    assert code == 0, out
    assert "rank 0 algo-1 3" in out
    assert "rank 1 algo-2 3" in out


def test_run_collects_each_hosts_exit_code_log_and_timing(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    results = cluster.run(["sh", "-c", 'echo "on $(hostname)"; exit "${HOSTNAME_EXIT:-0}"'], timeout=60)
    assert [result.exit_code for result in results.values()] == [0, 0, 0]
    for host, result in results.items():
        assert result.log.read_text() == f"on {host}\n"
        assert result.seconds is not None
        assert 0 < result.seconds < 30
    results = cluster.run(["sh", "-c", 'case "$(hostname)" in algo-2) exit 5;; esac'], timeout=60)
    assert {host: result.exit_code for host, result in results.items()} == {
        "algo-1": 0,
        "algo-2": 5,
        "algo-3": 0,
    }


def test_faults_term_kill_stop_and_a_host_held_down(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(3)
    # algo-1 gets SIGTERM (the command traps it and saves a file), algo-2 has all its processes killed
    # (a daemon it left behind included), algo-3 is taken down entirely.
    script = (
        "trap 'echo saved > /opt/ml/output/data/on-term; exit 143' TERM; "
        "setsid sleep 300 & sleep 300 & wait"
    )
    started = time.monotonic()
    results = cluster.run(
        ["sh", "-c", script],
        faults=[Fault("algo-1", "term", 1.0), Fault("algo-2", "kill", 1.0), Fault("algo-3", "stop", 1.0)],
        timeout=60,
    )
    assert time.monotonic() - started < 30
    assert {host: result.exit_code for host, result in results.items()} == {
        "algo-1": 143,
        "algo-2": 137,
        "algo-3": 137,
    }
    assert (cluster.ml_dir("algo-1") / "output" / "data" / "on-term").read_text() == "saved\n"
    assert results["algo-1"].left_running == ("sleep 300", "sleep 300")  # the shell exited, its children not
    assert cluster.host("algo-2").processes() == []
    assert not cluster.host("algo-3").alive


def test_host_held_down_and_timeout(make_cluster: MakeCluster) -> None:
    cluster = make_cluster(2)
    started = time.monotonic()
    results = cluster.run(["sleep", "300"], down=["algo-2"], timeout=1.0, grace=1.0)
    assert time.monotonic() - started < 20
    assert results["algo-1"].timed_out
    assert results["algo-1"].exit_code == 128 + signal.SIGTERM
    assert results["algo-2"].exit_code is None
    assert cluster.host("algo-1").processes() == []


def test_a_cluster_that_ends_leaves_the_mountpoints_a_live_cluster_uses(make_cluster: MakeCluster) -> None:
    """Clusters started together mount onto the same machine directories (/root/.ssh, the /opt/ml path),
    made by the first that found them missing. Removing one detaches every mount on it in every namespace:
    the other cluster's hosts lost their keys (sshd: "Permission denied (publickey)") or their tree. The
    directory goes with the last cluster that uses it."""
    ml = Path("/opt") / f"smhvd-test-{secrets.token_hex(4)}" / "ml"  # missing: the first cluster makes it
    first = make_cluster(2, ml_path=ml)
    second = make_cluster(2, ml_path=ml)
    start_sshd(second, "algo-2")
    first.down()
    config = json.loads(second.exec("algo-2", ["cat", str(ml / "input/config/resourceconfig.json")])[1])
    assert config["current_host"] == "algo-2"
    code, out = second.exec("algo-1", ["ssh", *SSH_OPTIONS, "algo-2", "hostname"])
    assert (code, out.strip()) == (0, "algo-2")
    second.down()
    assert not ml.parent.exists()


def test_leftovers_are_its_own_hosts_processes_not_those_of_a_cluster_started_after_it(
    make_cluster: MakeCluster,
) -> None:
    """A namespace's number goes to the next namespace made once it ends: the hosts of a cluster started
    after a teardown usually get the old hosts' numbers (a concurrent test's hosts were listed as left
    over)."""
    first = make_cluster(2)
    while_up = [item for item in first.leftovers() if item.startswith("process ")]
    assert len(while_up) == 4, while_up  # each host's unshare and PID 1
    first.down()
    second = make_cluster(2)
    assert first.leftovers() == []
    assert len([item for item in second.leftovers() if item.startswith("process ")]) == 4


def test_teardown_after_an_error_leaves_nothing(cluster_tools: None, tmp_path: Path) -> None:
    cluster = Cluster(ClusterSpec(hosts=2, workdir=tmp_path))
    namespaces: list[int | None] = []

    def fail_while_running() -> None:
        with cluster:
            namespaces.extend(cluster.host(name).net_namespace for name in ("algo-1", "algo-2"))
            cluster.start("algo-1", ["setsid", "sleep", "300"])
            cluster.start("algo-2", ["sleep", "300"])
            wait_for(lambda: cluster.host("algo-2").processes() or None, "sleep on algo-2", 10)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_while_running()
    assert cluster.leftovers() == []  # processes in its namespaces, its links, its record, its cgroups
    assert None not in namespaces
    mounts = Path("/proc/self/mountinfo").read_text()
    assert not [ns for ns in namespaces if f"net:[{ns}]" in mounts]  # no host's network kept by a mount


def test_a_killed_tool_leaves_no_processes_and_cleanup_removes_its_links(
    cluster_tools: None, tmp_path: Path
) -> None:
    tool = subprocess.Popen(
        [sys.executable, "-m", "smhvd_sim", "run", "-n", "2", "-q", "--workdir", str(tmp_path), "--",
         "sleep", "301"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert tool.stderr is not None
        assert "hosts up" in tool.stderr.readline()
        record = next(r for r in registry.load_all() if r.owner_pid == tool.pid)
        sleepers = _wait_for_commands(tool.pid, ["sleep", "301"], 2)
    finally:
        tool.kill()
        tool.wait()
    _wait_dead(sleepers, "the hosts' processes to die with the tool")
    assert Path("/sys/class/net", record.links[0]).exists()  # the bridge outlives a SIGKILLed tool...
    done = subprocess.run(
        [sys.executable, "-m", "smhvd_sim", "cleanup"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0
    assert record.cluster_id in done.stdout
    assert not any(Path("/sys/class/net", link).exists() for link in record.links)  # ...until cleanup
    cgroups = [path for path in record.created_dirs if f"/smhvd-{record.cluster_id}" in path]
    assert not any(Path(path).exists() for path in cgroups)  # the hosts' CPU accounting groups too
    assert not record.path.exists()


def _wait_for_commands(tool: int, argv: list[str], count: int) -> list[int]:
    """The pids of `count` processes running `argv` that `tool` started (on its hosts): only what this test
    made, whatever else runs on the machine."""

    def found() -> list[int] | None:
        pids = [pid for pid in processes.descendants(tool) if processes.cmdline(pid) == argv]
        return pids if len(pids) == count else None

    return wait_for(found, f"{' '.join(argv)} on {count} hosts", 10)


def _wait_dead(pids: list[int], what: str) -> None:
    wait_for(lambda: True if not any(processes.is_alive(pid) for pid in pids) else None, what, 10)


def test_interrupting_the_tool_stops_every_host(cluster_tools: None, tmp_path: Path) -> None:
    tool = subprocess.Popen(
        [sys.executable, "-m", "smhvd_sim", "run", "-n", "2", "-q", "--workdir", str(tmp_path), "--",
         "sh", "-c", "trap 'echo stopping; exit 143' TERM; sleep 302 & wait"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert tool.stderr is not None
    assert "hosts up" in tool.stderr.readline()
    record = next(r for r in registry.load_all() if r.owner_pid == tool.pid)
    sleepers = _wait_for_commands(tool.pid, ["sleep", "302"], 2)
    os.kill(tool.pid, signal.SIGINT)
    assert tool.wait(30) == 130
    for host in ("algo-1", "algo-2"):
        assert (tmp_path / host / "train.log").read_text() == "stopping\n"
    assert not any(Path("/sys/class/net", link).exists() for link in record.links)
    assert not any(processes.is_alive(pid) for pid in sleepers)


def test_private_tmp_still_shows_the_software_that_lives_under_tmp(
    cluster_tools: None, tmp_path: Path
) -> None:
    """A CI checkout under /tmp: the host's /tmp is a fresh tmpfs, yet the carried directories (the Python
    environment, the project) are bound back at the same place."""
    carried = tmp_path / "venv"
    carried.mkdir()
    (carried / "marker").write_text("visible\n")
    (tmp_path / "other").write_text("hidden\n")
    layout = HostLayout(
        hostname="algo-1",
        binds=(),
        tmpfs=((Path("/tmp"), "1777"),),
        dirs=(),
        carry=(carried,),
    )
    address = host_addresses(2, "test00", 0)[0]
    host = SimHost.start(address, layout, tmp_path / "hostinit.json")
    try:
        done = subprocess.run(
            host.command(
                ["sh", "-c", f"cat {carried / 'marker'}; test -e {tmp_path / 'other'} || echo private"]
            ),
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    finally:
        host.stop()
    assert done.stdout == "visible\nprivate\n", done.stderr
