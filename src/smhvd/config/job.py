"""Everything the launcher knows about the job, loaded once from the /opt/ml tree (and SDK v3's drivers
channel, when it has one: after loading, nothing knows which SDK wrote the files) and validated."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from smhvd.config import sdk_v3
from smhvd.config.hardware import interface_names, num_cpus, num_gpus, route_interface
from smhvd.config.hyperparameters import (
    decode_hyperparameters,
    key_warnings,
    split_hyperparameters,
    to_script_args,
)
from smhvd.config.instance_groups import Placement, placement
from smhvd.config.launcher_options import (
    LauncherOptions,
    MpiOptions,
    all_declarations,
    parse_launcher_options,
)
from smhvd.config.paths import SageMakerPaths
from smhvd.config.sagemaker_files import (
    Channel,
    ResourceConfig,
    parse_hyperparameters_file,
    parse_input_data_config,
    parse_resource_config,
    read_json,
)
from smhvd.errors import ConfigError, WaitTimeout
from smhvd.option_spec import key_of
from smhvd.proc.waiting import NotYet, wait_until

log = logging.getLogger("smhvd")
ROUTE_WAIT = 30.0  # how long peer names may take to resolve at start (container DNS can lag)


@dataclass(frozen=True)
class Hardware:
    cpus: int
    gpus: int


@dataclass(frozen=True)
class Job:
    paths: SageMakerPaths
    resources: ResourceConfig
    channels: tuple[Channel, ...]
    raw_resources: Mapping[str, object]
    raw_input_data: Mapping[str, object]
    user_hyperparameters: Mapping[str, object]
    options: LauncherOptions
    hardware: Hardware
    placement: Placement | None = None  # heterogeneous clusters: where MPI runs (None: on every host)
    # The script's arguments (from user_hyperparameters, by the rule of the SDK that wrote the files), and
    # variables that SDK promises scripts besides the toolkit's SM_* (SDK v3's SM_MASTER_ADDR, ...).
    script_args: tuple[str, ...] = ()
    script_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def multi_host(self) -> bool:
        """The job spans hosts: the leader links to every other host (MPI workers and hosts outside MPI)."""
        return len(self.resources.hosts) > 1

    @property
    def mpi_hosts(self) -> tuple[str, ...]:
        return self.placement.mpi_hosts if self.placement else self.resources.hosts

    @property
    def mpi_multi_host(self) -> bool:
        return len(self.mpi_hosts) > 1

    @property
    def leader(self) -> str:
        return self.mpi_hosts[0]

    @property
    def is_leader(self) -> bool:
        return self.resources.current_host == self.leader

    @property
    def runs_mpi_here(self) -> bool:
        return self.resources.current_host in self.mpi_hosts

    @property
    def peers(self) -> tuple[str, ...]:
        """Every host the leader links to: its MPI workers, then the hosts outside MPI."""
        return tuple(h for h in self.resources.hosts if h != self.leader)

    @property
    def processes_per_host(self) -> int:
        pph = self.options.mpi.processes_per_host
        return pph if pph is not None else max(self.hardware.gpus, 1)

    @property
    def num_processes(self) -> int:
        total = self.options.mpi.num_processes
        return total if total is not None else self.processes_per_host * len(self.mpi_hosts)


def load_job(
    paths: SageMakerPaths, hardware: Hardware | None = None, *, v3: sdk_v3.V3Job | None = None
) -> Job:
    """The job from the /opt/ml tree; `v3`: SDK v3's drivers channel (sdk_v3.load), read into the job before
    it is validated as a whole."""
    raw_resources = read_json(paths.resource_config, required=True)
    resources = parse_resource_config(raw_resources, str(paths.resource_config))
    raw_input = read_json(paths.input_data_config, required=False)
    channels = parse_input_data_config(raw_input, str(paths.input_data_config))
    raw_hps = parse_hyperparameters_file(
        read_json(paths.hyperparameters, required=False), str(paths.hyperparameters)
    )
    reserved, user = split_hyperparameters(decode_hyperparameters(raw_hps))
    resources_dict = raw_resources if isinstance(raw_resources, dict) else {}
    options = parse_launcher_options(reserved)
    for warning in key_warnings(reserved, {d.option.key for d in all_declarations()}):
        log.warning("%s", warning)
    job = Job(
        paths=paths,
        resources=resources,
        channels=channels,
        raw_resources=resources_dict,
        raw_input_data=raw_input if isinstance(raw_input, dict) else {},
        user_hyperparameters=user,
        options=options,
        hardware=hardware or Hardware(cpus=num_cpus(), gpus=num_gpus()),
        placement=placement(resources, resources_dict, options.mpi.distribution_groups),
        script_args=tuple(to_script_args(user)),
    )
    if v3 is not None:
        job = with_sdk_v3(job, v3)
    interfaces = interface_names() if job.multi_host else set()
    if job.multi_host and job.options.mpi.enabled:
        job = with_usable_interface(job, interfaces, route_interface)
    validate_job(job, interfaces)
    return job


def with_sdk_v3(job: Job, v3: sdk_v3.V3Job) -> Job:
    """The job as v3's files say: its options over the hyperparameters', the script's arguments as v3's
    drivers make them, and the variables v3's scripts read."""
    job = dataclasses.replace(
        job,
        options=sdk_v3.apply(job.options, v3),
        script_args=tuple(sdk_v3.script_args(job.user_hyperparameters)),
    )
    hosts = len(job.resources.hosts)
    log.info("%s", sdk_v3.describe(v3, job.processes_per_host, hosts))
    return dataclasses.replace(job, script_env=sdk_v3.env(v3, job.paths, job.leader, hosts))


