"""The MNIST example trained for real: 2 ranks under mpirun, short runs on real data; and once under the
benchmarks' measuring wrapper.

Cost: about 2.5 min on 2 lightly loaded cores; TensorFlow's start-up dominates each run.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import train_mnist
from mnist_helpers import MEASURE, RUN_TIMEOUT, SCRIPT_DIR, Job, mpirun_argv, run_script

from smhvd_dev.mltree import write_ml_tree
from support.ci import need_root

pytestmark = pytest.mark.integration


def job_args(job: Job, *extra: str) -> list[str]:
    return ["--checkpoint-dir", str(job.checkpoint_dir), *extra]


def epoch_headers(stdout: str) -> list[str]:
    return re.findall(r"^Epoch \d+/\d+$", stdout, flags=re.MULTILINE)


def read_history(job: Job) -> list[dict[str, str]]:
    with (job.output_data_dir / "history.csv").open() as stream:
        return list(csv.DictReader(stream))


def metric(name: str, output: str) -> list[float]:
    """Every value SageMaker would extract with the script's metric definition `name`."""
    regex = next(d["Regex"] for d in train_mnist.METRIC_DEFINITIONS if d["Name"] == name)
    return [float(value) for value in re.findall(regex, output)]


def latest_epoch(checkpoint_dir: Path) -> int | None:
    """The epoch of the newest complete checkpoint, from tf.train.CheckpointManager's state file."""
    state = checkpoint_dir / "checkpoint"
    found = (
        re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state.read_text(), re.MULTILINE)
        if state.exists()
        else None
    )
    return int(found.group(1)) if found else None


def assert_ok(result: subprocess.CompletedProcess[str]) -> None:
    assert (
        result.returncode == 0
    ), f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"


