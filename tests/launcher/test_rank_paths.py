"""What a rank's script prints and how it ends, through the real `train` and mpirun on one host: progress
bars that move, a job that ends with its script even when a child keeps writing, the script behaving as under
`python script.py`, the failure reason kept while another rank writes at full speed, untagged bytes kept."""

from __future__ import annotations

import re
import signal
import textwrap
import time

import pytest

pytestmark = pytest.mark.integration

TWO = {"sagemaker_mpi_num_of_processes_per_host": 2}

PROGRESS = """
    import os, sys, time
    if os.environ["OMPI_COMM_WORLD_RANK"] == "0":
        for step in range(60):  # 3 s of a bar rewritten 20 times a second
            sys.stdout.write(f"\\r{step + 1:3d}/60 [{'=' * (step // 6):10}]")
            sys.stdout.flush()
            time.sleep(0.05)
        print(" done")
"""


def test_a_progress_bar_shows_while_it_runs_and_its_final_state_stays(train_job):
    result = train_job(PROGRESS, TWO).run(timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    bar = [line for line in result.stdout.splitlines() if "/60 [" in line]
    assert all(line.startswith("[0,algo-1]<stdout>: ") and "\r" not in line for line in bar), bar
    shown, final = bar[:-1], bar[-1]
    assert final == "[0,algo-1]<stdout>:  60/60 [========= ] done"
    # Shown every half second or so while it ran (3 s): a few lines, not one per update.
    assert 3 <= len(shown) <= 10, shown
    steps = [int(re.search(r": +(\d+)/60", line).group(1)) for line in shown]  # type: ignore[union-attr]
    assert steps == sorted(steps) and steps[0] < 30


LEAVES_A_WRITER = """
    import subprocess, sys, time
    forever = "import time\\nwhile True:\\n    print('still here', flush=True)\\n    time.sleep(0.001)"
    subprocess.Popen([sys.executable, "-c", forever])
    time.sleep(0.5)
    print("script done", flush=True)
"""


def test_the_job_ends_with_its_script_even_when_a_child_it_left_keeps_writing(train_job):
    job = train_job(LEAVES_A_WRITER, TWO)
    started = time.monotonic()
    result = job.run(timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert time.monotonic() - started < 60  # the end of the script, not the test's timeout
    assert result.stdout.count("script done") == 2


WRAPPER_INVISIBLE = """
    import sys
    import json, signal, secrets, selectors, socket, struct, threading  # the user's own modules
    assert json.MINE and signal.MINE and secrets.MINE
    print("argv", sys.argv[1:], "main", __name__, "path0", sys.path[0] == __file__.rsplit("/", 1)[0])
    sys.exit(False)
"""


def test_the_code_directorys_modules_shadow_nothing_of_the_launchers_and_sys_exit_false_is_success(train_job):
    job = train_job(WRAPPER_INVISIBLE, {**TWO, "epochs": 2})
    for name in (
        "json",
        "signal",
        "secrets",
        "selectors",
        "socket",
        "struct",
        "threading",
        "random",
        "logging",
    ):
        (job.code / f"{name}.py").write_text("MINE = True\n")
    result = job.run(timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("argv ['--epochs', '2'] main __main__ path0 True") == 2
    assert job.failure() is None


@pytest.mark.parametrize(
    ("hook", "code", "shown"),
    [
        ("raise RuntimeError('the hook broke')", 1, "RuntimeError: the hook broke"),
        ("sys.exit(4)", 4, None),
    ],
    ids=["hook-raises", "hook-exits"],
)
def test_a_failing_excepthook_still_ends_the_job_with_the_traceback(train_job, hook, code, shown):
    script = f"""
        import sys
        from mpi4py import MPI
        def hook(*args):
            {hook}
        sys.excepthook = hook
        if MPI.COMM_WORLD.rank == 1:
            raise ValueError("the original cause")
        MPI.COMM_WORLD.Barrier()
    """
    job = train_job(textwrap.dedent(script), TWO)
    started = time.monotonic()
    result = job.run(timeout=120)
    assert result.returncode == code, result.stderr[-2000:]
    assert time.monotonic() - started < 60  # not a hang in MPI_Finalize
    failure = job.failure()
    assert failure is not None and failure.startswith(f"rank 1 on algo-1 exited with code {code}")
    assert "ValueError: the original cause" in failure
    if shown:
        assert shown in failure


def test_an_uncaught_keyboard_interrupt_prints_its_traceback_and_ends_by_sigint(train_job):
    job = train_job("raise KeyboardInterrupt", {"sagemaker_mpi_enabled": False})
    result = job.run(timeout=120)
    assert result.returncode == 130, result.stderr[-2000:]
    assert "Traceback (most recent call last)" in result.stderr and "KeyboardInterrupt" in result.stderr


def test_no_warning_of_the_launchers_own_reaches_the_log(train_job):
    job = train_job("print('hello')", TWO)
    result = job.run(timeout=120, env={"PYTHONWARNINGS": "error", "PYTHONDEVMODE": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Warning" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr[-2000:]


WRITES_AND_FAILS = """
    import os, sys, time
    if os.environ["OMPI_COMM_WORLD_RANK"] == "1":
        line = "rank 1 keeps writing " + "x" * 200 + "\\n"
        while True:
            sys.stdout.write(line)
    time.sleep(0.3)
    colour = "\\x1b[31m"
    reset = "\\x1b[0m"
    detail = "".join(f"{colour}Schritt {i}: Größe überschritten ✗ 数据{reset}\\n" for i in range(400))
    sys.stderr.write(detail)  # about 20 KB of non-ASCII, coloured text
    raise ValueError("Ursache: Größe ✗")
"""


def test_the_first_failed_ranks_traceback_survives_while_another_rank_writes_at_full_speed(train_job):
    """50 runs: every failure file names rank 0 and ends with its traceback's last line."""
    job = train_job(WRITES_AND_FAILS, TWO)
    wrong = []
    for run in range(50):
        job.paths.failure_file.unlink(missing_ok=True)
        result = job.run(timeout=120)
        failure = job.failure() or ""
        lines = failure.rstrip().splitlines()
        if not (
            result.returncode == 1
            and lines[0] == "rank 0 on algo-1 exited with code 1"
            and lines[-1] == "ValueError: Ursache: Größe ✗"
            and "Schritt 399: Größe überschritten ✗ 数据" in failure
            and "\x1b" not in failure
        ):
            wrong.append((run, result.returncode, failure[:200]))
    assert wrong == []


UNTAGGED_BYTES = r"""
    import os, sys
    rank = os.environ["OMPI_COMM_WORLD_RANK"].encode()
    out = b"out " + rank + b" \x1d\x1c\x1e\x1f\x00\xff\r end\n"
    err = b"\x1derr " + rank + b" starts with 0x1d\n@@smhvd-rank-failure@@ {\"rank\": 9}\n"
    for _ in range(200):
        os.write(1, out)
        os.write(2, err)
"""


def test_untagged_output_keeps_every_byte_of_each_stream(train_job):
    job = train_job(UNTAGGED_BYTES, {**TWO, "launcher_tag_output": False})
    proc = job.run_bytes(timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (b"0", b"1"):
        out = b"out " + rank + b" \x1d\x1c\x1e\x1f\x00\xff\r end\n"
        err = b"\x1derr " + rank + b' starts with 0x1d\n@@smhvd-rank-failure@@ {"rank": 9}\n'
        assert proc.stdout.count(out) == 200
        assert proc.stderr.count(err.split(b"\n")[0] + b"\n") == 200
        assert proc.stderr.count(b'@@smhvd-rank-failure@@ {"rank": 9}\n') == 400


IGNORES_SIGTERM = """
    import signal, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(300)
"""


def test_a_second_sigterm_ends_ranks_that_ignore_the_first(train_job):
    job = train_job(IGNORES_SIGTERM, TWO)
    proc = job.start()
    assert proc.stdout is not None
    ready = [proc.stdout.readline() for _ in range(2)]
    assert all("ready" in line for line in ready), ready
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    assert proc.poll() is None  # the ranks are given time to save their work
    proc.send_signal(signal.SIGTERM)
    started = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - started < 30, err[-2000:]
    assert proc.returncode == 143, err[-2000:]
    assert "stopped again by SIGTERM" in err
