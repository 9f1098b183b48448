"""The pre-flight end to end on 4 simulated hosts: one host made wrong in one way at a time, then `train` on
every host, under `sagemaker_preflight=warn` (the host is named, the job goes on) and `fail` (the host is
named, the job stops with 75 before the script starts, nothing left running). Each time exactly the bad host,
and no other, is named, in one line.

The faults are real where this machine allows: a token-bucket rate limit on the host's link (tc tbf), a small
tmpfs on its /dev/shm and on its checkpoint directory, another version's metadata bind-mounted over a
library's on that host, its probe frozen (SIGSTOP) mid-check. GPUs cannot be: every host gets a fake driver
tree (/proc/driver/nvidia/gpus, tmpfs) and the fake CUDA runtime and NCCL of support/fake_gpu.py."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from smhvd.preflight.launch import LAUNCH_LIMIT
from smhvd.proc.processes import read_process_table
from smhvd_sim import Cluster, ClusterSpec
from smhvd_sim.jobs import HostResult
from smhvd_sim.system import wait_for
from support.cluster import TOOLS, ensure_tools
from support.fake_gpu import build_fake_gpu

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")
# The job: each rank leaves a mark that it ran (a job stopped by the pre-flight leaves none).
JOB = """import os, pathlib
out = pathlib.Path(os.environ["SM_OUTPUT_DATA_DIR"])
out.mkdir(parents=True, exist_ok=True)
(out / f"ran-{os.environ['OMPI_COMM_WORLD_RANK']}").write_text("ran")
"""
# The links of a simulated cluster share one machine's 2 cores: measured alone, a healthy link varies about 2x
# (docs/preflight.md); a 20 Mbit/s link is 1/200 of the median. The option's default (0.5) is for real NICs.
MIN_RATIO = 0.2
BOUND = 30.0  # launcher_preflight_timeout_seconds (a frozen probe is named after runner.SILENCE)
RUN_TIMEOUT = 180.0  # a hang only crosses it


@dataclass
class Setup:
    cluster: Cluster
    fake_gpu: Path
    shared: Path  # seen by the hosts at the same path


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    ensure_tools({**TOOLS, "tc": "iproute2"})
    if not Path("/etc/ssh/ssh_host_ed25519_key").exists():
        subprocess.run(["ssh-keygen", "-A"], check=True)
    work = tmp_path_factory.mktemp("preflight")
    # What the hosts must see lives outside /tmp (each host has a /tmp of its own): the fake GPU libraries, a
    # library's metadata to bind-mount.
    shared = Path(tempfile.mkdtemp(prefix="smhvd-preflight-test-", dir="/var/tmp"))
    code = work / "code"
    code.mkdir()
    (code / "job.py").write_text(JOB)
    cluster = Cluster(ClusterSpec(hosts=len(HOSTS), workdir=work / "cluster", code_dir=code))
    cluster.up()
    try:
        yield Setup(cluster, build_fake_gpu(shared / "fake-gpu"), shared)
    finally:
        cluster.down()
        shutil.rmtree(shared)
    assert cluster.leftovers() == []


def config(cluster: Cluster, host: str, name: str) -> Path:
    return cluster.ml_dir(host) / "input" / "config" / name


def run_job(setup: Setup, policy: str, env: dict[str, str] | None = None) -> dict[str, HostResult]:
    cluster = setup.cluster
    hyperparameters = {
        "sagemaker_program": "job.py",
        "sagemaker_mpi_num_of_processes_per_host": 1,
        "sagemaker_preflight": policy,
        "launcher_preflight_timeout_seconds": BOUND,
        "launcher_preflight_min_ratio": MIN_RATIO,
        "launcher_forward_env": "FAKE_*",
    }
    for host in HOSTS:
        config(cluster, host, "hyperparameters.json").write_text(
            json.dumps({key: json.dumps(value) for key, value in hyperparameters.items()})
        )
        for place in ("output", "checkpoints"):
            for item in (cluster.ml_dir(host) / place).glob("**/*"):
                if item.is_file() and not item.is_mount():
                    item.unlink()
    return cluster.run(["train"], env=env, timeout=RUN_TIMEOUT)


def in_host(cluster: Cluster, host: str, *argv: str) -> None:
    code, output = cluster.exec(host, list(argv))
    assert code == 0, f"{host}: {' '.join(argv)}: {output}"


# Each fault: (the bad host, what its reason says) and a context manager that makes it so while the job runs.
Fault = Callable[[Setup], contextlib.AbstractContextManager[dict[str, str]]]


@contextlib.contextmanager
def slow_link(setup: Setup) -> Iterator[dict[str, str]]:
    link = next(a.outer_link for a in setup.cluster.addresses if a.name == "algo-3")
    tbf = ["tc", "qdisc", "add", "dev", link, "root", "tbf", "rate", "20mbit", "burst", "32kbit"]
    subprocess.run([*tbf, "latency", "400ms"], check=True)
    try:
        yield {}
    finally:
        subprocess.run(["tc", "qdisc", "del", "dev", link, "root"], check=True)


@contextlib.contextmanager
def small_shm(setup: Setup) -> Iterator[dict[str, str]]:
    """1 MB of /dev/shm on algo-2: less than its one rank needs (a container's default 64 MB is enough for
    the CPU job here, and names nobody: test_a_healthy_cluster_names_no_host_and_the_job_runs)."""
    in_host(setup.cluster, "algo-2", "mount", "-o", "remount,size=1m", "/dev/shm")
    try:
        yield {}
    finally:
        in_host(setup.cluster, "algo-2", "mount", "-o", "remount,size=50%", "/dev/shm")


@contextlib.contextmanager
def fewer_gpus(setup: Setup) -> Iterator[dict[str, str]]:
    """4 GPUs on every host of an ml.g5.12xlarge cluster (which has 4), 3 on algo-4."""
    cluster = setup.cluster
    originals = {h: config(cluster, h, "resourceconfig.json").read_text() for h in HOSTS}
    for host in HOSTS:
        resources = json.loads(originals[host]) | {"current_instance_type": "ml.g5.12xlarge"}
        for group in resources.get("instance_groups", []):
            group["instance_type"] = "ml.g5.12xlarge"
        config(cluster, host, "resourceconfig.json").write_text(json.dumps(resources))
        in_host(cluster, host, "mount", "-t", "tmpfs", "tmpfs", "/proc/driver")
        gpus = [f"/proc/driver/nvidia/gpus/0000:00:1{i}.0" for i in range(3 if host == "algo-4" else 4)]
        in_host(cluster, host, "mkdir", "-p", *gpus)
    try:
        yield {"LD_LIBRARY_PATH": str(setup.fake_gpu), "FAKE_GPU_DRIVER_DIR": "/proc/driver/nvidia/gpus"}
    finally:
        for host in HOSTS:
            in_host(cluster, host, "umount", "/proc/driver")
            config(cluster, host, "resourceconfig.json").write_text(originals[host])


@contextlib.contextmanager
def full_checkpoints(setup: Setup) -> Iterator[dict[str, str]]:
    cluster = setup.cluster
    (cluster.ml_dir("algo-3") / "checkpoints").mkdir(exist_ok=True)
    in_host(cluster, "algo-3", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", "/opt/ml/checkpoints")
    cluster.exec("algo-3", ["dd", "if=/dev/zero", "of=/opt/ml/checkpoints/fill", "bs=64k"])  # until full
    try:
        yield {}
    finally:
        in_host(cluster, "algo-3", "umount", "/opt/ml/checkpoints")


@contextlib.contextmanager
def other_mpi4py(setup: Setup) -> Iterator[dict[str, str]]:
    """algo-2's mpi4py says it is another version (its metadata, bind-mounted over the installed one's)."""
    dist = importlib.metadata.distribution("mpi4py")
    metadata = Path(str(dist.locate_file(next(f for f in dist.files or () if f.name == "METADATA"))))
    other = setup.shared / "METADATA-mpi4py"
    other.write_text(metadata.read_text().replace(f"Version: {dist.version}", "Version: 0.0.1", 1))
    in_host(setup.cluster, "algo-2", "mount", "--bind", str(other), str(metadata))
    try:
        yield {}
    finally:
        in_host(setup.cluster, "algo-2", "umount", str(metadata))


@contextlib.contextmanager
def in_background(work: Callable[[threading.Event], None], join: float = 5.0) -> Iterator[None]:
    """work(done) on a thread while the block runs; `done` set when the block ends, then the thread joined."""
    done = threading.Event()
    thread = threading.Thread(target=work, args=(done,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(join)


def _is_probe(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"smhvd.preflight.probe" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


@contextlib.contextmanager
def when_probing(setup: Setup, host_name: str, act: Callable[[int, list[int]], None]) -> Iterator[None]:
    """act(the probe's pid, the host's pids) on `host_name` as soon as its pre-flight probe runs."""
    host = setup.cluster.host(host_name)

    def watch(done: threading.Event) -> None:
        def probe() -> int | None:
            found = next((pid for pid in host.processes() if _is_probe(pid)), None)
            return found if found is not None or not done.is_set() else -1

        pid = wait_for(probe, f"{host_name}'s pre-flight probe", RUN_TIMEOUT, max_delay=0.005)
        if pid > 0:
            act(pid, host.processes())

    with in_background(watch):
        yield


@contextlib.contextmanager
def frozen_probe(setup: Setup) -> Iterator[dict[str, str]]:
    """algo-4's probe is stopped (SIGSTOP) as soon as it runs: it stops answering mid-check."""
    with when_probing(setup, "algo-4", lambda probe, _: os.kill(probe, signal.SIGSTOP)):
        yield {}


