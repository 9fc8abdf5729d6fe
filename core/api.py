"""The Broker API: everything a gateway may use of the core, and nothing else.

A gateway (``gateway/amqp``, ``gateway/mqtt``, ``gateway/kafka``) imports ``core.api`` and no
other ``core`` module (``tests/test_layers.py`` enforces it). It is handed one
:class:`BrokerAPI` by the process that assembles the listeners (``braid/server.py``) and calls
only its methods; it never reaches into the broker's parts.

The contract, so that security, limits and the cluster fit behind the same calls later:

- **Who is calling.** Every call that acts for a client takes a :class:`ClientContext`
  (protocol, vhost, user, peer address, connection id). Authorization and limits are decided
  here, once, for every protocol.
- **Durability is a handle.** :meth:`BrokerAPI.publish` is a plain call: it routes and stores
  the record now (in the order the frames came) and returns a :class:`Publication`, whose
  ``result`` is there at once unless flow control holds the publish back, and which is
  *awaited* for durability. Where the record is stored (this process's log, another shard or
  node) is behind it.
- **Deliveries are pushed under credit.** :meth:`BrokerAPI.consume` attaches a consumer with a
  prefetch (AMQP prefetch, MQTT Receive Maximum) and returns a :class:`Subscription` with ack,
  nack/requeue, pause, resume and detach.
- **Nothing outlives the call.** No call returns a core object (a store, a queue, a table) or a
  buffer into the log's mappings that the caller may keep: what comes back is values
  (:class:`PublishOutcome`, :class:`QueueStats`, ``bytes``), value types re-exported below, or
  handles defined in this module.

Value types and constants a gateway needs (record fields, protocol codes, header names, error
types) are re-exported here, so this module is the one place that says what the boundary is.

Not thread-safe: the event loop's thread, like the broker behind it.
"""

from __future__ import annotations

