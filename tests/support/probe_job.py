"""The training script of the launcher fault tests (copied into the job's code directory).

Every rank records where it ran (output/data/rank-N.json: its host, the SM_CURRENT_HOST it saw and the
variables named by --record), with --allreduce takes part in an MPI allreduce over every rank, then:
--mode ok: exits 0; --mode crash: the rank on --crash_host writes a marker to stderr and exits 3, the
others run for a long time; --mode raise: after MPI is initialised, the rank on --crash_host raises an
uncaught exception while the others wait for it in a barrier (mpi4py's MPI_Finalize would wait for them
in turn); --mode sleep: runs for a long time. On SIGTERM a rank saves a checkpoint
(/opt/ml/checkpoints/rank-N) and exits 0, as a spot-training script does.
"""

import argparse
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=["ok", "crash", "raise", "sleep"], default="ok")
parser.add_argument("--crash_host", default="algo-2")
parser.add_argument("--seconds", type=float, default=300.0)
parser.add_argument("--record", default="", help="comma-separated variable names to record")
parser.add_argument("--allreduce", default="false")
parser.add_argument("--outside_seconds", type=float, default=0.0, help="a run outside MPI sleeps this long")
parser.add_argument("--outside_exit", type=int, default=0, help="... then exits with this code")
args = parser.parse_args()

outside_mpi = "OMPI_COMM_WORLD_RANK" not in os.environ  # a host outside the MPI instance groups
rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "-1"))
host = socket.gethostname()
output = Path(os.environ["SM_OUTPUT_DATA_DIR"])
checkpoints = Path(os.environ.get("SM_CHECKPOINT_DIR", "/opt/ml/checkpoints"))


def save_checkpoint(_signum: int, _frame: object) -> None:
    checkpoints.mkdir(parents=True, exist_ok=True)
    (checkpoints / f"rank-{rank}").write_text(f"rank {rank} on {host} stopped at {time.time()}\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, save_checkpoint)
record = {
    "rank": rank,
    "host": host,
    "sm_current_host": os.environ.get("SM_CURRENT_HOST"),
    "time": time.time(),
    "env": {name: os.environ.get(name) for name in args.record.split(",") if name},
}
if outside_mpi:
    (output / "outside.json").write_text(json.dumps(record))
    print(f"outside MPI on {host}", flush=True)
    time.sleep(args.outside_seconds)  # SIGTERM interrupts it through save_checkpoint
    sys.exit(args.outside_exit)
if args.allreduce == "true":
    from mpi4py import MPI

    record["allreduce"] = MPI.COMM_WORLD.allreduce(rank + 1)
(output / f"rank-{rank}.json").write_text(json.dumps(record))
print(f"rank {rank} running on {host}", flush=True)
if args.mode == "ok":
    sys.exit(0)
if args.mode == "raise":
    from mpi4py import MPI

    MPI.COMM_WORLD.Barrier()
    if host == args.crash_host:
        raise ValueError(f"probe-raise-marker: rank {rank} on {host}")
    MPI.COMM_WORLD.Barrier()  # waits for the raising rank: only the launcher can end this job
if args.mode == "crash" and host == args.crash_host:
    print(f"probe-crash-marker: rank {rank} on {host} gives up", file=sys.stderr, flush=True)
    sys.exit(3)
time.sleep(args.seconds)  # SIGTERM interrupts it through save_checkpoint
