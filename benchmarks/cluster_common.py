"""Shared by the cluster benchmarks: the short job script they run, resetting outputs between runs, and
reading the timestamps ranks write. Benchmarks print tables; they assert nothing."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from smhvd_sim import Cluster

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
