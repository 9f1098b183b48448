"""The leader (Job.leader: the first of the sorted MPI hosts): reach the workers, the pre-flight, mpirun,
report, tell the workers.

Its life is a `State` (PREPARING -> LINKING -> CHECKING -> RUNNING -> STOPPING -> ENDED, `NEXT`); what ends
it is read from the state. Before RUNNING, whatever ends the leader (an error, a stop, the pre-flight under
`fail`, mpirun missing) becomes an `end` with the leader's exit code and reason (errors.exit_for: what cli.py
reports too) for every worker it reached, which exit at once; the workers are reached from the leader's
start, while the job is prepared (link/connect.py), and those not reached yet are given FAREWELL_WAIT to come
up. From RUNNING, mpirun's end is the job's, and every worker hears it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType

from smhvd.config.job import Job
from smhvd.config.launcher_options import LauncherOwnOptions
from smhvd.env_options import read_env_options
from smhvd.errors import EX_STOPPED, EX_TEMPFAIL, Ended, PeerError, Stopped, exit_for
from smhvd.hostenv import server
from smhvd.inflight.monitor import Monitor
from smhvd.link import ALIVE, END, START, STOP, Event
from smhvd.link.connect import Linking
from smhvd.mpi.command import SSH_CONFIG, MpiPlan, build_mpirun_argv, display, plan_for, require_mpirun
from smhvd.mpi.output import parse_mpirun_verdict
from smhvd.mpi.supervisor import Outcome, supervise
from smhvd.option_spec import key_of
from smhvd.preflight.check import groups as instance_groups
from smhvd.preflight.check import run_preflight
from smhvd.preflight.launch import JobLaunch
from smhvd.preflight.verdict import Verdict
from smhvd.proc.signals import STOP_SIGNALS, SignalWatch
from smhvd.report import failure, summary
from smhvd.report.stacks import STOP_DUMP_WAIT, Dumps, StackDumper, stop_failure
from smhvd.roles.sshd import render_ssh_config
from smhvd.wire import HOSTENV_SERVED_FROM, RANK_ARGV, RankFailure

log = logging.getLogger("smhvd")
DUMP_LINE_LIMIT = 400  # of the failure file's 1024 characters, at most this much for a stack dump's summary
FAREWELL_WAIT = 30.0  # a leader that ends before the start tells the workers that come up within this long
PREPARE_MARGIN = 10.0  # the leader's wait for the workers to prepare ends this much before theirs for it


class State(enum.Enum):
    PREPARING = "preparing the job (the workers are reached meanwhile)"
    LINKING = "waiting for the workers"
    CHECKING = "the pre-flight"
    RUNNING = "the job runs"
    STOPPING = "stopped: the ranks are ending"
    ENDED = "ended"


NEXT = {
    State.PREPARING: (State.LINKING, State.ENDED),
    State.LINKING: (State.CHECKING, State.RUNNING, State.ENDED),
    State.CHECKING: (State.RUNNING, State.ENDED),
    State.RUNNING: (State.STOPPING, State.ENDED),
    State.STOPPING: (State.ENDED,),
    State.ENDED: (),
}
BEFORE_START = (State.PREPARING, State.LINKING, State.CHECKING)


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
    summary line, when one was taken, comes first; a stop says so first (stacks.stop_failure)."""
    if outcome.stopped:
        log.info("job stopped (mpirun exit %d)", outcome.exit_code)
        started = len(outcome.output.starts)
        failure.write_failure(job.paths.failure_file, stop_failure(dump_line, started, job.num_processes))
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


def preflight_stop(job: Job, verdict: Verdict | None, only: bool) -> str | None:
    """The failure reason when the pre-flight stops the job (policy fail, or a pre-flight-only run): the first
    named host and its reason on the first line. Pure."""
    if verdict is None or verdict.ok or not (only or job.options.preflight.policy == "fail"):
        return None
    first, *others = verdict.named
    more = "".join(f"\n{n.host}: {n.reason}" for n in others)
    return failure.compose(f"pre-flight named {first.host}: {first.reason}", more.strip())


