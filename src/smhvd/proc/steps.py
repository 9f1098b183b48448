"""Preparation steps (the code's download, pip, the EFA probe) as child processes that end with their tree.
A step runs in its own session, the head and tail of its output kept (a probe reports first, pip fails last).
However the wait ends, nothing the step started is left: what it left behind is killed when it exits; at its
deadline, or when an exception (errors.Stopped) reaches the wait, its group and everything started since it
began get SIGTERM, then SIGKILL STOP_GRACE later ("since" is exact: the launcher is a child subreaper). Its
TMPDIR is its own (`private_tmpdir`: pip keeps its pip-* directories on SIGTERM), and marks what it started:
a daemon in a session of its own is the step's only when it carries that TMPDIR (on a worker, Open MPI's
orted daemonizes under the launcher while its steps run, and is none of theirs).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd.proc.loop import follow_output, wait_exits
from smhvd.proc.processes import descendants, die_with_parent, is_alive, not_own_since, signal_pids

OUTPUT_LIMIT = 1 << 20  # of each stream, the first and the last half of this many bytes are kept
STOP_GRACE = 3.0  # SIGTERM, then SIGKILL this long after to what ignored it (as mpirun after an abort)
TMPDIR_PREFIX = "smhvd-step-"  # a step's TMPDIR: <inherited TMPDIR>/smhvd-step-<random>


@dataclass(frozen=True)
class StepResult:
    returncode: int | None  # None: the deadline passed and the step was ended
    stdout: bytes
    stderr: bytes  # empty when stderr was merged into stdout

    def text(self) -> tuple[str, str]:
        """stdout and stderr as text (bytes that are not UTF-8 become U+FFFD: output is never a failure)."""
        return self.stdout.decode(errors="replace"), self.stderr.decode(errors="replace")


def last_line(output: bytes, default: str = "no output") -> str:
    """The last non-empty line of a step's output, as text (for a one-line error)."""
    lines = [line.strip() for line in output.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else default


def run_step(
    argv: Sequence[str],
    *,
    timeout: float | None = None,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    echo: bool = False,
    merge_stderr: bool = False,
) -> StepResult:
    """Run argv to its end (or `timeout` seconds); `echo` copies its output to this process's stderr as it
    comes. Raises what Popen raises (FileNotFoundError: no such program) and whatever interrupts the wait,
    after the step's process tree was ended."""
    with private_tmpdir() as tmp:
        before = set(descendants())
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env={**(os.environ if env is None else env), "TMPDIR": str(tmp)},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
            start_new_session=True,  # its own process group: one signal reaches what it starts
            preexec_fn=die_with_parent,  # noqa: PLW1509  (a launcher killed outright leaves no step behind)
        )
        streams = [s for s in (proc.stdout, proc.stderr) if s is not None]
        kept = {s.fileno(): _HeadAndTail() for s in streams}  # stdout first, then stderr (dicts keep order)
        deadline = None if timeout is None else time.monotonic() + timeout
        marker = f"TMPDIR={tmp}".encode()  # what the step starts carries it: a daemon it left is its
        try:
            finished = follow_output(
                proc.pid, kept, lambda fd, data: kept[fd].add(data, echo), deadline=deadline
            )
            if finished:
                _kill(proc, before, marker)  # what it left behind
            else:
                end_tree(proc, before, marker)
        except BaseException:
            end_tree(proc, before, marker)
            raise
        finally:
            for stream in streams:
                stream.close()
    out, err = [*(k.value() for k in kept.values()), b""][:2]
    return StepResult(proc.returncode if finished else None, out, err)


