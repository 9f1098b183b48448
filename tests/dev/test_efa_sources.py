"""EFA's sources for the image build (docker/scripts/build-efa.sh, bin/build.sh), checked without building
an image: the tree hashes pinned in docker/Dockerfile are those of the vendored archives (a pin that does not
match would stop every image build), a wrong archive stops the build naming both hashes, and a local folder
that does not exist is a one-line error before anything runs."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from support.ci import unavailable
from support.dockerfile import dockerfile_arg

pytestmark = pytest.mark.integration  # runs bash scripts

REPO = Path(__file__).resolve().parents[2]
BUILD_EFA = REPO / "docker" / "scripts" / "build-efa.sh"
SOURCES = (("libfabric", "LIBFABRIC"), ("aws-ofi-nccl", "AWS_OFI_NCCL"))


@pytest.fixture(scope="module")
def vendor() -> Path:
    """The folder bin/build.sh takes the archives from: $SMHVD_VENDOR_DIR, else ../shared/vendor."""
    where = Path(os.environ.get("SMHVD_VENDOR_DIR") or REPO.parent / "shared" / "vendor")
    if not where.is_dir():
        unavailable(f"no vendored EFA sources at {where} (SMHVD_VENDOR_DIR)")
    return where


def bash(script: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`script` with `args`, this environment plus `env`; its output as text, whatever its exit."""
    argv = ["bash", str(script), *args]
    return subprocess.run(
        argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=120, check=False
    )


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="tar")
    (top,) = dest.iterdir()
    return top


@pytest.mark.parametrize(("name", "arg"), SOURCES)
def test_the_pinned_tree_hash_is_the_vendored_archives(vendor: Path, tmp_path: Path, name: str, arg: str):
    archive = vendor / f"{name}-{dockerfile_arg(f'{arg}_VERSION')}.tar.gz"
    tree = unpack(archive, tmp_path)
    got = bash(BUILD_EFA, "tree-hash", str(tree)).stdout.strip()
    assert got == dockerfile_arg(f"{arg}_TREE_SHA256")
    if name == "aws-ofi-nccl":  # release archives add .release_version; the hash leaves it out
        (tree / ".release_version").unlink()
        assert bash(BUILD_EFA, "tree-hash", str(tree)).stdout.strip() == got


def test_an_archive_that_does_not_hash_to_the_pin_stops_the_build_naming_both(vendor: Path):
    version = dockerfile_arg("LIBFABRIC_VERSION")
    pins = {"LIBFABRIC_VERSION": version, "LIBFABRIC_TREE_SHA256": "0" * 64}
    proc = bash(
        BUILD_EFA,
        "libfabric",
        str(vendor),
        **pins,
        LIBFABRIC_URL="https://unused.invalid/",
        CUDA_HOME="/none",
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"build-efa: libfabric {version}: the source tree of {vendor}/libfabric-{version}.tar.gz hashes to "
        f"{dockerfile_arg('LIBFABRIC_TREE_SHA256')}, not the pinned {'0' * 64} (another version: pin its "
        "tree hash, build-efa.sh tree-hash DIR)"
    )


def test_a_vendor_folder_that_does_not_exist_is_a_one_line_error(tmp_path: Path):
    missing = tmp_path / "nowhere"
    proc = bash(REPO / "bin" / "build.sh", "cpu", SMHVD_VENDOR_DIR=str(missing))
    assert (proc.returncode, proc.stderr) == (2, f"build.sh: SMHVD_VENDOR_DIR={missing}: no such directory\n")
