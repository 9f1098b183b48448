"""How each launcher's start and exit grow with the cluster: 2, 4, 8, 16, 32 simulated hosts, 1 rank per host,
our `train` (on every host, as SageMaker starts it), `horovodrun` (MPI, from algo-1, a test sshd on every
other host), the stock sagemaker-training toolkit's MPI runner (`train` on every host), each with its
defaults, and the floor: `plain`, Open MPI's mpirun from algo-1 with sshd already running on every other host
and no launcher at all (what any MPI launcher pays). Needs root.

The job: each rank writes its first line of Python, imports TensorFlow and Horovod, calls hvd.init(), does one
allreduce and exits (`--script mpi4py`: mpi4py instead, for a quick look at the launchers alone). The crash
variant: after the allreduce, the rank on the launcher's last worker host exits 3 (ours and horovodrun:
algo-N; the toolkit elects algo-N as its leader (the unsorted instance group's first host), so its last
worker is algo-1); the others would sleep 300 s.

Rows (median (min-max) over --repeats runs; the runs of one size are interleaved across launchers):
  start -> all ranks' first line: the launcher's own cost, from its start (the first host's `train`, or
    horovodrun) to the last rank's first line of Python;
  start -> all ranks past hvd.init(): what the user waits for; the difference to the row above is the ranks'
    import of TensorFlow + Horovod and hvd.init(), shown separately:
  rank import (TensorFlow + Horovod), wall s per rank (median over ranks) and CPU s per rank: the same work
    for every launcher; on this machine all ranks share its cores, so N ranks cost about N x CPU / cores of
    wall time whatever launches them (printed as "shared-core floor");
  hvd.init(): from the last rank done importing to the last rank past hvd.init() (MPI wire-up);
  job end -> launcher exit: from the last rank's exit to the exit of the process a user waits on (our
    leader's `train`, the toolkit leader's `train`, horovodrun) and of everything it started on other hosts;
  job end -> last host exit: to the last host's own launcher exit (`train` on every host); n/a for
    horovodrun, which has no process per host;
  crash -> last host exit: from the crash to the exit of every launcher process on every host;
  ours / plain: our launcher's time over the floor's, for start -> first line and job end -> exit;
  memory: MemAvailable's drop during the successful runs, per host (launcher, sshd, orted, the rank).
Then, per launcher and row, the growth per added host (least-squares slope of the medians against N) and
per doubling of N (slope against log2 N), and ours / best peer at each size (> 1: ours is better).

    .venv/bin/python benchmarks/scale_launchers.py [--hosts 2,4,8,16,32] [--repeats 3]
        [--launchers ours,ours-no-preflight,plain,horovodrun,toolkit] [--script horovod|mpi4py] [--keep]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cluster_common import (
    SSHD_CONFIG,
    TOOLKIT_TRAIN,
    MemoryWatch,
    Run,
    conditions,
    configure,
    median_of,
    reset_outputs,
    run_horovodrun,
    run_plain_mpirun,
    run_sagemaker,
    say,
    spread,
    table,
    toolkit_leader,
)

from smhvd_sim import Cluster, ClusterSpec

OURS, OURS_NO_PREFLIGHT = "ours", "ours, pre-flight off"
PLAIN, HOROVODRUN, TOOLKIT = "plain mpirun (floor)", "horovodrun (MPI)", "toolkit 4.9.0"
LAUNCHERS = {
    "ours": OURS,
    "ours-no-preflight": OURS_NO_PREFLIGHT,  # what the pre-flight (on by default) adds to the start
    "plain": PLAIN,
    "horovodrun": HOROVODRUN,
    "toolkit": TOOLKIT,
}
PEERS = (HOROVODRUN, TOOLKIT)
ONE_PROCESS = (PLAIN, HOROVODRUN)  # one process on algo-1, none of their own on the other hosts
FLOOR_ROWS = ("first", "end_launcher")  # ours / plain at each size
PROGRAM = "scale_job.py"

# Each rank records epoch times (and its CPU seconds after the imports) in output/data/scale-<rank>.json.
JOB_SCRIPT = """
import argparse, json, os, resource, socket, sys, time
from pathlib import Path
first = time.time()
parser = argparse.ArgumentParser()
parser.add_argument("--mode", default="ok")
parser.add_argument("--crash_host", default="")
parser.add_argument("--script", default="horovod")
args, _ = parser.parse_known_args()
rank = os.environ.get("OMPI_COMM_WORLD_RANK") or os.environ.get("HOROVOD_RANK") or "0"
out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
out.mkdir(parents=True, exist_ok=True)
host = socket.gethostname()
record = {"rank": rank, "host": host, "first": first}
def save(**extra):
    record.update(extra)
    tmp = out / f".scale-{rank}.tmp"
    tmp.write_text(json.dumps(record))
    tmp.replace(out / f"scale-{rank}.json")
