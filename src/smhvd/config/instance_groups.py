"""Heterogeneous clusters: which hosts run the MPI job, and what the others do.

The SDK's `instance_groups=[...]` with `distribution={"mpi": ..., "instance_groups": [group, ...]}`
becomes the hyperparameter `sagemaker_distribution_instance_groups` (a JSON list of group names) and
resourceconfig's `instance_groups` + `current_group_name`. MPI runs over the hosts of those groups only; the
leader is the first of them, sorted. A host of any other group does what the sagemaker-training toolkit
does for it (trainer.py: `RunnerType.MPI if mpi_enabled and current_instance_group in
distribution_instance_groups else RunnerType.Process`): it runs the entry point once, as a plain process
(e.g. a tf.data service feeding the GPU group). Unlike the toolkit's, such a host also ends with the job:
the leader tells it the job's end over the same link as its MPI workers, its script is stopped if still
running, and it exits with the job's code (or at once with its script's own code when that fails).

Without instance groups in resourceconfig (older files, SDK local mode), or without the hyperparameter, MPI
runs over every host (the toolkit would run one MPI job per group; one job over all hosts is what users
mean).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from smhvd.config.sagemaker_files import ResourceConfig
from smhvd.errors import ConfigError

KEY = "sagemaker_distribution_instance_groups"
SOURCE = "hyperparameters.json"


@dataclass(frozen=True)
class Placement:
    mpi_hosts: tuple[str, ...]  # sorted; the MPI leader is mpi_hosts[0]
    current_group: str | None
    distribution_groups: tuple[str, ...]  # () when every host runs MPI


def _group_names(value: object) -> tuple[str, ...]:
    if value in (None, "", []):
        return ()
    if isinstance(value, str):  # JSON text, if decoding left it a string
        try:
            value = json.loads(value)
        except ValueError:
            value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(SOURCE, KEY, "a list of instance group names", value)
    return tuple(dict.fromkeys(value))


def placement(
    resources: ResourceConfig, raw_resources: Mapping[str, object], reserved: Mapping[str, object]
) -> Placement:
    """Where MPI runs, from resourceconfig and the hyperparameters. Pure."""
    current = raw_resources.get("current_group_name")
    current_group = current if isinstance(current, str) and current else None
    wanted = _group_names(reserved.get(KEY))
    if not wanted or not resources.instance_groups:
        return Placement(resources.hosts, current_group, ())
    by_name = {g.name: g for g in resources.instance_groups}
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        raise ConfigError(
            SOURCE, KEY, f"names of instance groups in resourceconfig.json {sorted(by_name)}", unknown
        )
    hosts = sorted({host for name in wanted for host in by_name[name].hosts})
    return Placement(tuple(hosts), current_group, wanted)


def group_env(resources: ResourceConfig, where: Placement) -> dict[str, str]:
    """The toolkit's instance-group variables (SM_CURRENT_INSTANCE_GROUP, ...). Pure."""
    if not resources.instance_groups:
        return {}
    current_hosts = next(
        (list(g.hosts) for g in resources.instance_groups if resources.current_host in g.hosts), []
    )
    groups = [g.name for g in resources.instance_groups]
    return {
        "SM_CURRENT_INSTANCE_GROUP": where.current_group or "",
        "SM_CURRENT_INSTANCE_GROUP_HOSTS": json.dumps(current_hosts),
        "SM_INSTANCE_GROUPS": json.dumps(groups),
        "SM_DISTRIBUTION_INSTANCE_GROUPS": json.dumps(list(where.distribution_groups or groups)),
        "SM_IS_HETERO": json.dumps(len(groups) > 1),
    }
