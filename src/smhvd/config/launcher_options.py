"""The launcher's options, typed, from the reserved hyperparameters (sagemaker_, horovod_, launcher_ keys).

Each option is declared once, as a field below (option_spec.py): its key, type, default, reader and
bounds, the variables it sets on every rank and its line in the docs tables, which
`python -m smhvd_dev.option_docs` writes from these declarations (a test fails when the docs differ).
Unknown `horovod_*` and `launcher_*` keys are errors (a typo must not pass silently); the `sagemaker_*` keys
declared here are the only ones the launcher reads, and any other is a warning naming the closest known key
(hyperparameters.key_warnings), unless the SDKs are known to send it for other containers (SDK_SENT_KEYS).
"""
# ruff: noqa: RUF009 (option() is a dataclasses.field with the declaration in its metadata, not a default)

from __future__ import annotations

import itertools
import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from smhvd.config.hyperparameters import MAX_TOTAL_BYTES, carriable
from smhvd.config.mpi_defaults import MPI_DEFAULT_NAMES, user_names
from smhvd.config.sagemaker_files import shown_key
from smhvd.errors import ConfigError
from smhvd.option_spec import (
    SOURCE,
    Declared,
    Variable,
    choice,
    declarations,
    flag,
    integer,
    key_of,
    names,
    names_of,
    number,
    option,
    option_env,
    output_file,
    read_options,
    string,
    when_given,
    when_on,
)

# Ranks per host (and in all, per host): at most this many. Open MPI reads -np as a C int (a larger value
# wraps, e.g. to -1), and the largest SageMaker instances have 192 vCPUs and 8 GPUs: 1024 processes on one
# host is already far beyond what can run there, and any bound keeps a typo from reaching mpirun.
MAX_PROCESSES_PER_HOST = 1024
# Timeouts: SageMaker's longest allowed max_run is 28 days; select() refuses much larger timeouts.
MAX_SECONDS = 28 * 24 * 3600
PEER_TIMEOUT = 600.0  # leader: how long to wait for every worker's sshd (launcher_peer_timeout_seconds)
LEADER_TIMEOUT = 900.0  # worker: how long to wait for the leader to start (launcher_leader_timeout_seconds)
# Horovod reads these as C ints / int64 byte counts: bounds far above any useful value, below any overflow.
MAX_FUSION_THRESHOLD_MB = 1024 * 1024  # 1 TiB
MAX_CYCLE_TIME_MS = 3_600_000.0
HOROVOD_LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")
# The keys of the code's origin, written here once: CodeOrigin's defaults name them before ProgramOptions
# (which holds a CodeOrigin) declares them.
PROGRAM_KEY = "sagemaker_program"
SUBMIT_DIRECTORY_KEY = "sagemaker_submit_directory"


@dataclass(frozen=True)
class CodeOrigin:
    """The file and keys that named the program and its code, for the errors about them."""

    file: str = SOURCE
    program_key: str = PROGRAM_KEY
    directory_key: str = SUBMIT_DIRECTORY_KEY
    requirements_key: str | None = None  # the key that named the requirements file (then it must exist)

    @property
    def requirements_named_by(self) -> tuple[str, str] | None:
        """(file, key) that asked for the requirements file by name; None: requirements.txt if present."""
        return None if self.requirements_key is None else (self.file, self.requirements_key)


HYPERPARAMETERS_ORIGIN = CodeOrigin()


@dataclass(frozen=True)
class ProgramOptions:
    """What runs, and where its code comes from."""

    program: str | None = option(
        PROGRAM_KEY,
        None,
        string,
        "the entry point, relative to the code directory (`.py`: run with the venv's Python; `.sh`: bash)",
        shown_default="env `SAGEMAKER_PROGRAM`",
    )
    submit_directory: str | None = option(
        SUBMIT_DIRECTORY_KEY,
        None,
        string,
        "a local directory (used in place), a local `.tar.gz` / `file://`, or `s3://bucket/key.tar.gz` "
        "(boto3; `AWS_ENDPOINT_URL_S3` overrides the endpoint)",
        shown_default="`/opt/ml/code`",
    )
    region: str | None = option(
        "sagemaker_region", None, string, "the AWS region of the `s3://` code download (set by the SDK)"
    )
    job_name: str | None = option(
        "sagemaker_job_name", None, string, "the training job's name: `SM_JOB_NAME` (set by the SDK)"
    )
    log_level: int | None = option(
        "sagemaker_container_log_level",
        None,
        integer(0, 50),
        "the SDK's `container_log_level` (`logging.DEBUG` = 10, ...): the launcher's own log level, unless "
        "`SMHVD_LOG_LEVEL` (or `train --log-level`) is set",
        shown_default="20 (INFO)",
    )
    requirements: str | None = "requirements.txt"  # installed with pip before the job (SDK v3: its own name)
    origin: CodeOrigin = HYPERPARAMETERS_ORIGIN  # SDK v3: its sourcecode.json (sdk_v3.apply)