@contextlib.contextmanager
def private_tmpdir(parent: Path | None = None) -> Iterator[Path]:
    """A new directory (0700) under `parent` (default: the temporary directory), removed with everything in
    it however the block ends. This process holds a lock on it meanwhile (made under a hidden name, locked,
    then renamed into place: no other train finds it unlocked); ones whose holder is gone go first."""
    parent = parent or Path(tempfile.gettempdir())
    remove_abandoned(parent)
    name = f"{TMPDIR_PREFIX}{secrets.token_hex(8)}"
    making, path = parent / f".{name}", parent / name
    try:
        making.mkdir(mode=0o700)
    except OSError as exc:
        raise _cannot_create(parent, exc) from None
    held = -1
    try:
        try:
            held = os.open(making, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            with contextlib.suppress(OSError):  # a file system without locks: nothing is swept there either
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            making.rename(path)
        except OSError as exc:
            raise _cannot_create(parent, exc) from None
        yield path
    finally:
        try:
            _remove(path, making)
        finally:
            if held >= 0:
                os.close(held)  # the lock goes with it


def _cannot_create(parent: Path, exc: OSError) -> OSError:
    """Not a FileNotFoundError: to run_step's callers that means "no such program"."""
    return OSError(f"cannot create the step's temporary directory in {parent}: {exc}")


def remove_abandoned(parent: Path) -> list[Path]:
    """Remove the step directories under `parent` that no process holds any more (their train was killed
    outright); only this user's, never through a link. Returns what was removed."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in sorted(parent.glob(f"{TMPDIR_PREFIX}*")):
            try:
                fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError:
                continue  # gone, a link, or not ours to read
            try:
                if os.fstat(fd).st_uid != os.geteuid():
                    continue
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: its train is alive
                _remove(entry)
                removed.append(entry)
            except OSError:
                continue
            finally:
                os.close(fd)
    return removed


def _remove(*paths: Path) -> None:
    """rmtree each; a stop that interrupts the first attempt is raised after a second one."""
    try:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
    except BaseException:
        for path in paths:
            shutil.rmtree(path, ignore_errors=True)
        raise


class _HeadAndTail:
    """A stream's first and last OUTPUT_LIMIT // 2 bytes; what lies between is dropped (and marked)."""

    def __init__(self) -> None:
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = False

    def add(self, chunk: bytes, echo: bool = False) -> None:
        if echo:
            os.write(2, chunk)
        room = OUTPUT_LIMIT // 2 - len(self.head)
        if room > 0 and not self.tail:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        if len(self.tail) > OUTPUT_LIMIT // 2:
            del self.tail[: len(self.tail) - OUTPUT_LIMIT // 2]
            self.dropped = True

    def value(self) -> bytes:
        return bytes(self.head + (b"\n[...]\n" if self.dropped else b"") + self.tail)


def _started_since(before: set[int], step: int, marker: bytes | None = None) -> list[int]:
    """What the step (pid `step`) started: every process below this one since it began, but what this process
    started itself meanwhile (processes.not_own_since). With `marker` (an environment entry only the step's
    processes carry), a process in a session of its own must carry it: Open MPI's orted daemonizes on a
    worker while the worker's steps run, and, re-parented to this process (a subreaper), it is no step's."""
    found = not_own_since(before)
    return found if marker is None else [pid for pid in found if _of_step(pid, step, marker)]


def _of_step(pid: int, step: int, marker: bytes) -> bool:
    """In the step's session, or carrying its marker in its environment (a daemon it left, in its own)."""
    try:
        if os.getsid(pid) == step:
            return True
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _signal_tree(proc: subprocess.Popen[bytes], pids: Iterable[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the step's group (its pid stays reserved until it is reaped below)
    signal_pids(pids, sig)


def _reap(pids: Iterable[int]) -> None:
    """Reap those of `pids` that are exited children of this process (orphans re-parented to it)."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


FREEZE_ROUNDS = 100  # looks for what the step's processes forked before they were all stopped


def end_tree(proc: subprocess.Popen[bytes], before: set[int], marker: bytes | None = None) -> None:
    """SIGTERM to the step's group and every process started since it began (`marker`: _started_since);
    SIGKILL STOP_GRACE later to what is still alive; the step and the orphans it left reaped."""
    termed = set(_started_since(before, proc.pid, marker))
    _signal_tree(proc, termed, signal.SIGTERM)
    _wait_gone(proc, before, STOP_GRACE, marker, termed)
    _kill(proc, before, marker, termed)


def _kill(
    proc: subprocess.Popen[bytes], before: set[int], marker: bytes | None = None, known: Iterable[int] = ()
) -> None:
    """The step's group and every process started since it began stopped (SIGSTOP, look again for what they
    forked meanwhile, until a look finds nothing new: a stopped process forks nothing), then SIGKILLed; the
    step and every process found reaped, also one whose environment reads empty once it is a zombie."""
    frozen = set(known)
    for _ in range(FREEZE_ROUNDS):
        found = set(_started_since(before, proc.pid, marker)) - frozen
        _signal_tree(proc, found, signal.SIGSTOP)
        if not found:
            break
        frozen |= found
    _signal_tree(proc, frozen, signal.SIGKILL)
    _wait_gone(proc, before, STOP_GRACE, marker, frozen)
    proc.wait()


def _wait_gone(
    proc: subprocess.Popen[bytes], before: set[int], timeout: float, marker: bytes | None, known: set[int]
) -> None:
    """Wait (bounded) until nothing started since the step began is alive, reaping the orphans among them
    and those of `known` (signalled already: a zombie's environment reads empty, so no look finds it again):
    on the processes' pidfds, then a new look at the tree (what they forked meanwhile), until none is left."""
    deadline = time.monotonic() + timeout
    while True:
        pids = set(_started_since(before, proc.pid, marker)) | known
        alive = [pid for pid in pids if is_alive(pid)]
        _reap(pid for pid in pids if pid != proc.pid)  # after the look: what it saw gone is reaped now
        remaining = deadline - time.monotonic()
        if not alive or remaining <= 0:
            return
        wait_exits(alive, remaining)
