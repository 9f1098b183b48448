"""Hostile and odd input through the real `train`: no argument injection, no hang after the script ends, one
clear line (and a sysexits code, nothing started, nothing left behind) for every bad value."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from smhvd.proc.processes import read_process_table
from tests.conftest import TRAIN

pytestmark = pytest.mark.integration

MUST_NOT_RUN = "open('/dev/null'); raise SystemExit('the script must not run')"


def run(
    job, tmp_path: Path, timeout: float = 120, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`train` with a private TMPDIR (so that what mpirun leaves there can be checked)."""
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    return job.run(timeout=timeout, env={"TMPDIR": str(tmp), **(env or {})})


def assert_refused(job, result, code: int, message: str) -> None:
    """The README's promise for bad input: the code, one ERROR line naming it, the failure file's first line
    saying the same, nothing started."""
    assert result.returncode == code, result.stderr
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and message in errors[0], result.stderr
    failure = job.failure()
    assert failure is not None and "\n" not in failure
    assert message in failure
    assert "mpirun --allow" not in result.stderr and "starting" not in result.stderr
    assert "Traceback" not in result.stderr


def write_raw_hyperparameters(job, text: str | bytes, **extra: str) -> None:
    hps = json.loads(job.paths.hyperparameters.read_text())
    base = {k: hps[k] for k in ("sagemaker_program", "sagemaker_submit_directory")}
    base.update(extra)
    head = json.dumps(base)[:-1]
    data = text if isinstance(text, bytes) else text.encode()
    job.paths.hyperparameters.write_bytes(head.encode() + b", " + data + b"}")


# --- 1. argument injection -------------------------------------------------------------------------------

ARGV_RECORDER = """
    import json, os, sys
    from pathlib import Path
    rank = os.environ["OMPI_COMM_WORLD_RANK"]
    Path(os.environ["SM_OUTPUT_DATA_DIR"], f"argv-{rank}.json").write_text(
        json.dumps({"argv": sys.argv[1:], "env": "SMHVD_RANK_ARGV" in os.environ})
    )
"""


def test_mpirun_never_parses_a_users_value(train_job, tmp_path):
    planted = tmp_path / "X"
    hostile = {
        "a": ":",
        "np": "1",
        "report-bindings": "env",
        "split-string": f"touch {planted}",
        "app": "--app",
        "dash": "-np",
        "x": "-x",
        "lead": "--mca btl self",
        "nl": "line one\nline two\n",
        "sep": ":",
    }
    job = train_job(ARGV_RECORDER, {"sagemaker_mpi_num_of_processes_per_host": 2, **hostile})
    result = run(job, tmp_path)
    assert result.returncode == 0, result.stderr
    expected = []
    for key in sorted(hostile):
        expected += [f"--{key}" if len(key) > 1 else f"-{key}", hostile[key]]
    for rank in (0, 1):
        record = json.loads((job.paths.output_data_dir / f"argv-{rank}.json").read_text())
        assert record == {"argv": expected, "env": False}
    assert not planted.exists()
    assert sorted(p.name for p in job.paths.output_data_dir.glob("argv-*")) == ["argv-0.json", "argv-1.json"]
    assert "-x SMHVD_RANK_ARGV" in result.stderr  # forwarded by name: no value on mpirun's command line
    assert "touch" not in next(line for line in result.stderr.splitlines() if "mpirun --allow" in line)


# --- 2. a finished job ends ------------------------------------------------------------------------------

LEAVES_A_CHILD = """
    import os, subprocess, sys, time
    from pathlib import Path
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    child = subprocess.Popen(["sleep", "300"])  # keeps this script's stdout and stderr
    if os.fork() == 0:  # and a daemon, re-parented away from the script
        os.setsid()
        grandchild = subprocess.Popen(["sleep", "301"])
        (out / "daemon.tmp").write_text(str(grandchild.pid))
        os.rename(out / "daemon.tmp", out / "daemon.pid")  # complete when it appears
        os._exit(0)
    while not (out / "daemon.pid").exists():
        time.sleep(0.01)
    (out / "child.pid").write_text(str(child.pid))
    print("done", file=sys.stderr)
    (out / "ended").write_text(str(time.time()))
    sys.exit(int(os.environ.get("EXIT_CODE", "0")))
"""


def _alive(pid: int) -> bool:
    entry = read_process_table().get(pid)
    return entry is not None and entry[1] != "Z"


@pytest.mark.parametrize(
    ("mpi", "exit_code"), [(True, 0), (True, 3), (False, 0)], ids=["mpirun", "mpirun-failing", "no-mpi"]
)
def test_the_job_ends_when_the_script_does_and_its_leftovers_are_killed(train_job, tmp_path, mpi, exit_code):
    job = train_job(LEAVES_A_CHILD, {"sagemaker_mpi_enabled": mpi})
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    result = job.run(timeout=240, env={"TMPDIR": str(tmp), "EXIT_CODE": str(exit_code)})
    finished = time.time()
    out = job.paths.output_data_dir
    assert result.returncode == exit_code, result.stderr
    # A job that waited for the leftovers (they hold the script's stdout) would end 300 s after the script:
    # only that exceeds 120 s, however loaded the machine. How fast `train` exits after the script is
    # benchmarks/launcher_overhead.py's figure (script end -> `train` exit).
    assert finished - float((out / "ended").read_text()) < 120
    for name in ("child.pid", "daemon.pid"):
        assert not _alive(int((out / name).read_text())), name
    assert "done" in result.stderr
    if exit_code:
        assert job.failure().splitlines()[0] == "rank 0 on algo-1 exited with code 3"
    else:
        assert job.failure() is None
    assert list(tmp.iterdir()) == []