@dataclass(frozen=True)
class MpiOptions:
    enabled: bool = option(
        "sagemaker_mpi_enabled",
        True,
        flag,
        "run under mpirun. **Default on, for one host and for several**: this image exists to run Horovod, "
        "and one process per host under mpirun costs ~0.3 s. `false`: every host runs the script once, "
        "directly",
        readme="`false`: the script runs once per host, without mpirun",
    )
    processes_per_host: int | None = option(
        "sagemaker_mpi_num_of_processes_per_host",
        None,
        integer(1, MAX_PROCESSES_PER_HOST),
        f"ranks per host, at most {MAX_PROCESSES_PER_HOST} (Open MPI reads `-np` as a C int; the largest "
        "instances have 192 vCPUs, 8 GPUs)",
        shown_default="one per GPU, else 1",
        readme="ranks per host (SDK: `processes_per_host` / `process_count_per_node`; at most "
        f"{MAX_PROCESSES_PER_HOST})",
    )
    num_processes: int | None = option(  # (validate_job then holds it to per-host x hosts)
        "sagemaker_mpi_num_processes",
        None,
        integer(1, 2**31 - 1),
        "total ranks (at most per-host x hosts)",
        shown_default="per-host x hosts",
    )
    custom_options: tuple[str, ...] = option(
        "sagemaker_mpi_custom_mpi_options",
        (),
        lambda value, key: split_mpi_options(value, key),  # (defined below, with the toolkit's forms)
        "extra mpirun options, split with `shlex` (quotes work), placed after the defaults; an option that "
        "sets a default (below), or that Open MPI refuses beside it, **replaces** it",
        shown_default='`""`',
        readme="extra mpirun options, split with `shlex`; one that sets a default replaces it",
    )
    distribution_groups: tuple[str, ...] = option(  # (instance_groups.placement holds it to resourceconfig)
        "sagemaker_distribution_instance_groups",
        (),
        lambda value, key: group_names(value, key),  # (defined below)
        'the instance groups whose hosts run MPI (SDK v2: `distribution={..., "instance_groups": [...]}`); '
        "the other hosts run the script once (docs/multi-host.md, heterogeneous clusters)",
        shown_default="every host",
    )
    drop_defaults: frozenset[str] = option(
        "launcher_drop_mpi_defaults",
        frozenset(),
        names_of(MPI_DEFAULT_NAMES, "mpirun defaults"),
        "comma-separated names of defaults to remove, e.g. `mpi_yield_when_idle,bind-to`; each must be a "
        "name of the defaults table below (a typo is an error)",
        readme="names of the launcher's mpirun defaults to leave out",
    )


INFLIGHT_POLICIES = ("off", "warn")


