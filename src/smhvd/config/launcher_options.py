"""The launcher's options, typed, from the reserved hyperparameters (sagemaker_, horovod_, launcher_ keys).

Unknown `horovod_*` and `launcher_*` keys are errors (a typo must not pass silently); unknown `sagemaker_*`
keys are ignored because the SDK sets many that concern other containers.
"""

from __future__ import annotations

import itertools
import math
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from smhvd.config.sagemaker_files import optional_str, shown_key
from smhvd.errors import ConfigError

SOURCE = "hyperparameters.json"
# The launcher's mpirun defaults, by the names launcher_drop_mpi_defaults takes: data of this layer, which
# validates the key; mpi/command.default_options gives each default under its name (a test checks they agree).
MPI_DEFAULT_NAMES = frozenset(
    {
        "bind-to",
        "map-by",
        "orte_abort_on_non_zero_status",
        "odls_base_sigkill_timeout",
        "mpi_yield_when_idle",
        "btl_tcp_if_include",
        "oob_tcp_if_include",
        "NCCL_SOCKET_IFNAME",
        "plm_rsh_args",
        "plm_rsh_no_tree_spawn",
        "plm_rsh_num_concurrent",
    }
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


@dataclass(frozen=True)
class MpiOptions:
    enabled: bool
    processes_per_host: int | None  # None: one per GPU, else 1
    num_processes: int | None  # None: processes_per_host * hosts
    custom_options: tuple[str, ...]
    drop_defaults: frozenset[str]


@dataclass(frozen=True)
class HorovodOptions:
    timeline: bool = False
    timeline_mark_cycles: bool = False
    autotune: bool = False
    fusion_threshold_mb: float | None = None
    cycle_time_ms: float | None = None
    stall_check_seconds: int | None = None  # 0 disables the check
    stall_shutdown_seconds: int | None = None
    log_level: str | None = None

    def env(self, output_data_dir: Path) -> dict[str, str]:
        """The HOROVOD_* variables these options stand for (forwarded to every rank)."""
        env: dict[str, str] = {}
        if self.timeline:
            env["HOROVOD_TIMELINE"] = str(output_data_dir / "horovod_timeline.json")
        if self.timeline_mark_cycles:
            env["HOROVOD_TIMELINE_MARK_CYCLES"] = "1"
        if self.autotune:
            env["HOROVOD_AUTOTUNE"] = "1"
            env["HOROVOD_AUTOTUNE_LOG"] = str(output_data_dir / "horovod_autotune_log.csv")
        if self.fusion_threshold_mb is not None:
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(self.fusion_threshold_mb * 1024 * 1024))
        if self.cycle_time_ms is not None:
            env["HOROVOD_CYCLE_TIME"] = f"{self.cycle_time_ms:g}"
        if self.stall_check_seconds == 0:
            env["HOROVOD_STALL_CHECK_DISABLE"] = "1"
        elif self.stall_check_seconds is not None:
            env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(self.stall_check_seconds)
        if self.stall_shutdown_seconds is not None:
            env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(self.stall_shutdown_seconds)
        if self.log_level is not None:
            env["HOROVOD_LOG_LEVEL"] = self.log_level
        return env


@dataclass(frozen=True)
class LauncherOwnOptions:
    peer_timeout: float = PEER_TIMEOUT
    leader_timeout: float = LEADER_TIMEOUT
    forward_env: tuple[str, ...] = ()  # extra variable names (or PREFIX*) forwarded to ranks
    forward_aws_credentials: bool = False
    hang_dump_seconds: float | None = None  # stack dumps of every rank after this long without any output
    tag_output: bool = True  # each line a rank prints tagged [RANK,HOST]<stdout>: (proc/lines.py)


@dataclass(frozen=True)
class CodeOrigin:
    """The file and keys that named the program and its code, for the errors about them."""

    file: str = SOURCE
    program_key: str = "sagemaker_program"
    directory_key: str = "sagemaker_submit_directory"
    requirements_key: str | None = None  # the key that named the requirements file (then it must exist)

    @property
    def requirements_named_by(self) -> tuple[str, str] | None:
        """(file, key) that asked for the requirements file by name; None: requirements.txt if present."""
        return None if self.requirements_key is None else (self.file, self.requirements_key)


