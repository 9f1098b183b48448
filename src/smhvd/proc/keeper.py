"""`train` as two processes, so that nothing of a job outlives a `train` killed outright (SIGKILL): a
SIGKILLed launcher cannot end its orphans (ranks that ignore SIGTERM, in sessions of their own). The process
started is a keeper that passes on every catchable signal and exits as its child, the launcher, did; when the
keeper dies, the kernel sends the launcher KEEPER_GONE (PR_SET_PDEATHSIG), and it SIGKILLs everything below
it. The launcher has a process group of its own: a signal to the keeper's group reaches it once, not twice.
"""

from __future__ import annotations

import contextlib
import os
import signal
from signal import SIGALRM, SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGWINCH
from types import FrameType

from smhvd.proc import processes

KEEPER_GONE = signal.SIGRTMIN + 1  # the launcher's parent-death signal: not one anything else sends
# Passed on from the keeper to the launcher: every signal a user or SageMaker may send that can be caught.
PASSED_ON = (SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGCONT, SIGWINCH)
END_BOUND_SECONDS = 2  # a killed train's job is gone within this long, as the docs say (measured: 0.1 s)


def split() -> None:
    """Fork: return in the child, which runs the launcher; in the parent keep the child until it ends and exit
    as it did (never returns). Signals arriving during the fork wait, blocked, for their handler."""
    keeper = os.getpid()
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, PASSED_ON)
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        processes.become_subreaper()
        signal.signal(KEEPER_GONE, _end_the_job)
        processes.die_with_parent(KEEPER_GONE)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if os.getppid() != keeper:  # the keeper died before the line above could take effect
            _end_the_job(KEEPER_GONE, None)
        return
    for sig in PASSED_ON:
        signal.signal(sig, lambda signum, _frame: _pass_on(child, signum))
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    _, status = os.waitpid(child, 0)  # a signal's handler runs, and the wait goes on (PEP 475)
    exit_as(os.waitstatus_to_exitcode(status))


def _pass_on(child: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # it ended meanwhile: the wait returns next
        os.kill(child, signum)


def exit_as(code: int) -> None:
    """End this process as the launcher ended: its exit code, or death by the same signal."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        os.kill(os.getpid(), -code)
        code = 128 - code  # a signal that does not end a process by default (SIGCHLD, SIGWINCH...)
    os._exit(code)


def _end_the_job(_signum: int, _frame: FrameType | None) -> None:
    """The keeper is gone: SIGKILL everything below (processes.kill_descendants), then exit. No report:
    whoever killed the keeper asked for this."""
    processes.kill_descendants()
    os._exit(128 + signal.SIGKILL)
