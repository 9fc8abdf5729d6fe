"""The states of a consumer group and the transitions between them, as data.

Kafka's classic group protocol (``GroupMetadata.scala``) has five states::

    Empty ──join──▶ PreparingRebalance ──all joined / timeout──▶ CompletingRebalance
      ▲                  ▲    │  ▲                                   │        │
      │   no members left│    │  └──────── member joins, leaves, ────┘        │ leader's
      └──────────────────┼────┘            expires or changes metadata        │ SyncGroup
                         └────────────────────────────────────────── Stable ◀─┘
    any state ──delete / coordinator closed──▶ Dead

Kafka writes the table as "valid previous states" per target state; here it is h11 style,
``(state, event) -> state``, and anything missing is an :class:`IllegalGroupTransition`.
Pure data and functions: no asyncio, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum, StrEnum
from types import MappingProxyType

from core.groups.errors import IllegalGroupTransition


class GroupState(StrEnum):
    """A group's state; the value is the name Kafka's DescribeGroups and ListGroups return."""

    EMPTY = "Empty"  # no members; committed offsets may still exist
    PREPARING_REBALANCE = "PreparingRebalance"  # waiting for members to (re)send JoinGroup
    COMPLETING_REBALANCE = "CompletingRebalance"  # joined; waiting for the leader's SyncGroup
    STABLE = "Stable"  # assignment distributed; members heartbeat
    DEAD = "Dead"  # removed (deleted, or the coordinator closed); answers nothing


class GroupEvent(Enum):
    """What moves a group from one state to another."""

    REBALANCE = "rebalance"  # a member joined, left, expired or changed its protocols
    JOIN_COMPLETED = "join-completed"  # the join phase ended with members: next generation
    JOIN_COMPLETED_EMPTY = "join-completed-empty"  # the join phase ended with no member left
    ASSIGNMENT_RECEIVED = "assignment-received"  # the leader's SyncGroup carried the assignment
    REMOVED = "removed"  # DeleteGroups, or the coordinator closed


_S = GroupState
_E = GroupEvent

TRANSITIONS: Mapping[tuple[GroupState, GroupEvent], GroupState] = MappingProxyType(
    {
        (_S.EMPTY, _E.REBALANCE): _S.PREPARING_REBALANCE,
        (_S.STABLE, _E.REBALANCE): _S.PREPARING_REBALANCE,
        (_S.COMPLETING_REBALANCE, _E.REBALANCE): _S.PREPARING_REBALANCE,
        (_S.PREPARING_REBALANCE, _E.JOIN_COMPLETED): _S.COMPLETING_REBALANCE,
        (_S.PREPARING_REBALANCE, _E.JOIN_COMPLETED_EMPTY): _S.EMPTY,
        (_S.COMPLETING_REBALANCE, _E.ASSIGNMENT_RECEIVED): _S.STABLE,
        # Kafka lets every state, Dead included, go to Dead.
        **{(state, _E.REMOVED): _S.DEAD for state in GroupState},
    }
)


def next_state(group_id: str, state: GroupState, event: GroupEvent) -> GroupState:
    """The state ``event`` leads to from ``state``; raises :class:`IllegalGroupTransition`."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalGroupTransition(group_id, state.value, event.value) from None


def can_rebalance(state: GroupState) -> bool:
    """Whether a rebalance may start from ``state`` (Kafka's ``GroupMetadata.canRebalance``)."""
    return (state, GroupEvent.REBALANCE) in TRANSITIONS
