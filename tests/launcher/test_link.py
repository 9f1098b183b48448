"""The leader-worker link without ssh: the real relay process feeding a real LinkWaiter (its socket in the
worker's private directory, proc/trust.py)."""

import os
import subprocess
import sys
import time

import pytest

from smhvd import wire
from smhvd.errors import EX_UNAVAILABLE, PeerError
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


def wait_in_background(w: LinkWaiter):
    import threading

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
    w = waiter()
    thread, result = wait_in_background(w)
    proc = relay()
    ready(proc)
    proc.stdin.write(wire.encode({"event": "start"}))
    proc.stdin.flush()
    wait_until(lambda: w.started or None, what="the worker to see the start", timeout=10)
    closed = time.monotonic()
    proc.kill()
    thread.join(10)
    noticed = time.monotonic() - closed
    verdict = result["verdict"]
    assert verdict.exit_code == EX_UNAVAILABLE
    assert verdict.reason.startswith("lost the leader algo-1 during the job")
    assert noticed < 1.0


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


def test_relay_without_a_waiting_launcher_fails_clearly():
    proc = relay()
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 69  # EX_UNAVAILABLE: no launcher waits on this host
    assert b"no launcher is waiting on this host" in err


def test_heartbeats_keep_the_job_alive_and_silence_means_the_leader_is_gone(waiter):
    """A leader host that vanishes closes nothing: the worker notices that its heartbeats stopped."""
    w = waiter()
    w.silence_limit = 1.0
    thread, result = wait_in_background(w)
    proc = relay()
    ready(proc)
    proc.stdin.write(wire.encode({"event": "start"}))
    proc.stdin.flush()
    for _ in range(4):  # 2 s of heartbeats every 0.5 s: longer than the limit, but never silent
        proc.stdin.write(wire.encode({"event": "alive"}))
        proc.stdin.flush()
        last_word = time.monotonic()
        thread.join(0.5)
        assert thread.is_alive()
    thread.join(10)  # the session stays open, but nothing more is said
    verdict = result["verdict"]
    assert verdict.exit_code == EX_UNAVAILABLE
    assert verdict.reason.startswith("lost the leader algo-1 during the job: no word from it for 1s")
    assert 0.9 < time.monotonic() - last_word < 5
    proc.kill()
