"""In-flight's parts that run in a rank and its wrapper: the recorder's lines through a real pipe (never
blocking the script), the wrapper's check of them, the samples read from /proc and cgroup files, why a host
is late; and the leader's watch fed as mpirun delivers the reports: its lines, the summary and the metric."""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

import pytest

from smhvd import wire
from smhvd.inflight import explain, record, signals
from smhvd.inflight.explain import Sample
from smhvd.inflight.forward import Forward, parse_steps
from smhvd.inflight.monitor import METRIC_LINE, METRIC_REGEX, Monitor, report_of
from smhvd.runscript import run as runscript


def test_the_runscript_names_the_variable_the_wire_does() -> None:
    assert runscript.INFLIGHT_FD == wire.INFLIGHT_FD


def test_steps_go_through_a_pipe_as_lines_the_wrapper_takes_and_a_full_pipe_never_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(record, "HELD_MAX", 500)
    read_fd, write_fd = os.pipe()
    try:
        recorder = record.start(write_fd)
        assert recorder is not None and record.current() is recorder
        recorder.flushed_at = -1e9  # the first step writes at once
        recorder.step(ready=10.5, done=10.75)
        line = os.read(read_fd, 65536)
        assert parse_steps(line.rstrip(b"\n")) == [[0, 10.5, 10.75]]
        for _ in range(5_000):  # nobody reads: the pipe fills, the steps are held, then the oldest dropped
            recorder.flushed_at = -1e9
            recorder.step()
        assert recorder.seq == 5_001
        assert len(recorder.held) <= record.HELD_MAX
        assert recorder.dropped > 0
    finally:
        os.close(read_fd)
        os.close(write_fd)
        record._current.clear()


def test_a_recorder_whose_reader_is_gone_stops_recording_and_step_stays_harmless() -> None:
    from smhvd import inflight

    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        recorder = record.start(write_fd)
        assert recorder is not None
        recorder.flushed_at = -1e9
        recorder.step()  # EPIPE: not raised into the script
        assert record.current() is None
        inflight.step()  # a no-op now
    finally:
        os.close(write_fd)
        record._current.clear()
    inflight.step()  # outside `train`: a no-op


def test_every_line_is_under_the_atomic_write_size() -> None:
    steps = [record.step_text(i, 1e9 + i, 1e9 + i + 0.5) for i in range(1000)]
    lines = record.pack(steps)
    assert all(len(line) <= record.LINE_MAX for line, _ in lines)
    assert sum(count for _, count in lines) == 1000
    assert [s for line, _ in lines for s in json.loads(line)] == [json.loads(s) for s in steps]


@pytest.mark.parametrize(
    "line",
    [b"", b"[]", b"{}", b"[[1,2]]", b'[["1",2,3]]', b"[[-1,2,3]]", b"[[1,2,true]]", b"[[1,NaN,2]]", b"\xff"],
)
def test_what_is_not_a_recorder_line_is_dropped(line: bytes) -> None:
    assert parse_steps(line) is None


def test_the_wrapper_passes_steps_on_with_its_rank_and_host() -> None:
    sent: list[tuple[int, bytes]] = []
    forward = Forward(lambda kind, data: sent.append((kind, data)), 3, "algo-2", 1, os.getpid())
    forward.feed(b"[[0,1.5,2.0]]\n[[1,2.5,nonsense\n[[2,3.5,")
    forward.feed(b"null]]\n")
    assert [kind for kind, _ in sent] == [wire.INFLIGHT, wire.INFLIGHT]
    assert [json.loads(data) for _, data in sent] == [
        {"rank": 3, "host": "algo-2", "steps": [[0, 1.5, 2.0]]},
        {"rank": 3, "host": "algo-2", "steps": [[2, 3.5, None]]},
    ]


