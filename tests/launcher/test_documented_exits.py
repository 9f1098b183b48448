"""Exit codes of `train` that the README documents and no other test reaches end to end: 127 (a rank's
program cannot be started) and 76 (Open MPI announced that the job aborts, and mpirun did not exit)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from smhvd.proc.processes import is_alive

pytestmark = pytest.mark.integration


def test_a_program_that_cannot_be_started_is_127_and_named(train_job):
    """An executable entry point whose interpreter does not exist: exec fails in every rank (real mpirun)."""
    job = train_job("#!/nonexistent/interpreter\n", {"sagemaker_mpi_num_of_processes_per_host": 2}, "run")
    (job.code / "run").chmod(0o755)
    result = job.run(timeout=120)
    assert result.returncode == 127, result.stderr
    failure = job.failure()
    assert failure is not None, result.stderr
    headline, *evidence = failure.splitlines()
    assert re.fullmatch(r"rank [01]( on algo-1)? exited with code 127", headline), failure
    assert f"smhvd.rank: cannot run {job.code / 'run'}: No such file or directory" in evidence, failure
    assert "Traceback" not in result.stderr


# A stand-in for mpirun (named so in the test, the one part not real): Open MPI's abort notice as Open MPI
# 4.1 prints it (help-mpi-btl-tcp.txt / help-mca-bml-r2.txt), then a hang that ignores SIGTERM. Real Open
# MPI hangs so only sometimes (test_container_contract.py's unreachable ranks end with exit 1 here): the
# launcher's side of it, the notice seen, 5 s, SIGTERM, SIGKILL 3 s later, exit 76, is what is tested.
HUNG_MPIRUN = """\
#!/bin/bash
echo $$ > "$HUNG_MPIRUN_PID"
cat >&2 <<'EOF'
--------------------------------------------------------------------------
At least one pair of MPI processes are unable to reach each other for
MPI communications.  This means that no Open MPI device has indicated
that it can be used to communicate between these processes.  This is
an error; Open MPI requires that all MPI processes be able to reach
each other.  This error can sometimes be the result of forgetting to
specify the "self" BTL.

  Process 1 ([[4852,1],0]) is on host: algo-1
  Process 2 ([[4852,1],1]) is on host: algo-1
  BTLs attempted: self

Your MPI job is now going to abort; sorry.
--------------------------------------------------------------------------
EOF
trap '' TERM
sleep 300 &
echo $! > "$HUNG_MPIRUN_PID.child"
wait
"""


def test_an_abort_notice_from_an_mpirun_that_hangs_is_76(train_job, tmp_path: Path):
    job = train_job("print('never runs')\n")
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    (bin_dir / "mpirun").write_text(HUNG_MPIRUN)
    (bin_dir / "mpirun").chmod(0o755)
    pid_file = tmp_path / "mpirun.pid"
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HUNG_MPIRUN_PID": str(pid_file)}
    result = job.run(timeout=120, env=env)
    assert result.returncode == 76, result.stderr
    failure = job.failure()
    assert failure is not None
    assert failure.splitlines()[0] == (
        "MPI aborted the job: At least one pair of MPI processes are unable to reach each other for MPI "
        "communications (mpirun hung after it; ended by the launcher)"
    ), failure
    started = [int(pid_file.read_text()), int(Path(f"{pid_file}.child").read_text())]
    assert not [pid for pid in started if is_alive(pid)]  # SIGTERM was ignored: SIGKILL, and its child too