# --- 3, 4. one line for every bad value ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("hyperparameters", "message"),
    [
        ({"horovod_fusion_threshold_mb": "Infinity"}, "horovod_fusion_threshold_mb: expected a number <= "),
        ({"horovod_fusion_threshold_mb": "1e400"}, "horovod_fusion_threshold_mb: expected a number <= "),
        ({"horovod_cycle_time_ms": "NaN"}, "horovod_cycle_time_ms: expected a number >= 0.01"),
        ({"launcher_peer_timeout_seconds": "1e300"}, "launcher_peer_timeout_seconds: expected a number <= "),
        (
            {"sagemaker_mpi_num_of_processes_per_host": "100000000000000000000"},
            "sagemaker_mpi_num_of_processes_per_host: expected an integer <= 1024, got '1000000000000",
        ),
        (
            {"sagemaker_mpi_num_of_processes_per_host": "1" * 5000},
            "sagemaker_mpi_num_of_processes_per_host: expected an integer <= 1024",
        ),
        (
            {"launcher_drop_mpi_defaults": "mpi_yield_when_idle,bind_to"},
            "launcher_drop_mpi_defaults: expected names of mpirun defaults (NCCL_SOCKET_IFNAME, bind-to, ",
        ),
        ({"epochs": "3\x00; touch /tmp/x"}, "epochs: expected text without NUL characters"),
        ({"nul\x00key": "1"}, "'nul\\x00key': expected a name of text without NUL characters"),
        ({"big": "x" * 200_000}, "big: expected hyperparameters of at most 65536 bytes in all"),
        ({"deep": json.loads("[" * 150 + "]" * 150)}, "deep: expected a value nested at most 100 deep"),
        (
            {"sagemaker_program": "a" * 300 + ".py"},
            "hyperparameters.json: sagemaker_program: expected a path relative to the code directory "
            "(names of at most 255 bytes between slashes, not 303)",
        ),
        (
            {"sagemaker_submit_directory": "/tmp/" + "d" * 300},
            "hyperparameters.json: sagemaker_submit_directory: expected a local directory or .tar.gz "
            "(names of at most 255 bytes between slashes, not 300)",
        ),
        (
            {"sagemaker_program": "nope.py"},
            "hyperparameters.json: sagemaker_program: expected a file in ",
        ),
    ],
)
def test_bad_hyperparameters_are_one_line_and_78(train_job, tmp_path, hyperparameters, message):
    job = train_job(MUST_NOT_RUN, hyperparameters)
    result = run(job, tmp_path)
    assert_refused(job, result, 78, message)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b'"epochs": "\xff\xfe"', "hyperparameters.json: expected UTF-8 text (invalid byte at offset "),
        (
            b'"deep": ' + b"[" * 100_000 + b"]" * 100_000,
            "hyperparameters.json: expected JSON nested less deeply",
        ),
        (b'"deep": "' + b"[" * 100_000 + b'"', "deep: expected a value nested at most 100 deep"),
        (
            b'"n": ' + b"7" * 5000,
            "hyperparameters.json: expected valid JSON (Exceeds the limit (4300 digits)",
        ),
        (b'"\\ud800x": "1"', "hyperparameters.json: '\\ud800x': expected a name of text without"),
        (b'"v": "\\"a\\\\u0000b\\""', "v: expected text without NUL characters"),
    ],
    ids=["invalid-utf8", "file-nested-100000", "value-nested-100000", "5000-digits", "surrogate-key", "nul"],
)
def test_unreadable_hyperparameters_files_are_one_line_and_78(train_job, tmp_path, raw, message):
    job = train_job(MUST_NOT_RUN)
    write_raw_hyperparameters(job, raw)
    result = run(job, tmp_path)
    assert_refused(job, result, 78, message)


@pytest.mark.parametrize("level", ["debug", "10", "Debug"])
def test_the_log_level_by_name_in_any_case_or_number(train_job, tmp_path, level):
    job = train_job("print('ran')", {"sagemaker_mpi_enabled": False})
    result = job.run(timeout=120, env={"SMHVD_LOG_LEVEL": level})
    assert result.returncode == 0, result.stderr
    assert " DEBUG job: host algo-1 of algo-1" in result.stderr