@dataclass(frozen=True)
class LauncherOwnOptions:
    peer_timeout: float = option(
        "launcher_peer_timeout_seconds",
        PEER_TIMEOUT,
        number(1, MAX_SECONDS),
        "leader: how long to wait for every worker, from its start; the error names each host that never "
        "answered and its last ssh error",
        readme="how long the leader waits for every worker",
    )
    leader_timeout: float = option(
        "launcher_leader_timeout_seconds",
        LEADER_TIMEOUT,
        number(1, MAX_SECONDS),
        "worker: how long to wait for the leader to start the job, from its start (a leader that ends before "
        "the start tells its workers at once)",
        readme="how long a worker waits for the leader",
    )
    forward_env: tuple[str, ...] = option(
        "launcher_forward_env",
        (),
        names,
        "extra variable names or `PREFIX*` patterns forwarded to every rank",
        readme="more variable names (or `PREFIX*`) forwarded to every rank",
    )
    forward_aws_credentials: bool = option(
        "launcher_forward_aws_credentials",
        False,
        flag,
        "also forward AWS credential variables to ranks (see below)",
        readme="also forward AWS credential variables to ranks",
    )
    hang_dump_seconds: float | None = option(
        "launcher_hang_dump_seconds",
        None,
        number(1, MAX_SECONDS),
        'stack dumps of every rank when no rank has written output for this long (see "Hung jobs")',
        shown_default="off",
        readme="stack dumps of every rank after this long without output",
    )
    inflight: str = option(
        "launcher_inflight",
        "warn",
        choice(*INFLIGHT_POLICIES),
        "while the job runs, name the host whose ranks reach the collective last in most steps, by a margin "
        "that matters, and what slows it (docs/inflight.md); `off`: nothing is measured",
        shown_default="`warn`",
        readme="name the host that slows every step while the job runs: `warn` or `off`",
    )
    tag_output: bool = option(  # (mpi/lines.py)
        "launcher_tag_output",
        True,
        flag,
        "each line a rank prints reaches the log whole and tagged `[RANK,HOST]<stdout>: ` (or `<stderr>`); "
        "`false`: whole lines, untagged (see below)",
        readme="tag each line `[RANK,HOST]<stdout>: `; `false`: whole lines, untagged",
    )


PREFLIGHT_POLICIES = ("off", "warn", "fail")


@dataclass(frozen=True)
class PreflightOptions:
    """The pre-flight: every host measured before the script starts (preflight/, docs/preflight.md)."""

    policy: str = option(
        "sagemaker_preflight",
        "warn",
        choice(*PREFLIGHT_POLICIES),
        "the pre-flight before the script (docs/preflight.md): `warn` logs a named host and goes on, `fail` "
        "stops the job (exit 75) before the script starts, `off` skips it",
        shown_default="`warn`",
        readme="pre-flight of every host before the script: `off`, `warn` or `fail` (exit 75)",
    )
    timeout: float = option(
        "launcher_preflight_timeout_seconds",
        60.0,
        number(1, MAX_SECONDS),
        "the pre-flight's bound: a host without its results by then is named (one whose probe falls silent "
        "is named after at most 10 s of silence, or this, whichever is shorter)",
    )
    min_ratio: float = option(
        "launcher_preflight_min_ratio",
        0.5,
        number(0, 1),
        "a link's bandwidth (or a host's GPU bus bandwidth) below this fraction of the median, or of the "
        "instance type's figure, names it",
    )
    min_shm_mb: float | None = option(
        "launcher_preflight_min_shm_mb",
        None,
        number(0, MAX_FUSION_THRESHOLD_MB),
        "a host with less free `/dev/shm` is named; by default what the job needs there: 4 MB a rank (Open "
        "MPI) and 64 MB a GPU in use (NCCL), per host (docs/preflight.md); a container's default is 64 MB",
        shown_default="derived",
    )
    min_free_disk_mb: float = option(
        "launcher_preflight_min_free_disk_mb",
        1024.0,
        number(0, MAX_FUSION_THRESHOLD_MB * 1024),
        "a host with less free space where checkpoints, the model or the output go, or in the temporary "
        "directory, is named",
    )
    max_clock_offset: float = option(
        "launcher_preflight_max_clock_offset_seconds",
        5.0,
        number(0, MAX_SECONDS),
        "a host whose clock differs from the leader's by more is named",
    )


