"""Shared by the cluster benchmarks: the short job script they run, resetting outputs between runs, and
reading the timestamps ranks write. Benchmarks print tables; they assert nothing."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from smhvd_dev.mltree import resource_config
from smhvd_sim import Cluster, ClusterError
from smhvd_sim.jobs import HostProcess
from smhvd_sim.system import wait_for

PYTHON = sys.executable  # the same interpreter (venv) on every host

# The job every launcher runs: each rank writes when it started and when it ended (or crashed) to
# $SM_OUTPUT_DATA_DIR/times-<rank>.json on its own host. --mode crash: the rank on --crash_host exits 3
# after --work seconds, the others keep running (300 s) until the launcher stops them. --mode allreduce:
# Horovod allreduce of each --sizes NAME:BYTES:REPEATS; rank 0 writes allreduce.json (bus bandwidth).
JOB_SCRIPT = """
import argparse, json, os, socket, statistics, sys, time
from pathlib import Path
started = time.time()
parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="ok")
parser.add_argument("--work", type=float, default=1.0)
parser.add_argument("--crash_host", default="algo-2")
parser.add_argument("--sizes", default="")
args, _ = parser.parse_known_args()
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("HOROVOD_RANK") or "0"
out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
out.mkdir(parents=True, exist_ok=True)
host = socket.gethostname()
def record(**extra):
    data = {"rank": rank, "host": host, "start": started, **extra}
    (out / f"times-{rank}.json").write_text(json.dumps(data))
record()
if args.mode == "allreduce":
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    results = {}
    for item in args.sizes.split(","):
        name, nbytes, repeats = item.split(":")
        tensor = tf.ones([int(nbytes) // 4], tf.float32)
        seconds = []
        for step in range(3 + int(repeats)):
            begin = time.perf_counter()
            first = float(hvd.allreduce(tensor, op=hvd.Sum, name=f"t{name}")[0])
            if step >= 3:
                seconds.append(time.perf_counter() - begin)
        assert first == hvd.size(), first
        median = statistics.median(seconds)
        bus = 2 * (hvd.size() - 1) / hvd.size() * int(nbytes) / median
        results[name] = {"median_s": median, "bus_gbit_s": bus * 8 / 1e9, "repeats": len(seconds)}
    if hvd.rank() == 0:
        (out / "allreduce.json").write_text(json.dumps(results))
    record(end=time.time())
    sys.exit(0)
time.sleep(args.work)
if args.mode == "crash":
    if host == args.crash_host:
        print(f"bench-crash: rank {rank} on {host} fails", file=sys.stderr, flush=True)
        record(crash=time.time())
        sys.exit(3)
    time.sleep(300)
record(end=time.time())
"""

# The stock toolkit's `train`, and the sshd configuration its workers need on a simulated host.
TOOLKIT_TRAIN = ["python", "-c", "from sagemaker_training.cli.train import main; main()"]
SSHD_CONFIG = """Port 22
HostKey /etc/ssh/ssh_host_ed25519_key
HostKey /etc/ssh/ssh_host_rsa_key
PidFile /run/sshd.pid
UsePAM no
UseDNS no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
AuthorizedKeysFile .ssh/authorized_keys
MaxStartups 64
LogLevel ERROR
"""


def write_job(code_dir: Path) -> None:
    code_dir.mkdir(parents=True, exist_ok=True)
    (code_dir / "bench_job.py").write_text(JOB_SCRIPT)


def reset_outputs(cluster: Cluster) -> None:
    """Empty every host's outputs (rank timestamps, failure file, model, checkpoints a script would resume
    from) before the next run."""
    for host in cluster.spec.host_names:
        root = cluster.ml_dir(host)
        for sub in ("output", "model", "checkpoints"):
            shutil.rmtree(root / sub, ignore_errors=True)
        (root / "output" / "data").mkdir(parents=True)
        (root / "model").mkdir()


def rank_times(cluster: Cluster) -> list[dict[str, float]]:
    found = []
    for host in cluster.spec.host_names:
        for path in sorted((cluster.ml_dir(host) / "output" / "data").glob("times-*.json")):
            found.append(json.loads(path.read_text()))
    return found


def failure_text(cluster: Cluster) -> str:
    """The first line of every host's failure file, as 'host: line' (the toolkit's leader is not ours)."""
    found = []
    for host in cluster.spec.host_names:
        path = cluster.ml_dir(host) / "output" / "failure"
        if path.exists():
            first = (path.read_text().strip().splitlines() or ["(empty)"])[0]
            found.append(f"{host}: {first}")
    return "; ".join(found)


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-|-".join("-" * width for width in widths))
    return "\n".join(lines)


def say(text: str) -> None:
    print(text, flush=True)
    sys.stdout.flush()


# ----- the conditions a benchmark ran in (every script prints them with its table) -----
def conditions(extra: str = "") -> str:
    """Date, commit, cores, memory and load average: one line to print above a table."""
    repo = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        commit += " (+ uncommitted changes)" if dirty else ""
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    memory = meminfo("MemTotal") / 2**20
    return (
        f"{time.strftime('%Y-%m-%d %H:%M %Z')}, commit {commit}, {os.cpu_count()} cores, {memory:.0f} GiB, "
        f"load average {load}{', ' + extra if extra else ''}"
    )


def meminfo(key: str) -> int:
    """A /proc/meminfo value in KiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, value = line.partition(":")
        if name == key:
            return int(value.split()[0])
    raise KeyError(key)