def _is_train(pid: int) -> bool:
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        return any(arg.endswith(b"/train") for arg in argv[:2])
    return False


def _kill_train(_probe: int, pids: list[int]) -> None:
    for pid in pids:
        if _is_train(pid):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def killed_train(setup: Setup) -> Iterator[dict[str, str]]:
    """algo-2's `train` is killed (SIGKILL) while its probe runs."""
    with when_probing(setup, "algo-2", _kill_train):
        yield {}


def daemon_killed(times: int) -> Fault:
    @contextlib.contextmanager
    def fault(setup: Setup) -> Iterator[dict[str, str]]:
        """algo-2's Open MPI daemon (orted) is killed (SIGKILL) once a probe runs under it, in the first
        `times` of the pre-flight's attempts: mpirun loses that daemon."""
        host = setup.cluster.host("algo-2")
        killed: list[int] = []

        def watch(done: threading.Event) -> None:
            def daemon_with_a_probe() -> int | None:
                table = read_process_table()
                for pid in filter(_is_probe, host.processes()):
                    with contextlib.suppress(OSError, KeyError):
                        parent = table[pid][0]
                        if Path(f"/proc/{parent}/comm").read_text() == "orted\n" and parent not in killed:
                            return parent
                return None if not done.is_set() else -1

            while len(killed) < times:
                daemon = wait_for(
                    daemon_with_a_probe, "algo-2's probe under orted", RUN_TIMEOUT, max_delay=0.005
                )
                if daemon <= 0:
                    return
                os.kill(daemon, signal.SIGKILL)
                killed.append(daemon)

        with in_background(watch):
            yield {}
        assert len(killed) == times  # the fault happened as many times as asked

    return fault