HYPERPARAMETERS_ORIGIN = CodeOrigin()


@dataclass(frozen=True)
class ProgramOptions:
    program: str | None
    submit_directory: str | None
    region: str | None
    job_name: str | None
    log_level: int | None
    requirements: str | None = "requirements.txt"  # installed with pip before the job (SDK v3: its own name)
    origin: CodeOrigin = HYPERPARAMETERS_ORIGIN  # SDK v3: its sourcecode.json (sdk_v3.apply)


@dataclass(frozen=True)
class LauncherOptions:
    mpi: MpiOptions
    horovod: HorovodOptions
    launcher: LauncherOwnOptions
    program: ProgramOptions


HOROVOD_KEYS = {
    "horovod_timeline",
    "horovod_timeline_mark_cycles",
    "horovod_autotune",
    "horovod_fusion_threshold_mb",
    "horovod_cycle_time_ms",
    "horovod_stall_check_seconds",
    "horovod_stall_shutdown_seconds",
    "horovod_log_level",
}
LAUNCHER_KEYS = {
    "launcher_peer_timeout_seconds",
    "launcher_leader_timeout_seconds",
    "launcher_forward_env",
    "launcher_forward_aws_credentials",
    "launcher_drop_mpi_defaults",
    "launcher_hang_dump_seconds",
    "launcher_tag_output",
}
_HOROVOD_LOG_LEVELS = ("trace", "debug", "info", "warning", "error", "fatal")


def _bool(hps: Mapping[str, object], key: str, default: bool) -> bool:
    value = hps.get(key, default)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise ConfigError(SOURCE, key, "true or false", value)


def _number(
    hps: Mapping[str, object], key: str, *, minimum: float, maximum: float, integer: bool
) -> float | None:
    """A finite number within [minimum, maximum]; None when the key is absent or empty."""
    if key not in hps or hps[key] in (None, ""):
        return None
    value = hps[key]
    kind = "an integer" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ConfigError(SOURCE, key, f"{kind} >= {minimum:g}", value)
    try:
        number = float(value)  # "Infinity", "1e400" and 5000-digit strings give inf: refused below
    except (ValueError, OverflowError):
        raise ConfigError(SOURCE, key, f"{kind} >= {minimum:g}", value) from None
    if number > maximum:
        raise ConfigError(SOURCE, key, f"{kind} <= {maximum:.12g}", value)
    if not math.isfinite(number) or number < minimum or (integer and not number.is_integer()):
        raise ConfigError(SOURCE, key, f"{kind} >= {minimum:g}", value)
    return number


def _int(hps: Mapping[str, object], key: str, *, minimum: int, maximum: int) -> int | None:
    number = _number(hps, key, minimum=minimum, maximum=maximum, integer=True)
    return None if number is None else int(number)


def _names(hps: Mapping[str, object], key: str) -> tuple[str, ...]:
    value = hps.get(key)
    if value in (None, ""):
        return ()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if isinstance(value, str):
        return tuple(v for v in value.replace(",", " ").split() if v)
    raise ConfigError(SOURCE, key, "a comma-separated list of names", value)


def _default_names(hps: Mapping[str, object], key: str) -> frozenset[str]:
    """Names of mpirun defaults to drop: each must name one (a typo must not pass silently)."""
    known = MPI_DEFAULT_NAMES
    names = _names(hps, key)
    for name in names:
        if name not in known:
            raise ConfigError(SOURCE, key, f"names of mpirun defaults ({', '.join(sorted(known))})", name)
    return frozenset(names)


def _str(hps: Mapping[str, object], key: str) -> str | None:
    return optional_str(hps, key, SOURCE)


