"""The SM_* environment that SageMaker training scripts expect (names of the sagemaker-training toolkit).
Pure. `host_env` is the part that differs between hosts (hostenv/client.HOST_KEYS): each host's `train`
computes it for its own ranks, so that every rank sees its own SM_CURRENT_HOST.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from smhvd.config.hyperparameters import to_env_value
from smhvd.config.instance_groups import Placement, group_env
from smhvd.config.job import Job
from smhvd.config.sagemaker_files import ResourceConfig


def _json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _env_name(key: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in key).upper()


def host_env(
    resources: ResourceConfig,
    raw_resources: Mapping[str, object],
    cpus: int,
    gpus: int,
    training_env: Mapping[str, object],
) -> dict[str, str]:
    """Variables whose value depends on the host the process runs on."""
    env = {
        "SM_CURRENT_HOST": resources.current_host,
        "SM_NUM_CPUS": str(cpus),
        "SM_NUM_GPUS": str(gpus),
        "SM_RESOURCE_CONFIG": _json(raw_resources),
        "SM_TRAINING_ENV": _json(
            {**training_env, "current_host": resources.current_host, "num_cpus": cpus, "num_gpus": gpus}
        ),
    }
    if resources.network_interface_name:
        env["SM_NETWORK_INTERFACE_NAME"] = resources.network_interface_name
    if resources.current_instance_type:
        env["SM_CURRENT_INSTANCE_TYPE"] = resources.current_instance_type
    return env


def _log_level(job: Job) -> int:
    given = job.options.program.log_level  # 0 (logging.NOTSET) is a level, not a missing one
    return 20 if given is None else given


def _summary(job: Job, entry_point: str, module_dir: str) -> dict[str, object]:
    """SM_TRAINING_ENV (less what host_env adds: this host's own values)."""
    paths = job.paths
    return {
        "channel_input_dirs": {c.name: str(paths.channel_dir(c.name)) for c in job.channels},
        "current_host": job.resources.current_host,
        "hosts": list(job.resources.hosts),
        "hyperparameters": dict(job.user_hyperparameters),
        "input_config_dir": str(paths.config_dir),
        "input_data_config": dict(job.raw_input_data),
        "input_dir": str(paths.input_dir),
        "job_name": job.options.program.job_name,
        "log_level": _log_level(job),
        "model_dir": str(paths.model_dir),
        "module_dir": module_dir,
        "module_name": Path(entry_point).stem,
        "network_interface_name": job.resources.network_interface_name,
        "num_cpus": job.hardware.cpus,
        "num_gpus": job.hardware.gpus,
        "output_data_dir": str(paths.output_data_dir),
        "output_dir": str(paths.output_dir),
        "resource_config": dict(job.raw_resources),
        "user_entry_point": entry_point,
    }


def training_env(job: Job, code_dir: Path, entry_point: str, module_dir: str) -> dict[str, str]:
    """Every SM_* variable for a process of this job on this host."""
    paths = job.paths
    hps = job.user_hyperparameters
    channels = {c.name: str(paths.channel_dir(c.name)) for c in job.channels}
    env = {
        "SAGEMAKER_BASE_DIR": str(paths.base),
        "SM_HOSTS": _json(list(job.resources.hosts)),
        "SM_HPS": _json(dict(hps)),
        "SM_USER_ARGS": _json(list(job.script_args)),  # what the script's argv holds, whichever the SDK
        "SM_CHANNELS": _json(sorted(channels)),
        "SM_MODEL_DIR": str(paths.model_dir),
        "SM_OUTPUT_DATA_DIR": str(paths.output_data_dir),
        "SM_OUTPUT_INTERMEDIATE_DIR": str(paths.output_dir / "intermediate"),
        "SM_OUTPUT_DIR": str(paths.output_dir),
        "SM_INPUT_DIR": str(paths.input_dir),
        "SM_INPUT_CONFIG_DIR": str(paths.config_dir),
        "SM_INPUT_DATA_CONFIG": _json(dict(job.raw_input_data)),
        "SM_CHECKPOINT_DIR": str(paths.checkpoint_dir),
        "SM_LOG_LEVEL": str(_log_level(job)),
        "SM_USER_ENTRY_POINT": entry_point,
        "SM_MODULE_NAME": Path(entry_point).stem,
        "SM_MODULE_DIR": module_dir,
        "SM_CODE_DIR": str(code_dir),
        "SM_FRAMEWORK_MODULE": "",
    }
    if job.options.program.job_name:
        env["SM_JOB_NAME"] = job.options.program.job_name
    for name, directory in channels.items():
        env[f"SM_CHANNEL_{_env_name(name)}"] = directory
    for key, value in hps.items():
        env[f"SM_HP_{_env_name(key)}"] = to_env_value(value)
    env.update(job.script_env)  # SDK v3's SM_MASTER_ADDR, SM_DISTRIBUTED_CONFIG, ...
    env.update(group_env(job.resources, job.placement or Placement(job.resources.hosts, None, ())))
    summary = _summary(job, entry_point, module_dir)
    env.update(host_env(job.resources, job.raw_resources, job.hardware.cpus, job.hardware.gpus, summary))
    return env