def with_usable_interface(
    job: Job, interfaces: set[str], find_route: Callable[[str], str | None], wait: float = ROUTE_WAIT
) -> Job:
    """The job with an interface this host has: the named one, else the one routing to the other hosts (SDK
    v3 local mode names "ethwe", which no container has). Unchanged (and validate_job reports it) when no
    route is found. Logged at DEBUG in the SDKs' local modes (docs/sdk.md), where every run goes so."""
    named = job.resources.network_interface_name
    if named is None or named in interfaces:
        return job
    others = [h for h in job.resources.hosts if h != job.resources.current_host]

    def route() -> str | None:
        for host in others:
            found = find_route(host)
            if found in interfaces:
                return found
        raise NotYet(f"no route to {', '.join(others)} through an interface of this host")

    try:
        found = wait_until(route, what="a route to the other hosts", timeout=wait)
    except WaitTimeout:
        return job
    local_mode = (job.resources.current_instance_type or "").startswith("local")
    log.log(
        logging.DEBUG if local_mode else logging.WARNING,
        "%s: network_interface_name %r is not an interface of this host; using %s, which routes to the "
        "other hosts",
        job.paths.resource_config,
        named,
        found,
    )
    resources = dataclasses.replace(job.resources, network_interface_name=found)
    return dataclasses.replace(job, resources=resources)


def validate_job(job: Job, interfaces: set[str]) -> None:
    """Cross-file checks: only what can be known before anything starts."""
    mpi = job.options.mpi
    if mpi.enabled and job.num_processes > job.processes_per_host * len(job.mpi_hosts):
        raise ConfigError(
            "hyperparameters.json",
            key_of(MpiOptions, "num_processes"),
            f"at most {job.processes_per_host * len(job.mpi_hosts)} "
            f"({job.processes_per_host} per host x {len(job.mpi_hosts)} hosts)",
            job.num_processes,
        )
    iface = job.resources.network_interface_name
    if job.multi_host and mpi.enabled and iface is not None and iface not in interfaces:
        raise ConfigError(
            str(job.paths.resource_config),
            "network_interface_name",
            f"an interface of this host ({', '.join(sorted(interfaces))}); "
            "none routes to the other hosts either",
            iface,
        )
