"""The EFA checks both images share (test_efa_image.py, test_gpu_image.py): one libfabric.so.1, built with its
efa provider, loaded by fi_info and linked by every Open MPI library that uses libfabric."""

from __future__ import annotations

import re

from support.dockerfile import dockerfile_arg

from .helpers import BuiltImage, run

EFA_LIB = "/opt/amazon/efa/lib/"
# Everything in the image that links libfabric: Open MPI's ofi components and the library they share.
LINKS_LIBFABRIC = (
    "find /usr/lib -type f \\( -name 'mca_[mb]tl_ofi.so' -o -name 'libmca_common_ofi.so.*' \\) | sort"
)


def libfabric_report(image: BuiltImage, engine_env: dict[str, str]) -> str:
    """fi_info's providers and version, every libfabric file and loader-cache entry, and `ldd -r` of every
    Open MPI library that links libfabric, each under a heading line."""
    script = (
        "echo '## providers'; fi_info -l; echo '## version'; fi_info --version;"
        " echo '## files'; find / -xdev -name 'libfabric.so*' | sort;"
        " echo '## cache'; ldconfig -p | grep libfabric;"
        f' for f in $({LINKS_LIBFABRIC}); do echo "## ldd $f"; ldd -r "$f" 2>&1; done'
    )
    cmd = ["podman", "run", "--rm", "--network", "none", image.immutable, "bash", "-c", script]
    return run(cmd, engine_env, timeout=300).stdout


def sections(report: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for block in report.split("## ")[1:]:
        head, _, body = block.partition("\n")
        out[head.strip()] = [line.strip() for line in body.splitlines() if line.strip()]
    return out


def assert_one_libfabric_with_efa(image: BuiltImage, engine_env: dict[str, str]) -> None:
    """The checks shared by both images (test_gpu_image.py calls this too)."""
    found = sections(libfabric_report(image, engine_env))
    assert "efa:" in found["providers"], found["providers"]
    assert f"libfabric: {dockerfile_arg('LIBFABRIC_VERSION')}" in found["version"], found["version"]
    assert found["files"] and all(f.startswith(EFA_LIB) for f in found["files"]), found["files"]
    assert found["cache"] and all(f"=> {EFA_LIB}" in line for line in found["cache"]), found["cache"]
    linked = {head for head in found if head.startswith("ldd ")}
    assert len(linked) == 3, linked  # mca_mtl_ofi, mca_btl_ofi, libmca_common_ofi
    for head in linked:
        lines = found[head]
        resolved = rf"libfabric\.so\.1 => {EFA_LIB}libfabric\.so\.1 "
        assert any(re.match(resolved, line) for line in lines), lines
        # every libfabric symbol version Debian's Open MPI 4.1 links (FABRIC_1.0 to 1.5) is defined
        assert not [line for line in lines if "FABRIC" in line or "not found" in line], lines
