from __future__ import annotations

import pytest

from core.groups import (
    TRANSITIONS,
    GroupEvent,
    GroupState,
    IllegalGroupTransition,
    ManualClock,
    can_rebalance,
    next_state,
)

S = GroupState
E = GroupEvent


@pytest.mark.parametrize(
    ("state", "event", "expected"),
    [
        (S.EMPTY, E.REBALANCE, S.PREPARING_REBALANCE),
        (S.STABLE, E.REBALANCE, S.PREPARING_REBALANCE),
        (S.COMPLETING_REBALANCE, E.REBALANCE, S.PREPARING_REBALANCE),
        (S.PREPARING_REBALANCE, E.JOIN_COMPLETED, S.COMPLETING_REBALANCE),
        (S.PREPARING_REBALANCE, E.JOIN_COMPLETED_EMPTY, S.EMPTY),
        (S.COMPLETING_REBALANCE, E.ASSIGNMENT_RECEIVED, S.STABLE),
        (S.DEAD, E.REMOVED, S.DEAD),
    ],
)
def test_allowed_transitions(state: GroupState, event: GroupEvent, expected: GroupState) -> None:
    assert next_state("g", state, event) is expected


def test_every_missing_transition_is_an_error() -> None:
    missing = [(s, e) for s in GroupState for e in GroupEvent if (s, e) not in TRANSITIONS]
    assert (S.EMPTY, E.ASSIGNMENT_RECEIVED) in missing
    assert (S.STABLE, E.JOIN_COMPLETED) in missing
    for state, event in missing:
        with pytest.raises(IllegalGroupTransition):
            next_state("g", state, event)


def test_can_rebalance_matches_kafka() -> None:
    # Kafka: PreparingRebalance's valid previous states are Stable, CompletingRebalance, Empty.
    assert {s for s in GroupState if can_rebalance(s)} == {
        S.STABLE,
        S.COMPLETING_REBALANCE,
        S.EMPTY,
    }


def test_state_names_are_kafkas() -> None:
    assert [s.value for s in GroupState] == [
        "Empty",
        "PreparingRebalance",
        "CompletingRebalance",
        "Stable",
        "Dead",
    ]


def test_manual_clock_fires_in_order_and_cascades() -> None:
    clock = ManualClock()
    fired: list[str] = []
    clock.call_later(20, lambda: fired.append("b"))

    def first() -> None:
        fired.append("a")
        clock.call_later(5, lambda: fired.append("c"))

    clock.call_later(10, first)
    cancelled = clock.call_later(12, lambda: fired.append("x"))
    cancelled.cancel()
    assert clock.advance(9) == 0
    assert clock.advance(11) == 3
    assert fired == ["a", "c", "b"]
    assert clock.now_ms() == 20
    assert clock.pending() == 0
