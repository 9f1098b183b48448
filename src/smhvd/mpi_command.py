"""The mpirun command line: a pure function from a typed plan to an argv list.

Defaults are named. A user option in `sagemaker_mpi_custom_mpi_options` that sets the same thing
(`--mca KEY V`, `--bind-to`, `--map-by`, `-x NAME=V`) replaces the default instead of repeating it
(Open MPI rejects an MCA parameter given twice); `launcher_drop_mpi_defaults` removes defaults by name.
"""

from __future__ import annotations

import fnmatch
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Forwarded to every rank (by name: values never appear on the command line).
FORWARD_NAMES = (
    "PATH",
    "LD_LIBRARY_PATH",
    "PYTHONPATH",
    "PYTHONUNBUFFERED",
    "PYTHONHASHSEED",
    "VIRTUAL_ENV",
    "LANG",
    "LC_ALL",
    "TZ",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "TRAINING_JOB_NAME",
    "TRAINING_JOB_ARN",
)
FORWARD_PREFIXES = (
    "SM_",
    "SAGEMAKER_",
    "HOROVOD_",
    "NCCL_",
    "OMP_",
    "MKL_",
    "KMP_",
    "OPENBLAS_",
    "TF_",
    "XLA_",
    "CUDA_",
    "FI_",
    "RDMAV_",
    "SMHVD_",
)
# Only with launcher_forward_aws_credentials=true.
AWS_CREDENTIAL_NAMES = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_ROLE_ARN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
)
_MCA_FLAGS = ("--mca", "-mca", "--gmca", "-gmca")
_VALUE_FLAGS = {"--bind-to": "bind-to", "-bind-to": "bind-to", "--map-by": "map-by", "-map-by": "map-by"}


@dataclass(frozen=True)
class MpiPlan:
    num_processes: int
    hostfile: Path
    workdir: Path
    program: tuple[str, ...]
    interface: str | None = None  # multi-host: the resourceconfig network interface
    ssh_config: Path | None = None  # multi-host: ssh client config for launching orted
    yield_when_idle: bool = False
    forward: tuple[str, ...] = ()  # env names passed with -x NAME
    set_env: tuple[tuple[str, str], ...] = ()  # -x NAME=VALUE (launcher constants only)
    custom_options: tuple[str, ...] = ()
    drop_defaults: frozenset[str] = frozenset()


def default_options(plan: MpiPlan) -> list[tuple[str, list[str]]]:
    """(name, argv) pairs; the name is what users override or drop."""
    options: list[tuple[str, list[str]]] = [
        ("bind-to", ["--bind-to", "none"]),  # hosts' cores are the scripts' business (and TF's threads)
        ("map-by", ["--map-by", "slot"]),
        ("orte_abort_on_non_zero_status", ["--mca", "orte_abort_on_non_zero_status", "1"]),
        ("odls_base_sigkill_timeout", ["--mca", "odls_base_sigkill_timeout", "0"]),  # abort in ms, not 1-3 s
    ]
    if plan.yield_when_idle:
        options.append(("mpi_yield_when_idle", ["--mca", "mpi_yield_when_idle", "1"]))
    if plan.interface:
        options.append(("btl_tcp_if_include", ["--mca", "btl_tcp_if_include", plan.interface]))
        options.append(("oob_tcp_if_include", ["--mca", "oob_tcp_if_include", plan.interface]))
    if plan.ssh_config is not None:
        options.append(("plm_rsh_args", ["--mca", "plm_rsh_args", f"-F {plan.ssh_config}"]))
        options.append(("plm_rsh_no_tree_spawn", ["--mca", "plm_rsh_no_tree_spawn", "1"]))
    return options


def overridden_names(custom: Sequence[str]) -> set[str]:
    """Names of defaults that the user's own options set."""
    names: set[str] = set()
    for i, flag in enumerate(custom):
        nxt = custom[i + 1] if i + 1 < len(custom) else ""
        if flag in _MCA_FLAGS and nxt:
            names.add(nxt)
        elif flag in _VALUE_FLAGS:
            names.add(_VALUE_FLAGS[flag])
        elif flag == "-x" and nxt:
            names.add(nxt.split("=", 1)[0])
    return names


def build_mpirun_argv(plan: MpiPlan) -> list[str]:
    skip = overridden_names(plan.custom_options) | set(plan.drop_defaults)
    argv = [
        "mpirun",
        "--allow-run-as-root",
        "-np",
        str(plan.num_processes),
        "--hostfile",
        str(plan.hostfile),
        "-wdir",
        str(plan.workdir),
    ]
    for name, option in default_options(plan):
        if name not in skip:
            argv += option
    for name in plan.forward:
        argv += ["-x", name]
    for name, value in plan.set_env:
        if name not in skip:
            argv += ["-x", f"{name}={value}"]
    argv += plan.custom_options
    argv += plan.program
    return argv


def forwarded_names(
    env: Mapping[str, str], extra: Sequence[str] = (), *, aws_credentials: bool = False
) -> tuple[str, ...]:
    """Names of the variables in `env` that ranks on every host receive."""
    patterns = list(extra)
    allowed = set(FORWARD_NAMES) | (set(AWS_CREDENTIAL_NAMES) if aws_credentials else set())

    def wanted(name: str) -> bool:
        if name in AWS_CREDENTIAL_NAMES and not aws_credentials:
            return False
        return (
            name in allowed
            or name.startswith(FORWARD_PREFIXES)
            or any(fnmatch.fnmatchcase(name, p) for p in patterns)
        )

    return tuple(sorted(name for name in env if wanted(name)))


def display(argv: Sequence[str]) -> str:
    return shlex.join(argv)
