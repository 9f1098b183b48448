"""Horovod allreduce bus bandwidth across 2 simulated hosts (1 rank each, through our launcher) next to the
raw TCP bandwidth between the same hosts (iperf3, single stream), measured in the same run. Needs root and
iperf3 (apt-get install iperf3).

Bus bandwidth = 2 (n-1)/n x bytes / seconds per allreduce (n ranks; for n=2, bytes / seconds), the median of
--iterations after --warmup. Each variant changes one setting from the launcher's defaults, to show which
settings move the ratio. Target: ratio >= 0.7 with the defaults.

    .venv/bin/python benchmarks/allreduce_vs_iperf.py [--size-mb 64] [--iterations 10]
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import tempfile
from pathlib import Path

from cluster_common import reset_outputs, say, table

from smhvd_sim import Cluster, ClusterError, ClusterSpec
from smhvd_sim.system import wait_for

JOB = """
import argparse, json, os, statistics, time
parser = argparse.ArgumentParser()
parser.add_argument("--size_mb", type=float, default=64)
parser.add_argument("--iterations", type=int, default=10)
parser.add_argument("--warmup", type=int, default=3)
parser.add_argument("--engine", choices=["horovod", "mpi4py"], default="horovod")
args, _ = parser.parse_known_args()
count = int(args.size_mb * 1024 * 1024 / 4)
seconds = []
if args.engine == "horovod":
    import tensorflow as tf
    import horovod.tensorflow as hvd
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    tensor = tf.ones([count], tf.float32)
    for step in range(args.warmup + args.iterations):
        start = time.perf_counter()
        result = hvd.allreduce(tensor, op=hvd.Sum)
        first = float(result[0])
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
else:  # the same collective straight through Open MPI, without Horovod or TensorFlow
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.rank, comm.size
    send = np.ones(count, np.float32)
    out = np.empty_like(send)
    for step in range(args.warmup + args.iterations):
        start = time.perf_counter()
        comm.Allreduce(send, out, op=MPI.SUM)
        first = float(out[0])
        if step >= args.warmup:
            seconds.append(time.perf_counter() - start)
assert first == size
if rank == 0:
    median = statistics.median(seconds)
    size_bytes = count * 4
    bus = 2 * (size - 1) / size * size_bytes / median
    out = os.environ["SM_OUTPUT_DATA_DIR"]
    with open(os.path.join(out, "allreduce.json"), "w") as f:
        json.dump({"median_s": median, "bus_gbit_s": bus * 8 / 1e9, "seconds": seconds}, f)
