"""The pre-flight's pure parts: reading nvidia-smi, /proc and the probes' lines; which links are measured;
and the verdict: which host is named, for what, and no other (the simulated cluster runs them end to end in
test_preflight_cluster.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from smhvd.config.launcher_options import PreflightOptions
from smhvd.errors import Stopped
from smhvd.preflight import facts as facts_module
from smhvd.preflight import nccl_net, network, yardstick
from smhvd.preflight.blame import blamed_host
from smhvd.preflight.collected import Collected, mpirun_message, parse_line
from smhvd.preflight.facts import FACTS_VERSION, GpuHealth, driver_version, memory_gb, parse_gpu_query
from smhvd.preflight.runner import findings_of, lost_daemon, read_findings, run_probes
from smhvd.preflight.verdict import DISK_FIX, SHM_FIX, Findings, Named, judge, shm_reason, slow_links, table
from smhvd.proc.processes import descendants
from smhvd.proc.signals import SignalWatch
from smhvd.wire import PREFLIGHT_MARK

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")
OPTIONS = PreflightOptions()
GPU = {"index": 0, "name": "NVIDIA A100", "ecc_uncorrected": 0, "retired_pending": False,
       "remapped_pending": False, "persistence": True}  # fmt: skip


def facts(host: str, **changed: Any) -> dict[str, Any]:
    """A healthy host's facts as its probe writes them."""
    return {
        "host": host,
        "cpus": 96,
        "memory_gb": 1160.0,
        "gpus": 8,
        "gpu_health": [],
        "shm_free_mb": 100_000.0,
        "disk_free_mb": {"checkpoints": 50_000.0, "model": 50_000.0, "output": 50_000.0, "tmp": 50_000.0},
        "versions": {"python": "3.11.7", "tensorflow": "2.15.1", "horovod": "0.28.1", "mpi": "4.1.4"},
        "efa_devices": ["rdmap16s27", "rdmap32s27", "rdmap144s27", "rdmap160s27"],
        "time": 1.7e9,
        "notes": [],
        "tools": {},
        "stamp": FACTS_VERSION,
    } | changed


def ring(rates: dict[tuple[str, str], float] | None = None) -> dict[str, dict[str, float]]:
    """Every link of the 4 hosts at 1000 MB/s, but those given (src, dst) -> MB/s; by dst, then src."""
    out: dict[str, dict[str, float]] = {h: {} for h in HOSTS}
    for dst in HOSTS:
        for src in HOSTS:
            if src != dst:
                out[dst][src] = (rates or {}).get((src, dst), 1000.0)
    return out


def findings(**changed: Any) -> Findings:
    """The findings of 4 healthy ml.p4d.24xlarge hosts (8 ranks each), but those given; facts as the probes
    write them, read as the runner reads them."""
    typed = read_findings(
        {h: {"facts": f} for h, f in changed.pop("facts", {h: facts(h) for h in HOSTS}).items()}
    )
    base: dict[str, Any] = {
        "hosts": HOSTS,
        "facts": typed.facts,
        "other_version": typed.other_version,
        "ranks_per_host": 8,
        "links": ring(),
        "clock": {h: {"rtt_ms": 0.05, "offset_s": 0.001} for h in HOSTS[1:]},
        "groups": dict.fromkeys(HOSTS, ("train", "ml.p4d.24xlarge")),
    }
    return Findings(**(base | changed))


def named(f: Findings, options: PreflightOptions = OPTIONS) -> list[tuple[str, str]]:
    return [(n.host, n.reason) for n in judge(f, options).named]


def test_healthy_hosts_name_nobody_and_the_table_has_a_row_each() -> None:
    verdict = judge(findings(seconds=1.5), OPTIONS)
    assert verdict.named == ()
    assert verdict.line() == "pre-flight: all 4 host(s) fine (1.5s)"
    lines = table(verdict).splitlines()
    assert [line.split()[0] for line in lines[1:5]] == list(HOSTS)
    assert all(line.rstrip().endswith("ok") for line in lines[1:5])


@pytest.mark.parametrize(
    ("changed", "reason"),
    [
        ({"gpus": 7}, "7 GPU(s) visible; ml.p4d.24xlarge has 8"),
        (
            {"shm_free_mb": 64.0},
            "/dev/shm has 64 MB free; this job needs 544 MB (8 rank(s) x 4 MB for Open MPI, 8 GPU(s) x 64 MB "
            f"for NCCL): {SHM_FIX}",
        ),
        (
            {"disk_free_mb": {"checkpoints": 0.0, "model": 9e4, "output": 9e4, "tmp": 9e4}},
            f"checkpoints: 0 MB free; at least 1024 MB wanted: {DISK_FIX}",
        ),
        ({"gpu_health": [GPU | {"index": 5, "ecc_uncorrected": 3}]}, "GPU 5: 3 uncorrectable ECC error(s)"),
        ({"efa_devices": ["rdmap16s27"]}, "1 EFA device(s); the other hosts of train have 4"),
        ({"cpus": 48}, "48 CPUs; the other hosts of train have 96"),
    ],
)
def test_one_wrong_fact_names_that_host_alone(changed: dict[str, Any], reason: str) -> None:
    f = findings(facts={h: facts(h, **(changed if h == "algo-3" else {})) for h in HOSTS})
    assert named(f) == [("algo-3", reason)]


