"""`train` end to end on one host: real mpirun, real ranks, real Horovod."""

import json
import os
import re
import signal
import subprocess
import textwrap
import time

import pytest

from smhvd.proc.processes import read_process_table

pytestmark = pytest.mark.integration

RECORDER = """
    import json, os, sys
    from pathlib import Path
    rank = os.environ["OMPI_COMM_WORLD_RANK"]
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    keys = ["SM_CURRENT_HOST", "SM_HOSTS", "SM_MODEL_DIR", "SM_CHANNEL_TRAIN", "SM_HP_EPOCHS", "SM_NUM_CPUS"]
    record = {k: os.environ.get(k) for k in keys}
    record.update(argv=sys.argv[1:], cwd=os.getcwd(), size=os.environ["OMPI_COMM_WORLD_SIZE"],
                  secret=os.environ.get("AWS_SECRET_ACCESS_KEY"))
    (out / f"rank-{rank}.json").write_text(json.dumps(record))
"""


def test_two_ranks_each_record_their_environment(train_job):
    job = train_job(
        RECORDER,
        # a list is one argument per item: tensorpack's `--config` (argparse nargs='+') takes it so
        {
            "sagemaker_mpi_num_of_processes_per_host": 2,
            "epochs": 3,
            "name": "a b",
            "config": ["A=1", "B=x y"],
        },
        channels={"train": None},
    )
    result = job.run(env={"AWS_SECRET_ACCESS_KEY": "do-not-leak"})
    assert result.returncode == 0, result.stderr
    out = job.paths.output_data_dir
    assert sorted(p.name for p in out.iterdir()) == ["job-summary.json", "rank-0.json", "rank-1.json"]
    for rank in (0, 1):
        record = json.loads((out / f"rank-{rank}.json").read_text())
        assert record == {
            "SM_CURRENT_HOST": "algo-1",
            "SM_HOSTS": '["algo-1"]',
            "SM_MODEL_DIR": str(job.paths.model_dir),
            "SM_CHANNEL_TRAIN": str(job.paths.channel_dir("train")),
            "SM_HP_EPOCHS": "3",
            "SM_NUM_CPUS": str(len(os.sched_getaffinity(0))),
            "argv": ["--config", "A=1", "B=x y", "--epochs", "3", "--name", "a b"],
            "cwd": str(job.code),
            "size": "2",
            "secret": None,
        }
    assert job.failure() is None
    assert "mpirun --allow-run-as-root --tag-output -np 2" in result.stderr


