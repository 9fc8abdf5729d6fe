"""core/security/throttle.py with a manual clock: the slow-down after failed logins."""

from __future__ import annotations

import pytest

from core.security.throttle import REFUSE, LoginThrottle, host_of


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def throttle(clock):
    return LoginThrottle(
        failures_before_delay=3,
        first_delay_s=0.1,
        max_delay_s=1.0,
        max_wait_s=5.0,
        forget_after_s=60.0,
        clock=clock,
    )


def test_a_few_failures_cost_nothing(throttle):
    for _ in range(2):
        assert throttle.delay_before_attempt("h") == 0
        throttle.failed("h")
    assert throttle.delay_before_attempt("h") == 0


def test_parallel_attempts_take_distinct_slots_and_the_delay_doubles(throttle, clock):
    for _ in range(3):
        throttle.failed("h")
    # Ten attempts at once: spaced by the delay, not answered together.
    waits = [throttle.delay_before_attempt("h") for _ in range(10)]
    assert waits == pytest.approx([0.1 * index for index in range(10)])
    throttle.failed("h")  # a fourth failure: 0.2 s apart from the next free slot on
    clock.now += 1.0
    assert throttle.delay_before_attempt("h") == pytest.approx(0.0)
    assert throttle.delay_before_attempt("h") == pytest.approx(0.2)


def test_the_delay_is_capped_and_far_slots_are_refused(throttle, clock):
    for _ in range(40):
        throttle.failed("h")
    waits = [throttle.delay_before_attempt("h") for _ in range(7)]
    assert waits[:6] == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0, 5.0])
    assert waits[6] == REFUSE
    assert throttle.refused == 1


def test_other_hosts_and_a_success_are_not_slowed(throttle):
    for _ in range(5):
        throttle.failed("h")
    throttle.delay_before_attempt("h")
    assert throttle.delay_before_attempt("other") == 0
    throttle.succeeded("h")
    assert throttle.failures("h") == 0
    assert throttle.delay_before_attempt("h") == 0


def test_failures_are_forgotten_after_a_quiet_minute(throttle, clock):
    for _ in range(5):
        throttle.failed("h")
    clock.now += 61
    assert throttle.failures("h") == 0
    assert throttle.delay_before_attempt("h") == 0


def test_memory_is_bounded(clock):
    throttle = LoginThrottle(max_addresses=3, clock=clock)
    for host in ("a", "b", "c", "d"):
        throttle.failed(host)
    assert throttle.failures("a") == 0
    assert throttle.failures("d") == 1


@pytest.mark.parametrize(
    ("peer", "host"),
    [("1.2.3.4:5", "1.2.3.4"), ("[::1]:5672", "::1"), ("::1", "::1"), ("h", "h"), ("", "")],
)
def test_host_of(peer, host):
    assert host_of(peer) == host
