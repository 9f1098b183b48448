"""The leader-worker link without ssh: the real relay process feeding a real LinkWaiter (its socket in the
worker's private directory, proc/trust.py)."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from smhvd import wire
from smhvd.errors import EX_UNAVAILABLE, PeerError
from smhvd.mpi.supervisor import Dumps
from smhvd.proc import trust
from smhvd.proc.signals import SignalWatch
from smhvd.proc.waiting import wait_until
from smhvd.roles import hostenv
from smhvd.roles.worker import LinkWaiter, Verdict, listening

pytestmark = pytest.mark.integration
PORT = 47000 + os.getpid() % 1000  # a directory of our own


def relay() -> subprocess.Popen[bytes]:
    """What the leader starts over ssh on the worker: `python -m smhvd.link PORT`."""
    return subprocess.Popen(
        [sys.executable, "-m", "smhvd.link", str(PORT)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def ready(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout.readline() == wire.READY


@pytest.fixture
def waiter():
    place = trust.directory(PORT)
    with hostenv.serving(place, {}), listening(place) as server, SignalWatch() as watch:
        yield lambda timeout=10.0: LinkWaiter(server, "algo-1", timeout, watch)
    assert not place.exists()


def say(proc: subprocess.Popen[bytes], *events: dict[str, object]) -> None:
    """The leader's words to the relay, in order."""
    assert proc.stdin is not None
    proc.stdin.write(b"".join(wire.encode(event) for event in events))
    proc.stdin.flush()


def started(w: LinkWaiter) -> subprocess.Popen[bytes]:
    """A relay that told the worker the job started, once the worker saw it."""
    proc = relay()
    ready(proc)
    say(proc, {"event": "start"})
    wait_until(lambda: w.started or None, what="the worker to see the start", timeout=60)
    return proc


def wait_in_background(w: LinkWaiter):
    result: dict[str, object] = {}

    def run():
        try:
            result["verdict"] = w.wait([])
        except PeerError as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread, result


def test_end_event_gives_the_job_exit_code_and_reason(waiter):
    thread, result = wait_in_background(waiter())
    proc = relay()
    ready(proc)
    proc.stdin.write(
        wire.encode({"event": "start"}) + wire.encode({"event": "end", "exit_code": 7, "reason": "r"})
    )
    proc.stdin.flush()
    thread.join(10)
    assert result == {"verdict": Verdict(7, "r")}
    proc.stdin.close()
    assert proc.wait(5) == 0


def test_link_closing_mid_job_means_the_leader_was_lost_and_is_noticed_at_once(waiter):
    """No silence limit can end this wait (an hour): the verdict, and its reason, can only come from the
    closed link. How fast it comes is benchmarks/cluster_faults.py's ("leader's processes killed"); the 60 s
    here only catch a hang."""
    w = waiter()
    w.silence_limit = 3600.0
    thread, result = wait_in_background(w)
    proc = started(w)
    proc.kill()
    thread.join(60)
    assert not thread.is_alive(), "the closed link was not noticed"
    verdict = result["verdict"]
    assert verdict.exit_code == EX_UNAVAILABLE
    assert verdict.reason.startswith(
        "lost the leader algo-1 during the job: its link closed without a result"
    ), verdict.reason


def test_an_attempt_abandoned_before_start_is_not_a_failure_and_the_wait_is_bounded(waiter):
    thread, result = wait_in_background(waiter(timeout=1.5))
    first = relay()
    ready(first)
    first.kill()  # e.g. the leader's attempt timed out: the worker keeps waiting
    first.wait()
    thread.join(10)
    assert "verdict" not in result
    assert str(result["error"]) == (
        "the leader algo-1 did not start the job within 1.5s (launcher_leader_timeout_seconds)"
    )