def test_a_version_unlike_the_majority_names_its_host_and_a_tie_keeps_the_leaders() -> None:
    odd = {h: facts(h, versions={**facts(h)["versions"], "horovod": "0.28.0"}) for h in HOSTS}
    four = findings(facts={h: odd[h] if h == "algo-2" else facts(h) for h in HOSTS})
    assert named(four) == [("algo-2", "horovod 0.28.0; the other hosts of train have 0.28.1")]
    two = findings(hosts=HOSTS[:2], facts={"algo-1": facts("algo-1"), "algo-2": odd["algo-2"]}, links={})
    assert named(two) == [("algo-2", "horovod 0.28.0; the other hosts of train have 0.28.1")]


def test_links_into_one_host_name_it_and_not_the_senders() -> None:
    slow = {("algo-2", "algo-3"): 2.4, ("algo-4", "algo-3"): 2.3, ("algo-1", "algo-3"): 2.5}
    f = findings(links=ring(slow))
    assert named(f) == [
        (
            "algo-3",
            "slow network: algo-1->algo-3 2.5 MB/s, algo-2->algo-3 2.4 MB/s, algo-4->algo-3 2.3 MB/s; "
            "median link 1000 MB/s",
        )
    ]


def test_one_slow_path_names_neither_host_and_is_a_note() -> None:
    one_way = ring({("algo-1", "algo-2"): 100.0})
    assert slow_links(one_way, 0.5) == (
        {},
        ["slow link algo-1->algo-2 100 MB/s, median link 1000 MB/s (one path: neither host named)"],
        1000.0,
    )
    both_ways = ring({("algo-1", "algo-2"): 100.0, ("algo-2", "algo-1"): 90.0})
    assert slow_links(both_ways, 0.5)[0] == {}
    verdict = judge(findings(links=one_way), OPTIONS)
    assert verdict.named == ()
    assert verdict.notes == (
        "slow link algo-1->algo-2 100 MB/s, median link 1000 MB/s (one path: neither host named)",
    )


def test_slow_links_no_measurement_could_judge_are_notes_and_the_others_still_name() -> None:
    """The 32-host false alarm: algo-6's links out were slow, measured while it (the simulated hosts share 2
    cores) hardly had a CPU. Links the probe says it could not judge name nobody; a note says why."""
    slow = {("algo-3", "algo-2"): 5.2, ("algo-3", "algo-4"): 11.1}
    busy = {"algo-2": {"algo-3": 0.31}, "algo-4": {"algo-3": 0.2}}
    verdict = judge(findings(links=ring(slow), busy_links=busy), OPTIONS)
    assert verdict.named == ()
    assert verdict.notes == (
        "slow link algo-3->algo-2 5.2 MB/s not judged: measured alone, an end had its CPU 31% of the time at "
        "best (the host's other work held it)",
        "slow link algo-3->algo-4 11.1 MB/s not judged: measured alone, an end had its CPU 20% of the time "
        "at best (the host's other work held it)",
    )
    half = judge(findings(links=ring({**slow, ("algo-3", "algo-1"): 7.0}), busy_links=busy), OPTIONS)
    assert named(findings(links=ring({**slow, ("algo-3", "algo-1"): 7.0}))) != []  # without: algo-3
    assert half.named == ()  # one judged slow link is a path, not a host
    assert any(n.startswith("slow link algo-3->algo-1 7 MB/s, median") for n in half.notes)


def test_the_threshold_is_the_option() -> None:
    f = findings(links=ring({("algo-1", "algo-2"): 400.0, ("algo-3", "algo-2"): 400.0}))
    assert [h for h, _ in named(f, PreflightOptions(min_ratio=0.5))] == ["algo-2"]
    assert named(f, PreflightOptions(min_ratio=0.3)) == []


def test_clock_offset_and_a_silent_host() -> None:
    clock = {h: {"rtt_ms": 0.05, "offset_s": 9.0 if h == "algo-2" else 0.0} for h in HOSTS[1:]}
    assert named(findings(clock=clock)) == [("algo-2", "clock +9s from the leader's; at most 5s")]
    f = findings(
        facts={h: facts(h) for h in HOSTS if h != "algo-4"},
        silent={"algo-4": "stopped answering during the pre-flight: no word for 10s"},
    )
    assert named(f) == [("algo-4", "stopped answering during the pre-flight: no word for 10s")]