# (AMQP section's imports)
# (MQTT section's imports)
# (Kafka section's imports)
# Re-exported for gateway/kafka (``X as X``: an explicit re-export).
from collections.abc import (
    Awaitable,
    Callable,
    Collection,
    Generator,
    Hashable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass
from typing import Any, Final

from core.broker.broker import BRAID_HEADER_PREFIX as BRAID_HEADER_PREFIX
from core.broker.broker import EXCHANGE_QUEUE, Broker, Destination, PublishResult
from core.broker.broker import may_carry_braid_headers as may_carry_braid_headers
from core.broker.eager import Pending, run_eagerly
from core.broker.topics import TopicError, TopicInfo
from core.deadletter.policy import DEAD_LETTER_REASON_HEADER as DEAD_LETTER_REASON_HEADER

# Re-exported for gateway/mqtt (``X as X``: an explicit re-export).
from core.deadletter.policy import DEAD_LETTER_SUBJECT_HEADER as DEAD_LETTER_SUBJECT_HEADER
from core.deadletter.policy import DEAD_LETTER_TOPIC_HEADER as DEAD_LETTER_TOPIC_HEADER
from core.deadletter.policy import X_DEATH_HEADER as X_DEATH_HEADER
from core.deadletter.policy import DeadLetterPolicy as DeadLetterPolicy
from core.delivery.ackqueue import OVERFLOW_DROP_HEAD as OVERFLOW_DROP_HEAD
from core.delivery.ackqueue import OVERFLOW_REJECT_PUBLISH as OVERFLOW_REJECT_PUBLISH
from core.delivery.ackqueue import AckQueueConfig as AckQueueConfig
from core.delivery.ackqueue import Delivery as Delivery
from core.delivery.handles import NO_CREDIT as NO_CREDIT
from core.delivery.handles import QueueHandle as QueueHandle
from core.delivery.handles import QueueStats as QueueStats
from core.delivery.handles import Settlements as Settlements
from core.delivery.handles import Subscription as Subscription
from core.delivery.handles import attach, take_one
from core.delivery.live import LiveFeed, LiveReader
from core.delivery.message import EXPIRES_AT_HEADER as EXPIRES_AT_HEADER
from core.delivery.message import Message as Message
from core.groups.results import GroupDescription as GroupDescription
from core.groups.results import GroupListing as GroupListing
from core.groups.results import JoinResult as JoinResult
from core.groups.results import LeaveResult as LeaveResult
from core.groups.results import SyncResult as SyncResult
from core.groups.state import GroupState as GroupState
from core.kafka_values import OffsetCommit as OffsetCommit
from core.kafka_values import OpenTransaction as OpenTransaction
from core.kafka_values import StorageSettings as StorageSettings
from core.log import record as rec
from core.log.batches import unpack_batch as unpack_batch
from core.log.names import is_system_topic as is_system_topic
from core.log.store import now_ms
from core.log.tags import TagFilter as TagFilter
from core.log.tags import parse_tag_expression as parse_tag_expression
from core.log.tags import tags_from_headers as tags_from_headers
from core.offsets.store import CommittedOffset as CommittedOffset
from core.routing.errors import RoutingError as RoutingError
from core.routing.live import EMPTY_LEVEL_TOPIC as EMPTY_LEVEL_TOPIC
from core.routing.mqtt_topic import LEVEL_SEPARATOR as LEVEL_SEPARATOR
from core.routing.mqtt_topic import MULTI_LEVEL as MULTI_LEVEL
from core.routing.mqtt_topic import ONE_LEVEL as ONE_LEVEL
from core.routing.mqtt_topic import filter_levels_match as filter_levels_match
from core.routing.mqtt_topic import mqtt_name_of, routing_key_of
from core.routing.mqtt_topic import parse_shared_subscription as parse_shared_subscription
from core.routing.mqtt_topic import validate_topic_filter as validate_topic_filter
from core.scoped_reads import STORED_BATCH as STORED_BATCH
from core.scoped_reads import STORED_TXN_CONTROL as STORED_TXN_CONTROL
from core.scoped_reads import StoredEntry as StoredEntry
from core.scoped_reads import StoredRecordReader as StoredRecordReader
from core.scoped_reads import stored_body as stored_body
from core.scoped_reads import stored_flags as stored_flags
from core.scoped_reads import stored_tags as stored_tags
from core.state.retained import RetainedMessages
from core.state.sessions import SessionStates
from core.transactions import TransactionError as TransactionError
from core.transactions.control import GROUP_HEADER as PRODUCER_GROUP_HEADER
from core.transactions.control import TXN_ID_HEADER as TXN_ID_HEADER

# (TagFilter and TransactionError: re-exported by the AMQP section's imports above.)
# The Kafka listener runs each request handler eagerly, to its first real wait, so that what
# a handler does before waiting happens in request order (core/broker/eager.py says why).
RestOfCoroutine = Pending
run_until_first_wait = run_eagerly

__all__ = [
    "EXCHANGE_QUEUE",
    "PRODUCER_GROUP_HEADER",
    "PROTOCOL_AMQP",
    "PROTOCOL_INTERNAL",
    "PROTOCOL_KAFKA",
    "PROTOCOL_MQTT",
    "BrokerAPI",
    "ClientContext",
    "Destination",
    "Headers",
    "Publication",
    "PublishOutcome",
    "TopicError",
    "TopicInfo",
    "mqtt_name_of",
    "now_ms",
    "routing_key_of",
]

# -- value types and constants of the boundary ------------------------------------------------

PROTOCOL_INTERNAL: Final = rec.PROTOCOL_INTERNAL
PROTOCOL_AMQP: Final = rec.PROTOCOL_AMQP
PROTOCOL_MQTT: Final = rec.PROTOCOL_MQTT
PROTOCOL_KAFKA: Final = rec.PROTOCOL_KAFKA
Headers = rec.Headers


@dataclass(frozen=True, slots=True)
class ClientContext:
    """Who is calling: one per connection (or per session), passed with every call.

    ``protocol`` is one of the ``PROTOCOL_*`` codes; ``vhost`` is the AMQP virtual host (``/``
    for MQTT and Kafka, whose names map into vhosts as docs/security.md says); ``user`` the
    authenticated user name (``""``: anonymous); ``peer`` the client's ``host:port``;
    ``connection_id`` names the connection in logs and in the management API; ``client_id`` is
    the protocol's own client name (MQTT client id, Kafka ``client.id``, AMQP
    ``connection_name``) recorded with each record it publishes.
    """

    protocol: int
    vhost: str = "/"
    user: str = ""
    peer: str = ""
    connection_id: str = ""
    client_id: str = ""


# The context of what the broker does on its own behalf (timers, dead letters, tools).
INTERNAL_CONTEXT: Final = ClientContext(PROTOCOL_INTERNAL, connection_id="internal")


@dataclass(frozen=True, slots=True)
class PublishOutcome:
    """What became of one publish once it is stored.

    ``offset``: the record's offset in its topic's own queue ``queue`` (-1 for a half message,
    which gets its offset when committed); ``refused``: destinations that refused it (an AMQP
    queue at ``x-overflow: reject-publish``; a transaction outcome that could not be applied),
    which AMQP answers with a nack; ``delivered_to``: every destination it was indexed in;
    ``durable_mark``: what :meth:`BrokerAPI.when_durable` takes to wait for this record and
    everything stored before it.
    """

    offset: int
    queue: int
    refused: tuple[Destination, ...]
    delivered_to: tuple[Destination, ...]
    half: bool
    durable_mark: int
    record_count: int = 1

    @staticmethod
    def of(result: PublishResult) -> PublishOutcome:
        return PublishOutcome(
            result.offset,
            result.queue,
            tuple(result.refused),
            tuple(result.destinations),
            result.half,
            result.appended.end,
        )


class Publication(Awaitable[PublishOutcome]):
    """The durability handle :meth:`BrokerAPI.publish` returns.

    ``stored``: the record is in the log (always, unless flow control held the publish back);
    then ``outcome`` says where it went. Awaiting the handle returns the outcome once the record
    is durable at its topic's durability (at once for an ``async`` topic). Await it at most once.
    """

    __slots__ = ("_api", "_outcome", "_pending", "_topic")

    def __init__(
        self,
        api: BrokerAPI,
        topic: str,
        outcome: PublishOutcome | None,
        pending: Pending[PublishResult] | None,
    ) -> None:
        self._api = api
        self._topic = topic
        self._outcome = outcome
        self._pending = pending

    @property
    def stored(self) -> bool:
        return self._outcome is not None

    @property
    def outcome(self) -> PublishOutcome:
        """Where the record went; only once ``stored`` (else :class:`RuntimeError`)."""
        if self._outcome is None:
            raise RuntimeError("publish held back by flow control: await the publication")
        return self._outcome

    def __await__(self) -> Generator[Any, Any, PublishOutcome]:
        outcome = self._outcome
        if outcome is None:
            assert self._pending is not None
            result = yield from self._pending.__await__()
            outcome = self._outcome = PublishOutcome.of(result)
        yield from self._api.when_durable(outcome.durable_mark, self._topic).__await__()
        return outcome

    def cancel(self) -> None:
        """Give up a publish held back by flow control (the connection closed)."""
        if self._pending is not None and self._outcome is None:
            self._pending.close()


class BrokerAPI:
    """The one object a gateway talks to (see the module docstring for the contract)."""

    def __init__(self, broker: Broker) -> None:
        self._broker = broker

    # -- publishing ----------------------------------------------------------------------------

    def publish(
        self,
        context: ClientContext,
        topic: str,
        body: bytes | memoryview | None,
        *,
        queue: int | None = None,
        key: bytes | None = None,
        subject: str = "",
        headers: Headers = (),
        routing_headers: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        address: str = "",
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        extra_destinations: Sequence[Destination] = (),
        create_topic: bool | None = None,
    ) -> Publication:
        """Route and store one record now; the handle is awaited for durability.

        Raises :class:`TopicError` for an unknown topic (unless auto-created) or queue.
        """
        started = run_eagerly(
            self._broker.publish(
                topic,
                body,
                queue=queue,
                key=key,
                subject=subject,
                headers=headers,
                routing_headers=routing_headers,
                tags=tags,
                protocol=context.protocol,
                client=context.client_id,
                address=address,
                born_ms=born_ms,
                deliver_at_ms=deliver_at_ms,
                extra_destinations=extra_destinations,
                create_topic=create_topic,
                wait_durable=False,
            )
        )
        if isinstance(started, Pending):
            return Publication(self, topic, None, started)
        return Publication(self, topic, PublishOutcome.of(started), None)

    def when_durable(self, durable_mark: int, topic: str | None = None) -> Awaitable[None]:
        """Wait until everything stored up to ``durable_mark`` (a
        :attr:`PublishOutcome.durable_mark`) is durable at ``topic``'s durability (the sync
        durability when no topic is given). Marks only grow: waiting for the last of several
        publishes covers them all."""
        return self._broker.store.wait_durable(durable_mark, topic)

    # -- topics --------------------------------------------------------------------------------

    def topic_info(self, name: str) -> TopicInfo | None:
        """The topic's description (a value), or None when there is none."""
        return self._broker.topics.get(name)

    def has_topic(self, name: str) -> bool:
        return name in self._broker.topics

    # -- AMQP: exchanges, queues, consumers, tx (gateway/amqp) ---------------------------------

    # Topics, exchanges and bindings. An AMQP exchange is a topic, an AMQP queue a topic whose
    # queue 0 is an ack queue; the gateway keeps its settings in the topic's config (see
    # gateway/amqp/vhost.py for the names).

    def topics_with_config(self, key: str) -> list[TopicInfo]:
        """Every topic (system topics left out) whose config has a ``key`` entry: what a
        gateway stored there to find its objects again at start."""
        return [info for info in self._broker.topics.all() if key in info.config]

    def declare_exchange(
        self, context: ClientContext, topic: str, config: Mapping[str, Any]
    ) -> bool:
        """Create ``topic`` (one queue) with ``config`` as its settings, or merge ``config``
        into the settings of the topic there is (one another protocol made becomes an exchange
        too). True when it was created; :class:`TopicError` for a name that cannot be one."""
        broker = self._broker
        info, created = broker.declare_topic(topic, 1, dict(config))
        if not created:
            info.config.update(config)
            broker.topics.update(info)
        return created

    def delete_exchange(self, context: ClientContext, topic: str) -> set[str]:
        """Delete the exchange ``topic`` with its bindings (as a source, and as the destination
        of exchange-to-exchange bindings). Returns the sources of the latter: exchanges that
        may now be left without bindings (AMQP's auto-delete)."""
        broker = self._broker
        destination = (topic, EXCHANGE_QUEUE)
        sources: set[str] = set()
        for binding in broker.bindings.bindings(destination=destination):
            sources.add(binding.source)
            broker.unbind(
                binding.source, binding.kind, binding.pattern, destination, binding.arguments
            )
        broker.delete_topic(topic)
        return sources

    def exchange_has_bindings(self, topic: str) -> bool:
        """Whether any binding has ``topic`` as its source."""
        return bool(self._broker.bindings.bindings(source=topic))

    def bind(
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
        return self._broker.bind(source, kind, pattern, destination, arguments)

    def unbind(
        self,
        context: ClientContext,
        source: str,
        kind: str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Remove a binding :meth:`bind` added; False if there was none."""
        return self._broker.unbind(source, kind, pattern, destination, arguments)

    def routed_destinations(
        self, topic: str, subject: str, headers: Mapping[str, Any] | None = None
    ) -> list[Destination]:
        """Where a record published to ``topic`` with ``subject`` (and ``headers``, for headers
        exchanges) would go through the bindings now, exchange-to-exchange ones followed."""
        return self._broker.route(topic, subject, headers)

    def has_ack_queue(self, destination: Destination) -> bool:
        """Whether ``destination`` is an ack queue (a queue consumers read, as opposed to a
        topic's own stream): a publish that reached one was routed, for AMQP's mandatory."""
        return destination in self._broker.ack_queues

    # Queues.

    def declare_queue(
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
        broker = self._broker
        info, created = broker.declare_topic(topic, 1, dict(config))
        if not created:
            info.config.update(config)
            broker.topics.update(info)
        if broker.ack_queue(topic) is not None:  # left by a queue deleted while its topic stayed
            broker.delete_ack_queue(topic)
        ack, _ = broker.declare_ack_queue(topic, 0, settings)
        ack.purge()
        return QueueHandle(ack)

    def open_queue(self, topic: str, settings: AckQueueConfig) -> QueueHandle:
        """The queue ``topic`` as it was stored (at start); its ack queue is made with
        ``settings`` if it has none."""
        broker = self._broker
        ack = broker.ack_queue(topic)
        if ack is None:
            ack, _ = broker.declare_ack_queue(topic, 0, settings)
        return QueueHandle(ack)

    def delete_queue(self, context: ClientContext, topic: str) -> set[str]:
        """Delete the queue ``topic``: its records' index, ack state and bindings go (the
        consumers still attached are detached). Returns the sources of its bindings:
        exchanges that may now be left without bindings (AMQP's auto-delete)."""
        broker = self._broker
        sources = {b.source for b in broker.bindings.bindings(destination=(topic, 0))}
        broker.delete_topic(topic)
        return sources

    def queue_info(self, topic: str) -> QueueStats | None:
        """The counts of the queue ``topic`` now, or None when there is none."""
        ack = self._broker.ack_queue(topic)
        return None if ack is None else QueueHandle(ack).stats()

    def enforce_max_length(self, destinations: Iterable[Destination]) -> None:
        """After records reached ``destinations`` other than by :meth:`publish` (a transaction
        committed): drop the heads of the ack queues among them over their max-length."""
        ack_queues = self._broker.ack_queues
        for destination in destinations:
            ack = ack_queues.get(destination)
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
        return self._broker.store.is_sync(topic)

    def publishing_blocked_reason(self) -> str | None:
        """While flow control holds publishers back: why (``memory``, ...), else None."""
        reasons = self._broker.flow.reasons
        return ", ".join(sorted(reasons)) if reasons else None

    def add_flow_listener(self, listener: Callable[[bool, str], None]) -> None:
        """``listener(blocked, reason)`` on every change between blocked and unblocked
        (AMQP's connection.blocked / connection.unblocked)."""
        self._broker.flow.add_listener(listener)

    def remove_flow_listener(self, listener: Callable[[bool, str], None]) -> None:
        self._broker.flow.remove_listener(listener)

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
        broker = self._broker
        refused: Sequence[Destination] = ()
        if route:
            queue = broker.choose_queue(broker.topic(topic, create=False), None)
            destinations, refused = broker.prepare_destinations(
                topic, queue, subject, routing_headers, extra_destinations
            )
        else:
            queue, destinations = 0, [(topic, 0)]
        appended = broker.transactions.add_nowait(
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
        return PublishOutcome(-1, queue, tuple(refused), tuple(destinations), True, appended.end)

    # (end of the AMQP section)

    # -- MQTT: sessions, live subscriptions, retained messages (gateway/mqtt) -------------------
    # Live subscriptions (MQTT clean sessions): no queue; one router for every protocol
    # (core/routing/live.py). A subscriber is the caller's own hashable object, handed back by
    # live_subscribers. Records stored by others reach the followers (follow_live_records).

    _live: LiveFeed | None = None

    def _live_feed(self) -> LiveFeed:
        feed = self._live
        if feed is None:
            feed = self._live = LiveFeed(self._broker.store)
        return feed

    def subscribe_live(
        self, context: ClientContext, topic_filter: str, subscriber: Hashable
    ) -> None:
        """Add a live subscription: a valid, non-shared MQTT filter over full topic names."""
        self._live_feed().router.add(topic_filter, subscriber)

    def unsubscribe_live(
        self, context: ClientContext, topic_filter: str, subscriber: Hashable
    ) -> bool:
        """Undo one :meth:`subscribe_live`; False if there was none."""
        return self._live_feed().router.remove(topic_filter, subscriber)

    def has_live_subscriptions(self) -> bool:
        feed = self._live
        return feed is not None and feed.router.count > 0

    def live_subscribers(self, topic_name: str) -> tuple[Any, ...]:
        """The subscribers of every live subscription matching ``topic_name`` (each once)."""
        return self._live_feed().router.match(topic_name)

    def follow_live_records(self, context: ClientContext, reader: LiveReader) -> None:
        """Call ``reader(message)`` for every record stored by someone else (another
        protocol's publish, a delayed record when due, a commit, a dead letter) that a live
        subscription may match, soon after it is stored (core/delivery/live.py). A
        :class:`Message` is valid during the call only."""
        self._live_feed().follow(reader)

    def unfollow_live_records(self, reader: LiveReader) -> None:
        if self._live is not None:
            self._live.unfollow(reader)

    def publish_delivering_live(
        self,
        context: ClientContext,
        topic: str,
        body: bytes | memoryview | None,
        *,
        subject: str = "",
        headers: Headers = (),
        address: str = "",
        deliver_at_ms: int = 0,
        create_topic: bool | None = None,
    ) -> Publication:
        """:meth:`publish` for a caller that hands the record to the live subscriptions itself
        (the MQTT gateway, from the PUBLISH in hand, without reading it back): the record's own
        index entry is not read back for the followers; entries the publish made elsewhere
        (dead letters, a record held back by flow control and stored later) still are."""
        feed = self._live
        if feed is None:
            return self.publish(
                context,
                topic,
                body,
                subject=subject,
                headers=headers,
                address=address,
                deliver_at_ms=deliver_at_ms,
                create_topic=create_topic,
            )
        feed.begin_own_publish(topic)
        try:
            return self.publish(
                context,
                topic,
                body,
                subject=subject,
                headers=headers,
                address=address,
                deliver_at_ms=deliver_at_ms,
                create_topic=create_topic,
            )
        finally:
            feed.end_own_publish()

    def is_durable(self, durable_mark: int, topic: str | None = None) -> bool:
        """Whether :meth:`when_durable` would return at once (a synchronous check for a batch
        of acknowledgements that mostly need no wait)."""
        store = self._broker.store
        return store.commitlog.flushed_position >= durable_mark or (
            topic is not None and not store.is_sync(topic)
        )

    # Routing every protocol's records to MQTT subscriptions (a route hook), and the amq.topic
    # compatibility exchange (RabbitMQ's MQTT plugin).

    def mqtt_compat_exchange(self) -> str | None:
        """The AMQP topic exchange MQTT publishes also go through (BrokerConfig.mqtt_exchange)."""
        return self._broker.config.mqtt_exchange

    def add_route_hook(
        self,
        context: ClientContext,
        hook: Callable[[str, str, bytes | None, int, str], list[Destination]],
        *,
        may_route: Callable[[str], bool] | None = None,
    ) -> None:
        """Every publish (any protocol, plain or batch) also goes to what ``hook(topic,
        subject, key, protocol, address)`` returns; ``may_route(topic)`` False promises it
        returns nothing for ``topic`` now (a Kafka batch is then stored without decoding it)."""
        self._broker.add_route_hook(hook, may_route=may_route)

    def remove_route_hook(
        self, hook: Callable[[str, str, bytes | None, int, str], list[Destination]]
    ) -> None:
        self._broker.remove_route_hook(hook)

    def route_through(self, source: str, subject: str) -> list[Destination]:
        """The queues a record published to ``source`` with ``subject`` reaches through
        bindings, following exchange-to-exchange bindings."""
        return self._broker.route(source, subject)

    def bound_destinations(self, source: str, subject: str) -> set[Destination]:
        """The destinations bound on ``source`` matching ``subject`` directly (one lookup, no
        exchange-to-exchange hops: the per-publish path of the MQTT global bindings)."""
        return self._broker.bindings.route(source, subject)

    # Durable queues of persistent sessions and shared groups: ack queues of their own (no
    # topic), fed by bindings, read through consume_session_queue.

    def declare_session_queue(
        self,
        context: ClientContext,
        name: str,
        *,
        tag_filter: TagFilter | None = None,
        empty: bool = False,
    ) -> bool:
        """Get or create the durable queue ``name`` (True: created, starting empty, with
        ``tag_filter``); ``empty`` drops an existing queue's backlog too."""
        queue, created = self._broker.declare_ack_queue(
            name, 0, AckQueueConfig(tag_filter=tag_filter) if tag_filter is not None else None
        )
        if created or empty:
            queue.purge()
        return created

    def discard_session_queue(self, context: ClientContext, name: str) -> bool:
        """Delete the queue, its bindings and its index; False if there was none."""
        return self._broker.discard_ack_queue(name) is not None

    def has_session_queue(self, name: str) -> bool:
        return self._broker.ack_queue(name) is not None

    def session_queue_names(self, prefixes: tuple[str, ...]) -> list[str]:
        """The names of the queues (of queue number 0) starting with one of ``prefixes``."""
        return [
            topic
            for topic, number in self._broker.ack_queues
            if number == 0 and topic.startswith(prefixes)
        ]

    def set_session_queue_tag_filter(
        self, context: ClientContext, name: str, tag_filter: TagFilter | None
    ) -> None:
        """The queue skips, by the index's tag mask, the records ``tag_filter`` refuses (None:
        none); kept in memory (the caller sets it again after a restart)."""
        queue = self._broker.ack_queue(name)
        if queue is None:
            return
        current = queue.config.tag_filter
        if (current is None) != (tag_filter is None) or (
            current is not None and tag_filter is not None and current.tags != tag_filter.tags
        ):
            queue.config.tag_filter = tag_filter

    def bind_session_queue(
        self, context: ClientContext, source: str, kind: str, pattern: str, name: str
    ) -> bool:
        """A durable binding from ``source`` (``kind``: "topic" or "mqtt") to the queue; False if
        it existed already."""
        return self._broker.bind(source, kind, pattern, (name, 0))

    def unbind_session_queue(
        self, context: ClientContext, source: str, kind: str, pattern: str, name: str
    ) -> bool:
        return self._broker.unbind(source, kind, pattern, (name, 0))

    def session_queue_bindings(self, prefixes: tuple[str, ...]) -> list[tuple[str, str, str, str]]:
        """``(source, kind, pattern, queue name)`` of every binding to a queue named with one of
        ``prefixes``."""
        return [
            (binding.source, binding.kind.value, binding.pattern, binding.destination[0])
            for binding in self._broker.bindings.bindings()
            if binding.destination[1] == 0 and binding.destination[0].startswith(prefixes)
        ]

    def consume_session_queue(
        self,
        context: ClientContext,
        name: str,
        prefetch: int,
        deliver: Callable[[Delivery], None],
    ) -> Subscription | None:
        """Attach a consumer (tagged with the context's client id) that is pushed the queue's
        records while it has fewer than ``prefetch`` in flight; None if there is no queue."""
        queue = self._broker.ack_queue(name)
        if queue is None:
            return None
        return Subscription(queue.add_consumer(context.client_id, prefetch, deliver))

    # Retained messages (core/state/retained.py) and session states (core/state/sessions.py):
    # durable in the log, values in the gateway's own layout.

    _retained: RetainedMessages | None = None
    _session_states: SessionStates | None = None

    def _retained_messages(self) -> RetainedMessages:
        table = self._retained
        if table is None:
            table = self._retained = RetainedMessages(self._broker.store)
        return table

    def _sessions(self) -> SessionStates:
        table = self._session_states
        if table is None:
            table = self._session_states = SessionStates(self._broker.store)
        return table

    def store_retained(self, context: ClientContext, topic_name: str, value: bytes | None) -> None:
        """Retain ``value`` for ``topic_name`` (None clears it)."""
        self._retained_messages().put(topic_name, value)

    def retained_matching(self, topic_filter: str) -> list[tuple[str, bytes]]:
        """``(topic name, value)`` of the retained messages a (non-shared) filter matches."""
        return self._retained_messages().matching(topic_filter)

    def retained_count(self) -> int:
        return len(self._retained_messages())

    def save_session_state(self, context: ClientContext, client_id: str, state: bytes) -> None:
        self._sessions().save(client_id, state)

    def delete_session_state(self, context: ClientContext, client_id: str) -> None:
        self._sessions().delete(client_id)

    def session_states(self) -> list[tuple[str, bytes]]:
        """``(client id, state)`` of every saved session."""
        return self._sessions().items()

    # (end of the MQTT section)

    # -- Kafka: partitions, stored batches, groups, producers, transactions (gateway/kafka) ------
    # Topics as Kafka sees them: partitions are the topic's queues; system topics are hidden.

    def list_topics(self) -> list[TopicInfo]:
        """Every topic but the system ones, by name."""
        return self._broker.topics.all()

    def create_topic(
        self,
        context: ClientContext,
        name: str,
        partitions: int,
        config: Mapping[str, Any] | None = None,
    ) -> TopicInfo:
        """Declare ``name`` with ``partitions`` queues (an existing topic is returned as is)."""
        return self._broker.declare_topic(name, partitions, dict(config) if config else None)[0]

    def delete_topic(self, context: ClientContext, name: str) -> bool:
        """Delete the topic, its queues, bindings and committed offsets; False if unknown."""
        return self._broker.delete_topic(name)

    def add_partitions(self, context: ClientContext, name: str, total: int) -> TopicInfo:
        """Grow the topic to ``total`` queues (:class:`TopicError` if unknown)."""
        return self._broker.topics.add_queues(name, total)

    def storage_settings(self, topic: str | None = None) -> StorageSettings:
        """The log's retention and segment size, and ``topic``'s durability (DescribeConfigs)."""
        config = self._broker.store.config
        return StorageSettings(
            config.retention_ms,
            config.retention_bytes,
            config.segment_size,
            config.durability_for(topic) if topic is not None else config.durability,
        )

    # Producing: a RecordBatch stored as ONE batch record, indexed once, never re-encoded.

    def publishing_blocked(self) -> bool:
        """Flow control holds publishers back now (Kafka answers with a throttle time)."""
        return self._broker.flow.blocked

    async def wait_publishing_allowed(self) -> None:
        """Return once flow control lets publishers go on (at once when it does now)."""
        if self._broker.flow.blocked:
            await self._broker.flow.wait_unblocked()

    def produce_batch(
        self,
        context: ClientContext,
        topic: str,
        partition: int,
        batch: bytes | memoryview,
        record_count: int,
        *,
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        braid_headers: bool | None = None,
        transaction: str | None = None,
    ) -> Publication:
        """Store a Kafka RecordBatch in ``(topic, partition)`` now, as one batch record routed
        by its records' subjects (decoded only when the topic has bindings); the handle is
        awaited for durability. ``braid_headers=False``: the caller searched the batch and
        found no ``x-braid-`` header name (no tags, no half), so it is not searched again.
        ``transaction``: a transaction of :meth:`begin_transaction`; the batch is stored as a
        half message, visible (and given its offset) when that commits. A delayed batch
        (``deliver_at_ms``) gets its offset when it becomes visible. Raises
        :class:`TopicError` for an unknown topic or partition."""
        if transaction is not None:
            appended = self._broker.transactions.add_nowait(
                transaction,
                topic,
                partition,
                batch,
                protocol=rec.PROTOCOL_KAFKA,
                flags=rec.FLAG_BATCH,
                record_count=record_count,
                born_ms=born_ms,
                client=context.client_id,
            )
            # A half is indexed only in __half: its offset comes with the commit's LINK.
            outcome = PublishOutcome(
                -1, partition, (), ((topic, partition),), True, appended.end, record_count
            )
            return Publication(self, topic, outcome, None)
        return self._stored_batch(
            topic,
            run_eagerly(
                self._broker.publish_batch(
                    topic,
                    partition,
                    batch,
                    record_count,
                    born_ms=born_ms,
                    client=context.client_id,
                    deliver_at_ms=deliver_at_ms,
                    wait_durable=False,
                    braid_headers=braid_headers,
                )
            ),
        )

    def write_transaction_marker(
        self,
        context: ClientContext,
        topic: str,
        partition: int,
        marker: bytes,
        *,
        born_ms: int,
    ) -> Publication:
        """Store a Kafka control batch (a COMMIT or ABORT marker) in ``(topic, partition)``;
        :class:`TopicError` if the partition is gone."""
        return self._stored_batch(
            topic,
            run_eagerly(
                self._broker.publish_batch(
                    topic,
                    partition,
                    marker,
                    1,
                    born_ms=born_ms,
                    flags=rec.FLAG_TXN_CONTROL,
                    wait_durable=False,
                )
            ),
        )

    def _stored_batch(
        self, topic: str, started: PublishResult | Pending[PublishResult]
    ) -> Publication:
        if isinstance(started, Pending):
            return Publication(self, topic, None, started)
        return Publication(self, topic, PublishOutcome.of(started), None)

    def read_tail_batch_headers(
        self, topic: str, partition: int, *, max_entries: int, header_size: int
    ) -> list[tuple[int, bytes]]:
        """``(base offset, first header_size bytes)`` of the producer batches (no control
        batches) among the last ``max_entries`` index entries of a partition, oldest first:
        what rebuilds a partition's idempotent-producer state after a restart (copies)."""
        store = self._broker.store
        index = store.queue_index(topic, partition)
        if index is None:
            return []
        start, end = store.queue_bounds(topic, partition)
        first_entry = max(index.start_entry, index.next_entry - max_entries)
        if first_entry >= index.next_entry or start >= end:
            return []
        found: list[tuple[int, bytes]] = []
        offset = max(index.entry(first_entry).first_offset, start)
        while offset < end:
            entries = store.read(topic, partition, offset, max_records=2**62)  # bytes bound it
            if not entries:
                break
            for entry in entries:
                offset = entry.next_offset
                flags = stored_flags(entry)
                if flags & rec.FLAG_BATCH and not flags & rec.FLAG_TXN_CONTROL:
                    found.append((entry.offset, bytes(stored_body(entry)[:header_size])))
        return found

    # Fetching: stored batches served as stored, views of the log valid during the call only.

    def serve_stored_records(
        self, context: ClientContext, respond: Callable[[StoredRecordReader], bytes | None]
    ) -> bytes | None:
        """Call ``respond`` with a reader of stored entries and return what it returns: the
        response built from them (``None``: nothing to answer yet). The entries hold views of
        the log's memory maps (the fetch fast path copies each batch once, into the response
        frame): they are valid until ``respond`` returns, and the reader is closed then."""
        reader = StoredRecordReader(self._broker.store)
        try:
            return respond(reader)
        finally:
            reader.close()

    def partition_offsets(self, topic: str, partition: int) -> tuple[int, int]:
        """``(log start offset, high watermark)``; the last stable offset is the high
        watermark (open transactions are half messages, invisible in the partition)."""
        return self._broker.store.queue_bounds(topic, partition)

    def first_offset_stored_since(self, topic: str, partition: int, timestamp_ms: int) -> int:
        """The first offset the broker stored at or after ``timestamp_ms`` (the index's store
        time); the high watermark if none."""
        return self._broker.store.offset_for_time(topic, partition, timestamp_ms)

    def stored_time_of(self, topic: str, partition: int, offset: int) -> tuple[int, int] | None:
        """``(offset, store time in ms)`` of the entry holding ``offset``; None if none."""
        entries = self._broker.store.read(topic, partition, offset, max_records=1)
        return (entries[0].offset, entries[0].store_ms) if entries else None

    async def wait_for_records(
        self, context: ClientContext, partitions: Sequence[Destination], timeout_s: float
    ) -> bool:
        """Long poll: True once any of ``partitions`` got a new entry, False after
        ``timeout_s``."""
        return await self._broker.wait_for_records(partitions, timeout_s)

    # Consumer groups (Kafka's classic protocol): the coordinator answers with Kafka's codes.

    async def join_group(
        self,
        context: ClientContext,
        group_id: str,
        member_id: str,
        group_instance_id: str | None,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        *,
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        client_host: str,
        require_known_member_id: bool,
    ) -> JoinResult:
        """JoinGroup: returns once the rebalance completes (or at once, with an error)."""
        return await self._broker.groups.join(
            group_id,
            member_id,
            group_instance_id,
            protocol_type,
            protocols,
            session_timeout_ms,
            rebalance_timeout_ms,
            client_id=context.client_id,
            client_host=client_host,
            require_known_member_id=require_known_member_id,
        )

    async def sync_group(
        self,
        context: ClientContext,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
        assignments: Mapping[str, bytes],
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> SyncResult:
        """SyncGroup: the leader's assignments in, each member's out."""
        return await self._broker.groups.sync(
            group_id,
            generation_id,
            member_id,
            group_instance_id,
            dict(assignments),
            protocol_type,
            protocol_name,
        )

    def heartbeat(
        self,
        context: ClientContext,
        group_id: str,
        generation_id: int,
        member_id: str,
        group_instance_id: str | None,
    ) -> int:
        """Heartbeat: a Kafka error code (0: none)."""
        return int(
            self._broker.groups.heartbeat(group_id, generation_id, member_id, group_instance_id)
        )

    def leave_group(
        self,
        context: ClientContext,
        group_id: str,
        members: Sequence[tuple[str, str | None]],
    ) -> LeaveResult:
        """LeaveGroup of ``(member id, group instance id)`` members."""
        return self._broker.groups.leave(group_id, list(members))

    def describe_group(self, context: ClientContext, group_id: str) -> GroupDescription:
        return self._broker.groups.describe(group_id)

    def group_state(self, group_id: str) -> GroupState | None:
        """The group's state; None for a group the coordinator does not know."""
        return self._broker.groups.state(group_id)

    def list_groups(
        self, context: ClientContext, states: Collection[str] | None = None
    ) -> list[GroupListing]:
        return self._broker.groups.list_groups(states)

    def delete_groups(self, context: ClientContext, group_ids: Iterable[str]) -> dict[str, int]:
        """DeleteGroups: each group's error code; a deleted group's offsets go with it."""
        errors = self._broker.groups.delete_groups(group_ids)
        for group_id, error in errors.items():
            if error == 0:
                self._broker.offsets.delete_group(group_id)
        return {group_id: int(error) for group_id, error in errors.items()}

    def validate_group_member(
        self,
        context: ClientContext,
        group_id: str,
        member_id: str,
        generation_id: int,
        group_instance_id: str | None = None,
        *,
        transactional: bool = False,
    ) -> int:
        """May this member commit offsets for the group now? A Kafka error code (0: yes)."""
        return int(
            self._broker.groups.validate_member(
                group_id,
                member_id,
                generation_id,
                group_instance_id,
                transactional=transactional,
            )
        )

    async def commit_offsets(
        self, context: ClientContext, group_id: str, commits: Iterable[OffsetCommit]
    ) -> None:
        """Commit ``(topic, partition, offset, leader epoch, metadata)`` for the group;
        returns once durable (in ``__offsets``)."""
        await self._broker.offsets.commit(group_id, commits)

    def commit_offsets_nowait(
        self, context: ClientContext, group_id: str, commits: Iterable[OffsetCommit]
    ) -> int:
        """:meth:`commit_offsets` without waiting: the durable mark to wait for."""
        return self._broker.offsets.commit_nowait(group_id, commits)

    def fetch_offset(
        self, context: ClientContext, group_id: str, topic: str, partition: int
    ) -> CommittedOffset | None:
        return self._broker.offsets.fetch(group_id, topic, partition)

    def fetch_group_offsets(
        self, context: ClientContext, group_id: str
    ) -> dict[Destination, CommittedOffset]:
        """Every committed offset of the group, by ``(topic, partition)``."""
        return self._broker.offsets.fetch_group(group_id)

    # Transactions: half messages (RocketMQ semantics), the base of Kafka transactions.

    def open_transactions(self) -> list[OpenTransaction]:
        """Every transaction still open (after a restart: the ones it cut)."""
        return [
            OpenTransaction(pending.txn_id, pending.producer_group, pending.halves)
            for pending in self._broker.transactions.pending()
        ]

    def begin_transaction(
        self, context: ClientContext, producer_group: str, transaction_id: str, *, timeout_ms: int
    ) -> str:
        """Open a transaction whose halves are decided by the producer alone: it is never
        asked back, and after ``timeout_ms`` it is rolled back. Returns its id."""
        service = self._broker.transactions
        service.set_check_back(producer_group, None)
        return service.begin(producer_group, transaction_id, timeout_ms=timeout_ms)

    async def commit_transaction(self, context: ClientContext, transaction_id: str) -> None:
        """Make every half of the transaction visible at once (one LINK); returns once
        durable. :class:`TransactionError` if it was decided otherwise meanwhile."""
        await self._broker.transactions.commit(transaction_id)

    async def roll_back_transaction(self, context: ClientContext, transaction_id: str) -> None:
        """Discard every half of the transaction; returns once durable."""
        await self._broker.transactions.rollback(transaction_id)

    # The broker's metadata table (``__meta``): small durable settings a gateway keeps.

    def metadata_items(self, prefix: str) -> list[tuple[str, bytes]]:
        """Every ``(key, value)`` whose key starts with ``prefix``."""
        return [item for item in self._broker.topics.table.items() if item[0].startswith(prefix)]

    def metadata_value(self, key: str) -> bytes | None:
        return self._broker.topics.table.get(key)

    def put_metadata(self, key: str, value: bytes) -> int:
        """Store ``key``; returns the durable mark to wait for (:meth:`when_durable`)."""
        return self._broker.topics.table.put(key, value).end

    def delete_metadata(self, key: str) -> int | None:
        """Delete ``key``; the durable mark to wait for, None if there was no such key."""
        deleted = self._broker.topics.table.delete(key)
        return deleted.end if deleted is not None else None

    # (end of the Kafka section)