def daemon_stalled(times: int, wait: str = "exec sleep 600") -> Fault:
    @contextlib.contextmanager
    def fault(setup: Setup) -> Iterator[dict[str, str]]:
        """algo-3's Open MPI daemon does not start in the first `times` launches: an `orted` first on its PATH
        runs `wait` instead (by default it waits until the worker ends it with the job), then the real one.
        mpirun starts no process anywhere until every host's daemon has reported, so no rank or probe runs."""
        tools = setup.shared / f"stalled-orted-{times}"
        tools.mkdir(exist_ok=True)
        launches = tools / "launches"
        launches.write_text("")
        orted = tools / "orted"
        orted.write_text(
            f"#!/bin/sh\necho launch >> {launches}\n"
            f'[ "$(wc -l < {launches})" -gt {times} ] && exec /usr/bin/orted "$@"\n'
            f"{wait}\n"
        )
        orted.chmod(0o755)
        in_host(setup.cluster, "algo-3", "mount", "--bind", str(tools), "/usr/local/sbin")
        try:
            yield {}
        finally:
            in_host(setup.cluster, "algo-3", "umount", "/usr/local/sbin")
        assert len(launches.read_text().splitlines()) >= times  # it stalled as often as asked

    return fault


FAULTS: dict[str, tuple[Fault, str, str]] = {
    "rate-limited link": (slow_link, "algo-3", "slow network"),
    "small /dev/shm": (small_shm, "algo-2", "/dev/shm has"),
    "fewer GPUs": (fewer_gpus, "algo-4", "3 GPU(s) visible; ml.g5.12xlarge has 4"),
    "full checkpoint disk": (full_checkpoints, "algo-3", "checkpoints:"),
    "other library version": (
        other_mpi4py,
        "algo-2",
        "mpi4py 0.0.1; the other hosts of homogeneousCluster have",
    ),
    "host stops answering": (frozen_probe, "algo-4", "answer"),
}