def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
save()
if args.script == "horovod":
    import tensorflow as tf
    import horovod.tensorflow as hvd
    save(imported=time.time(), import_cpu=cpu())
    hvd.init()
    save(init=time.time())
    total = float(hvd.allreduce(tf.constant([1.0]), op=hvd.Sum)[0])
    assert total == hvd.size(), (total, hvd.size())
else:
    import mpi4py
    mpi4py.rc.initialize = False
    mpi4py.rc.finalize = True  # at exit, as Horovod finalizes MPI at exit
    from mpi4py import MPI
    save(imported=time.time(), import_cpu=cpu())
    if not MPI.Is_initialized():  # the toolkit runs ranks as `python -m mpi4py`, which initializes MPI
        MPI.Init()
    save(init=time.time())
    assert MPI.COMM_WORLD.allreduce(1) == MPI.COMM_WORLD.size
save(reduced=time.time())
if args.mode == "crash":
    if host == args.crash_host:
        print(f"scale-crash: rank {rank} on {host} fails", file=sys.stderr, flush=True)
        save(crash=time.time())
        os._exit(3)
    time.sleep(300)
save(end=time.time(), cpu=cpu())
"""

# Row keys, their titles, and whether each launcher has a value (horovodrun has no per-host process).
ROWS = {
    "first": "start -> all ranks' first line (launcher's own cost)",
    "init": "start -> all ranks past hvd.init()",
    "import_wall": "rank import TensorFlow + Horovod, wall s per rank (median of ranks)",
    "import_cpu": "rank import TensorFlow + Horovod, CPU s per rank (median of ranks)",
    "hvd_init": "hvd.init(): last rank imported -> last rank past it",
    "end_launcher": "job end -> launcher exit (leader's train / horovodrun, and what it started)",
    "end_hosts": "job end -> last host exit (each host's own train)",
    "crash": "crash -> last host exit (every launcher process)",
    "cpu_leader": "launcher CPU s on the leader host (all its processes but the rank)",
    "cpu_worker": "launcher CPU s per other host (median of hosts)",
    "cpu_floor": "launcher CPU s of all hosts / cores: its shared-core floor here",
    "memory": "memory in use during the job, MiB per host",
}
TIME_ROWS = ("first", "init", "hvd_init", "end_launcher", "end_hosts", "crash")


@dataclass
class Results:
    """values[row][launcher][hosts] -> the repeats' values; notes per (launcher, hosts)."""

    values: dict[str, dict[str, dict[int, list[float]]]] = field(default_factory=dict)
    exits: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    loads: dict[int, list[float]] = field(default_factory=dict)

    def add(self, row: str, launcher: str, hosts: int, value: float) -> None:
        self.values.setdefault(row, {}).setdefault(launcher, {}).setdefault(hosts, []).append(value)

    def get(self, row: str, launcher: str, hosts: int) -> list[float]:
        return self.values.get(row, {}).get(launcher, {}).get(hosts, [])


