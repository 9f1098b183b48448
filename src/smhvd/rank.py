"""The rank wrapper: `python -m smhvd.rank -- PROGRAM ARGS`, or under mpirun `python -m smhvd.rank` with the
argv in SMHVD_RANK_ARGV (so that no user value is ever parsed by mpirun); started by mpirun for every rank.

- Takes this host's own environment from its `train` (hostenv/client.py; hostenv/server.py serves it): the
  container's variables and its own SM_* values (mpirun forwards the leader's), so each rank sees its own
  SM_CURRENT_HOST and what SageMaker set in its container. Only the `train` that started this rank is
  trusted. Without it the rank does not start (exit 69, one line naming why).
- Passes the program's stdout and stderr on in whole lines, each tagged with its rank and host unless
  launcher_tag_output is false, lines in progress (progress bars) shown while they run (mpi/lines.py). Under
  the launcher it writes them, its start and, when the program fails, the failure with the tail of the
  program's stderr, as frames on its own stderr (wire.py), which the leader reassembles (mpi/output.py): no
  line is cut by another rank's, whatever its size, and nothing waits for mpirun to read.
- Forwards SIGTERM/SIGINT/SIGUSR1/SIGUSR2/SIGHUP to the program. A stop request (SIGTERM or SIGINT) that
  ends the program counts as a clean exit, so mpirun does not kill the other ranks while they checkpoint.
- The program dies with the wrapper (PR_SET_PDEATHSIG): nothing outlives a killed rank. The rank ends when
  the program exits: whatever it left running (even holding its stdout/stderr) is killed then.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Mapping, MutableMapping

from smhvd import wire
from smhvd.env_options import read_env_options
from smhvd.errors import EX_NOT_STARTED, EX_USAGE, LauncherError, exit_status
from smhvd.hostenv import client as hostenv_client
from smhvd.mpi.lines import Lines, Out, tag
from smhvd.proc.loop import follow_output
from smhvd.proc.processes import (
    ancestors,
    become_subreaper,
    kill_descendants,
    rank_program_preexec,
    write_all,
)
from smhvd.proc.timers import Timer, Timers
from smhvd.wire import (
    HOSTENV_SERVED_FROM,
    OUTPUT_CHANNEL,
    OUTPUT_FRAMED,
    RANK_ARGV,
    TAG_OUTPUT,
    RankFailure,
    RankStart,
)

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
# Stop requests (SageMaker's SIGTERM that mpirun passes on, Ctrl-C): a program they end exits cleanly.
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT)
TAIL_BYTES = 8192


def local_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for the program on this host: what mpirun forwarded, merged with the environment this
    host's own `train` serves (its container's variables and its own SM_* values; see hostenv/server.py).
    Started directly (not by mpirun under `train`): the environment as it is. HostEnvError when the host's
    environment cannot be had: a rank never runs with another host's identity."""
    if not env.get(HOSTENV_SERVED_FROM):
        return dict(env)
    options = read_env_options(env)
    path = hostenv_client.rank_directory(env, options.ssh_port)
    served = hostenv_client.fetch(path, options.hostenv_timeout, ancestors())  # only its own train answers
    return hostenv_client.merge(env, served)


