"""The rank wrapper mpirun starts for every rank: `python -m smhvd.rank`, the program's argv in
SMHVD_RANK_ARGV (no user value is parsed by mpirun), or `python -m smhvd.rank -- PROGRAM ARGS`. It takes its
host's own environment from its `train` (hostenv/client.py), passes the program's output on as frames
(docs/output.md), and forwards signals: a stop that ends the program is a clean exit (mpirun does not kill
the others while they checkpoint). What the program left running is killed when it exits.
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
from dataclasses import replace

from smhvd import wire
from smhvd.env_options import read_env_options
from smhvd.errors import EX_NOT_STARTED, EX_USAGE, LauncherError, exit_status
from smhvd.hostenv import client as hostenv_client
from smhvd.inflight.forward import Forward
from smhvd.inflight.signals import SAMPLE_EVERY
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

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
# Stop requests (SageMaker's SIGTERM that mpirun passes on, Ctrl-C): a program they end exits cleanly.
STOP_REQUESTS = (signal.SIGTERM, signal.SIGINT)
TAIL_BYTES = 8192  # of the program's stderr, the end kept for a failure report


def local_env(env: Mapping[str, str]) -> dict[str, str]:
    """What mpirun forwarded, merged with what this host's own `train` serves (hostenv/server.py); started
    directly, `env` as it is. HostEnvError when that cannot be had: a rank never runs with another host's
    identity."""
    if not env.get(wire.HOSTENV_SERVED_FROM):
        return dict(env)
    options = read_env_options(env)
    path = hostenv_client.rank_directory(env, options.ssh_port)
    served = hostenv_client.fetch(path, options.hostenv_timeout, ancestors())  # only its own train answers
    return hostenv_client.merge(env, served)


def _identity(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
    return (int(rank) if rank and rank.isdigit() else None), env.get("SM_CURRENT_HOST")


def _local_rank(env: Mapping[str, str]) -> int | None:
    local = env.get("OMPI_COMM_WORLD_LOCAL_RANK", "")
    return int(local) if local.isdigit() else None


class InflightPipe:
    """In-flight on (wire.INFLIGHT_POLICY, under the launcher): a pipe whose write end the program gets (its
    number in wire.INFLIGHT_FD), read here into INFLIGHT frames (inflight/forward.py)."""

    def __init__(self, env: dict[str, str]) -> None:
        self.read_fd, self.write_fd = os.pipe2(os.O_CLOEXEC)
        env[wire.INFLIGHT_FD] = str(self.write_fd)

    def started(self) -> None:
        """The program holds its end now: this process's copy is closed."""
        os.close(self.write_fd)

    def close(self) -> None:
        os.close(self.read_fd)


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
    failure = wire.RankFailure(rank=rank, host=host, exit_code=code, stderr_tail=message)
    sink.send(wire.FAILURE, failure.to_json())
    return code


class Streams:
    """The program's stdout and stderr as lines to the sink (mpi/lines.py), lines in progress shown when due
    (a timer), and the end of its stderr kept for a failure report."""

    def __init__(self, proc: subprocess.Popen[bytes], prefix: Callable[[str], bytes], sink: Sink) -> None:
        assert proc.stdout is not None
        assert proc.stderr is not None
        self.proc, self.sink, self.err = proc, sink, proc.stderr.fileno()
        self.streams = {
            proc.stdout.fileno(): (Lines(prefix("stdout")), (wire.STDOUT, wire.STDOUT_PIECE)),
            self.err: (Lines(prefix("stderr")), (wire.STDERR, wire.STDERR_PIECE)),
        }
        self.tail = b""
        self.timers, self.due_timer = Timers(), Timer("a line in progress is due")
        self.armed: float | None = None  # the deadline the timer is set for
        self.inflight: tuple[int, Forward] | None = None  # the in-flight pipe's read end and its reader

    def measure(self, fd: int, forward: Forward) -> None:
        """In-flight: the program's steps on `fd`, and this rank's samples every SAMPLE_EVERY seconds."""
        self.inflight = (fd, forward)
        self.timers.every(Timer("in-flight sample"), SAMPLE_EVERY, forward.sample)

    def follow(self) -> None:
        """Until the program exits (proc/loop.follow_output), then the unfinished last lines."""
        fds = [*self.streams, *([self.inflight[0]] if self.inflight else [])]
        follow_output(self.proc.pid, fds, self._output, self.timers)
        for lines, kinds in self.streams.values():
            self.sink.out(kinds, lines.finish())

    def _output(self, fd: int, chunk: bytes) -> None:
        if self.inflight is not None and fd == self.inflight[0]:
            self.inflight[1].feed(chunk)
            return
        lines, kinds = self.streams[fd]
        self.sink.out(kinds, lines.feed(chunk, time.monotonic()))
        if fd == self.err:
            self.tail = (self.tail + chunk)[-TAIL_BYTES:]
        self._arm()

    def _arm(self) -> None:
        due = min((d for lines, _ in self.streams.values() if (d := lines.due) is not None), default=None)
        if due != self.armed:
            self.armed = due
            if due is None:
                self.timers.cancel(self.due_timer)
            else:
                self.timers.at(self.due_timer, due, self._progress)

    def _progress(self) -> None:
        self.armed, now = None, time.monotonic()
        for lines, kinds in self.streams.values():
            self.sink.out(kinds, lines.progress(now))
        self._arm()