def summary_of(cluster: Cluster) -> dict[str, object]:
    return json.loads((cluster.ml_dir("algo-1") / "output" / "data" / "job-summary.json").read_text())


def figures(preflight: dict[str, object]) -> str:
    """What a failed assertion shows: who was named, the medians, each host's link figures and reasons."""
    hosts = preflight.get("hosts")
    links = {
        name: {k: v for k, v in facts.items() if k.startswith("link_") or k in ("reasons", "probe_seconds")}
        for name, facts in (hosts.items() if isinstance(hosts, dict) else ())
    }
    shown = {key: preflight.get(key) for key in ("named", "medians", "notes", "seconds")}
    return json.dumps(shown | {"hosts": links})


def marks(cluster: Cluster) -> list[str]:
    return sorted(p.name for h in HOSTS for p in (cluster.ml_dir(h) / "output" / "data").glob("ran-*"))


def test_a_healthy_cluster_names_no_host_and_the_job_runs(setup: Setup) -> None:
    """... with a container's default /dev/shm (64 MB) on every host: enough for this CPU job."""
    for host in HOSTS:
        in_host(setup.cluster, host, "mount", "-o", "remount,size=64m", "/dev/shm")
    try:
        results = run_job(setup, "fail")
    finally:
        for host in HOSTS:
            in_host(setup.cluster, host, "mount", "-o", "remount,size=50%", "/dev/shm")
    preflight = summary_of(setup.cluster)["preflight"]
    assert isinstance(preflight, dict)
    assert {h: r.exit_code for h, r in results.items()} == dict.fromkeys(HOSTS, 0), figures(preflight)
    assert preflight["named"] == []
    assert 0 < preflight["first_word_seconds"] < preflight["seconds"]  # mpirun's launch, within the check
    assert sorted(preflight["hosts"]) == sorted(HOSTS)
    assert marks(setup.cluster) == [f"ran-{r}" for r in range(len(HOSTS))]
    log = results["algo-1"].log.read_text()
    assert f"pre-flight: all {len(HOSTS)} host(s) fine" in log


