"""Broker: the one object a gateway talks to.

It owns the log store, the topic registry, the binding table, the ack queues (AMQP queues, MQTT
session queues), the committed offsets and group membership of offset groups, and flow control.
Gateways translate their protocol into these calls; nothing here knows a wire format.

Publishing: ``publish(topic, body, subject=..., ...)`` picks the topic's queue (explicit, by key
hash, or round robin), routes the subject through the bindings of the topic to more destination
queues, appends ONE record indexed into all of them, and returns once it is durable.

Addresses: a destination is ``(topic, queue)``; ``(name, EXCHANGE_QUEUE)`` names a topic used as
a routing source (exchange-to-exchange bindings), which is followed, cycles cut.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.broker.ack_queues import AckQueues, ack_queue_config_from_json
from core.broker.flow import FlowControl
from core.broker.partitioner import murmur2_partition
from core.broker.topics import (
    DEFAULT_MAX_PARTITIONS,
    DEFAULT_MAX_PARTITIONS_PER_TOPIC,
    DEFAULT_MAX_TOPICS,
    TopicError,
    TopicInfo,
    TopicLimits,
    TopicRegistry,
)
from core.cluster import KIND_BINDING, KIND_QUEUE, Change, LocalMetadata
from core.delivery.ackqueue import (
    AckQueue,
    DeadLetterHook,
)
from core.delivery.message import (
    BATCH_SELECT_HEADER,
    inner_subject,
    selection_key,
)
from core.groups import (
    DEFAULT_INITIAL_REBALANCE_DELAY_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
    GroupCoordinator,
)
from core.log import LogStore
from core.log import record as rec
from core.log.batches import batch_is_control, unpack_batch
from core.log.names import ACKS_TOPIC
from core.log.store import Appended
from core.log.tags import batch_may_have_tags, tags_from_headers
from core.offsets import OffsetStore
from core.routing.table import BindingTable, MatchKind
from core.state import DurableTable
from core.timers import TimerService
from core.transactions import TransactionService
from core.transactions.control import (
    CONTROL_TOPICS,
    RESULT_HEADER,
    TXN_TOPIC,
    HalfMessages,
    batch_half_mark,
    half_mark,
    outcome_txn_id,
)
from core.transactions.service import (
    DEFAULT_CHECK_CALL_TIMEOUT_MS,
    DEFAULT_CHECK_TIMEOUT_MS,
    DEFAULT_MAX_CHECKS,
    RecordFields,
)

log = logging.getLogger(__name__)

Destination = tuple[str, int]
# A route hook adds destinations to every publish, whatever its protocol (the MQTT gateway's
# filters with a wildcard first level): (topic, subject, key, protocol, address) -> destinations.
# ``address`` is the publisher's own name of the target (the MQTT topic name for an MQTT publish).
RouteHook = Callable[[str, str, bytes | None, int, str], Sequence[Destination]]
EXCHANGE_QUEUE = -1  # (name, -1): the topic ``name`` as a routing source
# Ack state of dirty queues is written this often (batched, never per ack).
ACK_STATE_FLUSH_INTERVAL_S = 0.05
FLOW_CHECK_INTERVAL_S = 0.25
# Exchange-to-exchange routing deeper than this is cut (RabbitMQ has no limit but detects cycles).
MAX_ROUTING_HOPS = 32


@dataclass
class BrokerConfig:
    auto_create_topics: bool = True
    # Queues (Kafka partitions) of a topic created on first use: Kafka's num.partitions.
    num_partitions: int = 1
    # Caps on topics and their queues (core/broker/topics.py:TopicLimits, docs/limits.md).
    max_topics: int = DEFAULT_MAX_TOPICS
    max_partitions_per_topic: int = DEFAULT_MAX_PARTITIONS_PER_TOPIC
    max_partitions: int = DEFAULT_MAX_PARTITIONS
    # What the records of one Kafka batch may inflate to (docs/limits.md): Kafka's
    # socket.request.max.bytes (100 MiB), the most an uncompressed batch could be.
    max_inflated_batch_bytes: int = 100 * 1024 * 1024
    memory_high_watermark_bytes: int | None = None
    # Publishers are slowed while an ack queue holds more ready records than this.
    backlog_high_watermark: int | None = None
    # RabbitMQ MQTT plugin compatibility: the AMQP topic exchange MQTT traffic also appears on
    # (``amq.topic``); None or "": off. Default from the environment variable
    # BRAID_MQTT_EXCHANGE (``[broker] mqtt_exchange`` in the config file overrides it).
    mqtt_exchange: str | None = field(
        default_factory=lambda: os.environ.get("BRAID_MQTT_EXCHANGE") or None
    )
    # Half messages with check-back (core/transactions/control.py; RocketMQ's
    # transactionTimeOut, transactionCheckMax): ms before an undecided transaction is checked
    # back, checks before the default outcome (rollback), ms a check waits for the answer.
    txn_check_timeout_ms: int = int(DEFAULT_CHECK_TIMEOUT_MS)
    txn_max_checks: int = DEFAULT_MAX_CHECKS
    txn_check_call_timeout_ms: int = DEFAULT_CHECK_CALL_TIMEOUT_MS
    # Kafka consumer groups (core/groups/coordinator.py): Kafka's group.min.session.timeout.ms,
    # group.max.session.timeout.ms and group.initial.rebalance.delay.ms.
    group_min_session_timeout_ms: int = DEFAULT_MIN_SESSION_TIMEOUT_MS
    group_max_session_timeout_ms: int = DEFAULT_MAX_SESSION_TIMEOUT_MS
    group_initial_rebalance_delay_ms: int = DEFAULT_INITIAL_REBALANCE_DELAY_MS

    def __post_init__(self) -> None:
        if self.num_partitions < 1:
            raise ValueError("num_partitions must be >= 1")
        if not 1 <= self.num_partitions <= self.max_partitions_per_topic:
            raise ValueError("num_partitions must be <= max_partitions_per_topic")
        TopicLimits(self.max_topics, self.max_partitions_per_topic, self.max_partitions)
        if self.max_inflated_batch_bytes < 1:
            raise ValueError("max_inflated_batch_bytes must be >= 1")
        if not 0 <= self.group_min_session_timeout_ms <= self.group_max_session_timeout_ms:
            raise ValueError(
                "need 0 <= group_min_session_timeout_ms <= group_max_session_timeout_ms"
            )
        if self.group_initial_rebalance_delay_ms < 0:
            raise ValueError("group_initial_rebalance_delay_ms must be >= 0")
        if not self.mqtt_exchange:  # "" (a config file's "off") is None
            self.mqtt_exchange = None
        if self.txn_check_timeout_ms <= 0 or self.txn_check_call_timeout_ms <= 0:
            raise ValueError("txn_check_timeout_ms and txn_check_call_timeout_ms must be > 0")
        if self.txn_max_checks < 0:
            raise ValueError("txn_max_checks must be >= 0")


@dataclass(slots=True)
class PublishResult:
    """What became of one publish; the Broker API hands it to gateways as ``PublishOutcome``
    (one object per publish: a second one, copied from this, cost MQTT QoS 0 ~7% of the
    broker's CPU). A value: the lists were made for this publish alone."""

    appended: Appended
    destinations: list[Destination]
    queue: int
    refused: list[Destination] = field(default_factory=list)
    # Stored as a half message (header x-braid-txn-id): invisible until committed.
    half: bool = False
    record_count: int = 1

    @property
    def offset(self) -> int:
        """Offset of the record in the topic's own queue (-1 for a half message: it gets
        its offset when committed)."""
        return -1 if self.half else self.appended.offsets[0][2]

    @property
    def delivered_to(self) -> list[Destination]:
        """Every destination the record was indexed in, its topic's own queue first."""
        return self.destinations

    @property
    def durable_mark(self) -> int:
        """What ``BrokerAPI.when_durable`` takes to wait for this record and all before it."""
        return self.appended.end


BRAID_HEADER_PREFIX = b"x-braid-"


def may_carry_braid_headers(batch: bytes | memoryview) -> bool:
    """Whether an uncompressed Kafka batch may carry an ``x-braid-*`` record header (tags, a
    transaction id, a delivery time): one byte search instead of one per header name, which on
    a batch of small records cost as much as storing it."""
    return BRAID_HEADER_PREFIX in (batch if type(batch) is bytes else bytes(batch))


def batch_tags(batch: bytes | memoryview) -> list[str]:
    """The tags of a Kafka batch record: the union of its records' ``x-braid-tags`` headers
    (a tag filter then takes or skips the whole batch)."""
    if batch_is_control(batch):
        return []
    tags: list[str] = []
    for inner in unpack_batch(batch):
        for tag in tags_from_headers(inner.headers):
            if tag not in tags:
                tags.append(tag)
    return tags


class Broker(AckQueues):
    def __init__(self, store: LogStore, config: BrokerConfig | None = None) -> None:
        self.store = store
        self.config = config or BrokerConfig()
        # Cluster-wide definitions (topics, bindings, queues, security, limits): on a single
        # node the __meta/__security/__limits tables of this log (docs/cluster.md section 4).
        self.metadata: LocalMetadata = LocalMetadata(store)
        self.topics = TopicRegistry(
            self.metadata,
            TopicLimits(
                self.config.max_topics,
                self.config.max_partitions_per_topic,
                self.config.max_partitions,
            ),
        )
        self.bindings: BindingTable[Destination] = BindingTable()
        self.offsets = OffsetStore(store)
        # Membership of offset groups (Kafka consumer groups); in memory, members rejoin.
        self.groups = GroupCoordinator(
            initial_rebalance_delay_ms=self.config.group_initial_rebalance_delay_ms,
            min_session_timeout_ms=self.config.group_min_session_timeout_ms,
            max_session_timeout_ms=self.config.group_max_session_timeout_ms,
        )
        # Half messages and their commit/rollback (RocketMQ semantics): the base of Kafka
        # transactions and AMQP tx. Front ends register their check-back per producer group.
        self.transactions = TransactionService(
            store,
            check_timeout_ms=self.config.txn_check_timeout_ms,
            max_checks=self.config.txn_max_checks,
            check_call_timeout_ms=self.config.txn_check_call_timeout_ms,
        )
        # The same from every protocol: header x-braid-txn-id, topics braid.txn(.check).
        self.half_messages = HalfMessages(self, self.transactions)
        # Delayed records (and retries with back-off) become visible at their time.
        self.timers = TimerService(store)
        for group in self.offsets.groups():
            self.groups.ensure_group(group)
        self.flow = FlowControl(self.config.memory_high_watermark_bytes)
        self.ack_queues: dict[Destination, AckQueue] = {}
        self._ack_states = DurableTable(store, ACKS_TOPIC)
        self._round_robin: dict[str, int] = {}
        self._watchers: dict[Destination, list[asyncio.Future[None]]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        # Work started from a callback that could not wait for it (start_eagerly's spawn).
        self._background: set[asyncio.Task[object]] = set()
        # Observer of records leaving a queue unconsumed (tests, metrics); the move itself is
        # the broker's (_dead_letter).
        self.dead_letter_hook: DeadLetterHook | None = None
        self.metrics: dict[str, int] = {"retried": 0, "dead_lettered": 0, "dropped": 0}
        self.route_hooks: list[RouteHook] = []
        self._hook_filters: dict[RouteHook, Callable[[str], bool]] = {}
        self._load_bindings_and_queues()
        store.index_listeners.append(self._on_index)
        store.retention_guards.append(self._segment_is_owed)

    # -- startup / shutdown ----------------------------------------------------------------

    def _load_bindings_and_queues(self) -> None:
        for _key, value in self.metadata.items(KIND_BINDING):
            raw = json.loads(value)
            self.bindings.add(
                raw["source"],
                raw["kind"],
                raw["pattern"],
                (raw["destination"][0], int(raw["destination"][1])),
                raw.get("arguments"),
            )
        for _key, value in self.metadata.items(KIND_QUEUE):
            raw = json.loads(value)
            destination = (raw["topic"], int(raw["queue"]))
            self._open_ack_queue(destination, ack_queue_config_from_json(raw["config"]))

    async def start(self) -> None:
        await self.timers.start()
        await self.half_messages.declare_topics()
        await self.transactions.start()
        self._tasks = [
            asyncio.create_task(self._periodic(ACK_STATE_FLUSH_INTERVAL_S, self.flush_ack_states)),
            asyncio.create_task(self._periodic(FLOW_CHECK_INTERVAL_S, self.check_flow)),
        ]

    async def _periodic(self, interval: float, action: Callable[[], object]) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                action()
            except Exception:
                log.exception("broker task %s failed", getattr(action, "__name__", action))

    def _spawn(self, work: Coroutine[Any, Any, object]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background_done)

    def _background_done(self, task: asyncio.Task[object]) -> None:
        self._background.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("broker: background work failed", exc_info=task.exception())

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, *self._background, return_exceptions=True)
        self._tasks = []
        await self.transactions.aclose()
        await self.timers.stop()
        self.flush_ack_states()
        self.groups.close()
        for waiters in self._watchers.values():
            for waiter in waiters:
                if not waiter.done():
                    waiter.cancel()
        self._watchers.clear()

    # -- topics ----------------------------------------------------------------------------

    async def declare_topic(
        self, name: str, queues: int | None = None, config: dict[str, Any] | None = None
    ) -> tuple[TopicInfo, bool]:
        return await self.topics.declare(name, queues or self.config.num_partitions, config)

    def topic(self, name: str) -> TopicInfo:
        """The topic ``name``; :class:`TopicError` when there is none."""
        info = self.topics.get(name)
        if info is None:
            raise TopicError("unknown", f"no topic {name!r}")
        return info

    async def _auto_create(self, name: str, create: bool | None) -> TopicInfo:
        """A publish to the unknown topic ``name``: created when ``create`` (None: the
        ``auto_create_topics`` setting) says so, else :class:`TopicError`."""
        if create if create is not None else self.config.auto_create_topics:
            return (await self.declare_topic(name))[0]
        raise TopicError("unknown", f"no topic {name!r}")

    async def delete_topic(self, name: str) -> bool:
        info = self.topics.get(name)
        if info is None:
            return False
        self.bindings.remove_source(name)
        for queue in range(info.queues):
            await self.delete_ack_queue(name, queue)
            self.bindings.remove_destination((name, queue))
        await self._persist_bindings_of(name)
        deleted = await self.topics.delete(name)
        # As Kafka does: the topic's committed offsets go with it, and a topic created again
        # under the same name starts empty at offset 0.
        self.offsets.delete_topic(name)
        self.store.drop_queues(name)
        return deleted

    # -- bindings --------------------------------------------------------------------------

    @staticmethod
    def _binding_key(
        source: str, kind: str, pattern: str, destination: Destination, arguments: Any
    ) -> str:
        identity = [source, kind, pattern, list(destination), arguments]
        return json.dumps(identity, sort_keys=True, default=str)

    async def bind(
        self,
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        """Add a durable binding; False if it existed already."""
        added = self.bindings.add(source, kind, pattern, destination, arguments)
        if added:
            kind_name = MatchKind(kind).value
            args = dict(arguments) if arguments else None
            value = json.dumps(
                {
                    "source": source,
                    "kind": kind_name,
                    "pattern": pattern,
                    "destination": list(destination),
                    "arguments": args,
                },
                default=str,
            ).encode()
            key = self._binding_key(source, kind_name, pattern, destination, args)
            await self.metadata.apply([Change(KIND_BINDING, key, value)])
        return added

    async def unbind(
        self,
        source: str,
        kind: MatchKind | str,
        pattern: str,
        destination: Destination,
        arguments: Mapping[str, Any] | None = None,
    ) -> bool:
        removed = self.bindings.remove(source, kind, pattern, destination, arguments)
        if removed:
            args = dict(arguments) if arguments else None
            key = self._binding_key(source, MatchKind(kind).value, pattern, destination, args)
            await self.metadata.apply([Change(KIND_BINDING, key, None)])
        return removed

    async def _persist_bindings_of(self, name: str) -> None:
        """Drop persisted bindings no longer in the table (after bulk removal)."""
        live = {
            self._binding_key(
                b.source,
                b.kind.value,
                b.pattern,
                b.destination,
                dict(b.arguments) if b.arguments else None,
            )
            for b in self.bindings.bindings()
        }
        gone = [key for key, _ in self.metadata.items(KIND_BINDING) if key not in live]
        if gone:
            await self.metadata.apply([Change(KIND_BINDING, key, None) for key in gone])

    def route(
        self, topic: str, subject: str, headers: Mapping[str, Any] | None = None
    ) -> list[Destination]:
        """Queues a record published to ``topic`` with ``subject`` reaches through bindings,
        following exchange-to-exchange bindings."""
        found: list[Destination] = []
        seen_queues: set[Destination] = set()
        visited = {topic}
        frontier = [topic]
        hops = 0
        while frontier and hops < MAX_ROUTING_HOPS:
            hops += 1
            next_frontier: list[str] = []
            for source in frontier:
                for destination in self.bindings.route(source, subject, headers):
                    if destination[1] == EXCHANGE_QUEUE:
                        name = destination[0]
                        if name not in visited:
                            visited.add(name)
                            next_frontier.append(name)
                            # The exchange's own stream sees what was routed to it.
                            own = (name, 0)
                            if own not in seen_queues and name in self.topics:
                                seen_queues.add(own)
                                found.append(own)
                    elif destination not in seen_queues:
                        seen_queues.add(destination)
                        found.append(destination)
            frontier = next_frontier
        return found

    def add_route_hook(
        self, hook: RouteHook, *, may_route: Callable[[str], bool] | None = None
    ) -> None:
        """Every publish (any protocol, plain or Kafka batch) also goes to what ``hook`` returns.
        ``may_route(topic)`` False promises that ``hook`` returns nothing for any record of
        ``topic`` right now: a Kafka batch to such a topic is then stored without decoding its
        records to route each one (most of a produce's cost otherwise)."""
        self.route_hooks.append(hook)
        if may_route is not None:
            self._hook_filters[hook] = may_route

    def remove_route_hook(self, hook: RouteHook) -> None:
        if hook in self.route_hooks:
            self.route_hooks.remove(hook)
        self._hook_filters.pop(hook, None)

    def _hooks_may_route(self, topic: str) -> bool:
        filters = self._hook_filters
        for hook in self.route_hooks:
            may_route = filters.get(hook)
            if may_route is None or may_route(topic):
                return True
        return False

    def _hooked(
        self, topic: str, subject: str, key: bytes | None, protocol: int, address: str
    ) -> list[Destination]:
        found: list[Destination] = []
        for hook in self.route_hooks:
            found.extend(hook(topic, subject, key, protocol, address))
        return found

    # -- publishing ------------------------------------------------------------------------

    def choose_queue(self, info: TopicInfo, key: bytes | None) -> int:
        if info.queues == 1:
            return 0
        if key:
            return murmur2_partition(key, info.queues)
        turn = self._round_robin.get(info.name, -1) + 1
        self._round_robin[info.name] = turn
        return turn % info.queues

    def prepare_destinations(
        self,
        topic: str,
        queue: int,
        subject: str,
        routing_headers: Mapping[str, Any] | None,
        extra: Sequence[Destination] = (),
        *,
        key: bytes | None = None,
        protocol: int = rec.PROTOCOL_INTERNAL,
        address: str = "",
    ) -> tuple[list[Destination], list[Destination]]:
        """``(destinations, refused)``: the topic's queue, routed queues, route hooks' and
        ``extra``, minus ack queues that refuse publishes (reject-publish overflow)."""
        destinations = [(topic, queue)]
        seen = {destinations[0]}
        hooked = self._hooked(topic, subject, key, protocol, address) if self.route_hooks else ()
        for destination in (*self.route(topic, subject, routing_headers), *hooked, *extra):
            if destination not in seen:
                seen.add(destination)
                destinations.append(destination)
        refused = []
        for destination in destinations[1:]:
            ack_queue = self.ack_queues.get(destination)
            if ack_queue is not None and ack_queue.would_overflow():
                refused.append(destination)
        if refused:
            destinations = [d for d in destinations if d not in refused]
        return destinations, refused

    async def publish(
        self,
        topic: str,
        body: bytes | memoryview | None,
        *,
        queue: int | None = None,
        key: bytes | None = None,
        subject: str = "",
        headers: rec.Headers = (),
        routing_headers: Mapping[str, Any] | None = None,
        tags: Sequence[str] = (),
        protocol: int = rec.PROTOCOL_INTERNAL,
        client: str = "",
        address: str = "",
        born_ms: int = 0,
        deliver_at_ms: int = 0,
        extra_destinations: Sequence[Destination] = (),
        create_topic: bool | None = None,
        wait_durable: bool = True,
    ) -> PublishResult:
        """Store one record for every destination it reaches; returns once durable.

        Raises TopicError for an unknown topic (unless auto-created). Ack queues refusing it
        under reject-publish are listed in ``result.refused`` (AMQP nacks the publish then, as
        RabbitMQ does); every other destination still gets the record.
        """
        if self.flow.reasons:
            await self.flow.wait_unblocked()
        info = self.topics.get(topic)
        if info is None:
            info = await self._auto_create(topic, create_topic)
        if queue is None:
            # No key: the subject partitions, as a Kafka producer keyed by it would (order per
            # routing key / MQTT topic is then kept in one Kafka partition).
            chosen = self.choose_queue(info, key or (subject.encode() if subject else None))
        else:
            chosen = queue
        if not 0 <= chosen < info.queues:
            raise TopicError("unknown_queue", f"topic {topic!r} has no queue {chosen}")
        if not tags and headers:
            # Tags from any protocol: the ``x-braid-tags: A,B`` header (docs/mapping.md).
            tags = tags_from_headers(headers)
        # Half messages from any protocol (core/transactions/control.py): header
        # x-braid-txn-id makes a half message; a record to braid.txn decides one.
        mark = None
        outcome_ok = True
        if topic in CONTROL_TOPICS:
            if topic == TXN_TOPIC:
                txn_id = outcome_txn_id(headers, subject, key)
                result, outcome_ok = await self.half_messages.apply(txn_id, body)
                headers = [*headers, (RESULT_HEADER, result.encode())]
        elif headers:
            mark = half_mark(headers)
        destinations, refused = self.prepare_destinations(
            topic,
            chosen,
            subject,
            routing_headers,
            extra_destinations,
            key=key,
            protocol=protocol,
            address=address,
        )
        if not outcome_ok:
            refused = [*refused, (topic, chosen)]  # the outcome was not applied: nack it
        # The record's fields, whether it is stored as a half or as a plain record.
        fields: RecordFields = {
            "key": key,
            "headers": headers,
            "tags": tags,
            "subject": subject,
            "client": client,
            "address": address,
            "protocol": protocol,
            "born_ms": born_ms,
        }
        if mark is not None:
            appended = self.half_messages.add_half(
                mark, topic, chosen, body, destinations=destinations, **fields
            )
            await self._after_half(appended, topic, wait_durable)
            return PublishResult(appended, destinations, chosen, refused, half=True)
        appended = self.store.append(
            topic,
            chosen,
            body,
            destinations=destinations if len(destinations) > 1 else None,
            deliver_at_ms=deliver_at_ms,
            **fields,
        )
        await self._after_append(appended, destinations, topic, wait_durable)
        return PublishResult(appended, destinations, chosen, refused)

    async def _after_append(
        self,
        appended: Appended,
        destinations: Sequence[Destination],
        topic: str,
        wait_durable: bool,
    ) -> None:
        """What every publish does once its record is stored: apply max-length (drop-head) on
        the ack queues it reached, then wait for the topic's durability."""
        for destination in destinations[1:]:
            ack_queue = self.ack_queues.get(destination)
            if ack_queue is not None and ack_queue.config.max_length is not None:
                ack_queue.enforce_max_length()
        if wait_durable:
            await self.store.wait_durable(appended.end, topic)

    async def _after_half(self, appended: Appended, topic: str, wait_durable: bool) -> None:
        """A half message is indexed only in ``__half`` (its commit's LINK is what indexes it
        in its topic); a gateway that hands its own publishes to live subscribers checks
        ``PublishResult.half`` first (the MQTT hub does)."""
        if wait_durable:
            await self.store.wait_durable(appended.end, topic)

    async def publish_batch(
        self,
        topic: str,
        queue: int,
        batch: bytes | memoryview,
        record_count: int,
        *,
        born_ms: int = 0,
        client: str = "",
        address: str = "",
        flags: int = 0,
        deliver_at_ms: int = 0,
        wait_durable: bool = True,
        braid_headers: bool | None = None,
    ) -> PublishResult:
        """Store a Kafka RecordBatch as one batch record in ``(topic, queue)``, indexed once;
        returns once durable (``wait_durable``) with the batch's base offset. With
        ``deliver_at_ms`` in the future the batch waits in ``__timers`` (offset known later).
        ``braid_headers=False``: the caller searched the batch and found no ``x-braid-`` header
        name in it (no tags, no half message), so it is not searched again here."""
        if self.flow.reasons:
            await self.flow.wait_unblocked()
        info = self.topic(topic)
        if not 0 <= queue < info.queues:
            raise TopicError("unknown_queue", f"topic {topic!r} has no queue {queue}")
        if braid_headers is None:
            braid_headers = may_carry_braid_headers(batch)
        mark = None
        outcome: tuple[str, bool] | None = None
        if topic == TXN_TOPIC:
            outcome = await self.half_messages.apply_batch(batch)
        elif braid_headers and topic not in CONTROL_TOPICS:
            mark = batch_half_mark(batch)
        destinations, headers = self.batch_destinations(topic, queue, batch)
        tags = batch_tags(batch) if braid_headers and batch_may_have_tags(batch) else []
        if mark is not None:
            appended = self.half_messages.add_half(
                mark,
                topic,
                queue,
                batch,
                key=None,
                headers=headers,
                tags=tags,
                subject="",
                client=client,
                address=address,
                destinations=destinations,
                protocol=rec.PROTOCOL_KAFKA,
                born_ms=born_ms,
                flags=flags | rec.FLAG_BATCH,
                record_count=record_count,
            )
            await self._after_half(appended, topic, wait_durable)
            return PublishResult(appended, destinations, queue, half=True)
        refused: list[Destination] = []
        if outcome is not None:
            headers = [*headers, (RESULT_HEADER, outcome[0].encode())]
            if not outcome[1]:
                refused.append((topic, queue))
        appended = self.store.append_batch(
            topic,
            queue,
            batch,
            record_count,
            born_ms=born_ms,
            client=client,
            address=address,
            flags=flags,
            destinations=destinations if len(destinations) > 1 else None,
            headers=headers,
            tags=tags,
            deliver_at_ms=deliver_at_ms,
        )
        await self._after_append(appended, destinations, topic, wait_durable)
        return PublishResult(appended, destinations, queue, refused)

    def batch_destinations(
        self, topic: str, queue: int, batch: bytes | memoryview
    ) -> tuple[list[Destination], list[tuple[str, bytes]]]:
        """Route each record of a Kafka batch by its subject (``x-braid-routing-key`` header,
        else its key): the batch's destinations (its own queue first) and, when they differ per
        record, the ``x-braid-batch-select`` header saying which records each one takes. The
        batch is decoded only when the topic has bindings or route hooks; it is stored once."""
        own = (topic, queue)
        if not self.bindings.has_source(topic) and not self._hooks_may_route(topic):
            return [own], []
        if batch_is_control(batch):
            return [own], []
        records = unpack_batch(batch)
        taken: dict[Destination, list[int]] = {}
        for inner in records:
            subject = inner_subject(inner.key, inner.headers)
            routing_headers = (
                {name: value.decode("utf-8", "replace") for name, value in inner.headers}
                if inner.headers
                else None
            )
            destinations, _ = self.prepare_destinations(
                topic, queue, subject, routing_headers, key=inner.key, protocol=rec.PROTOCOL_KAFKA
            )
            for destination in destinations[1:]:
                taken.setdefault(destination, []).append(inner.offset_delta)
        select = {
            selection_key(*destination): deltas
            for destination, deltas in taken.items()
            if len(deltas) < len(records)
        }
        headers = [(BATCH_SELECT_HEADER, json.dumps(select).encode())] if select else []
        return [own, *taken], headers

    # -- index notifications and long polling ----------------------------------------------

    def _on_index(self, topic: str, queue: int, offset: int) -> None:
        destination = (topic, queue)
        ack_queue = self.ack_queues.get(destination)
        if ack_queue is not None:
            ack_queue.notify()
        waiters = self._watchers.pop(destination, None)
        if waiters:
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    async def wait_for_records(self, keys: Sequence[Destination], timeout_s: float) -> bool:
        """Long poll: True when any of ``keys`` got a new entry before ``timeout_s``."""
        if timeout_s <= 0 or not keys:
            return False
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        for key in keys:
            self._watchers.setdefault(key, []).append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            for key in keys:
                waiters = self._watchers.get(key)
                if waiters and waiter in waiters:
                    waiters.remove(waiter)

    # -- flow control and retention --------------------------------------------------------

    def check_flow(self) -> None:
        self.flow.check_memory()
        limit = self.config.backlog_high_watermark
        if limit is None:
            return
        behind = any(q.consumers and q.message_count() > limit for q in self.ack_queues.values())
        self.flow.set_pressure("backlog", behind)

    def _segment_is_owed(self, start: int, end: int) -> bool:
        """Retention guard: a segment holding a record an ack queue still owes, or that a
        durable table's replay needs, is kept (the metadata guards its own tables)."""
        for ack_queue in self.ack_queues.values():
            owed = ack_queue.owed_from_position()
            if owed is not None and owed < end:
                return True
        for table in (self.offsets.table, self._ack_states):
            needed = table.oldest_needed_position()
            if needed is not None and needed < end:
                # Rewrite the table's live keys at the log's end so the old segment is free.
                table.compact()
                needed = table.oldest_needed_position()
                if needed is not None and needed < end:
                    return True
        return False
