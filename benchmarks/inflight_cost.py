"""What in-flight costs a training step, and how often it names a host in a healthy job: the MNIST example
through `train` on simulated hosts (1 rank each), `launcher_inflight` warn (the default) and off, in turns.
Needs root.

The step time is the batch of all ranks over the median images/s of the epochs after the first (rank 0's
history.csv from benchmarks/mnist_measure.py: the training steps' wall time, no validation). The cost is
on / off of the median step times: of the wall time, and of rank 0's CPU seconds a step (what measuring
costs the rank itself, which a busy machine sways less than the wall time). A false alarm is any in-flight
WARNING in a healthy run's leader log (a host named, or steps said slow with nobody late). The hosts share
this machine's cores: the figures are a shared machine's, noisy at the percent level; several turns and
medians are what makes them readable.

    .venv/bin/python benchmarks/inflight_cost.py [--hosts 2,4] [--repeats 3] [--epochs 3] [--steps 300]
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import statistics
import tempfile
from pathlib import Path

from cluster_common import reset_outputs, say, table
from mnist_measure import PROGRAM, code_dir

from smhvd_sim import Cluster, ClusterError, ClusterSpec

POLICIES = ("off", "warn")
BATCH = 64  # per rank (train_mnist.py's default)
WARNING = re.compile(r"WARNING in-flight: ")


def configure(cluster: Cluster, policy: str, epochs: int, steps: int) -> None:
    for host in cluster.spec.host_names:
        path = cluster.ml_dir(host) / "input" / "config" / "hyperparameters.json"
        hyperparameters = json.loads(path.read_text())
        hyperparameters.update(
            launcher_inflight=json.dumps(policy), epochs=str(epochs), steps_per_epoch=str(steps)
        )
        path.write_text(json.dumps(hyperparameters))


def step_seconds(cluster: Cluster, ranks: int) -> tuple[float, float]:
    """The median step time of the epochs after the first, from rank 0's history.csv, and rank 0's CPU
    seconds a step (its busy cores x the step: what the measuring itself costs, less swayed by a busy
    machine than the wall time)."""
    with (cluster.ml_dir("algo-1") / "output" / "data" / "history.csv").open() as stream:
        rows = list(csv.DictReader(stream))[1:]
    step = BATCH * ranks / statistics.median(float(row["images_per_sec"]) for row in rows)
    return step, step * statistics.median(float(row["rank_cpu_cores"]) for row in rows)


def run_once(cluster: Cluster, policy: str, epochs: int, steps: int) -> tuple[tuple[float, float], list[str]]:
    """One healthy run: its step time, and the in-flight warnings its leader logged (false alarms)."""
    reset_outputs(cluster)
    configure(cluster, policy, epochs, steps)
    results = cluster.run(["train"], timeout=1200)
    log = Path(results["algo-1"].log)
    if any(result.exit_code != 0 for result in results.values()):
        raise ClusterError(f"{policy}: training failed; see {log} (kept)")
    lines = log.read_text(errors="replace").splitlines()
    return step_seconds(cluster, len(results)), [line for line in lines if WARNING.search(line)]


def one_size(hosts: int, repeats: int, epochs: int, steps: int) -> dict[str, object]:
    times: dict[str, list[tuple[float, float]]] = {policy: [] for policy in POLICIES}
    alarms: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="bench-inflight-"))  # kept when a run fails: its logs are the evidence
    spec = ClusterSpec(
        hosts=hosts,
        workdir=tmp,
        code_dir=code_dir(tmp / "mnist-code"),
        hyperparameters={"sagemaker_program": json.dumps(PROGRAM), "sagemaker_mpi_enabled": "true"},
    )
    with Cluster(spec) as cluster:
        for turn in range(repeats):
            for policy in POLICIES if turn % 2 == 0 else POLICIES[::-1]:
                (wall, cpu), warned = run_once(cluster, policy, epochs, steps)
                times[policy].append((wall, cpu))
                alarms += warned
                say(f"{hosts} hosts, in-flight {policy}: step {wall * 1000:.1f} ms, CPU {cpu * 1000:.1f} ms")
    shutil.rmtree(tmp, ignore_errors=True)
    return {"hosts": hosts, "runs": times, "alarms": alarms}


def row(hosts: int, runs: dict[str, list[tuple[float, float]]], alarms: int) -> list[str]:
    """One table row: medians of the wall and CPU step times, off and on, their ratios, every run."""
    wall = {p: statistics.median(w for w, _ in runs[p]) for p in POLICIES}
    cpu = {p: statistics.median(c for _, c in runs[p]) for p in POLICIES}
    return [
        str(hosts),
        f"{wall['off'] * 1000:.2f}",
        f"{wall['warn'] * 1000:.2f}",
        f"{wall['warn'] / wall['off']:.3f}",
        f"{cpu['off'] * 1000:.2f}",
        f"{cpu['warn'] * 1000:.2f}",
        f"{cpu['warn'] / cpu['off']:.3f}",
        " / ".join(" ".join(f"{w * 1000:.1f}" for w, _ in runs[p]) for p in POLICIES),
        str(alarms),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="2,4", help="comma-separated cluster sizes")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each policy per size")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch")
    args = parser.parse_args()
    header = ["hosts", "step off (ms)", "step on (ms)", "on / off", "CPU off (ms)", "CPU on (ms)", "on / off"]
    rows = [[*header, "runs off / on (ms)", "false alarms"]]
    for hosts in (int(h) for h in args.hosts.split(",")):
        found = one_size(hosts, args.repeats, args.epochs, args.steps)
        alarms = found["alarms"]
        assert isinstance(alarms, list)
        rows.append(row(hosts, found["runs"], len(alarms)))  # type: ignore[arg-type]
        for line in alarms:
            say(f"false alarm: {line}")
    say(f"\nMNIST CNN, batch {BATCH} per rank, 1 rank a host, {args.epochs} epochs x {args.steps} steps")
    say(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
