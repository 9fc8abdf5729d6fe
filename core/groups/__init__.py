"""Consumer groups: membership with the semantics of Kafka's classic group protocol.

Protocol-neutral: the Kafka front end translates JoinGroup, SyncGroup, Heartbeat, LeaveGroup,
DescribeGroups, ListGroups and DeleteGroups into calls on one :class:`GroupCoordinator`, and the
offset-commit path asks it :meth:`GroupCoordinator.validate_member` first. Offsets themselves
are stored elsewhere. Modules:

- ``coordinator``: :class:`GroupCoordinator`, the rebalance protocol, timers, administration.
- ``group``: one group's bookkeeping (members, static instances, protocols, generation).
- ``state``: :class:`GroupState` and the ``(state, event) -> state`` transition table.
- ``results``: the frozen records the coordinator answers with.
- ``errors``: :class:`ErrorCode` (Kafka's numbers) and :class:`IllegalGroupTransition`.
- time: :class:`Clock`, :class:`LoopClock` (asyncio) and :class:`ManualClock` (tests), from
  ``core.clock``, the process's one clock.
"""

from core.clock import Clock, LoopClock, ManualClock, Timer
from core.groups.coordinator import (
    DEFAULT_INITIAL_REBALANCE_DELAY_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    NEW_MEMBER_JOIN_TIMEOUT_MS,
    GroupCoordinator,
)
from core.groups.errors import ErrorCode, IllegalGroupTransition
from core.groups.results import (
    UNKNOWN_GENERATION_ID,
    UNKNOWN_MEMBER_ID,
    GroupDescription,
    GroupListing,
    JoinMember,
    JoinResult,
    LeaveResult,
    MemberDescription,
    MemberIdentity,
    MemberLeaveResult,
    SyncResult,
)
from core.groups.state import TRANSITIONS, GroupEvent, GroupState, can_rebalance, next_state

__all__ = [
    "DEFAULT_INITIAL_REBALANCE_DELAY_MS",
    "DEFAULT_MAX_SESSION_TIMEOUT_MS",
    "DEFAULT_MIN_SESSION_TIMEOUT_MS",
    "NEW_MEMBER_JOIN_TIMEOUT_MS",
    "TRANSITIONS",
    "UNKNOWN_GENERATION_ID",
    "UNKNOWN_MEMBER_ID",
    "Clock",
    "ErrorCode",
    "GroupCoordinator",
    "GroupDescription",
    "GroupEvent",
    "GroupListing",
    "GroupState",
    "IllegalGroupTransition",
    "JoinMember",
    "JoinResult",
    "LeaveResult",
    "LoopClock",
    "ManualClock",
    "MemberDescription",
    "MemberIdentity",
    "MemberLeaveResult",
    "SyncResult",
    "Timer",
    "can_rebalance",
    "next_state",
]
