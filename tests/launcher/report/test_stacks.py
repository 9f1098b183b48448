"""Reading py-spy dumps: where each rank is, and the one-line summary of a whole job."""

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from smhvd.mpi.output import StderrFilter
from smhvd.proc.processes import reap_orphans
from smhvd.proc.waiting import wait_until
from smhvd.report import stacks
from smhvd.report.stacks import RankDump, parse_dumps, stop_failure, summary_line, where

WAITING = """Process 31799: /opt/venv/bin/python train.py
Python v3.11.2 (/usr/bin/python3.11)

Thread 31799 (idle): "MainThread"
    _allreduce (horovod/tensorflow/mpi_ops.py:130)
    allreduce (horovod/tensorflow/__init__.py:171)
    wait_for_peer (train.py:6)
    <module> (train.py:10)
Thread 31850 (idle): "Thread-1"
    wait (threading.py:320)
"""
ELSEWHERE = """Process 31798: /opt/venv/bin/python train.py

Thread 31798 (idle): "MainThread"
    busy_elsewhere (train.py:8)
    <module> (train.py:12)
"""


def test_where_is_the_innermost_horovod_frame_of_the_main_thread_else_its_innermost_frame():
    assert where(WAITING) == "_allreduce (horovod/tensorflow/mpi_ops.py:130)"
    assert where(ELSEWHERE) == "busy_elsewhere (train.py:8)"
    assert where("Error: Failed to find python version\n") == (
        "no Python frames (Error: Failed to find python version)"
    )


def test_one_line_groups_ranks_by_place():
    dumps = [
        RankDump(2, "algo-2", "_allreduce (horovod/tensorflow/mpi_ops.py:130)", "f2"),
        RankDump(0, "algo-1", "_allreduce (horovod/tensorflow/mpi_ops.py:130)", "f0"),
        RankDump(1, "algo-1", "busy_elsewhere (train.py:8)", "f1"),
    ]
    assert summary_line(dumps, "SIGUSR1") == (
        "stack dump (SIGUSR1): ranks 0,2 on algo-1,algo-2 in _allreduce (horovod/tensorflow/mpi_ops.py:130); "
        "rank 1 on algo-1 in busy_elsewhere (train.py:8)"
    )
    assert summary_line([], "SIGUSR1") == "stack dump (SIGUSR1): no rank was running"


def test_a_host_whose_dump_did_not_answer_is_named_not_taken_for_one_without_ranks():
    dump = RankDump(0, "algo-1", "busy_elsewhere (train.py:8)", "f0")
    assert summary_line([], "SIGUSR1", ["algo-1"]) == "stack dump (SIGUSR1): no answer within 90s from algo-1"
    assert summary_line([dump], "SIGUSR1", ["algo-2", "algo-3"]) == (
        "stack dump (SIGUSR1): rank 0 on algo-1 in busy_elsewhere (train.py:8); "
        "no answer within 90s from algo-2,algo-3"
    )


def test_a_stops_failure_file_says_stopped_by_what_in_which_phase_then_the_stacks():
    """Issue 52: the first line was the dump's, `stack dump (stopped by SIGTERM): ranks 0,1,2,3 ... in
    <module> (horovod/tensorflow/elastic.py:18)`, which reads like a crash in Horovod."""
    place = "<module> (horovod/tensorflow/elastic.py:18)"
    dump = summary_line(
        [RankDump(r, f"algo-{1 + r // 2}", place, f"f{r}") for r in range(4)], "stopped by SIGTERM"
    )
    assert stop_failure(dump, 4, 4).splitlines() == [
        "stopped by SIGTERM while the script ran (all 4 rank(s) had started it); where each rank was:",
        f"stack dump (stopped by SIGTERM): ranks 0,1,2,3 on algo-1,algo-2 in {place}",
    ]
    assert stop_failure(dump.replace("SIGTERM", "SIGINT"), 1, 4).splitlines()[0] == (
        "stopped by SIGINT while the job started (1 of 4 rank(s) had started the script); "
        "where each rank was:"
    )
    # no dump of the stop (it failed, or ranks run without them): the stop alone, its signal unknown
    assert stop_failure(None, 2, 2) == "stopped while the script ran (all 2 rank(s) had started it)"
    assert stop_failure("stack dump (SIGUSR1): rank 0 on algo-1 in f (t.py:1)", 0, 1).splitlines()[0] == (
        "stopped while the job started (0 of 1 rank(s) had started the script); where each rank was:"
    )


