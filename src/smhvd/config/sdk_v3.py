"""SageMaker Python SDK v3 (`sagemaker.train.ModelTrainer`): its `source_code` jobs run through this launcher
(docs/sdk.md). As sagemaker-train 1.27.0 writes them: the channel `sm_drivers` carries sm_train.sh,
`sourcecode.json` (source_dir, requirements, entry_script, command, ...) and `distributed.json` (MPI:
process_count_per_node, mpi_additional_options as argv tokens; `{}` without `distributed`); the code is the
channel `code` (a source_dir .tar.gz arrives as that file); hyperparameters are strings as given, other values
JSON. This module reads them into the one Job (config/job.py).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from smhvd.config.hyperparameters import option_args
from smhvd.config.launcher_options import (
    MAX_PROCESSES_PER_HOST,
    CodeOrigin,
    LauncherOptions,
    checked_mpi_tokens,
)
from smhvd.config.paths import SageMakerPaths
from smhvd.config.sagemaker_files import check_path, optional_str, read_json
from smhvd.errors import ConfigError
from smhvd.option_spec import integer

log = logging.getLogger("smhvd")

DRIVERS_CHANNEL = "sm_drivers"
CODE_CHANNEL = "code"
TRAIN_SCRIPT = "sm_train.sh"
SOURCE_CODE_JSON = "sourcecode.json"
DISTRIBUTED_JSON = "distributed.json"
# The bash command v3 gives the container (constants.DEFAULT_CONTAINER_ARGUMENTS, drivers at /opt/ml).
SM_TRAIN_COMMAND = (
    "chmod +x /opt/ml/input/data/sm_drivers/sm_train.sh && /opt/ml/input/data/sm_drivers/sm_train.sh"
)

DistributedKind = Literal["none", "mpi", "other"]


@dataclass(frozen=True)
class SourceCode:
    entry_script: str | None
    command: str | None
    requirements: str | None  # a file in the code directory, installed with pip before the job
    source_dir: str | None  # the user's own path: only whether it names a .tar.gz matters here


@dataclass(frozen=True)
class Distributed:
    kind: DistributedKind
    process_count_per_node: int | None = None
    mpi_additional_options: tuple[str, ...] = ()


@dataclass(frozen=True)
class V3Job:
    drivers_dir: Path
    code_dir: Path
    source: SourceCode
    distributed: Distributed

    @property
    def code_location(self) -> Path:
        """The directory of the code, or the .tar.gz it came as (unpacked by the launcher)."""
        name = self.source.source_dir
        if name and name.endswith(".tar.gz"):
            return self.code_dir / PurePosixPath(name).name
        return self.code_dir

    @property
    def unsupported(self) -> str | None:
        """Why the launcher leaves this job to v3's own driver, or None when it runs it."""
        if self.source.command:
            return "SourceCode.command is a shell command of its own (v3 runs it with eval, once per host)"
        if self.distributed.kind == "other":
            return "distributed= is not MPI (e.g. Torchrun)"
        if not self.source.entry_script:
            return "SourceCode has no entry_script"
        return None


def _optional_str(data: Mapping[str, object], key: str, source: str) -> str | None:
    return optional_str(data, key, source, empty_is_none=True)


def _relative_path(data: Mapping[str, object], key: str, source: str) -> str | None:
    value = _optional_str(data, key, source)
    return None if value is None else check_path(value, source, key, "a path relative to source_dir")


def parse_source_code(data: object, source: str = SOURCE_CODE_JSON) -> SourceCode:
    if not isinstance(data, dict):
        raise ConfigError(source, None, "a JSON object (SourceCode's fields)", data)
    source_dir = _optional_str(data, "source_dir", source)
    if source_dir is not None and source_dir.endswith(".tar.gz"):  # the channel holds a file of this name
        check_path(PurePosixPath(source_dir).name, source, "source_dir", "a .tar.gz of a valid file name")
    return SourceCode(
        entry_script=_relative_path(data, "entry_script", source),
        command=_optional_str(data, "command", source),
        requirements=_relative_path(data, "requirements", source),
        source_dir=source_dir,
    )


