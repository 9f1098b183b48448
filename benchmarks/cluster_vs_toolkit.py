"""Our launcher vs the stock sagemaker-training toolkit's MPI runner, in one run on the same simulated
2-host cluster (1 process per host) with the same short script. Needs root.

Prints, for each launcher: start -> first rank running; last rank exit -> last host exit (job succeeded);
rank crash on a worker host -> last host exit; each host's exit code; the leader's failure file's first line.
The toolkit elects as leader the first host of the instance group, whose order SageMaker does not sort (the
resourceconfig lists algo-2 first), ours sorted(hosts)[0]: the crash is put on each one's worker.
Targets for ours: worker exit <= 1 s after the job ends; crash -> all hosts exited <= 2 s.

    .venv/bin/python benchmarks/cluster_vs_toolkit.py [--toolkit-timeout 240] [--skip-toolkit]

The toolkit's runner needs, per host, what the cluster gives every host (its own /opt/ml bind-mounted at
/opt/ml, which its LD_PRELOADed gethostname library reads; a private /etc/environment it appends the whole
environment to; /run/sshd; a reaping PID 1), plus an sshd_config without PAM (its workers and leader start
the system sshd) and an ssh client config without host key checks, as SageMaker's images have.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cluster_common import (
    SSHD_CONFIG,
    TOOLKIT_TRAIN,
    failure_text,
    rank_times,
    reset_outputs,
    say,
    table,
    write_job,
)

from smhvd_sim import Cluster, ClusterSpec, HostResult

OURS_TRAIN = ["train"]


@dataclass(frozen=True)
class Measure:
    launcher: str
    scenario: str
    first_rank_s: float | None
    end_to_last_exit_s: float | None
    exits: str
    failure: str


def run_once(
    cluster: Cluster, launcher: str, argv: list[str], mode: str, crash_host: str, timeout: float
) -> Measure:
    reset_outputs(cluster)
    hyperparameters = cluster.ml_dir("algo-1") / "input" / "config" / "hyperparameters.json"
    for host in cluster.spec.host_names:
        path = cluster.ml_dir(host) / "input" / "config" / "hyperparameters.json"
        config = json.loads(hyperparameters.read_text())
        config["mode"] = json.dumps(mode)
        config["crash_host"] = json.dumps(crash_host)
        path.write_text(json.dumps(config))
    results = cluster.run(argv, timeout=timeout, grace=5.0)
    return measure(cluster, launcher, mode, crash_host, results)


def measure(
    cluster: Cluster, launcher: str, mode: str, crash_host: str, results: dict[str, HostResult]
) -> Measure:
    times = rank_times(cluster)
    started = min(result.started for result in results.values())
    last_exit = max((result.ended or float("nan")) for result in results.values())
    first_rank = min((t["start"] for t in times), default=None)
    if mode == "ok":
        job_end = max((t.get("end", float("nan")) for t in times), default=None)
    else:
        job_end = min((t["crash"] for t in times if "crash" in t), default=None)
    exits = ", ".join(f"{r.host}={'timeout' if r.timed_out else r.exit_code}" for r in results.values())
    return Measure(
        launcher=launcher,
        scenario="job succeeds" if mode == "ok" else f"rank crash on {crash_host} (worker)",
        first_rank_s=None if first_rank is None else first_rank - started,
        end_to_last_exit_s=None if job_end is None else last_exit - job_end,
        exits=exits,
        failure=failure_text(cluster)[:100] or "(no failure file)",
    )


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--toolkit-timeout", type=float, default=240.0)
    parser.add_argument("--skip-toolkit", action="store_true")
    parser.add_argument("--work", type=float, default=1.0, help="seconds each rank works")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        workdir = Path(tmp)
        write_job(workdir / "code")
        (workdir / "sshd_config").write_text(SSHD_CONFIG)
        spec = ClusterSpec(
            hosts=2,
            workdir=workdir / "cluster",
            code_dir=workdir / "code",
            hyperparameters={
                "sagemaker_program": json.dumps("bench_job.py"),
                "sagemaker_mpi_enabled": "true",
                "sagemaker_mpi_num_of_processes_per_host": "1",
                "sagemaker_region": json.dumps("us-east-1"),
                "work": str(args.work),
            },
            ssh_client_config=True,
            extra_binds=((workdir / "sshd_config", Path("/etc/ssh/sshd_config")),),
        )
        measures = []
        with Cluster(spec) as cluster:
            plan = [("ours", OURS_TRAIN, "algo-2", 120.0)]
            if not args.skip_toolkit:
                plan.append(("toolkit 4.9.0", TOOLKIT_TRAIN, "algo-1", args.toolkit_timeout))
            for launcher, argv, worker, timeout in plan:
                for mode in ("ok", "crash"):
                    say(f"running {launcher}: {mode} ...")
                    result = run_once(cluster, launcher, argv, mode, worker, timeout)
                    say(f"  {result}")
                    measures.append(result)
    rows = [["launcher", "scenario", "start -> first rank (s)", "job end -> last host exit (s)", "exit codes",
             "failure file (first line)"]]  # fmt: skip
    rows += [
        [m.launcher, m.scenario, fmt(m.first_rank_s), fmt(m.end_to_last_exit_s), m.exits, m.failure]
        for m in measures
    ]
    say("")
    say(table(rows))
    return 0


if __name__ == "__main__":
    time.tzset()
    raise SystemExit(main())
