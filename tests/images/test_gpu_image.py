"""The GPU image builds and is verifiable on a machine without a GPU.

Horovod is built with NCCL GPU operations against TensorFlow's CUDA wheels; its libraries resolve the CUDA
runtime and NCCL from the venv (no CUDA toolkit and no LD_LIBRARY_PATH in the image); a 2-rank Horovod job
runs on CPU in it.
"""

from __future__ import annotations

import json
import time

import pytest

from .helpers import BuiltImage, build_image, record_timing, run

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(5400)]

GB = 1000**3

ALLREDUCE = (
    "import horovod.tensorflow as hvd, tensorflow as tf; hvd.init();"
    " s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum);"
    " print(f'rank {hvd.rank()} of {hvd.size()} sum {float(s[0])}')"
)


@pytest.fixture(scope="module")
def gpu_image(engine_env: dict[str, str], base_image: str) -> BuiltImage:
    return build_image("gpu", base_image, engine_env, timeout=5400)


def test_gpu_image_has_horovod_with_nccl(gpu_image: BuiltImage, engine_env: dict[str, str]) -> None:
    info = json.loads(run(["podman", "image", "inspect", gpu_image.immutable], engine_env, 60).stdout)[0]
    assert info["Config"]["Cmd"] == ["train"]
    assert "NVIDIA_VISIBLE_DEVICES=all" in info["Config"]["Env"]
    assert info["Size"] <= 5 * GB, f"GPU image is {info['Size'] / GB:.3f} GB, the budget is <= 5 GB"
    record_timing("size-gpu", 0, bytes=info["Size"])

    # Horovod's library needs NCCL from the venv (RPATH). The CUDA runtime API it calls is resolved at import
    # time from TensorFlow's own library (TensorFlow's cudart stub loads the venv's libcudart), like every
    # TensorFlow custom op; a 2-rank run below proves the library loads and works.
    probe = (
        "set -e; test ! -e /opt/cuda; echo LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}; horovodrun --check-build;"
        " ldd /opt/venv/lib/python3.*/site-packages/horovod/tensorflow/mpi_lib*.so"
    )
    out = run(
        ["podman", "run", "--rm", "--network", "none", gpu_image.immutable, "bash", "-c", probe],
        engine_env,
        300,
    ).stdout
    for built in ("TensorFlow", "MPI", "Gloo", "NCCL"):
        assert f"[X] {built}" in out, out
    assert "LD_LIBRARY_PATH=\n" in out
    assert "site-packages/nvidia/nccl/lib/libnccl.so.2 (" in out, out
    missing = [line for line in out.splitlines() if "not found" in line and "libtensorflow" not in line]
    assert not missing, missing


def test_gpu_image_runs_a_two_rank_job_on_cpu(gpu_image: BuiltImage, engine_env: dict[str, str]) -> None:
    start = time.monotonic()
    out = run(
        [
            "podman",
            "run",
            "--rm",
            "--network",
            "none",
            "--hostname",
            "algo-1",
            gpu_image.immutable,
            "mpirun",
            "-np",
            "2",
            "--bind-to",
            "none",
            "python",
            "-c",
            ALLREDUCE,
        ],
        engine_env,
        600,
    ).stdout
    record_timing("gpu-image-2rank-cpu", time.monotonic() - start)
    assert "rank 0 of 2 sum 3.0" in out
    assert "rank 1 of 2 sum 3.0" in out
