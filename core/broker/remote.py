"""The seam between a node's publish path and shards owned by other nodes (docs/cluster.md
sections 6 and 7).

``core.broker`` must not import the gRPC layer (``core.cluster.rpc`` sits above it), so the
node holds a :class:`RemoteAppend` and :class:`ShardOwners`; ``core.cluster.rpc.forward``
implements them over ``Append`` streams and the ownership table in Redis.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from core.delivery.ackqueue import AckQueueConfig
from core.delivery.handles import QueueStats
from core.delivery.message import Message
from core.errors import ShardUnavailable
from core.transactions.service import RecordFields

Destination = tuple[str, int]


@dataclass(frozen=True, slots=True)
class OwnerAddress:
    """Who owns a shard now: the node id (an int, as Kafka's broker ids), the address of its
    gRPC server (``host:port``) and the epoch of its claim."""

    node: int
    rpc_address: str
    epoch: int


class ShardOwners(Protocol):
    """The ownership table as a node sees it (Redis ``shard:<n>`` hashes and live leases)."""

    def owner_of(self, shard: int) -> OwnerAddress | None:
        """The cached owner, or None when the shard has no live owner."""
        ...

    async def refresh(self, shard: int) -> OwnerAddress | None:
        """Read the owner again (after a NOT_OWNER answer or a broken stream)."""
        ...


class ForwardResult(NamedTuple):
    """A forwarded record, durable on its shard's owner: its offset in the record's own queue
    there (-1 for a copy, which is not indexed in it) and the destinations that refused it."""

    offset: int
    refused: list[Destination]


# Called once for a record forwarded with :meth:`RemoteAppend.send`: its result, or the
# :class:`core.errors.ShardUnavailable` it failed with (the other None).
ForwardSettled = Callable[[ForwardResult | None, ShardUnavailable | None], None]


class RemoteAppend(Protocol):
    def forward(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        destinations: Sequence[Destination],
        copy: bool,
        deliver_at_ms: int,
        fields: RecordFields,
        txn: str = "",
        record_count: int = 1,
        flags: int = 0,
    ) -> Awaitable[ForwardResult]:
        """Send one routed record to the owner of ``shard``, which indexes it in
        ``destinations`` (all in that shard). ``copy``: the shard is not the home of
        ``(topic, queue)`` (FLAG_COPY, so readers of the whole root count the record once).
        ``record_count`` and ``flags``: a Kafka batch's (``FLAG_BATCH``, its records' count).
        Called synchronously in publish order; records for one shard keep that order. The
        awaitable resolves once the record is durable there, or raises
        :class:`core.errors.ShardUnavailable` (no live owner, or it did not answer within
        ``unavailable_wait_ms``)."""
        ...

    def send(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        *,
        destinations: Sequence[Destination],
        copy: bool,
        deliver_at_ms: int,
        fields: RecordFields,
        settled: ForwardSettled,
        record_count: int = 1,
        flags: int = 0,
    ) -> None:
        """:meth:`forward` without a future (a publish's hot path): ``settled`` is called once
        with the outcome, as its answer is read (maybe before this returns, when it fails at
        once)."""
        ...


class RemoteTransactions(Protocol):
    def publish(
        self,
        shard: int,
        topic: str,
        queue: int,
        body: bytes | memoryview | None,
        fields: RecordFields,
    ) -> Awaitable[ForwardResult]:
        """Publish a half message, or a ``braid.txn`` decision, on the owner of ``shard``, the
        shard of its transaction (a half is kept, and a decision applied, only there): the
        owner routes and stores it as a publish made there. Resolves once it is durable there
        (``offset``: -1 for a half), or raises :class:`core.errors.ShardUnavailable`."""
        ...


# A Fanout received from another node, handed to this node's live subscribers: (MQTT topic
# name, the record's fields as one frame of core/log/record.py, the publish's QoS).
FanoutDispatch = Callable[[str, bytes, int], None]
# The gateway's hook on the node that holds a client id's connection: (client id, the new
# connection's gen, the node taking it) -> whether a connection older than that gen was found
# (and closed: MQTT 5 DISCONNECT 0x8E, 3.1.1 closed) before this returns.
SessionCloser = Callable[[str, int, int], Awaitable[bool]]
# The gateway's publisher of a dead node's will taken over by this node: (client id, the will
# as the gateway wrote it down for ``hold_will``).
OrphanedWillPublisher = Callable[[str, bytes], None]


class MqttCluster(Protocol):
    """MQTT across the nodes of a cluster (docs/cluster.md section 8), as the Broker API
    (core/api/sessions.py) uses it; ``core.cluster.mqtt_cluster`` implements it over the route
    table, the ``Deliver`` fan-out and the session registry with ``TakeOverSession``."""

    @property
    def node(self) -> int:
        """This node's id."""
        ...

    def handle(self, dispatch: FanoutDispatch, close_session: SessionCloser) -> None:
        """Where received Fanouts and takeover requests go (set once by the Broker API)."""
        ...

    def add_route(self, topic_filter: str) -> None:
        """This node has its first live subscriber of ``topic_filter``: the route is written
        in the background (:meth:`routes_written` waits for it)."""
        ...

    def remove_route(self, topic_filter: str) -> None:
        """This node's last live subscriber of ``topic_filter`` is gone."""
        ...

    async def routes_written(self) -> None:
        """Returns once every route change asked for so far is in the cluster's table."""
        ...

    def nodes_for(self, topic: str) -> set[int]:
        """The nodes (this one included) with a live subscriber matching ``topic``."""
        ...

    def owner_of(self, shard: int) -> int | None:
        """The node owning ``shard`` now (its live feed reads back what the shard indexes),
        None when it has no live owner."""
        ...

    def send(self, node: int, mqtt_topic: str, fields: bytes, qos: int) -> None:
        """Queue one Fanout for ``node``'s live subscribers (at most once: a node that is
        gone or too far behind loses it, counted; never raises for that)."""
        ...

    async def connect(self, client_id: str) -> int:
        """Register ``client_id`` as connected here and have its connection on any other
        node closed; returns the new connection's gen. Raises
        :class:`core.errors.ShardUnavailable` when the node holding it lives but did not
        give it up (CONNACK 0x88 / 3.1.1 return code 3: the client retries)."""
        ...

    def release(self, client_id: str, gen: int) -> None:
        """The connection ``gen`` of ``client_id`` ended: its registration is removed (in the
        background) unless a newer connection replaced it."""
        ...

    async def share_joined(self, name: str) -> None:
        """This node has members of the ``$share`` group whose queue is ``name``."""
        ...

    async def share_left(self, name: str) -> bool:
        """This node's last member of the group left; True when no node has members (the
        group's queue may go)."""
        ...

    async def share_elsewhere(self, name: str) -> bool:
        """Whether another node has members of the group (its queue stays)."""
        ...

    def hold_will(self, client_id: str, will: bytes | None) -> None:
        """Keep the will of this node's connection of ``client_id`` where another node finds
        it should this one die (None: it was published or the connection ended normally); in
        the background, in order."""
        ...

    def on_orphaned_will(self, publish: OrphanedWillPublisher | None) -> None:
        """Where the wills of dead nodes that this node takes go (issue 23): each is handed to
        ``publish`` once; None: this node takes none (another node publishes them)."""
        ...


# -- queues consumed from another node (docs/cluster.md section 8, AMQP) ------------------------
#
# ``core.api`` puts a queue whose shard another node owns behind the same QueueHandle and
# Subscription as a local one; these are what it needs of the node's gRPC side for that
# (``core.cluster.remote_queues.RemoteQueuesOverRpc`` implements them over ``Consume``, ``Get``
# and two ``Admin`` calls). Every call names the queue's shard (``ShardOwners`` finds its owner)
# and its topic as the core names it; a shard without a live owner, or an owner that does not
# answer, is :class:`core.errors.ShardUnavailable`.


class RemoteQueueDelivery(Protocol):
    """One delivery from a queue of another node: ``tag`` is what it is settled by there."""

    tag: int
    message: Message
    redelivered: bool
    delivery_count: int


class RemoteQueueConsumer(Protocol):
    """One consumer attached to a queue of another node. The calls are synchronous, as a
    gateway makes them from its read: each is sent in order on the consumer's stream."""

    @property
    def inflight(self) -> int:
        """Deliveries received and not settled yet."""
        ...

    def set_prefetch(self, limit: int) -> None:
        """A new limit of unsettled deliveries (0: none)."""
        ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def ack(self, tag: int) -> None: ...

    def nack(self, tag: int, *, requeue: bool) -> None:
        """Back to the queue, redelivered (``requeue``), else dead-lettered or dropped."""
        ...

    def detach(self) -> int:
        """End it now: the stream is closed in the background, and the owner puts what was
        unsettled back in the queue, redelivered. How many were unsettled here."""
        ...


class QueueDeleted(NamedTuple):
    """queue.delete's answer (``RemoteQueues.delete``): ``refused`` "in use" or "not empty"
    when a condition failed (nothing deleted), else the ready records the queue held and the
    sources of its bindings (exchanges that may now be left without any)."""

    refused: str | None
    ready: int
    sources: frozenset[str]


# A queue's topic config: the holder (RemoteQueues.holder) of the node through whose connection
# an exclusive queue of another node's shard was declared; its owner deletes the queue when that
# node's process is gone (its connections went with it), as RabbitMQ deletes an exclusive queue
# with its connection.
EXCLUSIVE_TO_KEY = "braid.exclusive_to"


class RemoteQueues(Protocol):
    @property
    def holder(self) -> str:
        """This node's process as the owners name it (its id and lease incarnation)."""
        ...

    def consumer(
        self,
        shard: int,
        topic: str,
        tag: str,
        prefetch: int,
        deliver: Callable[[RemoteQueueDelivery], None],
        *,
        no_ack: bool,
        client_id: str,
        on_cancel: Callable[[str], None],
    ) -> RemoteQueueConsumer:
        """Attach a consumer to the queue ``topic`` in ``shard``, at most ``prefetch``
        unsettled (0: no limit). Returns at once; the attach is made in the background, and
        when it fails, or the owner later ends the consumer (the queue deleted, the owner
        gone), ``on_cancel(reason)`` is called once (never after :meth:`detach`)."""
        ...

    def get(
        self, shard: int, topic: str, *, no_ack: bool, client_id: str
    ) -> Awaitable[tuple[RemoteQueueDelivery | None, int]]:
        """basic.get: the next ready record, or None, and the ready records the owner has left;
        the record is held by the owner for ``client_id`` until :meth:`settle_gets` settles
        it, unless ``no_ack``."""
        ...

    def settle_gets(self, shard: int, tags: Sequence[int], *, ack: bool, requeue: bool) -> None:
        """Settle records :meth:`get` took (ack, or nack with ``requeue``), in the
        background and in order."""
        ...

    def delete(
        self, shard: int, topic: str, *, if_empty: bool, if_unused: bool
    ) -> Awaitable[QueueDeleted | None]:
        """queue.delete on the owner, its conditions checked and the queue deleted there in one
        step (nothing comes between); None when the owner has no such queue."""
        ...

    def stats(self, shard: int, topic: str) -> Awaitable[QueueStats | None]:
        """The owner's counts of the queue ``topic`` now, or None when it has no such queue."""
        ...

    def purge(self, shard: int, topic: str) -> Awaitable[int | None]:
        """queue.purge on the owner: how many ready records it dropped (in-flight ones stay),
        or None when it has no such queue."""
        ...

    def declare(
        self, shard: int, topic: str, config: dict[str, object], settings: AckQueueConfig
    ) -> Awaitable[QueueStats]:
        """Make sure the owner has the queue ``topic`` (its topic with ``config``, its ack
        queue with ``settings``; one that exists is kept as it is) and return its counts."""
        ...
