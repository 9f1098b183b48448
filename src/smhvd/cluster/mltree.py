"""Each host's own /opt/ml tree, laid out as SageMaker lays it out before it runs ``train``."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from smhvd.cluster.errors import ClusterError
from smhvd.cluster.spec import ClusterSpec, resource_config

DEFAULT_CHANNEL_CONFIG = {
    "TrainingInputMode": "File",
    "S3DistributionType": "FullyReplicated",
    "RecordWrapperType": "None",
}


def _link_or_copy(src: str, dst: str) -> None:
    """Hard-link channel files (data is read-only by convention, and large); copy across filesystems."""
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def hyperparameters_for(spec: ClusterSpec) -> dict[str, str]:
    """The caller's hyperparameters; with a code directory, sagemaker_submit_directory points at the
    copy in each host's tree unless the caller chose otherwise."""
    result = dict(spec.hyperparameters)
    if spec.code_dir is not None:
        result.setdefault("sagemaker_submit_directory", json.dumps(str(spec.ml_path / "code")))
    return result


def inputdataconfig_for(spec: ClusterSpec) -> dict[str, object]:
    """The caller's inputdataconfig, with a default File-mode entry for every channel it does not name."""
    result = dict(spec.inputdataconfig)
    for channel in spec.channels:
        result.setdefault(channel, dict(DEFAULT_CHANNEL_CONFIG))
    return result


def write_ml_tree(root: Path, spec: ClusterSpec, current_host: str) -> None:
    """Create ``root`` (seen as spec.ml_path inside the host) with config files, channels and output dirs."""
    config_dir = root / "input" / "config"
    config_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "resourceconfig.json": resource_config(current_host, spec.host_names, spec.instance_type),
        "hyperparameters.json": hyperparameters_for(spec),
        "inputdataconfig.json": inputdataconfig_for(spec),
    }
    for name, content in files.items():
        (config_dir / name).write_text(json.dumps(content, indent=1) + "\n")
    for channel, source in spec.channels.items():
        if not source.is_dir():
            raise ClusterError(f"channel {channel}: {source} is not a directory")
        target = root / "input" / "data" / channel
        shutil.copytree(source, target, copy_function=_link_or_copy, dirs_exist_ok=True)
    if spec.code_dir is not None:
        if not spec.code_dir.is_dir():
            raise ClusterError(f"code directory {spec.code_dir} is not a directory")
        shutil.copytree(spec.code_dir, root / "code", dirs_exist_ok=True)
    for sub in ("model", "output/data"):
        (root / sub).mkdir(parents=True, exist_ok=True)
