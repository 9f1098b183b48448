import os

from smhvd.mpi.output import StderrFilter, parse_mpirun_verdict
from smhvd.report.failure import MARKER, RankFailure, compose, write_failure


def test_headlines():
    assert RankFailure(rank=1, host="algo-2", exit_code=3).headline() == "rank 1 on algo-2 exited with code 3"
    assert RankFailure(rank=0, host=None, signal=9).headline() == "rank 0 was killed by signal 9 (SIGKILL)"


def test_marker_round_trip_keeps_everything():
    failure = RankFailure(
        rank=3, host="algo-4", exit_code=2, stderr_tail='Traceback\n  "quoted"\nValueError: x'
    )
    line = failure.to_marker()
    assert line.startswith(MARKER) and line.endswith("\n") and line.count("\n") == 1
    assert RankFailure.from_marker(line.rstrip("\n")) == failure
    assert RankFailure.from_marker(MARKER + "{not json") is None


def test_compose_keeps_headline_and_the_end_of_stderr_within_the_limit():
    detail = "".join(f"line {i}\n" for i in range(500)) + "ValueError: the real cause"
    text = compose("rank 1 on algo-2 exited with code 1", detail)
    assert len(text) <= 1024
    assert text.startswith("rank 1 on algo-2 exited with code 1\nline ")
    assert text.endswith("ValueError: the real cause")
    assert compose("headline only") == "headline only"


def test_failure_file_first_writer_wins(tmp_path):
    path = tmp_path / "output" / "failure"
    assert write_failure(path, "first")
    assert not write_failure(path, "second")
    assert path.read_text() == "first"


def test_filter_removes_markers_split_across_chunks_and_passes_the_rest_at_once():
    marker = RankFailure(rank=1, host="algo-2", exit_code=3, stderr_tail="boom").to_marker().encode()
    f = StderrFilter()
    shown = f.feed(b"epoch 1 loss 0.5\nprogress 10%\r")
    assert shown == b"epoch 1 loss 0.5\nprogress 10%\r"
    shown += f.feed(b"\n" + marker[:10])
    shown += f.feed(marker[10:] + b"after\n")
    shown += f.flush()
    assert shown == b"epoch 1 loss 0.5\nprogress 10%\r\nafter\n"
    assert f.failures == [RankFailure(rank=1, host="algo-2", exit_code=3, stderr_tail="boom")]


def test_a_marker_in_the_middle_of_a_line_is_not_taken():
    f = StderrFilter()
    text = b"user text " + RankFailure(rank=0, host=None, exit_code=1).to_marker().encode()
    assert f.feed(text) == text
    assert f.failures == []


MPIRUN_EXIT = """--------------------------------------------------------------------------
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[21142,1],1]
  Exit code:    3
--------------------------------------------------------------------------
"""
MPIRUN_SIGNAL = "mpirun noticed that process rank 1 with PID 0 on node algo-2 exited on signal 9 (Killed).\n"


def test_mpirun_verdicts():
    assert parse_mpirun_verdict(MPIRUN_EXIT) == RankFailure(rank=1, host=None, exit_code=3)
    assert parse_mpirun_verdict(MPIRUN_SIGNAL) == RankFailure(rank=1, host="algo-2", signal=9)
    assert parse_mpirun_verdict("ORTE was unable to reliably start one or more daemons.") is None


def test_tail_is_bounded():
    f = StderrFilter(keep_bytes=100)
    for _ in range(50):
        f.feed(os.urandom(10).hex().encode() + b"\n")
    assert len(f.tail_text()) <= 100