def test_two_ranks_learn_mnist_and_rank_0_alone_writes_one_model(job: Job) -> None:
    result = run_script(job, job_args(job, "--epochs", "2", "--steps-per-epoch", "40"))
    assert_ok(result)

    # Rank 0 alone reports: Keras' lines for each epoch (not one per rank), then the final line.
    assert epoch_headers(result.stdout) == ["Epoch 1/2", "Epoch 2/2"]
    val_accuracies = metric("validation:accuracy", result.stdout)
    assert len(val_accuracies) == 2
    assert all(0.5 < value <= 1.0 for value in val_accuracies)
    assert len(metric("validation:loss", result.stdout)) == 2
    # The log ends with what its user needs: the accuracy, and where the model went (no signature dump).
    final, where = result.stdout.strip().splitlines()[-2:]
    assert re.fullmatch(r"test_accuracy=0\.\d{4} test_loss=\d+\.\d{4}", final)
    assert where == f"model: SavedModel (serving_default) in {job.model_dir / '1'}"
    assert "Captures:" not in result.stdout and "TensorSpec" not in result.stdout

    metrics = json.loads((job.output_data_dir / "metrics.json").read_text())
    assert (metrics["world_size"], metrics["epochs"], metrics["steps_per_epoch"]) == (2, 2, 40)
    assert metrics["test_accuracy"] >= 0.90  # 2 x 40 steps x 128 images on the full 10k test set
    assert metric("test:accuracy", final) == [pytest.approx(metrics["test_accuracy"], abs=1e-4)]
    assert metric("test:loss", final) == [pytest.approx(metrics["test_loss"], abs=1e-4)]
    assert [row["epoch"] for row in read_history(job)] == ["0", "1"]  # Keras' CSVLogger counts from 0

    # Exactly one model, a SavedModel under the version directory TF Serving expects.
    assert [path.name for path in job.model_dir.iterdir()] == ["1"]
    assert (job.model_dir / "1" / "saved_model.pb").is_file()
    assert latest_epoch(job.checkpoint_dir) == 2
    assert {path.name for path in job.checkpoint_dir.glob("*.index")} == {"ckpt-1.index", "ckpt-2.index"}

    # The saved model is usable on its own (no Horovod, no Keras: its serving signature, as TF Serving calls
    # it) and scores what the job reported.
    check = (
        "import sys, numpy as np, tensorflow as tf; sys.path.insert(0, sys.argv[2]); import mnist_data; "
        "_, test = mnist_data.load(mnist_data.resolve_source('mnist', {})); "
        "serve = tf.saved_model.load(sys.argv[1]).signatures['serving_default']; "
        "(probs,) = serve(tf.constant(test.images, tf.float32)).values(); "
        "print(float(np.mean(np.argmax(probs.numpy(), 1) == test.labels)))"
    )
    scored = subprocess.run(
        [sys.executable, "-c", check, str(job.model_dir / "1"), str(SCRIPT_DIR)],
        env=job.env({"TF_CPP_MIN_LOG_LEVEL": "2"}),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert_ok(scored)
    assert float(scored.stdout.strip().splitlines()[-1]) == pytest.approx(metrics["test_accuracy"], abs=1e-3)


def wait_for_checkpoint(directory: Path, process: subprocess.Popen[str], deadline_seconds: float) -> int:
    """Poll (with backoff) until a first complete checkpoint exists; returns its epoch."""
    deadline = time.monotonic() + deadline_seconds
    delay = 0.02
    while time.monotonic() < deadline:
        found = latest_epoch(directory)
        if found is not None:
            return found
        if process.poll() is not None:
            pytest.fail(f"training ended (exit {process.returncode}) before writing a checkpoint")
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    pytest.fail(f"no checkpoint in {directory} after {deadline_seconds} s")


def pid_namespace(pid: int) -> str | None:
    try:
        return str(Path(f"/proc/{pid}/ns/pid").readlink())
    except OSError:
        return None


def kill_whole_job(unshare: subprocess.Popen[str]) -> None:
    """Kill every process of a job run in a PID namespace of its own, as a spot interruption ends every
    process of a host (mpirun's ranks are in process groups of their own: killing mpirun's group leaves them
    training and writing checkpoints), then wait until none is left (bounded)."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
    namespace = pid_namespace(int(children[0])) if children else None
    unshare.kill()  # --kill-child: its child, the namespace's init, is killed, and with it the namespace
    unshare.communicate(timeout=60)
    deadline = time.monotonic() + 60
    while namespace is not None and any(
        pid_namespace(int(p)) == namespace for p in os.listdir("/proc") if p.isdigit()
    ):
        assert time.monotonic() < deadline, "the killed job's processes are still running after 60 s"
        time.sleep(0.05)


def test_killed_after_an_epoch_it_resumes_from_the_checkpoint(job: Job) -> None:
    need_root("a PID namespace holds the whole job, to kill all of it as a spot interruption does")
    epochs = 4
    # Its own TMPDIR: the killed mpirun (PID 1 in its namespace) leaves its session directory (pid.1) there.
    tmp = job.root / "tmp"
    tmp.mkdir(parents=True)
    first = subprocess.Popen(
        [
            "unshare", "--pid", "--fork", "--kill-child", "--",
            *mpirun_argv(2, job_args(job, "--epochs", str(epochs), "--steps-per-epoch", "150")),
        ],
        env=job.env({"TMPDIR": str(tmp)}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    try:
        wait_for_checkpoint(job.checkpoint_dir, first, deadline_seconds=RUN_TIMEOUT)
    finally:
        kill_whole_job(first)
    killed_at = latest_epoch(job.checkpoint_dir)
    assert killed_at is not None
    assert 1 <= killed_at < epochs, "the job finished before it could be killed: make epochs longer"
    assert not (job.model_dir / "1").exists()
    # A spot restart's new host gets the checkpoints back (checkpoint_s3_uri), not the output directory.
    shutil.rmtree(job.output_data_dir)

    # Restart with ONE step per epoch: accuracy can then only be high if the weights were restored; and the
    # validation accuracy, averaged over both ranks' halves of the test set, only if rank 1 got them too.
    result = run_script(job, job_args(job, "--epochs", str(epochs), "--steps-per-epoch", "1"))
    assert_ok(result)
    assert f"resuming from epoch {killed_at}: " in result.stdout
    assert epoch_headers(result.stdout) == [
        f"Epoch {epoch}/{epochs}" for epoch in range(killed_at + 1, epochs + 1)
    ]
    assert all(value >= 0.90 for value in metric("validation:accuracy", result.stdout))
    metrics = json.loads((job.output_data_dir / "metrics.json").read_text())
    assert metrics["resumed_from_epoch"] == killed_at
    assert metrics["test_accuracy"] >= 0.90
    # The curves go on where they stopped, kept beside the checkpoints: every epoch once, in order.
    assert [int(row["epoch"]) for row in read_history(job)] == list(range(epochs))
    assert latest_epoch(job.checkpoint_dir) == epochs


def test_through_the_launcher_with_channel_data(tmp_path: Path, mnist_subset_dir: Path) -> None:
    """The SageMaker path: `train` reads /opt/ml (SDK-encoded hyperparameters), starts 2 ranks with mpirun,
    the script takes its data from the train/test channels and its directories from the SM_* variables."""

    paths = write_ml_tree(
        tmp_path / "opt_ml",
        hyperparameters={
            "sagemaker_program": "train_mnist.py",
            "sagemaker_submit_directory": str(SCRIPT_DIR),
            "sagemaker_mpi_enabled": True,
            "sagemaker_mpi_num_of_processes_per_host": 2,
            "epochs": 1,
            "batch-size": 32,
        },
        channels={"train": mnist_subset_dir / "train", "test": mnist_subset_dir / "test"},
    )
    result = subprocess.run(
        [str(Path(sys.executable).parent / "train")],
        env={
            **{key: value for key, value in os.environ.items() if not key.startswith("SM_")},
            "SAGEMAKER_BASE_DIR": str(paths.base),
        },
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
        check=False,
    )
    assert_ok(result)
    assert not paths.failure_file.exists()
    output = result.stdout + result.stderr
    assert "train 6000 / test 1000 examples" in output
    assert len(metric("validation:accuracy", output)) == 1  # rank 0's Keras line only (no header for 1 epoch)
    metrics = json.loads((paths.output_data_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2
    assert metrics["steps_per_epoch"] == 6000 // (32 * 2)  # one pass over the channel's data
    assert metrics["test_accuracy"] >= 0.85
    assert [path.name for path in paths.model_dir.iterdir()] == ["1"]
    assert latest_epoch(paths.checkpoint_dir) == 1


def test_fashion_mnist_trains_as_a_single_process_without_mpirun(job: Job) -> None:
    result = run_script(
        job,
        job_args(job, "--dataset", "fashion_mnist", "--epochs", "1", "--steps-per-epoch", "60"),
        processes=1,
    )
    assert_ok(result)
    assert "horovod: 1 rank(s)" in result.stdout
    assert "from /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz" in result.stdout
    metrics = json.loads((job.output_data_dir / "metrics.json").read_text())
    assert (metrics["dataset"], metrics["world_size"]) == ("fashion_mnist", 1)
    assert metrics["test_accuracy"] >= 0.65  # chance is 0.10; ~0.75 after 60 steps


def leave_channel_empty(channel: Path) -> None:
    del channel


def write_wrong_shape(channel: Path) -> None:
    np.savez(channel / "train.npz", data=np.zeros((5, 32, 32), np.uint8), labels=np.zeros(5, np.int64))


@pytest.mark.parametrize(
    ("make_channel", "message"),
    [
        (leave_channel_empty, r"train\.npz: file not found"),
        (write_wrong_shape, r"train\.npz: 'data' has shape \(5, 32, 32\), expected \(N, 28, 28\)"),
    ],
    ids=["missing-file", "wrong-shape"],
)
def test_bad_channel_data_fails_fast_with_one_clear_line(
    job: Job, tmp_path: Path, make_channel: Callable[[Path], None], message: str
) -> None:
    channel = tmp_path / "train"
    channel.mkdir()
    make_channel(channel)
    started = time.monotonic()
    result = run_script(job, job_args(job), processes=1, extra_env={"SM_CHANNEL_TRAIN": str(channel)})
    assert result.returncode == 2
    # The script's one line ends its stderr (TensorFlow's import banners may come before it).
    assert re.fullmatch(
        rf"train_mnist\.py: error: {re.escape(str(channel))}/{message}.*", result.stderr.splitlines()[-1]
    )
    assert result.stderr.count("train_mnist.py: error:") == 1
    assert time.monotonic() - started < 60  # fails before Horovod starts
    assert not job.root.exists()  # nothing half-done: no model, no checkpoint, no output


def test_under_the_benchmarks_wrapper_history_gets_the_timings(job: Job) -> None:
    """The measuring aids moved out of the example (benchmarks/mnist_measure.py) still measure it: 2 ranks,
    the figures in rank 0's history.csv, the thread variables shown, Keras' "callback is slow" note gone."""
    result = run_script(job, job_args(job, "--epochs", "2", "--steps-per-epoch", "20"), script=MEASURE)
    assert_ok(result)
    assert (
        "mnist_measure: threads OMP_NUM_THREADS=1 TF_NUM_INTRAOP_THREADS=1 TF_NUM_INTEROP_THREADS=1"
        in result.stdout
    )
    assert "is slow compared to the batch time" not in result.stdout + result.stderr
    history = read_history(job)
    assert [row["epoch"] for row in history] == ["0", "1"]
    for row in history:
        assert float(row["images_per_sec"]) > 0
        assert float(row["epoch_seconds"]) > 0
        # A rank's busy cores while it trained: some CPU, and no more than the machine has.
        assert 0 < float(row["rank_cpu_cores"]) <= len(os.sched_getaffinity(0)) + 0.05
        assert 0.5 < float(row["val_accuracy"]) <= 1.0
    assert json.loads((job.output_data_dir / "metrics.json").read_text())["world_size"] == 2
