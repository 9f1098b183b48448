"""The job summary: rank start frames, the summary itself, and the Horovod share of a timeline."""

import json

import pytest

from smhvd import wire
from smhvd.mpi.output import StderrFilter
from smhvd.report.summary import horovod_op_share, summarize, timeline_events, union_length
from smhvd.wire import RankStart


def test_start_frames_are_taken_from_mpiruns_output_and_read_back():
    start = RankStart(rank=1, host="algo-2", at=1000.5)
    output = StderrFilter()
    text = b"epoch 1\n[1,1]<stderr>:" + b"".join(wire.frames(wire.START, start.to_json())) + b"epoch 2\n"
    shown = b"".join(output.feed(text[i : i + 3]) for i in range(0, len(text), 3)) + output.flush()
    assert shown == b"epoch 1\nepoch 2\n"
    assert output.starts == [start]
    assert RankStart.from_json(start.to_json()[:-2] + b"garbage") is None


def test_summary_counts_ranks_where_they_started_and_times_from_train_start():
    summary = summarize(
        hosts=("algo-1", "algo-2"),
        ranks=4,
        starts=[RankStart(0, "algo-1", 103.2), RankStart(1, "algo-1", 103.0), RankStart(2, "algo-2", 103.9)],
        started_at=100.0,
        ended_at=160.5,
        exit_code=3,
        host_exits={"algo-1": 3, "algo-2": 3},
        failure="rank 2 on algo-2 exited with code 3\nTraceback ...",
    )
    assert json.loads(summary.to_json()) == {
        "hosts": ["algo-1", "algo-2"],
        "ranks": 4,
        "ranks_per_host": {"algo-1": 2, "algo-2": 1},
        "first_rank_seconds": 3.0,
        "wall_seconds": 60.5,
        "exit_code": 3,
        "host_exits": {"algo-1": 3, "algo-2": 3},
        "failure": "rank 2 on algo-2 exited with code 3",
        "horovod_op_share": None,
        "preflight": None,
        "preflight_only": False,
        "inflight": None,
    }
    assert summary.render() == (
        "job summary: exit 3; 4 rank(s) on 2 host(s) (algo-1:2, algo-2:1); first rank after 3.00s; "
        "wall 60.50s; failure: rank 2 on algo-2 exited with code 3"
    )


def test_union_length_counts_overlaps_once():
    assert union_length([(0, 2), (1, 3), (5, 6), (5.5, 5.7)]) == 4.0
    assert union_length([]) == 0.0


def _timeline(events):
    # As Horovod writes it while running: an opened array, one event per line, no closing bracket.
    return "[\n" + "".join(json.dumps(e) + ",\n" for e in events)


EVENTS = [
    {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": 0, "pid": 1, "tid": 0},
    {"ph": "E", "ts": 10, "pid": 1, "tid": 0},
    {"name": "MPI_ALLREDUCE", "ph": "B", "ts": 5, "pid": 2, "tid": 0},
    {"ph": "E", "ts": 20, "pid": 2, "tid": 0},
    {"name": "CYCLE_START", "ph": "i", "ts": 100, "pid": 0, "tid": 0},
]


@pytest.mark.parametrize("cut", [0, 17])
def test_horovod_share_from_a_timeline_even_one_cut_off_mid_write(cut):
    text = _timeline(EVENTS)
    text = text[: len(text) - cut] if cut else text + "]"
    events = timeline_events(text)
    assert len(events) == (5 if cut == 0 else 4)
    share = horovod_op_share(events)
    assert share == (0.2 if cut == 0 else 1.0)  # ops cover 0..20 of a 0..100 span (0..20 once cut)


def test_no_ops_no_share():
    assert horovod_op_share([]) is None
    assert timeline_events("") == []
    assert timeline_events("not json") == []


def test_a_standalone_check_says_what_it_did_not_which_ranks_started():
    named = {"ok": False, "named": [{"host": "algo-2", "reason": "/dev/shm has 1 MB free"}]}
    summary = summarize(
        hosts=("algo-1", "algo-2"),
        ranks=2,
        starts=[],
        started_at=100.0,
        ended_at=101.25,
        exit_code=75,
        host_exits={"algo-1": 75, "algo-2": 75},
        failure="pre-flight named algo-2: /dev/shm has 1 MB free",
        preflight=named,
        preflight_only=True,
    )
    assert summary.render() == (
        "job summary: exit 75; a pre-flight only (no script): 2 host(s) checked, 1 named; wall 1.25s; "
        "failure: pre-flight named algo-2: /dev/shm has 1 MB free"
    )
