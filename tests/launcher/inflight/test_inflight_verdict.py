"""In-flight's verdict, pure: a host's lateness at a step (by the waits for the collective, or by READY on the
hosts' clocks), like with like, and who is named over a window: the late host and no other, nobody for noise,
nobody for bad input (a host whose reports stop, a clock that steps)."""

from __future__ import annotations

import random

import pytest

from smhvd.inflight.verdict import (
    MIN_STEPS,
    HostStep,
    HostView,
    Verdict,
    has_recovered,
    host_steps,
    is_late,
    lateness,
    margin,
)

HOSTS = ("algo-1", "algo-2", "algo-3", "algo-4")


def steps_of(waits: dict[str, float]) -> dict[str, HostStep]:
    return {host: HostStep(ready=100.0 - wait, wait=wait, mark=100.0) for host, wait in waits.items()}


def test_the_host_that_waits_least_for_the_allreduce_is_as_late_as_the_others_wait_more() -> None:
    late = lateness(steps_of({"algo-1": 0.50, "algo-2": 0.52, "algo-3": 0.08, "algo-4": 0.49}), {})
    assert late["algo-3"] == pytest.approx(0.50 - 0.08)
    assert late["algo-1"] == pytest.approx(0.49 - 0.50)
    assert max(late, key=late.__getitem__) == "algo-3"


def test_by_ready_alone_the_host_that_reaches_the_collective_last_is_late_by_its_distance_to_the_median() -> (
    None
):
    ready = dict(zip(HOSTS, (0.0, 0.01, 0.4, 0.02), strict=True))
    steps = {h: HostStep(ready=10.0 + r, wait=None, mark=10.0 + r) for h, r in ready.items()}
    late = lateness(steps, {})
    assert late["algo-3"] == pytest.approx(0.39)
    assert late["algo-1"] == pytest.approx(-0.02)


def test_a_host_is_compared_with_its_own_instance_group_when_it_has_others() -> None:
    groups = {"algo-1": "p4d", "algo-2": "p4d", "algo-3": "g5", "algo-4": "g5"}
    # the g5 group is slower as a whole; within it algo-4 waits as long as algo-3
    late = lateness(steps_of({"algo-1": 0.30, "algo-2": 0.31, "algo-3": 0.01, "algo-4": 0.01}), groups)
    assert late["algo-3"] == pytest.approx(0.0)
    assert late["algo-4"] == pytest.approx(0.0)


def test_a_host_is_its_ranks_last_one_and_its_wait_their_least() -> None:
    entries = {("algo-1", 0): (10.0, 10.5), ("algo-1", 1): (10.3, 10.5), ("algo-2", 2): (10.1, None)}
    found = host_steps(entries)
    assert found["algo-1"] == HostStep(ready=10.3, wait=pytest.approx(0.2), mark=10.5)
    assert found["algo-2"] == HostStep(ready=10.1, wait=None, mark=10.1)


def feed(
    verdict: Verdict, first: int, count: int, lateness_of: dict[str, float], at: float, jitter: float = 0.0
) -> float:
    """`count` steps of 0.1 s from `first`, each host's ranks (one a host) waiting 0.3 s less its lateness;
    judged as they come, one step a tenth of a second."""
    rng = random.Random(first)
    for seq in range(first, first + count):
        done = 1000.0 + seq * 0.1
        for rank, host in enumerate(HOSTS):
            wait = 0.3 - lateness_of.get(host, 0.0) + rng.uniform(-jitter, jitter)
            verdict.add((host, rank), [[seq, done - wait, done]], at)
        at += 0.1
        verdict.judge(at)
    return at


def test_a_late_host_is_named_and_no_other_and_noise_names_nobody() -> None:
    verdict = Verdict()
    at = feed(verdict, 0, 200, {}, 0.0, jitter=0.004)  # 4 ms of noise on 0.1 s steps
    views = verdict.views()
    assert not [h for h, v in views.items() if is_late(v, verdict.step_seconds())]
    feed(verdict, 200, 200, {"algo-2": 0.05}, at, jitter=0.004)
    views = verdict.views()
    assert [h for h, v in views.items() if is_late(v, verdict.step_seconds())] == ["algo-2"]
    assert views["algo-2"].lateness == pytest.approx(0.05, abs=0.005)
    assert views["algo-2"].last_share >= 2 / 3  # 200 of the window's 300 steps are the slow ones


