"""The leader (Job.leader: the first of the sorted MPI hosts): hostfile, reach the workers, run mpirun,
report, tell the workers."""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from smhvd.config.job import Job
from smhvd.env_options import read_env_options
from smhvd.errors import EX_STOPPED, EX_TEMPFAIL, Stopped
from smhvd.mpi.command import SSH_CONFIG, MpiPlan, build_mpirun_argv, display, plan_for
from smhvd.mpi.output import parse_mpirun_verdict
from smhvd.mpi.supervisor import STOP_DUMP_WAIT, Dumps, Outcome, supervise
from smhvd.preflight.check import run_preflight
from smhvd.preflight.verdict import Verdict
from smhvd.proc.signals import SignalWatch
from smhvd.report import failure, summary
from smhvd.report.stacks import StackDumper
from smhvd.roles import hostenv
from smhvd.roles.peers import WorkerLink, close_all, connect_all
from smhvd.roles.sshd import render_ssh_config
from smhvd.wire import HOSTENV_SERVED_FROM, RANK_ARGV, RankFailure

log = logging.getLogger("smhvd")
DUMP_LINE_LIMIT = 400  # of the failure file's 1024 characters, at most this much for a stack dump's summary


def rank_command(program: Sequence[str]) -> list[str]:
    """The program under the wrapper (smhvd.rank), with this interpreter, started directly (MPI disabled).
    `-P`: the working directory (the user's code) is not on sys.path, so none of its modules shadows the
    wrapper's (a `signal.py` beside the script)."""
    return [sys.executable, "-P", "-m", "smhvd.rank", "--", *program]


