"""ClusterNode: what makes ``braid serve --cluster URL --node-id ID --data-dir ROOT`` one node of
a cluster (docs/cluster.md sections 2, 5, 9 and 11; steps 4 and 5 of section 15).

:func:`open_root` checks ROOT first, before anything connects anywhere: a single-node data
directory is refused (section 2: `braid cluster init --adopt`), as is a directory that is not a
root, and an adopted root of more than one shard (what the adopted directory defined would have
to be placed in its legacy shard, which is not done yet). A node serves the shards it claimed,
any number of the root's (section 6); the others are other nodes', reached through
:class:`ClusterServing`.

:meth:`ClusterNode.join`:

1. connects the cluster's metadata (:func:`~core.cluster.redis_metadata.connect` with
   ``cluster.json``'s id, so a node never joins the Redis of another root);
2. starts the gRPC server on ``cluster_port`` (0: any free port) with the shared secret;
3. starts :class:`~core.cluster.membership.Membership` with its addresses (advertised host, gRPC
   and Kafka ports): lease, the plan, the claims. It answers the epoch at which this node owns
   its lowest shard, or None: then it is a standby that owns nothing until it takes over a
   dead node's shards (``on_taken(shard, epoch)``, issue 23: the caller opens each with
   :meth:`ClusterNode.open_taken_shard` and serves it).

The owner then opens its shards (:meth:`ClusterNode.open_shards`): each ``ROOT/shards/NNNN`` as
a :class:`~core.log.LogStore` with the storage fence of its epoch (``epochs/<e+1>`` checked at
each group commit, a new segment after an unclean change, section 5), and a
:class:`~core.cluster.split.SplitMetadata` over the cluster's store and the lowest shard's own
:class:`~core.cluster.local.LocalMetadata`. On an adopted root (``legacy_shard`` 0) the
definitions that exist only in the shard's old ``__meta``/``__security``/``__limits`` are copied
into the cluster's store at the first start, once (:meth:`ClusterNode.copy_adopted_definitions`,
under a marker the copy's own apply sets).

Serving (sections 6-8): :class:`ClusterServing` joins a broker built over the owned shards to
the others' (one per serving: a fenced node serves again on a new broker): the Kafka view
(:class:`~core.cluster.kafka_view.MembershipView`, also who owns which shard for forwarding),
the :class:`~core.cluster.rpc.forward.Forwarder` as the broker's ``remote``, the
:class:`~core.cluster.rpc.append.AppendReceiver` and
:class:`~core.cluster.rpc.consume.ConsumeService` behind the gRPC service, and the
:class:`~core.cluster.follow.MetadataFollower` keeping the broker's registries in step with
what other nodes define.

Self-fencing (section 11): Membership calls ``on_fenced(reason)``; the caller (braid/server.py)
drops what it serves without writing (:meth:`ClusterServing.stop` first) and calls
:meth:`ClusterNode.rejoin`. A clean stop: :meth:`ClusterNode.stop` after the shards were closed
(``epochs/<e>.closed``, lease released).

This module builds no broker: core/cluster sits below core/broker, and the process that
assembles the broker and its listeners is braid/server.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Final

from redis import exceptions as redis_errors

from core.broker.remote import SessionCloser
from core.cluster import epochs, layout
from core.cluster.follow import FollowsRemote, MetadataFollower
from core.cluster.kafka_view import MembershipView
from core.cluster.layout import ClusterLayout
from core.cluster.local import LocalMetadata
from core.cluster.membership import (
    FormationTimeout,
    Membership,
    NodeAddresses,
    NotMember,
)
from core.cluster.metadata import (
    KIND_BINDING,
    KIND_LIMIT,
    KIND_QUEUE,
    KIND_SECURITY,
    KIND_TOPIC,
    Change,
    MetadataConflict,
)
from core.cluster.mqtt_cluster import NodeMqttCluster, RetainedAdminCalls, RetainedOverRpc
from core.cluster.mqtt_routes import RouteTable
from core.cluster.mqtt_sessions import SessionRegistry
from core.cluster.mqtt_shares import ShareMembers
from core.cluster.mqtt_wills import WillBook
from core.cluster.owners import ServedShards, ViewOwners
from core.cluster.redis_metadata import LeaseHeld, RedisMetadata, connect
from core.cluster.redis_metadata import _client as redis_client
from core.cluster.remote_queues import (
    GoneNodes,
    QueueAdminCalls,
    RemoteQueuesOverRpc,
    getter_holder,
)
from core.cluster.remote_txn import TxnPublishCalls, TxnPublishOverRpc
from core.cluster.rpc.append import AppendReceiver
from core.cluster.rpc.client import RpcClient
from core.cluster.rpc.consume import ConsumeService
from core.cluster.rpc.fanout import FanoutSender
from core.cluster.rpc.forward import Forwarder
from core.cluster.rpc.options import RpcSettings
from core.cluster.rpc.server import NodeService, RpcServer
from core.cluster.rpc.takeover import MetadataPeers, SessionTakeover
from core.cluster.rpc.txn_markers import TxnMarkerClient, TxnMarkerReceiver
from core.cluster.settings import ClusterSettings
from core.cluster.split import SplitMetadata
from core.log import LogConfig, LogStore

if TYPE_CHECKING:  # (annotations only: this module builds no broker)
    from core.api.partitions import ProducerIdSource
    from core.broker import Node

log = logging.getLogger(__name__)

# The lowest shard, which a node of a root of one shard serves (and an adopted root's legacy
# shard).
SERVED_SHARD: Final = 0
MULTI_SHARD_REFUSAL: Final = "an adopted root's definitions are not placed in many shards yet"
# Why a remote consumer's stream ends when its queue goes away or the node stops serving.
QUEUE_DELETED: Final = "queue deleted"
NOT_SERVING: Final = "the node stopped serving the queue's shard"
# Definitions an adopted shard's old tables may hold that are cluster-wide now (section 3: the
# shard-local kinds, redrive and setting, stay in the shard's log).
ADOPTED_KINDS: Final = (KIND_TOPIC, KIND_BINDING, KIND_QUEUE, KIND_SECURITY, KIND_LIMIT)
# The marker that the adopted definitions were copied: a key of its own kind in the cluster's
# store, set by the same apply as the copies (expecting it absent), so the copy runs once.
ADOPTION_KIND: Final = "adoption"
ADOPTION_KEY: Final = "definitions_copied"
# Hosts that mean "every interface": not something another machine can connect to.
_ANY_HOST: Final = frozenset({"", "0.0.0.0", "::"})
# Failures of a rejoin that are worth another try at the next heartbeat: Redis away, the
# lease still held by the old incarnation, the formation wait.
_REJOIN_ERRORS: Final = (
    redis_errors.RedisError,
    OSError,
    LeaseHeld,
    NotMember,
    FormationTimeout,
)


class NodeRefused(ValueError):
    """The node cannot serve this data directory; the message says why and what to run."""


def open_root(data_dir: Path) -> ClusterLayout:
    """The layout of the root ``data_dir`` a node may serve, else :class:`NodeRefused`."""
    kind = layout.detect(data_dir)
    if kind == "single":
        raise NodeRefused(
            f"data dir {data_dir} is a single-node data directory, not a cluster data root: "
            f"stop its broker and run `braid cluster init --adopt {data_dir}` to make it one "
            "(docs/cluster.md section 2)"
        )
    if kind == "new":
        raise NodeRefused(
            f"data dir {data_dir} is not a cluster data root (no {layout.CLUSTER_FILE}): make "
            f"one with `braid cluster init {data_dir} --shards 1`"
        )
    try:
        found = ClusterLayout.open(data_dir)
    except layout.LayoutError as error:
        raise NodeRefused(str(error)) from None
    if found.shards != 1 and found.legacy_shard is not None:
        raise NodeRefused(
            f"data root {data_dir} adopted a single-node directory into shard "
            f"{found.legacy_shard} and has {found.shards} shards; an adopted root is served "
            f"with one shard (`braid cluster init --adopt D --shards 1`): {MULTI_SHARD_REFUSAL}"
        )
    return found


def advertised(host: str | None, listen_host: str) -> str:
    """The host others are told: ``host`` when given, else the listeners' own host unless it
    means every interface, then this machine's name."""
    if host:
        return host
    if listen_host not in _ANY_HOST:
        return listen_host
    return socket.gethostname()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class ClusterNode:
    """One node's place in the cluster: metadata, gRPC, membership (module docstring)."""

    def __init__(
        self,
        root: ClusterLayout,
        url: str,
        node_id: int,
        settings: ClusterSettings,
        *,
        listen_host: str,
        advertised_host: str | None = None,
        kafka_port: int = 0,
        secret: str | None = None,
        max_message_size: int | None = None,
        on_fenced: Callable[[str], None] | None = None,
        on_taken: Callable[[int, int], None] | None = None,
    ) -> None:
        self.layout = root
        self.url = url
        self.node_id = node_id
        self.settings = settings
        self.listen_host = listen_host
        self.host = advertised(advertised_host, listen_host)
        self.kafka_port = kafka_port
        self._secret = secret
        self._max_message_size = max_message_size
        self._on_fenced = on_fenced
        self._on_taken = on_taken
        self.metadata: RedisMetadata | None = None
        self.membership: Membership | None = None
        self._rpc: RpcServer | None = None
        # The gRPC service (its data calls plugged in by ClusterServing) and this node's
        # client of the others' (forwarding, the cluster-wide HTTP answers).
        self.service: NodeService | None = None
        self.rpc_client: RpcClient | None = None
        self.queue_admin = QueueAdminCalls()
        self.retained_admin = RetainedAdminCalls()  # MQTT retained messages, the same way
        self.txn_admin = TxnPublishCalls()  # half messages of transactions in its shards
        self.rpc_port = 0
        self._stopped = False

    # -- joining ---------------------------------------------------------------------------

    async def join(self, *, formed: bool = False) -> int | None:
        """Connect, start gRPC, join: the epoch at which this node owns the served shard, or
        None (a standby). ``formed``: no wait for ``expect_nodes`` (Membership.start)."""
        settings = self.settings
        self.metadata = metadata = await connect(
            self.url,
            self.layout.cluster_id,
            shards=self.layout.shards,
            metadata_wait_ms=settings.metadata_wait_ms,
            heartbeat_ms=settings.heartbeat_ms,
        )
        secret = self._secret
        if not secret:
            # Every node of the root reads the same id; enough where only the nodes reach the
            # cluster port (loopback, a private network), not a secret across machines.
            secret = self.layout.cluster_id
            log.info("no [cluster] secret: the cluster id authenticates calls between nodes")
        rpc_settings = RpcSettings(
            secret=secret,
            heartbeat_ms=settings.heartbeat_ms,
            rpc_timeout_ms=settings.rpc_timeout_ms,
            **(
                {}
                if self._max_message_size is None
                else {"max_message_size": self._max_message_size}
            ),
        )
        self.service = NodeService(self.node_id, 0)
        # A queue's counts and its declare, asked by the other nodes (core/cluster/
        # remote_queues.py): registered once, pointed at each broker served.
        self.queue_admin.register(self.service)
        self.retained_admin.register(self.service)
        self.txn_admin.register(self.service)
        self.rpc_client = RpcClient(rpc_settings)
        self._rpc = RpcServer(rpc_settings, self.service)
        self.rpc_port = await self._rpc.start(self.listen_host, settings.cluster_port)
        addresses = NodeAddresses(
            host=self.host,
            grpc=_address(self.host, self.rpc_port),
            kafka=_address(self.host, self.kafka_port) if self.kafka_port else "",
        )
        self.membership = membership = Membership(
            metadata,
            self.layout,
            str(self.node_id),
            addresses,
            settings,
            on_fenced=self._fenced,
            on_taken=self._taken,
        )
        owned = await membership.start(formed=formed)
        self.service.incarnation = membership.incarnation or 0
        return self._served(owned)

    def _served(self, owned: dict[int, int]) -> int | None:
        """The epoch of the lowest owned shard, None for a standby (it owns none)."""
        if not owned:
            log.info(
                "node %d owns no shard: standby, no listeners until it takes shards over",
                self.node_id,
            )
            return None
        if len(owned) != self.layout.shards:
            log.info(
                "node %d serves shards %s of %d; the others are other nodes'",
                self.node_id,
                sorted(owned),
                self.layout.shards,
            )
        return owned[min(owned)]

    def _taken(self, shard: int, epoch: int) -> None:
        if self._on_taken is not None:
            self._on_taken(shard, epoch)

    def _fenced(self, reason: str) -> None:
        if self._on_fenced is not None:
            self._on_fenced(reason)

    async def rejoin(self) -> int | None:
        """After a fence: a new incarnation and claims again, retried every heartbeat until it
        works or :meth:`stop` is called (then None)."""
        membership = self.membership
        assert membership is not None, "join() first"
        delay_s = self.settings.heartbeat_ms / 1000
        while not self._stopped:
            try:
                owned = await membership.rejoin()
            except _REJOIN_ERRORS as error:
                log.warning(
                    "node %d: rejoining failed (%s); again in %.1f s", self.node_id, error, delay_s
                )
                await asyncio.sleep(delay_s)
                continue
            if self.service is not None:
                self.service.incarnation = membership.incarnation or 0
            log.info("node %d: rejoined as incarnation %s", self.node_id, membership.incarnation)
            return self._served(owned)
        return None

    def holds_lease(self) -> bool:
        return self.membership is not None and self.membership.holds_lease()

    @property
    def owned(self) -> dict[int, int]:
        return self.membership.owned if self.membership is not None else {}

    # -- the shard -------------------------------------------------------------------------

    def open_shard(self, log_config: LogConfig, epoch: int) -> tuple[LogStore, SplitMetadata]:
        """Open the served shard's log as the owner of ``epoch`` (its fence: section 5.3-5.4)
        and the node's metadata over it."""
        metadata = self.metadata
        assert metadata is not None, "join() first"
        store = self._open_store(log_config, SERVED_SHARD, epoch)
        try:
            local = LocalMetadata(store)
        except BaseException:
            store.abandon()
            raise
        return store, SplitMetadata(metadata, local)

    def open_shards(
        self, log_config: LogConfig
    ) -> tuple[list[tuple[int, LogStore]], SplitMetadata]:
        """Open every owned shard's log, each as the owner of its epoch, and the node's
        metadata over the lowest one's: ``((number, store) by number, metadata)``. Recovery
        of each runs here (a worker thread's, braid/server.py)."""
        metadata = self.metadata
        assert metadata is not None, "join() first"
        owned = sorted(self.owned.items())
        if not owned:
            raise ValueError(f"node {self.node_id} owns no shard to open")
        stores: list[tuple[int, LogStore]] = []
        try:
            for number, epoch in owned:
                stores.append((number, self._open_store(log_config, number, epoch)))
            local = LocalMetadata(stores[0][1])
        except BaseException:
            for _, store in stores:
                store.abandon()
            raise
        return stores, SplitMetadata(metadata, local)

    def open_taken_shard(self, log_config: LogConfig, shard: int, epoch: int) -> LogStore:
        """Open a shard taken over at ``epoch`` (issue 23): recovered as after a crash, a new
        segment, the storage fence of its epoch, exactly as a shard owned at start."""
        return self._open_store(log_config, shard, epoch)

    def _open_store(self, log_config: LogConfig, shard: int, epoch: int) -> LogStore:
        shard_dir = self.layout.shard_dir(shard)
        config = dataclasses.replace(log_config, data_dir=shard_dir)
        return LogStore(config, fence=epochs.log_fence(shard_dir, epoch))

    async def copy_adopted_definitions(self, local: LocalMetadata) -> int:
        """On a root that adopted a single-node directory into the served shard: copy the
        definitions its old tables hold and the cluster's store lacks, once for the cluster
        (section 2: adoption copies every definition). Returns how many were copied (0: not
        adopted, or copied already)."""
        metadata = self.metadata
        assert metadata is not None, "join() first"
        if self.layout.legacy_shard != SERVED_SHARD:
            return 0
        if metadata.get(ADOPTION_KIND, ADOPTION_KEY) is not None:
            return 0
        changes = [
            Change(kind, key, value)
            for kind in ADOPTED_KINDS
            for key, value in local.items(kind)
            if metadata.get(kind, key) is None
        ]
        marker = {"node": self.node_id, "copied": len(changes), "at_ms": int(time.time() * 1000)}
        changes.append(Change(ADOPTION_KIND, ADOPTION_KEY, json.dumps(marker).encode()))
        try:
            await metadata.apply(changes, expect={(ADOPTION_KIND, ADOPTION_KEY): None})
        except MetadataConflict:
            return 0  # another node copied them meanwhile
        log.info(
            "node %d: copied %d definitions of the adopted shard %d into the cluster's metadata",
            self.node_id,
            len(changes) - 1,
            SERVED_SHARD,
        )
        return len(changes) - 1

    # -- leaving ---------------------------------------------------------------------------

    async def stop(self) -> None:
        """A clean stop, after the shard was closed: the closed marker and the lease released
        (Membership.stop), then gRPC and the metadata connection. Idempotent."""
        self._stopped = True
        membership, self.membership = self.membership, None
        if membership is not None:
            try:
                await membership.stop()
            except Exception:
                log.exception("node %d: leaving the cluster failed", self.node_id)
        rpc, self._rpc = self._rpc, None
        if rpc is not None:
            with contextlib.suppress(Exception):
                await rpc.stop(grace_s=1.0)
        client, self.rpc_client = self.rpc_client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close(grace_s=0)
        metadata, self.metadata = self.metadata, None
        if metadata is not None:
            await metadata.aclose()