def test_cgroup_v1_and_v2_places_and_their_throttling_are_read() -> None:
    v1 = "12:pids:/x\n4:cpu,cpuacct:/smhvd-throttle-a\n0::/"
    assert signals.cpu_stat_paths(v1)[0] == Path("/sys/fs/cgroup/cpu,cpuacct/smhvd-throttle-a/cpu.stat")
    assert signals.cpu_stat_paths("0::/job\n") == [
        Path("/sys/fs/cgroup/job/cpu.stat"),
        Path("/sys/fs/cgroup/unified/job/cpu.stat"),
    ]
    before = signals.parse_cpu_stat("nr_periods 100\nnr_throttled 10\nthrottled_time 5\n")
    after = signals.parse_cpu_stat("usage_usec 9\nnr_periods 200\nnr_throttled 82\nthrottled_usec 7\n")
    assert signals.share(before, after, 0.0) == pytest.approx(0.72)
    assert signals.parse_cpu_stat("nr_periods x\n") is None


def test_proc_stat_steal_and_pressure_are_read() -> None:
    assert signals.parse_proc_stat("cpu  10 0 10 70 0 0 0 10 0 0\ncpu0 1 2\n") == (100, 10)
    text = "some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\nfull avg10=0 avg60=0 avg300=0 total=5\n"
    assert signals.parse_pressure(text) == 123456
    assert signals.share(100, 50, 1.0) is None  # a counter that went back
    stat = "1234 (a) b) S " + " ".join(["0"] * 10) + " 150 50 " + " ".join(["0"] * 26) + " 42 0"
    assert signals.parse_pid_stat(stat) == (200, 42)


def test_tcp_retransmits_are_read() -> None:
    snmp = "Ip: Forwarding\nIp: 1\nTcp: RtoAlgorithm OutSegs RetransSegs\nTcp: 1 1000 20\n"
    assert signals.parse_snmp(snmp) == (1000, 20)
    assert signals.share((1000, 20), (3000, 70), 0.0) == pytest.approx(0.025)
    assert signals.parse_snmp("Tcp: OutSegs\n") is None


@pytest.mark.integration
def test_a_fake_nvidia_smi_is_asked_for_the_host_s_gpu_clocks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first rank of a host runs nvidia-smi (bounded) for its GPUs' clocks; no GPU here: a fake one."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 0x0000000000000020, 88, 1100, 1980'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sampler = signals.Sampler(os.getpid(), host_wide=True)
    gpu = sampler.sample()["gpu"]
    assert gpu == [{"index": 0, "slowdown": ["SW thermal"], "temperature": 88.0, "sm_clock_ratio": 0.556}]
    assert "gpu" not in sampler.sample()  # every GPU_EVERY seconds, not every sample
    assert "gpu" not in signals.Sampler(os.getpid(), host_wide=False).sample()  # a host's first rank only


def test_a_real_process_is_sampled() -> None:
    sampler = signals.Sampler(os.getpid(), host_wide=True)
    start = os.times().user
    while os.times().user - start < 0.05:  # CPU time the kernel counts in whole ticks
        sum(i * i for i in range(10_000))
    sample = sampler.sample()
    assert sample["cpu"] is not None and sample["cpu"] > 0
    assert "steal" in sample


def test_gpu_clocks_name_only_real_slowdowns() -> None:
    rows = "0, 0x0000000000000001, 45, 210, 1980\n3, 0x0000000000000048, 91, 890, 1980\nbad row\n"
    gpus = signals.parse_gpu_clocks(rows)
    assert gpus[0]["slowdown"] == []
    assert gpus[1] == {
        "index": 3,
        "slowdown": ["HW slowdown", "HW thermal"],
        "temperature": 91.0,
        "sm_clock_ratio": 0.449,
    }


def samples_for(host_values: dict[str, dict[str, object]]) -> dict[str, list[Sample]]:
    return {host: [Sample(0.0, 0, values), Sample(5.0, 0, values)] for host, values in host_values.items()}


def test_why_a_host_is_late_is_what_stands_out_against_its_group() -> None:
    quiet = {"throttled": None, "steal": 0.0, "pressure": {"cpu": 0.02, "io": 0.0, "memory": 0.0}}
    samples = samples_for({"algo-1": quiet, "algo-2": quiet, "algo-3": {**quiet, "throttled": 0.72}})
    assert explain.explain("algo-3", samples, ["algo-1", "algo-2"]) == (
        "algo-3: CPU throttled 72% of the last 60 s (its cgroup's CPU quota)"
    )
    assert explain.explain("algo-1", samples, ["algo-2", "algo-3"]).startswith("algo-1: no cause seen there")
    # a cause every host shares explains nobody
    noisy = {**quiet, "steal": 0.4}
    shared = explain.explain("algo-1", samples_for({"algo-1": noisy, "algo-2": noisy}), ["algo-2"])
    assert shared.startswith("algo-1: no cause seen there")