def _identity(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
    return (int(rank) if rank and rank.isdigit() else None), env.get("SM_CURRENT_HOST")


def follow(
    proc: subprocess.Popen[bytes],
    on_output: Callable[[int, bytes], object],
    next_due: Callable[[], float | None] = lambda: None,
    on_due: Callable[[], object] = lambda: None,
) -> None:
    """Pass the program's stdout and stderr to `on_output(fd, chunk)` as they come, and call `on_due` once
    `next_due()` (time.monotonic()) has come, until the program exits (proc/loop.follow_output: not until
    every copy of its pipes closes), then what is already in the pipes, bounded."""
    timers = Timers()
    due_timer = Timer("a line in progress is due")
    armed: float | None = None  # the deadline the timer is set for

    def arm() -> None:
        nonlocal armed
        due = next_due()
        if due == armed:
            return
        armed = due
        if due is None:
            timers.cancel(due_timer)
        else:
            timers.at(due_timer, due, fire)

    def fire() -> None:
        nonlocal armed
        armed = None
        on_due()
        arm()

    def output(fd: int, chunk: bytes) -> None:
        on_output(fd, chunk)
        arm()

    fds = [f.fileno() for f in (proc.stdout, proc.stderr) if f is not None]
    follow_output(proc.pid, fds, output, timers)


class Sink:
    """Where the rank's output goes: frames on stderr under the launcher (`framed`), else each stream to
    where it came from."""

    def __init__(self, framed: bool) -> None:
        self.framed = framed

    def send(self, kind: int, data: bytes) -> None:
        if not data:
            return
        if self.framed:
            for chunk in wire.writes(wire.frames(kind, data)):
                write_all(2, chunk)  # whole frames, at most PIPE_BUF bytes: one atomic write each
        elif kind in (wire.STDOUT, wire.STDOUT_PIECE):
            write_all(1, data)
        elif kind in (wire.STDERR, wire.STDERR_PIECE):
            write_all(2, data)

    def out(self, kinds: tuple[int, int], out: Out) -> None:
        self.send(kinds[0], out.lines)
        self.send(kinds[1], out.in_progress)


def not_run(why: str, code: int, rank: int | None, host: str | None, sink: Sink) -> int:
    """The program does not run: one line, and the failure report that makes it the job's reported cause."""
    message = f"smhvd.rank: {why}\n"
    sink.send(wire.STDERR, message.encode())
    sink.send(wire.FAILURE, RankFailure(rank=rank, host=host, exit_code=code, stderr_tail=message).to_json())
    return code


class Tail:
    """The last `limit` bytes of a stream."""

    def __init__(self, limit: int = TAIL_BYTES) -> None:
        self.limit = limit
        self.data = b""

    def add(self, chunk: bytes) -> None:
        self.data = (self.data + chunk)[-self.limit :]


def run(program: list[str]) -> int:
    become_subreaper()  # what the program leaves behind is re-parented here, and killed when it exits
    sink = Sink(framed=os.environ.get(OUTPUT_CHANNEL) == OUTPUT_FRAMED)
    try:
        env = local_env(os.environ)
    except LauncherError as exc:  # no host environment: not SM_CURRENT_HOST, that would be the leader's
        return not_run(str(exc), exc.exit_code, _identity(os.environ)[0], socket.gethostname(), sink)
    stop_requested = False
    rank, host = _identity(env)  # this host's own SM_CURRENT_HOST
    try:
        proc = subprocess.Popen(
            program,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            preexec_fn=rank_program_preexec,  # noqa: PLW1509
        )
    except (FileNotFoundError, PermissionError) as exc:
        return not_run(f"cannot run {program[0]}: {exc.strerror}", EX_NOT_STARTED, rank, host, sink)
    sink.send(wire.START, RankStart(rank, host, at=time.time()).to_json())  # for the job summary

    def forward(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        if signum in STOP_REQUESTS:
            stop_requested = True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)

    tagged = env.get(TAG_OUTPUT, "1") != "0"
    assert proc.stdout is not None
    assert proc.stderr is not None
    err_fd = proc.stderr.fileno()
    streams = {
        proc.stdout.fileno(): (
            Lines(tag(rank, host, "stdout") if tagged else b""),
            (wire.STDOUT, wire.STDOUT_PIECE),
        ),
        err_fd: (Lines(tag(rank, host, "stderr") if tagged else b""), (wire.STDERR, wire.STDERR_PIECE)),
    }
    tail = Tail()

    def output(fd: int, chunk: bytes) -> None:
        lines, kinds = streams[fd]
        sink.out(kinds, lines.feed(chunk, time.monotonic()))
        if fd == err_fd:
            tail.add(chunk)

    def next_due() -> float | None:
        return min((d for lines, _ in streams.values() if (d := lines.due) is not None), default=None)

    def progress() -> None:
        now = time.monotonic()
        for lines, kinds in streams.values():
            sink.out(kinds, lines.progress(now))

    with proc.stdout, proc.stderr:
        follow(proc, output, next_due, progress)
        for lines, kinds in streams.values():
            sink.out(kinds, lines.finish())
    code = proc.wait()
    # The job's end is the program's exit: what it left running (a child holding its stdout or stderr, which
    # mpirun would wait for) is killed now. This wrapper is their subreaper, so daemons are found too.
    kill_descendants()

    if code == 0 or (stop_requested and -code in STOP_REQUESTS):
        return 0
    failure = RankFailure(
        rank=rank,
        host=host,
        exit_code=code if code > 0 else None,
        signal=-code if code < 0 else None,
        stderr_tail=tail.data.decode(errors="replace"),
    )
    sink.send(wire.FAILURE, failure.to_json())
    if code < 0:  # die the same way, so mpirun reports the signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return exit_status(code)


def program_argv(args: list[str], env: MutableMapping[str, str]) -> list[str]:
    """`-- PROGRAM ARGS` when started directly; under mpirun, RANK_ARGV (taken out of the environment)."""
    if args[:1] == ["--"]:
        return args[1:]
    if not args and RANK_ARGV in env:
        value = json.loads(env.pop(RANK_ARGV))
        if isinstance(value, list) and all(isinstance(a, str) for a in value):
            return value
    return args


def main(argv: list[str] | None = None) -> int:
    warnings.simplefilter("ignore")  # the wrapper's own warnings never reach the job's log
    args = program_argv(sys.argv[1:] if argv is None else argv, os.environ)
    if not args:
        sys.stderr.write("usage: python -m smhvd.rank -- PROGRAM [ARGS...]\n")
        return EX_USAGE
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
