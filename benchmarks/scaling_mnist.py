"""MNIST training throughput through our launcher, with its defaults and no hand-added flags: np=1 and np=2
on one host, and 2 hosts x 1 process on a simulated cluster; images/s and the ratio to np=1. Needs root.

All three run in the same simulated host algo-1 (single-host jobs get a resourceconfig naming algo-1 alone,
as a one-instance SageMaker job has), with src/scripts/mnist/train_mnist.py, --epochs E --steps_per_epoch S;
the figure is the median images/s (all ranks) over the epochs after the first (tracing, first broadcast).
Target: np=2 >= 1.6x np=1 on 2 cores. The 2 simulated hosts share the same 2 cores: that row shows the
multi-host path's cost (TCP instead of shared memory, each host's launcher sizing threads for 2 cores),
not what 2 real instances would give.

    .venv/bin/python benchmarks/scaling_mnist.py [--epochs 3] [--steps 300] [--repeats 1]
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
from pathlib import Path

from cluster_common import reset_outputs, say, table

from smhvd.cluster import Cluster, ClusterError, ClusterSpec
from smhvd.cluster.spec import resource_config

REPO = Path(__file__).resolve().parents[1]
SCRIPT_DIR = REPO / "src" / "scripts" / "mnist"
CONFIGS = (("np=1 (1 host)", 1, 1), ("np=2 (1 host)", 1, 2), ("2 hosts x 1", 2, 1))


def configure(cluster: Cluster, hosts: int, per_host: int, epochs: int, steps: int) -> None:
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
        (config / "hyperparameters.json").write_text(json.dumps(hyperparameters))


def images_per_second(cluster: Cluster) -> float:
    with (cluster.ml_dir("algo-1") / "output" / "data" / "history.csv").open() as stream:
        rows = list(csv.DictReader(stream))
    return statistics.median(float(row["images_per_sec"]) for row in rows[1:] or rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300, help="steps per epoch (per rank)")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    measured: dict[str, list[float]] = {name: [] for name, _, _ in CONFIGS}
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        spec = ClusterSpec(
            hosts=2,
            workdir=Path(tmp),
            code_dir=SCRIPT_DIR,
            hyperparameters={"sagemaker_program": json.dumps("train_mnist.py")},
        )
        with Cluster(spec) as cluster:
            for _ in range(args.repeats):
                for name, hosts, per_host in CONFIGS:
                    reset_outputs(cluster)
                    configure(cluster, hosts, per_host, args.epochs, args.steps)
                    down = cluster.spec.host_names[hosts:]
                    results = cluster.run(["train"], down=down, timeout=900)
                    if any(results[host].exit_code != 0 for host in cluster.spec.host_names[:hosts]):
                        raise ClusterError(f"{name}: training failed; see {results['algo-1'].log}")
                    measured[name].append(images_per_second(cluster))
                    say(f"{name}: {measured[name][-1]:.0f} images/s")
    base = statistics.median(measured[CONFIGS[0][0]])
    rows = [["configuration", "images/s (median)", "runs", "ratio to np=1"]]
    for name, values in measured.items():
        value = statistics.median(values)
        rows.append([name, f"{value:.0f}", " ".join(f"{v:.0f}" for v in values), f"{value / base:.2f}"])
    say(f"\nMNIST CNN, batch 64 per rank, {args.epochs} epochs x {args.steps} steps, launcher defaults")
    say(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
