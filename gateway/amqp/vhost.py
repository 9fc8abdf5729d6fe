"""The AMQP model (exchanges, queues, bindings) over the core's topics, ack queues and bindings.

Names (docs/amqp.md): an exchange ``X`` is the broker topic ``X``; a queue ``Q`` is the topic
``amq.queue.Q`` (RabbitMQ refuses to declare names starting with ``amq.``, so no user exchange
can collide with a queue's topic) whose queue 0 is the ack queue its consumers read. AMQP settings
live in the topic's free-form config under ``"amqp"`` and are compared on redeclare (AMQP's
equivalence rule, 406 PRECONDITION_FAILED). Bindings are core bindings from the exchange's topic
to ``(queue topic, 0)``, or to ``(exchange, EXCHANGE_QUEUE)`` for exchange-to-exchange ones.

Virtual hosts: one ``VirtualHost`` per configured vhost, each a separate namespace of exchanges,
queues and bindings with its own default and ``amq.*`` exchanges. The vhost ``/`` uses the names
above unprefixed (exchange ``X`` is topic ``X``, so Kafka and MQTT clients share it); any other
vhost ``V`` puts ``amq.vhost.V.`` in front of each of those topic names: exchange ``X`` is topic
``amq.vhost.V.X``, queue ``Q`` is topic ``amq.vhost.V.amq.queue.Q`` (:func:`topic_prefix`). A vhost
name other than ``/`` is 1-64 characters of ``A-Z a-z 0-9 _ -`` (no ``.``, so a topic name tells
its vhost unambiguously; every character is legal in a Kafka topic name). ``/`` never sees topics
starting with ``amq.vhost.``; RabbitMQ refuses ``amq.*`` exchange names, so none can be declared.

Checks and error texts follow RabbitMQ 3.x's ``rabbit_channel``/``rabbit_amqqueue``/
``rabbit_exchange``; errors raised here carry no method ids: the session fills in the method being
handled. A ``VirtualHost`` is not thread-safe (one event loop).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import re
import time
from collections.abc import Coroutine, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from core.api import (
    EXCHANGE_QUEUE,
    OVERFLOW_DROP_HEAD,
    OVERFLOW_REJECT_PUBLISH,
    PROTOCOL_AMQP,
    SINGLE_NODE_ID,
    AckQueueConfig,
    BrokerAPI,
    ClientContext,
    DeadLetterPolicy,
    QueueHandle,
    RoutingError,
    ShardUnavailable,
    TagFilter,
    TopicError,
    TopicInfo,
    start_eagerly,
)
from gateway.amqp.constants import (
    ACCESS_REFUSED,
    NOT_FOUND,
    PRECONDITION_FAILED,
    RESOURCE_LOCKED,
)
from gateway.amqp.errors import AmqpChannelError
from gateway.amqp.messages import jsonable

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_VHOST",
    "DIRECT_REPLY_TO",
    "QUEUE_TOPIC_PREFIX",
    "VHOST_TOPIC_PREFIX",
    "Exchange",
    "Queue",
    "VirtualHost",
    "check_vhost_name",
    "exchange_name",
    "queue_name",
    "topic_prefix",
]

QUEUE_TOPIC_PREFIX: Final = "amq.queue."
DEFAULT_VHOST: Final = "/"
# Topics of the vhost V (other than "/") are named VHOST_TOPIC_PREFIX + V + "." + the "/" name.
VHOST_TOPIC_PREFIX: Final = "amq.vhost."
VHOST_NAME: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
DIRECT_REPLY_TO: Final = "amq.rabbitmq.reply-to"
DIRECT_REPLY_TO_PREFIX: Final = DIRECT_REPLY_TO + "."
RESERVED_PREFIX: Final = "amq."
SERVER_NAMED_PREFIX: Final = "amq.gen-"
CONFIG_KEY: Final = "amqp"

# exchange type -> core match kind
EXCHANGE_TYPES: Final = {
    "direct": "exact",
    "fanout": "fanout",
    "topic": "topic",
    "headers": "headers",
}
DELAYED_TYPE: Final = "x-delayed-message"
DELAYED_TYPE_ARG: Final = "x-delayed-type"
ALTERNATE_EXCHANGE_ARG: Final = "alternate-exchange"
# The exchanges every RabbitMQ vhost has (rabbit_vhost:declare_default_exchanges).
BUILTIN_EXCHANGES: Final = (
    ("amq.direct", "direct"),
    ("amq.fanout", "fanout"),
    ("amq.topic", "topic"),
    ("amq.headers", "headers"),
    ("amq.match", "headers"),
)
# Exchange arguments compared on redeclare (rabbit_exchange:assert_args_equivalence).
EXCHANGE_EQUIVALENT_ARGS: Final = (ALTERNATE_EXCHANGE_ARG, DELAYED_TYPE_ARG)
# Queue arguments compared on redeclare (rabbit_amqqueue:declare_args).
# BraidMQ's queue argument: a tag filter (``"TagA || TagB"``) on the queue (docs/mapping.md).
TAG_FILTER_ARG: Final = "x-braid-tag-filter"
# Priority queues: 0-255 as RabbitMQ (rabbit_priority_queue: priorities 0..max; a message's
# priority above max counts as max, none as 0).
MAX_PRIORITY_ARG: Final = "x-max-priority"
MAX_PRIORITY: Final = 255
QUEUE_EQUIVALENT_ARGS: Final = (
    "x-expires",
    "x-message-ttl",
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-max-length",
    "x-max-length-bytes",
    MAX_PRIORITY_ARG,
    "x-overflow",
    "x-queue-mode",
    "x-queue-type",
    "x-single-active-consumer",
    "x-delivery-limit",
    TAG_FILTER_ARG,
)
OVERFLOW_MODES: Final = {
    "drop-head": OVERFLOW_DROP_HEAD,
    "reject-publish": OVERFLOW_REJECT_PUBLISH,
    # reject-publish-dlx also dead-letters the refused message in RabbitMQ; refused here.
    "reject-publish-dlx": OVERFLOW_REJECT_PUBLISH,
}
# How often queues whose records may expire are swept when nobody consumes them (RabbitMQ
# expires the head of a classic queue on a timer; the core only checks when it delivers).
TTL_SWEEP_INTERVAL_S: Final = 0.1
# In a cluster the owner of a queue other nodes declared runs its x-message-ttl and x-expires,
# so it must know it: the core tells the gateway as the definitions follow (add_queue_listener),
# and a scan this often catches what that missed (a queue whose definition came before its
# config, say).
OWNED_QUEUES_SCAN_INTERVAL_S: Final = 30.0
# The owner of an exclusive queue declared through another node (no connection here owns it).
_ELSEWHERE: Final = object()


def check_vhost_name(name: str) -> str:
    """``name`` if it can be a vhost (``/``, or 1-64 of ``A-Z a-z 0-9 _ -``); else ValueError."""
    if name != DEFAULT_VHOST and VHOST_NAME.fullmatch(name) is None:
        raise ValueError(
            f"invalid vhost name {name!r}: '/' or 1-64 characters of A-Z a-z 0-9 _ - "
            "(the name is part of topic names, docs/amqp.md)"
        )
    return name


def topic_prefix(vhost: str) -> str:
    """What the topic names of ``vhost``'s exchanges and queues start with ("" for "/")."""
    return "" if vhost == DEFAULT_VHOST else f"{VHOST_TOPIC_PREFIX}{check_vhost_name(vhost)}."


