"""Nothing of a job outlives its `train`, whatever is killed: `train` itself by SIGKILL (proc/keeper.py) or
mpirun alone, while the ranks ignore SIGTERM, keep a child, or keep a child in a session of its own; before
the ranks started or while they run. Every process the job started carries a marker in its environment, and
none may be left END_BOUND_SECONDS after the kill (the bound README's exit codes state)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from smhvd.proc.keeper import END_BOUND_SECONDS
from smhvd.proc.waiting import NotYet, wait_until

pytestmark = pytest.mark.integration

IGNORES_TERM = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
CHILD = (
    "import subprocess, sys\n"
    "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
    "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)'], start_new_session={session})\n"
)
SCRIPTS = {
    "ignores-sigterm": IGNORES_TERM,
    "keeps-a-child": IGNORES_TERM + CHILD.format(session=False),
    "keeps-a-child-in-its-own-session": IGNORES_TERM + CHILD.format(session=True),
}
READY = "print('ready', flush=True)\ntime.sleep(300)\n"
TRAIN = Path(sys.executable).parent / "train"


def marked(marker: str) -> dict[int, str]:
    """pid -> command line of every live process whose environment carries the marker."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or marker.encode() not in (entry / "environ").read_bytes():
                continue
            stat = (entry / "stat").read_text()
            if stat[stat.rfind(")") + 2] != "Z":
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def start(job, marker: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [str(TRAIN)],
        env=job.env({"SMHVD_TEST_MARKER": marker}),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def none_left(marker: str) -> bool:
    if left := marked(marker):
        raise NotYet(f"still running: {sorted(left.values())}")
    return True


@pytest.mark.parametrize("moment", ["ranks-running", "mpirun-starting"])
@pytest.mark.parametrize("killed", ["train", "mpirun"])
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_a_killed_job_leaves_no_process(train_job, script, killed, moment):
    job = train_job(SCRIPTS[script] + READY, {"sagemaker_mpi_num_of_processes_per_host": 2})
    marker = f"smhvd-test-{uuid.uuid4().hex}"
    train = start(job, marker)
    try:
        assert train.stdout is not None
        if moment == "ranks-running":
            # range first: zip stops there, without waiting for a third line
            ready = sorted(line for _, line in zip(range(2), train.stdout, strict=False))
            assert ready == [f"[{rank},algo-1]<stdout>: ready\n" for rank in (0, 1)]
        else:
            wait_until(
                lambda: any(cmd.startswith("mpirun") for cmd in marked(marker).values()) or None,
                what="mpirun to start",
                timeout=60,
            )
        if killed == "train":
            train.kill()
        else:
            for pid, cmd in marked(marker).items():
                if cmd.startswith("mpirun"):
                    os.kill(pid, signal.SIGKILL)
        # killed: as the shell sees it; mpirun killed: the launcher's exit with mpirun's death
        assert train.wait(timeout=60) == (-signal.SIGKILL if killed == "train" else 128 + signal.SIGKILL)
        wait_until(lambda: none_left(marker), what="the job's processes to end", timeout=END_BOUND_SECONDS)
    finally:
        train.kill()
        for pid in marked(marker):  # whatever a failed assertion left: not for the next test
            os.kill(pid, signal.SIGKILL)