def test_unfinished_hosts_are_named_only_when_nothing_else_explains_it() -> None:
    late = {h: "the pre-flight did not finish within 60s" for h in HOSTS}
    assert [h for h, _ in named(findings(unfinished=late))] == list(HOSTS)
    slow = ring({("algo-2", "algo-3"): 1.0, ("algo-4", "algo-3"): 1.0})
    assert [h for h, _ in named(findings(unfinished=late, links=slow))] == ["algo-3"]


def test_gpu_bus_bandwidth_below_the_instance_types_figure() -> None:
    gpu = {h: {"devices": 8, "busbw_gbps": 40.0 if h == "algo-4" else 228.0} for h in HOSTS}
    assert named(findings(gpu=gpu)) == [
        ("algo-4", "GPU all_reduce bus bandwidth 40 GB/s; ml.p4d.24xlarge reaches ~230")
    ]


def test_the_summary_object_has_named_and_the_per_host_figures() -> None:
    verdict = judge(
        findings(facts={h: facts(h, shm_free_mb=1.0 if h == "algo-2" else 9e4) for h in HOSTS}), OPTIONS
    )
    data = verdict.to_json()
    need = "this job needs 544 MB (8 rank(s) x 4 MB for Open MPI, 8 GPU(s) x 64 MB for NCCL)"
    reason = f"/dev/shm has 1 MB free; {need}: {SHM_FIX}"
    assert data["named"] == [{"host": "algo-2", "reason": reason}]
    assert sorted(data["hosts"]) == sorted(HOSTS)
    assert data["hosts"]["algo-2"]["shm_free_mb"] == 1.0
    assert data["hosts"]["algo-3"]["link_in_mb_s"] == 1000.0
    assert verdict.named == (Named("algo-2", reason),)


def test_nvidia_smi_query_and_proc_files() -> None:
    csv = "0, NVIDIA A100-SXM4-40GB, 0, No, No, Enabled\n1, NVIDIA A100-SXM4-40GB, 2, [N/A], Yes, Disabled\n"
    assert parse_gpu_query(csv) == (
        GpuHealth(0, "NVIDIA A100-SXM4-40GB", 0, False, False, True),
        GpuHealth(1, "NVIDIA A100-SXM4-40GB", 2, None, True, False),
    )
    version = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
    assert driver_version(version) == "550.54.15"
    assert driver_version("") is None
    assert memory_gb("MemTotal:       24576000 kB\nMemFree: 1 kB\n") == round(24576000 * 1024 / 1e9, 1)


def test_rounds_cover_every_pair_on_small_clusters_and_the_ring_above() -> None:
    for n in (2, 3, 4, 8):
        pairs = {
            frozenset((r, p)) for d in network.offsets(n) for r in range(n) for p in network.partners(r, n, d)
        }
        assert pairs == {frozenset((a, b)) for a in range(n) for b in range(a + 1, n)}
    ring16 = {(r, p) for d in network.offsets(16) for r in range(16) for p in network.partners(r, 16, d)}
    assert ring16 == {(r, (r + 1) % 16) for r in range(16)} | {(r, (r - 1) % 16) for r in range(16)}
    assert network.sized(None) == network.CALIBRATION_BYTES
    assert network.sized(1.0) == network.MIN_BYTES
    assert network.sized(1e9) == network.MAX_BYTES


def test_a_link_measured_alone_is_put_on_the_rounds_scale_but_never_lifted() -> None:
    # Alone a link has the CPUs to itself: the median link ran 600 alone against 300 in the rounds.
    assert network.on_rounds_scale(100.0, med=300.0, reference_alone=600.0) == 50.0
    # A reference descheduled while alone (5 MB/s against a median of 230) would have lifted a 2.4 MB/s link
    # 46 times, over the threshold: the scale is at most 1.
    assert network.on_rounds_scale(2.4, med=230.0, reference_alone=5.0) == 2.4
    assert network.on_rounds_scale(2.4, med=230.0, reference_alone=None) == 0.0


def test_a_link_is_measured_alone_again_while_it_is_still_slow_on_the_best_references_scale() -> None:
    # Median 50 in the rounds; the reference ran 1000 alone: a link needs 500 alone (25 on the rounds' scale).
    ref, healthy, spoiled, slow, unmeasured = (5, 6), (1, 2), (3, 4), (7, 8), (9, 10)
    alone = {ref: 1000.0, healthy: 900.0, spoiled: 40.0, slow: 2.4}
    links = [healthy, spoiled, slow, unmeasured]
    assert network.still_slow(links, alone, med=50.0, ratio=0.5, reference=ref) == [spoiled, slow, unmeasured]
    # A better reference in a later try makes the scale stricter: a link cleared before is slow again.
    alone[ref] = 2000.0
    assert network.still_slow(links, alone, 50.0, 0.5, ref) == [healthy, spoiled, slow, unmeasured]


