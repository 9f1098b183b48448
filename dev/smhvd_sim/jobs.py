"""Running one command on hosts at once and collecting, per host, its exit code, log and timings; with
scheduled faults (SIGTERM, kill, link cut, host down) and a deadline after which everything is stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TextIO

from smhvd.proc.processes import cmdline, is_alive
from smhvd_sim.host import SimHost
from smhvd_sim.procfs import children_of
from smhvd_sim.system import ClusterError, wait_for

FaultKind = Literal["term", "int", "kill", "link-down", "stop"]
FAULT_KINDS: tuple[FaultKind, ...] = ("term", "int", "kill", "link-down", "stop")
TIMEOUT_EXIT = 124


@dataclass(frozen=True)
class Fault:
    """Do ``kind`` to ``host`` ``at`` seconds after the command started on every host.
    term/int: SIGTERM/SIGINT to the command's process (how SageMaker stops a job: SIGTERM to the
    container's main process); kill: SIGKILL to every process of the host; link-down: cut its network
    link; stop: take the whole host down (namespaces and link vanish)."""

    host: str
    kind: FaultKind
    at: float


@dataclass(frozen=True)
class HostResult:
    """How the command ended on one host. exit_code is None when it never ran (host held down) or was
    still running at the deadline (timed_out); killed by signal N reads 128+N, as a shell shows it.
    left_running: the command lines of processes still alive on the host when the command exited (they
    were then killed, as stopping a container kills everything in it)."""

    host: str
    exit_code: int | None
    started: float
    ended: float | None
    log: Path
    timed_out: bool = False
    left_running: tuple[str, ...] = ()

    @property
    def seconds(self) -> float | None:
        return None if self.ended is None else self.ended - self.started


def exit_code_of(returncode: int) -> int:
    """nsenter re-raises its child's fatal signal on itself: -N becomes 128+N."""
    return 128 - returncode if returncode < 0 else returncode


class HostProcess:
    """A command running inside one host; its output goes to ``log`` (and, prefixed, to ``echo``)."""

    def __init__(
        self,
        host: SimHost,
        argv: Sequence[str],
        env: Mapping[str, str],
        log: Path,
        echo: TextIO | None = None,
        exited: threading.Event | None = None,
        end_host_on_exit: bool = False,
    ) -> None:
        self.host = host
        self._end_host_on_exit = end_host_on_exit
        self.left_running: tuple[str, ...] = ()
        self.log = log
        self._exited = exited
        self.ended: float | None = None
        log.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = log.open("wb")
        self.started = time.time()
        self.popen = subprocess.Popen(
            host.command(list(argv)),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._pump = threading.Thread(target=self._copy_output, args=(echo,), daemon=True)
        self._pump.start()
        self._waiter = threading.Thread(target=self._wait_exit, daemon=True)
        self._waiter.start()

    def _copy_output(self, echo: TextIO | None) -> None:
        assert self.popen.stdout is not None
        prefix = f"[{self.host.name}] "
        for line in self.popen.stdout:
            self._log_file.write(line)
            self._log_file.flush()
            if echo is not None:
                echo.write(prefix + line.decode(errors="replace"))
                echo.flush()
        self._log_file.close()

    def _wait_exit(self) -> None:
        self.popen.wait()
        ended = time.time()
        if self._end_host_on_exit:
            survivors = [pid for pid in self.host.processes() if is_alive(pid)]
            self.left_running = tuple(" ".join(cmdline(pid)) for pid in survivors)
            self.host.kill_processes()
        # Only now is the host quiet: `running` must not turn false before the clean-up above, or the next
        # command started on this host could be caught by it (and killed).
        self.ended = ended
        if self._exited is not None:
            self._exited.set()

    def target_pid(self, timeout: float = 10.0) -> int:
        """Host pid of the command itself (nsenter's child inside the host's PID namespace)."""
        return wait_for(
            lambda: next(iter(children_of(self.popen.pid)), None),
            f"the command to start on {self.host.name}",
            timeout,
        )

    def send_signal(self, signum: int) -> None:
        """Signal the command itself (not nsenter, which would not pass it on)."""
        if not self.running:
            return
        with contextlib.suppress(ProcessLookupError, ClusterError):
            os.kill(self.target_pid(), signum)

    @property
    def running(self) -> bool:
        return self.ended is None

    def wait(self, timeout: float) -> int:
        """Wait for the exit (and the end of the output) at most ``timeout`` s; return the exit code."""
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise ClusterError(f"{self.host.name}: still running after {timeout:g} s") from exc
        self._waiter.join(timeout)
        return exit_code_of(self.popen.returncode)

    def finish_output(self, timeout: float = 5.0) -> None:
        """Let the log catch up (daemons the command left behind may hold its output open)."""
        self._pump.join(timeout)

    def result(self, timed_out: bool = False) -> HostResult:
        code = self.popen.poll()
        return HostResult(
            host=self.host.name,
            exit_code=None if code is None else exit_code_of(code),
            started=self.started,
            ended=self.ended,
            log=self.log,
            timed_out=timed_out,
            left_running=self.left_running,
        )


def apply_fault(fault: Fault, host: SimHost, process: HostProcess | None) -> None:
    if fault.kind in ("term", "int"):
        if process is not None:
            process.send_signal(signal.SIGTERM if fault.kind == "term" else signal.SIGINT)
    elif fault.kind == "kill":
        host.kill_processes()
    elif fault.kind == "link-down":
        host.set_link(up=False)
    else:
        host.stop()


def await_hosts(
    processes: Mapping[str, HostProcess],
    hosts: Mapping[str, SimHost],
    *,
    timeout: float,
    faults: Sequence[Fault] = (),
    grace: float = 10.0,
    exited: threading.Event,
) -> dict[str, bool]:
    """Wait until every process has exited, applying faults when due. At the deadline (or on an
    exception such as KeyboardInterrupt) send SIGTERM, wait ``grace`` s, then kill what is left.
    Returns, per host, whether it was stopped at the deadline."""
    start = min((process.started for process in processes.values()), default=time.time())
    deadline = start + timeout
    pending = sorted(faults, key=lambda fault: fault.at)
    try:
        while any(process.running for process in processes.values()):
            now = time.time()
            while pending and pending[0].at <= now - start:
                fault = pending.pop(0)
                apply_fault(fault, hosts[fault.host], processes.get(fault.host))
            if now >= deadline:
                running = [name for name, process in processes.items() if process.running]
                stop_all(processes, hosts, grace)
                return {name: name in running for name in processes}
            next_event = min([deadline] + [start + fault.at for fault in pending[:1]])
            exited.wait(max(0.0, min(next_event - time.time(), 1.0)))
            exited.clear()
    except BaseException:
        stop_all(processes, hosts, grace)
        raise
    return dict.fromkeys(processes, False)


def stop_all(processes: Mapping[str, HostProcess], hosts: Mapping[str, SimHost], grace: float) -> None:
    """SIGTERM every running command, give them ``grace`` s, then SIGKILL everything on those hosts."""
    for process in processes.values():
        process.send_signal(signal.SIGTERM)
    deadline = time.time() + grace
    for process in processes.values():
        try:
            process.wait(max(0.0, deadline - time.time()))
        except ClusterError:
            hosts[process.host.name].kill_processes()
            process.wait(10.0)
