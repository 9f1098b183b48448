"""SIGUSR1 to `train` while every rank floods its output (whole lines, or a progress bar that never ends its
line): each rank's stack file is written all the same. The leader's loop reads the flood and the signal from
the same poll; the dump runs beside it (report/stacks.py).

Each rank says it runs with a file, not with a line of output: under a flood, when another rank's line
comes through mpirun is not what this test is about. Nor is speed: while 2 ranks flood 2 cores, starting any
process (the dump's, py-spy) was measured to wait 5-60 s, so the files get the dump's own bound and more. The
flood lasts until the test kills `train` (nothing of the job outlives it: test_nothing_outlives), so a slow
machine cannot end it before the dump. What `train` writes is read all along, as a terminal or a log collector
does, and only the launcher's own lines are kept (a minute of flood would be gigabytes)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO

import pytest

from smhvd.errors import WaitTimeout
from smhvd.proc.waiting import NotYet, wait_until
from smhvd.report.stacks import HOST_DUMP_TIMEOUT
from support.rank_ready import SAY_READY, ranks_ready

pytestmark = pytest.mark.integration

TRAIN = Path(sys.executable).parent / "train"
FLOOD = """import sys
n = 0
while True:
    n += 1
    sys.{stream}.write(f"step {{n}} " + "x" * 100 + "{end}")
"""
FLOODS = {
    "lines-on-stdout": SAY_READY + FLOOD.format(stream="stdout", end="\\n"),
    "lines-on-stderr": SAY_READY + FLOOD.format(stream="stderr", end="\\n"),
    "progress-bar": SAY_READY + FLOOD.format(stream="stdout", end="\\r"),
}
RANKS = 2


def dumped(stacks: Path) -> list[str]:
    files = sorted(path.name for path in stacks.glob("*-rank*.txt"))
    if len(files) < RANKS or not (stacks / "summary.txt").exists():
        raise NotYet(f"stack files so far: {files}")
    return files


def launcher_lines(stream: IO[bytes], kept: list[str]) -> None:
    """Read `stream` to its end; keep the launcher's own lines ('[smhvd ...'), drop the flood."""
    for line in stream:
        if line.startswith(b"[smhvd"):
            kept.append(line.decode(errors="replace").rstrip())


@pytest.mark.parametrize("flood", sorted(FLOODS))
def test_sigusr1_during_a_flood_of_output_dumps_every_rank(train_job, flood):
    job = train_job(FLOODS[flood], {"sagemaker_mpi_num_of_processes_per_host": RANKS})
    data = job.paths.base / "output" / "data"
    train = subprocess.Popen([str(TRAIN)], env=job.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said: list[str] = []
    readers = [
        threading.Thread(target=launcher_lines, args=(stream, said), daemon=True)
        for stream in (train.stdout, train.stderr)
    ]
    for reader in readers:
        reader.start()
    try:
        wait_until(lambda: ranks_ready(data, RANKS), what="both ranks to run", timeout=120)
        train.send_signal(signal.SIGUSR1)
        try:
            bound = HOST_DUMP_TIMEOUT + 30
            files = wait_until(lambda: dumped(data / "stacks"), what="both ranks' stack files", timeout=bound)
        except WaitTimeout as exc:
            train.kill()
            train.wait()
            for reader in readers:
                reader.join(10)
            pytest.fail(f"{exc}; the launcher said: {said[-12:]}")
        assert files == ["algo-1-rank0.txt", "algo-1-rank1.txt"]
        assert "step" not in (data / "stacks" / "summary.txt").read_text()  # it names frames, not output
        assert "(train.py:" in (data / "stacks" / "algo-1-rank0.txt").read_text()
    finally:
        train.kill()
        train.wait()