@dataclass(frozen=True)
class HorovodOptions:
    """Horovod's own settings: HOROVOD_* variables on every rank."""

    timeline: bool = option(
        "horovod_timeline",
        False,
        flag,
        "Horovod timeline to `/opt/ml/output/data/horovod_timeline.json`",
        sets=(Variable("HOROVOD_TIMELINE", output_file("horovod_timeline.json")),),
        readme="Horovod's timeline, in the job's output",
    )
    timeline_mark_cycles: bool = option(
        "horovod_timeline_mark_cycles",
        False,
        flag,
        "mark Horovod's background cycles in the timeline",
        sets=(Variable("HOROVOD_TIMELINE_MARK_CYCLES", when_on()),),
    )
    autotune: bool = option(
        "horovod_autotune",
        False,
        flag,
        "autotuning, log in `/opt/ml/output/data/horovod_autotune_log.csv`",
        sets=(
            Variable("HOROVOD_AUTOTUNE", when_on()),
            Variable("HOROVOD_AUTOTUNE_LOG", output_file("horovod_autotune_log.csv")),
        ),
        readme="Horovod's autotuning, its log in the job's output",
    )
    fusion_threshold_mb: float | None = option(
        "horovod_fusion_threshold_mb",
        None,
        number(0, MAX_FUSION_THRESHOLD_MB),
        "tensor fusion buffer, MiB",
        shown_default="Horovod's (128)",
        sets=(Variable("HOROVOD_FUSION_THRESHOLD", when_given(lambda mb: str(int(mb * 1024 * 1024)))),),
        readme="Horovod's tensor fusion buffer, MiB",
    )
    cycle_time_ms: float | None = option(
        "horovod_cycle_time_ms",
        None,
        number(0.01, MAX_CYCLE_TIME_MS),
        "background cycle time",
        shown_default="Horovod's (1 ms)",
        sets=(Variable("HOROVOD_CYCLE_TIME", when_given(lambda ms: f"{ms:g}")),),
    )
    stall_check_seconds: int | None = option(
        "horovod_stall_check_seconds",
        None,
        integer(0, MAX_SECONDS),
        "stall warning after N s; `0` disables the check",
        shown_default="Horovod's (60)",
        sets=(
            Variable("HOROVOD_STALL_CHECK_DISABLE", lambda seconds, _: "1" if seconds == 0 else None),
            Variable(
                "HOROVOD_STALL_CHECK_TIME_SECONDS", lambda seconds, _: str(seconds) if seconds else None
            ),
        ),
    )
    stall_shutdown_seconds: int | None = option(
        "horovod_stall_shutdown_seconds",
        None,
        integer(0, MAX_SECONDS),
        "abort the job after a stall of N s",
        shown_default="Horovod's",
        sets=(Variable("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", when_given(str)),),
    )
    log_level: str | None = option(
        "horovod_log_level",
        None,
        choice(*HOROVOD_LOG_LEVELS),
        f"{', '.join(HOROVOD_LOG_LEVELS[:-1])} or {HOROVOD_LOG_LEVELS[-1]}, in any case",
        shown_default="Horovod's",
        sets=(Variable("HOROVOD_LOG_LEVEL", when_given(str)),),
    )

    def env(self, output_data_dir: Path) -> dict[str, str]:
        """The HOROVOD_* variables these options stand for (forwarded to every rank)."""
        return option_env(self, output_data_dir)


@dataclass(frozen=True)
class LauncherOptions:
    # (in the order of the docs tables)
    program: ProgramOptions
    mpi: MpiOptions
    launcher: LauncherOwnOptions
    horovod: HorovodOptions
    preflight: PreflightOptions = PreflightOptions()


GROUPS = (ProgramOptions, MpiOptions, LauncherOwnOptions, PreflightOptions, HorovodOptions)


def all_declarations() -> list[Declared]:
    """Every launcher option, in the order of the docs tables."""
    return [d for group in GROUPS for d in declarations(group)]


def group_names(value: object, key: str) -> tuple[str, ...]:
    """Instance group names: a list (or its JSON text, if decoding left it a string), each once."""
    if value in (None, "", []):
        return ()
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(SOURCE, key, "a list of instance group names", value)
    return tuple(dict.fromkeys(value))


def split_mpi_options(text: object, key: str = key_of(MpiOptions, "custom_options")) -> tuple[str, ...]:
    if text in (None, ""):
        return ()
    if not isinstance(text, str):
        raise ConfigError(SOURCE, key, "mpirun options as one string", text)
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(SOURCE, key, f"options quoted as in a shell ({exc})", text) from None
    return _toolkit_nccl_debug(list(checked_mpi_tokens(tokens, SOURCE, key)), key)


# mpirun options (and their MCA parameters) that change how mpirun writes the ranks' output, which the
# launcher reads by Open MPI's --tag-output tags (mpi/output.py; docs/output.md).
OUTPUT_OPTIONS = frozenset(
    {
        "xml",
        "timestamp-output",
        "merge-stderr-to-stdout",
        "output-filename",
        "orte_xml_output",
        "orte_timestamp_output",
        "orte_output_filename",
        "iof_base_redirect_app_stderr_to_stdout",
    }
)


