"""A fake CUDA runtime and NCCL (fake_gpu.c) for the GPU pre-flight where there is no GPU: compiled with `cc`
into one library, linked as libcudart.so.12 and libnccl.so.2, found through LD_LIBRARY_PATH as the real ones
are. Its devices are the entries of FAKE_GPU_DRIVER_DIR (a fake /proc/driver/nvidia/gpus) or FAKE_GPU_COUNT;
its all_reduce sleeps so that the bus bandwidth measured is FAKE_NCCL_BUSBW_GBPS (default 100)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from support.ci import unavailable

SOURCE = Path(__file__).with_name("fake_gpu.c")
NAMES = ("libcudart.so.12", "libnccl.so.2")


def build_fake_gpu(where: Path) -> Path:
    """`where`, holding the fake under both names (skipped without a C compiler, except under CI)."""
    cc = shutil.which("cc")
    if cc is None:
        unavailable("no C compiler (cc) to build the fake CUDA runtime and NCCL")
    where.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-o", str(where / "libfakegpu.so"), str(SOURCE)], check=True
    )
    for name in NAMES:
        (where / name).unlink(missing_ok=True)
        (where / name).symlink_to("libfakegpu.so")
    return where
