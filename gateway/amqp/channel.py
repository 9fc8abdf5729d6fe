"""One AMQP channel: its consumers, unacked deliveries, prefetch, confirm and tx modes.

The session (session.py) hands each channel the methods and hot events of its number; handlers
raise ``AmqpChannelError`` (the session closes this channel) or ``AmqpConnectionError``. A handler
returns ``None`` when done, or an awaitable the session waits for before the next frame of the
connection (a flow-blocked publish, a tx.commit waiting for the disk), so replies stay in order.

Deliveries: each consumer (consumer.py's ``ChannelConsumer``) is a core ack-queue consumer whose
callback (called synchronously by the queue's pump) numbers the delivery on this channel and
writes the Basic.Deliver frames.

Prefetch: ``basic.qos`` with ``global=false`` limits each consumer created afterwards (the core's
per-consumer in-flight limit); ``global=true`` limits the channel as a whole. The core has no
per-channel limit yet, so the channel lends its consumers a per-consumer limit equal to what the
channel still allows (``update_capacity``), recomputed on every delivery and acknowledgement (a
limit of -1 means "none now").

``channel.flow``: ``active=true`` is answered Flow-Ok; ``active=false`` closes the connection with
540 ``NOT_IMPLEMENTED - active=false``, as RabbitMQ has since 3.3 (rabbit_channel.erl; 3.10.8
answers exactly that). Pausing a client's deliveries is the outgoing bound's job (session.py).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, Final

from pamqp import commands

from core.api import (
    EXPIRES_AT_HEADER,
    NO_CREDIT,
    PROTOCOL_MQTT,
    ClientContext,
    Delivery,
    Publication,
    PublishOutcome,
    RestOfCoroutine,
    ShardUnavailable,
    TopicError,
    TransactionError,
    now_ms,
    run_until_first_wait,
)
from gateway.amqp.codec import encode_basic_return, encode_get_ok, encode_method
from gateway.amqp.constants import (
    ACCESS_REFUSED,
    NO_ROUTE,
    NOT_ALLOWED,
    NOT_FOUND,
    NOT_IMPLEMENTED,
    PRECONDITION_FAILED,
)
from gateway.amqp.consumer import (
    ChannelConsumer,
    delivered_address,
    mqtt_compat_address,
    properties_of,
)
from gateway.amqp.errors import AmqpChannelError, AmqpConnectionError
from gateway.amqp.events import Publish
from gateway.amqp.messages import (
    PublishInfo,
    publish_info,
)
from gateway.amqp.properties import decode_properties, encode_properties
from gateway.amqp.vhost import (
    ALTERNATE_EXCHANGE_ARG,
    DIRECT_REPLY_TO,
    DIRECT_REPLY_TO_PREFIX,
    RESERVED_PREFIX,
    SERVER_NAMED_PREFIX,
    Queue,
    server_generated_name,
)

if TYPE_CHECKING:
    from gateway.amqp.session import Session

log = logging.getLogger(__name__)

__all__ = ["Channel", "ChannelConsumer"]  # (ChannelConsumer: from consumer.py)

CONSUMER_TAG_PREFIX: Final = "amq.ctag-"
DEAD_LETTER_EXCHANGE_ARG: Final = "x-dead-letter-exchange"
# Resource kinds in permission checks and their errors (RabbitMQ's words).
EXCHANGE: Final = "exchange"
QUEUE: Final = "queue"
TOPIC_EXCHANGE: Final = "topic"  # the exchange type whose routing keys topic permissions check
PUBLISH: Final = "amqp basic.publish"
NO_CAPACITY: Final = NO_CREDIT  # a consumer limit that admits nothing (0 would mean unlimited)
_NO_ROUTE_TEXT: Final = b"NO_ROUTE"

_TX_PUBLISH, _TX_ACK, _TX_NACK = range(3)
# The producer group of AMQP transactions in the core's TransactionService (no check-back: an
# undecided one is rolled back when it times out, and at the next start of the server).
AMQP_TX_GROUP: Final = "amqp-tx"
# AMQP transactions have no timeout; the core's would roll an idle one back after this long.
TX_TIMEOUT_MS: Final = 24 * 3600 * 1000
# Transaction ids: unique in this process (what a stop leaves open is rolled back at the next
# start, before any channel begins one).
_TX_ID_PREFIX: Final = f"amqp-tx-{os.urandom(4).hex()}-"
_tx_numbers = itertools.count(1)


def next_transaction_id() -> str:
    return f"{_TX_ID_PREFIX}{next(_tx_numbers):x}"


def _now_or_later(work: Coroutine[Any, Any, None]) -> Awaitable[None] | None:
    """Run a handler's coroutine to its first wait: None when it is done (a single node's
    metadata change never waits, so no task and no loop turn), else the rest, which the
    session awaits with the frames after it parked (their order stays the wire's)."""
    started = run_until_first_wait(work)
    return started if isinstance(started, RestOfCoroutine) else None


class Channel:
    def __init__(self, session: Session, number: int) -> None:
        self.session = session
        self.number = number
        vhost = session.vhost
        assert vhost is not None  # channels are opened after Connection.Open
        self.vhost = vhost
        self.vhost_prefix = vhost.prefix  # "" for "/"
        self.api = vhost.api
        refusal = self.api.channel_limit_refusal(session.context)
        if refusal is not None:
            # The user's max-channels: RabbitMQ's rabbit_reader closes the connection with
            # 530 NOT_ALLOWED (the session answers Channel.Open with Connection.Close).
            log.info("amqp: %s: %s", session.context.peer or "?", refusal.text)
            raise AmqpConnectionError(NOT_ALLOWED, f"NOT_ALLOWED - {refusal.text}")
        access = session.access
        assert access is not None  # (set by Connection.Open)
        self.access = access  # the connection's permission checks (auth.py)
        # RabbitMQ MQTT plugin compatibility: MQTT records are delivered as published to this
        # exchange (amq.topic) with the whole topic name as routing key (docs/mapping.md).
        # MQTT publishes go through the "/" vhost's exchange only.
        self.mqtt_exchange = "" if vhost.prefix else self.api.mqtt_compat_exchange()
        self._waits_for_fsync = self.api.waits_for_fsync
        self.consumers: dict[str, ChannelConsumer] = {}
        self.draining: list[ChannelConsumer] = []  # cancelled, still owed acks
        self.unacked: dict[int, Delivery] = {}  # delivery tag -> delivery, in tag order
        self.delivery_tag = 0
        self.prefetch_consumer = 0  # basic.qos global=false: for consumers made afterwards
        self.prefetch_global = 0  # basic.qos global=true: the whole channel
        self.limited = False  # prefetch_global: consumers' limits are lent
        self.confirm = False
        self.next_seq = 1  # publish sequence number in confirm mode
        self.tx: list[tuple[int, Any, bool]] | None = None
        self.tx_end = 0  # highest log position a tx.commit must wait for
        self.txn_id: str | None = None  # the core transaction holding this tx's half messages
        self._tx_destinations: set[tuple[str, int]] = set()
        self._tx_expiring: set[tuple[str, int]] = set()
        self._committing = False
        self.confirmed = 0  # highest publish sequence number confirmed
        self.last_queue: str | None = None  # for the "" queue name shorthand
        self.reply_address: str | None = None  # direct reply-to
        self._reply_properties: dict[bytes, bytes] = {}
        self.closed = False

    # -- helpers -----------------------------------------------------------------------------

    def write_method(self, method: Any) -> None:
        self.session.write(encode_method(self.number, method))

    def _queue_name(self, name: str) -> str:
        if name:
            return name
        if self.last_queue is None:
            raise AmqpChannelError(NOT_FOUND, "NOT_FOUND - no previously declared queue")
        return self.last_queue

    @property
    def owner(self) -> object:
        return self.session

    @property
    def context(self) -> ClientContext:
        return self.session.context

    # -- permissions (docs/security.md: the "amqp" rows; RabbitMQ's rabbit_channel checks) ----

    def _require(
        self, operation: str, kind: str, name: str, routing_key: str | None = None
    ) -> None:
        """403 ACCESS_REFUSED unless the user may do ``operation`` on the exchange or queue
        ``name`` of this vhost (``routing_key``: for a topic permission)."""
        vhost = self.vhost
        topic = vhost.queue_topic(name) if kind == QUEUE else vhost.exchange_topic(name)
        self.access.require(operation, topic, kind, name, routing_key)

    def _require_on_topic(self, operation: str, exchange: str, routing_key: str) -> None:
        """The topic permission on ``routing_key``: only for a topic exchange, as RabbitMQ's
        ``check_*_permitted_on_topic`` (a missing exchange: its own 404 comes later)."""
        found = self.vhost.find_exchange(self.context, exchange) if exchange else None
        if found is not None and found.type == TOPIC_EXCHANGE:
            self._require(operation, EXCHANGE, exchange, routing_key)

    def _require_binding(
        self, method: str, destination_kind: str, destination: str, source: str, key: str
    ) -> None:
        """rabbit_channel:binding_action: write on the destination, read on the source
        exchange, then the topic permission's read on the binding key."""
        if destination_kind == QUEUE:
            self._require(f"amqp {method} queue", QUEUE, destination)
        elif destination:
            self._require(f"amqp {method} destination", EXCHANGE, destination)
        if source:
            suffix = "exchange" if destination_kind == QUEUE else "source"
            self._require(f"amqp {method} {suffix}", EXCHANGE, source)
            self._require_on_topic(f"amqp {method} {suffix}", source, key)

    # -- exchanges ---------------------------------------------------------------------------

    # These change metadata, which may have to wait (a cluster's Redis); each runs eagerly
    # (_now_or_later): on a single node it is done before the next frame, as any handler.

    def exchange_declare(self, m: commands.Exchange.Declare) -> Awaitable[None] | None:
        return _now_or_later(self._exchange_declare(m))

    async def _exchange_declare(self, m: commands.Exchange.Declare) -> None:
        if not m.passive and m.exchange:  # (passive: no check, as RabbitMQ)
            self._require("amqp exchange.declare", EXCHANGE, m.exchange)
            alternate = (m.arguments or {}).get(ALTERNATE_EXCHANGE_ARG)
            if isinstance(alternate, str) and not self.vhost.find_exchange(
                self.context, m.exchange
            ):
                # rabbit_channel: a new exchange routing to an alternate is read from
                # and writes to it.
                self._require("amqp exchange.declare with alternate-exchange", EXCHANGE, m.exchange)
                self._require("amqp exchange.declare alternate-exchange", EXCHANGE, alternate)
        await self.vhost.declare_exchange(
            self.context,
            m.exchange,
            m.exchange_type,
            passive=m.passive,
            durable=m.durable,
            auto_delete=m.auto_delete,
            internal=m.internal,
            arguments=m.arguments,
        )
        if not m.nowait:
            self.write_method(commands.Exchange.DeclareOk())

    def exchange_delete(self, m: commands.Exchange.Delete) -> Awaitable[None] | None:
        return _now_or_later(self._exchange_delete(m))

    async def _exchange_delete(self, m: commands.Exchange.Delete) -> None:
        if m.exchange and not m.exchange.startswith(RESERVED_PREFIX):  # (those: refused anyway)
            self._require("amqp exchange.delete", EXCHANGE, m.exchange)
        await self.vhost.delete_exchange(self.context, m.exchange, if_unused=m.if_unused)
        if not m.nowait:
            self.write_method(commands.Exchange.DeleteOk())

    def exchange_bind(self, m: commands.Exchange.Bind) -> Awaitable[None] | None:
        return _now_or_later(self._exchange_bind(m))

    async def _exchange_bind(self, m: commands.Exchange.Bind) -> None:
        self._require_binding("exchange.bind", EXCHANGE, m.destination, m.source, m.routing_key)
        await self.vhost.bind_exchange(
            self.context, m.destination, m.source, m.routing_key, m.arguments
        )
        if not m.nowait:
            self.write_method(commands.Exchange.BindOk())

    def exchange_unbind(self, m: commands.Exchange.Unbind) -> Awaitable[None] | None:
        return _now_or_later(self._exchange_unbind(m))

    async def _exchange_unbind(self, m: commands.Exchange.Unbind) -> None:
        self._require_binding("exchange.unbind", EXCHANGE, m.destination, m.source, m.routing_key)
        await self.vhost.bind_exchange(
            self.context, m.destination, m.source, m.routing_key, m.arguments, unbind=True
        )
        if not m.nowait:
            self.write_method(commands.Exchange.UnbindOk())

    # -- queues ------------------------------------------------------------------------------

    def queue_declare(self, m: commands.Queue.Declare) -> Awaitable[None] | None:
        return _now_or_later(self._queue_declare(m))

    async def _queue_declare(self, m: commands.Queue.Declare) -> None:
        if m.queue == DIRECT_REPLY_TO or (m.passive and m.queue.startswith(DIRECT_REPLY_TO_PREFIX)):
            if not m.nowait:
                self.write_method(commands.Queue.DeclareOk(m.queue, 0, 0))
            return
        name = m.queue
        if not m.passive:  # (passive: no check, as RabbitMQ)
            # A server-named queue's name is made first: the check is on it, as RabbitMQ's.
            name = name or server_generated_name(SERVER_NAMED_PREFIX)
            self._require("amqp queue.declare", QUEUE, name)
            dead_letter = (m.arguments or {}).get(DEAD_LETTER_EXCHANGE_ARG)
            if isinstance(dead_letter, str) and self.vhost.find_queue(name) is None:
                # rabbit_channel: a new queue's dead letters are read from it and written to
                # its dead-letter exchange.
                self._require("amqp queue.declare with x-dead-letter-exchange", QUEUE, name)
                self._require("amqp queue.declare x-dead-letter-exchange", EXCHANGE, dead_letter)
        queue = await self.vhost.declare_queue(
            self.context,
            self.owner,
            name,
            passive=m.passive,
            durable=m.durable,
            exclusive=m.exclusive,
            auto_delete=m.auto_delete,
            arguments=m.arguments,
        )
        self.last_queue = queue.name
        if not m.nowait:
            # Consumers of every node, as RabbitMQ counts them: the owner's ack queue has
            # other nodes' Consume streams, and another node's queue its owner's last count.
            consumers = max(len(queue.consumers), queue.handle.stats().consumers)
            self.write_method(
                commands.Queue.DeclareOk(queue.name, queue.handle.message_count(), consumers)
            )

    def queue_bind(self, m: commands.Queue.Bind) -> Awaitable[None] | None:
        return _now_or_later(self._queue_bind(m))

    async def _queue_bind(self, m: commands.Queue.Bind) -> None:
        name = self._queue_name(m.queue)
        routing_key = m.routing_key if m.routing_key or m.queue else name
        self._require_binding("queue.bind", QUEUE, name, m.exchange, routing_key)
        await self.vhost.bind_queue(
            self.context, self.owner, name, m.exchange, routing_key, m.arguments
        )
        if not m.nowait:
            self.write_method(commands.Queue.BindOk())

    def queue_unbind(self, m: commands.Queue.Unbind) -> Awaitable[None] | None:
        return _now_or_later(self._queue_unbind(m))

    async def _queue_unbind(self, m: commands.Queue.Unbind) -> None:
        name = self._queue_name(m.queue)
        routing_key = m.routing_key if m.routing_key or m.queue else name
        self._require_binding("queue.unbind", QUEUE, name, m.exchange, routing_key)
        await self.vhost.bind_queue(
            self.context, self.owner, name, m.exchange, routing_key, m.arguments, unbind=True
        )
        self.write_method(commands.Queue.UnbindOk())

    def queue_purge(self, m: commands.Queue.Purge) -> Awaitable[None] | None:
        return _now_or_later(self._queue_purge(m))

    async def _queue_purge(self, m: commands.Queue.Purge) -> None:
        name = self._queue_name(m.queue)
        self._require("amqp queue.purge", QUEUE, name)  # read, as RabbitMQ
        count = await self.vhost.purge_queue(self.owner, name)
        if not m.nowait:
            self.write_method(commands.Queue.PurgeOk(count))

    def queue_delete(self, m: commands.Queue.Delete) -> Awaitable[None] | None:
        return _now_or_later(self._queue_delete(m))

    async def _queue_delete(self, m: commands.Queue.Delete) -> None:
        name = self._queue_name(m.queue)
        self._require("amqp queue.delete", QUEUE, name)
        count = await self.vhost.delete_queue(
            self.owner, name, if_unused=m.if_unused, if_empty=m.if_empty
        )
        if not m.nowait:
            self.write_method(commands.Queue.DeleteOk(count))

    # -- consumers ---------------------------------------------------------------------------

    def basic_qos(self, m: commands.Basic.Qos) -> None:
        if m.prefetch_size:
            raise AmqpConnectionError(
                NOT_IMPLEMENTED, f"NOT_IMPLEMENTED - prefetch_size!=0 ({m.prefetch_size})"
            )
        if m.global_:
            self.prefetch_global = m.prefetch_count
            self._limits_changed()
        else:
            self.prefetch_consumer = m.prefetch_count
        self.write_method(commands.Basic.QosOk())

    def channel_flow(self, m: commands.Channel.Flow) -> None:
        if not m.active:
            # RabbitMQ refuses to stop sending to a client on its say-so (a hard error, so the
            # connection closes); a client that cannot keep up stops reading and the outgoing
            # bound holds its deliveries back.
            raise AmqpConnectionError(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - active=false")
        self.write_method(commands.Channel.FlowOk(True))

    def _limits_changed(self) -> None:
        was_limited = self.limited
        self.limited = self.prefetch_global > 0
        if self.limited or was_limited:
            self.update_capacity(notify=True)

    def update_capacity(self, *, notify: bool) -> None:
        """Lend each consumer the limit the channel allows now (see the module docstring)."""
        if self.session.deliveries_stopped:  # the outgoing bound: the session resumes them
            return
        remaining = self.prefetch_global - len(self.unacked) if self.prefetch_global else 0
        for consumer in self.consumers.values():
            subscription = consumer.subscription
            if subscription is None or consumer.no_ack:
                continue
            own = consumer.prefetch
            if self.prefetch_global:
                if remaining <= 0:
                    limit = NO_CAPACITY
                else:
                    limit = subscription.inflight + remaining
                    if own:
                        limit = min(limit, own)
            else:
                limit = own
            if subscription.prefetch != limit:
                subscription.set_prefetch(limit, deliver_now=notify)

    def basic_consume(self, m: commands.Basic.Consume) -> None:
        name = self._queue_name(m.queue)
        tag = m.consumer_tag or server_generated_name(CONSUMER_TAG_PREFIX)
        if tag in self.consumers:
            raise AmqpConnectionError(
                NOT_ALLOWED, f"NOT_ALLOWED - attempt to reuse consumer tag '{tag}'"
            )
        if name == DIRECT_REPLY_TO:
            self._consume_reply_to(tag, m)
            return
        self._require("amqp basic.consume", QUEUE, name)
        queue = self.vhost.queue(name, self.owner)
        if queue.exclusive_consumer or (m.exclusive and queue.consumers):
            raise AmqpChannelError(
                ACCESS_REFUSED,
                f"ACCESS_REFUSED - queue '{name}' in vhost '{self.vhost.name}' in exclusive use",
            )
        if not m.nowait:
            self.write_method(commands.Basic.ConsumeOk(tag))
        consumer = ChannelConsumer(self, tag, queue, m.no_ack, m.exclusive, self.prefetch_consumer)
        self.consumers[tag] = consumer
        prefetch = NO_CAPACITY if self.session.deliveries_stopped else consumer.prefetch
        consumer.subscription = self.api.consume(
            self.context, queue.handle, tag, prefetch, consumer.deliver, no_ack=m.no_ack
        )
        self.vhost.consumer_added(queue, consumer)
        if self.limited:
            self.update_capacity(notify=True)

    def _consume_reply_to(self, tag: str, m: commands.Basic.Consume) -> None:
        if not m.no_ack:
            raise AmqpChannelError(
                PRECONDITION_FAILED, "PRECONDITION_FAILED - reply consumer cannot acknowledge"
            )
        if self.reply_address is not None:
            raise AmqpChannelError(
                PRECONDITION_FAILED, "PRECONDITION_FAILED - reply consumer already set"
            )
        consumer = ChannelConsumer(self, tag, None, True, False, 0)
        self.consumers[tag] = consumer
        self.reply_address = server_generated_name(DIRECT_REPLY_TO_PREFIX)
        self.vhost.reply_consumers[self.reply_address] = consumer
        if not m.nowait:
            self.write_method(commands.Basic.ConsumeOk(tag))

    def basic_cancel(self, m: commands.Basic.Cancel) -> None:
        tag = m.consumer_tag or ""
        consumer = self.consumers.pop(tag, None)
        if consumer is not None:
            self._detach(consumer, keep_unacked=True)
        if not m.nowait:
            self.write_method(commands.Basic.CancelOk(tag))

    def _detach(self, consumer: ChannelConsumer, *, keep_unacked: bool) -> None:
        """Stop a consumer. With ``keep_unacked`` (basic.cancel) its unacked deliveries stay
        acknowledgeable, as in RabbitMQ: the subscription is kept, paused, until they are
        settled; otherwise they return to the queue now."""
        consumer.cancelled = True
        queue = consumer.queue
        if queue is None:
            if self.reply_address is not None:
                self.vhost.reply_consumers.pop(self.reply_address, None)
                self.reply_address = None
            return
        subscription = consumer.subscription
        if subscription is not None:
            if keep_unacked and subscription.inflight and not consumer.no_ack:
                subscription.pause()
                self.draining.append(consumer)
            else:
                subscription.detach()
        self.vhost.consumer_removed(queue, consumer)

    def _settle_draining(self) -> None:
        for consumer in list(self.draining):
            subscription = consumer.subscription
            if subscription is None or not subscription.inflight:
                self.draining.remove(consumer)
                if subscription is not None and consumer.queue is not None:
                    subscription.detach()

    def server_cancel(self, consumer: ChannelConsumer) -> None:
        if self.consumers.get(consumer.tag) is consumer:
            del self.consumers[consumer.tag]
        consumer.cancelled = True
        if consumer in self.draining:
            self.draining.remove(consumer)
        if self.session.capabilities.get("consumer_cancel_notify") and not self.closed:
            self.write_method(commands.Basic.Cancel(consumer.tag, nowait=True))

    # -- basic.get / ack / nack / reject / recover ------------------------------------------

    def basic_get(self, m: commands.Basic.Get) -> Awaitable[None] | None:
        # A queue of another node waits for its owner's answer (the frames after it park).
        return _now_or_later(self._basic_get(m))

    async def _basic_get(self, m: commands.Basic.Get) -> None:
        name = self._queue_name(m.queue)
        self._require("amqp basic.get", QUEUE, name)
        queue = self.vhost.queue(name, self.owner)
        self.vhost.queue_used(queue)
        try:
            delivery = await self.api.fetch_message(self.context, queue.handle, no_ack=m.no_ack)
        except ShardUnavailable as error:
            raise self.vhost.home_down(name, error) from None
        if self.closed:  # while the owner answered: what it holds for this get goes back
            if delivery is not None and not m.no_ack:
                delivery.queue.nack(delivery.offset, requeue=True)
            return
        if delivery is None:
            self.write_method(commands.Basic.GetEmpty())
            return
        tag = self.delivery_tag = self.delivery_tag + 1
        if not m.no_ack:
            self.unacked[tag] = delivery
        message = delivery.message
        topic, subject = delivered_address(message)
        exchange = self.vhost.exchange_name(topic)
        if message.protocol == PROTOCOL_MQTT and self.mqtt_exchange and message.address:
            exchange, subject = mqtt_compat_address(self.mqtt_exchange, message.address)
        self.session.write(
            encode_get_ok(
                self.number,
                tag,
                delivery.redelivered,
                exchange,
                subject,
                queue.handle.message_count(),
                properties_of(message, self.vhost),
                message.body or b"",
                self.session.frame_max,
            )
        )
        self.session.metrics["delivered"] += 1

    def _take(self, tag: int, multiple: bool) -> list[tuple[int, Delivery]]:
        """Remove and return (tag, delivery) of what an ack/nack/reject of ``tag`` settles."""
        unacked = self.unacked
        if not multiple:
            delivery = unacked.pop(tag, None)
            if delivery is None:
                raise AmqpChannelError(
                    PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
                )
            return [(tag, delivery)]
        if tag == 0:
            taken = list(unacked.items())
            unacked.clear()
            return taken
        if tag > self.delivery_tag:
            raise AmqpChannelError(
                PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
            )
        tags = []
        for key in unacked:
            if key > tag:
                break
            tags.append(key)
        return [(key, unacked.pop(key)) for key in tags]

    def basic_ack(self, tag: int, multiple: bool) -> None:
        if not multiple and self.tx is None:
            delivery = self.unacked.pop(tag, None)  # the hot path
            if delivery is None:
                raise AmqpChannelError(
                    PRECONDITION_FAILED, f"PRECONDITION_FAILED - unknown delivery tag {tag}"
                )
            self.session.settlements.ack(delivery)
        else:
            deliveries = self._take(tag, multiple)
            if self.tx is not None:
                self.tx.append((_TX_ACK, deliveries, False))
                return
            ack = self.session.settlements.ack
            for _tag, delivery in deliveries:
                ack(delivery)
        self._after_settle()

    def basic_nack(self, tag: int, multiple: bool, requeue: bool) -> None:
        deliveries = self._take(tag, multiple)
        if self.tx is not None:
            self.tx.append((_TX_NACK, deliveries, requeue))
            return
        nack = self.session.settlements.nack
        for _tag, delivery in deliveries:
            nack(delivery, requeue=requeue)
        self._after_settle()

    def _after_settle(self) -> None:
        if self.draining:
            self._settle_draining()
        if self.limited:
            self.update_capacity(notify=True)

    def basic_recover(self, m: commands.Basic.Recover) -> None:
        self.basic_recover_async(m)
        self.write_method(commands.Basic.RecoverOk())

    def basic_recover_async(self, m: commands.Basic.Recover | commands.Basic.RecoverAsync) -> None:
        if not m.requeue:
            raise AmqpConnectionError(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - requeue=false")
        deliveries = list(self.unacked.values())
        self.unacked.clear()
        nack = self.session.settlements.nack
        for delivery in deliveries:
            nack(delivery, requeue=True)
        self._after_settle()

    # -- publish -----------------------------------------------------------------------------

    def basic_publish(self, event: Publish) -> Awaitable[None] | None:
        if self.tx is not None:
            if self.api.publishing_blocked():
                return self._stage_when_unblocked(event)
            self._stage(event)
            return None
        return self._publish(event)

    async def _stage_when_unblocked(self, event: Publish) -> None:
        await self.api.wait_publishing_allowed()
        self._stage(event)

    def _stage(self, event: Publish) -> None:
        """tx mode: route the publish now and store it as a half message of the channel's
        transaction (the core's TransactionService): invisible until tx.commit links every
        half of it at once, atomically, or tx.rollback discards them."""
        assert self.tx is not None
        session = self.session
        session.metrics["published"] += 1
        if event.immediate:
            raise AmqpConnectionError(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true")
        properties_raw = event.properties_raw
        info = publish_info(properties_raw)
        self._check_user(info)
        if info.reply_to == DIRECT_REPLY_TO:
            properties_raw, info = self._with_reply_address(properties_raw)
        exchange = event.exchange
        routing_key = event.routing_key
        self._require(PUBLISH, EXCHANGE, exchange)
        extra: list[tuple[str, int]] = []
        if not exchange:
            queue = self.vhost.find_queue(routing_key)
            if queue is None:
                if routing_key.startswith(DIRECT_REPLY_TO_PREFIX):
                    self.tx.append((_TX_PUBLISH, event, False))  # delivered at commit
                else:
                    self._unroutable(event, properties_raw)
                return
            if queue.handle.would_overflow():
                return  # refused by a reject-publish queue (no confirms in tx mode)
            topic = queue.topic
        else:
            ex = self.vhost.exchange(self.context, exchange)
            self._check_internal(ex.internal, exchange)
            if ex.type == TOPIC_EXCHANGE:
                self._require(PUBLISH, EXCHANGE, exchange, routing_key)
            if ex.delayed and info.delay_ms > 0:
                # A half message cannot also be delayed: published normally at commit.
                self.tx.append((_TX_PUBLISH, event, False))
                return
            topic = ex.topic
            if ex.alternate is not None:
                extra = self._alternate_destinations(ex.topic, ex.alternate, routing_key, info)
        headers = info.headers
        if info.expiration_ms is not None:
            headers = [*headers, (EXPIRES_AT_HEADER, str(now_ms() + info.expiration_ms).encode())]
        api = self.api
        context = self.context
        if self.txn_id is None:
            self.txn_id = api.begin_transaction(
                context, AMQP_TX_GROUP, next_transaction_id(), timeout_ms=TX_TIMEOUT_MS
            )
        try:
            # The default exchange goes straight to its one queue, never through bindings.
            staged = api.publish_in_transaction(
                context,
                self.txn_id,
                topic,
                event.body,
                subject=routing_key,
                headers=headers,
                routing_headers=info.table,
                address=session.peer,
                extra_destinations=extra,
                route=bool(exchange),
            )
        except TopicError:
            raise self._no_exchange(exchange) from None
        destinations = staged.delivered_to
        if exchange and event.mandatory and not self._routed(staged):
            self._return(event, properties_raw)
        if info.expiration_ms is not None:
            self._tx_expiring.update(destinations)
        self._tx_destinations.update(destinations)

    def _check_user(self, info: PublishInfo) -> None:
        if info.user_id is not None and info.user_id != self.session.user:
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                f"PRECONDITION_FAILED - user_id property set to '{info.user_id}' but "
                f"authenticated user was '{self.session.user}'",
            )

    def _check_internal(self, internal: bool, exchange: str) -> None:
        if internal:
            raise AmqpChannelError(
                ACCESS_REFUSED,
                f"ACCESS_REFUSED - cannot publish to internal exchange '{exchange}' in "
                f"vhost '{self.vhost.name}'",
            )

    def _publish(self, event: Publish) -> Awaitable[None] | None:
        """Append the record now (in order); durability is awaited by the confirm pipeline."""
        session = self.session
        session.metrics["published"] += 1
        if event.immediate:
            raise AmqpConnectionError(NOT_IMPLEMENTED, "NOT_IMPLEMENTED - immediate=true")
        properties_raw = event.properties_raw
        info = publish_info(properties_raw)
        if info.user_id is not None:
            self._check_user(info)
        if info.reply_to == DIRECT_REPLY_TO:
            properties_raw, info = self._with_reply_address(properties_raw)
        exchange = event.exchange
        routing_key = event.routing_key
        self._require(PUBLISH, EXCHANGE, exchange)  # (one cached answer: the hot path)
        extra: list[tuple[str, int]] = []
        deliver_at = 0
        queue: Queue | None = None
        if not exchange:
            queue = self.vhost.find_queue(routing_key)
            if queue is None:
                if routing_key.startswith(DIRECT_REPLY_TO_PREFIX):
                    reply = self.vhost.reply_consumers.get(routing_key)
                    if reply is not None:
                        reply.deliver_direct(routing_key, properties_raw, event.body)
                        self._confirm_now()
                        return None
                self._unroutable(event, properties_raw)
                return None
            if queue.handle.would_overflow():
                self._unroutable(event, properties_raw, refused=True)
                return None
            topic = queue.topic
        else:
            ex = self.vhost.exchange(self.context, exchange)
            if ex.internal:
                self._check_internal(True, exchange)
            if ex.type == TOPIC_EXCHANGE:
                self._require(PUBLISH, EXCHANGE, exchange, routing_key)
            topic = ex.topic
            if ex.alternate is not None:
                extra = self._alternate_destinations(ex.topic, ex.alternate, routing_key, info)
            if ex.delayed and info.delay_ms > 0:
                deliver_at = now_ms() + info.delay_ms
        headers = info.headers
        if info.expiration_ms is not None:
            headers = [*headers, (EXPIRES_AT_HEADER, str(now_ms() + info.expiration_ms).encode())]
        try:
            publication = self.api.publish(
                session.context,
                topic,
                event.body,
                subject=routing_key,
                headers=headers,
                routing_headers=info.table,
                address=session.peer,
                deliver_at_ms=deliver_at,
                extra_destinations=extra,
                create_topic=False,
            )
        except TopicError:
            raise self._no_exchange(exchange) from None
        if not publication.stored:  # flow control holds it back: the connection waits
            return self._publish_later(publication, event, properties_raw, info, topic, queue)
        self._published(event, publication.outcome, properties_raw, info, topic, queue)
        return None

    async def _publish_later(
        self,
        publication: Publication,
        event: Publish,
        properties_raw: bytes,
        info: PublishInfo,
        topic: str,
        queue: Queue | None,
    ) -> None:
        try:
            # (Also waits for the topic's durability: rare, and the confirm waits anyway.)
            outcome = await publication
        except TopicError:
            raise self._no_exchange(event.exchange) from None
        self._published(event, outcome, properties_raw, info, topic, queue)

    def _no_exchange(self, name: str) -> AmqpChannelError:
        return AmqpChannelError(
            NOT_FOUND, f"NOT_FOUND - no exchange '{name}' in vhost '{self.vhost.name}'"
        )

    def _published(
        self,
        event: Publish,
        outcome: PublishOutcome,
        properties_raw: bytes,
        info: PublishInfo,
        topic: str,
        queue: Queue | None,
    ) -> None:
        """After the append: max-length, returns, and the confirm (hot path)."""
        if queue is not None:  # the default exchange: straight into one queue
            handle = queue.handle
            if handle.max_length is not None:
                handle.enforce_max_length()
            if info.expiration_ms is not None:
                self.vhost.expiring.add(queue)
        elif event.mandatory or info.expiration_ms is not None:
            has_ack_queue = self.api.has_ack_queue
            routed = bool(outcome.refused)
            for destination in outcome.delivered_to:
                if has_ack_queue(destination):
                    routed = True
                    if info.expiration_ms is not None:
                        self._mark_may_expire(destination[0])
            if not routed and event.mandatory:
                self._return(event, properties_raw)
        # Persistent messages wait for the disk if their topic is synced; others (RabbitMQ:
        # transient messages are confirmed once enqueued) do not.
        end = outcome.durable_mark if info.persistent and self._waits_for_fsync(topic) else 0
        if self.confirm:
            seq = self.next_seq
            self.next_seq = seq + 1
            confirm_end = end or self._forwarded_mark(outcome, topic)
            # A queue of another node refuses in its forward's answer, which fills
            # outcome.refused later: the confirm reads it again once confirm_end is durable.
            refused = outcome.refused if outcome.sequence >= 0 else None
            self.session.confirm(self, seq, confirm_end, bool(outcome.refused), refused)
        elif self.tx is not None or self._committing:
            self.tx_end = max(self.tx_end, end)

    def _forwarded_mark(self, outcome: PublishOutcome, topic: str) -> int:
        """A transient publish's mark for its confirm when a forward of it to another node's
        shard is unanswered (0 otherwise): RabbitMQ nacks a publish a queue did not accept, so
        the confirm waits for the forward and ``BrokerAPI.failed_marks`` nacks a failed one.
        One shard (``sequence`` -1) forwards nothing; with ``topic`` given the check skips the
        local flush of a topic not synced, so a publish with no forward is confirmed at once."""
        if outcome.sequence < 0:
            return 0
        mark = outcome.durable_mark
        return 0 if self.api.is_durable(mark, topic) else mark

    def _mark_may_expire(self, topic: str) -> None:
        queue = self.vhost.queues.get(self.vhost.queue_name(topic))
        if queue is not None and queue.topic == topic:
            self.vhost.expiring.add(queue)

    def _routed(self, outcome: PublishOutcome) -> bool:
        """Whether a publish reached a queue (or a queue refused it), for mandatory."""
        has_ack_queue = self.api.has_ack_queue
        return bool(outcome.refused) or any(has_ack_queue(d) for d in outcome.delivered_to)

    def _alternate_destinations(
        self, name: str, alternate: str, routing_key: str, info: PublishInfo
    ) -> list[tuple[str, int]]:
        api = self.api
        routed = api.routed_destinations(name, routing_key, info.table)
        if any(api.has_ack_queue(d) for d in routed):
            return []
        target = self.vhost.find_exchange(self.context, alternate)
        if target is None:
            return []
        return [
            (target.topic, 0),
            *api.routed_destinations(target.topic, routing_key, info.table),
        ]

    def _with_reply_address(self, properties_raw: bytes) -> tuple[bytes, PublishInfo]:
        """Direct reply-to: the requester's reply_to becomes its channel's reply address."""
        if self.reply_address is None:
            raise AmqpChannelError(
                PRECONDITION_FAILED, "PRECONDITION_FAILED - fast reply consumer does not exist"
            )
        rewritten = self._reply_properties.get(properties_raw)
        if rewritten is None:
            properties = dict(decode_properties(properties_raw))
            properties["reply_to"] = self.reply_address
            rewritten = encode_properties(properties)
            if len(self._reply_properties) > 256:
                self._reply_properties.clear()
            self._reply_properties[properties_raw] = rewritten
        return rewritten, publish_info(rewritten)

    def _unroutable(self, event: Publish, properties_raw: bytes, *, refused: bool = False) -> None:
        if event.mandatory and not refused:
            self._return(event, properties_raw)
        self._confirm_now(nack=refused)

    def _return(self, event: Publish, properties_raw: bytes) -> None:
        self.session.metrics["returned"] += 1
        self.session.write(
            encode_basic_return(
                self.number,
                NO_ROUTE,
                _NO_ROUTE_TEXT,
                event.exchange,
                event.routing_key,
                properties_raw,
                event.body,
                self.session.frame_max,
            )
        )

    def _confirm_now(self, *, nack: bool = False) -> None:
        if self.confirm:
            seq = self.next_seq
            self.next_seq = seq + 1
            self.session.confirm(self, seq, 0, nack)

    # -- confirm and tx ----------------------------------------------------------------------

    def confirm_select(self, m: commands.Confirm.Select) -> None:
        if self.tx is not None:
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                "PRECONDITION_FAILED - cannot switch from tx to confirm mode",
            )
        self.confirm = True
        if not m.nowait:
            self.write_method(commands.Confirm.SelectOk())

    def tx_select(self) -> None:
        if self.confirm:
            raise AmqpChannelError(
                PRECONDITION_FAILED,
                "PRECONDITION_FAILED - cannot switch from confirm to tx mode",
            )
        if self.tx is None:
            self.tx = []
        self.write_method(commands.Tx.SelectOk())

    def _not_transactional(self) -> AmqpChannelError:
        return AmqpChannelError(
            PRECONDITION_FAILED, "PRECONDITION_FAILED - channel is not transactional"
        )

    def tx_commit(self) -> Awaitable[None] | None:
        if self.tx is None:
            raise self._not_transactional()
        actions, self.tx = self.tx, []
        txn_id, self.txn_id = self.txn_id, None
        if not actions and txn_id is None:
            self.write_method(commands.Tx.CommitOk())
            return None
        destinations, self._tx_destinations = self._tx_destinations, set()
        expiring, self._tx_expiring = self._tx_expiring, set()
        return self._commit(txn_id, actions, destinations, expiring)

    async def _commit(
        self,
        txn_id: str | None,
        actions: list[tuple[int, Any, bool]],
        destinations: set[tuple[str, int]],
        expiring: set[tuple[str, int]],
    ) -> None:
        """Make the transaction's half messages visible (one LINK, durable when this returns),
        then apply what could not be a half (delayed and direct reply-to publishes) and the
        acknowledgements, in order (RabbitMQ: publishes, then acks, at tx.commit)."""
        if txn_id is not None:
            try:
                await self.api.commit_transaction(self.context, txn_id)
            except TransactionError as error:
                raise AmqpChannelError(
                    PRECONDITION_FAILED, f"PRECONDITION_FAILED - tx.commit failed: {error}"
                ) from None
            self.api.enforce_max_length(destinations)
            for destination in expiring:
                self._mark_may_expire(destination[0])
        tx, self.tx = self.tx, None  # _publish must not stage again
        settlements = self.session.settlements
        self._committing = True
        self.tx_end = 0
        try:
            for kind, payload, requeue in actions:
                if kind == _TX_PUBLISH:
                    pending = self._publish(payload)
                    if pending is not None:
                        await pending
                elif kind == _TX_ACK:
                    for _tag, delivery in payload:
                        settlements.ack(delivery)
                else:
                    for _tag, delivery in payload:
                        settlements.nack(delivery, requeue=requeue)
        finally:
            self.tx = tx if tx is not None else []
            self._committing = False
        self._after_settle()
        if self.tx_end:
            await self.api.when_durable(self.tx_end)
        self.tx_end = 0
        if not self.closed:
            self.write_method(commands.Tx.CommitOk())

    def tx_rollback(self) -> Awaitable[None] | None:
        if self.tx is None:
            raise self._not_transactional()
        actions, self.tx = self.tx, []
        txn_id, self.txn_id = self.txn_id, None
        self._tx_destinations = set()
        self._tx_expiring = set()
        returned = [pair for kind, pairs, _ in actions if kind != _TX_PUBLISH for pair in pairs]
        if returned:  # the acks are undone: those deliveries are unacked again, in tag order
            merged = dict(self.unacked)
            merged.update(returned)
            self.unacked = dict(sorted(merged.items()))
        if txn_id is None:
            self.write_method(commands.Tx.RollbackOk())
            return None
        return self._rollback(txn_id)

    async def _rollback(self, txn_id: str) -> None:
        with contextlib.suppress(TransactionError):  # already decided (its timeout passed)
            await self.api.roll_back_transaction(self.context, txn_id)
        if not self.closed:
            self.write_method(commands.Tx.RollbackOk())

    # -- closing -----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """The channel is closing: consumers go, unacked deliveries return to their queues."""
        if self.closed:
            return
        self.closed = True
        for consumer in list(self.consumers.values()):
            self._detach(consumer, keep_unacked=False)
        self.consumers.clear()
        for consumer in self.draining:
            if consumer.subscription is not None and consumer.queue is not None:
                consumer.subscription.detach()
        self.draining.clear()
        pending = list(self.unacked.values())
        for kind, payload, _requeue in self.tx or ():
            if kind != _TX_PUBLISH:
                pending.extend(delivery for _tag, delivery in payload)
        release = self.session.settlements.release
        for delivery in pending:
            # Deliveries of removed consumers are back in their queues already; basic.get ones
            # are requeued.
            release(delivery)
        self.unacked.clear()
        self.tx = None
        if self.txn_id is not None:  # publishes of an uncommitted transaction are discarded
            txn_id, self.txn_id = self.txn_id, None
            self.vhost.run_in_background(self._rollback_abandoned(txn_id))

    async def _rollback_abandoned(self, txn_id: str) -> None:
        await self.api.roll_back_transaction(self.context, txn_id)
