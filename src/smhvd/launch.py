"""One training job on this host: load and validate, fetch the code, build the ranks' env, take the role."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from smhvd.config import sdk_v3
from smhvd.config.job import Job, load_job
from smhvd.config.launcher_options import refuse_output_env
from smhvd.config.paths import SageMakerPaths
from smhvd.environment import training_env
from smhvd.errors import Stopped
from smhvd.mpi import efa
from smhvd.mpi.command import AWS_CREDENTIAL_NAMES
from smhvd.mpi.supervisor import supervise
from smhvd.proc.processes import become_subreaper, kill_descendants
from smhvd.proc.signals import SignalWatch
from smhvd.roles.leader import conclude, rank_command, run_leader
from smhvd.roles.worker import run_worker
from smhvd.sourcecode import (
    Source,
    fetch_source,
    install_requirements,
    program_command,
    program_path,
    resolve_source,
)
from smhvd.wire import OUTPUT_CHANNEL, OUTPUT_FRAMED, TAG_OUTPUT

log = logging.getLogger("smhvd")
THREAD_VARS = ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def rank_env(job: Job, base: Mapping[str, str], sm_env: Mapping[str, str]) -> dict[str, str]:
    """The environment mpirun (and so every rank) gets. Pure."""
    env = {
        k: v
        for k, v in base.items()
        if job.options.launcher.forward_aws_credentials or k not in AWS_CREDENTIAL_NAMES
    }
    env.update(sm_env)
    env.update(job.options.horovod.env(job.paths.output_data_dir))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env[TAG_OUTPUT] = "1" if job.options.launcher.tag_output else "0"
    env[OUTPUT_CHANNEL] = OUTPUT_FRAMED  # the supervisor takes the ranks' output from mpirun's stderr (wire)
    pph = job.processes_per_host
    if job.options.mpi.enabled and pph > 1:
        # Several ranks share this host's cores: one slice each instead of every rank spawning a thread per
        # core (on 2 cores, 2 ranks x 1 thread is ~1.5x faster than the TF defaults).
        threads = str(max(1, job.hardware.cpus // pph))
        for name in THREAD_VARS:
            env.setdefault(name, threads)
    return env


def efa_settings(job: Job, env: Mapping[str, str]) -> dict[str, str]:
    """Probe this host for EFA and say in one line what the ranks get (efa.py)."""
    found = efa.probe()
    added = efa.efa_env(found, env)
    if found.present:
        shown = (
            " ".join(f"{k}={v}" for k, v in sorted(added.items())) or "nothing (the environment sets them)"
        )
        log.info("EFA: %s; ranks get %s", found.detail, shown)
    else:
        log.info("EFA: none (%s)", found.detail)
    if efa.expected_but_missing(found, job.resources.current_instance_type):
        log.warning(
            "EFA: %s has EFA but none is usable here (%s): the job will run over TCP. Check that the "
            "security group allows all traffic to itself and that the image has the EFA software",
            job.resources.current_instance_type,
            found.detail,
        )
    return added


def prepare_dirs(paths: SageMakerPaths) -> None:
    for directory in (paths.model_dir, paths.output_data_dir, paths.checkpoint_dir):
        directory.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def step(what: str) -> Iterator[None]:
    """One preparation step: a stop that ends it says which step it ended, and after how long."""
    started = time.monotonic()
    try:
        yield
    except Stopped as exc:
        raise Stopped(f"{exc}, during {what} ({time.monotonic() - started:.1f}s in)") from None


def launch(
    paths: SageMakerPaths,
    *,
    job_log_level: Callable[[int], object] | None = None,
    preflight_only: bool = False,
) -> int:
    """`job_log_level`: how the job's own log level (the SDK's sagemaker_container_log_level) is applied;
    None when `train` was given one (--log-level, SMHVD_LOG_LEVEL), which wins. `preflight_only` (`train
    preflight`): the pre-flight is the job; no code is fetched and no script runs."""
    started_at = time.time()
    v3 = sdk_v3.load(paths)  # SDK v3 ModelTrainer(source_code=...): its sm_drivers channel says what to run
    if v3 is not None and v3.unsupported:  # v3's own driver runs it: decided here, before anything else
        log.info("SDK v3 job left to v3's sm_train.sh: %s", v3.unsupported)
        argv, env = sdk_v3.hand_back_command(os.environ)
        os.execve(argv[0], argv, env)  # noqa: S606 (v3's own command)
    job = load_job(paths, v3=v3)  # from here on, one job whichever SDK wrote the files
    refuse_output_env(os.environ)  # OMPI_MCA_orte_xml_output=1 is --xml: 78, as in custom_mpi_options
    if job_log_level is not None and job.options.program.log_level is not None:
        job_log_level(job.options.program.log_level)  # the SDK's container_log_level (logging.DEBUG=10, ...)
    log.debug(
        "job: host %s of %s, %d process(es) per host, %d cpu(s), %d gpu(s)",
        job.resources.current_host,
        ",".join(job.resources.hosts),
        job.processes_per_host,
        job.hardware.cpus,
        job.hardware.gpus,
    )
    become_subreaper()
    if preflight_only:
        try:
            return _preflight_only(job, started_at)
        finally:
            kill_descendants()
    try:
        # Every step below is a child process (proc/steps.py) or in-process work that a stop interrupts
        # (proc/stopping.py); `finally` ends whatever is left, whatever ended the launch.
        source = resolve_source(job.options.program, paths, os.environ)
        with step(f"fetching the code from {source.location}"):
            fetch_source(source, job.options.program.region)
        entry = program_path(source)
        if requirements := job.options.program.requirements:
            named_by = job.options.program.origin.requirements_named_by
            with step(f"pip install -r {requirements}"):
                if install_requirements(source.code_dir, name=requirements, named_by=named_by):
                    log.info("installed %s", source.code_dir / requirements)
        program = program_command(entry, source.code_dir) + list(job.script_args)
        module_dir = job.options.program.submit_directory or str(source.code_dir)
        env = rank_env(job, os.environ, training_env(job, source.code_dir, source.program, module_dir))
        if job.options.mpi.enabled:
            with step("the EFA probe (fi_info)"):
                env.update(efa_settings(job, env))
        prepare_dirs(paths)
        host = job.resources.current_host
        return _run_role(job, source, program, env, host, started_at)
    finally:
        kill_descendants()  # whatever the role, nothing started by this job outlives `train`


def _preflight_only(job: Job, started_at: float) -> int:
    """Every host as in a job (the leader probes them all, the workers wait for its verdict), no script."""
    env = rank_env(job, os.environ, {})
    with step("the EFA probe (fi_info)"):
        env.update(efa_settings(job, env))
    prepare_dirs(job.paths)
    with tempfile.TemporaryDirectory(prefix="smhvd-") as tmp:
        if job.is_leader:
            return run_leader(job, [], env, Path(tmp), Path("/"), started_at, preflight_only=True)
        return run_worker(job, Path(tmp), env)


def _run_role(
    job: Job, source: Source, program: list[str], env: dict[str, str], host: str, started_at: float
) -> int:
    with tempfile.TemporaryDirectory(prefix="smhvd-") as tmp:
        run_dir = Path(tmp)
        if not job.options.mpi.enabled:
            log.info("MPI disabled: running %s once on %s", source.program, host)
            with SignalWatch() as watch:
                outcome = supervise(rank_command(program), env, source.code_dir, watch=watch)
            return conclude(job, outcome)[0]
        if job.is_leader:
            return run_leader(job, program, env, run_dir, source.code_dir, started_at)
        if not job.runs_mpi_here:  # outside the distribution instance groups (config/instance_groups.py)
            log.info("%s is outside the MPI instance groups: running %s once", host, source.program)
            return run_worker(job, run_dir, env, outside=(program, source.code_dir))
        return run_worker(job, run_dir, env)
