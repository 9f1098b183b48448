"""One training job on this host: load and validate, fetch the code, build the ranks' env, take the role."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from smhvd.config import sdk_v3
from smhvd.config.job import Job, load_job
from smhvd.config.launcher_options import refuse_output_env
from smhvd.config.paths import SageMakerPaths
from smhvd.environment import training_env
from smhvd.errors import Stopped
from smhvd.mpi import efa
from smhvd.mpi.command import AWS_CREDENTIAL_NAMES
from smhvd.mpi.supervisor import Alone, supervise
from smhvd.proc.processes import become_subreaper, kill_descendants
from smhvd.proc.signals import SignalWatch
from smhvd.proc.steps import private_tmpdir
from smhvd.roles.leader import Leader, conclude, rank_command
from smhvd.roles.worker import Worker
from smhvd.sourcecode import (
    fetch_source,
    install_requirements,
    program_command,
    program_path,
    resolve_source,
)
from smhvd.wire import INFLIGHT_POLICY, OUTPUT_CHANNEL, OUTPUT_FRAMED, TAG_OUTPUT

log = logging.getLogger("smhvd")
PREFLIGHT_NOT_RUN = (
    "pre-flight: not run (sagemaker_preflight=%s, but sagemaker_mpi_enabled is false: the script runs alone, "
    "with no MPI hosts to check; `train preflight` checks this host)"
)
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
    if job.options.launcher.inflight != "off" and job.mpi_multi_host:  # hosts to compare (docs/inflight.md)
        env[INFLIGHT_POLICY] = job.options.launcher.inflight
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
    log.info("%s", efa.ranks_line(found, added, job.options.mpi.custom_options))
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


def _nobody(_step: str) -> None:
    """A host whose preparation nobody waits to hear about (the leader, a job alone)."""


@contextlib.contextmanager
def step(what: str, report: Callable[[str], None] = _nobody) -> Iterator[None]:
    """One preparation step, `report`ed as it starts (a worker's leader waits for it: roles/worker.py); a
    stop that ends it says which step it ended, and after how long."""
    report(what)
    started = time.monotonic()
    try:
        yield
    except Stopped as exc:
        raise Stopped(f"{exc}, during {what} ({time.monotonic() - started:.1f}s in)") from None


@dataclass(frozen=True)
class Prepared:
    """The job on this host, ready to run: the program's argv, the ranks' environment, where it runs."""

    program: list[str]
    env: dict[str, str]
    code_dir: Path
    name: str  # the script, as the log names it


def launch(
    paths: SageMakerPaths,
    *,
    job_log_level: Callable[[int], object] | None = None,
    preflight_only: bool = False,
) -> int:
    """`job_log_level`: how the job's own log level (the SDK's sagemaker_container_log_level) is applied;
    None when `train` was given one (--log-level, SMHVD_LOG_LEVEL), which wins. `preflight_only` (`train
    preflight`): the pre-flight is the job; no code is fetched and no script runs.

    The host's role starts first (a leader reaches its workers, a worker runs sshd and waits for the link), so
    that whatever ends a host while the job is prepared reaches the others at once (roles/)."""
    started_at = time.time()
    job = _load(paths, job_log_level)
    become_subreaper()
    try:  # `finally` ends whatever is left, whatever ended the launch: nothing of the job outlives `train`
        with private_tmpdir() as run_dir:  # what a train killed outright leaves, the next one removes
            if not job.options.mpi.enabled and not preflight_only:
                if job.options.preflight.policy != "off":
                    log.info(PREFLIGHT_NOT_RUN, job.options.preflight.policy)
                return _alone(job, _prepare(job, preflight_only))
            if job.is_leader:
                with Leader(job, run_dir) as leader:
                    ready = _prepare(job, preflight_only)
                    return leader.run(ready.program, ready.env, ready.code_dir, started_at, preflight_only)
            with Worker(job, run_dir) as worker:
                ready = _prepare(job, preflight_only, worker.preparing)
                worker.serve(ready.env)
                worker.prepared()  # the leader starts the job (and the pre-flight) once every host said so
                if (
                    not job.runs_mpi_here
                ):  # outside the distribution instance groups (config/instance_groups.py)
                    log.info(
                        "%s is outside the MPI instance groups: running %s once",
                        job.resources.current_host,
                        ready.name,
                    )
                    worker.run_outside(ready.program, ready.env, ready.code_dir)
                return worker.wait("the pre-flight" if preflight_only else "job")
    finally:
        kill_descendants()


def _load(paths: SageMakerPaths, job_log_level: Callable[[int], object] | None) -> Job:
    """The job, whichever SDK wrote its files (an SDK v3 job this launcher does not run is handed back)."""
    v3 = sdk_v3.load(paths)  # SDK v3 ModelTrainer(source_code=...): its sm_drivers channel says what to run
    if v3 is not None and v3.unsupported:  # v3's own driver runs it: decided here, before anything else
        log.info("SDK v3 job left to v3's sm_train.sh: %s", v3.unsupported)
        argv, env = sdk_v3.hand_back_command(os.environ)
        os.execve(argv[0], argv, env)  # noqa: S606 (v3's own command)
    job = load_job(paths, v3=v3)  # from here on, one job whichever SDK wrote the files
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
    return job


def _prepare(job: Job, preflight_only: bool, report: Callable[[str], None] = _nobody) -> Prepared:
    """The code, its requirements, the ranks' environment and the EFA probe. Every step is a child process
    (proc/steps.py) or in-process work that a stop interrupts (proc/signals.py). A pre-flight alone needs no
    code. What only this host's environment refuses is found here, once its role has started (a leader's
    then reaches its workers). `report`: each step as it starts."""
    refuse_output_env(os.environ)  # OMPI_MCA_orte_xml_output=1 is --xml: 78, as in custom_mpi_options
    if preflight_only:
        env = rank_env(job, os.environ, {})
        program, code_dir, name = [], Path("/"), "the pre-flight"
    else:
        source = resolve_source(job.options.program, job.paths, os.environ)
        with step(f"fetching the code from {source.location}", report):
            fetch_source(source, job.options.program.region)
        entry = program_path(source)
        if requirements := job.options.program.requirements:
            named_by = job.options.program.origin.requirements_named_by
            with step(f"pip install -r {requirements}", report):
                if install_requirements(source.code_dir, name=requirements, named_by=named_by):
                    log.info("installed %s", source.code_dir / requirements)
        program = program_command(entry, source.code_dir) + list(job.script_args)
        module_dir = job.options.program.submit_directory or str(source.code_dir)
        env = rank_env(job, os.environ, training_env(job, source.code_dir, source.program, module_dir))
        code_dir, name = source.code_dir, source.program
    if job.options.mpi.enabled:
        with step("the EFA probe (fi_info)", report):
            env.update(efa_settings(job, env))
    prepare_dirs(job.paths)
    return Prepared(program, env, code_dir, name)


def _alone(job: Job, ready: Prepared) -> int:
    """MPI disabled: the script once on this host."""
    log.info("MPI disabled: running %s once on %s", ready.name, job.resources.current_host)
    with SignalWatch() as watch:
        result = supervise(rank_command(ready.program), ready.env, ready.code_dir, watch, Alone())
    return conclude(job, result)[0]
