"""The mpirun command line: the plan (`plan_for`, from the job), then a pure function from plan to argv. The
defaults are config/mpi_defaults.py's, each replaced by a user's option that sets it or conflicts with it.
The plan owns the hostfile and the one decision whether mpirun spans hosts (`MpiPlan.multi_host`).
"""

from __future__ import annotations

import fnmatch
import os
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from smhvd.config.launcher_options import MCA_ENV_PREFIX
from smhvd.config.mpi_defaults import MPI_DEFAULTS, overridden_names
from smhvd.errors import LauncherError

if TYPE_CHECKING:
    from smhvd.config.job import Job

# Forwarded to every rank (by name: values never appear on the command line).
FORWARD_NAMES = frozenset(
    (
        "PATH LD_LIBRARY_PATH PYTHONPATH PYTHONUNBUFFERED PYTHONHASHSEED VIRTUAL_ENV LANG LC_ALL TZ "
        "AWS_REGION AWS_DEFAULT_REGION TRAINING_JOB_NAME TRAINING_JOB_ARN"
    ).split()
)
FORWARD_PREFIXES = tuple(
    "SM_ SAGEMAKER_ HOROVOD_ NCCL_ OMP_ MKL_ KMP_ OPENBLAS_ TF_ XLA_ CUDA_ FI_ RDMAV_ SMHVD_".split()
)
# Only with launcher_forward_aws_credentials=true.
AWS_CREDENTIAL_NAMES = frozenset(
    (
        "AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_SESSION_TOKEN AWS_SECURITY_TOKEN AWS_PROFILE "
        "AWS_ROLE_ARN AWS_CONTAINER_CREDENTIALS_RELATIVE_URI AWS_CONTAINER_CREDENTIALS_FULL_URI "
        "AWS_SHARED_CREDENTIALS_FILE AWS_CONTAINER_AUTHORIZATION_TOKEN AWS_WEB_IDENTITY_TOKEN_FILE "
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"
    ).split()
)

LOCAL_HOSTS = ("localhost",)  # a one-host job's hostfile: mpirun starts no orted over ssh
# In the run directory: the job's hostfile, and the ssh client config (mpirun's orted, the leader's links).
HOSTFILE = "hostfile"
SSH_CONFIG = "ssh_config"


@dataclass(frozen=True)
class MpiPlan:
    num_processes: int
    hostfile: Path  # where the hostfile is written (`hostfile_text`)
    workdir: Path
    program: tuple[str, ...]
    interface: str | None = None  # multi-host: the resourceconfig network interface
    ssh_config: Path | None = None  # multi-host: ssh client config for launching orted
    yield_when_idle: bool = False
    forward: tuple[str, ...] = ()  # env names passed with -x NAME
    custom_options: tuple[str, ...] = ()
    drop_defaults: frozenset[str] = frozenset()
    env_mca: frozenset[str] = frozenset()  # MCA keys the job's environment sets (OMPI_MCA_<key>)
    hosts: tuple[str, ...] = LOCAL_HOSTS  # the hostfile's, the leader first: the MPI hosts, or LOCAL_HOSTS
    slots: int = 1  # ranks per host: the hostfile's `slots=N`

    def __post_init__(self) -> None:
        if self.multi_host and self.ssh_config is None:
            raise ValueError(f"a plan over {len(self.hosts)} hosts needs the ssh config that starts orted")

    @property
    def multi_host(self) -> bool:
        """mpirun spans hosts: the one place this is decided, from the hostfile's hosts."""
        return len(self.hosts) > 1

    @property
    def hostfile_text(self) -> str:
        """One `host slots=N` line per host, the leader first."""
        return "".join(f"{host} slots={self.slots}\n" for host in self.hosts)


OMPI_RSH_CONCURRENT = 128  # Open MPI's own plm_rsh_num_concurrent


def default_options(plan: MpiPlan) -> list[tuple[str, list[str]]]:
    """(name, argv) pairs of the defaults (config/mpi_defaults.py) that apply to this plan; the name is what
    users override or drop."""
    applies = {
        "always": True,
        "ranks_fill_cores": plan.yield_when_idle,
        "interface": plan.multi_host and bool(plan.interface),
        "ssh": plan.multi_host,
        "many_hosts": plan.multi_host and len(plan.hosts) > OMPI_RSH_CONCURRENT,
    }
    values = {"interface": plan.interface, "ssh_config": plan.ssh_config, "hosts": len(plan.hosts)}
    return [(d.name, [a.format_map(values) for a in d.argv]) for d in MPI_DEFAULTS if applies[d.when]]


def env_mca_keys(env: Mapping[str, str]) -> frozenset[str]:
    """MCA keys set through the environment (OMPI_MCA_btl_tcp_if_exclude=lo sets btl_tcp_if_exclude)."""
    return frozenset(k[len(MCA_ENV_PREFIX) :] for k in env if k.startswith(MCA_ENV_PREFIX))


def plan_for(
    job: Job, program: Sequence[str], env: Mapping[str, str], run_dir: Path, code_dir: Path
) -> MpiPlan:
    """The plan of the job's mpirun: `program` on every MPI host, with `env` (the ranks' environment)."""
    multi = job.mpi_multi_host
    launcher = job.options.launcher
    return MpiPlan(
        num_processes=job.num_processes,
        hostfile=run_dir / HOSTFILE,
        workdir=code_dir,
        program=tuple(program),
        interface=job.resources.network_interface_name if multi else None,
        ssh_config=run_dir / SSH_CONFIG if multi else None,
        yield_when_idle=job.processes_per_host >= job.hardware.cpus,
        forward=forwarded_names(env, launcher.forward_env, aws_credentials=launcher.forward_aws_credentials),
        custom_options=job.options.mpi.custom_options,
        drop_defaults=job.options.mpi.drop_defaults,
        env_mca=env_mca_keys(env),
        hosts=job.mpi_hosts if multi else LOCAL_HOSTS,
        slots=job.processes_per_host,
    )


def require_mpirun(env: Mapping[str, str]) -> None:
    """LauncherError, one line, when there is no mpirun on the PATH the leader runs it with (`env`'s)."""
    path = env.get("PATH", os.defpath)
    if shutil.which("mpirun", path=path) is None:
        raise LauncherError(
            f"mpirun not found on PATH ({path}): the leader runs the job with Open MPI's mpirun; install "
            "it in the image (Debian: openmpi-bin) or put its bin directory on PATH"
        )


def build_mpirun_argv(plan: MpiPlan) -> list[str]:
    # A default is skipped when the user's options set it (or what conflicts with it), when it is dropped by
    # name, or, for a variable, when the environment's own value is forwarded.
    skip = overridden_names(plan.custom_options, plan.env_mca) | set(plan.drop_defaults) | set(plan.forward)
    argv = ["mpirun", "--allow-run-as-root", "--tag-output"]  # the leader reads these tags (mpi/output.py)
    argv += ["-np", str(plan.num_processes), "--hostfile", str(plan.hostfile), "-wdir", str(plan.workdir)]
    for name, option in default_options(plan):
        if name not in skip:
            argv += option
    for name in plan.forward:
        argv += ["-x", name]
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