def test_a_late_round_trip_is_far_above_the_median_in_ratio_and_in_time() -> None:
    assert yardstick.late_trip(1.223, 0.018, 0.5)
    assert not yardstick.late_trip(0.9, 0.018, 0.5)  # 50 times the median, but within the 1 ms floor
    assert not yardstick.late_trip(1.5, 1.0, 0.5)  # 0.5 ms over, within the ratio
    assert not yardstick.late_trip(5.0, None, 0.5)


def test_probe_lines_tagged_by_mpirun_or_alone() -> None:
    line = f'[1,3]<stdout>:{PREFLIGHT_MARK}{{"facts":{{"cpus":2}},"t":0.4}}'.encode()
    assert parse_line(line) == (3, {"facts": {"cpus": 2}, "t": 0.4})
    assert parse_line(f'{PREFLIGHT_MARK}{{"done":true}}'.encode()) == (0, {"done": True})
    assert parse_line(b"[1,0]<stdout>:anything else") is None
    assert parse_line(f"{PREFLIGHT_MARK}not json".encode()) is None


def test_a_rank_that_falls_silent_while_another_speaks_is_found() -> None:
    now = [0.0]
    collected = Collected(("algo-1", "algo-2"), clock=lambda: now[0])
    beat = PREFLIGHT_MARK + '{"beat":true,"t":0.5}'
    collected.feed(f"[1,0]<stdout>:{beat}\n[1,1]<stdout>:{beat}\n".encode())
    now[0] = 6.0
    collected.feed(f"[1,0]<stdout>:{beat}\n".encode())
    assert collected.silent(10.0) == []
    now[0] = 11.0
    collected.feed(f"[1,0]<stdout>:{beat}\n".encode())
    assert collected.silent(10.0) == [1]


# What one host's probe said (algo-3's; the others are healthy), and the one reason it is named for.
OTHER = "runs another version of the launcher: "
NO_PLUGIN = "libnccl-net.so: cannot open shared object file: No such file or directory"
SOCKETS = dataclasses.asdict(nccl_net.NcclNet(None, None, NO_PLUGIN, provider=True, efa_devices=4))
OFI = dataclasses.asdict(
    nccl_net.NcclNet("/opt/amazon/ofi-nccl/lib/libnccl-net.so", "1.21.1", None, provider=True, efa_devices=4)
)
PROBE_OUTPUTS: dict[str, tuple[dict[str, Any], str]] = {
    "a fact missing": (
        {"facts": {k: v for k, v in facts("algo-3").items() if k != "efa_devices"}},
        OTHER + "its facts lack efa_devices",
    ),
    "a fact unknown here": ({"facts": facts("algo-3", numa=2)}, OTHER + "its facts have numa, unknown here"),
    "a fact of another type": (
        {"facts": facts("algo-3", cpus="96")},
        OTHER + "its facts have cpus='96', of another type",
    ),
    "another stamp": (
        {"facts": facts("algo-3", stamp=1)},
        OTHER + f"its facts are version 1, this launcher's {FACTS_VERSION}",
    ),
    "facts not an object": ({"facts": [96, 8]}, OTHER + "its facts are a list, not an object"),
    "a GPU's health mistyped": (
        {"facts": facts("algo-3", gpu_health=[{"index": "0"}])},
        OTHER + "its facts have gpu_health=[{'index': '0'}], of another type",
    ),
    "links not numbers": ({"links": {"algo-1": "fast"}}, OTHER + "its links are not numbers by host"),
    "busy links not numbers": ({"busy_links": ["algo-1"]}, OTHER + "its busy_links are not numbers by host"),
    "a GPU finding mistyped": (
        {"gpu": {"busbw_gbps": "228"}},
        OTHER + "its GPU finding is not this launcher's",
    ),
    "an NCCL-network finding short": (
        {"nccl_net": {"plugin": None}},
        OTHER + "its NCCL network finding is not this launcher's",
    ),
    "nvidia-smi printed bytes that are not UTF-8": (
        {"facts": facts("algo-3", tools={"nvidia-smi": "printed bytes that are not UTF-8"})},
        "nvidia-smi printed bytes that are not UTF-8",
    ),
    "NCCL across the hosts failed on one host": (
        {"gpu_cluster": {"error": "ncclCommInitRank: remote process exited or there was a network error"}},
        "NCCL all_reduce across the hosts failed here: ncclCommInitRank: remote process exited or there "
        "was a network error",
    ),
    "NCCL falls back to sockets on an EFA instance": (
        {"nccl_net": SOCKETS},
        f"NCCL on algo-3 falls back to sockets: no NCCL network plugin loads ({NO_PLUGIN})",
    ),
}


def said(rank: int, finding: dict[str, Any]) -> bytes:
    return f"[1,{rank}]<stdout>:{PREFLIGHT_MARK}{json.dumps(finding)}\n".encode()