def exchange_name(topic: str) -> str:
    """The AMQP exchange a record of ``topic`` was published to ("" for a queue's topic)."""
    return "" if topic.startswith(QUEUE_TOPIC_PREFIX) else topic


def queue_name(topic: str) -> str:
    return topic[len(QUEUE_TOPIC_PREFIX) :] if topic.startswith(QUEUE_TOPIC_PREFIX) else topic


def server_generated_name(prefix: str) -> str:
    """RabbitMQ's ``amq.gen-`` / ``amq.ctag-`` names: 16 random bytes, URL-safe base64."""
    return prefix + base64.urlsafe_b64encode(os.urandom(16)).decode().rstrip("=")


def _not_found(text: str) -> AmqpChannelError:
    return AmqpChannelError(NOT_FOUND, f"NOT_FOUND - {text}")


def _refused(text: str) -> AmqpChannelError:
    return AmqpChannelError(ACCESS_REFUSED, f"ACCESS_REFUSED - {text}")


def _precondition(text: str) -> AmqpChannelError:
    return AmqpChannelError(PRECONDITION_FAILED, f"PRECONDITION_FAILED - {text}")


def _describe(value: Any) -> str:
    """A value as RabbitMQ's equivalence errors show it."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        kind = "bool"
    elif isinstance(value, int):
        kind = "signedint" if -(1 << 31) <= value < 1 << 31 else "long"
    elif isinstance(value, str):
        kind = "longstr"
    else:
        kind = type(value).__name__
    return f"the value '{value}' of type '{kind}'"


class ConsumerHandle(Protocol):
    """What the vhost needs of a channel's consumer (channel.py)."""

    @property
    def exclusive(self) -> bool: ...

    def cancelled_by_server(self) -> None: ...


@dataclass(eq=False, slots=True)
class Exchange:
    name: str  # the AMQP name (in its vhost)
    type: str  # direct, fanout, topic, headers, x-delayed-message
    kind: str  # the core match kind of its bindings
    durable: bool
    auto_delete: bool
    internal: bool
    arguments: dict[str, Any]
    alternate: str | None
    delayed: bool
    info: TopicInfo  # the topic this was read from (a stale cache entry has another)
    topic: str  # its topic's name (info.name)

    @classmethod
    def from_topic(cls, info: TopicInfo, name: str) -> Exchange:
        config = info.config.get(CONFIG_KEY)
        if not isinstance(config, dict) or config.get("object") != "exchange":
            # A topic made by another protocol: usable as a topic exchange.
            return cls(name, "topic", "topic", True, False, False, {}, None, False, info, info.name)
        ex_type = str(config.get("type", "direct"))
        arguments = dict(config.get("arguments") or {})
        delayed = ex_type == DELAYED_TYPE
        routing_type = str(arguments.get(DELAYED_TYPE_ARG, "direct")) if delayed else ex_type
        alternate = arguments.get(ALTERNATE_EXCHANGE_ARG)
        return cls(
            name,
            ex_type,
            EXCHANGE_TYPES.get(routing_type, "exact"),
            bool(config.get("durable")),
            bool(config.get("auto_delete")),
            bool(config.get("internal")),
            arguments,
            alternate if isinstance(alternate, str) and alternate else None,
            delayed,
            info,
            info.name,
        )