class ClusterServing:
    """A broker over this node's shards joined to the cluster's other shards (module
    docstring): :meth:`start` once the broker is built (before its listeners), :meth:`stop`
    before it closes. ``registries``: the security and limits stores the follower keeps in
    step (the broker's own topics, bindings and queues it always does); ``from_version``: the
    metadata version the broker's registries were loaded at."""

    def __init__(
        self,
        node: ClusterNode,
        broker: Node,
        *,
        security: FollowsRemote | None = None,
        limits: FollowsRemote | None = None,
        from_version: int | None = None,
    ) -> None:
        metadata, client, service, membership = (
            node.metadata,
            node.rpc_client,
            node.service,
            node.membership,
        )
        assert metadata is not None, "join() first"
        assert client is not None, "join() first"
        assert service is not None, "join() first"
        assert membership is not None, "join() first"
        assert isinstance(broker.metadata, SplitMetadata), "a cluster node's broker"
        self.node = node
        self.broker = broker
        self.view = MembershipView(metadata, node.node_id, broker.shards.placements)
        self.owners = owners = ViewOwners(self.view)
        self.forwarder = Forwarder(
            client,
            owners,
            node.settings,
            node=node.node_id,
            incarnation=membership.incarnation or 0,
            meta_version=lambda: metadata.version,
        )
        self.receiver = AppendReceiver(
            ServedShards(broker.shards.local, lambda: node.owned),
            node_id=node.node_id,
            window_ms=node.settings.rpc_timeout_ms,
        )
        self.consume = ConsumeService(broker)
        # What this node keeps for other nodes' processes (held gets, exclusive queues of their
        # connections) goes when they die or restart: told each refresh of the view.
        self.gone_nodes = GoneNodes(self.consume, broker)
        # The queues of other nodes' shards, consumed and read through this node (the Broker
        # API's set_remote_queues).
        self.remote_queues = RemoteQueuesOverRpc(
            client, owners, holder=getter_holder(str(node.node_id), membership.incarnation or 0)
        )
        # MQTT retained messages in other nodes' shards (the API's set_remote_retained).
        self.remote_retained = RetainedOverRpc(client, owners)
        # Half messages and decisions of transactions in other nodes' shards (section 10).
        self.remote_txn = TxnPublishOverRpc(client, owners)
        # Kafka producer ids unique across the nodes (the Broker API's set_producer_ids):
        # blocks of the cluster's counter in Redis.
        self.producer_ids: ProducerIdSource = metadata
        # Kafka's WriteTxnMarkers both ways (the Broker API's set_txn_markers; section 8).
        self.txn_markers = TxnMarkerClient(client, owners)
        self._txn_receiver = TxnMarkerReceiver(lambda: self.broker if self._started else None)
        # MQTT across the nodes (the Broker API's set_mqtt_cluster), made in start().
        self.mqtt: NodeMqttCluster | None = None
        self._routes: RouteTable | None = None
        self._redis_closers: Callable[[], Awaitable[None]] | None = None
        self._incarnation = membership.incarnation or 0
        self.follower = MetadataFollower(
            broker.metadata,
            topics=self,
            bindings=broker.bindings,
            queues=self,
            security=security,
            limits=limits,
            from_version=from_version,
        )
        self._service = service
        self._started = False

    async def start(self) -> MembershipView:
        """Read who owns what (errors propagate: no serving on no view), make the broker
        forward to the other nodes' shards, take their calls, follow their definitions.
        Returns the view, for the Broker API (``set_cluster_view``)."""
        self.view.on_refresh = self.gone_nodes
        await self.view.start()
        self.broker.remote = self.forwarder
        self.broker.remote_txn = self.remote_txn
        service = self._service
        service.append = self.receiver
        service.consume = self.consume.consume
        service.get = self.consume.get
        service.write_txn_markers = self._txn_receiver
        self.node.queue_admin.attach(self.broker)
        self.node.retained_admin.attach(self.broker)
        self.node.txn_admin.attach(self.broker)
        self._started = True
        try:
            await self._start_mqtt()
        except BaseException:
            await self.stop()
            raise
        self.follower.start()
        return self.view

    async def _start_mqtt(self) -> None:
        """MQTT across the nodes (docs/cluster.md section 8): the route table of live
        subscriptions, the Deliver fan-out and the session registry with TakeOverSession, over
        a Redis client of its own (the route table subscribes to a channel)."""
        node, metadata, client = self.node, self.node.metadata, self.node.rpc_client
        assert metadata is not None
        assert client is not None
        settings = node.settings
        redis, closers = redis_client(node.url, settings.metadata_wait_ms, None)
        self._redis_closers = closers.run
        cluster_id, node_id, incarnation = node.layout.cluster_id, node.node_id, self._incarnation
        self._routes = routes = RouteTable(redis, cluster_id, node_id)
        async with asyncio.timeout(settings.metadata_wait_ms / 1000):
            await routes.start()
        peers = MetadataPeers(metadata)
        registry = SessionRegistry(redis, cluster_id)

        def takeover(close: SessionCloser) -> SessionTakeover:
            return SessionTakeover(
                registry,
                client,
                peers,
                node=node_id,
                incarnation=incarnation,
                shards=node.layout.shards,
                takeover_timeout_ms=settings.takeover_timeout_ms,
                close_local=close,
            )

        self.mqtt = NodeMqttCluster(
            node_id,
            routes,
            FanoutSender(client, node_id, incarnation, peers.address_of),
            registry,
            takeover,
            owners=self.owners,
            shares=ShareMembers(redis, cluster_id, node_id),
            wills=WillBook(redis, cluster_id, node_id),
        )
        self.mqtt.attach(self._service)

    def apply_remote(self, name: str, value: bytes | None) -> None:
        """The follower's topic definitions: a topic deleted through another node also loses
        its indexes and committed offsets in this node's shards (``Node.delete_topic`` drops
        those of the deleting node's), so one created again under its name starts empty."""
        broker = self.broker
        known = name in broker.topics
        broker.topics.apply_remote(name, value)
        if value is None and known:
            for shard in broker.shards:
                shard.offsets.delete_topic(name)
                shard.store.drop_queues(name)
            log.info("topic %r deleted through another node: its records here dropped", name)

    def on_queue(self, key: str, value: bytes | None) -> None:
        """The follower's queue definitions: the broker opens or closes its ack queue, and a
        deleted queue's remote consumers are told (their owner's queue is gone)."""
        self.broker.on_queue(key, value)
        if value is None:
            self.consume.cancel(key.rpartition("\0")[0], QUEUE_DELETED)

    async def stop(self) -> None:
        """Stop taking calls for the broker's shards (new ones answer UNIMPLEMENTED, remote
        consumers are cancelled), following, the view and the forwards (unanswered ones fail
        with ShardUnavailable). Idempotent."""
        if not self._started:
            return
        self._started = False
        service = self._service
        if service.append is self.receiver:
            service.append = service.consume = service.get = None
            service.deliver = service.take_over_session = None
        if service.write_txn_markers is self._txn_receiver:
            service.write_txn_markers = None
        self.node.queue_admin.attach(None)
        self.node.retained_admin.attach(None)
        self.node.txn_admin.attach(None)
        self.consume.cancel(None, NOT_SERVING)
        mqtt, routes, closers = self.mqtt, self._routes, self._redis_closers
        self.mqtt = self._routes = self._redis_closers = None
        steps: list[tuple[str, Callable[[], Awaitable[None]]]] = [
            ("the metadata follower", self.follower.aclose),
            ("the remote queues", self.remote_queues.close),
            ("the retained puts", self.remote_retained.aclose),
        ]
        if mqtt is not None:
            steps.append(("the MQTT fan-out", mqtt.aclose))
        if routes is not None:
            steps.append(("the MQTT route table", routes.aclose))
        if closers is not None:
            steps.append(("the MQTT Redis client", closers))
        steps += [
            ("the Kafka view", self.view.stop),
            ("exclusive queue deletes", self.gone_nodes.close),
            ("the forwarder", self.forwarder.aclose),
        ]
        wait_s = self.node.settings.heartbeat_ms / 1000
        for name, step in steps:
            try:
                # Bounded: a task stuck in a Redis or gRPC call past its cancellation (seen
                # after a fence: the view's refresh) must not keep the node from stopping.
                async with asyncio.timeout(wait_s):
                    await step()
            except TimeoutError:
                log.warning(
                    "node %d: %s did not stop within %.1f s", self.node.node_id, name, wait_s
                )