@pytest.mark.parametrize("case", list(PROBE_OUTPUTS))
def test_a_probe_output_names_its_host_alone_and_never_raises(case: str) -> None:
    odd, reason = PROBE_OUTPUTS[case]
    collected = Collected(HOSTS)
    for rank, host in enumerate(HOSTS):
        healthy = {
            "facts": facts(host),
            "links": ring()[host],
            "nccl_net": OFI,
            "gpu": {"busbw_gbps": 228.0},
            "gpu_cluster": {"busbw_gbps": 40.0, "ranks": 32},
        }
        for key, value in (healthy | (odd if host == "algo-3" else {})).items():
            collected.feed(said(rank, {key: value, "t": 0.1}))
        collected.feed(said(rank, {"done": True}))
    groups = dict.fromkeys(HOSTS, ("train", "ml.p4d.24xlarge"))
    found = findings_of(collected, 1.0, 60.0, 10.0, groups, ranks_per_host=8)
    verdict = judge(found, OPTIONS)
    assert [(n.host, n.reason[: len(reason)]) for n in verdict.named] == [("algo-3", reason)]
    assert "algo-3" in table(verdict)


def test_the_nccl_network_column_says_what_each_host_will_use() -> None:
    nets = {h: nccl_net.from_fact(OFI if h != "algo-2" else SOCKETS) for h in HOSTS}
    verdict = judge(findings(nccl_net=nets), OPTIONS)
    assert "NCCL network" in table(verdict).splitlines()[0]
    assert verdict.to_json()["hosts"]["algo-1"]["nccl_net"] == "OFI (aws-ofi-nccl 1.21.1, 4 EFA)"
    assert [n.host for n in verdict.named] == ["algo-2"]
    no_efa_type = dict.fromkeys(HOSTS, ("train", "ml.g5.12xlarge"))
    assert (
        named(findings(nccl_net=nets, groups=no_efa_type, facts={h: facts(h, gpus=4) for h in HOSTS})) == []
    )


@pytest.mark.parametrize(
    ("ranks", "gpus", "shm", "option", "named_for"),
    [
        (2, 0, 62.5, None, None),  # a CPU job in a container with the default /dev/shm: enough
        (
            8,
            8,
            64.0,
            None,
            "this job needs 544 MB (8 rank(s) x 4 MB for Open MPI, 8 GPU(s) x 64 MB for NCCL)",
        ),
        (1, 8, 64.0, None, None),  # one rank a host: one GPU in use, no peer on its host
        (2, 0, 1.0, None, "this job needs 8 MB (2 rank(s) x 4 MB for Open MPI)"),
        (8, 8, 64.0, 32.0, None),  # the option lowers the threshold
        (2, 0, 62.5, 512.0, "this job needs 512 MB (launcher_preflight_min_shm_mb)"),
    ],
)
def test_dev_shm_is_judged_by_what_the_job_uses(
    ranks: int, gpus: int, shm: float, option: float | None, named_for: str | None
) -> None:
    reason = shm_reason(shm, ranks, gpus, option)
    assert (reason is None) == (named_for is None)
    if named_for is not None:
        assert reason == f"/dev/shm has {shm:g} MB free; {named_for}: {SHM_FIX}"
        assert "--shm-size=1g" in reason and "launcher_preflight_min_shm_mb" in reason


def fake_tool(tmp_path: Path, script: str) -> str:
    tool = tmp_path / "nvidia-smi"
    tool.write_text(f"#!/bin/sh\n{script}\n")
    tool.chmod(0o755)
    return str(tool)


@pytest.mark.parametrize(
    ("script", "says"),
    [
        (r"printf '0, NVIDIA A100, 0, No, No, Enabled\n\377\376\n'", "printed bytes that are not UTF-8"),
        ("echo 'No devices were found'", "printed no GPU's row: 'No devices were found'"),
        ("echo 'NVIDIA-SMI has failed' >&2; exit 9", "exited 9: NVIDIA-SMI has failed"),
        ("exec sleep 30", "did not finish within 0.3s"),
    ],
)
@pytest.mark.integration
def test_nvidia_smi_that_misbehaves_is_a_finding_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str, says: str
) -> None:
    monkeypatch.setattr(facts_module, "NVIDIA_SMI_TIMEOUT", 0.3)
    assert facts_module.gpu_health(fake_tool(tmp_path, script)) == ((), says)
    good = fake_tool(tmp_path, "echo '0, NVIDIA A100, 0, No, [N/A], Enabled'")
    assert facts_module.gpu_health(good) == ((GpuHealth(0, "NVIDIA A100", 0, False, None, True),), None)


