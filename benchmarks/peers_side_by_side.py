"""Our launcher side by side with its peers, in one run on the same simulated 2-host cluster with the same
scripts, each launcher with its own defaults: our `train` (on every host, as SageMaker starts it), Horovod's
`horovodrun` with its default MPI controller and with `--gloo` (run from algo-1, an sshd on algo-2), and the
stock sagemaker-training toolkit's MPI runner (`train` on every host). Needs root.

Rows (medians over --repeats runs, each row's runs interleaved across the launchers):
  start -> first rank running (s): from the launcher's start (the first host's `train`, or `horovodrun`) to
    the first rank's first line of Python;
  job end -> last launcher process exited (s): from the last rank's end to the last launcher process's exit
    on any host. For horovodrun (one process, on algo-1) this is script end -> horovodrun exit, or the end of
    what it left on algo-2 (orted, ssh sessions) if that is later;
  job end -> each host's launcher exit (s): the same per host, the median over the hosts of each run, for the
    launchers that run on every host (ours, the toolkit); n/a for horovodrun, which has no per-host process;
  rank crash -> all hosts exited (s): a rank on the worker host exits 3 one second after it starts (the others
    would sleep 300 s); from the crash to the exit of every launcher process on every host, and the exit code
    each launcher reports (per host for the SageMaker launchers). The worker is algo-2 for ours and
    horovodrun; the toolkit elects as leader the first host of the unsorted instance group (algo-2), so its
    worker is algo-1;
  MNIST images/s: examples/mnist/train_mnist.py under benchmarks/mnist_measure.py, batch 64 per rank,
    --epochs E --steps_per_epoch S, median images/s (all ranks) over the epochs after the first, np=2 on
    algo-1 alone and 2 hosts x 1;
  allreduce bus bandwidth: hvd.allreduce of float32 tensors of 4 KiB, 1 MiB, 64 MiB between 2 hosts x 1 rank,
    median time of N repeats after warmup, bus bandwidth = 2 (n-1)/n x bytes / time.
Every cell is the median (min-max) n=runs; every row also gets its ratio to the best peer from the medians,
oriented so that > 1 is better than the best peer (time rows: best peer's time / ours; rate rows: ours / best
peer's), and the 1-minute load average over its runs.

    .venv/bin/python benchmarks/peers_side_by_side.py [--repeats 3] [--toolkit-repeats 3] [--heavy-repeats 3]
        [--epochs 3] [--steps 50] [--launchers ...] [--only timing,mnist,allreduce] [--keep]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cluster_common import (
    SSHD_CONFIG,
    TOOLKIT_TRAIN,
    Run,
    configure,
    finite,
    median_of,
    rank_times,
    reset_outputs,
    run_horovodrun,
    run_sagemaker,
    say,
    table,
    write_job,
)
from mnist_measure import PROGRAM as MNIST_PROGRAM
from mnist_measure import code_dir as mnist_code_dir

from smhvd_sim import Cluster, ClusterError, ClusterSpec

OURS, HVD_MPI, HVD_GLOO, TOOLKIT = "ours", "horovodrun (MPI)", "horovodrun --gloo", "toolkit 4.9.0"
LAUNCHERS = (OURS, HVD_MPI, HVD_GLOO, TOOLKIT)
PEERS = (HVD_MPI, HVD_GLOO, TOOLKIT)
SIZES = (("4 KiB", 4 * 1024, 200), ("1 MiB", 1024 * 1024, 50), ("64 MiB", 64 * 1024 * 1024, 8))

# The job every launcher runs for the timing and allreduce rows: cluster_common.JOB_SCRIPT (bench_job.py);
# configuring the hosts and running each launcher: cluster_common (shared with scale_launchers.py).


def loadavg() -> float:
    return os.getloadavg()[0]


def run_launcher(
    cluster: Cluster,
    launcher: str,
    hosts: int,
    per_host: int,
    program: str,
    args: dict[str, str],
    timeout: float,
    tag: str,
) -> Run:
    reset_outputs(cluster)
    configure(cluster, hosts, per_host, program, args)
    if launcher == OURS:
        return run_sagemaker(cluster, ["train"], hosts, timeout)
    if launcher == TOOLKIT:
        return run_sagemaker(cluster, TOOLKIT_TRAIN, hosts, timeout)
    script = [f"/opt/ml/code/{program}"] + [f"--{key}={value}" for key, value in args.items()]
    return run_horovodrun(cluster, launcher == HVD_GLOO, hosts, per_host, script, timeout, tag)


# ----- reading what the ranks wrote -----
def output_file(cluster: Cluster, name: str) -> Path:
    """Rank 0's output file, on whichever host rank 0 ran (the toolkit's leader is algo-2)."""
    for host in cluster.spec.host_names:
        path = cluster.ml_dir(host) / "output" / "data" / name
        if path.exists():
            return path
    raise ClusterError(f"no host has output/data/{name}")


def images_per_sec(cluster: Cluster) -> float:
    with output_file(cluster, "history.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    rows = rows[1:] or rows
    return statistics.median(float(row["images_per_sec"]) for row in rows)


# ----- the rows -----
@dataclass
class Row:
    name: str
    unit: str
    lower_is_better: bool
    values: dict[str, list[float]] = field(default_factory=lambda: {name: [] for name in LAUNCHERS})
    loads: list[float] = field(default_factory=list)
    extra: dict[str, list[str]] = field(default_factory=lambda: {name: [] for name in LAUNCHERS})


def measure_timing(cluster: Cluster, launcher: str, rows: dict[str, Row], work: float) -> None:
    worker = "algo-1" if launcher == TOOLKIT else "algo-2"
    for mode in ("ok", "crash"):
        args = {"mode": mode, "work": str(work), "crash_host": worker}
        timeout = 150.0 if launcher == TOOLKIT else 60.0
        run = run_launcher(cluster, launcher, 2, 1, "bench_job.py", args, timeout, f"timing-{mode}")
        times = rank_times(cluster)
        load = loadavg()
        first = min((t["start"] for t in times), default=float("nan"))
        exits = ", ".join(f"{host}={code}" for host, code in run.exits.items())
        if run.timed_out:
            exits += " (timeout)"
        if mode == "ok":
            end = max((t.get("end", float("nan")) for t in times), default=float("nan"))
            add(rows["start"], launcher, first - run.started, load)
            add(rows["end"], launcher, run.ended - end, load)
            if run.host_ends:  # launchers with a process on every host
                per_host = [ended - end for ended in run.host_ends.values()]
                add(rows["end_host"], launcher, statistics.median(finite(per_host) or [float("nan")]), load)
        else:
            crash = min((t["crash"] for t in times if "crash" in t), default=float("nan"))
            add(rows["crash"], launcher, run.ended - crash, load)
            rows["crash"].extra[launcher].append(exits)
        say(f"  {launcher} {mode}: exits {exits}, load {load:.1f} {'; '.join(run.notes)}")


def measure_mnist(cluster: Cluster, launcher: str, rows: dict[str, Row], epochs: int, steps: int) -> None:
    args = {"epochs": str(epochs), "steps_per_epoch": str(steps)}
    for key, hosts, per_host in (("mnist1", 1, 2), ("mnist2", 2, 1)):
        run = run_launcher(cluster, launcher, hosts, per_host, MNIST_PROGRAM, args, 600.0, key)
        if run.timed_out or any(code != 0 for code in run.exits.values()):
            say(f"  {launcher} {key}: FAILED {run.exits} {run.notes}")
            continue
        value = images_per_sec(cluster)
        add(rows[key], launcher, value, loadavg())
        say(f"  {launcher} {key}: {value:.0f} images/s, load {loadavg():.1f}")


def measure_allreduce(cluster: Cluster, launcher: str, rows: dict[str, Row]) -> None:
    sizes = ",".join(f"{name.replace(' ', '')}:{nbytes}:{repeats}" for name, nbytes, repeats in SIZES)
    args = {"mode": "allreduce", "sizes": sizes}
    timeout = 300.0
    run = run_launcher(cluster, launcher, 2, 1, "bench_job.py", args, timeout, "allreduce")
    if run.timed_out or any(code != 0 for code in run.exits.values()):
        say(f"  {launcher} allreduce: FAILED {run.exits} {run.notes}")
        return
    results = json.loads(output_file(cluster, "allreduce.json").read_text())
    load = loadavg()
    for name, _, _ in SIZES:
        add(rows[f"ar {name}"], launcher, results[name.replace(" ", "")]["bus_gbit_s"], load)
    shown = ", ".join(f"{name} {results[name.replace(' ', '')]['bus_gbit_s']:.3f}" for name, _, _ in SIZES)
    say(f"  {launcher} allreduce Gbit/s: {shown}, load {load:.1f}")


def add(row: Row, launcher: str, value: float, load: float) -> None:
    row.values[launcher].append(value)
    row.loads.append(load)


def make_rows(repeats: int, epochs: int, steps: int) -> dict[str, Row]:
    rows = {
        "start": Row("start -> first rank running", "s", True),
        "end": Row(
            "job end -> last launcher process exited (horovodrun: its exit, its remote processes)", "s", True
        ),
        "end_host": Row("job end -> each host's launcher exit (median over hosts)", "s", True),
        "crash": Row("rank crash on the worker -> all hosts exited", "s", True),
        "mnist1": Row(f"MNIST np=2 on 1 host ({epochs}x{steps} steps)", "images/s", False),
        "mnist2": Row(f"MNIST 2 hosts x 1 ({epochs}x{steps} steps)", "images/s", False),
    }
    for name, _, count in SIZES:
        rows[f"ar {name}"] = Row(f"allreduce bus bandwidth {name} ({count} timed)", "Gbit/s", False)
    return rows


def ratio(row: Row, launcher: str) -> float | None:
    """> 1: better than the best peer (time rows: best peer's time / this; rate rows: this / best peer)."""
    value = median_of(row.values[launcher])
    peers = [v for peer in PEERS if (v := median_of(row.values[peer])) is not None]
    if value is None or not peers or value == 0:
        return None
    best = min(peers) if row.lower_is_better else max(peers)
    return best / value if row.lower_is_better else value / best


def fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if unit == "images/s":
        return f"{value:.0f}"
    return f"{value:.3f}" if unit == "Gbit/s" and value < 1 else f"{value:.2f}"


def fmt_cell(row: Row, launcher: str, with_ratio: bool) -> str:
    """'median (min-max) [ratio] n=N'; n/a for a per-host row of a launcher without per-host processes."""
    values = finite(row.values[launcher])
    if not values:
        return (
            "n/a" if row.name.startswith("job end -> each host") and launcher in (HVD_MPI, HVD_GLOO) else "-"
        )
    cell = fmt_value(statistics.median(values), row.unit)
    if len(values) > 1:
        cell += f" ({fmt_value(min(values), row.unit)}-{fmt_value(max(values), row.unit)})"
    r = ratio(row, launcher) if with_ratio else None
    return cell + (f" [{r:.2f}]" if r is not None else "") + f" n={len(values)}"


def report(rows: dict[str, Row], repeats: int, started_load: tuple[float, float, float]) -> None:
    header = ["row (unit, median (min-max) of runs)", *LAUNCHERS, "ours / best peer", "load avg (1 min)"]
    lines = [header]
    for row in rows.values():
        if not any(row.values.values()):
            continue
        cells = [f"{row.name} ({row.unit})"]
        cells += [fmt_cell(row, launcher, with_ratio=True) for launcher in LAUNCHERS]
        ours = ratio(row, OURS)
        cells.append("-" if ours is None else f"{ours:.2f}")
        cells.append(f"{min(row.loads):.1f}-{max(row.loads):.1f}" if row.loads else "-")
        lines.append(cells)
    crash = rows["crash"]
    if any(crash.extra.values()):
        cells = ["exit codes after the crash (per host / horovodrun)"]
        cells += [" | ".join(sorted(set(crash.extra[launcher]))) or "-" for launcher in LAUNCHERS]
        lines.append([*cells, "", ""])
    say(
        f"\nPeers side by side on one simulated 2-host cluster (2 cores shared); [ratio to the best peer, "
        f"> 1 = better than the best peer]; up to {repeats} run(s) per cell (n=); load average at the start "
        f"{started_load[0]:.1f} {started_load[1]:.1f} {started_load[2]:.1f}, at the end "
        + " ".join(f"{x:.1f}" for x in os.getloadavg())
    )
    say(table([[cell.replace("|", "/") for cell in line] for line in lines]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs of the timing rows per launcher")
    parser.add_argument(
        "--toolkit-repeats", type=int, default=3, help="runs of the timing rows for the toolkit (~100 s each)"
    )
    parser.add_argument("--heavy-repeats", type=int, default=3, help="runs of the MNIST and allreduce rows")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50, help="MNIST steps per epoch (per rank)")
    parser.add_argument("--work", type=float, default=1.0, help="seconds each rank works (timing rows)")
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="comma-separated subset")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) and print it")
    parser.add_argument("--only", default="timing,mnist,allreduce", help="comma-separated: which row groups")
    args = parser.parse_args()
    launchers = [name for name in LAUNCHERS if name in args.launchers.split(",")]
    groups = args.only.split(",")
    started_load = os.getloadavg()
    began = time.time()
    rows = make_rows(args.repeats, args.epochs, args.steps)
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
        workdir = Path(tempfile.mkdtemp(prefix="bench-peers-")) if args.keep else Path(tmp)
        if args.keep:
            say(f"work directory (kept): {workdir}")
        code = workdir / "code"
        mnist_code_dir(code)  # the example and benchmarks/mnist_measure.py (its timings in history.csv)
        write_job(code)
        (workdir / "sshd_config").write_text(SSHD_CONFIG)
        spec = ClusterSpec(
            hosts=2,
            workdir=workdir / "cluster",
            code_dir=code,
            ssh_client_config=True,  # as SageMaker's images have: no host key checks between algo-*
            extra_binds=((workdir / "sshd_config", Path("/etc/ssh/sshd_config")),),
        )
        plan: list[tuple[str, Callable[[Cluster, str], None]]] = []
        for repeat in range(max(args.repeats, args.heavy_repeats)):
            if "timing" in groups and repeat < args.repeats:
                plan.append(("timing", lambda c, name: measure_timing(c, name, rows, args.work)))
            if "mnist" in groups and repeat < args.heavy_repeats:
                plan.append(("mnist", lambda c, name: measure_mnist(c, name, rows, args.epochs, args.steps)))
            if "allreduce" in groups and repeat < args.heavy_repeats:
                plan.append(("allreduce", lambda c, name: measure_allreduce(c, name, rows)))
        with Cluster(spec) as cluster:
            done: dict[tuple[str, str], int] = {}
            for group, step in plan:
                for launcher in launchers:
                    runs = done[(group, launcher)] = done.get((group, launcher), 0) + 1
                    if group == "timing" and launcher == TOOLKIT and runs > args.toolkit_repeats:
                        continue
                    say(f"{time.time() - began:6.0f} s  {group}: {launcher} ...")
                    step(cluster, launcher)
    say(f"\ntotal {time.time() - began:.0f} s")
    report(rows, max(args.repeats, args.heavy_repeats), started_load)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
