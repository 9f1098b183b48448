"""The rank wrapper: `python -m smhvd.rank -- PROGRAM ARGS`, or under mpirun `python -m smhvd.rank` with the
argv in SMHVD_RANK_ARGV (so that no user value is ever parsed by mpirun); started by mpirun for every rank.

- Takes this host's own environment from its `train` (roles/hostenv.py): the container's variables and its own
  SM_* values (mpirun forwards the leader's), so each rank sees its own SM_CURRENT_HOST and what SageMaker
  set in its container. Only the `train` that started this rank may answer. Without it the rank does not
  start (exit 69, one line naming why).
- Passes the program's stdout and stderr on in whole lines, each tagged with its rank and host unless
  launcher_tag_output is false (proc/lines.py), and keeps the tail of its stderr; when the program fails,
  prints one marker line (wire.FAILURE_MARKER + JSON) that the leader picks out of mpirun's output as the root
  cause.
- Forwards SIGTERM/SIGINT/SIGUSR1/SIGUSR2/SIGHUP to the program. A stop request (SIGTERM or SIGINT) that
  ends the program counts as a clean exit, so mpirun does not kill the other ranks while they checkpoint.
- The program dies with the wrapper (PR_SET_PDEATHSIG): nothing outlives a killed rank. The rank ends when
  the program exits: whatever it left running (even holding its stdout/stderr) is killed then.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from collections.abc import Iterator, Mapping, MutableMapping

from smhvd.errors import EX_NOT_STARTED, EX_UNAVAILABLE, EX_USAGE, LauncherError, exit_status
from smhvd.proc.lines import LineWriter, tag, write_paced
from smhvd.proc.processes import (
    ancestors,
    become_subreaper,
    drain_pipe,
    kill_descendants,
    rank_program_preexec,
)
from smhvd.report.failure import RankFailure
from smhvd.report.summary import RankStart
from smhvd.roles import hostenv
from smhvd.roles.sshd import ssh_port
from smhvd.wire import OUTPUT_CHANNEL, RANK_ARGV, SERVED, STDOUT_MARK, TAG_OUTPUT

FORWARDED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
TAIL_BYTES = 8192


def local_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for the program on this host: what mpirun forwarded, merged with the environment this
    host's own `train` serves (its container's variables and its own SM_* values; see roles/hostenv.py).
    Started directly (not by mpirun under `train`): the environment as it is. HostEnvError when the host's
    environment cannot be had: a rank never runs with another host's identity."""
    if not env.get(SERVED):
        return dict(env)
    path = hostenv.rank_directory(env, ssh_port(env))
    return hostenv.merge(env, hostenv.fetch(path, ancestors=ancestors()))  # only the train that started it


def _identity(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    rank = env.get("OMPI_COMM_WORLD_RANK") or env.get("PMIX_RANK")
    return (int(rank) if rank and rank.isdigit() else None), env.get("SM_CURRENT_HOST")


def output_until_exit(proc: subprocess.Popen[bytes]) -> Iterator[tuple[int, bytes]]:
    """(fd, chunk) of the program's stdout and stderr as they come, until the program exits (not until every
    copy of the pipes closes: a child it left running may hold them forever); then what is already in the
    pipes, bounded."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    fds = {proc.stdout.fileno(), proc.stderr.fileno()}
    exited = os.pidfd_open(proc.pid)
    try:
        with selectors.DefaultSelector() as sel:
            for fd in fds:
                sel.register(fd, selectors.EVENT_READ)
            sel.register(exited, selectors.EVENT_READ)
            while fds:
                ready = {key.fd for key, _ in sel.select()}
                readable = ready & fds
                for fd in sorted(readable):
                    chunk = os.read(fd, 65536)
                    if chunk:
                        yield fd, chunk
                    else:
                        sel.unregister(fd)
                        fds.discard(fd)
                if not readable and exited in ready:
                    break
    finally:
        os.close(exited)
    for fd in sorted(fds):
        for chunk in drain_pipe(fd):
            yield fd, chunk


def unavailable(exc: LauncherError) -> int:
    """The rank cannot start: one line, and the failure marker that makes it the job's reported cause."""
    message = f"smhvd.rank: {exc}\n"
    os.write(2, message.encode())
    rank, _ = _identity(os.environ)
    host = socket.gethostname()  # not SM_CURRENT_HOST: without this host's environment that is the leader's
    failure = RankFailure(rank=rank, host=host, exit_code=EX_UNAVAILABLE, signal=None, stderr_tail=message)
    os.write(2, failure.to_marker().encode())
    return EX_UNAVAILABLE


def run(program: list[str]) -> int:
    become_subreaper()  # what the program leaves behind is re-parented here, and killed when it exits
    try:
        env = local_env(os.environ)
    except LauncherError as exc:
        return unavailable(exc)
    stop_requested = False
    proc = subprocess.Popen(
        program,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=rank_program_preexec,  # noqa: PLW1509
    )
    os.write(2, RankStart(*_identity(env), at=time.time()).to_marker().encode())  # for the job summary

    def forward(signum: int, _frame: object) -> None:
        nonlocal stop_requested
        if signum in STOP_SIGNALS:
            stop_requested = True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in FORWARDED_SIGNALS:
        signal.signal(sig, forward)

    tagged = env.get(TAG_OUTPUT, "1") != "0"
    rank, host = _identity(env)
    assert proc.stdout is not None
    assert proc.stderr is not None
    # Under the launcher's supervisor, both streams go through stderr (a pipe it can pace), stdout's lines
    # marked (proc/lines.py); run by hand, each goes where it came from.
    merged = env.get(OUTPUT_CHANNEL) == "stderr"
    out_fd, out_mark = (2, STDOUT_MARK) if merged else (1, b"")
    writers = {
        proc.stdout.fileno(): LineWriter(
            lambda b: write_paced(out_fd, out_mark + b), tag(rank, host, "stdout") if tagged else b""
        ),
        proc.stderr.fileno(): LineWriter(
            lambda b: write_paced(2, b), tag(rank, host, "stderr") if tagged else b""
        ),
    }
    tail: deque[bytes] = deque()
    size = 0
    for fd, chunk in output_until_exit(proc):
        writers[fd].feed(chunk)
        if fd != proc.stderr.fileno():
            continue
        tail.append(chunk)
        size += len(chunk)
        while size > TAIL_BYTES and len(tail) > 1:
            size -= len(tail.popleft())
    for writer in writers.values():
        writer.flush()
    code = proc.wait()
    # The job's end is the program's exit: what it left running (a child holding its stdout or stderr, which
    # mpirun would wait for) is killed now. This wrapper is their subreaper, so daemons are found too.
    kill_descendants()

    if code == 0 or (stop_requested and -code in STOP_SIGNALS):
        return 0
    failure = RankFailure(
        rank=rank,
        host=host,
        exit_code=code if code > 0 else None,
        signal=-code if code < 0 else None,
        stderr_tail=b"".join(tail).decode(errors="replace")[-TAIL_BYTES:],
    )
    os.write(2, failure.to_marker().encode())
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
    args = program_argv(sys.argv[1:] if argv is None else argv, os.environ)
    if not args:
        sys.stderr.write("usage: python -m smhvd.rank -- PROGRAM [ARGS...]\n")
        return EX_USAGE
    try:
        return run(args)
    except FileNotFoundError as exc:
        sys.stderr.write(f"smhvd.rank: cannot run {args[0]}: {exc.strerror}\n")
        return EX_NOT_STARTED


if __name__ == "__main__":
    sys.exit(main())