RULE = "-" * 74
LOST_DAEMON = f"""{RULE}
ORTE has lost communication with a remote daemon.

  HNP daemon   : [[33333,0],0] on node algo-1
  Remote daemon: [[33333,0],3] on node algo-4

This is usually due to either a failure of the TCP network
connection to the node, or possibly an internal failure of
the daemon itself. We cannot recover from this failure, and
therefore will terminate the job.
{RULE}"""
NOTICED = "mpirun noticed that process rank 2 with PID 0 on node algo-3 exited on signal 9 (Killed)."
RANK_KILLED = f"{RULE}\n{NOTICED}\n{RULE}"
PROCESS_EXITED = f"""{RULE}
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[52345,1],1]
  Exit code:    1
{RULE}"""


@pytest.mark.parametrize(
    ("said", "blamed"),
    [
        (LOST_DAEMON, "algo-4"),  # not mpirun's own daemon's host, the leader
        # seen in the simulated cluster under load: mpirun's own warning, signed with its host, came first
        (f"[algo-1:00368] plm:rsh: Warning: setpgid(372,372) failed in parent\n{LOST_DAEMON}", "algo-4"),
        (RANK_KILLED, "algo-3"),
        (PROCESS_EXITED, "algo-2"),  # by its rank
        ("mpirun: something without a host\n", None),
    ],
)
def test_the_host_mpiruns_own_message_names(said: str, blamed: str | None) -> None:
    """mpirun's own lines (untagged) name the host; a rank's lines are never read here (collected.py)."""
    lines = [line.encode() for line in said.splitlines()]
    assert blamed_host(lines, HOSTS) == blamed
    words = [w for line in said.splitlines() if line != RULE for w in line.split()]
    assert mpirun_message(lines) == " ".join(words)  # whole, its borders left out


def failed_job(said: str, heard: dict[int, dict[str, Any]]) -> Findings:
    """The probes' MPI job exited 1 after mpirun said `said` and each rank of `heard` said its findings."""
    collected = Collected(HOSTS)
    for rank, finding in heard.items():
        collected.feed(f"[1,{rank}]<stdout>:{PREFLIGHT_MARK}{json.dumps(finding)}\n".encode())
    collected.feed(said.encode() + b"\n")
    collected.exit_code = 1
    return findings_of(collected, 2.0, 60.0, 10.0, dict.fromkeys(HOSTS, ("", None)))


def test_a_failed_probe_job_names_only_the_host_the_evidence_points_at() -> None:
    everyone = {r: {"facts": facts(h)} for r, h in enumerate(HOSTS)}
    lost = judge(failed_job(LOST_DAEMON, everyone), OPTIONS)
    assert [n.host for n in lost.named] == ["algo-4"]
    assert lost.named[0].reason.startswith(
        "the pre-flight's MPI job failed there: ORTE has lost communication"
    )
    assert "HNP daemon : [[33333,0],0] on node algo-1" in lost.named[0].reason  # whole, not cut at a rule
    assert any(note.startswith("mpirun said: ORTE has lost") for note in lost.notes)
    errored = {**everyone, 2: {"error": "OSError: no space left"}}
    assert [n.host for n in judge(failed_job("mpirun exited", errored), OPTIONS).named] == ["algo-3"]
    silent_one = {r: f for r, f in everyone.items() if r != 1}
    named_silent = judge(failed_job("mpirun exited", silent_one), OPTIONS).named
    assert [(n.host, n.reason.split(";")[0]) for n in named_silent] == [
        ("algo-2", "did not answer: no word from its probe in 2.0s")
    ]


def test_a_probe_error_while_mpirun_hangs_to_the_bound_names_its_host_alone() -> None:
    """Seen in CI: algo-3's MPI_Init failed (its /tmp full), mpirun did not exit, the other probes waited in
    MPI_Init for it, and at the bound nobody had been heard from. The error line is evidence about algo-3;
    the others, the leader first, are not named for waiting on it."""
    collected = Collected(HOSTS)
    collected.feed(b"[1,2]<stderr>:[algo-3:00304] PMIX ERROR: ERROR in file gds_ds12_lock_pthread.c\n")
    collected.feed(b"It looks like orte_init failed for some reason\n")  # mpirun still runs: no exit code
    verdict = judge(findings_of(collected, 30.0, 30.0, 10.0, dict.fromkeys(HOSTS, ("", None))), OPTIONS)
    assert [n.host for n in verdict.named] == ["algo-3"]
    assert verdict.named[0].reason == (
        "Open MPI failed in its probe: [algo-3:00304] PMIX ERROR: ERROR in file gds_ds12_lock_pthread.c; "
        "mpirun: It looks like orte_init failed for some reason"
    )
    hung = Collected(HOSTS)  # no evidence at all: every host silent is named, as before
    assert [n.host for n in judge(findings_of(hung, 30.0, 30.0, 10.0, {}), OPTIONS).named] == list(HOSTS)


