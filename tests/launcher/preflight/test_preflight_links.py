"""The pre-flight's link figure is never better than the link: a receiver that starts its clock late (a busy
host descheduled it right after the round's barrier) must not find the message already delivered and read a
2.5 MB/s link as a fast one. That false "fast" hid the rate-limited host of test_preflight_cluster.py on a
loaded machine (its link measured 46.6 MB/s, the median 54 MB/s).

Real parts: two ranks under mpirun over Open MPI's TCP transport, on the loopback of a network namespace of
their own whose every packet goes through a 20 Mbit/s token bucket (tc tbf); rank 1's clock starts 0.3 s
late (support/late_receiver.py). Sizes below Open MPI's eager limit (64 KiB for TCP), where the sender's
bytes flow before the receiver asks for them, and one above it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from smhvd.preflight import network
from support.cluster import SBIN_PATH, ensure_tools

pytestmark = [pytest.mark.cluster, pytest.mark.integration]

LATE = 0.3
RATE_MB_S = 2.5  # 20 Mbit/s
SIZES = (32 << 10, 60_000, 256 << 10)
SCRIPT = Path(__file__).parents[2] / "support" / "late_receiver.py"


@pytest.fixture
def slow_loopback() -> Iterator[list[str]]:
    """A network namespace whose loopback carries 20 Mbit/s; the argv prefix that runs a command in it."""
    ensure_tools({"ip": "iproute2", "tc": "iproute2", "mpirun": "openmpi-bin"})
    ip = shutil.which("ip", path=SBIN_PATH) or "ip"
    name = f"smhvd-links-{os.getpid()}"
    subprocess.run([ip, "netns", "add", name], check=True)
    try:
        inside = [ip, "netns", "exec", name]
        # Packets no larger than the bucket: tbf drops what it cannot fit, and loopback's MTU is 64 KiB.
        subprocess.run([*inside, ip, "link", "set", "lo", "mtu", "1500", "up"], check=True)
        tbf = ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", "20mbit", "burst", "32kbit"]
        subprocess.run([*inside, *tbf, "latency", "400ms"], check=True)
        yield inside
    finally:
        subprocess.run([ip, "netns", "del", name], check=True)


def test_a_late_receiver_does_not_read_a_slow_link_as_fast(slow_loopback: list[str]) -> None:
    mpirun = [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2",
        "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
    ]  # fmt: skip
    proc = subprocess.run(
        [*slow_loopback, *mpirun, sys.executable, str(SCRIPT), str(LATE), *map(str, SIZES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = [json.loads(line) for line in proc.stdout.splitlines()]
    late = {f["size"]: f["mb_s"] for f in figures if f["rank"] == 1}
    assert sorted(late) == sorted(SIZES), proc.stdout
    # Both directions share the one bucket: a figure is at most the link's rate, give or take its burst.
    assert all(mb_s < 1.5 * RATE_MB_S for mb_s in late.values()), late


STARVED = Path(__file__).parents[2] / "support" / "starved_link.py"
HOGS = 3  # busy loops beside rank 1 on its CPU: it runs about a quarter of the time


def confirm_link(busy_cpu: bool) -> dict[str, dict[str, float]]:
    """support/starved_link.py under a real mpirun on loopback, rank 1's CPU shared with HOGS busy loops or
    not; rank 1's result."""
    ensure_tools({"mpirun": "openmpi-bin"})
    cpus = sorted(os.sched_getaffinity(0))
    assert len(cpus) >= 2, "the test pins rank 1 and the others to two CPUs"
    mine, others = cpus[0], cpus[1]
    mpirun = [
        "mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "-np", "3",
        "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
    ]  # fmt: skip
    hog = [sys.executable, "-c", "while True: pass"]
    hogs = [
        subprocess.Popen(hog, preexec_fn=lambda: os.sched_setaffinity(0, {mine}))  # noqa: PLW1509
        for _ in range(HOGS if busy_cpu else 0)
    ]
    try:
        proc = subprocess.run(
            [*mpirun, sys.executable, str(STARVED), str(mine), str(others)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        for p in hogs:
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr[-2000:]
    result: dict[str, dict[str, float]] = json.loads(proc.stdout.splitlines()[-1])
    return result


def test_a_link_whose_end_never_had_its_cpu_is_not_judged_and_one_that_had_it_is() -> None:
    """A suspect link measured alone while its receiver shares its CPU with busy loops measures the loops,
    not the link: no try counts, and the link comes back unjudged with the CPU share seen (the verdict then
    writes a note, not a name). The same link with the CPU to itself is judged: slow here, since the figures
    given make every loopback transfer slow against their median."""
    starved = confirm_link(busy_cpu=True)
    assert list(starved["busy"]) == ["0"], starved
    assert starved["busy"]["0"] < network.MIN_CPU_SHARE
    assert starved["confirmed"]["0"] == 20_000.0  # its figure is not lifted either
    free = confirm_link(busy_cpu=False)
    assert free["busy"] == {}, free
    assert free["confirmed"]["0"] < 0.5 * 100_000.0  # judged: still below the threshold