def rank_records(cluster: Cluster, hosts: int) -> list[dict[str, float]]:
    found = []
    for host in cluster.spec.host_names[:hosts]:
        for path in sorted((cluster.ml_dir(host) / "output" / "data").glob("scale-*.json")):
            found.append(json.loads(path.read_text()))
    return found


def latest(records: Sequence[dict[str, float]], key: str, count: int) -> float:
    """The latest `key` over the ranks, NaN unless every one of the `count` ranks recorded it."""
    values = [record[key] for record in records if key in record]
    return max(values) if len(values) == count else float("nan")


def run_one(
    cluster: Cluster, launcher: str, hosts: int, mode: str, script: str, timeout: float
) -> tuple[Run, list[dict[str, float]], float]:
    """One run; returns it, the ranks' records, and the memory in use during it (MiB)."""
    names = cluster.spec.host_names[:hosts]
    crash_host = "algo-1" if launcher == TOOLKIT else names[-1]
    args = {"mode": mode, "crash_host": crash_host, "script": script}
    reset_outputs(cluster)
    preflight = {"sagemaker_preflight": "off"} if launcher == OURS_NO_PREFLIGHT else {}
    configure(cluster, hosts, 1, PROGRAM, args | preflight)
    cpu_before = cluster.cpu_seconds()
    with MemoryWatch() as memory:
        if launcher in (OURS, OURS_NO_PREFLIGHT):
            run = run_sagemaker(cluster, ["train"], hosts, timeout)
        elif launcher == TOOLKIT:
            run = run_sagemaker(cluster, TOOLKIT_TRAIN, hosts, timeout, leader=toolkit_leader(names))
        else:
            command = [f"/opt/ml/code/{PROGRAM}"] + [f"--{key}={value}" for key, value in args.items()]
            tag = f"{hosts}-{mode}"
            if launcher == HOROVODRUN:
                run = run_horovodrun(cluster, False, hosts, 1, command, timeout, tag)
            else:
                run = run_plain_mpirun(cluster, hosts, 1, command, timeout, tag)
    cpu_after = cluster.cpu_seconds()
    run.host_cpu = {host: cpu_after[host] - cpu_before[host] for host in names if host in cpu_before}
    return run, rank_records(cluster, hosts), memory.peak_mib


def measure(results: Results, launcher: str, hosts: int, mode: str, run: Run, records: list[dict[str, float]],
            memory: float) -> str:  # fmt: skip
    """Add one run's figures; return a line describing it."""

    def add(row: str, value: float) -> None:
        results.add(row, launcher, hosts, value)

    started = run.started
    if mode == "ok":
        last_end = latest(records, "end", hosts)
        add("first", latest(records, "first", hosts) - started)
        add("init", latest(records, "init", hosts) - started)
        add("hvd_init", latest(records, "init", hosts) - latest(records, "imported", hosts))
        walls = [r["imported"] - r["first"] for r in records if "imported" in r]
        cpus = [r["import_cpu"] for r in records if "import_cpu" in r]
        add("import_wall", statistics.median(walls) if walls else float("nan"))
        add("import_cpu", statistics.median(cpus) if cpus else float("nan"))
        # horovodrun, plain: its own exit or the end of what it left on other hosts; ours, the toolkit: the
        # leader's
        add("end_launcher", (run.ended if launcher in ONE_PROCESS else run.launcher_ended) - last_end)
        if run.host_ends:
            add("end_hosts", max(run.host_ends.values()) - last_end)
        add("memory", memory / hosts)
        # The launcher's own CPU on each host: everything that ran there during the run but the rank.
        rank_cpu = {r["host"]: r["cpu"] for r in records if "cpu" in r}
        own = {host: cpu - rank_cpu[host] for host, cpu in run.host_cpu.items() if host in rank_cpu}
        if len(own) == hosts:
            leader = (
                toolkit_leader([f"algo-{k}" for k in range(1, hosts + 1)])
                if launcher == TOOLKIT
                else "algo-1"
            )
            add("cpu_leader", own[leader])
            add("cpu_worker", statistics.median(v for host, v in own.items() if host != leader))
            add("cpu_floor", sum(own.values()) / (os.cpu_count() or 1))
    else:
        crash = min((r["crash"] for r in records if "crash" in r), default=float("nan"))
        add("crash", run.ended - crash)
        codes = sorted({str(code) for code in run.exits.values()})
        results.exits.setdefault(launcher, {}).setdefault(hosts, set()).add("/".join(codes))
    ranks = sum(1 for r in records if "init" in r)
    exits = ",".join(sorted({f"{code}" for code in run.exits.values()}))
    timed_out = " TIMEOUT" if run.timed_out else ""
    notes = f" {'; '.join(run.notes)}" if run.notes else ""
    return f"{ranks}/{hosts} ranks past init, exit codes {exits}{timed_out}{notes}"