def collected_after(said: str, done: range) -> Collected:
    collected = Collected(HOSTS)
    for rank in done:
        collected.feed(f"[1,{rank}]<stdout>:{PREFLIGHT_MARK}{json.dumps({'done': True})}\n".encode())
    collected.feed(said.encode() + b"\n")
    collected.exit_code = 1
    return collected


def test_only_a_lost_daemon_before_every_probe_is_done_makes_the_check_run_again() -> None:
    """mpirun losing a daemon may be a connection that dropped once (check.py runs the probes again and
    judges that attempt); a rank's failure is evidence about its host, and a check every probe finished is
    judged as it stands."""
    again = lost_daemon(collected_after(LOST_DAEMON, range(2)))
    assert again is not None and again.startswith("ORTE has lost communication with a remote daemon")
    assert "on node algo-4" in again
    assert lost_daemon(collected_after(RANK_KILLED, range(2))) is None
    assert lost_daemon(collected_after(PROCESS_EXITED, range(0))) is None
    assert lost_daemon(collected_after(LOST_DAEMON, range(len(HOSTS)))) is None
    healthy = Findings(hosts=HOSTS, facts=read_findings({h: {"facts": facts(h)} for h in HOSTS}).facts)
    ran_twice = dataclasses.replace(healthy, first_attempt=again)
    assert judge(ran_twice, OPTIONS).ok
    assert [n for n in judge(ran_twice, OPTIONS).notes if n.startswith("the check ran twice")] == [
        f"the check ran twice; its first attempt ended with: {again}"
    ]


def mesh(groups: dict[str, str], rate: dict[frozenset[str], float], slow: str | None = None) -> Findings:
    """Every link between `groups`' hosts at the rate of its pair of groups; those of `slow` at 1/10."""
    links = {
        dst: {
            src: rate[frozenset((groups[src], groups[dst]))] / (10 if slow in (src, dst) else 1)
            for src in groups
            if src != dst
        }
        for dst in groups
    }
    return Findings(
        hosts=tuple(groups),
        facts=read_findings({h: {"facts": facts(h)} for h in groups}).facts,
        links=links,
        groups={h: (g, None) for h, g in groups.items()},
    )


def test_links_are_compared_like_with_like_within_and_between_instance_groups() -> None:
    """3 hosts of a large type and 1 of a smaller one, by design: nobody named (one global median named the
    small one); a slow host within a group is still named."""
    rates = {frozenset(("big",)): 1000.0, frozenset(("big", "small")): 100.0, frozenset(("small",)): 100.0}
    designed = {"algo-1": "big", "algo-2": "big", "algo-3": "big", "algo-4": "small"}
    assert named(mesh(designed, rates)) == []
    six = {f"algo-{i}": "big" for i in range(1, 6)} | {"algo-6": "small"}
    slow = [host for host, _ in named(mesh(six, rates, slow="algo-3"))]
    assert slow == ["algo-3"]
    gpu = {h: {"busbw_gbps": 50.0 if h == "algo-4" else 200.0} for h in HOSTS}
    by_design = {h: ("small" if h == "algo-4" else "big", None) for h in HOSTS}
    assert named(findings(gpu=gpu, groups=by_design)) == []  # its group has no other host to compare with
    one_group = dict.fromkeys(HOSTS, ("big", None))
    assert named(findings(gpu=gpu, groups=one_group)) == [
        ("algo-4", "GPU all_reduce bus bandwidth 50 GB/s; median of its group 200 GB/s")
    ]


@pytest.mark.integration
def test_a_stop_ends_the_probes_at_once_and_nothing_is_left() -> None:
    before = set(descendants())  # the session's own servers (a registry, an S3 server) when the suite runs
    with SignalWatch() as watch:
        threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
        started = time.monotonic()
        with pytest.raises(Stopped):
            run_probes(["sleep", "30"], os.environ, HOSTS[:1], 20.0, signals=watch)
    assert time.monotonic() - started < 5
    assert set(descendants()) - before == set()


# Issue 51 item 3: blame came from words. A healthy GPU probe under NCCL_DEBUG=INFO prints this line, which
# matched `error|fail|abort`: once a host was really silent the healthy host was named and the silent one not,
# and NCCL's flood pushed mpirun's own message out of its 200-line buffer.
NCCL_INFO = (
    "[1,1]<stdout>:algo-2:123:123 [0] NCCL INFO NET/Plugin: Failed to find ncclCollNetPlugin_v8 symbol."
)


def test_a_probes_words_name_nobody_and_the_silent_host_is_named() -> None:
    now = [0.0]
    collected = Collected(HOSTS, clock=lambda: now[0])
    for second in range(12):
        now[0] = float(second)
        for rank in (0, 1, 3):  # algo-3 (rank 2) never says a word
            collected.feed(said(rank, {"beat": True}))
        collected.feed(f"{NCCL_INFO}\n".encode())
    verdict = judge(findings_of(collected, 12.0, 60.0, 10.0, dict.fromkeys(HOSTS, ("", None))), OPTIONS)
    assert [(n.host, n.reason) for n in verdict.named] == [
        ("algo-3", "did not answer: no word from its probe in 12.0s")
    ]
    assert any(NCCL_INFO.split(":", 1)[1] in note for note in verdict.notes)  # shown, not matched
    assert blamed_host([NCCL_INFO.encode()], HOSTS) is None


