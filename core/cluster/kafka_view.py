"""MembershipView: a cluster node's :class:`~core.api.cluster.ClusterView`, what Kafka clients are
told about the cluster (docs/cluster.md section 8), read from the membership and the ownership
table in Redis (section 4) and answered from memory.

What it reads, at :meth:`MembershipView.start` and when asked (:meth:`MembershipView.refresh`),
and every ``heartbeat_ms`` in a task, which reads the ownership table only when it may have
changed (:meth:`MembershipView.refresh_if_changed`):

- ``RedisMetadata.live_nodes()``: the nodes holding a lease, with what they registered
  (``core/cluster/membership.py:NodeAddresses``: ``kafka`` and ``kafka_tls`` as ``host:port``,
  ``[v6]:port`` for an IPv6 host). A live node with an integer id and a Kafka address is a
  broker while it owns a shard (a standby has no listeners); this node always is one (its
  listener knows its own address, so the gateway gives that to its clients).
- ``RedisMetadata.shard_owners()``: per shard its owner, incarnation and epoch. A shard's owner
  counts only while that very incarnation holds the node's lease: a record left by a node that
  died, or by an earlier incarnation that has not claimed back yet, names no leader.

A partition's shard is its recorded placement (``place:partition`` in the metadata's cache,
then the node's :class:`~core.cluster.placement.Placements`), else the rule
``(h(topic) + q) % S``; a group's and a transactional id's likewise (``h(id) % S``). Leader =
the shard's live owner, leader epoch = the shard's epoch (it only grows, as Kafka requires).

Only a claim moves a shard, and every claim (a join, a rejoin, a takeover) is of a shard without
a live owner or by a node whose incarnation is new: so while the live nodes (ids, incarnations)
are those of the last reading and that reading found a live owner for every shard, the task
answers from the owners read then (a node gone since leads nothing at once: the live nodes are
read each time). An idle node's view reads one SCAN and a GET, HGETALL and PTTL per node a
heartbeat, not also an HGETALL per shard; every :data:`FULL_READ_EVERY` heartbeats it reads the
table anyway.

Metadata requests never wait for Redis: a failed refresh keeps the last answers (logged), and
each successful one starts a new :class:`~core.api.cluster.LeaderTable`, so a request sees one
refresh's answers throughout.

The same refresh answers who owns a shard for the node's forwarding (:meth:`owner_address`:
the live owner's gRPC address, registered as ``grpc``, and its epoch), which
core/cluster/owners.py's :class:`~core.cluster.owners.ViewOwners` hands to the
:class:`~core.cluster.rpc.forward.Forwarder` as its :class:`~core.broker.remote.ShardOwners`.

Wiring (core/cluster/node_runner.py ``ClusterServing``, a cluster node): after
``ClusterNode.join()``, ``view = MembershipView(node.metadata, node.node_id)``,
``await view.start()``, ``api.set_cluster_view(view)``; at stop, ``await view.stop()`` before
``node.stop()``.

Not thread-safe: the node's event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Final

from redis import exceptions as redis_errors

from core.api.cluster import (
    COORDINATOR_GROUP,
    COORDINATOR_TXN,
    BrokerNode,
    LeaderTable,
    PartitionLeader,
)
from core.broker.remote import OwnerAddress
from core.cluster.placement import (
    PLACE_GROUP,
    PLACE_PARTITION,
    PLACE_TXN,
    Placements,
    partition_key,
)
from core.cluster.redis_metadata import PLACE_PREFIX, NodeInfo, RedisMetadata, ShardOwner

log = logging.getLogger(__name__)

# The placement kind of each coordinator kind (section 3's table).
_COORDINATOR_PLACEMENTS: Final = {COORDINATOR_GROUP: PLACE_GROUP, COORDINATOR_TXN: PLACE_TXN}
# What a refresh that cannot reach Redis raises; the last answers stay.
_REDIS_ERRORS: Final = (redis_errors.RedisError, OSError)
# Kafka broker ids are int32.
_MAX_NODE_ID: Final = 2**31 - 1
# The periodic refresh reads the ownership table at least once in this many heartbeats, even
# when nothing says it changed (a safety net: a claim of a shard a live node owns, which no
# node makes today, would otherwise go unseen until a node comes or goes).
FULL_READ_EVERY: Final = 10


def parse_address(text: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6 host]:port`` as registered; None when empty or malformed."""
    host, separator, port = text.rpartition(":")
    if not separator or not host or not port.isdigit():
        return None
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def kafka_id(node_id: str) -> int | None:
    """The Kafka broker id of a membership node id, or None when it is not an int32."""
    if not node_id.isdigit():
        return None
    number = int(node_id)
    return number if number <= _MAX_NODE_ID else None