def run(program: list[str]) -> int:
    become_subreaper()  # what the program leaves behind is re-parented here, and killed when it exits
    sink = Sink(framed=os.environ.get(wire.OUTPUT_CHANNEL) == wire.OUTPUT_FRAMED)
    try:
        env = local_env(os.environ)
    except LauncherError as exc:  # no host environment: not SM_CURRENT_HOST, that would be the leader's
        return not_run(str(exc), exc.exit_code, _identity(os.environ)[0], socket.gethostname(), sink)
    rank, host = _identity(env)  # this host's own SM_CURRENT_HOST
    inflight = InflightPipe(env) if sink.framed and env.get(wire.INFLIGHT_POLICY) else None
    pipe, pass_fds = subprocess.PIPE, (inflight.write_fd,) if inflight else ()
    try:
        proc = subprocess.Popen(
            program,
            env=env,
            stdout=pipe,
            stderr=pipe,
            pass_fds=pass_fds,
            preexec_fn=rank_program_preexec,  # noqa: PLW1509
        )
    except (FileNotFoundError, PermissionError) as exc:
        return not_run(f"cannot run {program[0]}: {exc.strerror}", EX_NOT_STARTED, rank, host, sink)
    finally:
        if inflight is not None:
            inflight.started()
    sink.send(wire.START, wire.RankStart(rank, host, at=time.time()).to_json())  # for the job summary
    stops: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stops.extend([signum] if signum in STOP_REQUESTS else [])
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)
    tagged = env.get(wire.TAG_OUTPUT, "1") != "0"
    streams = Streams(proc, lambda stream: tag(rank, host, stream) if tagged else b"", sink)
    if inflight is not None:
        streams.measure(inflight.read_fd, Forward(sink.send, rank, host, _local_rank(env), proc.pid))
    with proc.stdout, proc.stderr:  # type: ignore[union-attr]
        streams.follow()
    if inflight is not None:
        inflight.close()
    code = proc.wait()
    # The job's end is the program's exit: what it left running (a child holding its stdout or stderr, which
    # mpirun would wait for) is killed now. This wrapper is their subreaper, so daemons are found too.
    kill_descendants()
    if code == 0 or (stops and -code in STOP_REQUESTS):
        return 0
    failure = wire.RankFailure(rank, host, code if code > 0 else None, -code if code < 0 else None)
    sink.send(wire.FAILURE, replace(failure, stderr_tail=streams.tail.decode(errors="replace")).to_json())
    if code < 0:  # die the same way, so mpirun reports the signal
        if -code not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return exit_status(code)


def program_argv(args: list[str], env: MutableMapping[str, str]) -> list[str]:
    """`-- PROGRAM ARGS` when started directly; under mpirun, RANK_ARGV (taken out of the environment)."""
    if args[:1] == ["--"]:
        return args[1:]
    if not args and wire.RANK_ARGV in env:
        value = json.loads(env.pop(wire.RANK_ARGV))
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