def test_a_rank_can_incriminate_only_its_own_host_in_open_mpis_form() -> None:
    collected = Collected(HOSTS)
    collected.feed(b"[1,1]<stderr>:[algo-3:00304] PMIX ERROR: forged by algo-2 about algo-3\n")
    collected.feed(b"[1,0]<stderr>:ERROR: the word alone\n")
    assert collected.open_mpi_errors == {}
    collected.feed(b"[1,2]<stderr>:[algo-3:00304] [[5,1],2] ORTE_ERROR_LOG: Out of resource in file x.c\n")
    assert list(collected.open_mpi_errors) == [2]
    collected.feed(said(2, {"done": True}))  # it finished: what Open MPI logged there names nobody
    assert judge(findings_of(collected, 5.0, 60.0, 10.0, {}), OPTIONS).named == tuple(
        Named(h, "did not answer: no word from its probe in 5.0s") for h in ("algo-1", "algo-2", "algo-4")
    )


def test_mpiruns_own_message_is_kept_whole_whatever_the_ranks_print() -> None:
    collected = collected_after(LOST_DAEMON, range(2))
    collected.feed(f"{NCCL_INFO}\n".encode() * 5000)  # NCCL_DEBUG=INFO on every probe
    assert (lost_daemon(collected) or "").startswith("ORTE has lost communication with a remote daemon")
    assert blamed_host(collected.own, HOSTS) == "algo-4"


# Issue 51 item 5: like with like. A GPU leader beside three CPU hosts was named for its driver ("driver
# 550.x; the other hosts have none": every host 75 under fail); two GPU groups with different drivers named
# each other; two hosts of one type whose MemTotal straddles x.5 GB named each other.
def with_version(host: str, **versions: str) -> dict[str, Any]:
    return facts(host, versions={**facts(host)["versions"], **versions})


def test_the_driver_is_compared_only_among_hosts_that_have_one_and_versions_within_groups() -> None:
    gpu_leader = {h: with_version(h, driver="550.54.15") if h == "algo-1" else facts(h) for h in HOSTS}
    assert named(findings(facts=gpu_leader)) == []
    drivers = {"algo-1": "550.54.15", "algo-2": "550.54.15", "algo-3": "535.161.08", "algo-4": "535.161.08"}
    groups = {h: ("gpu-a" if h in HOSTS[:2] else "gpu-b", "ml.p4d.24xlarge") for h in HOSTS}
    two_groups = {h: with_version(h, driver=drivers[h]) for h in HOSTS}
    assert named(findings(facts=two_groups, groups=groups)) == []
    one_off = {h: with_version(h, driver="535.161.08" if h == "algo-4" else "550.54.15") for h in HOSTS}
    assert named(findings(facts=one_off)) == [
        ("algo-4", "driver 535.161.08; the other hosts of train have 550.54.15")
    ]


def test_memory_is_compared_with_a_tolerance() -> None:
    straddling = {h: facts(h, memory_gb=1160.4 if h in HOSTS[:2] else 1160.6) for h in HOSTS}
    assert named(findings(facts=straddling)) == []
    lost_dimm = {h: facts(h, memory_gb=1015.0 if h == "algo-3" else 1160.5) for h in HOSTS}
    assert named(findings(facts=lost_dimm)) == [
        ("algo-3", "1015 GB of memory; the other hosts of train have 1160.5")
    ]


# Issue 51 item 6: round trips were timed with time.time(); a step of the wall clock during a ping (NTP, a
# VM's resume) made a trip negative (the best, so the one kept) or seconds long. The clock cannot be stepped
# on a shared machine, so time.time is replaced here, and MPI by a pair of queues; the monotonic clock is not.
class _Echo:
    """One peer that answers each ping at once with its wall clock (the other end of network._pings)."""

    def __init__(self, wall: list[float]) -> None:
        self.wall, self.inbox = wall, [None]

    def send(self, value: object, dest: int, tag: int) -> None:
        self.wall[0] -= 1.0  # the leader's wall clock steps back a second while each ping is out
        self.inbox.append(self.wall[0])

    def recv(self, source: int, tag: int) -> object:
        return self.inbox.pop(0)


def test_round_trips_are_timed_on_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    wall = [1.7e9]
    monkeypatch.setattr(network.time, "time", lambda: wall[0])
    trip_ms, _ = network._pings(_Echo(wall), 1, 3)
    assert 0 <= trip_ms < 100
