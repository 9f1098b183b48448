"""The pre-flight's program on each host (`python -m smhvd.preflight.probe`, one per host under the job's
mpirun; alone on a one-host job): it beats every PREFLIGHT_BEAT seconds from its first moment, writes this
host's facts, then (several hosts) measures the links into it and the leader's latency and clock offset to
it over MPI, then the NCCL all_reduce bandwidth over this host's GPUs and across the hosts; each finding is a
line of its own (wire.py), so that what a host said before it stopped answering is kept.

It imports neither the frameworks nor the launcher's roles: mpi4py (when installed) and ctypes for the GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from smhvd.mpi import efa
from smhvd.preflight import gpu, nccl_net, network
from smhvd.preflight.facts import gather
from smhvd.proc.processes import die_with_parent, state
from smhvd.wire import PREFLIGHT_BEAT, PREFLIGHT_MARK, PREFLIGHT_SPEC

GPU_BYTES = 64 << 20
GPU_ITERS = 5


class Out:
    """Whole lines to stdout (each one write, under PIPE_BUF: the beat process's never cut the probe's)."""

    def __init__(self, started: float) -> None:
        self.started = started

    def say(self, **finding: object) -> None:
        """One finding, with `t`: seconds since the probe started."""
        finding["t"] = round(time.monotonic() - self.started, 3)
        os.write(1, (PREFLIGHT_MARK + json.dumps(finding, separators=(",", ":")) + "\n").encode())


def start_beating(out: Out) -> int:
    """A child process that beats for this probe every PREFLIGHT_BEAT seconds while the probe runs: not
    while it is stopped, and it exits when the probe is gone. A process, not a thread: MPI_Init (in mpi4py's
    import) holds the GIL while it waits for every host, and a thread could not beat then."""
    probe = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        die_with_parent()
        while True:
            time.sleep(PREFLIGHT_BEAT)
            now = state(probe)
            if now is None or os.getppid() != probe:
                break
            if now not in "TtZX":  # stopped, traced or gone: no word from it
                out.say(beat=True)
    finally:
        os._exit(0)


def open_mpi(several: bool) -> tuple[Any, Any] | str:
    """mpi4py's MPI and COMM_WORLD (initialized only with several hosts), or why not."""
    try:
        import mpi4py

        mpi4py.rc.initialize = several
        from mpi4py import MPI
    except ImportError as exc:
        return f"mpi4py not importable ({exc})"
    return MPI, MPI.COMM_WORLD


def gpu_findings(out: Out, mpi: tuple[Any, Any] | None, rank: int, n: int) -> None:
    """This host's all_reduce over its GPUs, then (several hosts, every one with GPUs) across the hosts."""
    runtime = gpu.load(os.environ)
    if isinstance(runtime, str):
        devices = 0
        out.say(gpu={"error": runtime})
    else:
        devices = gpu.device_count(runtime)
        found: dict[str, object] = {"devices": devices, "nccl": gpu.nccl_version(runtime)}
        if devices >= 1:  # one GPU: NCCL's own start and a copy (no bus bandwidth to compare)
            try:
                bw = gpu.allreduce(runtime, gpu.unique_id(runtime), devices, 0, devices, GPU_BYTES, GPU_ITERS)
                found["algbw_gbps"] = round(bw.algbw_gbps, 1)
                if devices >= 2:
                    found["busbw_gbps"] = round(bw.busbw_gbps, 1)
            except gpu.GpuError as exc:
                found["error"] = str(exc)
        out.say(gpu=found)
    if mpi is None or n < 2:
        return
    _, comm = mpi
    counts = comm.allgather(devices)
    if min(counts) == 0 or isinstance(runtime, str):
        return
    uid = comm.bcast(gpu.unique_id(runtime) if rank == 0 else None, root=0)
    try:
        bw = gpu.allreduce(runtime, uid, sum(counts), sum(counts[:rank]), devices, GPU_BYTES, GPU_ITERS)
        result: dict[str, object] = {"busbw_gbps": round(bw.busbw_gbps, 1), "ranks": bw.ranks}
    except gpu.GpuError as exc:
        result = {"error": str(exc)}
    out.say(gpu_cluster=result)  # every rank its own: a failure is NCCL's word on the host that saw it


def run(spec: Mapping[str, Any], out: Out) -> None:
    hosts: list[str] = list(spec["hosts"])
    several = len(hosts) > 1
    rank = int(os.environ.get("OMPI_COMM_WORLD_RANK", "0")) if several else 0
    host = hosts[rank]
    places = {name: Path(path) for name, path in spec["places"].items()}
    found = gather(host, places, time.time())
    facts = asdict(found)
    mpi = open_mpi(several)
    if isinstance(mpi, str):
        facts["notes"] = [*facts["notes"], mpi]
    else:
        library = mpi[0].Get_library_version().split(",")[0].strip()  # "Open MPI v4.1.4"
        facts["versions"]["mpi"] = library.removeprefix("Open MPI v").removeprefix("Open MPI ")
    out.say(facts=facts)
    if several and not isinstance(mpi, str):
        MPI, comm = mpi
        n = comm.Get_size()
        ratio = float(spec["min_ratio"])
        links, busy = network.measure_links(comm, MPI, ratio)
        out.say(links={hosts[src]: mb_s for src, mb_s in links.items()})
        if busy:  # slow links into this host, not judged: an end never had the CPU (its share)
            out.say(busy_links={hosts[src]: share for src, share in busy.items()})
        clock = network.clock_and_latency(comm, rank, n, ratio)
        if rank == 0:
            out.say(clock={hosts[r]: {"rtt_ms": rtt, "offset_s": off} for r, (rtt, off) in clock.items()})
        network.idle_wait(comm.Ibarrier(), network.PATIENT_POLL)  # none spins in MPI_Finalize meanwhile
    if spec.get("gpus"):
        net = nccl_net.detect(
            os.environ,
            provider=efa.probe().present,
            efa_devices=len(found.efa_devices),
            nccl_version=found.versions.get("nccl"),
            listed=nccl_net.provider_listed(),
        )
        out.say(nccl_net=asdict(net))
        gpu_findings(out, None if isinstance(mpi, str) else mpi, rank, len(hosts))
    out.say(done=True)


def main() -> int:
    out = Out(time.monotonic())
    beating = start_beating(out)
    try:
        run(json.loads(os.environ[PREFLIGHT_SPEC]), out)
    except Exception as exc:  # a finding too: the leader names the host with it
        out.say(error=f"{type(exc).__name__}: {exc}")
        return 1
    finally:
        os.kill(beating, signal.SIGKILL)
        os.waitpid(beating, 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