def test_a_lateness_below_the_margin_against_the_step_time_is_not_named() -> None:
    step = 1.0
    assert margin(step) == pytest.approx(0.2)
    assert not is_late(HostView(lateness=0.15, last_share=1.0, steps=50), step)
    assert is_late(HostView(lateness=0.25, last_share=1.0, steps=50), step)
    assert not is_late(HostView(lateness=0.25, last_share=1.0, steps=MIN_STEPS - 1), step)
    assert not is_late(HostView(lateness=0.25, last_share=0.5, steps=50), step)


def test_a_named_host_recovers_when_it_is_no_longer_last_or_late_enough() -> None:
    assert has_recovered(HostView(lateness=0.01, last_share=0.9, steps=50), 1.0)
    assert has_recovered(HostView(lateness=0.5, last_share=0.3, steps=50), 1.0)
    assert not has_recovered(HostView(lateness=0.15, last_share=0.5, steps=50), 1.0)  # between the two bars
    assert not has_recovered(None, 1.0)


def test_a_rank_whose_reports_stop_is_left_out_and_nobody_is_named_for_it() -> None:
    verdict = Verdict()
    at = 0.0
    for seq in range(600):
        done = 1000.0 + seq * 0.1
        for rank, host in enumerate(HOSTS):
            if host == "algo-4" and seq >= 100:
                continue  # its reports stop (its wrapper's pipe, not its training: the others go on)
            verdict.add((host, rank), [[seq, done - 0.3, done]], at)
        at += 0.1
        verdict.judge(at)
    assert verdict.count > 500  # the others were judged once algo-4 was left out
    assert "algo-4" not in verdict.views()
    assert not [h for h, v in verdict.views().items() if is_late(v, verdict.step_seconds())]


def ready_only(verdict: Verdict, first: int, count: int, offset: dict[str, float], at: float) -> float:
    for seq in range(first, first + count):
        ready = 1000.0 + seq * 0.1
        for rank, host in enumerate(HOSTS):
            verdict.add((host, rank), [[seq, ready + offset.get(host, 0.0), None]], at)
        at += 0.1
        verdict.judge(at)
    return at


def test_a_clock_that_steps_by_more_than_a_step_is_not_judged() -> None:
    verdict = Verdict()
    at = ready_only(verdict, 0, 700, {}, 0.0)
    ready_only(verdict, 700, 300, {"algo-3": 5.0}, at)  # algo-3's clock steps 5 s ahead
    assert verdict.inconsistent > 250
    assert not any(
        is_late(v, verdict.step_seconds(), by_wait=False, baseline=verdict.baseline)
        for v in verdict.views().values()
    )


def test_a_clock_that_steps_by_less_than_a_step_names_nobody_as_the_steps_did_not_slow() -> None:
    verdict = Verdict()
    at = ready_only(verdict, 0, 700, {}, 0.0)
    ready_only(verdict, 700, 300, {"algo-3": 0.05}, at)  # half a step: it looks late, nothing slowed
    view = verdict.views()["algo-3"]
    assert view.lateness == pytest.approx(0.05)
    assert is_late(view, verdict.step_seconds())  # by its lateness alone it would be named...
    assert not is_late(view, verdict.step_seconds(), by_wait=False, baseline=verdict.baseline)  # ...but not


def test_by_ready_a_host_that_slows_the_steps_is_named() -> None:
    verdict = Verdict()
    at = ready_only(verdict, 0, 700, {}, 0.0)
    for seq in range(700, 1000):  # algo-3 arrives 0.05 s late and every step waits for it
        ready = 1000.0 + 70.0 + (seq - 700) * 0.15
        for rank, host in enumerate(HOSTS):
            verdict.add((host, rank), [[seq, ready + (0.05 if host == "algo-3" else 0.0), None]], at)
        at += 0.15
        verdict.judge(at)
    view = verdict.views()["algo-3"]
    assert is_late(view, verdict.step_seconds(), by_wait=False, baseline=verdict.baseline)


def test_memory_is_bounded_while_a_rank_lags() -> None:
    verdict = Verdict()
    for seq in range(30_000):
        verdict.add(("algo-1", 0), [[seq, float(seq), float(seq)]], 0.0)
    verdict.add(("algo-2", 1), [[0, 0.0, 0.0]], 0.0)
    verdict.judge(0.0)
    assert len(verdict.steps.pending) <= 22_000
