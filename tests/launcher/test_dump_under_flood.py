"""SIGUSR1 to `train` while every rank floods its output (whole lines, or a progress bar that never ends its
line): each rank's stack file is written all the same. The leader's loop reads the flood and the signal from
the same poll; the dump runs beside it (report/stacks.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from smhvd.proc.waiting import NotYet, wait_until

pytestmark = pytest.mark.integration

TRAIN = Path(sys.executable).parent / "train"
FLOOD = """
import sys, time
print("ready", flush=True)
end, n = time.monotonic() + 60, 0
while time.monotonic() < end:
    n += 1
    sys.{stream}.write(f"step {{n}} " + "x" * 100 + "{end}")
"""
FLOODS = {
    "lines-on-stdout": FLOOD.format(stream="stdout", end="\\n"),
    "lines-on-stderr": FLOOD.format(stream="stderr", end="\\n"),
    "progress-bar": FLOOD.format(stream="stdout", end="\\r"),
}


def dumped(stacks: Path) -> list[str]:
    files = sorted(path.name for path in stacks.glob("*-rank*.txt"))
    if len(files) < 2 or not (stacks / "summary.txt").exists():
        raise NotYet(f"stack files so far: {files}")
    return files


@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_sigusr1_during_a_flood_of_output_dumps_every_rank(train_job, flood):
    job = train_job(FLOODS[flood], {"sagemaker_mpi_num_of_processes_per_host": 2})
    train = subprocess.Popen([str(TRAIN)], env=job.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert train.stdout is not None and train.stderr is not None
        log: list[bytes] = []  # both streams read all along, as a terminal or a log collector does
        threading.Thread(target=lambda: log.append(train.stderr.read()), daemon=True).start()
        ready = 0
        for line in train.stdout:
            ready += line.endswith(b"<stdout>: ready\n")
            if ready == 2:
                break
        threading.Thread(target=train.stdout.read, daemon=True).start()
        train.send_signal(signal.SIGUSR1)
        stacks = job.paths.base / "output" / "data" / "stacks"
        files = wait_until(lambda: dumped(stacks), what="both ranks' stack files", timeout=60)
        assert files == ["algo-1-rank0.txt", "algo-1-rank1.txt"]
        assert "step" not in (stacks / "summary.txt").read_text()  # the summary names frames, not output
        assert "(train.py:" in (stacks / "algo-1-rank0.txt").read_text()
    finally:
        train.kill()
        train.wait()
