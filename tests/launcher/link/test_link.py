"""A worker's life (roles/worker.py) fed by the real relay, without ssh: the relay process as the leader
starts it (link/relay.command: `python -I -S`), the real Worker (its private directory, its link socket, its
sshd on a port of this test's own) waiting in this test's main thread while a thread plays the leader. Each
state's meaning of an `end`, a closed link, a silence and a stop."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from smhvd.errors import EX_STOPPED, EX_UNAVAILABLE, PeerError
from smhvd.hostenv import trust
from smhvd.link import END, LINKED, READY, START, Event
from smhvd.link.relay import command
from smhvd.proc.waiting import wait_until
from smhvd.report.stacks import Dumps
from smhvd.roles import worker as worker_module
from smhvd.roles.worker import State, Worker
from smhvd_dev.mltree import write_ml_tree
from support.ci import need_root
from support.jobs import bare_job

pytestmark = pytest.mark.integration
PORT = 47000 + os.getpid() % 1000  # a directory (and an sshd port) of our own


def relay() -> subprocess.Popen[bytes]:
    """What the leader starts over ssh on the worker."""
    return subprocess.Popen(
        command(PORT), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )


def ready(proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    assert proc.stdout.read(len(READY)) == READY  # nothing before it: the relay starts isolated


def say(proc: subprocess.Popen[bytes], *events: Event) -> None:
    """The leader's words to the relay, in order."""
    assert proc.stdin is not None
    proc.stdin.write(b"".join(event.encode() for event in events))
    proc.stdin.flush()


MakeWorker = Callable[..., Worker]


@pytest.fixture
def make_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MakeWorker]:
    """make_worker(leader_timeout=60) -> a Worker of algo-2 (leader algo-1), entered; exited at the end."""
    need_root("a worker runs sshd")
    monkeypatch.setenv("SMHVD_SSH_PORT", str(PORT))
    made: list[Worker] = []

    def make(leader_timeout: float = 60.0) -> Worker:
        paths = write_ml_tree(tmp_path / "ml", current_host="algo-2", hosts=("algo-1", "algo-2"))
        job = bare_job(paths, {"launcher_leader_timeout_seconds": leader_timeout})
        (tmp_path / "run").mkdir(exist_ok=True)
        made.append(Worker(job, tmp_path / "run").__enter__())
        return made[-1]

    yield make
    for worker in made:
        worker.__exit__(None, None, None)
    assert not trust.directory(PORT).exists()


def leader(play: Callable[[], object]) -> threading.Thread:
    """The leader's side, in a thread of its own (the worker waits in the main thread: it takes signals)."""
    thread = threading.Thread(target=play, daemon=True)
    thread.start()
    return thread


def failure_of(worker: Worker) -> str | None:
    path = worker.job.paths.failure_file
    return path.read_text() if path.exists() else None


def test_end_gives_the_jobs_exit_code_and_reason(make_worker: MakeWorker) -> None:
    worker = make_worker()
    proc = relay()

    def play() -> None:
        ready(proc)
        say(proc, Event(LINKED), Event(START), Event(END, 7, "rank 1 on algo-2 exited with code 7\nboom"))

    leader(play)
    assert worker.wait() == 7
    assert failure_of(worker) == "rank 1 on algo-2 exited with code 7\nboom"
    assert proc.stdin is not None
    proc.stdin.close()
    assert proc.wait(30) == 0


def test_the_leaders_end_before_the_start_is_this_workers_end_with_its_code_and_reason(
    make_worker: MakeWorker,
) -> None:
    """Issue 44: a leader whose pip failed exits 70; its workers waited 15 minutes. Now each exits at once
    with the leader's code, and its own failure file says what the leader said and that it was the leader."""
    worker = make_worker(leader_timeout=600)
    proc = relay()
    reason = "pip failed on requirements.txt: no such package\nERROR: No matching distribution"

    def play() -> None:
        ready(proc)
        say(proc, Event(LINKED), Event(END, 70, reason))

    leader(play)
    began = time.monotonic()
    assert worker.wait() == 70
    assert time.monotonic() - began < 60  # not the 600 s of launcher_leader_timeout_seconds
    assert failure_of(worker) == (
        "the leader algo-1 ended the job before it started (exit 70): pip failed on requirements.txt: no "
        "such package\nERROR: No matching distribution"
    )


@pytest.mark.parametrize(
    ("said", "state", "reason"),
    [
        # The leader's launcher killed outright after it took the link: 69 at once, not after
        # launcher_leader_timeout_seconds (it read such a close as an attempt the leader gave up).
        ((Event(LINKED),), State.LINKED, "the leader algo-1 ended before the job started: its link"),
        (
            (Event(LINKED), Event(START)),
            State.RUNNING,
            "lost the leader algo-1 during the job: its link closed",
        ),
    ],
)
def test_the_leaders_link_closing_without_a_word_ends_the_worker_at_once(
    make_worker: MakeWorker, said: tuple[Event, ...], state: State, reason: str
) -> None:
    worker = make_worker(leader_timeout=600)
    proc = relay()

    def play() -> None:
        ready(proc)
        say(proc, *said)
        wait_until(lambda: worker.state is state or None, what=f"the worker to be {state.name}", timeout=60)
        proc.kill()

    leader(play)
    assert worker.wait() == EX_UNAVAILABLE
    failure = failure_of(worker)
    assert failure is not None
    assert failure.startswith(reason), failure


def test_an_attempt_the_leader_gave_up_before_linked_is_not_an_end_and_the_wait_is_bounded(
    make_worker: MakeWorker,
) -> None:
    worker = make_worker(leader_timeout=1.5)
    proc = relay()

    def play() -> None:
        ready(proc)
        proc.kill()  # e.g. the leader's attempt timed out before it read READY: the worker keeps waiting

    leader(play)
    with pytest.raises(PeerError) as info:
        worker.wait()
    assert str(info.value) == (
        "the leader algo-1 did not start the job within 1.5s (launcher_leader_timeout_seconds)"
    )
    assert worker.state is State.WAITING


