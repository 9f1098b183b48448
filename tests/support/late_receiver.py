"""Run under `mpirun -np 2`: one round of the pre-flight's link measurement (preflight/network.exchange)
between the two ranks, with rank 1's clock starting LATE seconds after its barrier, as on a busy host that
descheduled it there. Prints each rank's figures as one JSON line: {"rank": r, "size": bytes, "mb_s": {...}}.

argv: LATE SIZE..."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable

from mpi4py import MPI

from smhvd.preflight import network


def late_clock(late: float) -> Callable[[], float]:
    started = False

    def clock() -> float:
        nonlocal started
        if not started:
            started = True
            time.sleep(late)
        return time.perf_counter()

    return clock


def main() -> None:
    late, sizes = float(sys.argv[1]), [int(arg) for arg in sys.argv[2:]]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    peer = [1 - rank]
    for size in sizes:
        comm.Barrier()
        network.exchange(comm, MPI, rank, peer, lambda _link, size=size: size)  # connects, and warms up
        comm.Barrier()
        clock = late_clock(late) if rank == 1 else time.perf_counter
        got = network.exchange(comm, MPI, rank, peer, lambda _link, size=size: size, clock)
        print(json.dumps({"rank": rank, "size": size, "mb_s": got[1 - rank]}), flush=True)


if __name__ == "__main__":
    main()