def test_a_slowed_gpu_is_named_in_the_cause() -> None:
    gpu = [{"index": 3, "slowdown": ["HW thermal"], "temperature": 91.0, "sm_clock_ratio": 0.45}]
    samples = samples_for({"algo-1": {"gpu": [{"index": 0, "slowdown": []}]}, "algo-2": {"gpu": gpu}})
    assert explain.explain("algo-2", samples, ["algo-1"]) == (
        "algo-2: GPU 3 clocks slowed (HW thermal), 91 C, SM clock at 45% of its most"
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def line(host: str, rank: int, **fields: object) -> bytes:
    return json.dumps({"host": host, "rank": rank, **fields}).encode() + b"\n"


def run_job(monitor: Monitor, clock: Clock, steps: range, late: dict[str, float]) -> None:
    """Reports as mpirun delivers them: a line a rank a second, ten 0.1 s steps each, a tick a second."""
    for start in steps[::10]:
        clock.now += 1.0
        batch = b""
        for rank, host in enumerate(("algo-1", "algo-2", "algo-3")):
            wait = 0.3 - late.get(host, 0.0)
            marks = [[s, 1000 + s * 0.1 - wait, 1000 + s * 0.1] for s in range(start, start + 10)]
            batch += line(host, rank, steps=marks)
            throttled = 0.7 if late.get(host) else None
            batch += line(host, rank, local_rank=0, signals={"throttled": throttled, "steal": 0.0})
        monitor.feed(batch + b"garbage\n" + line("algo-9", True, steps=[[1, 2, 3]]))
        monitor.tick()


def test_the_watch_names_the_late_host_once_says_when_it_recovers_and_keeps_the_summary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    summary = tmp_path / "job-summary.json"
    monitor = Monitor({}, summary, clock)
    caplog.set_level(logging.INFO, logger="smhvd")
    run_job(monitor, clock, range(0, 1200), {})  # two minutes, healthy
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    run_job(monitor, clock, range(1200, 2400), {"algo-3": 0.2})
    run_job(monitor, clock, range(2400, 3600), {})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    assert re.fullmatch(
        r"in-flight: algo-3 slows every step: its ranks reach the allreduce 0\.20 s after the others "
        r"\(median of \d+ steps; steps 1\.0x the job's first minute\); "
        r"algo-3: CPU throttled 70% of the last 60 s \(its cgroup's CPU quota\)",
        warnings[0],
    )
    ended = [r.getMessage() for r in caplog.records if "no longer slows" in r.getMessage()]
    assert len(ended) == 1 and ended[0].startswith("in-flight: algo-3 no longer slows the steps")
    written = json.loads(summary.read_text())
    assert written["running"] is True
    named = written["inflight"]["named"]
    assert [e["host"] for e in named] == ["algo-3"]
    assert 120 < named[0]["since_seconds"] < 150  # named within 30 s of the slowdown at 120 s
    assert named[0]["lateness_seconds"] == pytest.approx(0.2, abs=0.01)
    assert 240 < named[0]["until_seconds"] < 270
    metrics = [r.getMessage() for r in caplog.records if re.search(METRIC_REGEX, r.getMessage())]
    assert metrics and all(m.startswith("in-flight: slowest host ") for m in metrics)
    assert METRIC_LINE.startswith("in-flight: slowest host {host} lateness_seconds=")


def test_reports_from_nowhere_are_refused() -> None:
    assert report_of(b"[1,2]") is None
    assert report_of(b'{"host": 3, "rank": 1}') is None
    assert report_of(b'{"host": "algo-1", "rank": true}') is None
    assert report_of(b'{"host": "algo-1", "rank": 0, "steps": []}') == (
        "algo-1",
        0,
        {"host": "algo-1", "rank": 0, "steps": []},
    )