def test_a_crashing_rank_gives_its_exit_code_and_stderr_in_the_failure_file(train_job):
    job = train_job(
        """
        import os, sys
        if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
            print("loading shard 7", file=sys.stderr)
            raise ValueError("shard 7 has 3 columns, expected 4")
        import time; time.sleep(60)
        """,
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    started = time.monotonic()
    result = job.run()
    elapsed = time.monotonic() - started
    assert result.returncode == 1
    failure = job.failure()
    assert failure is not None and len(failure) <= 1024
    first, *rest = failure.splitlines()
    assert first == "rank 1 on algo-1 exited with code 1"
    assert rest[-1] == "ValueError: shard 7 has 3 columns, expected 4"
    assert "loading shard 7" in failure and "Traceback" in failure
    assert elapsed < 30  # rank 0 sleeps 60 s: it was aborted, not waited for
    assert "@@smhvd-rank-failure@@" not in result.stderr  # the marker is consumed, the stderr itself shown
    assert "ValueError: shard 7" in result.stderr


RAISE_AFTER_INIT = """
    import sys
    {init}
    if {rank} == {failing}:
        {fail}
    {wait}
"""
MPI4PY = {"init": "from mpi4py import MPI; MPI.COMM_WORLD.Barrier()", "rank": "MPI.COMM_WORLD.rank",
          "wait": "MPI.COMM_WORLD.Barrier()"}  # fmt: skip
HOROVOD = {"init": "import tensorflow as tf, horovod.tensorflow as hvd; hvd.init()", "rank": "hvd.rank()",
           "wait": "hvd.allreduce(tf.constant(1.0), name='waits_for_the_failing_rank')"}  # fmt: skip


@pytest.mark.parametrize(
    ("framework", "failing", "fail", "code", "last_line"),
    [
        (MPI4PY, 0, "raise ValueError('rank 0 broke')", 1, "ValueError: rank 0 broke"),
        (MPI4PY, 1, "raise ValueError('rank 1 broke')", 1, "ValueError: rank 1 broke"),
        (MPI4PY, 1, "sys.exit(3)", 3, None),
        (HOROVOD, 1, "raise KeyError('shard 7')", 1, "KeyError: 'shard 7'"),
    ],
    ids=["mpi4py-rank0-raises", "mpi4py-rank1-raises", "mpi4py-exit-3", "horovod-rank1-raises"],
)
def test_a_rank_failing_after_mpi_init_ends_the_job_at_once(
    train_job, framework, failing, fail, code, last_line
):
    """The other rank waits in a collective, and the failing one would wait in MPI_Finalize (or Horovod's
    shutdown) at exit: a hang until max_run without smhvd.runscript."""
    job = train_job(
        textwrap.dedent(RAISE_AFTER_INIT).format(failing=failing, fail=fail, **framework),
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    started = time.monotonic()
    result = job.run(timeout=120)
    assert result.returncode == code, result.stderr[-2000:]
    assert time.monotonic() - started < 60  # ended by the launcher, not by a timeout
    failure = job.failure()
    assert failure is not None and failure.startswith(f"rank {failing} on algo-1 exited with code {code}")
    if last_line:
        assert failure.rstrip().splitlines()[-1] == last_line
        assert "Traceback (most recent call last)" in failure and "runpy" not in failure


def test_a_rank_killed_by_a_signal_is_named(train_job):
    job = train_job(
        """
        import os, signal, time
        if os.environ["OMPI_COMM_WORLD_RANK"] == "0":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
        """,
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    result = job.run()
    assert result.returncode == 128 + 9
    assert job.failure().splitlines()[0] == "rank 0 on algo-1 was killed by signal 9 (SIGKILL)"


def test_horovod_allreduce_through_train(train_job):
    job = train_job(
        """
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        import tensorflow as tf
        import horovod.tensorflow as hvd
        hvd.init()
        total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum)
        if hvd.rank() == 0:
            with open(os.path.join(os.environ["SM_MODEL_DIR"], "sum.txt"), "w") as f:
                f.write(f"{hvd.size()} {float(total[0])}")
        """,
        {"sagemaker_mpi_num_of_processes_per_host": 2, "horovod_timeline": True},
    )
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert (job.paths.model_dir / "sum.txt").read_text() == "2 3.0"
    assert (job.paths.output_data_dir / "horovod_timeline.json").stat().st_size > 0


def test_mpi_disabled_runs_the_script_once_without_mpirun(train_job):
    job = train_job(
        """
        import os
        from pathlib import Path
        Path(os.environ["SM_MODEL_DIR"], "ran").write_text(str("OMPI_COMM_WORLD_RANK" in os.environ))
        """,
        {"sagemaker_mpi_enabled": False},
    )
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert (job.paths.model_dir / "ran").read_text() == "False"
    assert "mpirun" not in result.stderr


def test_custom_mpi_options_reach_mpirun_and_replace_defaults(train_job):
    job = train_job(
        "import os; open(os.path.join(os.environ['SM_MODEL_DIR'], 'v'), 'w').write(os.environ['MY_FLAG'])",
        {
            "sagemaker_mpi_num_of_processes_per_host": 2,
            "sagemaker_mpi_custom_mpi_options": "--mca odls_base_sigkill_timeout 2 -x 'MY_FLAG=a b'",
        },
    )
    result = job.run()
    assert result.returncode == 0, result.stderr
    assert (job.paths.model_dir / "v").read_text() == "a b"
    assert (
        "odls_base_sigkill_timeout 2" in result.stderr and "odls_base_sigkill_timeout 0" not in result.stderr
    )


@pytest.mark.parametrize(
    ("mutate", "code", "message"),
    [
        (lambda p: p.resource_config.write_text("{not json"), 78, "resourceconfig.json: expected valid JSON"),
        (lambda p: p.resource_config.write_text('{"hosts": ["algo-1"]}'), 78, "current_host: expected"),
        (
            lambda p: p.hyperparameters.write_text(
                '{"sagemaker_program": "\\"train.py\\"", '
                '"sagemaker_mpi_num_of_processes_per_host": "\\"two\\""}'
            ),
            78,
            "sagemaker_mpi_num_of_processes_per_host: expected an integer >= 1, got 'two'",
        ),
        (
            lambda p: p.hyperparameters.write_text('{"sagemaker_program": "\\"missing.py\\""}'),
            78,
            "sagemaker_program: expected a file in",
        ),
    ],
)
def test_bad_configuration_fails_before_anything_starts(train_job, mutate, code, message):
    job = train_job(
        "open('/dev/null'); raise SystemExit('the script must not run')",
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    hps = json.loads(job.paths.hyperparameters.read_text())
    mutate(job.paths)
    if "sagemaker_submit_directory" not in job.paths.hyperparameters.read_text():
        raw = json.loads(job.paths.hyperparameters.read_text())
        raw["sagemaker_submit_directory"] = hps["sagemaker_submit_directory"]
        job.paths.hyperparameters.write_text(json.dumps(raw))
    result = job.run()
    assert result.returncode == code
    failure = job.failure()
    assert message in failure and "\n" not in failure
    assert str(job.paths.base) in failure or "hyperparameters.json" in failure
    assert "mpirun" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0]


def test_sigterm_reaches_every_rank_which_can_checkpoint(train_job):
    job = train_job(
        """
        import os, signal, sys, time
        from pathlib import Path
        rank = os.environ["OMPI_COMM_WORLD_RANK"]
        ckpt = Path(os.environ["SAGEMAKER_BASE_DIR"], "checkpoints")
        def save(signum, frame):
            (ckpt / f"rank-{rank}.ckpt").write_text("saved")
            sys.exit(0)
        signal.signal(signal.SIGTERM, save)
        (ckpt / f"ready-{rank}").write_text("")
        time.sleep(120)
        """,
        {"sagemaker_mpi_num_of_processes_per_host": 2},
    )
    proc = subprocess.Popen(
        [str(job.run.__globals__["TRAIN"])],
        env={**os.environ, "SAGEMAKER_BASE_DIR": str(job.paths.base)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    ckpt = job.paths.checkpoint_dir
    deadline = time.monotonic() + 60
    while not all((ckpt / f"ready-{r}").exists() for r in (0, 1)):
        assert time.monotonic() < deadline and proc.poll() is None, (
            proc.stderr.read() if proc.poll() else "ranks"
        )
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert sorted(p.name for p in ckpt.glob("*.ckpt")) == ["rank-0.ckpt", "rank-1.ckpt"]
    # Where every rank was when the stop came (taken before the ranks were stopped), nothing else.
    stops = job.failure()
    assert stops is not None and stops.splitlines() == [
        "stopped by SIGTERM while the script ran (all 2 rank(s) had started it); where each rank was:",
        "stack dump (stopped by SIGTERM): ranks 0,1 on algo-1 in <module> (train.py:11)",
    ], stops
    assert proc.pid not in read_process_table()


PIECES = """
    import os, sys
    rank = os.environ["OMPI_COMM_WORLD_RANK"]
    for i in range(300):
        sys.stdout.write(f"probe rank {rank} line {i} " + "x" * 200)  # text and newline written apart,
        sys.stdout.flush()
        sys.stdout.write("\\n")  # as an unbuffered print() does
        sys.stdout.flush()
    sys.stderr.write(f"err rank {rank}")  # no newline at the end
"""


@pytest.mark.parametrize("tagged", [True, False])
def test_every_line_a_rank_prints_reaches_the_log_whole_and_tagged(train_job, tagged):
    """4 ranks writing 300 lines each as fast as they can, each line in two pieces: every line arrives whole,
    on stdout, tagged with its rank and host (or untagged, as asked); stderr lines too."""
    hps: dict[str, object] = {"sagemaker_mpi_num_of_processes_per_host": 4}
    if not tagged:
        hps["launcher_tag_output"] = False
    result = train_job(PIECES, hps).run()
    assert result.returncode == 0, result.stderr[-2000:]
    prefix = r"\[(\d),algo-1\]<stdout>: " if tagged else ""
    lines = [line for line in result.stdout.splitlines() if "probe rank" in line]
    pattern = re.compile(prefix + r"probe rank (\d) line (\d+) x{200}")
    matches = [pattern.fullmatch(line) for line in lines]
    assert all(matches), [line[:80] for line, m in zip(lines, matches, strict=True) if not m][:3]
    per_rank = {
        r: sorted(int(m.group(m.lastindex or 0)) for m in matches if m and m.group(1 + tagged) == str(r))
        for r in range(4)
    }
    assert per_rank == {r: list(range(300)) for r in range(4)}
    for rank in range(4):
        expected = f"[{rank},algo-1]<stderr>: err rank {rank}" if tagged else f"err rank {rank}"
        assert expected in result.stderr.splitlines()