def test_dumps_travel_as_json_lines_and_noise_is_skipped():
    dump = RankDump(1, "algo-2", "busy_elsewhere (train.py:8)", "/opt/ml/output/data/stacks/algo-2-rank1.txt")
    assert parse_dumps(["Warning: Permanently added 'algo-2'", dump.to_json(), "{}"]) == [dump]


def test_horovods_stall_warning_is_noticed():
    output = StderrFilter()
    output.feed(
        b"[2026-11-23 10:00:00.000000: W horovod/common/stall_inspector.cc:107] One or more tensors were "
        b"submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for "
        b"remainder of "
        b"ranks for more than 60 seconds.\n"
    )
    assert output.stall_notice is not None and "waiting for remainder of ranks" in output.stall_notice


def test_dump_file_names_stay_within_255_bytes_for_any_valid_host_name():
    longest = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 61])  # 253 characters: a valid host name
    assert len(longest) == 253
    names = {stacks.dump_file_name(h, 7) for h in (longest, longest[:-1] + "e", "algo-2")}
    assert len(names) == 3  # cut names keep a digest of the whole: two hosts never share a file
    assert all(len(n.encode()) <= 255 and n.endswith("-rank7.txt") for n in names)
    assert stacks.dump_file_name("algo-2", None) == "algo-2-rankunknown.txt"


@pytest.mark.integration
def test_a_dump_that_cannot_be_written_says_so_instead_of_failing(tmp_path):
    """The real py-spy (the image's, and the venv's) dumps this very process, sampled while it waits for
    py-spy: where it was (a Python frame) is kept though the file cannot be."""
    blocked = tmp_path / "output"
    blocked.write_text("a file where the stacks directory would go")
    py_spy = str(Path(sys.executable).parent / "py-spy")
    dump = stacks.dump_one(stacks.RankProcess(0, os.getpid()), "algo-1", blocked, py_spy)
    assert dump.file.startswith("(not written: ")
    assert re.fullmatch(r"\S+ \(\S+\.py:\d+\)", dump.where), dump


@pytest.mark.integration  # starts processes
def test_a_failed_py_spy_is_noted_though_train_reaps_orphans_meanwhile(tmp_path, monkeypatch):
    """`train` reaps every zombie child that is not its own to wait for on each SIGCHLD (SignalWatch.receive),
    while a stack dump runs beside its loop. py-spy ran in `train`'s own threads, so the reaper took its exit
    and the file read as if it had succeeded (issue 46). Each host's dumps now run in a process of their own:
    here a py-spy that fails with 3 (and leaves a child holding its output for a second, so that the reaper
    has all the time it needs) is noted as such."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "py-spy").write_text("#!/bin/sh\n(sleep 1) &\necho 'no such process' >&2\nexit 3\n")
    (fake / "py-spy").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "out"
    rank_env = {**os.environ, "SM_CURRENT_HOST": "reaped", "SM_OUTPUT_DATA_DIR": str(out)}
    rank = subprocess.Popen(
        [sys.executable, "-m", "smhvd.rank", "--", "sleep", "60"],
        env={**rank_env, "OMPI_COMM_WORLD_RANK": "0"},
    )
    try:
        wait_until(lambda: stacks.find_ranks("reaped", out) or None, what="the rank to run", timeout=60)
        dumper = stacks.StackDumper("reaped", out, [], None)
        dumping = threading.Thread(target=dumper.dump, args=("test",))
        dumping.start()
        while dumping.is_alive():  # what `train`'s loop does on SIGCHLD, as often as it can
            reap_orphans(())
            dumping.join(0.005)
    finally:
        rank.kill()
        rank.wait()
    assert "[py-spy exited 3] no such process" in (out / "stacks" / "reaped-rank0.txt").read_text()
