"""A Job built from a tree's resourceconfig and the given (decoded) hyperparameters, as load_job would,
without what load_job looks up on this machine (its interfaces, routes, CPUs and GPUs)."""

from __future__ import annotations

import json

from smhvd.config.hyperparameters import split_hyperparameters
from smhvd.config.job import Hardware, Job
from smhvd.config.launcher_options import parse_launcher_options
from smhvd.config.paths import SageMakerPaths
from smhvd.config.sagemaker_files import parse_resource_config


def bare_job(paths: SageMakerPaths, hyperparameters: dict[str, object] | None = None) -> Job:
    reserved, user = split_hyperparameters(hyperparameters or {})
    return Job(
        paths=paths,
        resources=parse_resource_config(json.loads(paths.resource_config.read_text())),
        channels=(),
        raw_resources={},
        raw_input_data={},
        user_hyperparameters=user,
        options=parse_launcher_options(reserved),
        hardware=Hardware(cpus=2, gpus=0),
    )
