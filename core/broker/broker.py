"""What the two halves of the broker share (docs/cluster.md section 6): its settings
(:class:`BrokerConfig`), what a publish became (:class:`PublishResult`), destinations and route
hooks, and the look into a Kafka batch that decides how it is stored.

The broker is a :class:`~core.broker.node.Node` (cluster-wide: definitions, routing, flow
control; the object the Broker API is built over) and its shards
(:class:`~core.broker.shard.Shard`: a log, and what its records are the truth of). Nothing
here knows a wire format.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from core.broker.topics import (
    DEFAULT_MAX_PARTITIONS,
    DEFAULT_MAX_PARTITIONS_PER_TOPIC,
    DEFAULT_MAX_TOPICS,
    TopicLimits,
)
from core.groups import (
    DEFAULT_INITIAL_REBALANCE_DELAY_MS,
    DEFAULT_MAX_SESSION_TIMEOUT_MS,
    DEFAULT_MIN_SESSION_TIMEOUT_MS,
)
from core.log.batches import batch_is_control, unpack_batch
from core.log.store import Appended
from core.log.tags import tags_from_headers
from core.transactions.service import (
    DEFAULT_CHECK_CALL_TIMEOUT_MS,
    DEFAULT_CHECK_TIMEOUT_MS,
    DEFAULT_MAX_CHECKS,
)

Destination = tuple[str, int]
# A route hook adds destinations to every publish, whatever its protocol (the MQTT gateway's
# filters with a wildcard first level): (topic, subject, key, protocol, address) -> destinations.
# ``address`` is the publisher's own name of the target (the MQTT topic name for an MQTT publish).
RouteHook = Callable[[str, str, bytes | None, int, str], Sequence[Destination]]
EXCHANGE_QUEUE = -1  # (name, -1): the topic ``name`` as a routing source


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
    # A node of many shards: the publish's node-local sequence number, its durable mark
    # (core/broker/shards.py:DurableMarks); -1 on one shard, whose mark is a log position.
    sequence: int = -1

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
        return self.appended.end if self.sequence < 0 else self.sequence


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