def test_an_unknown_log_level_is_one_line_and_78(train_job, tmp_path):
    job = train_job(MUST_NOT_RUN)
    result = run(job, tmp_path, env={"SMHVD_LOG_LEVEL": "TRACE"})
    assert_refused(
        job,
        result,
        78,
        "environment: SMHVD_LOG_LEVEL: expected DEBUG, INFO, WARNING, ERROR or CRITICAL (any case) or a "
        "number from 0 to 50, got 'TRACE'",
    )
    bad_flag = subprocess.run(
        [str(TRAIN), "--log-level", "trace", "--base-dir", str(job.paths.base)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad_flag.returncode == 64, bad_flag.stderr


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        (
            [("a", ["algo-1"]), ("b", ["algo-1"])],
            "instance_groups[1].hosts: expected hosts of no other group",
        ),
        ([("a", ["algo-1"]), ("a", [])], "instance_groups[1].hosts: expected a non-empty list of host names"),
        (
            [("a", ["algo-1"]), ("a", ["algo-1"])],
            "instance_groups[1].instance_group_name: expected a name no",
        ),
    ],
    ids=["host-in-two-groups", "empty-group", "same-name"],
)
def test_instance_groups_that_overlap_are_refused_at_load(train_job, tmp_path, groups, message):
    job = train_job(MUST_NOT_RUN)
    config = {
        "current_host": "algo-1",
        "hosts": ["algo-1"],
        "current_group_name": "a",
        "instance_groups": [{"instance_group_name": n, "instance_type": "t", "hosts": h} for n, h in groups],
    }
    job.paths.resource_config.write_text(json.dumps(config))
    assert_refused(job, run(job, tmp_path), 78, message)


def test_a_program_named_by_the_environment_is_reported_as_such(train_job, tmp_path):
    job = train_job(MUST_NOT_RUN, {"sagemaker_program": None})
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    result = job.run(timeout=120, env={"TMPDIR": str(tmp), "SAGEMAKER_PROGRAM": "missing.py"})
    assert_refused(job, result, 78, "environment: SAGEMAKER_PROGRAM: expected a file in ")


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ("resourceconfig.json", "current_host: expected a host name"),
        ("inputdataconfig.json", "inputdataconfig.json: 'train\\n': expected a channel name"),
    ],
)
def test_names_with_a_trailing_newline_are_refused(train_job, tmp_path, file, message):
    job = train_job(MUST_NOT_RUN)
    if file == "resourceconfig.json":
        job.paths.resource_config.write_text(json.dumps({"current_host": "algo-1\n", "hosts": ["algo-1\n"]}))
    else:
        job.paths.input_data_config.write_text(json.dumps({"train\n": {"TrainingInputMode": "File"}}))
    result = run(job, tmp_path)
    assert_refused(job, result, 78, message)


def _tar_gz(files: dict[str, bytes]) -> bytes:
    """Names may hold surrogates: they are written as the raw bytes they stand for (invalid UTF-8)."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:gz", format=tarfile.GNU_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


TRUNCATED = _tar_gz({"train.py": os.urandom(200_000)})[:100_000]


@pytest.mark.parametrize(
    ("archive", "message"),
    [
        (TRUNCATED, "not a readable tar archive (Compressed file ended before the end-of-stream marker"),
        (_tar_gz({"../\udcff\udcfe.py": b"x"}), "unsafe path in archive: '../\\udcff\\udcfe.py'"),
    ],
    ids=["truncated", "invalid-utf8-name"],
)
def test_broken_archives_are_one_line_and_66(train_job, tmp_path, archive, message):
    job = train_job(MUST_NOT_RUN)
    path = tmp_path / "sourcedir.tar.gz"
    path.write_bytes(archive)
    hps = json.loads(job.paths.hyperparameters.read_text())
    hps["sagemaker_submit_directory"] = json.dumps(str(path))
    job.paths.hyperparameters.write_text(json.dumps(hps))
    result = run(job, tmp_path)
    assert_refused(job, result, 66, message)


# --- 6. nothing left in TMPDIR by a failing mpirun --------------------------------------------------------


def test_a_killed_mpirun_leaves_no_session_directory(train_job, tmp_path):
    job = train_job(
        """
        import os, signal, time
        wrapper = os.getppid()
        with open(f"/proc/{wrapper}/stat") as f:
            mpirun = int(f.read().rsplit(")", 1)[1].split()[1])
        os.kill(mpirun, signal.SIGKILL)
        time.sleep(30)
        """
    )
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    result = job.run(timeout=60, env={"TMPDIR": str(tmp)})
    assert result.returncode == 128 + 9, result.stderr
    assert job.failure().splitlines()[0] == "mpirun exited with code 137"
    assert list(tmp.iterdir()) == []


# --- 7. the failure file goes to the error, not to TensorFlow's start-up lines ----------------------------


def test_framework_startup_noise_is_not_the_failure_reason(train_job, tmp_path):
    job = train_job(
        """
        import os
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
        import tensorflow as tf
        tf.constant(1)
        raise RuntimeError("the real error")
        """
    )
    result = run(job, tmp_path)
    assert result.returncode == 1
    failure = job.failure()
    assert "cpu_feature_guard" in result.stderr  # the log keeps everything
    lines = failure.splitlines()
    assert lines[0] == "rank 0 on algo-1 exited with code 1"
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: the real error"
    assert "cpu_feature_guard" not in failure and "tensorflow/core" not in failure
