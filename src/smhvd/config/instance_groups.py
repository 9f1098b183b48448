"""Heterogeneous clusters: which hosts run the MPI job (`sagemaker_distribution_instance_groups`'s groups,
else every host), and what the others do: run the entry point once, as the toolkit does, until the job ends.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from smhvd.config.launcher_options import MpiOptions
from smhvd.config.sagemaker_files import ResourceConfig
from smhvd.errors import ConfigError
from smhvd.option_spec import key_of

KEY = key_of(MpiOptions, "distribution_groups")  # declared there, with its reader
SOURCE = "hyperparameters.json"


@dataclass(frozen=True)
class Placement:
    mpi_hosts: tuple[str, ...]  # sorted; the MPI leader is mpi_hosts[0]
    current_group: str | None
    distribution_groups: tuple[str, ...]  # () when every host runs MPI


def placement(
    resources: ResourceConfig, raw_resources: Mapping[str, object], wanted: tuple[str, ...]
) -> Placement:
    """Where MPI runs, from resourceconfig and the instance groups the hyperparameters name (`wanted`: the
    option's value; () for every host). Pure."""
    current = raw_resources.get("current_group_name")
    current_group = current if isinstance(current, str) and current else None
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
