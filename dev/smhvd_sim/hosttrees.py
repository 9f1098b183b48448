"""Each host's own /opt/ml tree, laid out as SageMaker lays it out before it runs ``train``: written by the
project's one tree writer (smhvd_dev.mltree), with channels hard-linked and the code copied into the tree."""

from __future__ import annotations

import json
from pathlib import Path

from smhvd_dev.mltree import TreeError, write_ml_tree
from smhvd_sim.spec import INTERFACE, ClusterSpec
from smhvd_sim.system import ClusterError


def hyperparameters_for(spec: ClusterSpec) -> dict[str, str]:
    """The caller's hyperparameters; with a code directory, sagemaker_submit_directory points at the
    copy in each host's tree unless the caller chose otherwise."""
    result = dict(spec.hyperparameters)
    if spec.code_dir is not None:
        result.setdefault("sagemaker_submit_directory", json.dumps(str(spec.ml_path / "code")))
    return result


def write_host_tree(root: Path, spec: ClusterSpec, current_host: str) -> None:
    """Create ``root`` (seen as spec.ml_path inside the host) with config files, channels and output dirs."""
    try:
        write_ml_tree(
            root,
            current_host=current_host,
            hosts=spec.host_names,
            encoded_hyperparameters=hyperparameters_for(spec),
            channels=dict(spec.channels),
            input_config=spec.inputdataconfig,
            code_dir=spec.code_dir,
            copy_channels=True,
            network_interface_name=INTERFACE,
            instance_type=spec.instance_type,
        )
    except TreeError as exc:
        raise ClusterError(str(exc)) from exc
