"""A rank's output on its way to the log: the frames (wire.py), a stream's lines (mpi/lines.py) and the
leader's reassembly of what mpirun forwards (mpi/output.py), checked against Open MPI 4.1's own forwarding.

`openmpi_forward` does what Open MPI 4.1.4's --tag-output forwarding does with the ranks' stderr pipes (seen
with mpirun 4.1.4 on this stack: a read takes at most 4096 bytes of a pipe; each piece is written behind
`[JOB,RANK]<stderr>:`, again after every newline inside it; pieces of different ranks and mpirun's own
messages follow each other in any order). The real mpirun runs the same path in test_train_one_host.py.
"""

from __future__ import annotations

import json
import random

import pytest

from smhvd import wire
from smhvd.config.launcher_options import split_mpi_options
from smhvd.errors import ConfigError
from smhvd.mpi.lines import PROGRESS_EVERY, Lines, tag, visible
from smhvd.mpi.output import FrameReader, StderrFilter
from smhvd.report.failure import compose
from smhvd.wire import RankFailure, RankStart

CONTROL = bytes(range(0x1C, 0x20))


def test_escaping_round_trips_every_byte_and_leaves_no_control_byte():
    data = bytes(range(256)) * 3 + CONTROL * 5 + b"\x1d1\x1d0" + CONTROL[::-1]
    escaped = wire.escape(data)
    assert not any(b in escaped for b in CONTROL if b != wire.ESCAPE)
    assert all(escaped[i + 1 : i + 2] in b"0123" for i, b in enumerate(escaped) if b == wire.ESCAPE)
    assert wire.unescape(escaped) == data


def test_frames_are_whole_writes_of_at_most_pipe_buf_without_newlines():
    data = b"".join(b"line %d " % i + bytes([i % 256]) * (i % 50) + b"\n" for i in range(3000))
    frames = wire.frames(wire.STDOUT, data)
    assert all(
        len(r) <= wire.FRAME_MAX and r[0] == wire.FRAME_START and r[-1] == wire.FRAME_END for r in frames
    )
    assert all(b"\n" not in r and r.count(wire.FRAME_END) == 1 for r in frames)
    writes = wire.writes(frames)
    assert b"".join(writes) == b"".join(frames) and all(len(w) <= wire.FRAME_MAX for w in writes)
    assert wire.body_lines(b"".join(r[2:-1] for r in frames)) == data


def openmpi_forward(writes: dict[int, list[bytes]], texts: list[bytes], rng: random.Random) -> bytes:
    """mpirun's stderr for these ranks' writes (each to its own pipe, in order) and mpirun's own texts."""
    pipes = {rank: b"" for rank in writes}
    queues = {rank: list(w) for rank, w in writes.items()}
    texts = list(texts)
    out = []
    while any(queues.values()) or any(pipes.values()) or texts:
        choice = rng.random()
        writers = [r for r, q in queues.items() if q and len(pipes[r]) + len(q[0]) <= 65536]
        readers = [r for r, p in pipes.items() if p]
        if writers and (choice < 0.5 or not readers):
            rank = rng.choice(writers)
            pipes[rank] += queues[rank].pop(0)  # a write of at most PIPE_BUF bytes is atomic
        elif readers and choice < 0.97:
            rank = rng.choice(readers)
            piece, pipes[rank] = pipes[rank][:4096], pipes[rank][4096:]
            start = b"[1,%d]<stderr>:" % rank
            body = piece[:-1].replace(b"\n", b"\n" + start) + piece[-1:]
            out.append(start + body)
        elif texts:
            out.append(texts.pop(0))
    return b"".join(out)


def wrapper_writes(rank: int, lines: list[bytes], failure: RankFailure | None = None) -> list[bytes]:
    """What the rank wrapper writes for these lines of its program (stdout and stderr alternating)."""
    out = list(wire.writes(wire.frames(wire.START, RankStart(rank, "algo-1", 1.5).to_json())))
    stream = {0: Lines(tag(rank, "algo-1", "stdout")), 1: Lines(tag(rank, "algo-1", "stderr"))}
    for i, line in enumerate(lines):
        kind = wire.STDOUT if i % 2 == 0 else wire.STDERR
        for piece in (line[:7], line[7:] + b"\n"):  # an unbuffered print writes a line in pieces
            got = stream[i % 2].feed(piece, 0.0)
            if got.lines:
                out += wire.writes(wire.frames(kind, got.lines))
    if failure is not None:
        out += wire.writes(wire.frames(wire.FAILURE, failure.to_json()))
    return out