"""

# name -> hyperparameters added to the defaults
VARIANTS: dict[str, dict[str, str]] = {
    "launcher defaults": {},
    "mpi4py Allreduce without Horovod": {"engine": json.dumps("mpi4py")},
    "+ mpi_yield_when_idle 1": {
        "sagemaker_mpi_custom_mpi_options": json.dumps("--mca mpi_yield_when_idle 1")
    },
    "+ btl_tcp_links 4": {"sagemaker_mpi_custom_mpi_options": json.dumps("--mca btl_tcp_links 4")},
    "+ btl_tcp_max_send_size 1 MiB": {
        "sagemaker_mpi_custom_mpi_options": json.dumps("--mca btl_tcp_max_send_size 1048576")
    },
    "+ allreduce algorithm ring": {
        "sagemaker_mpi_custom_mpi_options": json.dumps(
            "--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4"
        )
    },
    "+ yield and btl_tcp_links 4": {
        "sagemaker_mpi_custom_mpi_options": json.dumps("--mca mpi_yield_when_idle 1 --mca btl_tcp_links 4")
    },
}


def iperf_gbits(cluster: Cluster, seconds: int, *, both_ways: bool = False) -> float:
    """Single-stream TCP bandwidth algo-1 -> algo-2 in Gbit/s (iperf3 server on algo-2 while it runs);
    ``both_ways``: one stream each way at once (--bidir), the mean of the two directions."""
    server = cluster.start("algo-2", ["iperf3", "-s"], log=cluster.host_dir("algo-2") / "iperf3-server.log")
    try:
        wait_for(
            lambda: True if ":5201" in cluster.exec("algo-2", ["ss", "-Hltn"])[1] else None,
            "the iperf3 server on algo-2 to listen",
            30,
        )
        argv = ["iperf3", "-c", "algo-2", "-t", str(seconds), "-J", *(["--bidir"] if both_ways else [])]
        code, out = cluster.exec("algo-1", argv, timeout=60)
        if code != 0:
            raise ClusterError(f"iperf3 client failed with exit {code}: {out[-300:]}")
        end = json.loads(out)["end"]
        keys = ["sum_received", "sum_received_bidir_reverse"] if both_ways else ["sum_received"]
        return statistics.mean(float(end[key]["bits_per_second"]) for key in keys) / 1e9
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)


def allreduce(cluster: Cluster, extra: dict[str, str], timeout: float) -> dict[str, float]:
    reset_outputs(cluster)
    base = json.loads((cluster.ml_dir("algo-1") / "input" / "config" / "hyperparameters.json").read_text())
    for host in cluster.spec.host_names:
        (cluster.ml_dir(host) / "input" / "config" / "hyperparameters.json").write_text(
            json.dumps(base | extra)
        )
    results = cluster.run(["train"], timeout=timeout)
    if any(result.exit_code != 0 for result in results.values()):
        raise ClusterError(f"allreduce job failed: {results}; see {results['algo-1'].log}")
    return json.loads((cluster.ml_dir("algo-1") / "output" / "data" / "allreduce.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=64)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--iperf-seconds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names to run")
    parser.add_argument("--repeats", type=int, default=2, help="rounds over the variants (median kept)")
    args = parser.parse_args()
    if shutil.which("iperf3") is None:
        raise SystemExit("allreduce_vs_iperf: iperf3 not found: apt-get install iperf3")
    with tempfile.TemporaryDirectory(prefix="bench-allreduce-") as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        (code / "allreduce_job.py").write_text(JOB)
        spec = ClusterSpec(
            hosts=2,
            workdir=Path(tmp) / "cluster",
            code_dir=code,
            hyperparameters={
                "sagemaker_program": json.dumps("allreduce_job.py"),
                "size_mb": str(args.size_mb),
                "iterations": str(args.iterations),
            },
        )
        rows = [
            ["setting", "bus bandwidth (Gbit/s), runs", "median", "ratio to TCP one way",
             "ratio to TCP both ways"]
        ]  # fmt: skip
        names = args.variants.split(",")
        measured: dict[str, list[float]] = {name: [] for name in names}
        tcp_runs: list[float] = []
        bidir_runs: list[float] = []
        with Cluster(spec) as cluster:
            for _ in range(args.repeats):
                tcp_runs.append(iperf_gbits(cluster, args.iperf_seconds))
                bidir_runs.append(iperf_gbits(cluster, args.iperf_seconds, both_ways=True))
                say(f"iperf3: {tcp_runs[-1]:.2f} Gbit/s one way, {bidir_runs[-1]:.2f} each way at once")
                for name in names:
                    result = allreduce(cluster, VARIANTS[name], timeout=300)
                    measured[name].append(result["bus_gbit_s"])
                    say(f"{name}: {result['bus_gbit_s']:.2f} Gbit/s (median {result['median_s']:.3f} s)")
            tcp_runs.append(iperf_gbits(cluster, args.iperf_seconds))
            say(f"iperf3: {tcp_runs[-1]:.2f} Gbit/s")
        tcp = statistics.median(tcp_runs)
        bidir = statistics.median(bidir_runs)
        for name, values in measured.items():
            bus = statistics.median(values)
            runs = " ".join(f"{value:.2f}" for value in values)
            rows.append([name, runs, f"{bus:.2f}", f"{bus / tcp:.2f}", f"{bus / bidir:.2f}"])
    say(
        f"\n{args.size_mb:g} MiB allreduce, 2 hosts x 1 rank, {args.iterations} timed iterations per run; "
        f"iperf3 single stream, median of {len(tcp_runs)} runs between the rounds: one way {tcp:.2f} Gbit/s, "
        f"both ways at once {bidir:.2f} Gbit/s per direction (an allreduce sends and receives at once)"
    )
    say(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
