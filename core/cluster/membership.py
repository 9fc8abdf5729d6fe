"""Membership: a node's lease, the claims of its shards, and self-fencing (docs/cluster.md
sections 4, 5 and 11).

One :class:`Membership` per node process. :meth:`Membership.start`:

1. registers the node (``node:<id>``: host, gRPC and Kafka addresses, pid, started_ms) with a
   fresh random incarnation;
2. takes ``lease:<id>``, waiting (bounded) for a previous incarnation's lease to expire: two
   processes never serve as one node; then renews it every ``heartbeat_ms`` in a task;
3. waits until ``expect_nodes`` nodes hold leases (bounded; logged while it waits) and computes
   the plan, ``sorted(live node ids)[n % count]`` for shard ``n`` (:func:`plan`), the same on
   every node;
4. claims its shards: those recorded as its own (a restart with the same node id takes them
   back, at a new epoch) and those the plan gives it that nobody owns. A shard recorded as
   another node's is left alone at the join, live or not;
5. takes over (issue 23, section 12; ``[cluster] takeover``, on by default): after the join it
   reads the live nodes when the first of the others' leases read last can expire (each
   reading gives their PTTLs; a node dead right after it expires then, not sooner), at least
   once a ``heartbeat_ms`` (a lease released by a clean stop), and the ownership table when
   the live nodes (ids, incarnations) differ from those of the last reading that found no
   orphan (only a claim, by a live node, moves a shard otherwise); a shard
   nobody owns, or whose recorded owner holds no lease (dead, or released by a clean stop), is
   an orphan, and :func:`takeover_plan` over the live nodes (balanced by the shards each node
   owns, the same on every node) says who claims it. This node claims its orphans (a new
   epoch, the epoch file, as any claim) and tells the node (``on_taken(shard, epoch)``), which
   recovers and serves them. A node that comes back later finds its old shards owned by live
   nodes and claims only orphans: nothing is stolen back (rebalancing is later work).

A claim (:meth:`Membership.claim`): read the shard's epoch, ``claim_shard(expected)`` (the
compare-and-set of claim.lua), then create the epoch file ``epochs/<epoch>`` with ``O_EXCL``
(core/cluster/epochs.py). ``EpochTaken`` means Redis handed out an epoch that is already on
disk (a Sentinel failover lost a grant): Redis is raised to the highest epoch on disk
(``set_epoch_at_least``) and the claim runs again. Only then is the shard owned
(``on_owned(shard, epoch)``).

Self-fencing (section 11). The lease is valid until ``lease_ms`` after the last successful
renewal was *sent* (Redis extends it when it runs the renewal, later than that), measured on
this process's monotonic clock (the injected :class:`~core.clock.Clock`). A renewal Redis
refuses, or a reply that comes back when ``lease_ms`` has passed since the last successful one
(even an OK: others may have seen the lease expire meanwhile), or no successful renewal for
``lease_ms`` at all (a timer, for a Redis that does not answer) fences the node: it stops
claiming, drops every owned shard without writing (``on_fenced(reason)``; the node closes its
shards and client connections) and later :meth:`Membership.rejoin`\\ s with a new incarnation.
:meth:`Membership.holds_lease` is the check before acknowledging anything.

A clean :meth:`Membership.stop` (after the node closed its shards, i.e. after their last fsync)
writes ``epochs/<e>.closed`` for each owned shard, so the next owner continues the segment
(section 5.4), and releases the lease, so the next process of this node need not wait for it.

Not thread-safe: one event loop. Epoch files are written in a worker thread (fsyncs on a
shared filesystem can be slow; the loop keeps renewing meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from redis import exceptions as redis_errors

from core.clock import Clock, LoopClock, Timer
from core.cluster import epochs
from core.cluster.epochs import EpochClaim, EpochTaken
from core.cluster.layout import ClusterLayout
from core.cluster.redis_metadata import (
    REFUSED_EPOCH,
    REFUSED_LEASE,
    ClaimRefused,
    RedisMetadata,
    ShardOwner,
)
from core.cluster.settings import ClusterSettings

log = logging.getLogger(__name__)

# How long start() waits for expect_nodes nodes. Workers of one supervisor start within
# seconds; nodes on separate machines are started by hand or by an orchestrator, so a
# minute, after which the node exits with an error naming the live nodes, rather than hang.
FORMATION_WAIT_MS: Final = 60_000
# How often start() looks for the other nodes while it waits (one SCAN + GETs).
FORMATION_POLL_MS: Final = 100
# A previous incarnation's lease expires at most lease_ms after its last renewal; waiting
# twice that also covers one that ran with a longer lease_ms. Still held then: another process
# is serving as this node, and this one must not (LeaseHeld).
LEASE_WAIT_LEASES: Final = 2
# Claim attempts per shard: each retry follows a lost compare-and-set (another claimer moved
# the epoch) or an epoch file already on disk; more than a few means something else is racing.
MAX_CLAIM_ATTEMPTS: Final = 8
# How long after the first of the other nodes' leases read last can expire (their PTTL) a
# node looks for orphaned shards again (issue 23): Redis has expired it by then, and a dead
# node's shards are taken within this of its lease's expiry, not a fixed poll's period later
# (four readings of the live nodes and the ownership table a heartbeat cost an idle cluster
# ~1-2% of a core per node). At most heartbeat_ms apart, for a lease released by a clean stop.
TAKEOVER_AFTER_EXPIRY_MS: Final = 5
# What a Redis that cannot be reached raises; a renewal that fails so is retried at the next
# heartbeat, and the lease timer fences the node if none succeeds within lease_ms.
_REDIS_ERRORS: Final = (redis_errors.RedisError, OSError)

OnOwned = Callable[[int, int], None]
OnTaken = Callable[[int, int], None]
OnFenced = Callable[[str], None]


class FormationTimeout(TimeoutError):
    """Fewer than ``expect_nodes`` nodes held leases when the wait ran out."""

    def __init__(self, expect_nodes: int, live: list[str], waited_ms: int) -> None:
        super().__init__(f"waited {waited_ms} ms for {expect_nodes} nodes; live: {live or 'none'}")
        self.expect_nodes = expect_nodes
        self.live = live


class NotMember(RuntimeError):
    """The call needs a started, unfenced membership."""


@dataclass(frozen=True, slots=True)
class NodeAddresses:
    """What a node registers in ``node:<id>`` (section 4): how others and clients reach it.
    Empty strings for what it does not serve."""

    host: str  # the advertised host
    grpc: str = ""  # host:port of its gRPC server (section 7)
    kafka: str = ""  # host:port advertised to Kafka clients
    kafka_tls: str = ""  # the TLS twin

    def fields(self) -> dict[str, str]:
        return {
            "host": self.host,
            "grpc": self.grpc,
            "kafka": self.kafka,
            "kafka_tls": self.kafka_tls,
            "pid": str(os.getpid()),
        }


def node_order(node_id: str) -> tuple[int, int, str]:
    """The sort key of node ids: numerically when they are integers ("2" before "10"), those
    before the others, which sort as strings."""
    if node_id.isdigit():
        return (0, int(node_id), node_id)
    return (1, 0, node_id)


def plan(live: Iterable[str], shards: int) -> list[str]:
    """Shard ``n``'s planned owner, ``sorted(live)[n % len(live)]`` (section 5.1): every node
    computes the same from the same live set."""
    ordered = sorted(set(live), key=node_order)
    if not ordered:
        raise ValueError("a plan needs at least one live node")
    return [ordered[shard % len(ordered)] for shard in range(shards)]


def takeover_plan(
    live: Iterable[str], owners: Mapping[int, str | None], orphans: Iterable[int]
) -> dict[int, str]:
    """Who takes each orphaned shard (issue 23): in shard order, the live node owning the
    fewest shards then (``owners``: the recorded owner of each shard; ties go by
    :func:`node_order`). Every node computes the same from the same reading, and claims made as
    planned leave the rest of the plan unchanged (each claimed shard moves one to the node the
    plan counted it for), so nodes reading between each other's claims still agree. It balances
    the totals: a node that came back owning nothing gets the next orphans first."""
    ordered = sorted(set(live), key=node_order)
    if not ordered:
        raise ValueError("a plan needs at least one live node")
    load = dict.fromkeys(ordered, 0)
    for owner in owners.values():
        if owner in load:
            load[owner] += 1
    taken: dict[int, str] = {}
    for shard in sorted(orphans):
        node = min(ordered, key=lambda candidate: (load[candidate], node_order(candidate)))
        taken[shard] = node
        load[node] += 1
    return taken


class Membership:
    """One node's place in the cluster: its lease and the shards it owns (module docstring)."""

    def __init__(
        self,
        metadata: RedisMetadata,
        layout: ClusterLayout,
        node_id: str,
        addresses: NodeAddresses,
        settings: ClusterSettings | None = None,
        *,
        clock: Clock | None = None,
        on_owned: OnOwned | None = None,
        on_fenced: OnFenced | None = None,
        on_taken: OnTaken | None = None,
        formation_wait_ms: int = FORMATION_WAIT_MS,
    ) -> None:
        if metadata.cluster_id != layout.cluster_id:
            raise ValueError(
                f"the metadata is cluster {metadata.cluster_id}'s, the root {layout.root} is "
                f"cluster {layout.cluster_id}'s"
            )
        if metadata.shards != layout.shards:
            raise ValueError(f"the metadata has {metadata.shards} shards, the root {layout.shards}")
        self.metadata = metadata
        self.layout = layout
        self.node_id = node_id
        self.addresses = addresses
        self.settings = settings or ClusterSettings()
        self.formation_wait_ms = formation_wait_ms
        self._clock = clock or LoopClock()
        self._on_owned = on_owned
        self._on_fenced = on_fenced
        self._on_taken = on_taken
        self._incarnation: int | None = None
        # The incarnation whose join finished (its claims made): takeover runs only then, or a
        # node waiting for the formation would take every shard as an orphan.
        self._joined: int | None = None
        self._taker: asyncio.Task[None] | None = None
        # The live nodes (id, incarnation) of the last reading that found no orphan: while
        # they are the same, no shard can be one (take_over skips the ownership table).
        self._quiet_live: frozenset[tuple[str, int]] | None = None
        # When the first of the other nodes' leases read last can expire (the clock's ms).
        self._next_expiry_ms: float | None = None
        self._owned: dict[int, int] = {}  # shard -> epoch, made real by its epoch file
        # When the last successful renewal was sent; None while no lease is counted (before
        # the first renewal of a join, after a fence or a stop).
        self._last_ok_ms: float | None = None
        self._lease_timer: Timer | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._fenced = False
        self._fence_reason: str | None = None
        self._stopped = False

    # -- what it knows ---------------------------------------------------------------------

    @property
    def incarnation(self) -> int | None:
        """This incarnation's number (a new one after each :meth:`rejoin`); None before
        :meth:`start`."""
        return self._incarnation

    @property
    def owned(self) -> dict[int, int]:
        """The owned shards with their epochs (a copy)."""
        return dict(self._owned)

    @property
    def fenced(self) -> bool:
        return self._fenced

    @property
    def fence_reason(self) -> str | None:
        return self._fence_reason

    def holds_lease(self) -> bool:
        """Whether this node may act as the owner of its shards now: started, not fenced, not
        stopped, and less than ``lease_ms`` since the last successful renewal was sent. The check
        before acknowledging anything (section 11); it fences the node when the time is up."""
        if self._last_ok_ms is None or self._fenced or self._stopped:
            return False
        if self._clock.now_ms() - self._last_ok_ms >= self.settings.lease_ms:
            self._fence(f"no lease renewal succeeded within lease_ms ({self.settings.lease_ms})")
            return False
        return True

    # -- joining ---------------------------------------------------------------------------

    async def start(self, *, formed: bool = False) -> dict[int, int]:
        """Register, take the lease, wait for ``expect_nodes`` nodes (not when the cluster is
        known to have ``formed``: a drained node joining again), claim this node's shards;
        returns the owned shards with their epochs. Raises :class:`FormationTimeout` or
        ``LeaseHeld`` (nothing owned; the lease, if taken, is released)."""
        if self._incarnation is not None:
            raise NotMember("start() runs once; after a fence, rejoin()")
        await self._join(wait_for_formation=not formed)
        return self.owned

    async def rejoin(self) -> dict[int, int]:
        """After a fence: a new incarnation, a new lease, and claims again (the shards recorded
        as this node's come back at new epochs; the plan's unowned ones if ``expect_nodes``
        nodes are live). Does not wait for the other nodes: the cluster formed already."""
        if not self._fenced or self._stopped:
            raise NotMember("rejoin() follows a fence")
        await self._cancel_renewer()
        old = self._incarnation
        if old is not None:
            # Dropping the old incarnation's lease lets this node take a new one at once
            # instead of waiting lease_ms for it: safe, the old one owns nothing any more and
            # the epoch files fence whatever it still had open.
            with contextlib.suppress(*_REDIS_ERRORS):
                await self.metadata.release_lease(self.node_id, old)
        self._last_ok_ms = None
        self._fenced = False
        self._fence_reason = None
        await self._join(wait_for_formation=False)
        return self.owned

    async def _join(self, *, wait_for_formation: bool) -> None:
        settings = self.settings
        incarnation = await self.metadata.register_node(self.node_id, self.addresses.fields())
        self._incarnation = incarnation
        try:
            await self.metadata.acquire_lease(
                self.node_id,
                incarnation,
                settings.lease_ms,
                wait_ms=LEASE_WAIT_LEASES * settings.lease_ms,
            )
            # The lease's validity is counted from a renewal whose send time is known (the take
            # above may have waited and retried): one renewal now starts the count.
            sent_ms = self._clock.now_ms()
            if not await self.metadata.renew_lease(self.node_id, incarnation, settings.lease_ms):
                raise NotMember(f"node {self.node_id}'s lease was lost right after it was taken")
            self._last_ok_ms = sent_ms
            self._arm_lease_timer()
            self._renewer = asyncio.get_running_loop().create_task(
                self._renew_forever(incarnation), name=f"braid-lease-{self.node_id}"
            )
            log.info(
                "node %s: incarnation %d holds its lease (lease_ms %d, heartbeat_ms %d)",
                self.node_id,
                incarnation,
                settings.lease_ms,
                settings.heartbeat_ms,
            )
            live = await self._live_for_plan(wait=wait_for_formation)
            await self._claim_mine(live, incarnation)
            self._joined = incarnation
            if settings.takeover:
                self._taker = asyncio.get_running_loop().create_task(
                    self._take_over_forever(incarnation), name=f"braid-takeover-{self.node_id}"
                )
        except BaseException as error:
            if self._incarnation == incarnation and not self._fenced:
                await self._leave(incarnation, error)
            raise

    async def _leave(self, incarnation: int, error: BaseException) -> None:
        """Give up after a failed join: stop renewing, drop the lease, own nothing. The node is
        then as after a fence (without telling on_fenced: it never served): rejoin() may try
        again."""
        self._fenced = True
        self._fence_reason = f"joining failed: {error!r}"
        self._last_ok_ms = None
        self._disarm_lease_timer()
        await self._cancel_renewer()
        self._owned.clear()
        with contextlib.suppress(*_REDIS_ERRORS):
            await self.metadata.release_lease(self.node_id, incarnation)

    async def _live_for_plan(self, *, wait: bool) -> list[str] | None:
        """The live node ids once ``expect_nodes`` hold leases; without ``wait``, None when
        fewer do (then only the shards recorded as this node's are claimed)."""
        expect = self.settings.expect_nodes
        started_ms = self._clock.now_ms()
        logged: list[str] | None = None
        while True:
            live = sorted(await self.metadata.live_nodes(), key=node_order)
            if len(live) >= expect:
                return live
            if not wait:
                return None
            waited_ms = self._clock.now_ms() - started_ms
            if waited_ms >= self.formation_wait_ms:
                raise FormationTimeout(expect, live, int(waited_ms))
            if live != logged:  # log each change of the live set, not every poll
                log.info(
                    "node %s: waiting for %d nodes (expect_nodes); live: %s",
                    self.node_id,
                    expect,
                    ", ".join(live) or "none",
                )
                logged = live
            await self._sleep_ms(FORMATION_POLL_MS)

    async def _claim_mine(self, live: list[str] | None, incarnation: int) -> None:
        """Claim the shards recorded as this node's, and the plan's for it that nobody owns."""
        records = await self.metadata.shard_owners()
        planned = plan(live, self.layout.shards) if live is not None else None
        targets: list[int] = []
        for shard in range(self.layout.shards):
            record = records.get(shard)
            owner = record.owner if record is not None else None
            if owner == self.node_id or (
                owner is None and planned is not None and planned[shard] == self.node_id
            ):
                targets.append(shard)
        log.info(
            "node %s: claiming shards %s (live nodes: %s)",
            self.node_id,
            targets,
            ", ".join(live) if live is not None else f"fewer than {self.settings.expect_nodes}",
        )
        for shard in targets:
            record = records.get(shard)
            if self._incarnation != incarnation or self._fenced:
                return
            try:
                await self._claim(shard, record, incarnation)
            except NotMember:  # fenced meanwhile: on_fenced told the node
                return
            except ClaimRefused as refused:
                if refused.reason == REFUSED_LEASE:
                    return  # _claim fenced the node
                # Another node won the shard meanwhile (a different plan from a racing start).
                log.warning("node %s: shard %d not claimed: %s", self.node_id, shard, refused)

    # -- claiming --------------------------------------------------------------------------

    async def claim(self, shard: int) -> int:
        """Claim ``shard`` for this node whoever has it recorded (refused by Redis while another
        node's lease lives: :class:`ClaimRefused`); returns the new epoch. A shard this node
        already owns is claimed again at a new epoch."""
        incarnation = self._incarnation
        if incarnation is None or not self.holds_lease():
            raise NotMember(f"node {self.node_id} holds no lease: start() or rejoin() first")
        record = (await self.metadata.shard_owners()).get(shard)
        return await self._claim(shard, record, incarnation)

    async def _claim(self, shard: int, record: ShardOwner | None, incarnation: int) -> int:
        """Section 5.2: the compare-and-set in Redis, then the epoch file that makes it real."""
        shard_dir = self.layout.shard_dir(shard)
        expected = record.epoch if record is not None else 0
        for _ in range(MAX_CLAIM_ATTEMPTS):
            try:
                epoch = await self.metadata.claim_shard(shard, self.node_id, incarnation, expected)
            except ClaimRefused as refused:
                if refused.reason == REFUSED_LEASE:
                    self._fence(f"a claim found the lease gone: {refused}")
                if refused.reason != REFUSED_EPOCH:
                    raise
                expected = refused.epoch  # someone claimed or raised it meanwhile: again
                continue
            self._check_still(incarnation, shard)
            claim = EpochClaim(
                node=self.node_id,
                incarnation=incarnation,
                claimed_ms=self._clock.wall_ms(),
                # Where the owner starts writing and what it sealed come from opening the
                # shard's log after this file exists (section 5.2/5.4); the log's integration
                # fills them. 0 and none until then: no reader bounds anything by this file.
                start=0,
            )
            try:
                await asyncio.to_thread(epochs.claim_epoch, shard_dir, epoch, claim)
            except EpochTaken:
                highest = await asyncio.to_thread(epochs.highest_epoch, shard_dir)
                assert highest is not None  # the file that was in the way
                expected = await self.metadata.set_epoch_at_least(shard, highest)
                log.warning(
                    "node %s: shard %d epoch %d was already on disk (a lost grant?); Redis "
                    "raised to %d, claiming again",
                    self.node_id,
                    shard,
                    epoch,
                    expected,
                )
                continue
            self._check_still(incarnation, shard)
            self._owned[shard] = epoch
            log.info("node %s: owns shard %d at epoch %d", self.node_id, shard, epoch)
            if self._on_owned is not None:
                try:
                    self._on_owned(shard, epoch)
                except Exception:
                    log.exception("on_owned(%d, %d) failed", shard, epoch)
            return epoch
        raise ClaimRefused(shard, f"epoch kept moving: {MAX_CLAIM_ATTEMPTS} attempts lost")

    def _check_still(self, incarnation: int, shard: int) -> None:
        """A claim that finishes after a fence (or a rejoin) is not used: the epoch it made
        fences nobody who matters, and the next claim goes past it."""
        if self._incarnation != incarnation or self._fenced or self._stopped:
            raise NotMember(f"node {self.node_id} was fenced while claiming shard {shard}")

    # -- taking over (issue 23) -------------------------------------------------------------

    async def _take_over_forever(self, incarnation: int) -> None:
        """Claim this node's share of the orphaned shards (module docstring, step 5): at the
        first expiry of a lease read last (plus :data:`TAKEOVER_AFTER_EXPIRY_MS`), at most
        ``heartbeat_ms`` apart; a failed reading of Redis is tried again at the next check."""
        while self._active(incarnation):
            delay_ms: float = self.settings.heartbeat_ms
            if self._next_expiry_ms is not None:
                due_ms = self._next_expiry_ms + TAKEOVER_AFTER_EXPIRY_MS - self._clock.now_ms()
                delay_ms = max(min(delay_ms, due_ms), TAKEOVER_AFTER_EXPIRY_MS)
            await self._sleep_ms(delay_ms)
            if not self._active(incarnation) or not self.holds_lease():
                return
            try:
                await self.take_over(incarnation)
            except _REDIS_ERRORS as error:
                log.warning("node %s: looking for orphaned shards failed: %s", self.node_id, error)

    def _active(self, incarnation: int) -> bool:
        return (
            self._joined == incarnation
            and self._incarnation == incarnation
            and not self._fenced
            and not self._stopped
        )

    async def take_over(self, incarnation: int) -> dict[int, int]:
        """Claim the orphaned shards (no owner, or an owner without a lease) that
        :func:`takeover_plan` over the live nodes gives this node; returns those claimed with
        their epochs (each also told to ``on_taken``)."""
        # A reading that fails leaves no expiry to wait for: the next check is a heartbeat
        # later, not a retry at once (a Redis that is down would be asked in a tight loop).
        self._next_expiry_ms = None
        nodes = await self.metadata.live_nodes()
        read_ms = self._clock.now_ms()  # after the PTTLs were read: the expiries not before
        left = [
            info.lease_left_ms
            for info in nodes.values()
            if info.node_id != self.node_id and info.lease_left_ms is not None
        ]
        self._next_expiry_ms = read_ms + min(left) if left else None
        live = sorted(nodes, key=node_order)
        holders = frozenset((info.node_id, info.incarnation) for info in nodes.values())
        if holders == self._quiet_live:
            return {}  # nobody came, left or restarted since a reading found no orphan
        records = await self.metadata.shard_owners()
        owners = {shard: record.owner for shard, record in records.items()}
        orphaned = [
            shard
            for shard in range(self.layout.shards)
            if owners.get(shard) is None or owners.get(shard) not in live
        ]
        self._quiet_live = holders if not orphaned and self.node_id in live else None
        if not orphaned or self.node_id not in live:
            return {}
        planned = takeover_plan(live, owners, orphaned)
        mine = [shard for shard in orphaned if planned[shard] == self.node_id]
        if not mine:
            return {}
        log.warning(
            "node %s: taking over shards %s (orphaned: %s; live nodes: %s)",
            self.node_id,
            mine,
            orphaned,
            ", ".join(live),
        )
        taken: dict[int, int] = {}
        for shard in mine:
            if not self._active(incarnation):
                break
            try:
                epoch = await self._claim(shard, records.get(shard), incarnation)
            except NotMember:
                break
            except ClaimRefused as refused:
                if refused.reason == REFUSED_LEASE:
                    break  # _claim fenced the node
                # Another node's claim won (its plan saw other live nodes): it serves it.
                log.info("node %s: shard %d not taken over: %s", self.node_id, shard, refused)
                continue
            taken[shard] = epoch
            if self._on_taken is not None:
                try:
                    self._on_taken(shard, epoch)
                except Exception:
                    log.exception("on_taken(%d, %d) failed", shard, epoch)
        return taken

    # -- the lease -------------------------------------------------------------------------

    async def _renew_forever(self, incarnation: int) -> None:
        settings = self.settings
        while not self._fenced and not self._stopped:
            await self._sleep_ms(settings.heartbeat_ms)
            sent_ms = self._clock.now_ms()
            try:
                renewed = await self.metadata.renew_lease(
                    self.node_id, incarnation, settings.lease_ms
                )
            except _REDIS_ERRORS as error:
                # Retried at the next heartbeat; the lease timer fences if none succeeds.
                log.warning("node %s: lease renewal failed: %s", self.node_id, error)
                continue
            if self._fenced or self._stopped or self._incarnation != incarnation:
                return
            if not renewed:
                self._fence("the lease expired or another incarnation holds it")
                return
            assert self._last_ok_ms is not None  # counted before this task started
            late_ms = self._clock.now_ms() - self._last_ok_ms
            if late_ms >= settings.lease_ms:
                # Redis renewed it, but this node cannot tell whether the lease lapsed between
                # (others judge by Redis's clock): it must assume it did.
                self._fence(
                    f"a renewal came back {late_ms:.0f} ms after the last successful one, "
                    f"past lease_ms ({settings.lease_ms})"
                )
                return
            self._last_ok_ms = sent_ms
            self._arm_lease_timer()

    def _arm_lease_timer(self) -> None:
        """Fence at ``lease_ms`` after the last successful renewal was sent, whether or not a
        reply ever comes."""
        self._disarm_lease_timer()
        if self._last_ok_ms is None:
            return
        due_ms = self._last_ok_ms + self.settings.lease_ms - self._clock.now_ms()
        self._lease_timer = self._clock.call_later(due_ms, self._lease_ran_out)

    def _disarm_lease_timer(self) -> None:
        if self._lease_timer is not None:
            self._lease_timer.cancel()
            self._lease_timer = None

    def _lease_ran_out(self) -> None:
        self._lease_timer = None
        if self._fenced or self._stopped or self._last_ok_ms is None:
            return
        if self._clock.now_ms() - self._last_ok_ms >= self.settings.lease_ms:
            self._fence(f"no lease renewal succeeded within lease_ms ({self.settings.lease_ms})")
        else:
            self._arm_lease_timer()

    def _fence(self, reason: str) -> None:
        """Section 11: stop claiming, drop every shard without writing, tell the node."""
        if self._fenced or self._stopped:
            return
        self._fenced = True
        self._fence_reason = reason
        self._last_ok_ms = None
        self._disarm_lease_timer()
        dropped, self._owned = self._owned, {}
        for task in (self._renewer, self._taker):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
        log.warning(
            "node %s: fenced (incarnation %s): %s; dropped shards %s",
            self.node_id,
            self._incarnation,
            reason,
            sorted(dropped),
        )
        if self._on_fenced is not None:
            try:
                self._on_fenced(reason)
            except Exception:
                log.exception("on_fenced failed")

    async def _cancel_renewer(self) -> None:
        renewer, self._renewer = self._renewer, None
        if renewer is None or renewer is asyncio.current_task():
            return
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError, *_REDIS_ERRORS):
            await renewer

    async def _sleep_ms(self, delay_ms: float) -> None:
        """Sleep on the injected clock (a test's ManualClock moves it)."""
        woken = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not woken.done():
                woken.set_result(None)

        timer = self._clock.call_later(delay_ms, wake)
        try:
            await woken
        finally:
            timer.cancel()

    # -- leaving ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """A clean stop, once the node has closed its shards (after their last fsync): mark
        each owned epoch closed (unless a newer owner exists or the lease ran out), then release
        the lease. A fenced node only stops renewing: it has nothing to close."""
        if self._stopped:
            return
        incarnation = self._incarnation
        taker, self._taker = self._taker, None
        if taker is not None:  # no claim may start while the owned shards are closed
            taker.cancel()
            # Bounded: a Redis call stuck past its cancellation must not keep the node up.
            await asyncio.wait({taker}, timeout=self.settings.heartbeat_ms / 1000)
        for shard, epoch in sorted(self._owned.items()):
            if not self.holds_lease():  # fenced meanwhile: the shards are not ours to close
                break
            shard_dir = self.layout.shard_dir(shard)
            if await asyncio.to_thread(epochs.is_fenced, shard_dir, epoch):
                log.warning(
                    "node %s: shard %d has an owner past epoch %d: not marked closed",
                    self.node_id,
                    shard,
                    epoch,
                )
                continue
            await asyncio.to_thread(epochs.mark_closed, shard_dir, epoch)
        self._stopped = True
        self._disarm_lease_timer()
        await self._cancel_renewer()
        self._owned.clear()
        if incarnation is not None and not self._fenced:
            try:
                await self.metadata.release_lease(self.node_id, incarnation)
            except _REDIS_ERRORS as error:  # it expires by itself within lease_ms
                log.warning("node %s: could not release its lease: %s", self.node_id, error)
        log.info("node %s: stopped (incarnation %s)", self.node_id, incarnation)
