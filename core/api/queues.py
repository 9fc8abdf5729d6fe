"""Exchanges, queues, bindings, consumers, basic.get, flow listeners and tx: the Broker
API's calls for queues and their consumers (AMQP's model)."""

from __future__ import annotations

# (AMQP section's imports)
# (MQTT section's imports)
# (Kafka section's imports)
from collections.abc import (
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from typing import Any

from core.api.base import BrokerCalls, ClientContext, Headers, PublishOutcome
from core.broker.broker import (
    EXCHANGE_QUEUE,
    Destination,
)
from core.broker.topics import TopicInfo
from core.delivery.ackqueue import (
    AckQueueConfig,
    Delivery,
)
from core.delivery.handles import (
    QueueHandle,
    QueueStats,
    Subscription,
    attach,
    take_one,
)
from core.limits import QUEUE_VHOST_KEY
from core.transactions import TransactionError


class QueueCalls(BrokerCalls):
    """Exchanges, queues, bindings, consumers and tx."""

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
        return self._node.ack_queue(*destination) is not None

    # Queues.

    async def declare_queue(
        self,
        context: ClientContext,
        topic: str,
        config: Mapping[str, Any],
        settings: AckQueueConfig,
    ) -> QueueHandle:
        """Create the queue ``topic``: a topic (one queue, ``config`` merged into its
        settings) whose queue 0 is an ack queue with ``settings``. The queue starts empty, even
        where an earlier queue of that name left index entries or ack state.
        :class:`TopicError` for a name that cannot be a topic."""
        node = self._node
        # The queue's topic, config merged; marked to count for the queue limits of its vhost.
        await self.declare_exchange(context, topic, {**config, QUEUE_VHOST_KEY: context.vhost})
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

    def queue_info(self, context: ClientContext, topic: str) -> QueueStats | None:
        """The counts of the queue ``topic`` now, or None when there is none."""
        ack = self._node.ack_queue(topic)
        return None if ack is None else QueueHandle(ack).stats()

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
        Settle deliveries with a :class:`Settlements`."""
        return attach(queue, tag, prefetch, deliver, no_ack=no_ack)

    def get_message(
        self, context: ClientContext, queue: QueueHandle, *, no_ack: bool
    ) -> Delivery | None:
        """AMQP's basic.get: the next ready record of ``queue``, held by no consumer (settled
        with a :class:`Settlements` unless ``no_ack``), or None when there is none."""
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
