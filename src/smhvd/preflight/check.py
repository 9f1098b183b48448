"""The pre-flight of one job, run by its leader after every host is reachable and before the script starts:
the probe on every MPI host (runner.py), the verdict (verdict.py), the table and the verdict line in the log.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

from smhvd.config.job import Job
from smhvd.mpi.command import MpiPlan
from smhvd.proc.signals import SignalWatch
from smhvd.wire import PREFLIGHT_SPEC

from .launch import launch_limit
from .runner import SILENCE, findings_of, lost_daemon, probe_argv, probe_program, run_probes, stalled_launch
from .verdict import Verdict, judge, table

log = logging.getLogger("smhvd")


def places(job: Job) -> dict[str, str]:
    """Where the job writes, by the name the report gives each."""
    paths = job.paths
    return {
        "checkpoints": str(paths.checkpoint_dir),
        "model": str(paths.model_dir),
        "output": str(paths.output_data_dir),
        "tmp": tempfile.gettempdir(),
    }


def groups(job: Job) -> dict[str, tuple[str, str | None]]:
    """Each host's (instance group, instance type): one group of the current type without instance_groups."""
    resources = job.resources
    found = {h: ("", resources.current_instance_type) for h in resources.hosts}
    for group in resources.instance_groups:
        for host in group.hosts:
            found[host] = (group.name, group.instance_type)
    return found


def spec(job: Job, hosts: tuple[str, ...]) -> str:
    """What every probe is told (wire.PREFLIGHT_SPEC). Pure."""
    return json.dumps(
        {
            "hosts": list(hosts),
            "places": places(job),
            "gpus": job.hardware.gpus > 0,
            "min_ratio": job.options.preflight.min_ratio,
        }
    )


def second_attempt(timeout: float) -> tuple[float, float]:
    """The second attempt's own bound and stall limit, whatever the first took: the option's bound again (a
    daemon lost late in the first attempt leaves the second a whole check, not the seconds left), and the same
    stall limit (a launch that stalls again costs that limit, 20 s at most, not the bound). Pure."""
    return timeout, launch_limit(timeout)


def run_preflight(
    job: Job, plan: MpiPlan, env: Mapping[str, str], run_dir: Path, signals: SignalWatch | None = None
) -> Verdict:
    """Probe every MPI host (this one alone on a one-host job), log the table and the verdict line; a stop
    (`signals`) ends it with Stopped."""
    options = job.options.preflight
    several = plan.multi_host
    hosts = plan.hosts if several else (job.resources.current_host,)
    argv = probe_argv(plan, hosts, run_dir) if several else probe_program()
    log.debug("pre-flight of %d host(s) (up to %gs)", len(hosts), options.timeout)
    probe_env = {**env, PREFLIGHT_SPEC: spec(job, hosts)}
    first = launch_limit(options.timeout) if several else None
    collected, seconds = run_probes(
        argv, probe_env, hosts, options.timeout, signals=signals, launch_limit=first
    )
    lost = lost_daemon(collected) if several and seconds < options.timeout else None
    stalled = stalled_launch(collected) if lost is None else None  # only mpirun's launch stalls (several)
    first_attempt = lost or stalled
    if first_attempt is not None:  # a dropped connection or a stalled launch: a second attempt tells
        log.info("pre-flight: %s; checking once more", stalled or "mpirun lost one of its daemons")
        bound, limit = second_attempt(options.timeout)
        collected, again = run_probes(argv, probe_env, hosts, bound, signals=signals, launch_limit=limit)
        seconds += again
    found = findings_of(collected, seconds, options.timeout, SILENCE, groups(job), plan.slots)
    if first_attempt is not None:
        found = dataclasses.replace(found, first_attempt=first_attempt)
    verdict = judge(found, options)
    log_verdict(verdict)
    return verdict


def log_verdict(verdict: Verdict) -> None:
    """The verdict line; before it the table, a launcher line each, when there is something to compare or
    someone is named (a healthy one-host job: one line)."""
    if len(verdict.rows) > 1 or not verdict.ok:
        for line in table(verdict).splitlines():
            log.info("pre-flight: %s", line)
    (log.info if verdict.ok else log.warning)("%s", verdict.line())