# ----- growth and ratios -----
def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys against xs (None with fewer than two points)."""
    if len(xs) < 2:
        return None
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    denominator = sum((x - mean_x) ** 2 for x in xs)
    return sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / denominator


def medians(results: Results, row: str, launcher: str, sizes: Sequence[int]) -> list[tuple[int, float]]:
    points = []
    for hosts in sizes:
        value = median_of(results.get(row, launcher, hosts))
        if value is not None:
            points.append((hosts, value))
    return points


def growth(results: Results, row: str, launcher: str, sizes: Sequence[int]) -> str:
    points = medians(results, row, launcher, sizes)
    per_host = slope([n for n, _ in points], [v for _, v in points])
    per_doubling = slope([math.log2(n) for n, _ in points], [v for _, v in points])
    if per_host is None or per_doubling is None:
        return "-"
    return f"{per_host:+.3f} s/host, {per_doubling:+.2f} s/doubling"


def ratio(results: Results, row: str, hosts: int) -> str:
    """Best peer's median / ours (> 1: ours is faster)."""
    ours = median_of(results.get(row, OURS, hosts))
    peers = [value for peer in PEERS if (value := median_of(results.get(row, peer, hosts))) is not None]
    if ours is None or not peers or ours <= 0:
        return "-"
    return f"{min(peers) / ours:.2f}"


def over_floor(results: Results, row: str, hosts: int, ours_is: str = OURS) -> str:
    """Ours / plain mpirun's median (1.00: ours costs what mpirun alone does)."""
    ours = median_of(results.get(row, ours_is, hosts))
    floor = median_of(results.get(row, PLAIN, hosts))
    if ours is None or floor is None or floor <= 0:
        return "-"
    return f"{ours / floor:.2f}"


