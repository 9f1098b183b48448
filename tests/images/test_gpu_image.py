"""The GPU image builds and is verifiable on a machine without a GPU.

Horovod is built with NCCL GPU operations against TensorFlow's CUDA wheels; its libraries resolve the CUDA
runtime and NCCL from the venv (no CUDA toolkit and no LD_LIBRARY_PATH in the image); a 2-rank Horovod job
runs on CPU in it. NCCL over EFA: the image's NCCL is new enough for aws-ofi-nccl, which NCCL loads by itself
and whose own initialisation runs until it needs a GPU driver (nothing here has one, nor an EFA device).
"""

from __future__ import annotations

import json
import re
import time

import pytest

from support.dockerfile import dockerfile_arg

from .efa_checks import assert_one_libfabric_with_efa
from .helpers import REPO, BuiltImage, build_image, record_timing, run

pytestmark = [pytest.mark.images, pytest.mark.integration, pytest.mark.timeout(5400)]

GB = 1000**3

ALLREDUCE = (
    "import horovod.tensorflow as hvd, tensorflow as tf; hvd.init();"
    " s = hvd.allreduce(tf.constant([float(hvd.rank() + 1)]), op=hvd.Sum);"
    " print(f'rank {hvd.rank()} of {hvd.size()} sum {float(s[0])}')"
)


# nvidia-nccl-cu12==X.Y.Z, the last line of requirements/nccl.txt
NCCL_PIN = (REPO / "requirements" / "nccl.txt").read_text().strip().splitlines()[-1]
# The newest ncclNet and ncclTuner interfaces an NCCL release asks a plugin for (it tries older ones after),
# from NVIDIA/nccl's sources: src/net.cc ncclNetPluginInit and src/include/nccl_tuner.h at tag v2.21.5-1.
ASKED = {(2, 21): ("ncclNetPlugin_v8", "ncclTunerPlugin_v2")}


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
        " ldd /opt/venv/lib/python3.*/site-packages/horovod/tensorflow/mpi_lib*.so;"
        " python -c 'import tensorflow, horovod.tensorflow as hvd; print(\"nccl_built\", hvd.nccl_built())';"
        " python -m pip list --format=freeze | grep nvidia-nccl"
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
    # NCCL raised over TensorFlow's pin (requirements/nccl.txt): TensorFlow imports, Horovod's NCCL ops load
    assert re.search(r"^nccl_built (True|[1-9]\d*)$", out, re.MULTILINE), out[-2000:]
    assert f"{NCCL_PIN}\n" in out, out[-2000:]


def test_nccl_loads_the_efa_plugin_by_itself_and_its_init_runs_until_it_needs_a_gpu(
    gpu_image: BuiltImage, engine_env: dict[str, str]
) -> None:
    assert_one_libfabric_with_efa(gpu_image, engine_env)
    script = REPO / "tests" / "images" / "nccl_in_image.py"
    cmd = ["podman", "run", "--rm", "--network", "none", "-v", f"{script}:/check.py:ro", gpu_image.immutable]
    found = json.loads(run([*cmd, "python", "/check.py"], engine_env, 300).stdout.splitlines()[-1])

    major, minor, patch = (int(x) for x in NCCL_PIN.split("==")[1].split("."))
    assert found["nccl_version"] == major * 10000 + minor * 100 + patch
    net, tuner = ASKED[(major, minor)]  # a new NCCL: add what it asks for (and check the plugin has it)
    assert {net, tuner} <= set(found["exports"]), found["exports"]

    # NCCL itself loads the plugin by its default name and, through it, the one libfabric; no setting needed
    loads = found["nccl_loads"]
    assert loads["returncode"] == 0, loads
    assert "/opt/amazon/ofi-nccl/lib/libnccl-net.so" in loads["initialised"], loads
    assert "/opt/amazon/efa/lib/libfabric.so.1" in loads["initialised"], loads
    # (the plugin has no collective-network part: NCCL says so and goes on without one)
    fallback = ("Using internal network plugin", "Failed to find ncclNetPlugin", "Could not find")
    assert not [line for line in loads["nccl_lines"] if any(f in line for f in fallback)], loads["nccl_lines"]

    # The plugin's own init: its version and libfabric's, then it stops where a GPU driver is needed
    said = "\n".join(found["plugin_init"]["said"])
    assert f"NET/OFI Initializing aws-ofi-nccl {dockerfile_arg('AWS_OFI_NCCL_VERSION')}" in said, said
    api = ".".join(dockerfile_arg("LIBFABRIC_VERSION").split(".")[:2])  # libfabric's API version: 2.6
    assert f"NET/OFI Using Libfabric version {api}" in said, said
    # It found the CUDA runtime (as `libcudart.so`, install-efa.sh; without that name it stops one step
    # earlier, "Failed to find CUDA Runtime library", which on a GPU would leave NCCL on sockets) and stops
    # at the driver, which only a GPU machine has.
    assert "NET/OFI Failed to resolve CUDA function cuDriverGetVersion" in said, said
    assert "NET/OFI CUDA initialization failed" in said, said
    assert found["plugin_init"]["code"] != 0, found["plugin_init"]

    # The launcher's reading (the pre-flight's NCCL-network row): plugin and version found, the CUDA runtime
    # it names loads, libfabric lists its efa provider (fi_info -l) but no EFA device is here to try it
    net = found["nccl_net"]
    memlock = net.pop("memlock_kb")  # the engine's limit (unlimited: None)
    assert memlock is None or memlock >= 0
    plugin = dockerfile_arg("AWS_OFI_NCCL_VERSION")
    assert net == {
        "plugin": "/opt/amazon/ofi-nccl/lib/libnccl-net.so",
        "plugin_version": plugin,
        "plugin_error": None,
        "provider": False,
        "efa_devices": 0,
        "nccl_version": NCCL_PIN.split("==")[1],
        "nccl_setting": None,
        "fi_provider": None,
        "cudart_error": None,
        "provider_listed": True,
        "network": "Socket",
        "cell": f"Socket (aws-ofi-nccl {plugin}, efa provider, untried, 0 EFA)",
    }


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
