"""GroupCoordinator driven without sockets: a ManualClock for every timer, asyncio tasks for the
JoinGroup and SyncGroup calls that wait. One test runs on the real loop clock with short timeouts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from core.groups import (
    ErrorCode,
    GroupCoordinator,
    GroupState,
    JoinResult,
    ManualClock,
    MemberIdentity,
    SyncResult,
)

GROUP = "g"
CONSUMER = "consumer"
DELAY = 50  # initial rebalance delay
SESSION = 10_000
REBALANCE = 20_000
RANGE = [("range", b"meta")]


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def coord(clock: ManualClock) -> AsyncIterator[GroupCoordinator]:
    coordinator = GroupCoordinator(
        clock=clock, initial_rebalance_delay_ms=DELAY, min_session_timeout_ms=10
    )
    yield coordinator
    coordinator.close()


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(10):
        await asyncio.sleep(0)


def start_join(
    coord: GroupCoordinator,
    member_id: str = "",
    protocols: Sequence[tuple[str, bytes]] = RANGE,
    *,
    instance: str | None = None,
    protocol_type: str = CONSUMER,
    session: int = SESSION,
    rebalance: int = REBALANCE,
    client: str = "client",
    require_known: bool = False,
    group: str = GROUP,
) -> asyncio.Task[JoinResult]:
    return asyncio.create_task(
        coord.join(
            group,
            member_id,
            instance,
            protocol_type,
            list(protocols),
            session,
            rebalance,
            client,
            "/127.0.0.1",
            require_known,
        )
    )


def start_sync(
    coord: GroupCoordinator,
    result: JoinResult,
    assignments: dict[str, bytes] | None = None,
    *,
    instance: str | None = None,
) -> asyncio.Task[SyncResult]:
    return asyncio.create_task(
        coord.sync(GROUP, result.generation_id, result.member_id, instance, assignments)
    )


async def form_group(
    coord: GroupCoordinator, clock: ManualClock, count: int, **join_options: object
) -> list[JoinResult]:
    """Join ``count`` new members at once and let the initial delay run out."""
    tasks = [start_join(coord, client=f"c{i}", **join_options) for i in range(count)]  # type: ignore[arg-type]
    await settle()
    assert not any(t.done() for t in tasks)
    for _ in range(count + 1):  # stop at the instant the join completes
        clock.advance(DELAY)
        await settle()
        if all(t.done() for t in tasks):
            break
    results = [t.result() for t in tasks]
    assert all(r.error_code == ErrorCode.NONE for r in results)
    return results


async def stabilize(coord: GroupCoordinator, results: list[JoinResult]) -> dict[str, SyncResult]:
    """Followers sync first, then the leader with one assignment per member."""
    leader = next(r for r in results if r.is_leader)
    followers = [start_sync(coord, r) for r in results if not r.is_leader]
    await settle()
    assignments = {r.member_id: f"assigned:{r.member_id}".encode() for r in results}
    synced = [await start_sync(coord, leader, assignments), *[await t for t in followers]]
    members = [leader, *[r for r in results if not r.is_leader]]
    return {m.member_id: s for m, s in zip(members, synced, strict=True)}


# -- joining -------------------------------------------------------------------------------------


async def test_two_members_join_one_leader_same_generation(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    first = start_join(coord, protocols=[("range", b"m1")], client="c1")
    second = start_join(coord, protocols=[("range", b"m2")], client="c2")
    await settle()
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE
    clock.advance(DELAY - 1)
    await settle()
    assert not first.done()  # the initial rebalance delay holds the join back
    clock.advance(DELAY * 2)
    await settle()
    r1, r2 = first.result(), second.result()

    assert r1.error_code == r2.error_code == ErrorCode.NONE
    assert r1.generation_id == r2.generation_id == 1
    assert r1.protocol_name == r2.protocol_name == "range"
    assert r1.protocol_type == CONSUMER
    assert r1.leader_id == r2.leader_id == r1.member_id  # the first joiner leads
    assert r1.member_id.startswith("c1-")
    assert r2.member_id.startswith("c2-")
    assert r1.is_leader
    assert not r2.is_leader
    assert [tuple(m) for m in r1.members] == [
        (r1.member_id, None, b"m1"),
        (r2.member_id, None, b"m2"),
    ]
    assert r2.members == []
    assert coord.state(GROUP) is GroupState.COMPLETING_REBALANCE
    assert coord.generation(GROUP) == 1


async def test_three_members_join_concurrently_and_vote_a_protocol(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    both = [("roundrobin", b"rr"), ("range", b"rg")]
    tasks = [
        start_join(coord, protocols=both),
        start_join(coord, protocols=both),
        start_join(coord, protocols=[("range", b"rg"), ("roundrobin", b"rr"), ("sticky", b"s")]),
    ]
    await settle()
    clock.advance(1_000)
    await settle()
    results = [t.result() for t in tasks]
    assert {r.generation_id for r in results} == {1}
    assert {r.protocol_name for r in results} == {"roundrobin"}  # two votes to one
    leaders = [r for r in results if r.is_leader]
    assert len(leaders) == 1
    assert len({r.leader_id for r in results}) == 1
    assert {m.member_id for m in leaders[0].members} == {r.member_id for r in results}
    assert {m.metadata for m in leaders[0].members} == {b"rr"}


async def test_protocol_only_one_member_lacks_is_not_chosen(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    first = start_join(coord, protocols=[("roundrobin", b""), ("range", b"")])
    second = start_join(coord, protocols=[("range", b"")])
    await settle()
    clock.advance(1_000)
    await settle()
    assert first.result().protocol_name == second.result().protocol_name == "range"


async def test_sync_distributes_assignments(coord: GroupCoordinator, clock: ManualClock) -> None:
    results = await form_group(coord, clock, 3)
    leader = next(r for r in results if r.is_leader)
    followers = [r for r in results if not r.is_leader]
    waiting = [start_sync(coord, r) for r in followers]
    await settle()
    assert not any(t.done() for t in waiting)  # followers wait for the leader
    assert coord.heartbeat(GROUP, 1, followers[0].member_id) == ErrorCode.NONE

    # The leader leaves one member out: it gets an empty assignment.
    assignments = {leader.member_id: b"L", followers[0].member_id: b"F0", "stranger": b"?"}
    mine = await start_sync(coord, leader, assignments)
    await settle()
    assert mine == SyncResult(ErrorCode.NONE, b"L", CONSUMER, "range")
    assert waiting[0].result().assignment == b"F0"
    assert waiting[1].result() == SyncResult(ErrorCode.NONE, b"", CONSUMER, "range")
    assert coord.state(GROUP) is GroupState.STABLE

    # A sync in a Stable group answers the stored assignment at once.
    again = await start_sync(coord, followers[0])
    assert again.assignment == b"F0"

    described = coord.describe(GROUP)
    assert described.state == "Stable"
    assert described.protocol_name == "range"
    assert {m.member_id: m.assignment for m in described.members} == {
        leader.member_id: b"L",
        followers[0].member_id: b"F0",
        followers[1].member_id: b"",
    }
    assert {m.metadata for m in described.members} == {b"meta"}


async def test_third_member_joining_a_stable_group_rebalances(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2)
    await stabilize(coord, [a, b])
    assert coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.NONE

    c_join = start_join(coord, client="c3")
    await settle()
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE
    assert not c_join.done()
    assert coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.heartbeat(GROUP, 1, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    # A sync for the old generation during the rebalance: rejoin.
    assert (await start_sync(coord, b)).error_code == ErrorCode.REBALANCE_IN_PROGRESS

    a_join = start_join(coord, a.member_id)
    b_join = start_join(coord, b.member_id)
    await settle()  # everyone known has rejoined: no timer needed
    results = [a_join.result(), b_join.result(), c_join.result()]
    assert {r.generation_id for r in results} == {2}
    assert {r.leader_id for r in results} == {a.member_id}
    assert len(results[0].members) == 3
    assert coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.ILLEGAL_GENERATION
    assert coord.heartbeat(GROUP, 2, a.member_id) == ErrorCode.NONE
    synced = await stabilize(coord, results)
    assert all(s.error_code == ErrorCode.NONE for s in synced.values())
    assert coord.state(GROUP) is GroupState.STABLE


async def test_member_that_does_not_rejoin_is_removed_at_the_rebalance_timeout(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2, rebalance=1_000)
    await stabilize(coord, [a, b])
    c_join = start_join(coord, rebalance=1_000)
    a_join = start_join(coord, a.member_id, rebalance=1_000)
    await settle()
    assert not a_join.done()
    clock.advance(1_000)
    await settle()
    assert a_join.result().generation_id == c_join.result().generation_id == 2
    assert {m.member_id for m in a_join.result().members} == {
        a.member_id,
        c_join.result().member_id,
    }
    assert coord.heartbeat(GROUP, 2, b.member_id) == ErrorCode.UNKNOWN_MEMBER_ID


async def test_leader_rejoin_in_stable_group_forces_rebalance(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2)
    await stabilize(coord, [a, b])
    # A follower with unchanged metadata just gets the current generation back.
    same = await start_join(coord, b.member_id)
    assert (same.generation_id, same.members) == (1, [])
    assert coord.state(GROUP) is GroupState.STABLE
    a_join = start_join(coord, a.member_id)
    await settle()
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat(GROUP, 1, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    b_join = start_join(coord, b.member_id)
    await settle()
    assert a_join.result().generation_id == b_join.result().generation_id == 2


# -- leaving and expiring ------------------------------------------------------------------------


async def test_leave_triggers_rebalance(coord: GroupCoordinator, clock: ManualClock) -> None:
    a, b = await form_group(coord, clock, 2)
    await stabilize(coord, [a, b])
    left = coord.leave(GROUP, [MemberIdentity(a.member_id), ("nobody", None)])
    assert left.error_code == ErrorCode.NONE
    assert [m.error_code for m in left.members] == [ErrorCode.NONE, ErrorCode.UNKNOWN_MEMBER_ID]
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(GROUP, 1, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    rejoined = await start_join(coord, b.member_id)
    assert rejoined.generation_id == 2
    assert rejoined.leader_id == b.member_id  # the leader left: the remaining member leads
    assert [m.member_id for m in rejoined.members] == [b.member_id]

    # The last member leaving makes the group Empty (a new generation with no members).
    await stabilize(coord, [rejoined])
    coord.leave(GROUP, [(b.member_id, None)])
    assert coord.state(GROUP) is GroupState.EMPTY
    assert coord.generation(GROUP) == 3


async def test_leave_during_completing_rebalance_fails_waiting_syncs(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    _a, b, c = await form_group(coord, clock, 3)
    waiting = start_sync(coord, b)
    await settle()
    coord.leave(GROUP, [(c.member_id, None)])
    await settle()
    assert waiting.result().error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE


async def test_session_timeout_removes_a_silent_member(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2, session=200)
    await stabilize(coord, [a, b])
    for _ in range(3):  # b heartbeats every 100 ms, a stays silent
        clock.advance(100)
        assert coord.heartbeat(GROUP, 1, b.member_id) in (
            ErrorCode.NONE,
            ErrorCode.REBALANCE_IN_PROGRESS,
        )
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat(GROUP, 1, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    assert coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    rejoined = await start_join(coord, b.member_id, session=200)
    assert rejoined.generation_id == 2
    assert [m.member_id for m in rejoined.members] == [b.member_id]


async def test_waiting_in_join_does_not_expire_the_session(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2, session=200, rebalance=1_000)
    await stabilize(coord, [a, b])
    a_join = start_join(coord, a.member_id, session=200, rebalance=1_000)
    await settle()
    for _ in range(9):  # a waits far longer than its session timeout; b heartbeats, no rejoin
        clock.advance(100)
        assert coord.heartbeat(GROUP, 1, b.member_id) == ErrorCode.REBALANCE_IN_PROGRESS
    clock.advance(99)
    await settle()
    assert not a_join.done()
    clock.advance(1)  # the rebalance timeout: b did not rejoin and is removed
    await settle()
    result = a_join.result()
    assert (result.error_code, result.generation_id) == (ErrorCode.NONE, 2)
    assert [m.member_id for m in result.members] == [a.member_id]


async def test_member_that_never_syncs_is_removed(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2, rebalance=500)
    leader = a if a.is_leader else b
    other = b if leader is a else a
    synced = await start_sync(coord, leader, {leader.member_id: b"x", other.member_id: b"y"})
    assert synced.error_code == ErrorCode.NONE
    clock.advance(499)
    assert coord.heartbeat(GROUP, 1, leader.member_id) == ErrorCode.NONE
    clock.advance(1)  # the rebalance timeout after the join: other never sent SyncGroup
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE
    assert coord.heartbeat(GROUP, 1, other.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(GROUP, 1, leader.member_id) == ErrorCode.REBALANCE_IN_PROGRESS


async def test_real_loop_clock_session_expiry() -> None:
    """The same expiry on asyncio's own timers, with short timeouts."""
    coord = GroupCoordinator(initial_rebalance_delay_ms=0, min_session_timeout_ms=10)
    try:
        async with asyncio.timeout(5):
            joins = [
                coord.join(GROUP, "", None, CONSUMER, RANGE, 200, 400, f"c{i}", "h", False)
                for i in range(2)
            ]
            a, b = await asyncio.gather(*joins)
            assert a.generation_id == b.generation_id == 1
            await stabilize(coord, [a, b])
            # b heartbeats, a is silent: within ~200 ms a's session expires.
            code = ErrorCode.NONE
            while code == ErrorCode.NONE:
                await asyncio.sleep(0.05)
                code = coord.heartbeat(GROUP, 1, b.member_id)
            assert code == ErrorCode.REBALANCE_IN_PROGRESS
            rejoined = await coord.join(
                GROUP, b.member_id, None, CONSUMER, RANGE, 200, 400, "c1", "h", False
            )
            assert rejoined.generation_id == 2
            assert [m.member_id for m in rejoined.members] == [b.member_id]
    finally:
        coord.close()