def test_a_preflight_only_job_says_so_on_every_host(setup: Setup) -> None:
    """`train preflight` on every host (issue 52.8): the workers said 'job succeeded' for a job that ran no
    script; they say the pre-flight ended well, and nothing ran."""
    run_job(setup, "warn")  # writes the hosts' configuration; the job itself is not what is looked at here
    for host in HOSTS:
        for item in (setup.cluster.ml_dir(host) / "output" / "data").glob("ran-*"):
            item.unlink()
    results = setup.cluster.run(["train", "preflight"], timeout=RUN_TIMEOUT)
    assert {h: r.exit_code for h, r in results.items()} == dict.fromkeys(HOSTS, 0)
    for host in HOSTS[1:]:
        log = results[host].log.read_text()
        assert "the pre-flight ended well (exit 0)" in log and "job succeeded" not in log, log[-2000:]
    assert marks(setup.cluster) == []


@pytest.mark.parametrize("policy", ["warn", "fail"])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_the_bad_host_and_no_other_is_named(setup: Setup, fault: str, policy: str) -> None:
    make, bad, says = FAULTS[fault]
    with make(setup) as env:
        results = run_job(setup, policy, env)
    cluster = setup.cluster
    preflight = summary_of(cluster)["preflight"]
    assert isinstance(preflight, dict)
    named = preflight["named"]
    assert [n["host"] for n in named] == [bad], figures(preflight)
    assert says in named[0]["reason"]
    log = results["algo-1"].log.read_text()
    verdict = [line for line in log.splitlines() if "pre-flight: 1 of 4 host(s) named" in line]
    assert len(verdict) == 1 and f"{bad}: {named[0]['reason']}" in verdict[0]
    if policy == "warn":
        assert {h: r.exit_code for h, r in results.items()} == dict.fromkeys(HOSTS, 0)
        assert marks(cluster) == [f"ran-{r}" for r in range(len(HOSTS))]
    else:
        assert {h: r.exit_code for h, r in results.items()} == dict.fromkeys(HOSTS, 75)
        assert marks(cluster) == []  # the script never started
        reason = (cluster.ml_dir("algo-1") / "output" / "failure").read_text().splitlines()[0]
        assert reason == f"pre-flight named {bad}: {named[0]['reason']}"
        assert {h: r.left_running for h, r in results.items()} == dict.fromkeys(HOSTS, ())


@contextlib.contextmanager
def full_tmp(setup: Setup) -> Iterator[dict[str, str]]:
    """algo-3's /tmp is full: its probe's MPI_Init cannot make Open MPI's session files there. Its own /tmp
    shrunk and filled, not a new one mounted over it: that hid a checkout (and its venv) living under /tmp,
    as a CI clone may, and algo-3's `train` never started (issue 53.4); the launcher must still run there."""
    cluster = setup.cluster
    in_host(cluster, "algo-3", "mount", "-o", "remount,size=1m", "/tmp")
    cluster.exec("algo-3", ["dd", "if=/dev/zero", "of=/tmp/fill", "bs=4k"])  # until full
    try:
        in_host(cluster, "algo-3", sys.executable, "-c", "import smhvd.cli")  # wherever the checkout lives
        yield {}
    finally:
        in_host(cluster, "algo-3", "rm", "-f", "/tmp/fill")
        in_host(cluster, "algo-3", "mount", "-o", "remount,size=50%", "/tmp")  # tmpfs's default size


@contextlib.contextmanager
def garbled_nvidia_smi(setup: Setup) -> Iterator[dict[str, str]]:
    """Every host has 4 fake GPUs; algo-4's nvidia-smi (on its PATH alone) prints bytes that are not UTF-8."""
    cluster = setup.cluster
    tool = setup.shared / "garbled" / "nvidia-smi"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text("#!/bin/sh\nprintf '0, NVIDIA A10G, 0, No, No, Enabled\\n\\377\\376\\n'\n")
    tool.chmod(0o755)
    in_host(cluster, "algo-4", "mount", "--bind", str(tool.parent), "/usr/local/sbin")
    for host in HOSTS:
        in_host(cluster, host, "mount", "-t", "tmpfs", "tmpfs", "/proc/driver")
        in_host(cluster, host, "mkdir", "-p", *[f"/proc/driver/nvidia/gpus/0000:00:1{i}.0" for i in range(4)])
    try:
        yield {"LD_LIBRARY_PATH": str(setup.fake_gpu), "FAKE_GPU_DRIVER_DIR": "/proc/driver/nvidia/gpus"}
    finally:
        for host in HOSTS:
            in_host(cluster, host, "umount", "/proc/driver")
        in_host(cluster, "algo-4", "umount", "/usr/local/sbin")


