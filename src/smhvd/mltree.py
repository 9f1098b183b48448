"""Write a SageMaker /opt/ml tree as the platform and the Python SDK do (for demos, tests, local runs)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from .paths import SageMakerPaths


def sdk_encode(hyperparameters: Mapping[str, object]) -> dict[str, str]:
    """JSON-encode every value, as the SageMaker Python SDK does ("2", "true", "\\"text\\"")."""
    return {key: json.dumps(value) for key, value in hyperparameters.items()}


def write_ml_tree(
    base: Path,
    *,
    current_host: str = "algo-1",
    hosts: Sequence[str] = ("algo-1",),
    hyperparameters: Mapping[str, object] | None = None,
    channels: Mapping[str, Path | None] | None = None,
    network_interface_name: str = "eth0",
    instance_type: str = "ml.c5.xlarge",
) -> SageMakerPaths:
    """Create the config files and directories; a channel's data is symlinked from the given path."""
    paths = SageMakerPaths(base)
    paths.config_dir.mkdir(parents=True, exist_ok=True)
    resource = {
        "current_host": current_host,
        "current_instance_type": instance_type,
        "current_group_name": "homogeneousCluster",
        "hosts": list(hosts),
        "instance_groups": [
            {
                "instance_group_name": "homogeneousCluster",
                "instance_type": instance_type,
                "hosts": list(hosts),
            }
        ],
        "network_interface_name": network_interface_name,
    }
    paths.resource_config.write_text(json.dumps(resource))
    paths.hyperparameters.write_text(json.dumps(sdk_encode(hyperparameters or {})))
    input_config = {
        name: {
            "ContentType": "application/x-npz",
            "TrainingInputMode": "File",
            "S3DistributionType": "FullyReplicated",
            "RecordWrapperType": "None",
        }
        for name in (channels or {})
    }
    paths.input_data_config.write_text(json.dumps(input_config))
    for name, source in (channels or {}).items():
        target = paths.channel_dir(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        if source is None:
            target.mkdir(exist_ok=True)
        elif not target.exists():
            target.symlink_to(source.resolve(), target_is_directory=True)
    for directory in (paths.model_dir, paths.output_data_dir, paths.checkpoint_dir):
        directory.mkdir(parents=True, exist_ok=True)
    return paths
