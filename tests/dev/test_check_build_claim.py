"""docs/images.md: `horovodrun --check-build` shows `[X] PyTorch` in an image without PyTorch, because
`horovod.torch` imports without torch (issue 52 saw it in the GPU image and took it for a PyTorch). Checked on
make setup's venv, which has the images' Horovod build (0.28.1, no PyTorch): the same check, a second."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # a Python process importing horovod

CHECK = """
import importlib.util
from horovod.common.util import extension_available  # what check-build's PyTorch row calls
assert importlib.util.find_spec("torch") is None, "torch is installed: the claim cannot be checked here"
print(extension_available("torch"), extension_available("mxnet"))  # MXNet, also absent, is not marked
"""


def test_check_build_marks_pytorch_without_torch() -> None:
    pytest.importorskip("horovod")
    proc = subprocess.run(
        [sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "False"], proc.stdout + proc.stderr