def broker_of(info: NodeInfo) -> BrokerNode | None:
    """The broker a live node registered, or None (no integer id, or no Kafka listener)."""
    node_id = kafka_id(info.node_id)
    plain = parse_address(info.fields.get("kafka", ""))
    if node_id is None or plain is None:
        return None
    tls = parse_address(info.fields.get("kafka_tls", ""))
    return BrokerNode(node_id, plain[0], plain[1], tls[1] if tls is not None else None)


def live_leaders(
    live: Mapping[str, NodeInfo], owners: Mapping[int, ShardOwner]
) -> dict[int, PartitionLeader]:
    """Shard -> its leader, for the shards whose recorded owner incarnation holds its lease."""
    leaders: dict[int, PartitionLeader] = {}
    for shard, record in owners.items():
        if record.owner is None:
            continue
        node = live.get(record.owner)
        node_id = kafka_id(record.owner)
        if node is None or node_id is None or node.incarnation != record.incarnation:
            continue
        leaders[shard] = PartitionLeader(node_id, record.epoch)
    return leaders


def owner_addresses(
    live: Mapping[str, NodeInfo],
    owners: Mapping[int, ShardOwner],
    leaders: Mapping[int, PartitionLeader],
) -> dict[int, OwnerAddress]:
    """Shard -> its live owner's gRPC address (registered ``grpc``) and epoch, for the
    shards :func:`live_leaders` found a leader for."""
    found: dict[int, OwnerAddress] = {}
    for shard, leader in leaders.items():
        record = owners[shard]
        node = live.get(record.owner) if record.owner is not None else None
        address = node.fields.get("grpc", "") if node is not None else ""
        if address:
            found[shard] = OwnerAddress(leader.node_id, address, leader.epoch)
    return found