def split_mpi_options(text: object, key: str = "sagemaker_mpi_custom_mpi_options") -> tuple[str, ...]:
    if text in (None, ""):
        return ()
    if not isinstance(text, str):
        raise ConfigError(SOURCE, key, "mpirun options as one string", text)
    try:
        tokens = shlex.split(text)
    except ValueError as exc:
        raise ConfigError(SOURCE, key, f"options quoted as in a shell ({exc})", text) from None
    return _toolkit_nccl_debug(tokens, key)


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
    unknown = sorted(
        k
        for k in reserved
        if k.startswith(("horovod_", "launcher_")) and k not in HOROVOD_KEYS | LAUNCHER_KEYS
    )
    if unknown:
        known = sorted(HOROVOD_KEYS if unknown[0].startswith("horovod_") else LAUNCHER_KEYS)
        raise ConfigError(SOURCE, shown_key(unknown[0]), f"a known key ({', '.join(known)})")

    log_level = _str(reserved, "horovod_log_level")
    if log_level is not None and log_level.lower() not in _HOROVOD_LOG_LEVELS:
        raise ConfigError(SOURCE, "horovod_log_level", " | ".join(_HOROVOD_LOG_LEVELS), log_level)
    container_log_level = _int(reserved, "sagemaker_container_log_level", minimum=0, maximum=50)

    return LauncherOptions(
        mpi=MpiOptions(
            enabled=_bool(reserved, "sagemaker_mpi_enabled", True),
            processes_per_host=_int(
                reserved, "sagemaker_mpi_num_of_processes_per_host", minimum=1, maximum=MAX_PROCESSES_PER_HOST
            ),
            # (validate_job then holds it to per-host x hosts)
            num_processes=_int(reserved, "sagemaker_mpi_num_processes", minimum=1, maximum=2**31 - 1),
            custom_options=split_mpi_options(reserved.get("sagemaker_mpi_custom_mpi_options")),
            drop_defaults=_default_names(reserved, "launcher_drop_mpi_defaults"),
        ),
        horovod=HorovodOptions(
            timeline=_bool(reserved, "horovod_timeline", False),
            timeline_mark_cycles=_bool(reserved, "horovod_timeline_mark_cycles", False),
            autotune=_bool(reserved, "horovod_autotune", False),
            fusion_threshold_mb=_number(
                reserved,
                "horovod_fusion_threshold_mb",
                minimum=0,
                maximum=MAX_FUSION_THRESHOLD_MB,
                integer=False,
            ),
            cycle_time_ms=_number(
                reserved, "horovod_cycle_time_ms", minimum=0.01, maximum=MAX_CYCLE_TIME_MS, integer=False
            ),
            stall_check_seconds=_int(reserved, "horovod_stall_check_seconds", minimum=0, maximum=MAX_SECONDS),
            stall_shutdown_seconds=_int(
                reserved, "horovod_stall_shutdown_seconds", minimum=0, maximum=MAX_SECONDS
            ),
            log_level=log_level.lower() if log_level else None,
        ),
        launcher=LauncherOwnOptions(
            peer_timeout=_number(
                reserved, "launcher_peer_timeout_seconds", minimum=1, maximum=MAX_SECONDS, integer=False
            )
            or PEER_TIMEOUT,
            leader_timeout=_number(
                reserved, "launcher_leader_timeout_seconds", minimum=1, maximum=MAX_SECONDS, integer=False
            )
            or LEADER_TIMEOUT,
            forward_env=_names(reserved, "launcher_forward_env"),
            forward_aws_credentials=_bool(reserved, "launcher_forward_aws_credentials", False),
            hang_dump_seconds=_number(
                reserved, "launcher_hang_dump_seconds", minimum=1, maximum=MAX_SECONDS, integer=False
            ),
            tag_output=_bool(reserved, "launcher_tag_output", True),
        ),
        program=ProgramOptions(
            program=_str(reserved, "sagemaker_program"),
            submit_directory=_str(reserved, "sagemaker_submit_directory"),
            region=_str(reserved, "sagemaker_region"),
            job_name=_str(reserved, "sagemaker_job_name"),
            log_level=container_log_level,
        ),
    )
