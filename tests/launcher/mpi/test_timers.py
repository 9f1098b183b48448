"""The supervisor's timers on a fake clock: the heartbeat, the silence dump and the escalation after Open MPI
announced an abort, each stepped through its deadlines without waiting."""

from __future__ import annotations

from smhvd.mpi.output import StderrFilter
from smhvd.mpi.supervisor import ABORT_GRACE, KILL_GRACE, HungAbort
from smhvd.proc.timers import Timer, Timers
from smhvd.report.stacks import Dumps


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def run_until(self, timers: Timers, until: float) -> None:
        """What the loop does when nothing else happens: wait for the next deadline, fire; up to `until`."""
        while (wait := timers.timeout()) is not None and self.now + wait <= until:
            self.now += wait
            timers.fire_due()
        self.now = until


def test_timers_fire_when_due_earliest_first_once_and_can_be_cancelled_or_set_again() -> None:
    clock = Clock()
    timers = Timers(clock)
    fired: list[str] = []
    assert timers.timeout() is None  # nothing to wait for: the loop waits for events alone
    a, b, c = Timer("a"), Timer("b"), Timer("c")
    timers.after(b, 2.0, lambda: fired.append("b"))
    timers.after(a, 1.0, lambda: fired.append("a"))
    timers.after(c, 3.0, lambda: fired.append("c"))
    assert timers.timeout() == 1.0
    clock.now += 2.5
    assert timers.timeout() == 0.0
    timers.fire_due()
    assert fired == ["a", "b"]
    timers.after(c, 10.0, lambda: fired.append("c again"))  # set again: the old deadline is gone
    clock.now += 5
    timers.fire_due()
    assert fired == ["a", "b"]
    timers.cancel(c)
    assert timers.timeout() is None and not timers.pending(c)


def test_a_callback_cancelling_a_due_timer_stops_it_in_the_same_round() -> None:
    clock = Clock()
    timers = Timers(clock)
    fired: list[str] = []
    first, second = Timer("first"), Timer("second")
    timers.after(first, 1.0, lambda: (fired.append("first"), timers.cancel(second)))
    timers.after(second, 1.5, lambda: fired.append("second"))
    clock.now += 2
    timers.fire_due()
    assert fired == ["first"]


def test_the_heartbeat_beats_every_interval() -> None:
    clock = Clock()
    timers = Timers(clock)
    beats: list[float] = []
    timers.every(Timer("heartbeat"), 2.0, lambda: beats.append(clock.now - 1000.0))
    clock.run_until(timers, 1007.0)
    assert beats == [2.0, 4.0, 6.0]


def test_silence_dumps_once_per_silence_and_a_stall_once() -> None:
    clock = Clock()
    timers = Timers(clock)
    dumped: list[tuple[float, str]] = []
    dumps = Dumps(lambda why: dumped.append((clock.now - 1000.0, why)), silence=30.0)
    dumps.start(timers)
    clock.run_until(timers, 1010.0)
    dumps.heard(stalled=False)  # a rank wrote at 10 s: the silence starts again
    clock.run_until(timers, 1100.0)
    assert dumped == [(40.0, "no output from any rank for 30s")]  # once, not every 30 s of one silence
    output = StderrFilter()
    output.feed(
        b"[2026-11-23 10:00:00.000000: W horovod/common/stall_inspector.cc:107] One or more tensors were "
        b"submitted to be reduced, gathered or broadcasted by subset of ranks and are waiting for remainder "
        b"of ranks for more than 60 seconds.\n"
    )
    assert output.stall_notice is not None
    for _ in range(2):
        dumps.heard(stalled=output.stall_notice is not None)
    assert [why for _, why in dumped if "stall" in why] == ["Horovod reported a stall"]


def test_no_silence_dump_without_a_limit() -> None:
    clock = Clock()
    timers = Timers(clock)
    dumps = Dumps(lambda why: None)
    dumps.start(timers)
    assert timers.timeout() is None


def escalation(running: list[bool]) -> tuple[Clock, Timers, HungAbort, list[tuple[float, str]]]:
    clock = Clock()
    timers = Timers(clock)
    done: list[tuple[float, str]] = []
    hung = HungAbort(
        lambda: running[0],
        lambda: done.append((clock.now - 1000.0, "terminate")),
        lambda: done.append((clock.now - 1000.0, "kill")),
        timers,
        lambda: done.append((clock.now - 1000.0, "give up")),  # the supervisor's loop.stop
    )
    return clock, timers, hung, done


def test_an_announced_abort_ends_a_hung_mpirun_step_by_step() -> None:
    clock, timers, hung, done = escalation([True])
    hung.announced("ORTE has lost communication with a remote daemon")
    hung.announced("a second notice does not restart the grace")
    clock.run_until(timers, 1100.0)
    assert done == [
        (ABORT_GRACE, "terminate"),
        (ABORT_GRACE + KILL_GRACE, "kill"),
        (ABORT_GRACE + 2 * KILL_GRACE, "give up"),  # the loop stops reading KILL_GRACE after the kill
    ]
    assert hung.ended and hung.gave_up
    assert timers.timeout() is None


def test_an_mpirun_that_exits_in_its_grace_is_left_alone() -> None:
    running = [True]
    clock, timers, hung, done = escalation(running)
    hung.announced("MPI_ABORT was invoked")
    clock.run_until(timers, 1000.0 + ABORT_GRACE / 2)
    running[0] = False
    clock.run_until(timers, 1100.0)
    assert done == [] and not hung.ended and not hung.gave_up


def test_handles_with_one_label_are_two_timers() -> None:
    """A handle is its own timer, whatever its label: two owners on one loop cannot replace each other's."""
    clock = Clock()
    timers = Timers(clock)
    fired: list[str] = []
    mine, theirs = Timer("deadline"), Timer("deadline")
    timers.after(mine, 1.0, lambda: fired.append("mine"))
    timers.after(theirs, 2.0, lambda: fired.append("theirs"))
    timers.cancel(Timer("deadline"))  # a third handle cancels nothing of the others
    assert timers.pending(mine) and timers.pending(theirs)
    clock.run_until(timers, 1000.0 + 3)
    assert fired == ["mine", "theirs"] and not timers.pending(mine)