# -- KIP-394, protocols, generations -------------------------------------------------------------


async def test_member_id_required_flow(coord: GroupCoordinator, clock: ManualClock) -> None:
    first = await start_join(coord, require_known=True, client="app")
    assert first.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert first.member_id.startswith("app-")
    assert first.generation_id == -1
    assert coord.describe(GROUP).members == []  # pending, not a member yet

    second = start_join(coord, first.member_id, require_known=True)
    await settle()
    clock.advance(DELAY)
    await settle()
    result = second.result()
    assert result.error_code == ErrorCode.NONE
    assert result.member_id == first.member_id
    assert result.is_leader
    assert result.generation_id == 1


async def test_pending_member_holds_the_rebalance_until_it_expires(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    (a,) = await form_group(coord, clock, 1)
    await stabilize(coord, [a])
    pending = await start_join(coord, require_known=True, session=300)
    assert pending.error_code == ErrorCode.MEMBER_ID_REQUIRED
    assert coord.state(GROUP) is GroupState.STABLE  # no rebalance for a pending member
    a_join = start_join(coord, a.member_id)  # the leader rejoins: rebalance
    await settle()
    assert not a_join.done()  # the pending member may still come back
    clock.advance(300)
    await settle()
    assert a_join.result().generation_id == 2
    assert (await start_join(coord, pending.member_id)).error_code == ErrorCode.UNKNOWN_MEMBER_ID


async def test_inconsistent_protocols(coord: GroupCoordinator, clock: ManualClock) -> None:
    first = start_join(coord, protocols=[("range", b"")])
    await settle()
    other_name = await start_join(coord, protocols=[("roundrobin", b"")])
    assert other_name.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    assert other_name.member_id == ""
    other_type = await start_join(coord, protocols=[("range", b"")], protocol_type="connect")
    assert other_type.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    no_protocols = await start_join(coord, protocols=[], group="fresh")
    assert no_protocols.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    clock.advance(DELAY)
    await settle()
    assert first.result().error_code == ErrorCode.NONE


async def test_illegal_generation_and_unknown_member(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, _b = await form_group(coord, clock, 2)
    stale = await coord.sync(GROUP, 7, a.member_id, None, {})
    assert stale.error_code == ErrorCode.ILLEGAL_GENERATION
    assert coord.heartbeat(GROUP, 7, a.member_id) == ErrorCode.ILLEGAL_GENERATION
    unknown = await coord.sync(GROUP, 1, "nobody", None, {})
    assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(GROUP, 1, "nobody") == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat("no-such-group", 1, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat("", 1, a.member_id) == ErrorCode.INVALID_GROUP_ID
    wrong_protocol = await coord.sync(GROUP, 1, a.member_id, None, {}, CONSUMER, "sticky")
    assert wrong_protocol.error_code == ErrorCode.INCONSISTENT_GROUP_PROTOCOL
    stale_join = await start_join(coord, "gone-member")
    assert stale_join.error_code == ErrorCode.UNKNOWN_MEMBER_ID
    bad_session = await start_join(coord, session=1)
    assert bad_session.error_code == ErrorCode.INVALID_SESSION_TIMEOUT


async def test_validate_member_for_offset_commits(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    # A simple consumer commit (generation -1, no member) to an unknown group creates it Empty.
    assert coord.validate_member("simple", "", -1) == ErrorCode.NONE
    assert coord.state("simple") is GroupState.EMPTY
    assert coord.validate_member("unknown", "m", 3) == ErrorCode.ILLEGAL_GENERATION

    a, b = await form_group(coord, clock, 2)
    assert coord.validate_member(GROUP, a.member_id, 1) == ErrorCode.REBALANCE_IN_PROGRESS
    await stabilize(coord, [a, b])
    assert coord.validate_member(GROUP, a.member_id, 1) == ErrorCode.NONE
    assert coord.validate_member(GROUP, a.member_id, 0) == ErrorCode.ILLEGAL_GENERATION
    assert coord.validate_member(GROUP, "nobody", 1) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.validate_member(GROUP, "", -1) == ErrorCode.UNKNOWN_MEMBER_ID  # has members
    assert coord.validate_member(GROUP, "", -1, transactional=True) == ErrorCode.NONE


# -- administration ------------------------------------------------------------------------------


async def test_delete_groups(coord: GroupCoordinator, clock: ManualClock) -> None:
    (a,) = await form_group(coord, clock, 1)
    await stabilize(coord, [a])
    coord.ensure_group("offsets-only")
    assert coord.delete_groups([GROUP, "offsets-only", "never"]) == {
        GROUP: ErrorCode.NON_EMPTY_GROUP,
        "offsets-only": ErrorCode.NONE,
        "never": ErrorCode.GROUP_ID_NOT_FOUND,
    }
    coord.leave(GROUP, [(a.member_id, None)])
    assert coord.state(GROUP) is GroupState.EMPTY
    assert coord.delete_groups([GROUP]) == {GROUP: ErrorCode.NONE}
    assert coord.state(GROUP) is None
    assert coord.describe(GROUP).state == "Dead"
    assert coord.list_groups() == []


async def test_describe_and_list(coord: GroupCoordinator, clock: ManualClock) -> None:
    results = await form_group(coord, clock, 2)
    described = coord.describe(GROUP)
    assert described.state == "CompletingRebalance"
    assert described.protocol_name == ""  # only a Stable group shows protocol and metadata
    assert {m.client_id for m in described.members} == {"c0", "c1"}
    assert {m.client_host for m in described.members} == {"/127.0.0.1"}
    await stabilize(coord, results)
    coord.validate_member("idle", "", -1)
    listed = {(g.group_id, g.protocol_type, g.state) for g in coord.list_groups()}
    assert listed == {(GROUP, CONSUMER, "Stable"), ("idle", "", "Empty")}
    assert [g.group_id for g in coord.list_groups(["STABLE"])] == [GROUP]


async def test_close_answers_waiting_joins(coord: GroupCoordinator, clock: ManualClock) -> None:
    waiting = start_join(coord)
    await settle()
    coord.close()
    await settle()
    assert waiting.result().error_code == ErrorCode.NOT_COORDINATOR
    assert coord.list_groups() == []
    assert clock.advance(REBALANCE) == 0  # no timer left behind


async def test_cancelled_join_does_not_break_the_group(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    gone = start_join(coord, client="gone")
    stays = start_join(coord, client="stays")
    await settle()
    gone.cancel()  # the connection closed while waiting
    await settle()
    clock.advance(DELAY * 3)
    await settle()
    assert stays.result().generation_id == 1  # the cancelled member is still counted as joined


# -- static membership (KIP-345) ---------------------------------------------------------------


async def test_static_member_rejoin_replaces_member_id_without_rebalance(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a_task = start_join(coord, instance="instance-a", client="a")
    b_task = start_join(coord, client="b")
    await settle()
    clock.advance(DELAY * 3)
    await settle()
    a, b = a_task.result(), b_task.result()
    assert a.member_id.startswith("instance-a-")
    assert a.is_leader
    leader_view = {m.member_id: m.group_instance_id for m in a.members}
    assert leader_view == {a.member_id: "instance-a", b.member_id: None}
    synced = await stabilize(coord, [a, b])
    assert synced[a.member_id].assignment == f"assigned:{a.member_id}".encode()

    # The instance restarts: same instance id, no member id, same protocols.
    restarted = await start_join(coord, instance="instance-a", client="a")
    assert restarted.error_code == ErrorCode.NONE
    assert restarted.member_id != a.member_id
    assert restarted.generation_id == 1
    assert restarted.leader_id == a.member_id  # the old id: do not compute an assignment
    assert not restarted.is_leader
    assert coord.state(GROUP) is GroupState.STABLE
    assert coord.generation(GROUP) == 1

    # It keeps its assignment under the new id; the old id is fenced.
    kept = await coord.sync(GROUP, 1, restarted.member_id, "instance-a", None)
    assert kept.assignment == f"assigned:{a.member_id}".encode()
    assert coord.heartbeat(GROUP, 1, a.member_id, "instance-a") == ErrorCode.FENCED_INSTANCE_ID
    assert coord.heartbeat(GROUP, 1, a.member_id) == ErrorCode.UNKNOWN_MEMBER_ID
    assert coord.heartbeat(GROUP, 1, restarted.member_id, "instance-a") == ErrorCode.NONE
    assert coord.heartbeat(GROUP, 1, b.member_id) == ErrorCode.NONE


async def test_static_member_rejoin_with_other_protocol_rebalances(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    both = [("range", b""), ("roundrobin", b"")]
    (a,) = await form_group(coord, clock, 1, instance="solo", protocols=both)
    await stabilize(coord, [a])
    changed = start_join(coord, instance="solo", protocols=[("roundrobin", b"")])
    await settle()
    result = changed.result()  # the only member rejoined: the rebalance completes at once
    assert (result.generation_id, result.protocol_name) == (2, "roundrobin")
    assert result.is_leader


async def test_static_member_survives_a_missed_rejoin(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    s_task = start_join(coord, instance="static", rebalance=1_000)
    d_task = start_join(coord, rebalance=1_000)
    await settle()
    clock.advance(DELAY * 3)
    await settle()
    s, d = s_task.result(), d_task.result()
    await stabilize(coord, [s, d])
    d_join = start_join(coord, d.member_id, rebalance=1_000)  # static member misses this one
    await settle()
    assert coord.state(GROUP) is GroupState.STABLE  # a follower rejoin changes nothing...
    assert d_join.result().generation_id == 1
    assert coord.leave(GROUP, [("", "static")]).members[0].error_code == ErrorCode.NONE
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE  # ...an admin removal does


async def test_static_member_restart_during_completing_rebalance_fences_and_rebalances(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    d_task = start_join(coord, client="d")
    s_task = start_join(coord, instance="static", client="s")
    await settle()
    clock.advance(DELAY * 3)
    await settle()
    d, s = d_task.result(), s_task.result()
    old_sync = start_sync(coord, s, instance="static")
    await settle()
    restarted = start_join(coord, instance="static", client="s")
    await settle()
    assert old_sync.result().error_code == ErrorCode.FENCED_INSTANCE_ID
    assert coord.state(GROUP) is GroupState.PREPARING_REBALANCE  # the leader may hold the old id
    d_rejoin = start_join(coord, d.member_id)
    await settle()
    assert restarted.result().generation_id == d_rejoin.result().generation_id == 2
    assert restarted.result().member_id != s.member_id


# -- limits and duplicates -----------------------------------------------------------------------


async def test_duplicate_join_answers_the_first_call(
    coord: GroupCoordinator, clock: ManualClock
) -> None:
    a, b = await form_group(coord, clock, 2)
    await stabilize(coord, [a, b])
    first = start_join(coord, a.member_id)
    await settle()
    second = start_join(coord, a.member_id)
    await settle()
    assert first.result().error_code == ErrorCode.REBALANCE_IN_PROGRESS
    assert not second.done()
    b_join = start_join(coord, b.member_id)
    await settle()
    assert second.result().generation_id == b_join.result().generation_id == 2


async def test_max_group_size(clock: ManualClock) -> None:
    coord = GroupCoordinator(clock=clock, initial_rebalance_delay_ms=DELAY, max_group_size=2)
    try:
        a, b = await form_group(coord, clock, 2)
        await stabilize(coord, [a, b])
        refused = await start_join(coord)
        assert refused.error_code == ErrorCode.GROUP_MAX_SIZE_REACHED
        assert refused.member_id == ""
        assert coord.state(GROUP) is GroupState.STABLE
    finally:
        coord.close()