OUTPUT_REFUSED = (
    "no option that changes how mpirun writes the ranks' output (the launcher reads it; "
    f"{key_of(LauncherOwnOptions, 'tag_output')}=false gives untagged lines)"
)
MCA_ENV_PREFIX = "OMPI_MCA_"  # Open MPI reads MCA parameter KEY from the variable OMPI_MCA_KEY


def checked_mpi_tokens(tokens: Sequence[str], source: str, key: str) -> tuple[str, ...]:
    """The user's mpirun arguments from any source, checked alike: v2's custom options (once split with
    shlex) and v3's mpi_additional_options. Each argument can be carried to exec (no NUL, valid Unicode:
    `key[i]`), none changes how mpirun writes the ranks' output, and all fit beside the hyperparameters'
    bound; every ConfigError names `source` and the `key` the user wrote. Pure."""
    for i, token in enumerate(tokens):
        if not carriable(token):
            raise ConfigError(source, f"{key}[{i}]", "an argument without NUL or lone surrogates", token)
    refused = sorted(user_names(tokens) & OUTPUT_OPTIONS)
    if refused:
        raise ConfigError(source, key, OUTPUT_REFUSED, refused[0])
    size = sum(len(token.encode()) + 1 for token in tokens)
    if size > MAX_TOTAL_BYTES:  # what the hyperparameters (and so v2's custom options) may hold in all
        raise ConfigError(
            source, key, f"mpirun arguments of at most {MAX_TOTAL_BYTES} bytes in all, not {size}"
        )
    return tuple(tokens)


def refuse_output_env(env: Mapping[str, str]) -> None:
    """The same for the MCA parameters the job's environment sets (OMPI_MCA_orte_xml_output=1 is --xml)."""
    refused = sorted(
        name
        for name in env
        if name.startswith(MCA_ENV_PREFIX) and name[len(MCA_ENV_PREFIX) :] in OUTPUT_OPTIONS
    )
    if refused:
        raise ConfigError("environment", refused[0], OUTPUT_REFUSED, env[refused[0]])


TOOLKIT_NCCL_DEBUG = "--NCCL_DEBUG"  # the sagemaker-training toolkit's own option, not mpirun's


def _toolkit_nccl_debug(tokens: list[str], key: str) -> tuple[str, ...]:
    """The toolkit's `--NCCL_DEBUG=VALUE` / `--NCCL_DEBUG VALUE` / `--NCCL_DEBUG` (INFO) as mpirun's
    `-x NCCL_DEBUG=VALUE`, in its place (the last one counts, as in the toolkit); an explicit
    `-x NCCL_DEBUG...` among the options wins and the toolkit's form is dropped. Every other option is left
    as written."""
    explicit = any(
        flag == "-x" and name.split("=", 1)[0] == "NCCL_DEBUG" for flag, name in itertools.pairwise(tokens)
    )
    out: list[str] = []
    value: str | None = None
    at = 0
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token == TOOLKIT_NCCL_DEBUG or token.startswith(TOOLKIT_NCCL_DEBUG + "="):
            if "=" in token:
                value = token.split("=", 1)[1]
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                value = tokens[i + 1]
                i += 1
            else:
                value = "INFO"
            if not value:
                raise ConfigError(SOURCE, key, f"a value after {TOOLKIT_NCCL_DEBUG}= (e.g. INFO)", token)
            at = len(out)
        else:
            out.append(token)
        i += 1
    if value is not None and not explicit:
        out[at:at] = ["-x", f"NCCL_DEBUG={value}"]
    return tuple(out)


def parse_launcher_options(reserved: Mapping[str, object]) -> LauncherOptions:
    keys = {d.option.key for d in all_declarations()}
    unknown = sorted(k for k in reserved if k.startswith(("horovod_", "launcher_")) and k not in keys)
    if unknown:
        prefix = unknown[0].split("_", 1)[0] + "_"
        known = sorted(k for k in keys if k.startswith(prefix))
        raise ConfigError(SOURCE, shown_key(unknown[0]), f"a known key ({', '.join(known)})")
    return LauncherOptions(
        program=read_options(ProgramOptions, reserved),
        mpi=read_options(MpiOptions, reserved),
        launcher=read_options(LauncherOwnOptions, reserved),
        horovod=read_options(HorovodOptions, reserved),
        preflight=read_options(PreflightOptions, reserved),
    )