MPIRUN_TEXT = [
    b"-" * 74 + b"\nPrimary job  terminated normally, but 1 process returned\na non-zero exit code.\n",
    b"[algo-1:01234] 1 more process has sent help message help-mpi-api.txt / mpi-abort\n",
    b"mpirun noticed that process rank 1 with PID 0 on node algo-1 exited on signal 9 (Killed).\n",
]


@pytest.mark.parametrize("seed", range(12))
def test_every_line_of_every_rank_is_rebuilt_whole_in_order_whatever_mpirun_cut_or_put_between(seed):
    rng = random.Random(seed)
    lines = {
        rank: [
            b"rank %d line %d " % (rank, i)
            + bytes(
                rng.choice(b"ab[]<>:\r\t\x1b\x1c\x1d\x1e\x1f\xc3\xa9")
                for _ in range(rng.choice([0, 5, 90, 900, 6000]))
            )
            for i in range(rng.randint(20, 120))
        ]
        for rank in range(3)
    }
    failure = RankFailure(rank=2, host="algo-1", exit_code=1, stderr_tail="Trace\x1b[31mback é\n" * 1500)
    writes = {rank: wrapper_writes(rank, lines[rank], failure if rank == 2 else None) for rank in lines}
    stream = openmpi_forward(writes, MPIRUN_TEXT, rng)
    output = StderrFilter(keep_bytes=1 << 22)
    shown = b""
    stdout = b""
    position = 0
    while position < len(stream):
        size = rng.choice([1, 13, 4096, 65536])
        shown += output.feed(stream[position : position + size])
        stdout += output.take_stdout()
        position += size
    shown += output.flush()
    stdout += output.take_stdout()
    for rank, sent in lines.items():
        out = [ln for ln in stdout.split(b"\n") if ln.startswith(b"[%d,algo-1]<stdout>: " % rank)]
        err = [ln for ln in shown.split(b"\n") if ln.startswith(b"[%d,algo-1]<stderr>: " % rank)]
        assert out == [tag(rank, "algo-1", "stdout") + visible(line) for line in sent[0::2]]
        assert err == [tag(rank, "algo-1", "stderr") + visible(line) for line in sent[1::2]]
    for text in MPIRUN_TEXT:
        assert text in shown
    assert sorted(s.rank for s in output.starts) == [0, 1, 2]
    assert output.failures == [failure]


def test_frames_of_a_rank_run_without_mpirun_and_text_around_them():
    writes = wrapper_writes(0, [b"hello world", b"to stderr"])
    reader = FrameReader()
    events = reader.feed(b"plain text\n" + b"".join(writes) + b"Traceback (most recent call last):\n")
    events += reader.finish()
    assert (0, b"plain text\n") in events
    assert (wire.STDOUT, b"[0,algo-1]<stdout>: hello world\n") in events
    assert (wire.STDERR, b"[0,algo-1]<stderr>: to stderr\n") in events
    assert (0, b"Traceback (most recent call last):\n") in events


def test_a_line_the_wrapper_wrote_itself_keeps_open_mpis_tag():
    events = FrameReader().feed(b"[1,3]<stderr>:Traceback (most recent call last):\n[1,3]<stderr>:  File x\n")
    assert (
        b"".join(data for _, data in events)
        == b"[1,3]<stderr>:Traceback (most recent call last):\n[1,3]<stderr>:  File x\n"
    )


def test_a_line_longer_than_a_frame_is_joined_again():
    line = b"x" * 300_000
    writes = wrapper_writes(0, [line, b"short"])
    events = FrameReader().feed(b"".join(writes))
    assert events[1] == (wire.STDOUT, tag(0, "algo-1", "stdout") + line + b"\n")


