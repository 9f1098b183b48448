"""MNIST training throughput through our launcher, with its defaults and no hand-added flags: np=1 and np=2
on one host, and 2 hosts x 1 process on a simulated cluster; images/s and the ratio to np=1. Needs root.

All three run in the same simulated host algo-1 (single-host jobs get a resourceconfig naming algo-1 alone,
as a one-instance SageMaker job has), with examples/mnist/train_mnist.py run by benchmarks/mnist_measure.py
(the per-epoch timings it adds to history.csv), --epochs E --steps_per_epoch S;
the figure is the median images/s (all ranks) over the epochs after the first (tracing, first broadcast).
Target: np=2 >= 1.6x np=1 on 2 cores. The 2 simulated hosts share the same 2 cores: that row shows the
multi-host path's cost (TCP instead of shared memory, each host's launcher sizing threads for 2 cores),
not what 2 real instances would give.

A fourth row, not a launcher default, runs np=1 with one TensorFlow thread (set through
sagemaker_mpi_custom_mpi_options), as each rank of np=2 has. Every row also shows the cores the ranks kept
busy (each rank's process CPU time over the same steps, all threads) and images per CPU-second: 2 cores x
the single-thread rank's images per CPU-second bounds what np=2 can reach on 2 cores.

    .venv/bin/python benchmarks/scaling_mnist.py [--epochs 3] [--steps 300] [--repeats 1]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cluster_common import reset_outputs, say, table
from mnist_measure import PROGRAM, code_dir

from smhvd_dev.mltree import resource_config
from smhvd_sim import Cluster, ClusterError, ClusterSpec

CONFIGS = (("np=1 (1 host)", 1, 1), ("np=2 (1 host)", 1, 2), ("2 hosts x 1", 2, 1))
# Not a launcher default: one rank on one TensorFlow thread, i.e. what each rank of np=2 gets. Its images per
# CPU-second, on 2 cores, bound what np=2 can reach even with a free allreduce.
ONE_THREAD = ("np=1, 1 TF thread (reference)", 1, 1)
ONE_THREAD_OPTIONS = "-x TF_NUM_INTRAOP_THREADS=1 -x TF_NUM_INTEROP_THREADS=1 -x OMP_NUM_THREADS=1"


def configure(
    cluster: Cluster, hosts: int, per_host: int, epochs: int, steps: int, mpi_options: str = ""
) -> None:
    names = cluster.spec.host_names[:hosts]
    for host in cluster.spec.host_names:
        config = cluster.ml_dir(host) / "input" / "config"
        resource = resource_config(host, names if host in names else cluster.spec.host_names, "ml.c5.xlarge")
        (config / "resourceconfig.json").write_text(json.dumps(resource))
        hyperparameters = json.loads((config / "hyperparameters.json").read_text())
        hyperparameters.update(
            sagemaker_mpi_num_of_processes_per_host=str(per_host),
            epochs=str(epochs),
            steps_per_epoch=str(steps),
        )
        if mpi_options:
            hyperparameters["sagemaker_mpi_custom_mpi_options"] = json.dumps(mpi_options)
        else:
            hyperparameters.pop("sagemaker_mpi_custom_mpi_options", None)
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))


@dataclass(frozen=True)
class Throughput:
    images_per_sec: float  # all ranks
    cores_busy: float  # all ranks (rank 0's busy cores x ranks: the ranks do the same work)

    @property
    def images_per_cpu_second(self) -> float:
        return self.images_per_sec / self.cores_busy


def throughput(cluster: Cluster, ranks: int) -> Throughput:
    """Medians over the epochs after the first, from rank 0's history.csv."""
    with (cluster.ml_dir("algo-1") / "output" / "data" / "history.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    rows = rows[1:] or rows
    return Throughput(
        images_per_sec=statistics.median(float(row["images_per_sec"]) for row in rows),
        cores_busy=ranks * statistics.median(float(row["rank_cpu_cores"]) for row in rows),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch (per rank)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    runs = [(config, "") for config in CONFIGS] + [(ONE_THREAD, ONE_THREAD_OPTIONS)]
    measured: dict[str, list[Throughput]] = {name: [] for (name, _, _), _ in runs}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        spec = ClusterSpec(
            hosts=2,
            workdir=Path(tmp),
            code_dir=code_dir(Path(tmp) / "mnist-code"),
            hyperparameters={"sagemaker_program": json.dumps(PROGRAM)},
        )
        with Cluster(spec) as cluster:
            for _ in range(args.repeats):
                for (name, hosts, per_host), mpi_options in runs:
                    reset_outputs(cluster)
                    configure(cluster, hosts, per_host, args.epochs, args.steps, mpi_options)
                    down = cluster.spec.host_names[hosts:]
                    results = cluster.run(["train"], down=down, timeout=900)
                    if any(results[host].exit_code != 0 for host in cluster.spec.host_names[:hosts]):
                        raise ClusterError(f"{name}: training failed; see {results['algo-1'].log}")
                    log = results["algo-1"].log
                    one_thread = "TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1"
                    if mpi_options and one_thread not in Path(log).read_text():
                        raise ClusterError(f"{name}: the rank ran with more than one TF thread; see {log}")
                    measured[name].append(throughput(cluster, hosts * per_host))
                    say(f"{name}: {measured[name][-1]}")
    return report(measured, args.epochs, args.steps)


def report(measured: dict[str, list[Throughput]], epochs: int, steps: int) -> int:
    def median(name: str, field: str) -> float:
        return statistics.median(getattr(t, field) for t in measured[name])

    base = median(CONFIGS[0][0], "images_per_sec")
    rows = [["configuration", "images/s (median)", "runs", "ratio to np=1", "cores busy", "images/CPU-s"]]
    for name, values in measured.items():
        value = median(name, "images_per_sec")
        rows.append(
            [
                name,
                f"{value:.0f}",
                " ".join(f"{t.images_per_sec:.0f}" for t in values),
                f"{value / base:.2f}",
                f"{median(name, 'cores_busy'):.2f}",
                f"{median(name, 'images_per_cpu_second'):.0f}",
            ]
        )
    # What np=2 could reach if every core ran at the CPU efficiency of one single-thread rank.
    bound = 2 * median(ONE_THREAD[0], "images_per_cpu_second")
    say(f"\nMNIST CNN, batch 64 per rank, {epochs} epochs x {steps} steps, launcher defaults")
    say(table(rows))
    say(
        f"2 cores x images/CPU-s of one single-thread rank: {bound:.0f} images/s = {bound / base:.2f}x np=1"
        " (the most np=2 can reach unless Horovod made each image cheaper)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