class MemoryWatch:
    """The machine's memory in use during a run: MemAvailable's drop from just before the run to its lowest
    point (sampled every `interval` s by a thread), in MiB."""

    def __init__(self, interval: float = 0.25) -> None:
        self.interval = interval
        self.baseline = meminfo("MemAvailable")
        self.lowest = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.lowest = min(self.lowest, meminfo("MemAvailable"))

    @property
    def peak_mib(self) -> float:
        return (self.baseline - self.lowest) / 1024


# ----- running the launchers on a simulated cluster -----
# horovodrun needs an sshd on the other hosts (ours starts its own; the toolkit starts the system one): a
# test sshd with its settings in the bound /etc/ssh/sshd_config (SSHD_CONFIG) and its own PidFile.
TEST_SSHD_PID = Path("/run/peers-sshd.pid")
TEST_SSHD = ["/usr/sbin/sshd", "-D", "-e", "-f", "/etc/ssh/sshd_config", "-o", f"PidFile={TEST_SSHD_PID}"]


@dataclass
class Run:
    """One launcher's run: per-host exit codes and times (epoch seconds). `ended`: the last launcher
    process's exit on any host (horovodrun: its own exit, or the end of what it left on other hosts);
    `host_ends`: each host's own launcher exit (none for horovodrun: one process, no per-host launcher)."""

    started: float
    ended: float
    exits: dict[str, int | None]
    launcher_ended: float = float("nan")  # the process a user waits on: the leader's `train`, horovodrun
    host_ends: dict[str, float] = field(default_factory=dict)
    host_cpu: dict[str, float] = field(default_factory=dict)  # CPU s each host used during the run
    timed_out: bool = False
    notes: list[str] = field(default_factory=list)


def configure(cluster: Cluster, hosts: int, per_host: int, program: str, args: dict[str, str]) -> None:
    """resourceconfig.json (naming the first ``hosts`` hosts) and hyperparameters.json on every host."""
    names = cluster.spec.host_names[:hosts]
    for host in cluster.spec.host_names:
        config = cluster.ml_dir(host) / "input" / "config"
        resource = resource_config(host, names if host in names else cluster.spec.host_names, "ml.c5.xlarge")
        (config / "resourceconfig.json").write_text(json.dumps(resource))
        hyperparameters = {
            "sagemaker_program": json.dumps(program),
            "sagemaker_submit_directory": json.dumps("/opt/ml/code"),
            "sagemaker_mpi_enabled": "true",
            "sagemaker_mpi_num_of_processes_per_host": str(per_host),
            "sagemaker_region": json.dumps("us-east-1"),
            **{key: json.dumps(value) for key, value in args.items()},
        }
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))


def toolkit_leader(hosts: Sequence[str]) -> str:
    """The toolkit elects the first host of the instance group, which SageMaker (and the cluster's
    resourceconfig.json) does not sort: the last of algo-1..algo-N here. Ours: sorted(hosts)[0]."""
    return hosts[-1]  # mltree.resource_config lists the instance group's hosts in reverse


def run_sagemaker(
    cluster: Cluster, argv: list[str], hosts: int, timeout: float, leader: str = "algo-1"
) -> Run:
    """`argv` (`train`) on every host of the job at once, as SageMaker starts it."""
    down = cluster.spec.host_names[hosts:]
    results = cluster.run(argv, down=down, timeout=timeout, grace=5.0)
    up = [results[host] for host in cluster.spec.host_names[:hosts]]
    run = Run(
        started=min(r.started for r in up),
        ended=max((r.ended or float("nan")) for r in up),
        exits={r.host: r.exit_code for r in up},
        launcher_ended=results[leader].ended or float("nan"),
        host_ends={r.host: r.ended or float("nan") for r in up},
        timed_out=any(r.timed_out for r in up),
    )
    run.notes += [f"{r.host} left: {'; '.join(c[:80] for c in r.left_running)}" for r in up if r.left_running]
    return run


def start_test_sshds(cluster: Cluster, hosts: Sequence[str], timeout: float = 30.0) -> list[HostProcess]:
    """A test sshd on each of ``hosts``, all started at once; returns once every one listens (its PidFile,
    read through the host's PID 1's view of /run, is written after the socket is bound)."""
    started = [
        cluster.start(host, TEST_SSHD, log=cluster.host_dir(host) / "peers-sshd.log") for host in hosts
    ]
    pid_files = [
        Path(f"/proc/{cluster.host(host).init_pid}/root") / TEST_SSHD_PID.relative_to("/") for host in hosts
    ]

    def listening() -> bool | None:
        return True if all(path.exists() and path.stat().st_size > 0 for path in pid_files) else None

    wait_for(listening, f"sshd to listen on {len(hosts)} host(s)", timeout)
    return started


