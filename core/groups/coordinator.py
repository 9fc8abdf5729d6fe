"""GroupCoordinator: consumer-group membership with the semantics of Kafka's classic protocol.

What the Kafka front end needs for JoinGroup, SyncGroup, Heartbeat, LeaveGroup, DescribeGroups,
ListGroups and DeleteGroups, and the generation check of OffsetCommit, written once in ``core``
so the gateway only translates wire messages. The model is Kafka's ``GroupCoordinator.scala``
(3.x, before KIP-848): method names below cite the Kafka method they follow.

Flow of a rebalance:

1. A member sends JoinGroup. A new one (empty member id) gets an id; with
   ``require_known_member_id`` (JoinGroup v4+, KIP-394) it first gets MEMBER_ID_REQUIRED and must
   join again with that id. The group goes to PreparingRebalance.
2. JoinGroup waits until every known member has joined again, or the rebalance timeout (the
   largest among members) expires; dynamic members that did not rejoin are then removed. An
   Empty group waits ``initial_rebalance_delay_ms`` first, and again each time a member arrives
   in that window, up to the rebalance timeout (Kafka's InitialDelayedJoin).
3. The join completes: the generation increments, a protocol every member supports is chosen by
   vote, every waiting member gets its answer; the leader also gets every member's metadata.
4. Members send SyncGroup; followers wait for the leader's, which carries every assignment. The
   group becomes Stable. Members that send no SyncGroup within the rebalance timeout are removed.
5. Members heartbeat within their session timeout, or are removed. Any membership change starts
   step 1 again; heartbeats then answer REBALANCE_IN_PROGRESS so members rejoin.

Static members (group.instance.id, KIP-345) are not removed when they miss a rejoin (only when
their session expires), and one that restarts gets a new member id without a rebalance if the
group's protocol stays the same; its previous id is fenced (FENCED_INSTANCE_ID).

Membership is in memory only (Kafka also rebuilds it by rejoins after a coordinator moves).
Committed offsets are stored elsewhere; :meth:`GroupCoordinator.validate_member` is the check the
offset-commit path makes first.

Thread-safety: none. Every method runs on the event-loop thread; between awaits nothing else
runs, which is the "group lock" Kafka takes. Timers come from the injected :class:`Clock`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

from core.clock import Clock, LoopClock
from core.groups.errors import ErrorCode
from core.groups.group import (
    GroupMetadata,
    MemberMetadata,
    Protocols,
    join_error,
    normalize_protocols,
)
from core.groups.results import (
    UNKNOWN_MEMBER_ID,
    GroupDescription,
    GroupListing,
    JoinResult,
    LeaveResult,
    MemberDescription,
    MemberIdentity,
    MemberLeaveResult,
    SyncResult,
)
from core.groups.state import GroupEvent, GroupState, can_rebalance

log = logging.getLogger(__name__)

# Kafka's group.initial.rebalance.delay.ms is 3000: it lets the consumers of an application that
# start together form their first generation in one rebalance instead of one per consumer. A
# broker for development and tests wants joins fast; 100 ms still folds a burst of concurrent
# joins into one rebalance. Kafka's own integration tests set it to 0.
DEFAULT_INITIAL_REBALANCE_DELAY_MS = 100
# Kafka's group.min.session.timeout.ms and group.max.session.timeout.ms defaults.
DEFAULT_MIN_SESSION_TIMEOUT_MS = 6_000
DEFAULT_MAX_SESSION_TIMEOUT_MS = 1_800_000
# Kafka's GroupCoordinator.NewMemberJoinTimeoutMs: a new member whose JoinGroup is still waiting
# after 5 minutes is dropped (it cannot heartbeat yet, and a client that timed out and retried
# would otherwise leave a defunct member in the rebalance).
NEW_MEMBER_JOIN_TIMEOUT_MS = 5 * 60 * 1000

_S = GroupState


@dataclass(frozen=True, slots=True)
class _JoinRequest:
    """The fields of one JoinGroup request, as the coordinator uses them."""

    member_id: str
    instance_id: str | None
    protocol_type: str
    protocols: Protocols
    session_timeout_ms: int
    rebalance_timeout_ms: int
    client_id: str
    client_host: str
    require_known_member_id: bool

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]


class GroupCoordinator:
    """Membership of many consumer groups, Kafka's classic group protocol.

    Args:
        clock: time and timers; :class:`LoopClock` (the running asyncio loop) by default.
        initial_rebalance_delay_ms: how long an Empty group waits for more members before its
            first join completes (Kafka's ``group.initial.rebalance.delay.ms``).
        min_session_timeout_ms / max_session_timeout_ms: the accepted session timeouts; a
            JoinGroup outside gets INVALID_SESSION_TIMEOUT (``group.min/max.session.timeout.ms``).
        max_group_size: members per group, ``None`` for no limit (``group.max.size``).
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS,
        min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS,
        max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS,
        max_group_size: int | None = None,
    ) -> None:
        if initial_rebalance_delay_ms < 0:
            raise ValueError("initial_rebalance_delay_ms must be >= 0")
        if not 0 <= min_session_timeout_ms <= max_session_timeout_ms:
            raise ValueError("need 0 <= min_session_timeout_ms <= max_session_timeout_ms")
        if max_group_size is not None and max_group_size < 1:
            raise ValueError("max_group_size must be >= 1 or None")
        self._clock: Clock = clock if clock is not None else LoopClock()
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.min_session_timeout_ms = min_session_timeout_ms
        self.max_session_timeout_ms = max_session_timeout_ms
        self.max_group_size = max_group_size
        self._groups: dict[str, GroupMetadata] = {}

    # ==========================================================================================
    # JoinGroup
    # ==========================================================================================

    async def join(
        self,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_id: str = "",
        client_host: str = "",
        require_known_member_id: bool = True,
    ) -> JoinResult:
        """JoinGroup. Returns once the rebalance completes (or at once, with an error).

        ``member_id`` is ``""`` for a new member. ``rebalance_timeout_ms`` < 0 means "same as the
        session timeout", which is what JoinGroup v0 (no such field) implies.
        ``require_known_member_id`` is True for JoinGroup v4+ (KIP-394).
        """
        request = _JoinRequest(
            member_id=member_id,
            instance_id=group_instance_id,
            protocol_type=protocol_type,
            protocols=normalize_protocols(protocols),
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=(
                rebalance_timeout_ms if rebalance_timeout_ms >= 0 else session_timeout_ms
            ),
            client_id=client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
        )
        waiter: asyncio.Future[JoinResult] = asyncio.get_running_loop().create_future()
        self._handle_join(waiter, group_id, request)
        return await waiter

    def _handle_join(
        self, waiter: asyncio.Future[JoinResult], group_id: str, request: _JoinRequest
    ) -> None:
        """Kafka's handleJoinGroup."""
        member_id = request.member_id
        if not group_id:
            waiter.set_result(join_error(member_id, ErrorCode.INVALID_GROUP_ID))
            return
        if not (
            self.min_session_timeout_ms <= request.session_timeout_ms <= self.max_session_timeout_ms
        ):
            waiter.set_result(join_error(member_id, ErrorCode.INVALID_SESSION_TIMEOUT))
            return
        is_unknown_member = member_id == UNKNOWN_MEMBER_ID
        group = self._groups.get(group_id)
        if group is None:
            # Only a new member creates a group; a known member id for an unknown group is stale.
            if not is_unknown_member:
                waiter.set_result(join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID))
                return
            group = self._groups[group_id] = GroupMetadata(group_id)

        if not self._accept_joining_member(group, member_id):
            self._remove_member(group, member_id)
            waiter.set_result(join_error(UNKNOWN_MEMBER_ID, ErrorCode.GROUP_MAX_SIZE_REACHED))
        elif is_unknown_member:
            self._new_member_join(waiter, group, request)
        else:
            self._current_member_join(waiter, group, request)
        if group.state is _S.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _accept_joining_member(self, group: GroupMetadata, member_id: str) -> bool:
        """Kafka's acceptJoiningMember: the group.max.size check."""
        limit = self.max_group_size
        if limit is None or group.state in (_S.EMPTY, _S.DEAD):
            return True
        member = group.members.get(member_id)
        if group.state is _S.PREPARING_REBALANCE:
            # Counting members already waiting lets the last ones to rejoin be shed when the
            # limit was lowered.
            return (member is not None and member.is_awaiting_join) or (
                group.awaiting_join_count < limit
            )
        return member is not None or len(group.members) < limit

    def _new_member_join(
        self, waiter: asyncio.Future[JoinResult], group: GroupMetadata, request: _JoinRequest
    ) -> None:
        """Kafka's doNewMemberJoinGroup, doStaticNewMemberJoinGroup, doDynamicNewMemberJoinGroup."""
        if group.state is _S.DEAD:
            waiter.set_result(join_error(UNKNOWN_MEMBER_ID, ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(request.protocol_type, request.protocol_names()):
            waiter.set_result(join_error(UNKNOWN_MEMBER_ID, ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        instance_id = request.instance_id
        prefix = instance_id if instance_id is not None else request.client_id
        new_member_id = f"{prefix}-{uuid.uuid4()}"
        if instance_id is not None:
            old_member_id = group.static_members.get(instance_id)
            if old_member_id is not None:
                self._update_static_member_and_rebalance(
                    waiter, group, old_member_id, new_member_id, instance_id, request.protocols
                )
                return
        elif request.require_known_member_id:
            # [KIP-394] a dynamic member gets its id first and must join again with it; until
            # then it is pending, and the join phase waits for it (up to its session timeout).
            group.pending_members[new_member_id] = self._clock.call_later(
                request.session_timeout_ms,
                lambda: self._on_pending_member_expired(group, new_member_id),
            )
            waiter.set_result(join_error(new_member_id, ErrorCode.MEMBER_ID_REQUIRED))
            return
        self._add_member_and_rebalance(waiter, group, new_member_id, request)

    def _current_member_join(
        self, waiter: asyncio.Future[JoinResult], group: GroupMetadata, request: _JoinRequest
    ) -> None:
        """Kafka's doCurrentMemberJoinGroup: a JoinGroup that carries a member id."""
        member_id, protocols = request.member_id, request.protocols
        if group.state is _S.DEAD:
            waiter.set_result(join_error(member_id, ErrorCode.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(request.protocol_type, request.protocol_names()):
            waiter.set_result(join_error(member_id, ErrorCode.INCONSISTENT_GROUP_PROTOCOL))
            return
        if member_id in group.pending_members:
            if request.instance_id is not None:
                # Pending ids are only handed to dynamic members; Kafka throws here. A client
                # that mixes the two is told to start over.
                waiter.set_result(join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID))
                return
            self._add_member_and_rebalance(waiter, group, member_id, request)
            return
        error = self._validate_current_member(group, member_id, request.instance_id)
        if error is not None:
            waiter.set_result(join_error(member_id, error))
            return
        member = group.members[member_id]
        state = group.state
        if state is _S.PREPARING_REBALANCE:
            self._update_member_and_rebalance(waiter, group, member, protocols, "member rejoined")
        elif state is _S.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # The member lost its JoinGroup response: send the current generation again.
                waiter.set_result(self._join_result(group, member, with_members=True))
            else:
                self._update_member_and_rebalance(
                    waiter, group, member, protocols, "member changed its protocols"
                )
        elif state is _S.STABLE:
            if group.is_leader(member_id):
                # A leader's JoinGroup always rebalances: that is how a consumer leader reacts to
                # changes that are not in member metadata (new partitions, say).
                self._update_member_and_rebalance(
                    waiter, group, member, protocols, "leader rejoined"
                )
            elif not member.matches(protocols):
                self._update_member_and_rebalance(
                    waiter, group, member, protocols, "member changed its protocols"
                )
            else:
                # A follower with nothing new: tell it the current generation, then it syncs.
                waiter.set_result(self._join_result(group, member, with_members=False))
        else:  # Empty: the member is gone already (Dead was answered above)
            waiter.set_result(join_error(member_id, ErrorCode.UNKNOWN_MEMBER_ID))

    def _add_member_and_rebalance(
        self,
        waiter: asyncio.Future[JoinResult],
        group: GroupMetadata,
        member_id: str,
        request: _JoinRequest,
    ) -> None:
        member = MemberMetadata(
            member_id=member_id,
            group_instance_id=request.instance_id,
            client_id=request.client_id,
            client_host=request.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=request.protocols,
            is_new=True,
        )
        # A member arriving during the initial delay of a new group extends that delay.
        if group.state is _S.PREPARING_REBALANCE and group.generation_id == 0:
            group.new_member_added = True
        group.add(member, waiter)
        self._schedule_heartbeat_expiry(group, member, NEW_MEMBER_JOIN_TIMEOUT_MS)
        self._maybe_prepare_rebalance(group, f"adding member {member_id}")

    def _update_member_and_rebalance(
        self,
        waiter: asyncio.Future[JoinResult],
        group: GroupMetadata,
        member: MemberMetadata,
        protocols: Protocols,
        reason: str,
    ) -> None:
        group.update_member(member, protocols, waiter)
        self._maybe_prepare_rebalance(group, f"{reason}: {member.member_id}")

    def _update_static_member_and_rebalance(
        self,
        waiter: asyncio.Future[JoinResult],
        group: GroupMetadata,
        old_member_id: str,
        new_member_id: str,
        instance_id: str,
        protocols: Protocols,
    ) -> None:
        """[KIP-345] a known group.instance.id joins with no member id (the instance restarted).

        Kafka's updateStaticMemberAndRebalance: the member keeps its place and assignment under a
        new id; the old id is fenced. In a Stable group this is no rebalance unless the group's
        protocol would change.
        """
        current_leader = group.leader_id or ""
        member = group.replace_static_member(instance_id, old_member_id, new_member_id)
        self._schedule_heartbeat_expiry(group, member)
        group.update_member(member, protocols, waiter)
        state = group.state
        if state is _S.STABLE:
            if group.select_protocol() == group.protocol_name:
                log.info(
                    "group %s: static member %s rejoined as %s without a rebalance",
                    group.group_id,
                    instance_id,
                    new_member_id,
                )
                # The old leader id is returned on purpose: the rejoined member, even if it
                # leads, must not compute an assignment a Stable group would not distribute.
                group.complete_join(
                    member,
                    JoinResult(
                        error_code=ErrorCode.NONE,
                        generation_id=group.generation_id,
                        protocol_name=group.protocol_name,
                        leader_id=current_leader,
                        member_id=new_member_id,
                        protocol_type=group.protocol_type,
                    ),
                )
            else:
                self._maybe_prepare_rebalance(
                    group, f"static member {instance_id} changed the group's protocol"
                )
        elif state is _S.COMPLETING_REBALANCE:
            # The leader may have been given the old id to assign to: start over.
            self._prepare_rebalance(group, f"static member {instance_id} rejoined")
        elif state is _S.PREPARING_REBALANCE:
            pass  # it simply takes part in the rebalance under way
        else:  # a known instance id means members, so never Empty; Dead was answered earlier
            raise RuntimeError(f"group {group.group_id!r}: static member rejoined in {state}")

    def _join_result(
        self, group: GroupMetadata, member: MemberMetadata, *, with_members: bool
    ) -> JoinResult:
        is_leader = group.is_leader(member.member_id)
        return JoinResult(
            error_code=ErrorCode.NONE,
            generation_id=group.generation_id,
            protocol_name=group.protocol_name,
            leader_id=group.leader_id or "",
            member_id=member.member_id,
            members=group.leader_view() if (with_members and is_leader) else [],
            protocol_type=group.protocol_type,
        )

    # -- rebalance ---------------------------------------------------------------------------

    def _maybe_prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        if can_rebalance(group.state):
            self._prepare_rebalance(group, reason)

    def _prepare_rebalance(self, group: GroupMetadata, reason: str) -> None:
        """Kafka's prepareRebalance: enter PreparingRebalance and arm the join deadline."""
        if group.state is _S.COMPLETING_REBALANCE:
            # Members waiting in SyncGroup must rejoin instead.
            self._reset_and_propagate_assignment_error(group, ErrorCode.REBALANCE_IN_PROGRESS)
        self._cancel_sync_expiry(group)
        from_empty = group.state is _S.EMPTY
        group.transition(GroupEvent.REBALANCE)
        log.info(
            "group %s: preparing to rebalance, old generation %d (%s)",
            group.group_id,
            group.generation_id,
            reason,
        )
        if from_empty:
            delay = self.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_initial_join(group, delay, remaining)
        else:
            self._schedule_join_deadline(group, group.rebalance_timeout_ms())
            self._try_complete_join(group)

    def _schedule_join_deadline(self, group: GroupMetadata, timeout_ms: int) -> None:
        """Kafka's DelayedJoin: complete when all joined, or at the deadline regardless."""
        operation = self._next_join_operation(group)
        group.initial_delay_active = False
        group.join_timer = self._clock.call_later(
            timeout_ms, lambda: self._on_join_deadline(group, operation)
        )

    def _schedule_initial_join(
        self, group: GroupMetadata, delay_ms: int, remaining_ms: int
    ) -> None:
        """Kafka's InitialDelayedJoin: wait ``delay_ms`` even if everyone has joined; wait again
        while new members keep arriving, for at most the rebalance timeout in total."""
        operation = self._next_join_operation(group)
        group.initial_delay_active = True
        group.join_timer = self._clock.call_later(
            delay_ms, lambda: self._on_initial_delay(group, operation, delay_ms, remaining_ms)
        )

    def _next_join_operation(self, group: GroupMetadata) -> int:
        if group.join_timer is not None:
            group.join_timer.cancel()
            group.join_timer = None
        group.join_operation += 1
        return group.join_operation

    def _on_initial_delay(
        self, group: GroupMetadata, operation: int, delay_ms: int, remaining_ms: int
    ) -> None:
        if operation != group.join_operation or group.state is not _S.PREPARING_REBALANCE:
            return
        group.join_timer = None
        if group.new_member_added and remaining_ms != 0:
            group.new_member_added = False
            next_delay = min(self.initial_rebalance_delay_ms, remaining_ms)
            self._schedule_initial_join(group, next_delay, max(remaining_ms - delay_ms, 0))
            return
        group.initial_delay_active = False
        self._complete_join(group)

    def _on_join_deadline(self, group: GroupMetadata, operation: int) -> None:
        if operation != group.join_operation or group.state is not _S.PREPARING_REBALANCE:
            return
        group.join_timer = None
        self._complete_join(group)

    def _try_complete_join(self, group: GroupMetadata) -> None:
        """Kafka's tryCompleteJoin: finish early once every member (and pending member) joined."""
        if group.state is not _S.PREPARING_REBALANCE or group.initial_delay_active:
            return
        if group.has_all_members_joined():
            self._next_join_operation(group)  # disarm the deadline
            self._complete_join(group)

    def _complete_join(self, group: GroupMetadata) -> None:
        """Kafka's onCompleteJoin: drop who did not rejoin, start the next generation, answer."""
        for member in group.not_yet_rejoined():
            if not member.is_static:  # static members stay until their session expires
                log.info(
                    "group %s: removing member %s, which did not rejoin",
                    group.group_id,
                    member.member_id,
                )
                self._remove_member(group, member.member_id)
        if group.state is _S.DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Only static members that have not rejoined are left: wait another round, until
            # they rejoin or their sessions expire.
            log.warning("group %s: no member rejoined; waiting again", group.group_id)
            self._schedule_join_deadline(group, group.rebalance_timeout_ms())
            return
        group.init_next_generation()
        if group.state is _S.EMPTY:
            log.info("group %s: generation %d is empty", group.group_id, group.generation_id)
            return
        log.info(
            "group %s: generation %d with %d members, protocol %s, leader %s",
            group.group_id,
            group.generation_id,
            len(group.members),
            group.protocol_name,
            group.leader_id,
        )
        for member in list(group.members.values()):
            group.complete_join(member, self._join_result(group, member, with_members=True))
            self._schedule_heartbeat_expiry(group, member)
            member.is_new = False
            group.pending_sync.add(member.member_id)
        self._schedule_sync_expiry(group)

    # ==========================================================================================
    # SyncGroup
    # ==========================================================================================

    async def sync(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        assignments: Mapping[str, bytes] | None = None,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        """SyncGroup. The leader passes every member's assignment; a follower passes none and
        waits for the leader's. ``protocol_type``/``protocol_name`` (SyncGroup v5+) are checked
        against the group's when given."""
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        self._handle_sync(
            waiter,
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            assignments or {},
            protocol_type,
            protocol_name,
        )
        return await waiter

    def _handle_sync(
        self,
        waiter: asyncio.Future[SyncResult],
        group_id: str,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        assignments: Mapping[str, bytes],
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> None:
        """Kafka's handleSyncGroup and doSyncGroup."""
        if not group_id:
            waiter.set_result(SyncResult(ErrorCode.INVALID_GROUP_ID))
            return
        group = self._groups.get(group_id)
        if group is None:
            waiter.set_result(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
            return
        error = self._validate_sync(
            group, generation_id, member_id, instance_id, protocol_type, protocol_name
        )
        if error is not None:
            waiter.set_result(SyncResult(error))
            return
        state = group.state
        if state is _S.EMPTY:
            waiter.set_result(SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))
        elif state is _S.PREPARING_REBALANCE:
            waiter.set_result(SyncResult(ErrorCode.REBALANCE_IN_PROGRESS))
        elif state is _S.COMPLETING_REBALANCE:
            member = group.members[member_id]
            group.set_sync_waiter(member, waiter)
            self._sync_received(group, member_id)
            if group.is_leader(member_id):
                log.info(
                    "group %s: assignment from leader %s for generation %d",
                    group.group_id,
                    member_id,
                    group.generation_id,
                )
                # Members the leader left out get an empty assignment; unknown ids are ignored.
                for each in group.members.values():
                    each.assignment = bytes(assignments.get(each.member_id, b""))
                group.transition(GroupEvent.ASSIGNMENT_RECEIVED)
                self._propagate_assignment(group, ErrorCode.NONE)
        elif state is _S.STABLE:
            member = group.members[member_id]
            self._sync_received(group, member_id)
            waiter.set_result(
                SyncResult(
                    ErrorCode.NONE, member.assignment, group.protocol_type, group.protocol_name
                )
            )
            self._schedule_heartbeat_expiry(group, member)
        else:  # Dead was answered by _validate_sync
            raise RuntimeError(f"group {group_id!r}: SyncGroup in {state}")

    def _validate_sync(
        self,
        group: GroupMetadata,
        generation_id: int,
        member_id: str,
        instance_id: str | None,
        protocol_type: str | None,
        protocol_name: str | None,
    ) -> ErrorCode | None:
        if group.state is _S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_current_member(group, member_id, instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        if protocol_type is not None and protocol_type != group.protocol_type:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        if protocol_name is not None and protocol_name != group.protocol_name:
            return ErrorCode.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _sync_received(self, group: GroupMetadata, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self._cancel_sync_expiry(group)

    def _propagate_assignment(self, group: GroupMetadata, error: ErrorCode) -> None:
        """Answer every member waiting in SyncGroup; restart their session timers."""
        ok = error == ErrorCode.NONE
        for member in list(group.members.values()):
            result = SyncResult(
                error,
                member.assignment if ok else b"",
                group.protocol_type if ok else None,
                group.protocol_name if ok else None,
            )
            if group.complete_sync(member, result):
                # Expiry was ignored while it waited; it needs a fresh deadline now.
                self._schedule_heartbeat_expiry(group, member)

    def _reset_and_propagate_assignment_error(self, group: GroupMetadata, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = b""
        self._propagate_assignment(group, error)

    def _schedule_sync_expiry(self, group: GroupMetadata) -> None:
        """Kafka's DelayedSync: members that send no SyncGroup within the rebalance timeout
        after the join completed are removed, and the group rebalances without them."""
        self._cancel_sync_expiry(group)
        group.sync_operation += 1
        operation = group.sync_operation
        generation = group.generation_id
        group.sync_timer = self._clock.call_later(
            group.rebalance_timeout_ms(),
            lambda: self._on_sync_expired(group, operation, generation),
        )

    def _cancel_sync_expiry(self, group: GroupMetadata) -> None:
        if group.sync_timer is not None:
            group.sync_timer.cancel()
            group.sync_timer = None
        group.sync_operation += 1

    def _on_sync_expired(self, group: GroupMetadata, operation: int, generation: int) -> None:
        if operation != group.sync_operation or generation != group.generation_id:
            return
        group.sync_timer = None
        if group.state not in (_S.COMPLETING_REBALANCE, _S.STABLE) or not group.pending_sync:
            return
        missing = sorted(group.pending_sync)
        for member_id in missing:
            member = group.members.get(member_id)
            if member is not None:
                self._answer_removed(group, member)
            self._remove_member(group, member_id)
        log.info("group %s: removed members that did not sync: %s", group.group_id, missing)
        self._prepare_rebalance(group, "members did not send SyncGroup in time")

    # ==========================================================================================
    # Heartbeat, LeaveGroup, session expiry
    # ==========================================================================================

    def heartbeat(
        self,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None = None,
    ) -> ErrorCode:
        """Heartbeat: NONE, or REBALANCE_IN_PROGRESS once a rebalance started (rejoin), or why
        the member is not one (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, FENCED_INSTANCE_ID)."""
        if not group_id:
            return ErrorCode.INVALID_GROUP_ID
        group = self._groups.get(group_id)
        if group is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if group.state is _S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        error = self._validate_current_member(group, member_id, group_instance_id)
        if error is not None:
            return error
        if generation_id != group.generation_id:
            return ErrorCode.ILLEGAL_GENERATION
        state = group.state
        if state is _S.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID
        self._schedule_heartbeat_expiry(group, group.members[member_id])
        if state is _S.PREPARING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        return ErrorCode.NONE  # Stable, or CompletingRebalance (heartbeats may precede sync)

    def leave(
        self,
        group_id: str,
        members: Iterable[MemberIdentity | tuple[str, str | None]],
    ) -> LeaveResult:
        """LeaveGroup for one or more members (v3+ batches them). A member named only by its
        group.instance.id (empty member id) is removed administratively (KIP-345)."""
        identities = [MemberIdentity(member_id, instance) for member_id, instance in members]
        if not group_id:
            return LeaveResult(ErrorCode.INVALID_GROUP_ID)
        group = self._groups.get(group_id)
        if group is None:
            return LeaveResult(
                ErrorCode.NONE,
                [
                    MemberLeaveResult(m.member_id, m.group_instance_id, ErrorCode.UNKNOWN_MEMBER_ID)
                    for m in identities
                ],
            )
        if group.state is _S.DEAD:
            return LeaveResult(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        results = [
            MemberLeaveResult(m.member_id, m.group_instance_id, self._leave_one(group, m))
            for m in identities
        ]
        return LeaveResult(ErrorCode.NONE, results)

    def _leave_one(self, group: GroupMetadata, identity: MemberIdentity) -> ErrorCode:
        member_id, instance_id = identity
        if member_id == UNKNOWN_MEMBER_ID:
            current = group.static_members.get(instance_id) if instance_id is not None else None
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            self._remove_member_and_update_group(group, group.members[current], "left (admin)")
            return ErrorCode.NONE
        if member_id in group.pending_members:
            self._remove_member(group, member_id)
            if group.state is _S.PREPARING_REBALANCE:
                self._try_complete_join(group)
            return ErrorCode.NONE
        error = self._validate_current_member(group, member_id, instance_id)
        if error is not None:
            return error
        self._remove_member_and_update_group(group, group.members[member_id], "left the group")
        return ErrorCode.NONE

    def _remove_member_and_update_group(
        self, group: GroupMetadata, member: MemberMetadata, reason: str
    ) -> None:
        """Kafka's removeMemberAndUpdateGroup: drop a member and rebalance without it."""
        log.info("group %s: member %s %s", group.group_id, member.member_id, reason)
        self._answer_removed(group, member)
        self._remove_member(group, member.member_id)
        state = group.state
        if state in (_S.STABLE, _S.COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance(group, f"member {member.member_id} {reason}")
        elif state is _S.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _answer_removed(self, group: GroupMetadata, member: MemberMetadata) -> None:
        """A removed member still waiting in JoinGroup or SyncGroup learns it is unknown now,
        so a live client joins again. (Kafka answers the JoinGroup only; an asyncio waiter left
        unanswered would hang its connection.)"""
        group.complete_join(member, join_error(UNKNOWN_MEMBER_ID, ErrorCode.UNKNOWN_MEMBER_ID))
        group.complete_sync(member, SyncResult(ErrorCode.UNKNOWN_MEMBER_ID))

    def _remove_member(self, group: GroupMetadata, member_id: str) -> None:
        group.remove(member_id)

    def _schedule_heartbeat_expiry(
        self, group: GroupMetadata, member: MemberMetadata, timeout_ms: int | None = None
    ) -> None:
        """Kafka's completeAndScheduleNextHeartbeatExpiration: the member must be heard from
        again within ``timeout_ms`` (its session timeout by default).

        One timer per member chases a moving deadline: a heartbeat only moves the deadline, and
        the timer, when it fires early, re-arms for the rest.
        """
        timeout = member.session_timeout_ms if timeout_ms is None else timeout_ms
        deadline = self._clock.now_ms() + timeout
        member.heartbeat_deadline_ms = deadline
        if member.heartbeat_timer is not None:
            if member.heartbeat_timer_at_ms <= deadline:
                return
            member.heartbeat_timer.cancel()
        self._arm_heartbeat_timer(group, member, timeout)

    def _arm_heartbeat_timer(
        self, group: GroupMetadata, member: MemberMetadata, delay_ms: float
    ) -> None:
        member.heartbeat_timer_at_ms = self._clock.now_ms() + delay_ms
        member.heartbeat_timer = self._clock.call_later(
            delay_ms, lambda: self._on_heartbeat_timer(group, member)
        )

    def _on_heartbeat_timer(self, group: GroupMetadata, member: MemberMetadata) -> None:
        """Kafka's onExpireHeartbeat."""
        member.heartbeat_timer = None
        if group.state is _S.DEAD or group.members.get(member.member_id) is not member:
            return
        remaining = member.heartbeat_deadline_ms - self._clock.now_ms()
        if remaining > 0:
            self._arm_heartbeat_timer(group, member, remaining)
            return
        if not member.is_new and (member.is_awaiting_join or member.is_awaiting_sync):
            # A member waiting for a rebalance to finish cannot heartbeat; the rebalance and
            # sync deadlines cover it, and its timer restarts when it is answered.
            return
        self._remove_member_and_update_group(group, member, "session timed out")

    def _on_pending_member_expired(self, group: GroupMetadata, member_id: str) -> None:
        """[KIP-394] a member given an id with MEMBER_ID_REQUIRED never came back with it."""
        if group.pending_members.pop(member_id, None) is None:
            return
        log.info("group %s: pending member %s expired", group.group_id, member_id)
        if group.state is _S.PREPARING_REBALANCE:
            self._try_complete_join(group)

    def _validate_current_member(
        self, group: GroupMetadata, member_id: str, instance_id: str | None
    ) -> ErrorCode | None:
        """Kafka's validateCurrentMember: the instance id, if any, must map to this member id
        (else FENCED_INSTANCE_ID, or UNKNOWN_MEMBER_ID if unmapped); the member must exist."""
        if instance_id is not None:
            current = group.static_members.get(instance_id)
            if current is None:
                return ErrorCode.UNKNOWN_MEMBER_ID
            if current != member_id:
                return ErrorCode.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return ErrorCode.UNKNOWN_MEMBER_ID
        return None

    # ==========================================================================================
    # Offset-commit check, administration
    # ==========================================================================================

    def validate_member(
        self,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
        *,
        transactional: bool = False,
    ) -> ErrorCode:
        """May this member commit offsets for the group now? Kafka's validateOffsetCommit with
        the state checks of handleCommitOffsets / handleTxnCommitOffsets.

        - Generation -1, empty member id, no instance id: a "simple consumer" commit (no group
          management). Allowed when the group is unknown (it is then created Empty, as Kafka
          does, so it can be listed and deleted) or Empty; UNKNOWN_MEMBER_ID when it has members.
        - Otherwise the member must be current (UNKNOWN_MEMBER_ID / FENCED_INSTANCE_ID) and the
          generation the group's (ILLEGAL_GENERATION); during CompletingRebalance the answer is
          REBALANCE_IN_PROGRESS. A valid commit counts as a heartbeat.
        - ``transactional`` (TxnOffsetCommit): the group is created if unknown, and no state
          check is made beyond the member and generation.
        """
        group = self._groups.get(group_id)
        if group is None:
            if not transactional and generation_id >= 0:
                # A member of a group this coordinator does not know: a stale generation.
                return ErrorCode.ILLEGAL_GENERATION
            group = self._groups[group_id] = GroupMetadata(group_id)
        if group.state is _S.DEAD:
            return ErrorCode.COORDINATOR_NOT_AVAILABLE
        if generation_id >= 0 or member_id != UNKNOWN_MEMBER_ID or group_instance_id is not None:
            error = self._validate_current_member(group, member_id, group_instance_id)
            if error is not None:
                return error
            if generation_id != group.generation_id:
                return ErrorCode.ILLEGAL_GENERATION
        elif not transactional and group.state is not _S.EMPTY:
            return ErrorCode.UNKNOWN_MEMBER_ID  # only members commit for a group with members
        if transactional:
            return ErrorCode.NONE
        state = group.state
        if state is _S.COMPLETING_REBALANCE:
            return ErrorCode.REBALANCE_IN_PROGRESS
        if state in (_S.STABLE, _S.PREPARING_REBALANCE):
            self._schedule_heartbeat_expiry(group, group.members[member_id])
        return ErrorCode.NONE

    def ensure_group(self, group_id: str) -> None:
        """Make an unknown group exist, Empty: for groups that have committed offsets but no
        members (after a restart, say), so ListGroups shows them and DeleteGroups can delete
        them, as Kafka does when it loads its offsets topic."""
        if group_id not in self._groups:
            self._groups[group_id] = GroupMetadata(group_id)

    def generation(self, group_id: str) -> int | None:
        """The group's current generation id, or ``None`` if the group is unknown."""
        group = self._groups.get(group_id)
        return None if group is None else group.generation_id

    def state(self, group_id: str) -> GroupState | None:
        """The group's state, or ``None`` if the group is unknown."""
        group = self._groups.get(group_id)
        return None if group is None else group.state

    def describe(self, group_id: str) -> GroupDescription:
        """DescribeGroups for one group; an unknown group is described as Dead, error NONE.
        Member metadata and assignments are included only when the group is Stable."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(ErrorCode.NONE, group_id, _S.DEAD.value, "", "")
        stable = group.state is _S.STABLE and group.protocol_name is not None
        protocol = group.protocol_name if stable else None
        members = [
            MemberDescription(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                metadata=m.metadata_for(protocol) if protocol is not None else b"",
                assignment=m.assignment if stable else b"",
            )
            for m in group.members.values()
        ]
        return GroupDescription(
            ErrorCode.NONE,
            group_id,
            group.state.value,
            group.protocol_type or "",
            protocol or "",
            members,
        )

    def list_groups(self, states: Collection[str] | None = None) -> list[GroupListing]:
        """ListGroups; ``states`` (v4+) filters by state name, case-insensitively."""
        wanted = {s.lower() for s in states} if states else None
        return [
            GroupListing(group.group_id, group.protocol_type or "", group.state.value)
            for group in self._groups.values()
            if wanted is None or group.state.value.lower() in wanted
        ]

    def delete_groups(self, group_ids: Iterable[str]) -> dict[str, ErrorCode]:
        """DeleteGroups: only Empty groups go (NON_EMPTY_GROUP otherwise; GROUP_ID_NOT_FOUND if
        unknown). The caller deletes the committed offsets of every group answered NONE."""
        errors: dict[str, ErrorCode] = {}
        for group_id in group_ids:
            group = self._groups.get(group_id)
            if group is None or group.state is _S.DEAD:
                errors[group_id] = ErrorCode.GROUP_ID_NOT_FOUND
            elif group.state is _S.EMPTY:
                self._discard_group(group)
                errors[group_id] = ErrorCode.NONE
            else:
                errors[group_id] = ErrorCode.NON_EMPTY_GROUP
        return errors

    def close(self) -> None:
        """Drop every group (Kafka's onGroupUnloaded): waiting JoinGroup and SyncGroup calls are
        answered NOT_COORDINATOR, so clients look for the coordinator again; timers stop."""
        for group in list(self._groups.values()):
            for member in group.members.values():
                group.complete_join(member, join_error(member.member_id, ErrorCode.NOT_COORDINATOR))
                group.complete_sync(member, SyncResult(ErrorCode.NOT_COORDINATOR))
            self._discard_group(group)

    def _discard_group(self, group: GroupMetadata) -> None:
        group.transition(GroupEvent.REMOVED)
        self._next_join_operation(group)
        self._cancel_sync_expiry(group)
        for member in group.members.values():
            member.cancel_heartbeat_timer()
        for timer in group.pending_members.values():
            timer.cancel()
        group.pending_members.clear()
        self._groups.pop(group.group_id, None)
