"""Run under `mpirun -np 3`: the pre-flight's second look at a suspect link (preflight/network.confirm), on
figures that make link 0->1 a suspect (20 GB/s against a median of 100 GB/s: every alone figure on loopback is
below it too), with rank 1 pinned to CPU argv[1] and ranks 0 and 2 to CPU argv[2]. The test keeps rank 1's CPU
busy, or not. Prints rank 1's result as one JSON line: {"confirmed": {src: MB/s}, "busy": {src: CPU share}}.

argv: RANK1_CPU OTHERS_CPU"""

from __future__ import annotations

import json
import os
import sys

from mpi4py import MPI

from smhvd.preflight import network

SUSPECT, MEDIAN = 20_000.0, 100_000.0


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    os.sched_setaffinity(0, {int(sys.argv[1]) if rank == 1 else int(sys.argv[2])})
    sources = [src for src in range(comm.Get_size()) if src != rank]
    best = {src: SUSPECT if (src, rank) == (0, 1) else MEDIAN for src in sources}
    confirmed, busy = network.confirm(comm, MPI, rank, best, 0.5)
    if rank == 1:
        print(json.dumps({"confirmed": confirmed, "busy": busy}), flush=True)


if __name__ == "__main__":
    main()