def test_lines_are_tagged_whole_and_a_rewritten_line_keeps_what_a_terminal_shows():
    lines = Lines(b"[0,h]<stdout>: ")
    assert lines.feed(b"a\nb", 0.0).lines == b"[0,h]<stdout>: a\n"
    assert (
        lines.feed(b"c\r\n 10%\r 50%\r100% done\n", 0.0).lines
        == b"[0,h]<stdout>: bc\n[0,h]<stdout>: 100% done\n"
    )
    assert lines.finish().lines == b""
    lines.feed(b"no end", 0.0)
    assert lines.finish().lines == b"[0,h]<stdout>: no end\n"


def test_a_line_in_progress_is_shown_every_interval_while_it_changes_then_whole():
    lines = Lines(b"[0,h]<stdout>: ")
    shown = []
    for step in range(100):  # a bar updated 100 times over 5 s
        now = step * 0.05
        assert lines.feed(b"\r%3d%%" % step, now).lines == b""
        shown.append(lines.progress(now).lines)
        if lines.due is not None:
            assert lines.due - now <= PROGRESS_EVERY + 1e-9
    shown = [s for s in shown if s]
    assert 8 <= len(shown) <= 11  # one line every PROGRESS_EVERY, not one per update
    assert all(s.startswith(b"[0,h]<stdout>: ") and s.endswith(b"%\n") and b"\r" not in s for s in shown)
    assert len(lines.partial) < 20  # only what may still show is kept
    assert lines.feed(b"\r100% done\n", 5.0).lines == b"[0,h]<stdout>: 100% done\n"
    assert lines.progress(10.0).lines == b""


def test_untagged_keeps_every_byte_and_shows_a_line_in_progress_as_it_is():
    lines = Lines(b"")
    data = bytes(range(256)).replace(b"\n", b"") + b"\r\x1d@@smhvd-rank-failure@@ {}\r"
    out = lines.feed(data[:100], 0.0).lines + lines.feed(data[100:], 0.1).lines
    assert out == b""
    assert lines.progress(1.0).in_progress == data
    assert lines.feed(b"rest\n", 1.1).lines == b"rest\n"


def test_a_long_coloured_non_ascii_traceback_survives_as_a_failure():
    text = (
        "".join(f"\x1b[31mFehler {i}: Größe überschritten ✗\x1b[0m\n" for i in range(400))
        + "ValueError: Ursache"
    )
    failure = RankFailure(rank=0, host="algo-1", exit_code=1, stderr_tail=text)
    data = b"".join(wire.writes(wire.frames(wire.FAILURE, failure.to_json())))
    output = StderrFilter()
    output.feed(data)
    output.flush()
    assert output.failures == [failure]
    reason = compose(output.failures[0].headline(), output.failures[0].stderr_tail)
    assert reason.startswith("rank 0 on algo-1 exited with code 1\n") and reason.endswith(
        "ValueError: Ursache"
    )
    assert "\x1b" not in reason and "Größe überschritten ✗" in reason


def test_start_and_failure_reports_are_json_lines():
    start = RankStart(rank=1, host="algo-2", at=1000.5)
    assert RankStart.from_json(start.to_json()) == start
    assert RankStart.from_json(b"garbage") is None
    assert RankFailure.from_json(b"{not json") is None
    assert json.loads(RankFailure(rank=None, host=None, exit_code=3).to_json())["exit_code"] == 3


@pytest.mark.parametrize(
    "options",
    [
        "--xml",
        "-timestamp-output",
        "--merge-stderr-to-stdout",
        "--mca orte_xml_output 1",
        "--output-filename=/x",
    ],
)
def test_mpirun_options_that_change_how_it_writes_rank_output_are_refused_in_one_line(options):
    with pytest.raises(
        ConfigError, match=r"sagemaker_mpi_custom_mpi_options: expected no option that changes how"
    ):
        split_mpi_options(f"-x A=1 {options}")
    assert split_mpi_options("--tag-output -x A=1") == ("--tag-output", "-x", "A=1")
