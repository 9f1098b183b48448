"""Signals as events: the one dispatch the supervisor (leader) and the worker share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from smhvd.proc.signals import Received, SignalWatch


def test_signals_arrive_as_one_event_each_and_the_first_stop_is_kept() -> None:
    with SignalWatch() as watch:
        for sig in (signal.SIGUSR1, signal.SIGINT, signal.SIGTERM):
            os.kill(os.getpid(), sig)
        assert watch.receive(()) == Received(stop=signal.SIGINT, dump=True, child=False)
        assert watch.receive(()) == Received()


@pytest.mark.integration  # starts processes
def test_sigchld_reaps_orphans_but_not_the_children_we_wait_for() -> None:
    with SignalWatch() as watch:
        ours = subprocess.Popen([sys.executable, "-c", "pass"])
        ours.wait()  # reaped by its owner; the event still says a child exited
        kept = subprocess.Popen([sys.executable, "-c", "pass"])
        os.waitid(os.P_PID, kept.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped
        orphan_like = subprocess.Popen([sys.executable, "-c", "pass"])
        os.waitid(os.P_PID, orphan_like.pid, os.WEXITED | os.WNOWAIT)
        got = watch.receive([kept.pid])
        assert got.child
        # The kept child is still a zombie whose status is ours to take; the other one was reaped.
        assert os.waitid(os.P_PID, kept.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        try:
            os.waitid(os.P_PID, orphan_like.pid, os.WEXITED | os.WNOHANG)
            raise AssertionError("the child that nobody waits for was not reaped")
        except ChildProcessError:
            pass
        kept.wait(timeout=5)