class MembershipView:
    """A cluster node's view for Kafka clients (module docstring)."""

    def __init__(
        self,
        metadata: RedisMetadata,
        node_id: int,
        placements: Placements | None = None,
        *,
        refresh_ms: int | None = None,
    ) -> None:
        if not 0 <= node_id <= _MAX_NODE_ID:
            raise ValueError(f"a Kafka broker id is an int32 >= 0, not {node_id}")
        self._metadata = metadata
        self._node_id = node_id
        self._placements = placements if placements is not None else Placements(metadata.shards)
        self._refresh_s = (refresh_ms if refresh_ms is not None else metadata.heartbeat_ms) / 1000
        self._brokers: tuple[BrokerNode, ...] = (BrokerNode(node_id, "", 0),)
        self._leaders: dict[int, PartitionLeader] = {}
        self._owners: dict[int, OwnerAddress] = {}
        self._table = LeaderTable(self._lookup_leader)
        self._task: asyncio.Task[None] | None = None
        self._refreshes = 0
        # Told each refresh's live nodes (id -> the incarnation holding its lease): what the
        # node lets go of for nodes that died or restarted (remote_queues.py's held gets).
        self.on_refresh: Callable[[Mapping[str, int]], object] | None = None
        self._owner_readings = 0
        # The last reading of the ownership table, the live nodes (id, incarnation) it was read
        # with, and how many refreshes since have used it.
        self._read_owners: Mapping[int, ShardOwner] = {}
        self._read_with: frozenset[tuple[str, int]] | None = None
        self._reused = 0

    @property
    def refreshes(self) -> int:
        """How many refreshes have succeeded (each one a new leader table)."""
        return self._refreshes

    @property
    def owner_readings(self) -> int:
        """How many times the ownership table was read (one HGETALL per shard)."""
        return self._owner_readings

    # -- ClusterView ---------------------------------------------------------------------------

    def this_node(self) -> int:
        return self._node_id

    def brokers(self) -> Sequence[BrokerNode]:
        return self._brokers

    def partition_leader(self, topic: str, partition: int) -> PartitionLeader | None:
        return self._table[topic, partition]

    def coordinator(self, kind: str, key: str) -> int | None:
        leader = self._leaders.get(self._shard_of(_COORDINATOR_PLACEMENTS[kind], key))
        return leader.node_id if leader is not None else None

    def leader_table(self) -> LeaderTable | None:
        return self._table

    # -- forwarding ----------------------------------------------------------------------------

    def owner_address(self, shard: int) -> OwnerAddress | None:
        """Shard ``shard``'s live owner as of the last refresh: its id, gRPC address and the
        shard's epoch; None without a live owner that registered a gRPC address."""
        return self._owners.get(shard)

    # -- refreshing ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Read Redis once (errors propagate: a node must not start on no view), then keep
        refreshing every ``refresh_ms`` in a task."""
        await self.refresh()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._refresh_forever(), name=f"braid-kafka-view-{self._node_id}"
            )

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def refresh(self) -> None:
        """Read the live nodes and the shard owners now, and answer from them."""
        live = await self._metadata.live_nodes()
        self._answer_from(live, await self._read_owners_now(live))

    async def refresh_if_changed(self) -> None:
        """Read the live nodes now, and the shard owners only when they may have changed since
        the last reading (module docstring); answer from them."""
        live = await self._metadata.live_nodes()
        holders = frozenset((info.node_id, info.incarnation) for info in live.values())
        if (
            holders == self._read_with
            and self._reused + 1 < FULL_READ_EVERY
            and len(live_leaders(live, self._read_owners)) == self._metadata.shards
        ):
            self._reused += 1
            self._answer_from(live, self._read_owners)
            return
        self._answer_from(live, await self._read_owners_now(live))

    async def _read_owners_now(self, live: Mapping[str, NodeInfo]) -> Mapping[int, ShardOwner]:
        owners = await self._metadata.shard_owners()
        self._read_owners = owners
        self._read_with = frozenset((info.node_id, info.incarnation) for info in live.values())
        self._reused = 0
        self._owner_readings += 1
        return owners

    def _answer_from(self, live: Mapping[str, NodeInfo], owners: Mapping[int, ShardOwner]) -> None:
        leaders = live_leaders(live, owners)
        # A standby (it owns no shard) has no listeners: it is no broker to a client.
        serving = {leader.node_id for leader in leaders.values()}
        brokers = {self._node_id: BrokerNode(self._node_id, "", 0)}
        for info in live.values():
            broker = broker_of(info)
            if broker is not None and broker.node_id != self._node_id and broker.node_id in serving:
                brokers[broker.node_id] = broker
        self._brokers = tuple(brokers[node_id] for node_id in sorted(brokers))
        self._leaders = leaders
        self._owners = owner_addresses(live, owners, leaders)
        self._table = LeaderTable(self._lookup_leader)
        self._refreshes += 1
        if self.on_refresh is not None:
            self.on_refresh({node_id: info.incarnation for node_id, info in live.items()})

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            try:
                await self.refresh_if_changed()
            except _REDIS_ERRORS as error:
                log.warning(
                    "node %d: the Kafka view was not refreshed (%s); answering from the last one",
                    self._node_id,
                    error,
                )

    # -- placement -----------------------------------------------------------------------------

    def _lookup_leader(self, topic: str, partition: int) -> PartitionLeader | None:
        return self._leaders.get(self._shard_of(PLACE_PARTITION, partition_key(topic, partition)))

    def _shard_of(self, kind: str, name: str) -> int:
        """The recorded shard (the metadata's cache of ``place:<kind>``, then the node's
        placements), else the kind's rule."""
        recorded = self._metadata.get(PLACE_PREFIX + kind, name)
        if recorded is not None:
            return int(recorded)
        return self._placements.place(kind, name)
