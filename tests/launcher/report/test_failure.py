import os

from smhvd import wire
from smhvd.mpi.output import StderrFilter, parse_mpirun_verdict
from smhvd.report.failure import compose, write_failure
from smhvd.wire import RankFailure


def test_headlines():
    assert RankFailure(rank=1, host="algo-2", exit_code=3).headline() == "rank 1 on algo-2 exited with code 3"
    assert RankFailure(rank=0, host=None, signal=9).headline() == "rank 0 was killed by signal 9 (SIGKILL)"


def test_json_round_trip_keeps_everything():
    failure = RankFailure(
        rank=3, host="algo-4", exit_code=2, stderr_tail='Traceback\n  "quoted"\nValueError: é \x1b[31mx'
    )
    line = failure.to_json()
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert RankFailure.from_json(line) == failure


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


def test_mpiruns_own_text_passes_and_a_rank_failure_comes_only_in_its_frame():
    report = RankFailure(rank=1, host="algo-2", exit_code=3, stderr_tail="boom")
    frame = b"".join(wire.frames(wire.FAILURE, report.to_json()))
    f = StderrFilter()
    looks_like_one = b"@@smhvd-rank-failure@@ " + report.to_json()  # plain text: never taken for a report
    shown = f.feed(b"epoch 1 loss 0.5\n" + looks_like_one)
    shown += f.feed(b"[1,1]<stderr>:" + frame[:10])
    shown += f.feed(frame[10:] + b"after\n")
    shown += f.flush()
    assert shown == b"epoch 1 loss 0.5\n" + looks_like_one + b"after\n"
    assert f.failures == [report]


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
