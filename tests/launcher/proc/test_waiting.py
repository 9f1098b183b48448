import pytest

from smhvd.errors import PeerError, WaitTimeout
from smhvd.proc.waiting import NotYet, wait_until


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_returns_the_first_result_and_backs_off():
    clock = FakeClock()
    answers = iter([None, None, None, "up"])
    assert wait_until(lambda: next(answers), what="x", timeout=10, clock=clock, sleep=clock.sleep) == "up"
    assert clock.sleeps == pytest.approx([0.02, 0.032, 0.0512])


def test_timeout_says_what_was_awaited_and_the_last_reason():
    clock = FakeClock()

    def check():
        raise NotYet("ssh: connect to host algo-2 port 22: Connection refused")

    with pytest.raises(PeerError) as err:
        wait_until(check, what="worker algo-2", timeout=5, clock=clock, sleep=clock.sleep, error=PeerError)
    assert str(err.value) == (
        "timed out after 5s waiting for worker algo-2 "
        "(last: ssh: connect to host algo-2 port 22: Connection refused)"
    )
    assert clock.now == pytest.approx(5.0)
    assert max(clock.sleeps) <= 1.0


def test_default_error_type():
    clock = FakeClock()
    with pytest.raises(WaitTimeout, match="waiting for nothing"):
        wait_until(lambda: None, what="nothing", timeout=1, clock=clock, sleep=clock.sleep)