def parse_distributed(data: object, source: str = DISTRIBUTED_JSON) -> Distributed:
    """{} -> no distributed; MPI's two keys -> mpi; anything else (Torchrun has `smp`) -> other."""
    if not isinstance(data, dict):
        raise ConfigError(source, None, "a JSON object (the distributed= config)", data)
    if not data:
        return Distributed("none")
    if set(data) != {"process_count_per_node", "mpi_additional_options"}:
        return Distributed("other")
    # read and bounded as sagemaker_mpi_num_of_processes_per_host is (null: per-host default)
    count = integer(1, MAX_PROCESSES_PER_HOST, source)(
        data["process_count_per_node"], "process_count_per_node"
    )
    options = data["mpi_additional_options"]
    if options is None:
        options = []
    if not isinstance(options, list) or not all(isinstance(o, str) for o in options):
        raise ConfigError(source, "mpi_additional_options", "a list of mpirun arguments or null", options)
    return Distributed("mpi", count, checked_mpi_tokens(options, source, "mpi_additional_options"))


def load(paths: SageMakerPaths) -> V3Job | None:
    """The v3 job this container was given, or None when there is no v3 drivers channel (any other job)."""
    drivers = paths.channel_dir(DRIVERS_CHANNEL)
    source_json = drivers / SOURCE_CODE_JSON
    if not (drivers / TRAIN_SCRIPT).is_file() or not source_json.is_file():
        return None
    distributed_json = drivers / DISTRIBUTED_JSON
    return V3Job(
        drivers_dir=drivers,
        code_dir=paths.channel_dir(CODE_CHANNEL),
        source=parse_source_code(read_json(source_json, required=True), str(source_json)),
        distributed=parse_distributed(read_json(distributed_json, required=False), str(distributed_json)),
    )


def apply(options: LauncherOptions, v3: V3Job) -> LauncherOptions:
    """The hyperparameters' options under v3's files: MPI on all hosts (or the script once per host), its
    script, code and requirements file, each error about them naming sourcecode.json."""
    dist = v3.distributed
    mpi = dataclasses.replace(
        options.mpi,
        enabled=dist.kind == "mpi",
        processes_per_host=dist.process_count_per_node or options.mpi.processes_per_host,
        custom_options=options.mpi.custom_options + dist.mpi_additional_options,
    )
    program = dataclasses.replace(
        options.program,
        program=v3.source.entry_script,
        submit_directory=str(v3.code_location),
        requirements=v3.source.requirements,
        origin=CodeOrigin(
            str(v3.drivers_dir / SOURCE_CODE_JSON), "entry_script", "source_dir", "requirements"
        ),
    )
    return dataclasses.replace(options, mpi=mpi, program=program)


def script_args(user_hyperparameters: Mapping[str, object]) -> list[str]:
    """The script's arguments as v3's drivers make them: `--key value` in file order, non-strings as JSON;
    a list is `--key item item ...`, as for SDK v2 (v3's drivers pass its JSON, one argument)."""
    args: list[str] = []
    for key, value in user_hyperparameters.items():
        args += option_args(f"--{key}", value, lambda v: v if isinstance(v, str) else json.dumps(v))
    return args


def env(v3: V3Job, paths: SageMakerPaths, leader: str, hosts: int) -> dict[str, str]:
    """Variables v3's environment.py sets that scripts written for v3 read (the toolkit's are set already).
    `leader`: the job's one leader (the first MPI host: instance groups count); `hosts`: all of them."""
    values = {
        "SM_SOURCE_DIR": str(v3.code_dir),
        "SM_ENTRY_SCRIPT": v3.source.entry_script or "",
        "SM_MASTER_ADDR": leader,
        "SM_MASTER_PORT": "7777",
        "SM_HOST_COUNT": str(hosts),
        "SM_INPUT_DATA_DIR": str(paths.data_dir),
        "SM_OUTPUT_FAILURE": str(paths.failure_file),
    }
    if v3.distributed.kind != "none":
        values["SM_DISTRIBUTED_DRIVER_DIR"] = str(v3.drivers_dir / "distributed_drivers")
        values["SM_DISTRIBUTED_CONFIG"] = json.dumps(
            {
                "process_count_per_node": v3.distributed.process_count_per_node,
                "mpi_additional_options": list(v3.distributed.mpi_additional_options),
            }
        )
    return values


def describe(v3: V3Job, processes_per_host: int, hosts: int) -> str:
    if v3.distributed.kind == "mpi":
        how = (
            f"MPI, {processes_per_host} process(es) per host on {hosts} host(s) instead of v3's mpi_driver.py"
        )
    else:
        how = "once on each host instead of v3's basic_script_driver.py"
    return f"SDK v3 ModelTrainer job: running {v3.source.entry_script} {how}"


def hand_back_command(environ: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """What runs in place of `train` for a job this launcher leaves to v3: v3's own sm_train.sh (what the
    container was told to run), without our BASH_ENV hook, as (argv, environment). Pure."""
    return ["/bin/bash", "-c", SM_TRAIN_COMMAND], {k: v for k, v in environ.items() if k != "BASH_ENV"}