@contextlib.contextmanager
def frozen_host(setup: Setup) -> Iterator[dict[str, str]]:
    """Every process of algo-3 is stopped (SIGSTOP) once the leader starts the pre-flight's mpirun (every link
    said ready), and let go (SIGCONT) once the leader has ended: a host that hung after it said ready."""
    cluster = setup.cluster
    host, leader = cluster.host("algo-3"), cluster.host("algo-1")
    stopped: list[int] = []

    def leader_ended() -> bool | None:
        return True if not any(map(_is_train, leader.processes())) else None

    def freeze_then_thaw(done: threading.Event) -> None:
        def probes_started() -> bool | None:
            return True if any(map(_is_probe, leader.processes())) else (False if done.is_set() else None)

        try:
            if wait_for(probes_started, "the pre-flight's mpirun on algo-1", RUN_TIMEOUT, max_delay=0.005):
                for pid in host.processes():
                    with contextlib.suppress(OSError):
                        os.kill(pid, signal.SIGSTOP)
                        stopped.append(pid)
                wait_for(leader_ended, "the leader's end", RUN_TIMEOUT)
        finally:  # nsenter, outside the host, stops itself when its child does (job control): it too
            table = read_process_table()
            parents = {table[pid][0] for pid in stopped if pid in table}
            for pid in [*stopped, *parents]:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)

    with in_background(freeze_then_thaw, join=RUN_TIMEOUT):
        yield {}


# Each failure: the host at fault, what the failure file's first line begins with, every host's exit code.
FAILURES: dict[str, tuple[Fault, str, str, dict[str, int]]] = {
    "a worker's /tmp full": (
        full_tmp,
        "algo-3",
        # mpirun's own message naming algo-3, or Open MPI's error logged in algo-3's unfinished probe (which
        # comes first depends on timing: both are evidence about algo-3, preflight/blame.py)
        "pre-flight named algo-3: ",
        dict.fromkeys(HOSTS, 75),
    ),
    "a worker's train killed during the check": (
        killed_train,
        "algo-2",
        "algo-2 ended before the job started (its link closed)",
        {"algo-1": 69, "algo-2": 137, "algo-3": 69, "algo-4": 69},
    ),
    "a worker frozen after its link said ready": (
        frozen_host,
        "algo-3",
        "algo-3 ended before the job started (its link closed)",  # ssh's keepalive, before the bound
        dict.fromkeys(HOSTS, 69),
    ),
    "a worker's Open MPI daemon lost in both attempts": (
        daemon_killed(2),
        "algo-2",
        "pre-flight named algo-2: the pre-flight's MPI job failed there: ORTE has lost communication",
        dict.fromkeys(HOSTS, 75),
    ),
    "a worker's Open MPI daemon stalled at launch in both attempts": (
        daemon_stalled(2),
        "algo-3",
        "pre-flight named algo-3: its Open MPI daemon (orted) did not connect back to mpirun within",
        dict.fromkeys(HOSTS, 75),
    ),
    "a host's nvidia-smi prints bytes that are not UTF-8": (
        garbled_nvidia_smi,
        "algo-4",
        "pre-flight named algo-4: nvidia-smi printed bytes that are not UTF-8",
        dict.fromkeys(HOSTS, 75),
    ),
}