def prepare_bound(job: Job) -> tuple[float, str]:
    """How long the leader waits for every worker to prepare, and the option that sets it: a little less than
    the workers' own wait for the start (launcher_leader_timeout_seconds, from their start), so that the
    leader names the late host before a worker gives up on its own (issue 53.1). Pure."""
    timeout = job.options.launcher.leader_timeout
    return timeout - min(PREPARE_MARGIN, timeout / 4), key_of(LauncherOwnOptions, "leader_timeout")


@contextlib.contextmanager
def stop_first(watch: SignalWatch) -> Iterator[None]:
    """A worker's link closed before the start (PeerError), or it said why it ended (Ended), while this host's
    own stop waits on `watch`, not looked at yet (the pre-flight looks every half beat): SageMaker stopped
    every host, the worker's end is the stop's, and the stop is the cause (143), not the worker (53.2)."""
    try:
        yield
    except (PeerError, Ended):
        stops = [sig for sig in watch.drain() if sig in STOP_SIGNALS]
        if stops:
            raise Stopped(f"stopped by {signal.Signals(stops[0]).name} before the job started") from None
        raise


class Leader:
    """The leader's life (the module's docstring). A context manager: from its start it reaches the workers
    (several hosts); its end tells them why the job ended before it started, if it did, and hangs up."""

    def __init__(self, job: Job, run_dir: Path) -> None:
        self.job, self.run_dir = job, run_dir
        self.state = State.PREPARING
        self.linking: Linking | None = None
        self.keep: Sequence[int] = ()  # supervise's Role: the link sessions are this leader's to reap
        self.dumps = Dumps(lambda _why: None)
        self.told: dict[str, bool] = {}  # whom the job's end reached
        self.launch = JobLaunch(())  # the job's mpirun's launch, looked at from the heartbeat
        self.inflight: Monitor | None = None  # in-flight (docs/inflight.md): judged at every heartbeat

    def __enter__(self) -> Leader:
        if self.job.multi_host:
            port = read_env_options(os.environ).ssh_port
            ssh_config = self.run_dir / SSH_CONFIG  # the links' and (several MPI hosts) orted's
            ssh_config.write_text(render_ssh_config(port, control_dir=self.run_dir))
            timeout = self.job.options.launcher.peer_timeout
            log.info("reaching workers %s (up to %gs)", ", ".join(self.job.peers), timeout)
            self.linking = Linking(
                self.job.peers, ssh_config, port, timeout, prepare_bound=prepare_bound(self.job)
            ).__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if exc is not None and self.state is not State.ENDED:
                code, reason = exit_for(exc)
                self.end(code, reason, wait=0.0 if isinstance(exc, Stopped) else FAREWELL_WAIT)
        finally:
            if self.linking is not None:
                self.linking.close()

    def _to(self, state: State) -> None:
        if state not in NEXT[self.state]:
            raise AssertionError(f"the leader cannot go from {self.state.name} to {state.name}")
        log.debug("leader: %s -> %s", self.state.name, state.name)
        self.state = state

    def end(self, code: int, reason: str, wait: float = FAREWELL_WAIT) -> None:
        """The job's end to every worker: before the start, to each one reached (and those reached within
        `wait`); then ENDED."""
        event = Event(END, code, reason)
        if self.linking is not None and self.state in BEFORE_START:
            self.told = self.linking.end(event, wait)
        elif self.linking is not None:
            self.told = self.linking.tell(event)
        self._to(State.ENDED)

    def heartbeat(self) -> None:
        self.launch.check()
        if self.inflight is not None:
            self.inflight.tick()
        if self.linking is not None:
            self.linking.tell(Event(ALIVE))

    def inflight_reports(self, lines: bytes) -> None:
        if self.inflight is not None:
            self.inflight.feed(lines)

    def stopping(self) -> None:
        """A stop that reached only the leader (a user's stop, Ctrl-C) stops every host's ranks."""
        self._to(State.STOPPING)
        if self.linking is not None:
            self.linking.tell(Event(STOP))

    def run(
        self,
        program: Sequence[str],
        env: Mapping[str, str],
        code_dir: Path,
        started_at: float,
        preflight_only: bool = False,
    ) -> int:
        """The job from here, once prepared; its exit code. `started_at`: time.time() when `train` started
        (dates the summary). `preflight_only`: the pre-flight is the job (`train preflight`)."""
        self._to(State.LINKING)
        job = self.job
        host_env = dict(env)  # this host's ranks' own environment, held for them (hostenv/server.py)
        server.reclaim_leaders_leftovers()  # what trains killed by SIGKILL left behind
        served_from = server.leader_directory()
        command, env = mpirun_rank_command(program, {**env, HOSTENV_SERVED_FROM: str(served_from)})
        plan = plan_for(job, command, env, self.run_dir, code_dir)
        require_mpirun(env)
        plan.hostfile.write_text(plan.hostfile_text)
        verdict: Verdict | None = None
        result: Outcome | None = None
        with (
            SignalWatch() as watch,
            server.claimed(served_from),
            server.serving(served_from, host_env),
            stop_first(watch),
        ):
            if self.linking is not None:
                self.keep = [link.proc.pid for link in self.linking.wait(watch)]
            if preflight_only or job.options.preflight.policy != "off":
                self._to(State.CHECKING)
                verdict = run_preflight(job, plan, env, self.run_dir, watch)
            stop_reason = preflight_stop(job, verdict, preflight_only)
            if stop_reason is None and not preflight_only:
                self._to(State.RUNNING)
                if self.linking is not None:
                    self.linking.running()
                    self.linking.tell(Event(START))
                result, dump_line = self._run_mpirun(plan, env, code_dir, watch)
        if result is not None:
            code, reason = conclude(job, result, dump_line)
        elif stop_reason is not None:
            code, reason = EX_TEMPFAIL, stop_reason
            failure.write_failure(job.paths.failure_file, reason)
            log.error("job stopped before the script (exit %d): %s", code, reason.splitlines()[0])
        else:
            code, reason = 0, ""
        self.end(code, reason)
        inflight = self.inflight.to_json() if self.inflight is not None else None
        report(job, plan, result, code, reason, started_at, self.told, verdict, preflight_only, inflight)
        return code

    def _run_mpirun(
        self, plan: MpiPlan, env: Mapping[str, str], code_dir: Path, watch: SignalWatch
    ) -> tuple[Outcome, str | None]:
        """The job's mpirun to its end; the outcome, and the summary line of a stack dump if one was taken."""
        argv = build_mpirun_argv(plan)
        log.info("starting %d processes: %s", plan.num_processes, display(argv))
        stacks = StackDumper(
            self.job.resources.current_host, self.job.paths.output_data_dir, plan.hosts[1:], plan.ssh_config
        )
        self.dumps = Dumps(stacks.start, stacks.finished, self.job.options.launcher.hang_dump_seconds)
        self.launch = JobLaunch(plan.hosts if plan.multi_host else ())
        self.inflight = inflight_monitor(self.job)
        result = supervise(argv, env, code_dir, watch, self)
        if self.inflight is not None:
            self.inflight.tick()  # what came since the last heartbeat
        stacks.finish(STOP_DUMP_WAIT)
        return result, stacks.last_line


def inflight_monitor(job: Job) -> Monitor | None:
    """The job's in-flight watch: on, with several MPI hosts to compare (docs/inflight.md)."""
    if job.options.launcher.inflight == "off" or not job.mpi_multi_host:
        return None
    groups = {host: group for host, (group, _) in instance_groups(job).items()}
    return Monitor(groups, job.paths.output_data_dir / summary.FILE_NAME)


def report(
    job: Job,
    plan: MpiPlan,
    outcome: Outcome | None,
    code: int,
    reason: str,
    started_at: float,
    told: Mapping[str, bool],
    verdict: Verdict | None = None,
    preflight_only: bool = False,
    inflight: Mapping[str, object] | None = None,
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
        preflight_only=preflight_only,
        inflight=inflight,
    )
    log.info("%s", result.render())
    try:
        summary.write_summary(job.paths.output_data_dir, result)
    except OSError as exc:
        log.warning("could not write %s: %s", summary.FILE_NAME, exc)
