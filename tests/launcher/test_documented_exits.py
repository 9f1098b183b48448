"""What the README documents of `train` and no other test reaches end to end: exits 127 (a rank's program
cannot be started) and 76 (Open MPI announced that the job aborts, and mpirun did not exit), 143 for SIGINT
and SIGHUP as for SIGTERM, the failure file's first writer winning over the launcher, and the EFA probe's
timeout."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from smhvd.proc.processes import is_alive
from smhvd.proc.waiting import wait_until

TRAIN = Path(sys.executable).parent / "train"

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
    assert re.fullmatch(r"rank [01] on algo-1 exited with code 127", headline), failure
    assert f"smhvd.rank: cannot run {job.code / 'run'}: No such file or directory" in evidence, failure
    assert "Traceback" not in result.stderr


def first_on_path(tmp_path: Path, name: str, script: str) -> str:
    """PATH with a stand-in program `name` (the script) first."""
    bin_dir = tmp_path / "stand-ins"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / name).write_text(script)
    (bin_dir / name).chmod(0o755)
    return f"{bin_dir}:{os.environ['PATH']}"


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
    pid_file = tmp_path / "mpirun.pid"
    env = {"PATH": first_on_path(tmp_path, "mpirun", HUNG_MPIRUN), "HUNG_MPIRUN_PID": str(pid_file)}
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


CHECKPOINTS_ON_SIGTERM = """
import os, signal, sys, time
from pathlib import Path
rank = os.environ["OMPI_COMM_WORLD_RANK"]
ckpt = Path(os.environ["SM_CHECKPOINT_DIR"])
def save(signum, frame):
    (ckpt / f"rank-{rank}.ckpt").write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
(ckpt / f"ready-{rank}").write_text("")
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_ctrl_c_or_a_closed_terminal_stops_a_running_job_as_sigterm_does(train_job, sig):
    """README, exit 143: 'stopped by SIGTERM (also SIGINT or SIGHUP)'; every rank gets SIGTERM and can
    checkpoint (test_train_one_host.py does SIGTERM)."""
    job = train_job(CHECKPOINTS_ON_SIGTERM, {"sagemaker_mpi_num_of_processes_per_host": 2})
    train = job.start(stdout=subprocess.DEVNULL)
    ckpt = job.paths.checkpoint_dir

    def ready() -> bool | None:
        assert train.poll() is None, train.communicate()[1]
        return True if all((ckpt / f"ready-{rank}").exists() for rank in (0, 1)) else None

    wait_until(ready, what="both ranks to run", timeout=120)
    train.send_signal(sig)
    _, stderr = train.communicate(timeout=60)
    assert train.returncode == 143, stderr
    assert {p.name: p.read_text() for p in ckpt.glob("*.ckpt")} == {
        "rank-0.ckpt": "SIGTERM",
        "rank-1.ckpt": "SIGTERM",
    }
    failure = job.failure()
    assert failure is not None, failure
    assert failure.splitlines()[0].startswith(f"stopped by {sig.name} while the script ran"), failure


def test_a_reason_the_script_wrote_is_the_failure_file_whatever_the_launcher_would_say(train_job):
    """README: the failure file is written once, the first writer wins."""
    job = train_job(
        """
        import os, sys, time
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            with open(os.path.join(os.environ["SM_OUTPUT_DIR"], "failure"), "w") as f:
                f.write("shard 7 is corrupt: re-run the export job")
            print("giving up", file=sys.stderr)
            sys.exit(3)
        time.sleep(120)
        """,
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    result = job.run(timeout=120)
    assert result.returncode == 3, result.stderr
    assert job.failure() == "shard 7 is corrupt: re-run the export job"
    assert "rank 1 on algo-1 exited with code 3" in result.stderr  # the launcher's reason: in the log only


# A stand-in for libfabric's fi_info (no EFA device here) that never answers, with a child of its own.
SILENT_FI_INFO = """\
#!/bin/bash
sleep 300 &
echo $! > "$PROBE_CHILD_PID"
sleep 301
"""


def test_an_efa_probe_that_never_answers_is_ended_and_the_job_runs_without_efa(train_job, tmp_path: Path):
    """The probe's 15 s limit (mpi/efa.py): fi_info and its child are ended, the job runs, no FI_* is set."""
    job = train_job(
        """
        import json, os
        seen = {k: v for k, v in os.environ.items() if k.startswith("FI_")}
        open(os.path.join(os.environ["SM_OUTPUT_DATA_DIR"], "fi.json"), "w").write(json.dumps(seen))
        """
    )
    child = tmp_path / "fi_info-child.pid"
    env = {"PATH": first_on_path(tmp_path, "fi_info", SILENT_FI_INFO), "PROBE_CHILD_PID": str(child)}
    result = job.run(timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert "EFA: none (fi_info did not finish within 15s (ended))" in result.stderr
    assert (job.paths.output_data_dir / "fi.json").read_text() == "{}"
    assert not is_alive(int(child.read_text()))