@pytest.mark.parametrize("failure", list(FAILURES))
def test_a_failure_during_the_check_names_its_host_and_not_the_leader(setup: Setup, failure: str) -> None:
    """The leader is never named for a worker's failure: the failure file's first line names the host at
    fault and why, and the pre-flight (when it got to its verdict) names it alone, with mpirun's message
    whole in its notes."""
    make, bad, first_line, codes = FAILURES[failure]
    with make(setup) as env:
        results = run_job(setup, "fail", env)
    cluster = setup.cluster
    log = results["algo-1"].log.read_text()
    reason = (cluster.ml_dir("algo-1") / "output" / "failure").read_text().splitlines()[0]
    # mpirun runs on algo-1: its daemon's line, and what it prints signed "[algo-1:16] plm:rsh: ..."
    not_mpiruns_own = re.sub(r"HNP daemon\s*: \S+ on node algo-1|\[algo-1:\d+\]", "", reason)
    assert reason.startswith(first_line) and "algo-1" not in not_mpiruns_own, log[-3000:]
    assert {h: r.exit_code for h, r in results.items()} == codes
    assert marks(cluster) == []
    if first_line.startswith("pre-flight named"):
        preflight = summary_of(cluster)["preflight"]
        assert isinstance(preflight, dict)
        assert [n["host"] for n in preflight["named"]] == [bad], figures(preflight)


# A fault in the pre-flight's first attempt only: the host in its note, how the note and the log line begin.
ONCE: dict[str, tuple[Fault, str, str, str]] = {
    "a daemon lost": (
        daemon_killed(1),
        "algo-2",
        "the check ran twice; its first attempt ended with: ORTE has",
        "pre-flight: mpirun lost one of its daemons; checking once more",
    ),
    "a launch stalled": (
        daemon_stalled(1),
        "algo-3",
        "the check ran twice; its first attempt ended with: mpirun started no probe within",
        "pre-flight: mpirun started no probe within",
    ),
}


@pytest.mark.parametrize("once", list(ONCE))
def test_a_failure_of_the_first_attempt_only_is_a_note_and_the_job_runs(setup: Setup, once: str) -> None:
    """mpirun losing a worker's daemon once (a connection that dropped), or its launch stalling once (seen in
    SDK local mode), is checked once more: the second attempt finds every host fine, nobody is named, the
    job runs, and how the first attempt ended is a note naming the host."""
    make, host, note, logged = ONCE[once]
    with make(setup) as env:
        results = run_job(setup, "fail", env)
    cluster = setup.cluster
    preflight = summary_of(cluster)["preflight"]
    assert isinstance(preflight, dict)
    assert {h: r.exit_code for h, r in results.items()} == dict.fromkeys(HOSTS, 0), figures(preflight)
    assert preflight["named"] == []
    assert marks(cluster) == [f"ran-{r}" for r in range(len(HOSTS))]
    notes = preflight["notes"]
    assert isinstance(notes, list)
    first = [n for n in notes if n.startswith(note)]
    assert len(first) == 1 and host in first[0], notes
    log = results["algo-1"].log.read_text()
    assert logged in log
    assert "pre-flight: all 4 host(s) fine" in log


def test_the_jobs_own_launch_waiting_on_a_daemon_is_a_warning_naming_its_host(setup: Setup) -> None:
    """The pre-flight off, algo-3's Open MPI daemon starts only after the launch limit: the leader says once
    which host mpirun's launch waits on (algo-3, no other), where it was a silent wait, and the job runs."""
    late = f'sleep {LAUNCH_LIMIT + 6:g}; exec /usr/bin/orted "$@"'
    with daemon_stalled(1, late)(setup) as env:
        results = run_job(setup, "off", env)
    assert {h: r.exit_code for h, r in results.items()} == dict.fromkeys(HOSTS, 0)
    assert marks(setup.cluster) == [f"ran-{r}" for r in range(len(HOSTS))]
    log = results["algo-1"].log.read_text()
    said = [line for line in log.splitlines() if "mpirun has started no rank after" in line]
    assert len(said) == 1 and "WARNING" in said[0], log[-3000:]
    assert "Open MPI daemon (orted) on algo-3, which" in said[0]
    assert not any(h in said[0] for h in ("algo-1", "algo-2", "algo-4")), said[0]