def test_a_hundred_abandoned_attempts_leave_the_worker_holding_no_more_fds(make_worker: MakeWorker) -> None:
    """The leader's retried attempts, each a connection to this worker's link socket that ends before it is
    linked: after 100 of them the worker holds as many fds as after the first."""
    worker = make_worker(leader_timeout=600)
    held: list[int] = []

    def play() -> None:
        for _ in range(100):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as attempt:
                attempt.connect(str(trust.directory(PORT) / trust.LINK_SOCKET))
                attempt.sendall(b"{}\n")  # a word that is no event
                wait_until(lambda: worker.listener.connections or None, what="the attempt taken", timeout=60)
            wait_until(lambda: not worker.listener.connections or None, what="it dropped", timeout=60)
            held.append(len(os.listdir("/proc/self/fd")))
        proc = relay()
        ready(proc)
        say(proc, Event(LINKED), Event(START), Event(END, 0, ""))

    thread = leader(play)
    assert worker.wait() == 0
    thread.join(60)
    print(f"fds held after the 1st, 50th and 100th attempt: {held[0]}, {held[49]}, {held[99]}")
    assert set(held) == {held[0]}


def test_the_relay_without_a_waiting_launcher_fails_clearly() -> None:
    proc = relay()
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 69  # EX_UNAVAILABLE: no launcher waits on this host
    assert b"no launcher is waiting on this host" in err


def test_heartbeats_keep_the_job_alive_and_silence_means_the_leader_is_gone(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A leader host that vanishes closes nothing: the worker notices that its words stopped. The product's
    leader speaks every 2 s against a 10 s limit (link/__init__.py); here every 0.1 s against 3 s, for longer
    than the limit: only a 3 s stall of the relay or the worker (a hang, not a loaded machine) could end the
    wait while they come."""
    monkeypatch.setattr(worker_module, "SILENCE_LIMIT", 3.0)
    worker = make_worker()
    proc = relay()
    last_word = [0.0]

    def play() -> None:
        ready(proc)
        say(proc, Event(LINKED), Event(START))
        until = time.monotonic() + 4.0
        while time.monotonic() < until:
            say(proc, Event("alive"))
            last_word[0] = time.monotonic()
            time.sleep(0.1)
        # the session stays open, but nothing more is said

    leader(play)
    assert worker.wait() == EX_UNAVAILABLE
    silent = time.monotonic() - last_word[0]
    failure = failure_of(worker)
    assert failure is not None
    assert failure.startswith("lost the leader algo-1 during the job: no word from it for 3s")
    assert silent >= 3.0  # counted from the last word received, which came after it was written
    proc.kill()


def test_a_slow_stack_dump_does_not_silence_the_leader(
    make_worker: MakeWorker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR1 to a worker's `train` while its py-spy takes longer than the silence limit (a loaded host): the
    worker's loop goes on reading the leader's heartbeats, so the job goes on and ends with the leader's
    verdict."""
    monkeypatch.setattr(worker_module, "SILENCE_LIMIT", 1.5)
    dumping = threading.Event()
    finished = os.eventfd(0, os.EFD_NONBLOCK)

    def slow_dump(_why: str) -> None:  # as StackDumper.start: in the background, `finished` said at its end
        def run() -> None:
            dumping.set()
            time.sleep(2.5)
            os.eventfd_write(finished, 1)

        threading.Thread(target=run, daemon=True).start()

    worker = make_worker()
    worker.dumps = Dumps(slow_dump, finished)
    proc = relay()

    def play() -> None:
        ready(proc)
        say(proc, Event(LINKED), Event(START))
        wait_until(lambda: worker.state is State.RUNNING or None, what="the job's start", timeout=60)
        os.kill(os.getpid(), signal.SIGUSR1)  # the worker's SignalWatch: its loop starts the dump
        assert dumping.wait(30)
        until = time.monotonic() + 3.5  # past the dump's end
        while time.monotonic() < until:
            say(proc, Event("alive"))
            time.sleep(0.1)
        say(proc, Event(END, 0, ""))

    leader(play)
    assert worker.wait() == 0
    os.close(finished)


def test_a_stop_before_the_start_ends_the_worker_at_once(make_worker: MakeWorker) -> None:
    worker = make_worker(leader_timeout=600)
    before = signal.getsignal(signal.SIGTERM)

    def stop() -> None:  # once the worker's wait takes signals
        wait_until(
            lambda: signal.getsignal(signal.SIGTERM) is not before or None, what="the wait", timeout=60
        )
        os.kill(os.getpid(), signal.SIGTERM)

    leader(stop)
    assert worker.wait() == EX_STOPPED
    assert failure_of(worker) is None


def test_a_script_outside_mpi_is_stopped_without_sleeping(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script a host outside the MPI instance groups runs gets SIGTERM when the job ends; its end was
    awaited with Popen.wait(grace), a hidden sleep-poll (issue 46), and is now awaited on its pidfd."""
    script = worker_module.OutsideScript(
        ["sh", "-c", "trap 'sleep 0.3; exit 0' TERM; while :; do sleep 0.1; done"],
        dict(os.environ),
        tmp_path,
        "h",
    )
    time.sleep(0.5)  # the trap is set
    sleeps: list[float] = []
    real = time.sleep
    monkeypatch.setattr(time, "sleep", lambda seconds: (sleeps.append(seconds), real(seconds))[1])
    script.stop()
    assert script.proc.returncode == 0
    assert sleeps == []
