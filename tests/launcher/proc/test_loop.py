"""The launcher's one event loop (proc/loop.py) with real pipes and processes: a process's output is followed
until it exits (not until a child it left holds its pipe closed), a deadline ends the wait, and once a
callback stops the loop nothing more is handled."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smhvd.proc.loop import Loop, Scope, follow_output, wait_exits
from smhvd.proc.timers import Timer, Timers

# Writes to both streams, leaves a child holding them open (writing nothing), and exits.
LEAVES_A_CHILD = (
    "import subprocess, sys\n"
    "subprocess.Popen(['sleep', '300'])\n"
    "sys.stdout.write('out\\n' * 1000); sys.stderr.write('err\\n')\n"
)


def start(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )


def end(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, 9)
    proc.wait()
    for stream in (proc.stdout, proc.stderr):
        assert stream is not None
        stream.close()


@pytest.mark.integration
def test_output_is_followed_until_the_process_exits_not_until_its_pipes_close() -> None:
    proc = start(LEAVES_A_CHILD)
    assert proc.stdout is not None and proc.stderr is not None
    got: dict[int, bytes] = {proc.stdout.fileno(): b"", proc.stderr.fileno(): b""}

    def keep(fd: int, chunk: bytes) -> None:
        got[fd] += chunk

    try:
        started = time.monotonic()
        assert follow_output(proc.pid, list(got), keep) is True
        assert time.monotonic() - started < 60  # the sleeping child still holds both pipes: only a hang
        assert got == {proc.stdout.fileno(): b"out\n" * 1000, proc.stderr.fileno(): b"err\n"}
    finally:
        end(proc)


@pytest.mark.integration
def test_a_deadline_ends_the_wait_and_timers_run_meanwhile() -> None:
    proc = start("import time; print('started', flush=True); time.sleep(300)")
    assert proc.stdout is not None
    timers = Timers()
    ticks: list[float] = []
    timers.every(Timer("tick"), 0.05, lambda: ticks.append(time.monotonic()))
    try:
        exited = follow_output(
            proc.pid, [proc.stdout.fileno()], lambda _fd, _chunk: None, timers, time.monotonic() + 0.5
        )
        assert exited is False
        assert proc.poll() is None  # the wait ended; the process is its owner's to end
        assert len(ticks) >= 2
    finally:
        end(proc)


def test_nothing_is_handled_after_stop_and_a_forgotten_file_is_skipped() -> None:
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    os.write(w1, b"x")
    os.write(w2, b"x")
    calls: list[str] = []
    try:
        with Loop() as whole, whole.scope() as loop:

            def first() -> None:  # whichever the selector hands out first ends the loop
                calls.append("stop")
                loop.stop()

            loop.reader(r1, first)
            loop.reader(r2, first)
            loop.timers.after(Timer("late"), 0, lambda: calls.append("timer"))
            loop.run()  # the timer, due at once, fires before the first wait
        assert calls == ["timer", "stop"]

        calls.clear()
        with Loop() as whole, whole.scope() as loop:

            def forget_other(mine: int, other: int) -> None:
                calls.append("read")
                os.read(mine, 1)
                loop.forget(other)
                loop.timers.after(Timer("end"), 0.05, loop.stop)

            loop.reader(r1, lambda: forget_other(r1, r2))
            loop.reader(r2, lambda: forget_other(r2, r1))
            loop.run()
        assert calls == ["read"]
    finally:
        for fd in (r1, w1, r2, w2):
            os.close(fd)


def test_a_timer_that_stops_the_loop_is_the_last_one_handled_even_among_timers_due_together() -> None:
    """loop.py says: once stopped, nothing more is handled, due timers neither. Two timers of one scope due in
    the same round, and two scopes' timers: the first one's stop ends the round (issue 46: the second fired
    anyway, as Timers.fire_due ran every due callback of its round)."""
    for shared in (True, False):
        fired: list[str] = []
        with Loop() as whole, whole.scope() as first, whole.scope() as second:
            other = first if shared else second

            def stops(fired: list[str] = fired, first: Scope = first) -> None:
                fired.append("stops")
                first.stop()

            first.timers.at(Timer("stops"), 0, stops)
            other.timers.at(Timer("due too"), 1, functools.partial(fired.append, "due too"))  # already due
            whole.run()
        assert fired == ["stops"], shared


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.integration
def test_a_forgotten_process_exit_holds_no_fd() -> None:
    """exit_of + forget, 100 times on one loop (as a leader's retried ssh attempts): the fds held do not grow
    (before forget closed the pidfd: 100 more, one a process until the loop ended)."""
    with Loop() as whole, whole.scope() as loop:
        before = open_fds()
        for _ in range(100):
            proc = subprocess.Popen(["true"])
            pidfd = loop.exit_of(proc.pid, loop.stop)
            loop.run()
            loop.forget(pidfd)
            proc.wait()
        assert open_fds() == before
        watched = loop.exit_of(os.getpid(), loop.stop)  # one still watched is held, until the scope ends
        assert open_fds() == before + 1
    assert not _is_open(watched)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.mark.integration
def test_follow_outputs_deadline_leaves_the_callers_timers_alone() -> None:
    """The caller's own timers go on beside follow_output's deadline, whatever their labels: before handles, a
    caller's "deadline" was replaced by follow_output's (never fired) and cancelled at its end."""
    timers = Timers()
    fired: list[str] = []
    soon = time.monotonic() + 0.05
    timers.at(Timer("deadline"), soon, lambda: fired.append("caller's deadline"))
    timers.at(Timer("deadline"), soon, lambda: fired.append("caller's handle"))
    proc = subprocess.Popen(["sleep", "0.5"])
    try:
        assert follow_output(proc.pid, [], lambda fd, chunk: None, timers, deadline=time.monotonic() + 60)
    finally:
        proc.wait()
    assert sorted(fired) == ["caller's deadline", "caller's handle"]


@pytest.mark.integration
def test_wait_exits_waits_for_children_and_others_and_gives_up_at_its_timeout() -> None:
    # A child, and a process that is not one (a grandchild, its parent gone), each ending 0.3 s from now.
    child = subprocess.Popen(["sleep", "0.3"])
    leaves = ["sh", "-c", "sleep 0.3 >/dev/null 2>&1 & echo $!"]
    grandchild = int(subprocess.run(leaves, capture_output=True, text=True, check=True).stdout)
    began = time.monotonic()
    assert wait_exits([child.pid, grandchild], timeout=30)
    assert 0.2 < time.monotonic() - began < 10  # waited for them, and not to the timeout
    assert child.wait() == 0
    assert wait_exits([child.pid], timeout=30)  # a process gone already

    long = subprocess.Popen(["sleep", "30"])
    try:
        began = time.monotonic()
        assert not wait_exits([long.pid], timeout=0.2)
        assert 0.15 < time.monotonic() - began < 10
    finally:
        long.kill()
        long.wait()


def test_scopes_side_by_side_and_a_closed_scope_leaves_nothing() -> None:
    """A long-lived scope (as the host environment's server) is served whenever another scope's wait runs the
    loop; a closed scope's files, timers and pidfds are gone, whatever it left set."""
    r_long, w_long = os.pipe()
    r_wait, w_wait = os.pipe()
    heard: list[str] = []
    try:
        with Loop() as whole, whole.scope() as standing:
            standing.reader(r_long, lambda: heard.append(os.read(r_long, 10).decode()))
            with whole.scope() as waiting:
                os.write(w_long, b"a")  # for the standing scope, during the wait's run
                waiting.timers.after(Timer("end"), 0.2, waiting.stop)
                waiting.reader(r_wait, lambda: heard.append("the closed scope's reader"))
                waiting.run()
                assert heard == ["a"]
                waiting.timers.after(Timer("left set"), 0, lambda: heard.append("the closed scope's timer"))
                pidfd = waiting.exit_of(os.getpid(), lambda: None)
            assert not _is_open(pidfd)
            os.write(w_wait, b"x")  # readable now: nobody must be called for it
            with whole.scope() as later:
                os.write(w_long, b"b")
                later.timers.after(Timer("end"), 0.2, later.stop)
                later.run()
            assert heard == ["a", "b"]
    finally:
        for fd in (r_long, w_long, r_wait, w_wait):
            os.close(fd)


def test_a_wait_cannot_run_inside_another() -> None:
    raised: list[BaseException] = []
    with Loop() as whole, whole.scope() as outer:

        def nested() -> None:
            try:
                outer.run()
            except RuntimeError as exc:
                raised.append(exc)
            outer.stop()

        outer.timers.after(Timer("nested"), 0, nested)
        outer.run()
    assert len(raised) == 1 and "cannot run inside another" in str(raised[0])


SRC = Path(__file__).resolve().parents[3] / "src" / "smhvd"


def _calls_and_imports(path: Path) -> tuple[set[str], set[str]]:
    """The names called (`Loop(...)`, `loop.Loop(...)`) and the modules imported in one source file."""
    called: set[str] = set()
    imported: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            called.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
        elif isinstance(node, ast.Import):
            imported.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    return called, imported


def test_one_loop_a_process_and_no_thread_but_the_stack_dumps() -> None:
    """The launcher's source makes a Loop in one place (process_loop: every wait is a scope of it) and
    starts threads in one module (report/stacks.py: py-spy for each rank). A second loop or a serving thread
    fails here. inflight/record.py runs in the training script's own process and takes a lock there (its
    steps are recorded from TensorFlow's threads), never starting a thread."""
    makes_loops, threads = [], []
    for path in sorted(SRC.rglob("*.py")):
        called, imported = _calls_and_imports(path)
        where = str(path.relative_to(SRC))
        if "Loop" in called:
            makes_loops.append(where)
        if imported & {"threading", "_thread", "concurrent.futures"}:
            threads.append(where)
    assert makes_loops == ["proc/loop.py"]
    assert threads == ["inflight/record.py", "report/stacks.py"]
    assert "start_new_thread" not in (SRC / "inflight" / "record.py").read_text()
