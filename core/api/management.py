"""What the management API reads and does (issue 19): the Broker API's calls for operators.

The HTTP management API (``braid/web/``) answers RabbitMQ's ``/api/queues``,
``/api/exchanges``, ``/api/bindings`` and BraidMQ's own ``/api/braid/...`` from these calls, so
that it, like a gateway, sees the core only through :class:`~core.api.BrokerAPI`. Every call
takes the :class:`ClientContext` of the HTTP user; what comes back are values made for the call
(:class:`BindingView`, :class:`ConsumerView`, :class:`BrowsedMessage`, copies of
:class:`TopicInfo`), never a core object.

Declaring and deleting AMQP exchanges and queues, and binding them, is the AMQP listener's job:
its virtual hosts hold what the log does not (a queue's consumers, owner and expiry timer) and
make RabbitMQ's equivalence checks. So the listener registers one
:class:`ObjectAdministrator` per vhost here at start
(:meth:`ManagementCalls.register_object_administrator`), and the management API's
``manage_*`` calls go to it: a queue declared over HTTP is the queue AMQP clients see at once,
with the same checks and error texts, and ``braid/web`` never holds a gateway's objects. A
refusal comes back as :class:`ManagementRefusal`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from core.api.base import BrokerCalls, ClientContext
from core.api.queues import QueueCalls
from core.broker.topics import TopicInfo
from core.deadletter import redrive as dead_letters
from core.deadletter.redrive import DeadLetterQueue, RedriveResult, SubjectOf
from core.delivery.ackqueue import Delivery
from core.delivery.message import Message, messages_of


@dataclass(frozen=True, slots=True)
class BindingView:
    """One binding: from the topic ``source`` to ``destination`` (an ack queue's topic when
    ``destination_queue`` is 0, an exchange's topic when it is the exchange queue)."""

    source: str
    kind: str
    pattern: str
    destination: str
    destination_queue: int
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ConsumerView:
    """One consumer attached to an ack queue."""

    queue_topic: str
    tag: str
    prefetch: int
    inflight: int
    ack_required: bool


@dataclass(frozen=True, slots=True)
class BrowsedMessage:
    """A record taken from a queue by :meth:`ManagementCalls.browse_queue` (copied out)."""

    topic: str
    subject: str
    headers: list[tuple[str, bytes]]
    body: bytes
    protocol: int
    client: str
    born_ms: int
    store_ms: int
    redelivered: bool
    offset: int


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """A consumer group's position in one partition: its committed offset, the partition's
    log start and end (high watermark), and the lag (end - committed; kafka_exporter's
    ``kafka_consumergroup_lag``)."""

    topic: str
    partition: int
    committed: int
    log_start: int
    log_end: int
    lag: int


@dataclass(frozen=True, slots=True)
class GroupLag:
    """A consumer group with its members and its lag per partition it committed in."""

    group_id: str
    state: str
    protocol_type: str
    members: list[tuple[str, str, str]]  # (member id, client id, client host)
    partitions: list[PartitionLag]

    @property
    def lag(self) -> int:
        return sum(partition.lag for partition in self.partitions)


@dataclass(frozen=True, slots=True)
class DelayedDestination:
    """Delayed records that will become visible in one queue (``topic``'s queue or
    partition ``queue``): how many, and the earliest due time (ms since the epoch)."""

    topic: str
    queue: int
    messages: int
    next_due_ms: int


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """One record as stored at ``(topic, queue, offset)`` (a copy): ``message`` is what a
    consumer of that queue is handed (one record of a batch: its own key, headers, value and
    timestamp); ``batch_records`` is how many records the stored entry holds (1: a plain
    record; more: a Kafka RecordBatch stored as one record)."""

    message: Message
    batch_records: int


# ManagementRefusal kinds: what the management API answers (RabbitMQ: 404, 400, 401, 503).
REFUSED_NOT_FOUND: Final = "not_found"
REFUSED_PRECONDITION: Final = "precondition"  # AMQP 406 and other bad requests
REFUSED_ACCESS: Final = "access"  # AMQP 403
REFUSED_UNAVAILABLE: Final = "unavailable"  # no listener owns the vhost's objects


class ManagementRefusal(Exception):
    """An operator action refused: ``kind`` (one of the ``REFUSED_*``) and the owning
    protocol's own text (for AMQP objects RabbitMQ's, ``PRECONDITION_FAILED - inequivalent
    arg 'durable' ...``)."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(text)
        self.kind = kind
        self.text = text


class ObjectAdministrator(Protocol):
    """What the listener that owns a vhost's AMQP objects does for an operator. Each call
    raises :class:`ManagementRefusal` for what the protocol would refuse."""

    async def declare_exchange(
        self,
        context: ClientContext,
        name: str,
        ex_type: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
    ) -> bool:
        """Declare (or redeclare, equivalent) an exchange; True when it was created."""
        ...

    async def delete_exchange(self, context: ClientContext, name: str, *, if_unused: bool) -> bool:
        """Delete an exchange; False when there was none."""
        ...

    async def declare_queue(
        self,
        context: ClientContext,
        name: str,
        *,
        durable: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any],
    ) -> bool:
        """Declare (or redeclare, equivalent) a queue owned by no connection; True when it
        was created."""
        ...

    async def delete_queue(
        self, context: ClientContext, name: str, *, if_unused: bool, if_empty: bool
    ) -> bool:
        """Delete a queue (its consumers are cancelled); False when there was none."""
        ...

    async def bind(
        self,
        context: ClientContext,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: Mapping[str, Any],
        *,
        unbind: bool,
    ) -> None:
        """Bind (or unbind) the exchange ``source`` to a ``"queue"`` or an ``"exchange"``."""
        ...

    def publish_topic(self, context: ClientContext, exchange: str, routing_key: str) -> str | None:
        """The topic a publish to ``exchange`` goes to; None for the default exchange when no
        queue is named ``routing_key`` (unroutable); not found for a missing exchange."""
        ...


class ManagementCalls(BrokerCalls):
    """Listings, counts and operator actions (purge, browse) over the broker's objects."""

    _object_administrators: dict[str, ObjectAdministrator] | None = None

    # -- the AMQP objects, through the listener that owns them -----------------------------

    def register_object_administrator(
        self, context: ClientContext, vhost: str, administrator: ObjectAdministrator
    ) -> None:
        """The AMQP listener, at start: ``administrator`` acts on ``vhost``'s objects."""
        if self._object_administrators is None:
            self._object_administrators = {}
            # Before the listener serves a client: a redrive a crash interrupted is finished,
            # so no record of it is consumed from both queues (core/deadletter/redrive.py).
            for shard in self._node.shards:
                dead_letters.settle_interrupted(shard)
        self._object_administrators[vhost] = administrator

    def unregister_object_administrator(self, context: ClientContext, vhost: str) -> None:
        """The AMQP listener, at close."""
        if self._object_administrators is not None:
            self._object_administrators.pop(vhost, None)

    def _administrator(self, vhost: str) -> ObjectAdministrator:
        found = (self._object_administrators or {}).get(vhost)
        if found is None:
            raise ManagementRefusal(
                REFUSED_UNAVAILABLE, f"the AMQP listener does not serve vhost {vhost!r}"
            )
        return found

    async def manage_declare_exchange(
        self,
        context: ClientContext,
        name: str,
        ex_type: str,
        *,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any],
    ) -> bool:
        """Declare an exchange in the context's vhost; True when it was created."""
        return await self._administrator(context.vhost).declare_exchange(
            context,
            name,
            ex_type,
            durable=durable,
            auto_delete=auto_delete,
            internal=internal,
            arguments=arguments,
        )

    async def manage_delete_exchange(
        self, context: ClientContext, name: str, *, if_unused: bool
    ) -> bool:
        """Delete an exchange of the context's vhost; False when there was none."""
        return await self._administrator(context.vhost).delete_exchange(
            context, name, if_unused=if_unused
        )

    async def manage_declare_queue(
        self,
        context: ClientContext,
        name: str,
        *,
        durable: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any],
    ) -> bool:
        """Declare a queue in the context's vhost; True when it was created."""
        return await self._administrator(context.vhost).declare_queue(
            context, name, durable=durable, auto_delete=auto_delete, arguments=arguments
        )

    async def manage_delete_queue(
        self, context: ClientContext, name: str, *, if_unused: bool, if_empty: bool
    ) -> bool:
        """Delete a queue of the context's vhost; False when there was none."""
        return await self._administrator(context.vhost).delete_queue(
            context, name, if_unused=if_unused, if_empty=if_empty
        )

    async def manage_bind(
        self,
        context: ClientContext,
        source: str,
        destination_type: str,
        destination: str,
        routing_key: str,
        arguments: Mapping[str, Any],
        *,
        unbind: bool,
    ) -> None:
        """Bind or unbind in the context's vhost (``destination_type``: queue, exchange)."""
        await self._administrator(context.vhost).bind(
            context,
            source,
            destination_type,
            destination,
            routing_key,
            arguments,
            unbind=unbind,
        )

    def manage_publish_topic(
        self, context: ClientContext, exchange: str, routing_key: str
    ) -> str | None:
        """The topic a management publish to ``exchange`` of the context's vhost goes to
        (None: the default exchange has no such queue)."""
        return self._administrator(context.vhost).publish_topic(context, exchange, routing_key)

    # -- listings --------------------------------------------------------------------------

    def group_lags(self, context: ClientContext, group_id: str | None = None) -> list[GroupLag]:
        """Every consumer group (or the one named) with its lag per partition, by group id. A
        group known only by its committed offsets (members gone, state Empty) is included."""
        shards = self._node.shards
        names = (
            [group_id]
            if group_id is not None
            else [g.group_id for shard in shards for g in shard.groups.list_groups(None)]
        )
        found: list[GroupLag] = []
        for name in sorted(names):
            shard = shards.for_group(name)
            description = shard.groups.describe(name)
            committed = shard.offsets.fetch_group(name)
            if group_id is not None and description.state == "Dead" and not committed:
                continue  # no such group
            partitions: list[PartitionLag] = []
            for (topic, partition), position in sorted(committed.items()):
                start, end = shards.for_queue(topic, partition).store.queue_bounds(topic, partition)
                lag = max(end - position.offset, 0)
                partitions.append(PartitionLag(topic, partition, position.offset, start, end, lag))
            members = [
                (member.member_id, member.client_id, member.client_host)
                for member in description.members
            ]
            found.append(
                GroupLag(name, description.state, description.protocol_type, members, partitions)
            )
        return found

    def topics_snapshot(self, context: ClientContext) -> list[TopicInfo]:
        """Every topic, system topics included, each a copy (its config deep-copied)."""
        return [
            TopicInfo(info.name, info.queues, copy.deepcopy(info.config))
            for info in self._node.topics.all()
        ]

    def all_bindings(self, context: ClientContext) -> list[BindingView]:
        """Every binding, in the order they were added."""
        return [
            BindingView(
                binding.source,
                str(binding.kind),
                binding.pattern,
                binding.destination[0],
                binding.destination[1],
                dict(binding.arguments or {}),
            )
            for binding in self._node.bindings.bindings()
        ]

    def all_consumers(self, context: ClientContext) -> list[ConsumerView]:
        """Every consumer of every ack queue."""
        views: list[ConsumerView] = []
        for (topic, _queue), ack in self._node.ack_queues():
            for consumer in ack.consumers:
                views.append(
                    ConsumerView(
                        topic,
                        consumer.tag,
                        consumer.prefetch,
                        consumer.inflight,
                        not consumer.no_ack,
                    )
                )
        return views

    def ack_queue_topics(self, context: ClientContext) -> list[str]:
        """The topics whose queue 0 is an ack queue (AMQP queues, MQTT session queues)."""
        return [topic for (topic, queue), _ack in self._node.ack_queues() if queue == 0]

    async def purge_queue(self, context: ClientContext, topic: str) -> int | None:
        """Drop the ready records of the ack queue ``topic`` (in-flight ones stay, as AMQP's
        queue.purge); how many, or None when there is no such queue. In a cluster a queue of
        another node's shard is purged by its owner (:class:`ShardUnavailable` when it does
        not answer)."""
        queues = self._queue_calls()
        if not queues.queue_is_local(topic):
            known = queues.known_queue(topic)
            return None if known is None else await queues.purge_known_queue(known)
        ack = self._node.ack_queue(topic)
        return None if ack is None else ack.purge()

    async def browse_queue(
        self, context: ClientContext, topic: str, count: int, *, requeue: bool
    ) -> list[BrowsedMessage] | None:
        """Take up to ``count`` ready records of the ack queue ``topic`` (RabbitMQ's
        ``POST /api/queues/{vhost}/{name}/get``). With ``requeue`` they go back to the head
        of the queue, in their order, flagged redelivered; else they are acknowledged (gone).
        None when there is no such queue. In a cluster a queue of another node's shard is read
        from its owner, one basic.get round trip a record, settled there the same way but in
        the background (a next read may find them still held): the management API's browse
        goes to the owner instead, which answers once settled (braid/cluster_http.py)."""
        queues = self._queue_calls()
        if queues.queue_is_local(topic):
            return self._browse_local(topic, count, requeue=requeue)
        known = queues.known_queue(topic)
        if known is None:
            return None
        taken: list[Delivery] = []
        while len(taken) < count:
            delivery = await queues.fetch_message(context, known, no_ack=False)
            if delivery is None:
                break
            taken.append(delivery)
        browsed = [_browsed(delivery) for delivery in taken]
        # As the local queue's: requeued last-first, so the first taken is back at the head.
        for delivery in reversed(taken):
            if requeue:
                delivery.nack(requeue=True)
            else:
                delivery.ack()
        return browsed

    def _browse_local(
        self, topic: str, count: int, *, requeue: bool
    ) -> list[BrowsedMessage] | None:
        ack = self._node.ack_queue(topic)
        if ack is None:
            return None
        taken: list[Delivery] = []
        while len(taken) < count:
            delivery = ack.get(no_ack=False)
            if delivery is None:
                break
            taken.append(delivery)
        browsed = [_browsed(delivery) for delivery in taken]
        # Settled only once all are taken: a record requeued at once would be taken again.
        # Requeued last-first, so the first taken is back at the head.
        for delivery in reversed(taken):
            if requeue:
                ack.nack(delivery.offset, requeue=True)
            else:
                ack.ack(delivery.offset)
        if requeue and taken:
            ack.notify()  # consumers with credit get the requeued records now
        return browsed

    def _queue_calls(self) -> QueueCalls:
        """This object's queue calls (``BrokerAPI`` is both: :class:`QueueCalls` finds the
        owner of another node's queue)."""
        if not isinstance(self, QueueCalls):
            raise TypeError("ManagementCalls is used as part of BrokerAPI")
        return self

    # -- delays, dead letters, one record --------------------------------------------------

    def pending_delays(self, context: ClientContext) -> list[DelayedDestination]:
        """Delayed records not yet visible, per queue they will be visible in (delayed
        retries included), by topic and queue. Reads each pending timer's frame header: an
        operator's look, not a poll."""
        found = {
            destination: pending
            for shard in self._node.shards
            for destination, pending in shard.timers.pending_by_destination().items()
        }
        return [
            DelayedDestination(topic, queue, count, first_due)
            for (topic, queue), (count, first_due) in sorted(found.items())
        ]

    def pending_delay_count(self, context: ClientContext) -> int:
        """Delayed records not yet visible, all queues together (a counter: cheap)."""
        return sum(shard.timers.pending_count() for shard in self._node.shards)

    def dead_letter_queues(self, context: ClientContext) -> list[DeadLetterQueue]:
        """Every ack queue that dead letters reach, with the queues that dead-letter into it
        and its depth (``core/deadletter/redrive.py``)."""
        return [
            queue for shard in self._node.shards for queue in dead_letters.dead_letter_queues(shard)
        ]

    def redrive_dead_letters(
        self,
        context: ClientContext,
        topic: str,
        count: int | None = None,
        subject_of: SubjectOf | None = None,
    ) -> RedriveResult | None:
        """Move up to ``count`` ready records of the dead-letter queue ``topic`` back to the
        queues they died in, each once even across a crash (``core/deadletter/redrive.py``).
        ``subject_of``: the routing key a moved record shows, from its queue's topic. None
        when there is no such queue."""
        return dead_letters.redrive(
            self._node.shards.for_queue(topic, 0),
            topic,
            dead_letters.DEFAULT_REDRIVE_COUNT if count is None else count,
            subject_of,
        )

    def stored_record(
        self, context: ClientContext, topic: str, queue: int, offset: int
    ) -> StoredRecord | None:
        """The record at ``offset`` of ``topic``'s queue (partition) ``queue``, copied out of
        the log; None when there is none (a LINK entry is read as the record it points at)."""
        store = self._node.shards.for_queue(topic, queue).store
        for queued in store.read(topic, queue, offset, max_records=1):
            messages = messages_of(queued)
            for message in messages:
                if message.offset == offset:
                    copied = copy.copy(message)
                    copied.headers = [(name, bytes(value)) for name, value in message.headers]
                    copied.tags = list(message.tags)
                    copied.key = None if message.key is None else bytes(message.key)
                    copied.body = None if message.body is None else bytes(message.body)
                    return StoredRecord(copied, queued.record_count)
        return None


def _browsed(delivery: Delivery) -> BrowsedMessage:
    """What a browse hands out of one record taken from a queue (copied)."""
    message = delivery.message
    return BrowsedMessage(
        message.topic,
        message.subject,
        list(message.headers),
        bytes(message.body or b""),
        message.protocol,
        message.client,
        message.born_ms,
        message.store_ms,
        delivery.redelivered,
        delivery.offset,
    )
