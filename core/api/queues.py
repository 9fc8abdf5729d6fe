"""Exchanges, queues, bindings, consumers, basic.get, flow listeners and tx: the Broker
API's calls for queues and their consumers (AMQP's model).

A queue whose shard another node owns (docs/cluster.md section 8, AMQP) is handed out as a
:class:`RemoteQueueHandle` behind the same :class:`QueueHandle` methods, and its consumers as a
:class:`RemoteSubscription`, over the node's ``RemoteQueues`` (``set_remote_queues``): a
``Consume`` stream to the owner per consumer (prefetch as credit; acks, nacks, rejects, requeue
and the redelivered flag are the owner's), basic.get by ``Get``. A gateway keeps settling the
deliveries with its :class:`Settlements`: a remote delivery's ``queue`` is a stand-in
(:class:`_SettledRemotely`) that sends the settle to the owner instead. What cannot wait for
the owner in a gateway's synchronous call is answered from what this node knows: the counts are
the owner's last answer (asked again in the background when older than
:data:`STATS_MAX_AGE_S`). basic.get waits for the owner (:meth:`QueueCalls.fetch_message`: one
``Get`` round trip), so it answers get-empty only when the owner has no ready record.
"""

from __future__ import annotations

# (AMQP section's imports)
# (MQTT section's imports)
# (Kafka section's imports)
import asyncio
import dataclasses
import logging
import time
from collections.abc import (
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any, Final, cast

from core.api.base import BrokerCalls, ClientContext, Headers, PublishOutcome
from core.broker.broker import (
    EXCHANGE_QUEUE,
    Destination,
)
from core.broker.remote import (
    EXCLUSIVE_TO_KEY,
    QueueDeleted,
    RemoteQueueConsumer,
    RemoteQueueDelivery,
    RemoteQueues,
)
from core.broker.topics import TopicInfo
from core.delivery.ackqueue import (
    AckQueue,
    AckQueueConfig,
    Consumer,
    Delivery,
)
from core.delivery.handles import (
    NO_CREDIT,
    QueueHandle,
    QueueStats,
    Subscription,
    attach,
    take_one,
)
from core.errors import ShardUnavailable
from core.limits import QUEUE_VHOST_KEY
from core.transactions import TransactionError

log = logging.getLogger(__name__)

# A remote queue's counts older than this are asked for again (in the background) when read.
STATS_MAX_AGE_S: Final = 1.0


class _SettledRemotely:
    """Where a remote delivery names its queue: :class:`Settlements` (and ``Delivery.ack``)
    call ``ack(offset)`` and ``nack(offset, requeue=)`` on it, which go to the owner by the
    delivery's tag (its ``offset`` here); it has no local consumers to pump."""

    __slots__ = ("_ack", "_nack", "topic")

    consumers: tuple[()] = ()

    def __init__(
        self, topic: str, ack: Callable[[int], None], nack: Callable[[int, bool], None]
    ) -> None:
        self.topic = topic
        self._ack = ack
        self._nack = nack

    def ack(self, offset: int) -> None:
        self._ack(offset)

    def nack(self, offset: int, *, requeue: bool = True) -> None:
        self._nack(offset, requeue)

    def pump(self) -> None:
        """(A local queue's: delivers what settles freed. The owner does that for this one.)"""

    def __repr__(self) -> str:
        return f"_SettledRemotely({self.topic!r})"


def _as_queue(stand_in: _SettledRemotely) -> AckQueue:
    # Delivery and Consumer name an AckQueue; of it a gateway's Settlements use only what
    # _SettledRemotely has, so the stand-in goes where the queue would.
    return cast("AckQueue", stand_in)


class RemoteSubscription(Subscription):
    """A consumer of a queue of another node (``BrokerAPI.consume`` on a
    :class:`RemoteQueueHandle`), the :class:`Subscription` names over a
    ``RemoteQueueConsumer``. ``on_cancel(reason)`` is called when the owner ends it (the queue
    deleted, the owner gone) or it could not be attached."""

    __slots__ = ("_limit", "_remote", "_tag", "on_cancel")

    def __init__(self, tag: str, limit: int, on_cancel: Callable[[str], None] | None) -> None:
        # (No local Consumer: the base class's slot stays empty.)
        self._tag = tag
        self._limit = limit
        self._remote: RemoteQueueConsumer | None = None
        self.on_cancel = on_cancel

    @property
    def tag(self) -> str:
        return self._tag

    @property
    def inflight(self) -> int:
        return 0 if self._remote is None else self._remote.inflight

    @property
    def prefetch(self) -> int:
        return self._limit

    def set_prefetch(self, limit: int, *, deliver_now: bool = True) -> None:
        self._limit = limit
        remote = self._remote
        if remote is None:
            return
        if limit == NO_CREDIT:
            remote.pause()
        else:
            remote.set_prefetch(limit)
            remote.resume()

    def pause(self) -> None:
        self.set_prefetch(NO_CREDIT)

    def resume(self, prefetch: int) -> None:
        self.set_prefetch(prefetch)

    def detach(self) -> int:
        """Stop it: the stream to the owner ends (in the background) and the owner puts its
        unsettled deliveries back, redelivered. How many were unsettled here."""
        return 0 if self._remote is None else self._remote.detach()

    def cancelled(self, reason: str) -> None:
        log.info("remote consumer %r cancelled: %s", self._tag, reason)
        if self.on_cancel is not None:
            self.on_cancel(reason)

    def __repr__(self) -> str:
        return f"RemoteSubscription({self._tag!r}, inflight={self.inflight}/{self._limit})"


class RemoteQueueHandle(QueueHandle):
    """A queue whose shard another node owns, as a gateway may use it (module docstring).
    TTL, max-length and overflow are the owner's: here none apply."""

    __slots__ = (
        "_remote",
        "_shard",
        "_stats",
        "_stats_at",
        "_tasks",
        "_topic",
    )

    def __init__(
        self, remote: RemoteQueues, shard: int, topic: str, stats: QueueStats | None
    ) -> None:
        # (No local AckQueue: the base class's slot stays empty.)
        self._remote = remote
        self._shard = shard
        self._topic = topic
        self._stats = stats or QueueStats(0, 0, 0)
        self._stats_at = time.monotonic() if stats is not None else float("-inf")
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def shard(self) -> int:
        return self._shard

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def deleted(self) -> bool:
        return False  # (its consumers are cancelled by the owner when it is)

    @property
    def remote(self) -> bool:
        return True

    @property
    def message_ttl_ms(self) -> int | None:
        return None

    @property
    def max_length(self) -> int | None:
        return None

    def message_count(self) -> int:
        """Ready records, as the owner last said."""
        return self.stats().ready

    def stats(self) -> QueueStats:
        """The owner's last answer (asked again in the background when it is old)."""
        if time.monotonic() - self._stats_at > STATS_MAX_AGE_S:
            self._stats_at = time.monotonic()  # one question at a time
            self._run_soon(self._refresh_stats())
        return self._stats

    async def refresh_stats(self) -> QueueStats | None:
        """Ask the owner now: its counts, or None when it has no such queue
        (:class:`ShardUnavailable` when it does not answer)."""
        stats = await self._remote.stats(self._shard, self._topic)
        if stats is not None:
            self._stats = stats
            self._stats_at = time.monotonic()
        return stats

    async def _refresh_stats(self) -> None:
        try:
            await self.refresh_stats()
        except ShardUnavailable as error:
            log.info("remote queue %s: no counts: %s", self._topic, error)

    def would_overflow(self) -> bool:
        return False  # (the owner refuses a publish it cannot take: the forward says so)

    def enforce_max_length(self) -> int:
        return 0  # (the owner's)

    def expire_head(self) -> None:
        """(The owner expires its records.)"""

    def purge(self) -> int:
        raise ShardUnavailable(
            self._shard, reason=f"{self._topic!r} is purged on its owner: purge_known_queue"
        )

    async def purge_on_owner(self) -> int | None:
        """queue.purge on the owner: the ready records it dropped; None when the owner has no
        such queue (:class:`ShardUnavailable` when it does not answer)."""
        purged = await self._remote.purge(self._shard, self._topic)
        if purged is None:
            return None
        self._stats = dataclasses.replace(self._stats, ready=0)
        return purged

    async def delete_on_owner(self, *, if_empty: bool, if_unused: bool) -> QueueDeleted | None:
        """queue.delete on the owner, the conditions checked there (RemoteQueues.delete)."""
        return await self._remote.delete(
            self._shard, self._topic, if_empty=if_empty, if_unused=if_unused
        )

    # -- consumers ---------------------------------------------------------------------------

    def subscribe(
        self,
        tag: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
        *,
        no_ack: bool,
        client_id: str,
        on_cancel: Callable[[str], None] | None,
    ) -> RemoteSubscription:
        """``BrokerAPI.consume``'s work for this queue: a consumer on the owner whose
        deliveries come to ``deliver`` as :class:`Delivery` objects settled there."""
        subscription = RemoteSubscription(tag, prefetch, on_cancel)
        stand_in = _SettledRemotely(
            self._topic,
            lambda tag_: remote.ack(tag_),
            lambda tag_, requeue: remote.nack(tag_, requeue=requeue),
        )
        queue = _as_queue(stand_in)
        # Marks the deliveries as a consumer's (not basic.get's): a gateway that lets go of
        # them leaves them to the consumer's detach, which the owner answers.
        marker = Consumer(queue, tag, 0, deliver, no_ack)

        def delivered(remote_delivery: RemoteQueueDelivery) -> None:
            deliver(
                Delivery(
                    queue,
                    remote_delivery.tag,
                    remote_delivery.message,
                    remote_delivery.redelivered,
                    remote_delivery.delivery_count,
                    marker,
                )
            )

        # Paused at the start (a gateway whose client is not reading): attached with a
        # limit of one, then paused, until the gateway gives it credit.
        remote = self._remote.consumer(
            self._shard,
            self._topic,
            tag,
            1 if prefetch == NO_CREDIT else prefetch,
            delivered,
            no_ack=no_ack,
            client_id=client_id,
            on_cancel=subscription.cancelled,
        )
        if prefetch == NO_CREDIT:
            remote.pause()
        subscription._remote = remote
        return subscription

    # -- basic.get ---------------------------------------------------------------------------

    async def get(self, *, no_ack: bool, holder: str) -> Delivery | None:
        """basic.get, one ``Get`` round trip to the owner: its next ready record (held there
        for ``holder`` until settled, unless ``no_ack``) or None when it has none; the owner's
        count of ready records left becomes :meth:`message_count` (get-ok's count).
        :class:`ShardUnavailable` when the owner does not answer."""
        delivery, ready = await self._remote.get(
            self._shard, self._topic, no_ack=no_ack, client_id=holder
        )
        self._stats = dataclasses.replace(self._stats, ready=ready)
        self._stats_at = time.monotonic()
        if delivery is None:
            return None
        remote, shard = self._remote, self._shard
        stand_in = _SettledRemotely(
            self._topic,
            lambda tag: remote.settle_gets(shard, [tag], ack=True, requeue=False),
            lambda tag, requeue: remote.settle_gets(shard, [tag], ack=False, requeue=requeue),
        )
        return Delivery(
            _as_queue(stand_in),
            delivery.tag,
            delivery.message,
            delivery.redelivered,
            delivery.delivery_count,
            None,
        )

    def _run_soon(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def __repr__(self) -> str:
        return f"RemoteQueueHandle({self._topic!r}, shard={self._shard})"


def _cancel_told_by(deliver: Callable[[Delivery], None]) -> Callable[[str], None] | None:
    """How a gateway that sets no ``on_cancel`` learns that the owner ended its consumer: the
    path its deleted queues' consumers are told by (AMQP: ``cancelled_by_server`` of the
    consumer whose bound ``deliver`` this is, which sends basic.cancel), or None."""
    told = getattr(getattr(deliver, "__self__", None), "cancelled_by_server", None)
    if not callable(told):
        return None
    return lambda _reason: told()


class QueueCalls(BrokerCalls):
    """Exchanges, queues, bindings, consumers and tx."""

    # Queues of shards other nodes own are reached through this (None: a single node, or a
    # node that reaches none: ShardUnavailable).
    _remote_queues: RemoteQueues | None = None

    def set_remote_queues(self, remote: RemoteQueues | None) -> None:
        """The queues of other nodes' shards are reached through ``remote`` (the process that
        assembles a cluster node calls this once)."""
        self._remote_queues = remote

    def _remote_shard(self, topic: str) -> int | None:
        """The shard of the queue ``topic`` when another node owns it, else None."""
        shards = self._node.shards
        if shards.single:
            return None
        number = shards.queue_number(topic, 0)
        return None if shards.local(number) is not None else number

    def _remote(self, shard: int) -> RemoteQueues:
        remote = self._remote_queues
        if remote is None:
            raise ShardUnavailable(shard, reason="not served by this node")
        return remote

    # Topics, exchanges and bindings. An AMQP exchange is a topic, an AMQP queue a topic whose
    # queue 0 is an ack queue; the gateway keeps its settings in the topic's config (see
    # gateway/amqp/vhost.py for the names).

    def topics_with_config(self, key: str) -> list[TopicInfo]:
        """Every topic (system topics left out) whose config has a ``key`` entry: what a
        gateway stored there to find its objects again at start."""
        return [info for info in self._node.topics.all() if key in info.config]

    async def declare_exchange(
        self, context: ClientContext, topic: str, config: Mapping[str, Any]
    ) -> bool:
        """Create ``topic`` (one queue) with ``config`` as its settings, or merge ``config``
        into the settings of the topic there is (one another protocol made becomes an exchange
        too). True when it was created; :class:`TopicError` for a name that cannot be one."""
        node = self._node
        info, created = await node.declare_topic(topic, 1, dict(config))
        if not created:
            info.config.update(config)
            await node.topics.update(info)
        return created

    async def delete_exchange(self, context: ClientContext, topic: str) -> set[str]:
        """Delete the exchange ``topic`` with its bindings (as a source, and as the destination
        of exchange-to-exchange bindings). Returns the sources of the latter: exchanges that
        may now be left without bindings (AMQP's auto-delete)."""
        node = self._node
        destination = (topic, EXCHANGE_QUEUE)
        sources: set[str] = set()
        for binding in node.bindings.bindings(destination=destination):
            sources.add(binding.source)
            await node.unbind(
                binding.source, binding.kind, binding.pattern, destination, binding.arguments
            )
        await node.delete_topic(topic)
        return sources

    def exchange_has_bindings(self, topic: str) -> bool:
        """Whether any binding has ``topic`` as its source."""
        return bool(self._node.bindings.bindings(source=topic))

    async def bind(
        self,
        context: ClientContext,
        source: str,
        kind: str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add a durable binding from the topic ``source`` to ``destination`` (an ack queue's
        ``(topic, 0)``, or ``(exchange, EXCHANGE_QUEUE)``); ``kind`` is the match kind
        (``exact``, ``fanout``, ``topic``, ``headers``). False if it existed;
        :class:`RoutingError` for arguments the matcher refuses."""
        return await self._node.bind(source, kind, pattern, destination, arguments)

    async def unbind(
        self,
        context: ClientContext,
        source: str,
        kind: str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Remove a binding :meth:`bind` added; False if there was none."""
        return await self._node.unbind(source, kind, pattern, destination, arguments)

    def routed_destinations(
        self, topic: str, subject: str, headers: Mapping[str, Any] | None = None
    ) -> list[Destination]:
        """Where a record published to ``topic`` with ``subject`` (and ``headers``, for headers
        exchanges) would go through the bindings now, exchange-to-exchange ones followed."""
        return self._node.route(topic, subject, headers)

    def has_ack_queue(self, destination: Destination) -> bool:
        """Whether ``destination`` is an ack queue (a queue consumers read, as opposed to a
        topic's own stream): a publish that reached one was routed, for AMQP's mandatory."""
        node = self._node
        shards = node.shards
        if not shards.single and shards.local(shards.queue_number(*destination)) is None:
            # Another node's queue: an AMQP queue's topic is marked as one (declare_queue).
            info = node.topics.get(destination[0])
            return destination[1] == 0 and info is not None and QUEUE_VHOST_KEY in info.config
        return node.ack_queue(*destination) is not None

    # Queues.

    async def declare_queue(
        self,
        context: ClientContext,
        topic: str,
        config: Mapping[str, Any],
        settings: AckQueueConfig,
        *,
        exclusive: bool = False,
    ) -> QueueHandle:
        """Create the queue ``topic``: a topic (one queue, ``config`` merged into its
        settings) whose queue 0 is an ack queue with ``settings``. The queue starts empty, even
        where an earlier queue of that name left index entries or ack state. ``exclusive``:
        it lives only as long as this node's process (its owner, another node, deletes it when
        this process is gone: :data:`EXCLUSIVE_TO_KEY`); the gateway deletes it earlier, with
        its connection. :class:`TopicError` for a name that cannot be a topic."""
        node = self._node
        # The queue's topic, config merged; marked to count for the queue limits of its vhost.
        config = {**config, QUEUE_VHOST_KEY: context.vhost}
        shard = self._remote_shard(topic)
        if shard is not None and exclusive:
            config[EXCLUSIVE_TO_KEY] = self._remote(shard).holder
        await self.declare_exchange(context, topic, config)
        if shard is not None:
            # Another node owns it: it makes the queue, or keeps the one it has (a queue this
            # node's gateway did not know yet may well exist there).
            remote = self._remote(shard)
            await node.define_remote_queue(topic, 0, settings)  # for the cluster's followers
            stats = await remote.declare(shard, topic, dict(config), settings)
            return RemoteQueueHandle(remote, shard, topic, stats)
        if node.ack_queue(topic) is not None:  # left by a queue deleted while its topic stayed
            await node.delete_ack_queue(topic)
        ack, _ = await node.declare_ack_queue(topic, 0, settings)
        ack.purge()
        return QueueHandle(ack)

    async def open_queue(self, topic: str, settings: AckQueueConfig) -> QueueHandle:
        """The queue ``topic`` as it was stored (at start); its ack queue is made with
        ``settings`` if it has none. ``settings.max_priority`` applies either way: the
        gateway's stored arguments say whether it is a priority queue (the records keep their
        own priorities)."""
        node = self._node
        shard = self._remote_shard(topic)
        if shard is not None:  # its owner opens it; the counts come when first read
            return RemoteQueueHandle(self._remote(shard), shard, topic, None)
        ack = node.ack_queue(topic)
        if ack is None:
            ack, _ = await node.declare_ack_queue(topic, 0, settings)
        elif ack.config.max_priority != settings.max_priority:
            ack.set_max_priority(settings.max_priority)
        return QueueHandle(ack)

    async def delete_queue(self, context: ClientContext, topic: str) -> set[str]:
        """Delete the queue ``topic``: its records' index, ack state and bindings go (the
        consumers still attached are detached). Returns the sources of its bindings:
        exchanges that may now be left without bindings (AMQP's auto-delete)."""
        node = self._node
        sources = {b.source for b in node.bindings.bindings(destination=(topic, 0))}
        await node.delete_topic(topic)
        return sources

    async def delete_queue_if(
        self,
        context: ClientContext,
        topic: str,
        queue: QueueHandle,
        *,
        if_empty: bool,
        if_unused: bool,
    ) -> QueueDeleted | None:
        """queue.delete of ``queue`` (the queue ``topic``) unless ``if_empty`` and it holds
        ready records, or ``if_unused`` and it has consumers (of any node): checked and deleted
        in one step, on its owner for another node's queue (one call: nothing comes between).
        None when there is no such queue; :class:`ShardUnavailable` when the owner does not
        answer. Its bindings' sources are in the answer (AMQP's auto-delete)."""
        if isinstance(queue, RemoteQueueHandle):
            deleted = await queue.delete_on_owner(if_empty=if_empty, if_unused=if_unused)
            if deleted is None or deleted.refused is not None:
                return deleted
            # This node's definitions and bindings of it go now (the owner's delete follows).
            sources = await self.delete_queue(context, topic)
            return deleted._replace(sources=deleted.sources | sources)
        stats = queue.stats()
        if if_unused and stats.consumers:
            return QueueDeleted("in use", 0, frozenset())
        if if_empty and stats.ready:
            return QueueDeleted("not empty", 0, frozenset())
        sources = await self.delete_queue(context, topic)
        return QueueDeleted(None, stats.ready, frozenset(sources))

    def queue_info(self, context: ClientContext, topic: str) -> QueueStats | None:
        """The counts of the queue ``topic`` now, or None when there is none."""
        ack = self._node.ack_queue(topic)
        return None if ack is None else QueueHandle(ack).stats()

    def add_queue_listener(self, listener: Callable[[str, bool], None]) -> None:
        """``listener(topic, defined)`` each time another node defines or deletes a queue of
        this node's shards (in a cluster; the metadata follower's queue changes), after this
        node opened or closed it: its owner's gateway learns of it at once."""
        self._node.queue_listeners.append(listener)

    def queue_is_local(self, topic: str) -> bool:
        """Whether the queue ``topic``'s shard is one this node serves (always, on a single
        node)."""
        return self._remote_shard(topic) is None

    def known_queue(self, topic: str) -> QueueHandle | None:
        """The queue ``topic`` as the core knows it, wherever it was declared (the definitions
        of other nodes' declarations follow through ``Node.on_queue``): a local ack queue's
        handle, a :class:`RemoteQueueHandle` (counts come when first read) for a queue defined
        in another node's shard, or None when there is no such queue (or no way to reach
        its owner)."""
        shard = self._remote_shard(topic)
        if shard is None:
            ack = self._node.ack_queue(topic)
            return None if ack is None else QueueHandle(ack)
        remote = self._remote_queues
        if remote is None or not self._node.queue_defined(topic, 0):
            return None
        return RemoteQueueHandle(remote, shard, topic, None)

    async def refresh_queue(self, queue: QueueHandle) -> QueueStats | None:
        """The counts of ``queue`` now: another node's queue asks its owner (and keeps the
        answer for :meth:`RemoteQueueHandle.message_count`); None when the owner has no such
        queue; :class:`ShardUnavailable` when the owner does not answer."""
        if isinstance(queue, RemoteQueueHandle):
            return await queue.refresh_stats()
        return queue.stats()

    async def purge_known_queue(self, queue: QueueHandle) -> int | None:
        """queue.purge of a queue :meth:`known_queue` gave: another node's is purged by its
        owner (None when it has none; :class:`ShardUnavailable` when it does not answer)."""
        if isinstance(queue, RemoteQueueHandle):
            return await queue.purge_on_owner()
        return queue.purge()

    async def queue_stats(self, context: ClientContext, topic: str) -> QueueStats | None:
        """:meth:`queue_info` for a queue of any node: another node's queue is asked its owner
        (:class:`ShardUnavailable` when it does not answer)."""
        shard = self._remote_shard(topic)
        if shard is None:
            return self.queue_info(context, topic)
        return await self._remote(shard).stats(shard, topic)

    def enforce_max_length(self, destinations: Iterable[Destination]) -> None:
        """After records reached ``destinations`` other than by :meth:`publish` (a transaction
        committed): drop the heads of the ack queues among them over their max-length."""
        node = self._node
        for destination in destinations:
            ack = node.ack_queue(*destination)
            if ack is not None and ack.config.max_length is not None:
                ack.enforce_max_length()

    # Consumers.

    def consume(
        self,
        context: ClientContext,
        queue: QueueHandle,
        tag: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
        *,
        no_ack: bool = False,
    ) -> Subscription:
        """Attach a consumer to ``queue``: records are pushed to ``deliver`` (called
        synchronously by the queue's pump, one :class:`Delivery` each) while fewer than
        ``prefetch`` (0: no limit) are unsettled; ``no_ack`` deliveries are settled as they go.
        Settle deliveries with a :class:`Settlements`.

        A queue of another node (a :class:`RemoteQueueHandle`) gets a
        :class:`RemoteSubscription`, attached in the background: when the owner ends it (or
        refuses the attach), the gateway is told as of a deleted queue (see
        :func:`_cancel_told_by`), unless it set the subscription's ``on_cancel``."""
        if isinstance(queue, RemoteQueueHandle):
            return queue.subscribe(
                tag,
                prefetch,
                deliver,
                no_ack=no_ack,
                client_id=context.connection_id,
                on_cancel=_cancel_told_by(deliver),
            )
        return attach(queue, tag, prefetch, deliver, no_ack=no_ack)

    async def fetch_message(
        self, context: ClientContext, queue: QueueHandle, *, no_ack: bool
    ) -> Delivery | None:
        """AMQP's basic.get: the next ready record of ``queue``, held by no consumer (settled
        with a :class:`Settlements` unless ``no_ack``), or None when there is none. A local
        queue answers without waiting; a queue of another node asks its owner (one ``Get``
        round trip; the owner holds the record for this connection until it is settled) and
        its ``message_count()`` is then the owner's; :class:`ShardUnavailable` when the owner
        does not answer."""
        if isinstance(queue, RemoteQueueHandle):
            return await queue.get(no_ack=no_ack, holder=context.connection_id)
        return take_one(queue, no_ack=no_ack)

    # Durability and flow control.

    def waits_for_fsync(self, topic: str) -> bool:
        """Whether ``topic``'s durability is ``sync``: a publish there is durable only once
        the log is fsynced (:meth:`when_durable` waits for it); else at once."""
        # (Every shard's log has the same durability settings: the lowest local one answers.)
        return self._node.shards.home.store.is_sync(topic)

    def publishing_blocked_reason(self) -> str | None:
        """While flow control holds publishers back: why (``memory``, ...), else None."""
        reasons = self._node.flow.reasons
        return ", ".join(sorted(reasons)) if reasons else None

    def add_flow_listener(self, listener: Callable[[bool, str], None]) -> None:
        """``listener(blocked, reason)`` on every change between blocked and unblocked
        (AMQP's connection.blocked / connection.unblocked)."""
        self._node.flow.add_listener(listener)

    def remove_flow_listener(self, listener: Callable[[bool, str], None]) -> None:
        self._node.flow.remove_listener(listener)

    # Transactions (AMQP tx): half messages of the core's transaction service, invisible
    # until the commit makes all of them visible at once. Begun, committed and rolled back
    # with the Kafka section's begin_transaction / commit_transaction / roll_back_transaction
    # (and found after a restart with open_transactions).

    def publish_in_transaction(
        self,
        context: ClientContext,
        txn_id: str,
        topic: str,
        body: bytes | memoryview | None,
        *,
        subject: str = "",
        headers: Headers = (),
        routing_headers: Mapping[str, Any] | None = None,
        address: str = "",
        extra_destinations: Sequence[Destination] = (),
        route: bool = True,
    ) -> PublishOutcome:
        """Route a publish now and store it as a half message of ``txn_id``; the commit makes
        it visible where it was routed. ``route=False``: only to ``(topic, 0)`` (AMQP's default
        exchange). The outcome's ``refused`` are ack queues that refused it (reject-publish);
        its ``durable_mark`` covers the half (the commit waits for it anyway).
        :class:`TopicError` for an unknown topic; :class:`TransactionError` when ``txn_id``
        is not open."""
        node = self._node
        refused: Sequence[Destination] = ()
        if route:
            queue = node.choose_queue(node.topic(topic), None)
            destinations, refused = node.prepare_destinations(
                topic, queue, subject, routing_headers, extra_destinations
            )
        else:
            queue, destinations = 0, [(topic, 0)]
        shards = node.shards
        shard = shards.for_transaction(txn_id)
        if not shards.single:
            # Its commit is one LINK in the transaction's shard, which can index only that
            # shard's queues: a transaction across shards (section 10) is step 7's.
            for destination in destinations:
                if shards.queue_number(*destination) != shard.number:
                    raise TransactionError(
                        f"transaction {txn_id!r} is kept in shard {shard.number} and "
                        f"{destination[0]!r} queue {destination[1]} is in another: a "
                        "transaction across shards is not supported yet"
                    )
        appended = shard.transactions.add_nowait(
            txn_id,
            topic,
            queue,
            body,
            headers=headers,
            subject=subject,
            client=context.client_id,
            address=address,
            destinations=destinations if len(destinations) > 1 else None,
            protocol=context.protocol,
        )
        return PublishOutcome(appended, destinations, queue, list(refused), half=True)
