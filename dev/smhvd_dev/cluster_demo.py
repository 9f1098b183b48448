"""``make cluster-demo``: MNIST through the launcher on a simulated 2-host cluster, 1 process per host.

Prints the hosts' output as it comes, then the test accuracy rank 0 wrote (metrics.json on the leader) and
each host's exit code. Exit status: 0 when every host exited 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from smhvd_sim.cli import INTERRUPTED_EXIT, exit_status, summary
from smhvd_sim.cluster import Cluster
from smhvd_sim.spec import ClusterSpec
from smhvd_sim.system import ClusterError, Interrupted

PROGRAM = "train_mnist.py"


def demo_spec(args: argparse.Namespace) -> ClusterSpec:
    code = args.code.resolve()
    if not (code / PROGRAM).is_file():
        raise ClusterError(f"--code: {code} has no {PROGRAM}")
    hyperparameters = {
        "sagemaker_program": json.dumps(PROGRAM),
        "sagemaker_mpi_enabled": "true",
        "sagemaker_mpi_num_of_processes_per_host": str(args.processes_per_host),
        "epochs": str(args.epochs),
    }
    if args.steps_per_epoch:
        hyperparameters["steps_per_epoch"] = str(args.steps_per_epoch)
    workdir = args.workdir or Path("/tmp/smhvd-cluster") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    env = dict(item.split("=", 1) for item in args.env)
    return ClusterSpec(
        hosts=args.hosts, workdir=workdir.resolve(), hyperparameters=hyperparameters, code_dir=code, env=env
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m smhvd_dev.cluster_demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--code", type=Path, required=True, help=f"directory with {PROGRAM}")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--processes-per-host", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--steps-per-epoch", type=int, default=0, help="cap on steps per epoch (0: full pass)"
    )
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", help="extra env for train")
    args = parser.parse_args(argv)
    try:
        spec = demo_spec(args)
        with Cluster(spec) as cluster:
            print(f"cluster-demo: {spec.hosts} hosts up, trees and logs in {spec.workdir}", flush=True)
            results = cluster.run(["train"], timeout=args.timeout, echo=sys.stdout)
            metrics_file = cluster.ml_dir(cluster.leader) / "output" / "data" / "metrics.json"
    except ClusterError as exc:
        print(f"cluster-demo: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(f"cluster-demo: interrupted by {exc}; every host stopped and torn down", file=sys.stderr)
        return INTERRUPTED_EXIT
    print(summary(results))
    try:
        accuracy = json.loads(metrics_file.read_text())["test_accuracy"]
        print(f"cluster-demo: test accuracy {accuracy:.4f} ({metrics_file})")
    except (OSError, ValueError, KeyError) as exc:
        print(f"cluster-demo: no test accuracy: {metrics_file}: {exc}")
    for result in results.values():
        print(f"cluster-demo: {result.host} exited with {result.exit_code}")
    return exit_status(results)


if __name__ == "__main__":
    sys.exit(main())
