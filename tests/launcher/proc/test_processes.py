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
