"""How fast every host of a 2-host simulated cluster exits after each fault the cluster tests cover, through
our launcher (1 process per host). Needs root. Prints one row per scenario: the moment measured from, the
seconds until the last host exited, and each host's exit code.

- rank crash on algo-2: from the crash (the rank's own timestamp);
- leader's processes killed (SIGKILL, host stays on the network): from the kill;
- leader host vanishes (link cut, then every process killed: no TCP FIN/RST reaches the worker): from the cut;
- SIGTERM to every host's train (how SageMaker stops a job): from the signal;
- worker never up, launcher_peer_timeout_seconds=5: from the start.

    .venv/bin/python benchmarks/cluster_faults.py
"""

from __future__ import annotations

import json
import signal
import tempfile
import threading
import time
from pathlib import Path

from cluster_common import rank_times, reset_outputs, say, table, write_job

from smhvd_sim import Cluster, ClusterSpec
from smhvd_sim.jobs import HostProcess
from smhvd_sim.system import wait_for

HOSTS = ("algo-1", "algo-2")


def set_hyperparameters(cluster: Cluster, **values: str) -> None:
    for host in HOSTS:
        path = cluster.ml_dir(host) / "input" / "config" / "hyperparameters.json"
        config = json.loads(path.read_text())
        config.update(values)
        path.write_text(json.dumps(config))


def start(cluster: Cluster, down: tuple[str, ...] = ()) -> dict[str, HostProcess]:
    reset_outputs(cluster)
    exited = threading.Event()
    return {
        host: cluster.start(host, ["train"], exited=exited, end_host_on_exit=True)
        for host in HOSTS
        if host not in down
    }


def finish(processes: dict[str, HostProcess], since: float) -> tuple[str, str]:
    for process in processes.values():
        process.wait(300)
    last = max(process.ended or since for process in processes.values())
    codes = ", ".join(f"{host}={process.result().exit_code}" for host, process in processes.items())
    return f"{last - since:.2f}", codes


def vanish(cluster: Cluster, host: str) -> None:
    """Cut the host's link, then kill it: no FIN or RST reaches anyone, as when an instance dies."""
    cluster.host(host).set_link(up=False)
    cluster.host(host).stop()


def ranks_running(cluster: Cluster) -> None:
    wait_for(lambda: True if len(rank_times(cluster)) >= 2 else None, "both ranks to run", 120)


def main() -> int:
    rows = [["scenario", "measured from", "-> last host exit (s)", "exit codes"]]
    with tempfile.TemporaryDirectory(prefix="bench-faults-") as tmp:
        write_job(Path(tmp) / "code")
        spec = ClusterSpec(
            hosts=2,
            workdir=Path(tmp) / "cluster",
            code_dir=Path(tmp) / "code",
            hyperparameters={"sagemaker_program": json.dumps("bench_job.py"), "work": "1"},
        )
        with Cluster(spec) as cluster:
            set_hyperparameters(cluster, mode=json.dumps("crash"), crash_host=json.dumps("algo-2"))
            processes = start(cluster)
            for process in processes.values():
                process.wait(300)
            crash = min(t["crash"] for t in rank_times(cluster) if "crash" in t)
            rows.append(["rank crash on algo-2", "the crash", *finish(processes, crash)])
            say(str(rows[-1]))

            set_hyperparameters(cluster, mode=json.dumps("crash"), crash_host=json.dumps("nobody"))
            for name, action in (
                ("leader's processes killed", lambda: cluster.host("algo-1").kill_processes()),
                ("leader host vanishes (link cut first)", lambda: vanish(cluster, "algo-1")),
            ):
                if not cluster.host("algo-1").alive:
                    break
                processes = start(cluster)
                ranks_running(cluster)
                since = time.time()
                action()
                rows.append([name, "the kill or cut", *finish(processes, since)])
                say(str(rows[-1]))
        with Cluster(spec) as cluster:
            set_hyperparameters(cluster, mode=json.dumps("crash"), crash_host=json.dumps("nobody"))
            processes = start(cluster)
            ranks_running(cluster)
            since = time.time()
            for process in processes.values():
                process.send_signal(signal.SIGTERM)
            rows.append(["SIGTERM to every host's train", "the signal", *finish(processes, since)])
            say(str(rows[-1]))

            set_hyperparameters(cluster, mode=json.dumps("ok"), launcher_peer_timeout_seconds="5")
            processes = start(cluster, down=("algo-2",))
            since = min(process.started for process in processes.values())
            rows.append(["worker never up (peer timeout 5 s)", "train's start", *finish(processes, since)])
            say(str(rows[-1]))
    say("")
    say(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