@dataclass(eq=False)
class Queue:
    name: str
    topic: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict[str, Any]
    handle: QueueHandle  # its ack queue, through the Broker API
    owner: object | None = None  # the session of an exclusive queue
    consumers: list[ConsumerHandle] = field(default_factory=list)
    expires_ms: int | None = None
    expiry: asyncio.TimerHandle | None = None
    deleted: bool = False

    @property
    def exclusive_consumer(self) -> bool:
        return any(consumer.exclusive for consumer in self.consumers)


class VirtualHost:
    def __init__(self, api: BrokerAPI, name: str = DEFAULT_VHOST) -> None:
        self.api = api
        self.name = name
        # Who acts when the vhost acts on its own (restart clean-up, expiry, auto-delete).
        self.context = ClientContext(PROTOCOL_AMQP, name, connection_id=f"amqp-vhost:{name}")
        # "" for "/"; "amq.vhost.<name>." for the others (the module docstring).
        self.prefix = topic_prefix(name)
        self.queue_prefix = self.prefix + QUEUE_TOPIC_PREFIX
        # Exchange names that are not exchanges of this vhost: queue topics, and in "/" the
        # system topics and the other vhosts' topics.
        self._hidden: tuple[str, ...] = (
            (QUEUE_TOPIC_PREFIX,) if self.prefix else (QUEUE_TOPIC_PREFIX, "__", VHOST_TOPIC_PREFIX)
        )
        self.queues: dict[str, Queue] = {}
        self._exchanges: dict[str, Exchange] = {}
        # Queues whose records may expire (a queue TTL, or a publish with an expiration went
        # there): their heads are swept.
        self.expiring: set[Queue] = set()
        # Direct reply-to pseudo-queues: "amq.rabbitmq.reply-to.<token>" -> a consumer.
        self.reply_consumers: dict[str, Any] = {}
        self._sweeper: asyncio.TimerHandle | None = None
        self._owned_scanned_at = float("-inf")
        self._background: set[asyncio.Task[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load queues, drop what RabbitMQ would not have kept over a restart (transient and
        exclusive queues, transient exchanges), declare the built-in exchanges."""
        self._loop = asyncio.get_running_loop()
        for info in self.api.topics_with_config(CONFIG_KEY):
            if not self.owns_topic(info.name):
                continue
            config = info.config.get(CONFIG_KEY)
            if not isinstance(config, dict):
                continue
            if config.get("object") == "queue":
                await self._load_queue(info, config)
            elif config.get("object") == "exchange" and not config.get("durable"):
                log.info("amqp: transient exchange %r removed on restart", info.name)
                await self.api.delete_exchange(self.context, info.name)
        for name, ex_type in BUILTIN_EXCHANGES:
            if not self.api.has_topic(self.context, self.prefix + name):
                await self._create_exchange(self.context, name, ex_type, True, False, False, {})
        self.api.add_queue_listener(self._queue_changed)  # (called in a cluster only)
        self._schedule_sweep()

    def run_in_background(self, work: Coroutine[Any, Any, object]) -> None:
        """Run ``work`` in a task the vhost keeps until it is done; failures are logged."""
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("amqp: background work failed: %r", task.exception())

    def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for queue in self.queues.values():
            if queue.expiry is not None:
                queue.expiry.cancel()
                queue.expiry = None

    async def _load_queue(self, info: TopicInfo, config: Mapping[str, Any]) -> None:
        name = str(config.get("name", self.queue_name(info.name)))
        if not config.get("durable") or config.get("exclusive"):
            if not self.api.queue_is_local(info.name):
                # Another node's shard: RabbitMQ drops a node's transient queues when that
                # node restarts, not the others' (learned when used: find_queue).
                return
            log.info("amqp: transient queue %r removed on restart", name)
            # Its ack queue and index go with it.
            await self.api.delete_queue(self.context, info.name)
            return
        arguments = dict(config.get("arguments") or {})
        handle = await self.api.open_queue(info.name, self._ack_config(name, arguments))
        queue = Queue(
            name, info.name, True, False, bool(config.get("auto_delete")), arguments, handle
        )
        self._configure_queue(queue)
        self.queues[name] = queue
        self._touch(queue)

    # -- names -------------------------------------------------------------------------------

    def owns_topic(self, topic: str) -> bool:
        """Whether ``topic`` is in this vhost's namespace (an exchange's or a queue's)."""
        if self.prefix:
            return topic.startswith(self.prefix)
        return not topic.startswith(VHOST_TOPIC_PREFIX)

    def exchange_topic(self, name: str) -> str:
        return self.prefix + name

    def queue_topic(self, name: str) -> str:
        return self.queue_prefix + name

    def exchange_name(self, topic: str) -> str:
        """The AMQP exchange a record of ``topic`` was published to ("" for a queue's topic);
        a topic of another namespace is shown as it is."""
        prefix = self.prefix
        if prefix and topic.startswith(prefix):
            topic = topic[len(prefix) :]
        return "" if topic.startswith(QUEUE_TOPIC_PREFIX) else topic

    def queue_name(self, topic: str) -> str:
        prefix = self.queue_prefix
        return topic[len(prefix) :] if topic.startswith(prefix) else topic

    def _exchange_of_topic(self, topic: str) -> str | None:
        """The name of the exchange whose topic is ``topic`` in this vhost, or None."""
        prefix = self.prefix
        if prefix:
            return topic[len(prefix) :] if topic.startswith(prefix) else None
        return None if topic.startswith(VHOST_TOPIC_PREFIX) else topic

    # -- exchanges ---------------------------------------------------------------------------

    def find_exchange(self, context: ClientContext, name: str) -> Exchange | None:
        if name.startswith(self._hidden):
            return None
        topic = self.prefix + name if self.prefix else name
        info = self.api.topic_info(context, topic)
        if info is None:
            self._exchanges.pop(name, None)
            return None
        exchange = self._exchanges.get(name)
        if exchange is None or exchange.info is not info:
            exchange = self._exchanges[name] = Exchange.from_topic(info, name)
        return exchange

    def exchange(self, context: ClientContext, name: str) -> Exchange:
        """The exchange named ``name``; 404 if there is none."""
        exchange = self.find_exchange(context, name)
        if exchange is None:
            raise _not_found(f"no exchange '{name}' in vhost '{self.name}'")
        return exchange

    def _check_not_default(self, name: str) -> None:
        if name == "":
            raise _refused("operation not permitted on the default exchange")

    async def declare_exchange(
        self,
        context: ClientContext,
        name: str,
        ex_type: str,
        *,
        passive: bool,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        arguments: Mapping[str, Any] | None,
    ) -> None:
        self._check_not_default(name)
        if passive:
            self.exchange(context, name)
            return
        if ex_type not in EXCHANGE_TYPES and ex_type != DELAYED_TYPE:
            # A channel error, as RabbitMQ 3.11+ (rabbit_exchange:check_type raises
            # precondition_failed; 3.10 closed the connection with 503): pika's own suite
            # (TestInvalidExchangeTypeRaisesConnectionClosed) expects the channel closed with 406.
            raise _precondition(f"unknown exchange type '{ex_type}'")
        args = jsonable(dict(arguments or {}))
        existing = self.find_exchange(context, name)
        if existing is not None and isinstance(existing.info.config.get(CONFIG_KEY), dict):
            self._assert_exchange_equivalent(
                existing, ex_type, durable, auto_delete, internal, args
            )
            return
        if existing is None and name.startswith(RESERVED_PREFIX):
            raise _refused(f"exchange name '{name}' contains reserved prefix 'amq.*'")
        if ex_type == DELAYED_TYPE and args.get(DELAYED_TYPE_ARG) not in EXCHANGE_TYPES:
            raise _precondition(
                "Invalid argument, 'x-delayed-type' must be an existing exchange type"
            )
        alternate = args.get(ALTERNATE_EXCHANGE_ARG)
        if alternate is not None and not isinstance(alternate, str):
            raise _precondition(
                f"invalid arg '{ALTERNATE_EXCHANGE_ARG}' for exchange '{name}' in vhost "
                f"'{self.name}': {_describe(alternate)} is not a string"
            )
        await self._create_exchange(context, name, ex_type, durable, auto_delete, internal, args)

    async def _create_exchange(
        self,
        context: ClientContext,
        name: str,
        ex_type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        args: dict[str, Any],
    ) -> None:
        config = {
            "object": "exchange",
            "type": ex_type,
            "durable": durable,
            "auto_delete": auto_delete,
            "internal": internal,
            "arguments": args,
        }
        try:
            # A topic another protocol made becomes this exchange too.
            await self.api.declare_exchange(
                context, self.exchange_topic(name), {CONFIG_KEY: config}
            )
        except TopicError as error:
            raise _refused(f"cannot declare exchange '{name}': {error}") from None
        self._exchanges.pop(name, None)

    def _assert_exchange_equivalent(
        self,
        existing: Exchange,
        ex_type: str,
        durable: bool,
        auto_delete: bool,
        internal: bool,
        args: Mapping[str, Any],
    ) -> None:
        where = f"exchange '{existing.name}' in vhost '{self.name}'"
        for what, received, current in (
            ("type", ex_type, existing.type),
            ("durable", durable, existing.durable),
            ("auto_delete", auto_delete, existing.auto_delete),
            ("internal", internal, existing.internal),
        ):
            if received != current:
                raise _precondition(
                    f"inequivalent arg '{what}' for {where}: received '{_word(received)}' but "
                    f"current is '{_word(current)}'"
                )
        _assert_args_equivalent(where, args, existing.arguments, EXCHANGE_EQUIVALENT_ARGS)

    async def delete_exchange(self, context: ClientContext, name: str, *, if_unused: bool) -> None:
        self._check_not_default(name)
        if name.startswith(RESERVED_PREFIX):
            raise _refused(f"deletion of system exchange '{name}' in vhost '{self.name}' refused")
        exchange = self.find_exchange(context, name)
        if exchange is None:
            return  # RabbitMQ 3.x: deleting a missing exchange is not an error
        if if_unused and self.api.exchange_has_bindings(exchange.topic):
            raise _precondition(f"exchange '{name}' in vhost '{self.name}' in use")
        await self._delete_exchange(context, exchange)

    async def _delete_exchange(self, context: ClientContext, exchange: Exchange) -> None:
        sources = await self.api.delete_exchange(context, exchange.topic)
        self._exchanges.pop(exchange.name, None)
        await self._auto_delete_exchanges(sources)

    async def _auto_delete_exchanges(self, topics: Iterable[str]) -> None:
        """Auto-delete exchanges go with their last binding (as a source)."""
        for topic in topics:
            name = self._exchange_of_topic(topic)
            exchange = None if name is None else self.find_exchange(self.context, name)
            if (
                exchange is not None
                and exchange.auto_delete
                and not self.api.exchange_has_bindings(exchange.topic)
            ):
                log.info("amqp: auto-delete exchange %r deleted (no bindings left)", name)
                await self._delete_exchange(self.context, exchange)

    # -- bindings ----------------------------------------------------------------------------

    @staticmethod
    def _binding_arguments(arguments: Mapping[str, Any] | None) -> dict[str, Any] | None:
        return jsonable(dict(arguments)) if arguments else None  # type: ignore[no-any-return]

    async def _bind(
        self,
        context: ClientContext,
        source: Exchange,
        pattern: str,
        destination: tuple[str, int],
        arguments: Mapping[str, Any] | None,
        unbind: bool,
    ) -> None:
        args = self._binding_arguments(arguments)
        if unbind:
            await self.api.unbind(context, source.topic, source.kind, pattern, destination, args)
            await self._auto_delete_exchanges([source.topic])
            return
        refusal = self.api.binding_limit_refusal(
            context,
            source.topic,
            source.kind,
            pattern,
            destination,
            args,
            self._described(destination),
        )
        if refusal is not None:  # [limits] max_bindings_per_destination
            log.info("amqp: %s: %s", context.peer or context.connection_id, refusal.text)
            raise _precondition(refusal.text)
        try:
            await self.api.bind(context, source.topic, source.kind, pattern, destination, args)
        except RoutingError as error:
            raise _precondition(f"invalid binding arguments: {error}") from None

    def _described(self, destination: tuple[str, int]) -> str:
        """``queue 'q'`` or ``exchange 'x'``: a binding destination in a refusal's words."""
        topic, queue = destination
        if queue == EXCHANGE_QUEUE:
            return f"exchange '{self.exchange_name(topic)}'"
        return f"queue '{self.queue_name(topic)}'"

    # Unbinding where the source or the destination is gone succeeds and changes nothing, as
    # RabbitMQ's rabbit_binding:remove (absent_errs_only: only a queue on a down node is an
    # error). So the clean-up of a binding whose auto-delete exchange went with its last
    # binding works (aio-pika's suite unbinds src -> dst after dst's last queue left).

    async def bind_queue(
        self,
        context: ClientContext,
        owner: object,
        queue: str,
        exchange: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None,
        *,
        unbind: bool = False,
    ) -> None:
        self._check_not_default(exchange)
        if unbind and (
            self.find_queue(queue) is None or self.find_exchange(context, exchange) is None
        ):
            return  # (see above bind_queue)
        target = self.queue(queue, owner)
        source = self.exchange(context, exchange)
        await self._bind(context, source, routing_key, (target.topic, 0), arguments, unbind)

    async def bind_exchange(
        self,
        context: ClientContext,
        destination: str,
        source: str,
        routing_key: str,
        arguments: Mapping[str, Any] | None,
        *,
        unbind: bool = False,
    ) -> None:
        self._check_not_default(destination)
        self._check_not_default(source)
        if unbind and (
            self.find_exchange(context, destination) is None
            or self.find_exchange(context, source) is None
        ):
            return  # (see above bind_queue)
        target = self.exchange(context, destination)
        origin = self.exchange(context, source)
        await self._bind(
            context, origin, routing_key, (target.topic, EXCHANGE_QUEUE), arguments, unbind
        )

    # -- queues ------------------------------------------------------------------------------

    def find_queue(self, name: str) -> Queue | None:
        """The queue named ``name``: this gateway's, or one the core knows that another node
        declared (learned now: in a cluster any node knows every queue, as in RabbitMQ)."""
        queue = self.queues.get(name)
        if queue is not None and queue.handle.deleted and not queue.deleted:
            self._deleted_elsewhere(queue)
            queue = None
        if queue is not None and queue.handle.remote:
            self._follow_takeover(queue)
        return queue if queue is not None else self._learn_queue(name)

    def _follow_takeover(self, queue: Queue) -> None:
        """``queue`` was reached on another node, whose shard this node took over (issue 23):
        its handle becomes the local ack queue's, so it is no longer reached over gRPC to
        this node itself."""
        if not self.api.queue_is_local(queue.topic):
            return
        handle = self.api.known_queue(queue.topic)
        if handle is None or handle.remote:
            return
        queue.handle = handle
        self._configure_queue(queue)  # (its TTL is swept here now)
        log.info("amqp: queue %r is served by this node now (its shard was taken over)", queue.name)

    def _deleted_elsewhere(self, queue: Queue) -> None:
        """``queue`` was deleted through another node, and this node, its owner, closed its
        ack queue as it followed: forget it, and cancel its consumers here (Basic.Cancel)."""
        log.info("amqp: queue %r deleted through another node", queue.name)
        self._forget(queue)
        for consumer in list(queue.consumers):
            consumer.cancelled_by_server()
        queue.consumers.clear()

    def _learn_queue(self, name: str) -> Queue | None:
        topic = self.queue_topic(name)
        info = self.api.topic_info(self.context, topic)
        config = None if info is None else info.config.get(CONFIG_KEY)
        if not isinstance(config, dict) or config.get("object") != "queue":
            return None
        handle = self.api.known_queue(topic)
        if handle is None:  # its definition has not followed yet, or it was deleted
            return None
        queue = Queue(
            name,
            topic,
            bool(config.get("durable")),
            bool(config.get("exclusive")),
            bool(config.get("auto_delete")),
            dict(config.get("arguments") or {}),
            handle,
            # An exclusive queue belongs to a connection of the node that declared it.
            _ELSEWHERE if config.get("exclusive") else None,
        )
        log.info("amqp: queue %r declared elsewhere learned from the core", name)
        self._configure_queue(queue)
        self.queues[name] = queue
        self._touch(queue)
        return queue

    def queue(self, name: str, owner: object) -> Queue:
        """The queue named ``name`` usable by ``owner``; 404 if missing, 405 if exclusive."""
        queue = self.find_queue(name)
        if queue is None:
            raise _not_found(f"no queue '{name}' in vhost '{self.name}'")
        if queue.owner is not None and queue.owner is not owner:
            raise self._locked(name)
        return queue

    def home_down(self, name: str, error: ShardUnavailable) -> AmqpChannelError:
        """RabbitMQ's 404 for a queue whose owner does not answer."""
        home = f"node {error.owner}" if error.owner is not None else f"shard {error.shard}"
        return _not_found(
            f"home node '{home}' of durable queue '{name}' in vhost '{self.name}' "
            "is down or inaccessible"
        )

    def _locked(self, name: str) -> AmqpChannelError:
        return AmqpChannelError(
            RESOURCE_LOCKED,
            f"RESOURCE_LOCKED - cannot obtain exclusive access to locked queue '{name}' in vhost "
            f"'{self.name}'. It could be originally declared on another connection or the "
            "exclusive property value does not match that of the original declaration.",
        )

    async def declare_queue(
        self,
        context: ClientContext,
        owner: object,
        name: str,
        *,
        passive: bool,
        durable: bool,
        exclusive: bool,
        auto_delete: bool,
        arguments: Mapping[str, Any] | None,
    ) -> Queue:
        if passive:
            queue = self.queue(name, owner)
            try:
                # Another node's queue: its owner's counts now (a local one's are at hand).
                stats = await self.api.refresh_queue(queue.handle)
            except ShardUnavailable as error:
                raise self.home_down(name, error) from None
            if stats is None:  # deleted on its owner meanwhile
                self._forget(queue)
                raise _not_found(f"no queue '{name}' in vhost '{self.name}'")
            self._touch(queue)
            return queue
        if not name:
            name = server_generated_name(SERVER_NAMED_PREFIX)
        args = jsonable(dict(arguments or {}))
        existing = self.find_queue(name)
        if existing is not None:
            # rabbit_amqqueue:check_exclusive_access(Q, Owner, strict): the declare's owner
            # (this connection when it says exclusive, none otherwise) must be the queue's, so
            # redeclaring an exclusive queue without exclusive is 405 even on its own connection.
            if existing.owner is not (owner if exclusive else None):
                raise self._locked(name)
            where = f"queue '{name}' in vhost '{self.name}'"
            for what, received, current in (
                ("durable", durable, existing.durable),
                ("auto_delete", auto_delete, existing.auto_delete),
            ):
                if received != current:
                    raise _precondition(
                        f"inequivalent arg '{what}' for {where}: received '{_word(received)}' "
                        f"but current is '{_word(current)}'"
                    )
            _assert_args_equivalent(where, args, existing.arguments, QUEUE_EQUIVALENT_ARGS)
            self._touch(existing)
            return existing
        if name.startswith(RESERVED_PREFIX) and not name.startswith(SERVER_NAMED_PREFIX):
            raise _refused(f"queue name '{name}' contains reserved prefix 'amq.*'")
        ack_config = self._ack_config(name, args)
        refusal = self.api.queue_limit_refusal(context, name)
        if refusal is not None:  # max-queues of the vhost, or [limits] max_queues
            log.info("amqp: %s: %s", context.peer or context.connection_id, refusal.text)
            raise _precondition(refusal.text)
        topic = self.queue_topic(name)
        config = {
            "object": "queue",
            "name": name,
            "durable": durable,
            "exclusive": exclusive,
            "auto_delete": auto_delete,
            "arguments": args,
        }
        try:
            # A new queue is empty, even where an earlier queue of that name left index entries.
            handle = await self.api.declare_queue(
                context, topic, {CONFIG_KEY: config}, ack_config, exclusive=exclusive
            )
        except TopicError as error:
            raise _precondition(f"cannot declare queue '{name}': {error}") from None
        queue = Queue(
            name,
            topic,
            durable,
            exclusive,
            auto_delete,
            args,
            handle,
            owner if exclusive else None,
        )
        self._configure_queue(queue)
        self.queues[name] = queue
        self._touch(queue)
        return queue

    def _ack_config(self, name: str, args: Mapping[str, Any]) -> AckQueueConfig:
        where = f"queue '{name}' in vhost '{self.name}'"
        ttl = _int_arg(where, args, "x-message-ttl", minimum=0)
        _int_arg(where, args, "x-expires", minimum=1)
        max_length = _int_arg(where, args, "x-max-length", minimum=0)
        limit = _int_arg(where, args, "x-delivery-limit", minimum=0)
        max_priority = _int_arg(where, args, MAX_PRIORITY_ARG, minimum=0)
        if max_priority is not None and max_priority > MAX_PRIORITY:
            # rabbit_amqqueue:check_max_priority_arg
            raise _precondition(
                f"invalid arg '{MAX_PRIORITY_ARG}' for {where}: "
                f"{{max_value_exceeded,{max_priority}}}"
            )
        overflow = args.get("x-overflow", "drop-head")
        if overflow not in OVERFLOW_MODES:
            raise _precondition(
                f"invalid arg 'x-overflow' for {where}: {{invalid_overflow_value,{overflow}}}"
            )
        single = args.get("x-single-active-consumer", False)
        if not isinstance(single, bool):
            raise _precondition(
                f"invalid arg 'x-single-active-consumer' for {where}: "
                f"{{unacceptable_type,{_describe(single)}}}"
            )
        dlx = args.get("x-dead-letter-exchange")
        dlrk = args.get("x-dead-letter-routing-key")
        for key, value in (("x-dead-letter-exchange", dlx), ("x-dead-letter-routing-key", dlrk)):
            if value is not None and not isinstance(value, str):
                raise _precondition(
                    f"invalid arg '{key}' for {where}: {{unacceptable_type,{_describe(value)}}}"
                )
        if dlrk is not None and dlx is None:
            raise _precondition(
                f"invalid arg 'x-dead-letter-routing-key' for {where}: "
                "routing_key_but_no_dlx_defined"
            )
        tag_expression = args.get(TAG_FILTER_ARG)
        if tag_expression is not None and not isinstance(tag_expression, str):
            raise _precondition(
                f"invalid arg '{TAG_FILTER_ARG}' for {where}: "
                f"{{unacceptable_type,{_describe(tag_expression)}}}"
            )
        dead_letter = DeadLetterPolicy()
        if dlx:
            dead_letter = DeadLetterPolicy(self.exchange_topic(dlx), dlrk)
        elif dlx == "" and dlrk:
            # The default exchange routes to the queue named by the routing key.
            dead_letter = DeadLetterPolicy(self.queue_topic(dlrk), dlrk)
        return AckQueueConfig(
            message_ttl_ms=ttl,
            max_length=max_length,
            overflow=OVERFLOW_MODES[overflow],
            single_active_consumer=single,
            delivery_limit=limit,
            tag_filter=TagFilter.parse(tag_expression) if tag_expression else None,
            dead_letter=dead_letter,
            max_priority=max_priority,
        )

    def _configure_queue(self, queue: Queue) -> None:
        expires = queue.arguments.get("x-expires")
        queue.expires_ms = expires if isinstance(expires, int) else None
        if queue.handle.message_ttl_ms is not None:
            self.expiring.add(queue)

    async def purge_queue(self, owner: object, name: str) -> int:
        """queue.purge: the ready records dropped (another node's queue by its owner)."""
        queue = self.queue(name, owner)
        try:
            purged = await self.api.purge_known_queue(queue.handle)
        except ShardUnavailable as error:
            raise self.home_down(name, error) from None
        if purged is None:  # deleted on its owner meanwhile
            self._forget(queue)
            raise _not_found(f"no queue '{name}' in vhost '{self.name}'")
        return purged

    async def delete_queue(
        self, owner: object, name: str, *, if_unused: bool, if_empty: bool
    ) -> int:
        queue = self.find_queue(name)  # (one another node declared is deleted here too)
        if queue is None:
            return 0  # RabbitMQ 3.x: deleting a missing queue is not an error
        if queue.owner is not None and queue.owner is not owner:
            raise self._locked(name)
        if if_unused and queue.consumers:
            raise _precondition(f"queue '{name}' in vhost '{self.name}' in use")
        try:
            # Checked and deleted at once where the queue is (its owner's consumers include
            # other nodes'); this gateway's part goes after.
            deleted = await self.api.delete_queue_if(
                self.context, queue.topic, queue.handle, if_empty=if_empty, if_unused=if_unused
            )
        except ShardUnavailable as error:
            raise self.home_down(name, error) from None
        if deleted is None:  # deleted on its owner meanwhile
            self._forget(queue)
            return 0
        if deleted.refused == "in use":
            raise _precondition(f"queue '{name}' in vhost '{self.name}' in use")
        if deleted.refused is not None:
            raise _precondition(f"queue '{name}' in vhost '{self.name}' is not empty")
        self._drop(queue)
        await self._auto_delete_exchanges(deleted.sources)
        return deleted.ready

    def remove_queue_soon(self, queue: Queue) -> None:
        """:meth:`remove_queue` from a callback that cannot wait (a timer, a consumer or a
        connection gone): done before this returns on a single node, else in the
        background."""
        start_eagerly(self.remove_queue(queue), self.run_in_background)

    def _forget(self, queue: Queue) -> None:
        """Drop ``queue`` from this gateway (another node deleted it)."""
        if self.queues.get(queue.name) is queue:
            del self.queues[queue.name]
        self.expiring.discard(queue)
        if queue.expiry is not None:
            queue.expiry.cancel()
            queue.expiry = None

    async def remove_queue(self, queue: Queue) -> None:
        """Delete a queue: its consumers are cancelled (Basic.Cancel to clients that take it),
        its bindings go, auto-delete exchanges left without bindings go too."""
        if queue.deleted:
            return
        self._drop(queue)
        # Its ack queue and index go with it; its bindings' sources may be left without any.
        sources = await self.api.delete_queue(self.context, queue.topic)
        await self._auto_delete_exchanges(sources)

    def _drop(self, queue: Queue) -> None:
        """This gateway's part of a queue's delete: it is forgotten, its consumers cancelled
        (Basic.Cancel to clients that take it)."""
        queue.deleted = True
        self.queues.pop(queue.name, None)
        self.expiring.discard(queue)
        if queue.expiry is not None:
            queue.expiry.cancel()
            queue.expiry = None
        for consumer in list(queue.consumers):
            consumer.cancelled_by_server()
        queue.consumers.clear()

    def owner_gone(self, owner: object) -> None:
        """A connection closed: its exclusive queues go."""
        for queue in [q for q in self.queues.values() if q.owner is owner]:
            self.remove_queue_soon(queue)

    # -- consumers and expiry ----------------------------------------------------------------

    def consumer_added(self, queue: Queue, consumer: ConsumerHandle) -> None:
        queue.consumers.append(consumer)
        if queue.expiry is not None:
            queue.expiry.cancel()
            queue.expiry = None

    def consumer_removed(self, queue: Queue, consumer: ConsumerHandle) -> None:
        if consumer in queue.consumers:
            queue.consumers.remove(consumer)
        if queue.consumers or queue.deleted:
            return
        if queue.auto_delete:
            log.info("amqp: auto-delete queue %r deleted (last consumer gone)", queue.name)
            self.remove_queue_soon(queue)
        else:
            self._touch(queue)

    def queue_used(self, queue: Queue) -> None:
        """basic.get, a redeclare: the queue is in use (x-expires starts again)."""
        self._touch(queue)

    def _touch(self, queue: Queue) -> None:
        if queue.expires_ms is None or queue.consumers or self._loop is None:
            return
        if not self.api.queue_is_local(queue.topic):
            # In a cluster only the queue's owner expires it, as RabbitMQ's home node does:
            # a node that merely knows the queue cannot see the consumers other nodes attach.
            return
        if queue.expiry is not None:
            queue.expiry.cancel()
        queue.expiry = self._loop.call_later(queue.expires_ms / 1000, self._expire, queue)

    def _expire(self, queue: Queue) -> None:
        queue.expiry = None
        if queue.deleted or queue.consumers:
            return
        if queue.handle.stats().consumers:
            # Consumers of other nodes, attached to the ack queue through the cluster's
            # Consume streams: still in use, so the unused period starts again.
            self._touch(queue)
            return
        log.info("amqp: queue %r expired (x-expires %d ms unused)", queue.name, queue.expires_ms)
        self.remove_queue_soon(queue)

    def _queue_changed(self, topic: str, defined: bool) -> None:
        """Another node declared (``defined``) or deleted the queue ``topic`` of this node's
        shards: learn it (its owner, here, sweeps its TTL and runs its x-expires) or forget it
        and cancel its consumers here, as :meth:`_learn_owned_queues` would at its next scan."""
        if not self.owns_topic(topic):
            return
        name = self.queue_name(topic)
        queue = self.queues.get(name)
        if not defined:
            if queue is not None and queue.handle.deleted and not queue.deleted:
                self._deleted_elsewhere(queue)
            return
        if queue is None:
            learned = self.find_queue(name)
            if learned is not None:
                # Publishes with an expiration reach it through other nodes: swept.
                self.expiring.add(learned)
        elif queue.handle.remote:  # (its shard came here: Node.add_shard)
            self._follow_takeover(queue)

    def _learn_owned_queues(self) -> None:
        """In a cluster, now and then: learn the queues of this node's shards that other nodes
        declared (:meth:`find_queue`), so their owner, here, sweeps their TTL and runs their
        x-expires (docs/cluster.md section 8), and forget those other nodes deleted. A node
        alone declared and deleted all its queues itself."""
        if self.api.this_node() == SINGLE_NODE_ID:
            return
        now = time.monotonic()
        if now - self._owned_scanned_at < OWNED_QUEUES_SCAN_INTERVAL_S:
            return
        self._owned_scanned_at = now
        for queue in [q for q in self.queues.values() if q.handle.deleted and not q.deleted]:
            self._deleted_elsewhere(queue)
        for info in self.api.topics_with_config(CONFIG_KEY):
            config = info.config.get(CONFIG_KEY)
            if (
                not isinstance(config, dict)
                or config.get("object") != "queue"
                or not self.owns_topic(info.name)
                or not self.api.queue_is_local(info.name)
            ):
                continue
            name = str(config.get("name", self.queue_name(info.name)))
            if name not in self.queues:
                learned = self.find_queue(name)
                if learned is not None:
                    # Publishes with an expiration reach it through other nodes, unseen here
                    # (a node alone adds a queue when such a publish goes there): swept.
                    self.expiring.add(learned)

    def _schedule_sweep(self) -> None:
        if self._loop is not None:
            self._sweeper = self._loop.call_later(TTL_SWEEP_INTERVAL_S, self._sweep)

    def _sweep(self) -> None:
        """Expire (drop or dead-letter) records at the head of queues nobody drains."""
        try:
            self._learn_owned_queues()
            for queue in list(self.expiring):
                if queue.handle.message_count():
                    queue.handle.expire_head()
        except Exception:
            log.exception("amqp: TTL sweep failed")
        finally:
            self._schedule_sweep()


def _word(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _int_arg(where: str, args: Mapping[str, Any], key: str, *, minimum: int) -> int | None:
    value = args.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise _precondition(f"invalid arg '{key}' for {where}: {{unacceptable_type,{value!r}}}")
    if value < minimum:
        reason = "value_zero" if value == 0 else "value_negative"
        raise _precondition(f"invalid arg '{key}' for {where}: {{{reason},{value}}}")
    return value


def _assert_args_equivalent(
    where: str, received: Mapping[str, Any], current: Mapping[str, Any], keys: Iterable[str]
) -> None:
    for key in keys:
        new, old = received.get(key), current.get(key)
        if new != old or isinstance(new, bool) != isinstance(old, bool):
            raise _precondition(
                f"inequivalent arg '{key}' for {where}: received {_describe(new)} but current "
                f"is {_describe(old)}"
            )