def test_a_hundred_abandoned_attempts_leave_the_worker_holding_no_more_fds(waiter):
    """The leader's retried attempts, each a connection to this worker's link socket that ends before the
    job starts: after 100 of them the worker holds as many fds as after the first."""
    w = waiter(timeout=120)
    thread, result = wait_in_background(w)
    held = []
    try:
        for _ in range(100):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as attempt:
                attempt.connect(str(trust.directory(PORT) / trust.LINK_SOCKET))
                wait_until(lambda: w.buffers or None, what="the worker to take the attempt", timeout=60)
            wait_until(lambda: not w.buffers or None, what="the worker to drop the attempt", timeout=60)
            held.append(len(os.listdir("/proc/self/fd")))
    finally:
        proc = relay()  # the leader's end, to end the wait
        ready(proc)
        say(proc, {"event": "start"}, {"event": "end", "exit_code": 0, "reason": ""})
        proc.communicate(timeout=30)
        thread.join(30)
    assert result["verdict"] == Verdict(0, "")
    print(f"fds held after the 1st, 50th and 100th attempt: {held[0]}, {held[49]}, {held[99]}")
    assert set(held) == {held[0]}


def test_relay_without_a_waiting_launcher_fails_clearly():
    proc = relay()
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 69  # EX_UNAVAILABLE: no launcher waits on this host
    assert b"no launcher is waiting on this host" in err


def test_heartbeats_keep_the_job_alive_and_silence_means_the_leader_is_gone(waiter):
    """A leader host that vanishes closes nothing: the worker notices that its heartbeats stopped.
    The product's leader speaks every 2 s against a 10 s limit (wire.py); here every 0.1 s against 3 s, for
    longer than the limit: only a 3 s stall of the relay or the waiter (a hang, not a loaded machine) could
    end the wait while they come."""
    w = waiter()
    w.silence_limit = 3.0
    thread, result = wait_in_background(w)
    proc = started(w)
    until = time.monotonic() + 4.0
    while time.monotonic() < until:
        say(proc, {"event": "alive"})
        last_word = time.monotonic()
        thread.join(0.1)
        assert thread.is_alive(), result
    thread.join(60)  # the session stays open, but nothing more is said
    assert not thread.is_alive(), "the silence was not noticed"
    silent = time.monotonic() - last_word
    verdict = result["verdict"]
    assert verdict.exit_code == EX_UNAVAILABLE
    assert verdict.reason.startswith("lost the leader algo-1 during the job: no word from it for 3s")
    # The limit counts from the last word received, which came after it was written: never sooner.
    assert silent >= 3.0
    proc.kill()


def test_a_slow_stack_dump_does_not_silence_the_leader(waiter):
    """SIGUSR1 to a worker's `train` while its py-spy takes longer than the silence limit (a loaded host): the
    worker's loop goes on reading the leader's heartbeats, so the job goes on and ends with the leader's
    verdict. The dump ran in the worker loop's callback before: no heartbeat was read, and once it returned
    the silence timer, due first, declared the leader lost."""
    dumping = threading.Event()
    finished = os.eventfd(0, os.EFD_NONBLOCK)

    def slow_dump(_why: str) -> None:  # as StackDumper.start: in the background, `finished` said at its end
        def run() -> None:
            dumping.set()
            time.sleep(2.5)
            os.eventfd_write(finished, 1)

        threading.Thread(target=run, daemon=True).start()

    w = waiter()
    w.silence_limit = 1.5
    w.dumps = Dumps(slow_dump, finished)
    thread, result = wait_in_background(w)
    proc = started(w)
    os.kill(os.getpid(), signal.SIGUSR1)  # the worker's SignalWatch: its loop starts the dump
    assert dumping.wait(30)
    until = time.monotonic() + 3.5  # past the dump's end
    while time.monotonic() < until:
        say(proc, {"event": "alive"})
        thread.join(0.1)
        assert thread.is_alive(), result
    say(proc, {"event": "end", "exit_code": 0, "reason": ""})
    thread.join(30)
    os.close(finished)
    assert result == {"verdict": Verdict(0, "")}
    proc.stdin.close()
    assert proc.wait(5) == 0
