"""The membership of one group: its members, static-instance map, protocols and generation.

Mirrors Kafka's ``GroupMetadata`` and ``MemberMetadata``: bookkeeping only, no timers and no
policy. :mod:`core.groups.coordinator` decides when members join, leave or expire; this module
keeps the counts it needs consistent (members per protocol, members awaiting a join response).

In memory only, as in Kafka, where a new coordinator rebuilds membership by having the members
join again. Thread-safety: none; used from the event-loop thread only.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from core.clock import Timer
from core.groups.errors import ErrorCode
from core.groups.results import JoinMember, JoinResult, SyncResult
from core.groups.state import GroupEvent, GroupState, next_state

Protocols = tuple[tuple[str, bytes], ...]


def normalize_protocols(protocols: Iterable[tuple[str, bytes]]) -> Protocols:
    """Copy (name, metadata) pairs, so a member never pins a connection's read buffer."""
    return tuple((str(name), bytes(metadata)) for name, metadata in protocols)


@dataclass(slots=True, eq=False)
class MemberMetadata:
    """One member: what it asked for, what it was given, and what it is waiting for."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols  # in the member's order of preference
    assignment: bytes = b""
    # Joined with an empty member id and not yet through a completed join: its session timer is
    # the new-member timeout, and waiting for a join does not keep it alive (Kafka's isNew).
    is_new: bool = False
    join_waiter: asyncio.Future[JoinResult] | None = None
    sync_waiter: asyncio.Future[SyncResult] | None = None
    # Session expiry: the deadline moves on every heartbeat; one timer chases it.
    heartbeat_deadline_ms: float = 0.0
    heartbeat_timer: Timer | None = None
    heartbeat_timer_at_ms: float = 0.0

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_waiter is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.sync_waiter is not None

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata_for(self, protocol: str) -> bytes:
        for name, metadata in self.protocols:
            if name == protocol:
                return metadata
        raise KeyError(f"member {self.member_id!r} does not support protocol {protocol!r}")

    def matches(self, protocols: Protocols) -> bool:
        """Same protocols, same order, same metadata (Kafka's ``MemberMetadata.matches``)."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among ``candidates``."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id!r} supports none of {sorted(candidates)}")

    def cancel_heartbeat_timer(self) -> None:
        if self.heartbeat_timer is not None:
            self.heartbeat_timer.cancel()
            self.heartbeat_timer = None


@dataclass(slots=True, eq=False)
class GroupMetadata:
    """One group. ``members`` keeps join order: the first member is the first leader."""

    group_id: str
    state: GroupState = GroupState.EMPTY
    generation_id: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, MemberMetadata] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    # KIP-394: member ids handed out with MEMBER_ID_REQUIRED, each with its expiry timer.
    pending_members: dict[str, Timer] = field(default_factory=dict)
    # Members of the current generation whose SyncGroup has not arrived yet.
    pending_sync: set[str] = field(default_factory=set)
    supported_protocols: Counter[str] = field(default_factory=Counter)
    awaiting_join_count: int = 0
    # Set when a member joins a brand-new group during the initial rebalance delay.
    new_member_added: bool = False
    # The join deadline (DelayedJoin / InitialDelayedJoin) and the sync deadline (DelayedSync).
    # Each timer carries the operation number it was armed with; a stale one does nothing.
    join_timer: Timer | None = None
    join_operation: int = 0
    initial_delay_active: bool = False
    sync_timer: Timer | None = None
    sync_operation: int = 0

    # -- state --------------------------------------------------------------------------------

    def transition(self, event: GroupEvent) -> None:
        self.state = next_state(self.group_id, self.state, event)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def rebalance_timeout_ms(self) -> int:
        """The longest rebalance timeout among members (Kafka's ``rebalanceTimeoutMs``)."""
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def has_all_members_joined(self) -> bool:
        return self.awaiting_join_count == len(self.members) and not self.pending_members

    # -- members ------------------------------------------------------------------------------

    def add(self, member: MemberMetadata, join_waiter: asyncio.Future[JoinResult] | None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError(
                    f"static member {member.group_instance_id!r} is already in {self.group_id!r}"
                )
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        self._set_join_waiter(member, join_waiter)
        self.pending_members.pop(member.member_id, None)

    def remove(self, member_id: str) -> MemberMetadata | None:
        """Drop a member (without answering its waiters: the caller does that first)."""
        member = self.members.pop(member_id, None)
        if member is not None:
            self.supported_protocols.subtract(member.protocol_names())
            self.supported_protocols += Counter()  # drop names no member supports any more
            if member.is_awaiting_join:
                self.awaiting_join_count -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
            member.cancel_heartbeat_timer()
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        pending = self.pending_members.pop(member_id, None)
        if pending is not None:
            pending.cancel()
        self.pending_sync.discard(member_id)
        return member

    def update_member(
        self,
        member: MemberMetadata,
        protocols: Protocols,
        join_waiter: asyncio.Future[JoinResult] | None,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names())
        member.protocols = protocols
        self.supported_protocols.update(member.protocol_names())
        self.supported_protocols += Counter()
        self._set_join_waiter(member, join_waiter)

    def replace_static_member(
        self, group_instance_id: str, old_member_id: str, new_member_id: str
    ) -> MemberMetadata:
        """Give a static member a new member id; the old id is fenced (KIP-345)."""
        member = self.members.pop(old_member_id)
        # Fence a duplicate instance still waiting with the old id.
        self.complete_join(member, join_error(old_member_id, ErrorCode.FENCED_INSTANCE_ID))
        self.complete_sync(member, SyncResult(ErrorCode.FENCED_INSTANCE_ID))
        member.member_id = new_member_id
        self.members[new_member_id] = member
        if self.leader_id == old_member_id:
            self.leader_id = new_member_id
        if old_member_id in self.pending_sync:
            self.pending_sync.discard(old_member_id)
            self.pending_sync.add(new_member_id)
        self.static_members[group_instance_id] = new_member_id
        return member

    def _set_join_waiter(
        self, member: MemberMetadata, waiter: asyncio.Future[JoinResult] | None
    ) -> None:
        previous = member.join_waiter
        replaced = waiter is not None and previous is not None and previous is not waiter
        if replaced and previous is not None and not previous.done():
            # A second JoinGroup from the same member replaces the first; Kafka drops the first
            # callback, but an asyncio waiter must be answered or its caller hangs.
            previous.set_result(join_error(member.member_id, ErrorCode.REBALANCE_IN_PROGRESS))
        if waiter is not None and previous is None:
            self.awaiting_join_count += 1
        elif waiter is None and previous is not None:
            self.awaiting_join_count -= 1
        member.join_waiter = waiter

    def set_sync_waiter(self, member: MemberMetadata, waiter: asyncio.Future[SyncResult]) -> None:
        previous = member.sync_waiter
        if previous is not None and previous is not waiter and not previous.done():
            previous.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        member.sync_waiter = waiter

    def complete_join(self, member: MemberMetadata, result: JoinResult) -> bool:
        """Answer the member's pending JoinGroup, if any (Kafka's maybeInvokeJoinCallback)."""
        waiter = member.join_waiter
        if waiter is None:
            return False
        self._set_join_waiter(member, None)
        if not waiter.done():  # done when the caller was cancelled (connection closed)
            waiter.set_result(result)
        return True

    def complete_sync(self, member: MemberMetadata, result: SyncResult) -> bool:
        """Answer the member's pending SyncGroup, if it has one."""
        waiter = member.sync_waiter
        if waiter is None:
            return False
        member.sync_waiter = None
        if not waiter.done():
            waiter.set_result(result)
        return True

    # -- protocols ----------------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, names: Sequence[str]) -> bool:
        """Whether a member with these protocols may join (Kafka's ``supportsProtocols``)."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        size = len(self.members)
        return self.protocol_type == protocol_type and any(
            self.supported_protocols[name] == size for name in names
        )

    def candidate_protocols(self) -> set[str]:
        size = len(self.members)
        return {name for name, count in self.supported_protocols.items() if count == size}

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol that all members support; the most
        votes win. Kafka leaves ties to hash-map order; here the earliest-joined voter's wins."""
        if not self.members:
            raise RuntimeError(f"cannot select a protocol for empty group {self.group_id!r}")
        candidates = self.candidate_protocols()
        votes = Counter(member.vote(candidates) for member in self.members.values())
        return max(votes, key=lambda name: votes[name])  # max keeps the first of equals

    # -- generations --------------------------------------------------------------------------

    def not_yet_rejoined(self) -> list[MemberMetadata]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep the leader if it rejoined, else pick a member that did. False if none did."""
        if self.leader_id is None:
            return False
        if self.members[self.leader_id].is_awaiting_join:
            return True
        for member_id, member in self.members.items():
            if member.is_awaiting_join:
                self.leader_id = member_id
                return True
        return False

    def init_next_generation(self) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition(GroupEvent.JOIN_COMPLETED)
        else:
            self.protocol_name = None
            self.transition(GroupEvent.JOIN_COMPLETED_EMPTY)
        self.pending_sync.clear()

    def leader_view(self) -> list[JoinMember]:
        """Every member with its metadata for the selected protocol: the leader's input."""
        if self.state is not GroupState.COMPLETING_REBALANCE or self.protocol_name is None:
            raise RuntimeError(f"group {self.group_id!r} in {self.state} has no member view")
        protocol = self.protocol_name
        return [
            JoinMember(m.member_id, m.group_instance_id, m.metadata_for(protocol))
            for m in self.members.values()
        ]


def join_error(member_id: str, error_code: ErrorCode) -> JoinResult:
    """A JoinGroup error response (Kafka's ``JoinGroupResult(memberId, error)``)."""
    return JoinResult(
        error_code=error_code,
        generation_id=-1,
        protocol_name=None,
        leader_id="",
        member_id=member_id,
    )
