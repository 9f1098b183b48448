"""A stop (SIGTERM to `train`) takes a stack dump of every rank before the ranks get SIGTERM, and the leader's
loop runs on while that dump is taken: the ranks' output still reaches the log, heartbeats still go to the
workers, a second stop is still heard. Before, the loop waited for the dump (up to 8 s) in a callback.

Real parts: `train` on one host, two ranks, the real py-spy behind a `py-spy` first on PATH that takes 2 s
before it runs it (stacks.py runs the py-spy it finds on PATH), as it can on a loaded host. The launcher's
log and the ranks' output come through one pipe, so their order in it is the order the launcher wrote them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from smhvd.proc.waiting import wait_until
from support.rank_ready import SAY_READY, ranks_ready

pytestmark = pytest.mark.integration

TRAIN = Path(sys.executable).parent / "train"
SLOW_DUMP = 2.0  # well within STOP_DUMP_WAIT (8 s), with py-spy's own time on a loaded machine
JOB = (
    SAY_READY
    + """import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("saw SIGTERM", flush=True), sys.exit(0)))
n = 0
while True:
    n += 1
    print(f"tick {n}", flush=True)
    time.sleep(0.05)
"""
)


def slow_py_spy(where: Path) -> Path:
    real = Path(sys.executable).with_name("py-spy")
    shim = where / "py-spy"
    shim.write_text(f'#!/bin/sh\nsleep {SLOW_DUMP}\nexec "{real}" "$@"\n')
    shim.chmod(0o755)
    return where


def test_the_loop_runs_while_a_stops_dump_is_taken(train_job, tmp_path: Path) -> None:
    job = train_job(JOB, {"sagemaker_mpi_num_of_processes_per_host": 2})
    data = job.paths.base / "output" / "data"
    shims = slow_py_spy(tmp_path)
    env = job.env({"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"})
    one_pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    train = subprocess.Popen([str(TRAIN)], env=env, **one_pipe)
    try:
        wait_until(lambda: ranks_ready(data, 2), what="both ranks to run", timeout=120)
        train.send_signal(signal.SIGTERM)
        out, _ = train.communicate(timeout=120)
    finally:
        train.kill()
        train.wait()
    lines = out.splitlines()

    def first(text: str) -> int:
        return next(i for i, line in enumerate(lines) if text in line)

    asked = first("taking a stack dump of every rank (stopped by SIGTERM)")
    dumped = first("stack dump (stopped by SIGTERM): ranks 0,1 on algo-1 in <module> (train.py:")
    stopped = first("stopped by SIGTERM: SIGTERM sent to 2 local rank(s)")
    assert asked < dumped < stopped, lines[asked:]  # the stacks are taken before the ranks are stopped
    meanwhile = [line for line in lines[asked:stopped] if "<stdout>: tick" in line]
    # 2 s of a tick every 0.05 s from each rank: their output came through while the dump was taken.
    assert len(meanwhile) >= 10, lines[asked : stopped + 1]
    assert sum("saw SIGTERM" in line for line in lines[stopped:]) == 2
    assert train.returncode != 0
