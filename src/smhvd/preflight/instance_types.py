"""What a SageMaker instance type promises: its NVIDIA GPUs, and (where measured figures are known) the NCCL
all_reduce bus bandwidth over them. The pre-flight compares each host with this table; a type not in it is
compared with the other hosts of its instance group only.
"""

from __future__ import annotations


def _family(prefix: str, counts: dict[str, int]) -> dict[str, int]:
    return {f"ml.{prefix}.{size}": gpus for size, gpus in counts.items()}


_SINGLE = {"xlarge": 1, "2xlarge": 1, "4xlarge": 1, "8xlarge": 1, "16xlarge": 1}
# GPUs per instance type (AWS's instance type pages, Nov 2026): the GPU training types SageMaker offers.
GPU_COUNTS: dict[str, int] = {
    **_family("p2", {"xlarge": 1, "8xlarge": 8, "16xlarge": 16}),
    **_family("p3", {"2xlarge": 1, "8xlarge": 4, "16xlarge": 8}),
    "ml.p3dn.24xlarge": 8,
    "ml.p4d.24xlarge": 8,
    "ml.p4de.24xlarge": 8,
    "ml.p5.48xlarge": 8,
    "ml.p5e.48xlarge": 8,
    "ml.p5en.48xlarge": 8,
    **_family("g4dn", {**_SINGLE, "12xlarge": 4}),
    **_family("g5", {**_SINGLE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    **_family("g6", {**_SINGLE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
    **_family("g6e", {**_SINGLE, "12xlarge": 4, "24xlarge": 4, "48xlarge": 8}),
}
# NCCL all_reduce bus bandwidth (GB/s) over all of one instance's GPUs, large messages, as nccl-tests reports
# it for these NVSwitch systems (A100 NVLink3, H100/H200 NVLink4): approximate, so the pre-flight names a host
# only far below it (launcher_preflight_min_ratio of it).
EXPECTED_BUSBW_GBPS: dict[str, float] = {
    "ml.p4d.24xlarge": 230.0,
    "ml.p4de.24xlarge": 230.0,
    "ml.p5.48xlarge": 480.0,
    "ml.p5e.48xlarge": 480.0,
    "ml.p5en.48xlarge": 480.0,
}


def gpu_count(instance_type: str | None) -> int | None:
    """GPUs an instance type has; None for a type not listed (CPU types, local mode's "local"): only GPU types
    are held to a count. Pure."""
    return GPU_COUNTS.get(instance_type or "")
