import os
import subprocess
import sys
from pathlib import Path

import pytest

from smhvd.config.hardware import count_gpus
from smhvd.mpi.command import MpiPlan
from smhvd.proc.processes import descendants, descendants_of, read_process_table


def test_descendants_of_a_table():
    table = {1: (0, "S"), 10: (1, "S"), 11: (10, "S"), 12: (10, "Z"), 13: (11, "S"), 20: (1, "S")}
    assert descendants_of(10, table) == [11, 12, 13]
    assert descendants_of(13, table) == []


@pytest.mark.integration  # starts processes
def test_descendants_of_this_process_are_real():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert child.pid in descendants()
        assert read_process_table()[child.pid][0] == os.getpid()
    finally:
        child.kill()
        child.wait()


def test_hostfile_and_gpu_count():
    plan = MpiPlan(8, Path("hostfile"), Path(), (), hosts=("algo-1", "algo-2"), slots=8, ssh_config=Path("c"))
    assert plan.hostfile_text == "algo-1 slots=8\nalgo-2 slots=8\n"
    assert count_gpus(["0000:00:1e.0", "0000:00:1f.0"], []) == 2
    assert count_gpus([], ["nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"]) == 2
    assert count_gpus([], []) == 0


# A process that forks children (each sleeping, SIGTERM ignored) as fast as it can, for as long as it lives:
# what a rank starting its own helpers looks like at the moment its launcher ends it.
FORKER = """
import os, signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("forking", flush=True)
while True:
    if os.fork() == 0:
        time.sleep(300)
        os._exit(0)
"""
# A launcher in miniature: a subreaper with the forker below it, which then ends every descendant.
ENDS_ITS_TREE = f"""
import subprocess, sys
from smhvd.proc.processes import become_subreaper, kill_descendants
become_subreaper()
forker = subprocess.Popen([sys.executable, "-c", {FORKER!r}], stdout=subprocess.PIPE)
forker.stdout.readline()
kill_descendants()
"""


@pytest.mark.integration  # starts processes
def test_ending_the_descendants_takes_what_they_fork_while_they_are_killed() -> None:
    """A descendant that forks while it is being killed leaves children the first look did not see; they are
    re-parented to the subreaper, and must be killed too (a rank's helper once outlived `train` so, in CI)."""
    marker = f"smhvd-test-{os.getpid()}-forks"
    subprocess.run(
        [sys.executable, "-c", ENDS_ITS_TREE],
        env={**os.environ, "SMHVD_TEST_MARKER": marker},
        timeout=60,
        check=True,
    )
    left = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "environ").read_bytes():
                left.append(int(entry.name))
        except OSError:
            continue
    for pid in left:
        os.kill(pid, 9)
    assert left == []