def mpirun_rank_command(program: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """The rank command for mpirun's command line, and the environment that carries the program's argv.

    The argv travels as JSON in RANK_ARGV (forwarded to other hosts by name, `-x SMHVD_RANK_ARGV`), never on
    mpirun's command line: there a user's value `:` starts a second program, and `-np`, `--app` or `-x` are
    read as mpirun's own options. The wrapper takes it out of the program's environment."""
    return [sys.executable, "-P", "-m", "smhvd.rank"], {**env, RANK_ARGV: json.dumps(list(program))}


def failure_reason(outcome: Outcome) -> str:
    """The failure file's text: the first failed rank and its stderr, else Open MPI's abort notice or
    mpirun's own last words."""
    failures = outcome.output.failures
    verdict = parse_mpirun_verdict(outcome.output.tail_text()) if len(failures) > 1 else None
    # Several ranks failed (the others often fail once the first is gone): the one mpirun saw exit first,
    # whose report may have reached the output after another's.
    named = [f for f in failures if verdict is not None and f.rank == verdict.rank]
    first: RankFailure | None = (named or failures)[0] if failures else None
    notice = outcome.output.abort_notice
    if notice is not None:  # Open MPI's own reason comes first; a rank that failed of it is the evidence
        ended = " (mpirun hung after it; ended by the launcher)" if outcome.ended_hung_abort else ""
        evidence = f"{first.headline()}\n{first.stderr_tail}" if first else outcome.output.tail_text()
        return failure.compose(f"MPI aborted the job: {notice}{ended}", evidence)
    first = first or parse_mpirun_verdict(outcome.output.tail_text())
    if first is not None:
        return failure.compose(first.headline(), first.stderr_tail or outcome.output.tail_text())
    return failure.compose(f"mpirun exited with code {outcome.exit_code}", outcome.output.tail_text())


def conclude(job: Job, outcome: Outcome, dump_line: str | None = None) -> tuple[int, str]:
    """The job's exit code and failure reason; writes the failure file (first writer wins). A stack dump's
    summary line, when one was taken, comes first (and makes a stopped job leave a failure file too)."""
    if outcome.stopped:
        log.info("job stopped (mpirun exit %d)", outcome.exit_code)
        if dump_line:
            failure.write_failure(job.paths.failure_file, failure.compose(dump_line, "the job was stopped"))
        return EX_STOPPED, ""
    if outcome.exit_code == 0:
        log.info("job succeeded")
        return 0, ""
    reason = failure_reason(outcome)
    if dump_line:
        first = dump_line.replace("\n", " ")[:DUMP_LINE_LIMIT]
        head, _, tail = reason.partition("\n")
        reason = first + "\n" + failure.compose(head, tail, limit=failure.FAILURE_LIMIT - len(first) - 1)
    failure.write_failure(job.paths.failure_file, reason)
    log.error("job failed (exit %d): %s", outcome.exit_code, reason.splitlines()[0])
    return outcome.exit_code, reason


def tell_all(links: Sequence[WorkerLink], event: dict[str, object]) -> None:
    """One event to every worker's link (a link that broke is the worker's problem: it exits on its own)."""
    for worker in links:
        worker.send(event)


def preflight_stop(job: Job, verdict: Verdict | None, only: bool) -> str | None:
    """The failure reason when the pre-flight stops the job (policy fail, or a pre-flight-only run): the first
    named host and its reason on the first line. Pure."""
    if verdict is None or verdict.ok or not (only or job.options.preflight.policy == "fail"):
        return None
    first, *others = verdict.named
    more = "".join(f"\n{n.host}: {n.reason}" for n in others)
    return failure.compose(f"pre-flight named {first.host}: {first.reason}", more.strip())


def run_leader(
    job: Job,
    program: Sequence[str],
    env: Mapping[str, str],
    run_dir: Path,
    code_dir: Path,
    started_at: float | None = None,
    *,
    preflight_only: bool = False,
) -> int:
    """Run the job from the leader; `started_at` (time.time() when `train` started) dates the summary.
    `preflight_only`: the pre-flight is the job (`train preflight`)."""
    started_at = time.time() if started_at is None else started_at
    host_env = dict(env)  # this host's ranks' own environment, served to them (roles/hostenv.py)
    hostenv.reclaim_leaders_leftovers()  # what trains killed by SIGKILL left behind
    served_from = hostenv.leader_directory()
    command, env = mpirun_rank_command(program, {**env, HOSTENV_SERVED_FROM: str(served_from)})
    plan = plan_for(job, command, env, run_dir, code_dir)
    plan.hostfile.write_text(plan.hostfile_text)
    links: list[WorkerLink] = []
    verdict: Verdict | None = None
    outcome: Outcome | None = None
    dump_line: str | None = None
    with SignalWatch() as watch, hostenv.serving(served_from, host_env):
        if job.multi_host:
            port = read_env_options(os.environ).ssh_port
            ssh_config = run_dir / SSH_CONFIG  # the links' and (several MPI hosts) orted's: plan.ssh_config
            ssh_config.write_text(render_ssh_config(port, control_dir=run_dir))
            log.info(
                "waiting for workers %s (up to %gs)",
                ", ".join(job.peers),
                job.options.launcher.peer_timeout,
            )
            links = connect_all(
                job.peers,
                ssh_config,
                port,
                job.options.launcher.peer_timeout,
                watch,
            )
        if preflight_only or job.options.preflight.policy != "off":
            try:
                verdict = run_preflight(job, plan, env, run_dir, watch)
            except Stopped as exc:
                tell_all(links, {"event": "end", "exit_code": exc.exit_code, "reason": str(exc)})
                close_all(links)
                raise
        stop_reason = preflight_stop(job, verdict, preflight_only)
        if stop_reason is None and not preflight_only:
            tell_all(links, {"event": "start"})
            outcome, dump_line = _run_mpirun(job, plan, env, code_dir, links, watch)
    if outcome is not None:
        code, reason = conclude(job, outcome, dump_line)
    elif stop_reason is not None:
        code, reason = EX_TEMPFAIL, stop_reason
        failure.write_failure(job.paths.failure_file, reason)
        log.error("job stopped before the script (exit %d): %s", code, reason.splitlines()[0])
    else:
        code, reason = 0, ""
    told = {w.host: w.send({"event": "end", "exit_code": code, "reason": reason}) for w in links}
    close_all(links)
    report(job, plan, outcome, code, reason, started_at, told, verdict)
    return code


def _run_mpirun(
    job: Job,
    plan: MpiPlan,
    env: Mapping[str, str],
    code_dir: Path,
    links: Sequence[WorkerLink],
    watch: SignalWatch,
) -> tuple[Outcome, str | None]:
    """The job's mpirun to its end; the outcome, and the summary line of a stack dump if one was taken."""
    argv = build_mpirun_argv(plan)
    log.info("starting %d processes: %s", plan.num_processes, display(argv))
    stacks = StackDumper(
        job.resources.current_host, job.paths.output_data_dir, plan.hosts[1:], plan.ssh_config
    )
    outcome = supervise(
        argv,
        env,
        code_dir,
        keep=[w.proc.pid for w in links],
        watch=watch,
        tick=functools.partial(tell_all, links, {"event": "alive"}) if links else None,
        dumps=Dumps(stacks.start, stacks.finished, job.options.launcher.hang_dump_seconds),
        # A stop that reached only the leader (a user's stop, Ctrl-C) stops every host's ranks.
        on_stop=functools.partial(tell_all, links, {"event": "stop"}),
    )
    stacks.finish(STOP_DUMP_WAIT)
    return outcome, stacks.last_line


def report(
    job: Job,
    plan: MpiPlan,
    outcome: Outcome | None,
    code: int,
    reason: str,
    started_at: float,
    told: Mapping[str, bool],
    verdict: Verdict | None = None,
) -> None:
    """Log the job summary and write it to output/data/job-summary.json."""
    share = None
    if job.options.horovod.timeline:
        timeline = Path(job.options.horovod.env(job.paths.output_data_dir)["HOROVOD_TIMELINE"])
        with contextlib.suppress(OSError):
            share = summary.horovod_op_share(summary.timeline_events(timeline.read_text()))
    host_exits: dict[str, int | str] = {job.resources.current_host: code}
    for host, ok in told.items():
        host_exits[host] = code if ok else "link lost before the end: exits on its own (69)"
    result = summary.summarize(
        hosts=job.mpi_hosts,
        ranks=plan.num_processes,
        starts=outcome.output.starts if outcome is not None else (),
        started_at=started_at,
        ended_at=time.time(),
        exit_code=code,
        host_exits=host_exits,
        failure=reason or None,
        horovod_op_share=share,
        preflight=verdict.to_json() if verdict is not None else None,
    )
    log.info("%s", result.render())
    try:
        summary.write_summary(job.paths.output_data_dir, result)
    except OSError as exc:
        log.warning("could not write %s: %s", summary.FILE_NAME, exc)