def report(results: Results, launchers: Sequence[str], sizes: Sequence[int], script: str) -> None:
    say(f"\nScaling, 1 rank per host, script {script!r}: {conditions()}")
    say(
        "cells: median (min-max) n=runs, seconds unless stated; load average (1 min) at each size: "
        + ", ".join(
            f"{n} hosts {min(results.loads[n]):.1f}-{max(results.loads[n]):.1f}"
            for n in sizes
            if results.loads.get(n)
        )
    )
    digits = {"memory": 0}
    for row, title in ROWS.items():
        lines = [[title, *(f"{n} hosts" for n in sizes), "growth"]]
        for launcher in launchers:
            if row == "end_hosts" and launcher in ONE_PROCESS:
                lines.append([launcher, *("n/a (no per-host process)" for _ in sizes), "n/a"])
                continue
            cells = [spread(results.get(row, launcher, n), digits.get(row, 2)) for n in sizes]
            if all(cell == "-" for cell in cells):
                continue
            lines.append(
                [launcher, *cells, growth(results, row, launcher, sizes) if row in TIME_ROWS else ""]
            )
        if row in TIME_ROWS and OURS in launchers and any(peer in launchers for peer in PEERS):
            lines.append(
                ["ours / best peer (> 1: ours better)", *(ratio(results, row, n) for n in sizes), ""]
            )
        for ours_is in (OURS, OURS_NO_PREFLIGHT):
            if row in FLOOR_ROWS and ours_is in launchers and PLAIN in launchers:
                label = f"{ours_is} / plain (1: the floor)"
                lines.append([label, *(over_floor(results, row, n, ours_is) for n in sizes), ""])
        if len(lines) > 1:
            say("")
            say(table(lines))
    cores = os.cpu_count() or 1
    floor = []
    for n in sizes:
        value = median_of([v for launcher in launchers for v in results.get("import_cpu", launcher, n)])
        if value is not None:
            floor.append(f"{n} ranks {n * value / cores:.0f} s")
    if floor:
        say(
            f"\nshared-core floor of the imports alone (N x CPU s per rank / {cores} cores): "
            + ", ".join(floor)
        )
    if results.exits:
        say("exit codes after the crash (every host / horovodrun): " + "; ".join(
            f"{launcher} {n}: {' | '.join(sorted(codes))}"
            for launcher, by_size in results.exits.items()
            for n, codes in sorted(by_size.items())
        ))  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,4,8,16,32", help="comma-separated host counts")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--launchers", default=",".join(LAUNCHERS), help="comma-separated: ours,horovodrun,toolkit"
    )
    parser.add_argument("--script", choices=("horovod", "mpi4py"), default="horovod")
    parser.add_argument("--modes", default="ok,crash", help="comma-separated: ok (job succeeds), crash")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) and print it")
    parser.add_argument(
        "--env", action="append", default=[], metavar="KEY=VALUE", help="add to every host's environment"
    )
    args = parser.parse_args()
    sizes = sorted({int(n) for n in args.hosts.split(",")})
    launchers = [LAUNCHERS[name] for name in args.launchers.split(",")]
    modes = args.modes.split(",")
    extra = f"hosts {sizes}, {args.repeats} repeat(s), launchers {launchers}, script {args.script}"
    if args.env:
        extra += f", env {' '.join(args.env)}"
    say(f"bench-scale: {conditions(extra)}")
    results = Results()
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        workdir = Path(tempfile.mkdtemp(prefix="bench-scale-")) if args.keep else Path(tmp)
        if args.keep:
            say(f"work directory (kept): {workdir}")
        code = workdir / "code"
        code.mkdir(parents=True)
        (code / PROGRAM).write_text(JOB_SCRIPT)
        (workdir / "sshd_config").write_text(SSHD_CONFIG)
        spec = ClusterSpec(
            hosts=max(sizes),
            workdir=workdir / "cluster",
            code_dir=code,
            ssh_client_config=True,  # as SageMaker's images have: no host key checks between algo-*
            extra_binds=((workdir / "sshd_config", Path("/etc/ssh/sshd_config")),),
            env=dict(item.split("=", 1) for item in args.env),
        )
        with Cluster(spec) as cluster:
            say(f"{max(sizes)} hosts up in {time.time() - began:.1f} s")
            for hosts in sizes:
                for repeat in range(args.repeats):
                    for launcher in launchers:
                        for mode in modes:
                            timeout = 90.0 + 6.0 * hosts + (200.0 if launcher == TOOLKIT else 0.0)
                            run, records, memory = run_one(
                                cluster, launcher, hosts, mode, args.script, timeout
                            )
                            load = os.getloadavg()[0]
                            results.loads.setdefault(hosts, []).append(load)
                            line = measure(results, launcher, hosts, mode, run, records, memory)
                            say(
                                f"{time.time() - began:6.0f} s  {hosts:2d} hosts #{repeat + 1} {launcher} "
                                f"{mode}: {line}, load {load:.1f}"
                            )
    say(f"\ntotal {time.time() - began:.0f} s")
    report(results, launchers, sizes, args.script)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