def stop_test_sshds(cluster: Cluster, sshds: Sequence[HostProcess]) -> None:
    for sshd in sshds:
        sshd.send_signal(signal.SIGTERM)
    for sshd in sshds:
        sshd.wait(10.0)
        cluster.host(sshd.host.name).kill_processes()


def run_horovodrun(
    cluster: Cluster, gloo: bool, hosts: int, per_host: int, script: list[str], timeout: float, tag: str
) -> Run:
    """horovodrun from algo-1 with its defaults: -np hosts x per_host (-H algo-1:P,... across hosts), with
    a test sshd on every other host (started before horovodrun, outside its time)."""
    names = cluster.spec.host_names[:hosts]
    argv = ["horovodrun", "-np", str(hosts * per_host)]
    if hosts > 1:
        argv += ["-H", ",".join(f"{host}:{per_host}" for host in names)]
    if gloo:
        argv.append("--gloo")
    return run_from_leader(cluster, [*argv, PYTHON, *script], hosts, timeout, f"horovodrun-{tag}")


def run_plain_mpirun(
    cluster: Cluster, hosts: int, per_host: int, script: list[str], timeout: float, tag: str
) -> Run:
    """The floor any MPI launcher pays: Open MPI's mpirun from algo-1, sshd already running on every other
    host (started outside its time), no launcher; only what a multi-host run on these hosts needs (root,
    the interface, no core binding: every "host" shares this machine's cores)."""
    names = cluster.spec.host_names[:hosts]
    argv = ["mpirun", "--allow-run-as-root", "-np", str(hosts * per_host), "--bind-to", "none"]
    argv += ["-H", ",".join(f"{host}:{per_host}" for host in names)]
    argv += ["--mca", "btl_tcp_if_include", "eth0", "--mca", "oob_tcp_if_include", "eth0", "-x", "PATH"]
    return run_from_leader(cluster, [*argv, PYTHON, *script], hosts, timeout, f"plain-{tag}")


def run_from_leader(cluster: Cluster, argv: list[str], hosts: int, timeout: float, tag: str) -> Run:
    """`argv` from algo-1 (its log: algo-1/<tag>.log), with a test sshd on every other host of the first
    `hosts` (started before, outside its time); the run ends when it and everything it started on the other
    hosts have."""
    names = cluster.spec.host_names[:hosts]
    sshds = start_test_sshds(cluster, names[1:]) if hosts > 1 else []
    try:
        log = cluster.host_dir("algo-1") / f"{tag}.log"
        process = cluster.start("algo-1", argv, log=log, end_host_on_exit=True)
        try:
            code = process.wait(timeout)
            timed_out = False
        except ClusterError:
            cluster.host("algo-1").kill_processes()
            code = process.wait(10.0)
            timed_out = True
        process.finish_output()
        ended = process.ended or time.time()
        run = Run(started=process.started, ended=ended, exits={"algo-1": code}, launcher_ended=ended)
        run.timed_out = timed_out
        if process.left_running:
            run.notes.append(f"algo-1 left: {'; '.join(c[:80] for c in process.left_running)}")
        if sshds:
            # What it started on the other hosts (ssh sessions, orted, ranks) must be gone too.
            listeners = {sshd.host.name: sshd.target_pid() for sshd in sshds}

            def others() -> list[int]:
                return [
                    pid
                    for host, listener in listeners.items()
                    for pid in cluster.host(host).processes()
                    if pid != listener
                ]

            if others():
                try:
                    wait_for(
                        lambda: None if others() else True,
                        "the other hosts to be quiet",
                        30.0,
                        max_delay=0.02,
                    )
                    run.ended = max(run.ended, time.time())
                except ClusterError:
                    run.notes.append(f"{len(others())} process(es) still run 30 s after {argv[0]}")
                    run.ended = float("nan")
        return run
    finally:
        stop_test_sshds(cluster, sshds)


# ----- summarising repeated measurements -----
def finite(values: Sequence[float]) -> list[float]:
    return [value for value in values if not math.isnan(value)]


def median_of(values: Sequence[float]) -> float | None:
    clean = finite(values)
    return statistics.median(clean) if clean else None


def spread(values: Sequence[float], digits: int = 2) -> str:
    """'median (min-max) n=N', or '-' without values."""
    clean = finite(values)
    if not clean:
        return "-"
    middle = statistics.median(clean)
    if len(clean) == 1:
        return f"{middle:.{digits}f} n=1"
    return f"{middle:.{digits}f} ({min(clean):.{digits}f}-{max(clean):.{digits}f}) n={len(clean)}"
