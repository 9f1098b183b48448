"""A training loop in mpi4py with nothing that measures its steps but `inflight.step()` (docs/inflight.md):
each step computes for --compute seconds, calls inflight.step(), then allreduces. From step --slow-from to
--slow-until, the ranks on host --slow-host compute --slow-extra seconds more (a starving data loader)."""

from __future__ import annotations

import argparse
import os
import time

from mpi4py import MPI

from smhvd import inflight


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def main() -> None:
    parser = argparse.ArgumentParser()
    for name, kind in (("steps", int), ("compute", float), ("slow-from", int), ("slow-until", int)):
        parser.add_argument(f"--{name}", type=kind, required=True)
    parser.add_argument("--slow-host", required=True)
    parser.add_argument("--slow-extra", type=float, required=True)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    slow_here = os.environ.get("SM_CURRENT_HOST") == args.slow_host
    total = 0.0
    for step in range(args.steps):
        extra = args.slow_extra if slow_here and args.slow_from <= step < args.slow_until else 0.0
        busy(args.compute)
        if extra:
            time.sleep(extra)  # waiting for data, not computing
        inflight.step()
        total += comm.allreduce(1.0)
    if comm.rank == 0:
        print(f"stepping_job: {args.steps} steps, allreduced {total:.0f}", flush=True)


if __name__ == "__main__":
    main()
