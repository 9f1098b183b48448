"""The figures that README.md and docs/ share with a file of the repository are the same: versions
pinned by the scripts and requirements, the images' defaults and size budgets, the local-run defaults. A
figure changed in one place and not the other fails here, naming both. (Measured figures, timings and sizes
of a run, are recorded by the tests that measure them: build/images-test/timings.jsonl.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def read(path: str) -> str:
    return (REPO / path).read_text()


def found(pattern: str, path: str) -> set[str]:
    """Every value the pattern's group captures in the file; at least one."""
    values = set(re.findall(pattern, read(path), re.MULTILINE))
    assert values, f"{path}: no match for {pattern!r} (the figure moved: update this test)"
    return values


def one(pattern: str, path: str) -> str:
    (value,) = found(pattern, path)
    return value


SAME = [
    # (what, pattern in the page, page, pattern in the source, source)
    (
        "the SDK v2 pin",
        r"`sagemaker==(2\.[\d.]+)`",
        "docs/sdk.md",
        r"^SAGEMAKER_VERSION=(\S+)$",
        "bin/sdk-venv.sh",
    ),
    (
        "the podman-compose pin",
        r"`podman-compose==([\d.]+)`",
        "docs/sdk.md",
        r"^PODMAN_COMPOSE_VERSION=(\S+)$",
        "bin/sdk-venv.sh",
    ),
    (
        "the SDK v3 pin",
        r"`sagemaker==(3\.[\d.]+)`",
        "docs/sdk.md",
        r"^SAGEMAKER_VERSION=(\S+)$",
        "bin/sdk-v3-venv.sh",
    ),
    (
        "TensorFlow in the README",
        r"TensorFlow (\d+\.\d+\.\d+)",
        "README.md",
        r"^tensorflow-cpu==(\S+)$",
        "requirements/stack.txt",
    ),
    (
        "TensorFlow in images.md",
        r"TensorFlow (\d+\.\d+\.\d+)",
        "docs/images.md",
        r"^tensorflow-cpu==(\S+)$",
        "requirements/stack.txt",
    ),
    (
        "Horovod in the README",
        r"Horovod (\d+\.\d+\.\d+)",
        "README.md",
        r"^horovod==(\S+)$",
        "requirements/horovod.txt",
    ),
    (
        "Horovod in images.md",
        r"Horovod (\d+\.\d+\.\d+)",
        "docs/images.md",
        r"^horovod==(\S+)$",
        "requirements/horovod.txt",
    ),
    (
        "the images' TensorFlow log level",
        r"The images set `TF_CPP_MIN_LOG_LEVEL=(\d)`",
        "docs/output.md",
        r"^ENV TF_CPP_MIN_LOG_LEVEL=(\d)$",
        "docker/Dockerfile",
    ),
    (
        "the CPU image's size budget",
        r"Budgets: CPU <= ([\d.]+) GB",
        "docs/images.md",
        r'info\["Size"\] <= ([\d.]+) \* GB',
        "tests/images/test_cpu_image.py",
    ),
    (
        "the GPU image's size budget",
        r"Budgets: CPU <= [\d.]+ GB, GPU <= ([\d.]+) GB",
        "docs/images.md",
        r'info\["Size"\] <= ([\d.]+) \* GB',
        "tests/images/test_gpu_image.py",
    ),
    (
        "SciPy for tensorpack's example",
        r"scipy==([\d.]+)",
        "docs/tensorpack-example.md",
        r'^SCIPY = "scipy==([\d.]+)"',
        "tests/images/test_maskrcnn_tryout.py",
    ),
    (
        "the leader's sshd check's first line (what keeps sshd from logging kex_exchange_identification)",
        r"`(SSH-2\.0-\w+)`",
        "docs/sdk.md",
        r'^PROBE_IDENTIFICATION = b"(SSH-2\.0-\w+)\\r\\n"',
        "src/smhvd/link/connect.py",
    ),
    (
        "local-train's exit code for --gpu without a GPU",
        r"cannot give a container its GPUs exits (\d+) with one line",
        "README.md",
        r"^EX_UNAVAILABLE=(\d+)",
        "bin/local-train.sh",
    ),
    (
        "local-train's /dev/shm",
        r"gives the container\s+the (\d+) GB `/dev/shm`",
        "README.md",
        r"^shm_size=(\d+)g$",
        "bin/local-train.sh",
    ),
]


@pytest.mark.parametrize(("what", "page_re", "page", "source_re", "source"), SAME, ids=[s[0] for s in SAME])
def test_a_figure_in_the_docs_is_the_one_in_the_repository(
    what: str, page_re: str, page: str, source_re: str, source: str
) -> None:
    in_source = one(source_re, source)
    in_page = found(page_re, page)
    assert in_page == {in_source}, f"{what}: {page} says {sorted(in_page)}, {source} says {in_source}"


def test_the_registry_example_uses_the_scripts_default_port() -> None:
    """README's `make registry REGISTRY_PORT=5000` and bin/local-registry.sh's default are the same port, and
    the push line beside it names that port."""
    default = one(r"^port=(\d+)$", "bin/local-registry.sh")
    assert one(r"^REGISTRY_PORT \?= (\d+)$", "mk/images.mk") == default
    assert found(r"make registry REGISTRY_PORT=(\d+)", "README.md") == {default}
    assert found(r"bin/push.sh --registry 127\.0\.0\.1:(\d+)", "README.md") == {default}
