"""Topic definitions: a topic is a named stream of N queues (Kafka partitions; an AMQP exchange
or queue has one). Durable as definitions of kind ``topic`` of the node's
:class:`~core.cluster.metadata.MetadataStore` (on a single node: the ``__meta`` system topic);
lookups are this registry's in-memory dict.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from core.cluster.metadata import KIND_TOPIC, Change, MetadataStore
from core.errors import TopicError as TopicError  # re-exported: its importers name it here
from core.log.names import is_system_topic

# Kafka's limit on topic names is 249 characters; AMQP's shortstr allows 255 bytes.
MAX_TOPIC_NAME_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f]")

# Caps on what topic declarations may ask for (issue 21: one CreateTopics with 2^31-1
# partitions grew the next Metadata to 4 GB and killed the broker, again after every restart).
# Kafka's KRaft controller refuses more than 10,000 new partitions in one request
# (ReplicationControlManager.MAX_PARTITIONS_PER_BATCH, POLICY_VIOLATION "Excessively large
# number of partitions per request."): a topic cannot be created with more there, so the same
# number caps one topic here.
DEFAULT_MAX_PARTITIONS_PER_TOPIC = 10_000
# Kafka has no total cap; Confluent's sizing guidance is at most 200,000 partitions per
# (ZooKeeper-mode) cluster. Every queue of every protocol counts (an AMQP queue or exchange,
# an MQTT topic: one each).
DEFAULT_MAX_PARTITIONS = 200_000
# Every topic has at least one queue, so the same number; a topic's registry entry, bindings
# and index files are what it costs besides.
DEFAULT_MAX_TOPICS = 200_000


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """Caps on topics (``[broker]`` settings ``max_topics``, ``max_partitions_per_topic``,
    ``max_partitions``; docs/limits.md). A declaration past one raises :class:`TopicError`
    with code ``invalid_partitions`` (a topic's own count) or ``policy_violation`` (a total),
    which Kafka answers with INVALID_PARTITIONS (37) and POLICY_VIOLATION (44)."""

    max_topics: int = DEFAULT_MAX_TOPICS
    max_partitions_per_topic: int = DEFAULT_MAX_PARTITIONS_PER_TOPIC
    max_partitions: int = DEFAULT_MAX_PARTITIONS

    def __post_init__(self) -> None:
        if min(self.max_topics, self.max_partitions_per_topic, self.max_partitions) < 1:
            raise ValueError("max_topics, max_partitions_per_topic and max_partitions must be >= 1")


@dataclass
class TopicInfo:
    name: str
    queues: int
    # Free-form settings gateways and features keep per topic (exchange type, retention, ...).
    config: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps({"queues": self.queues, "config": self.config}).encode()


def validate_topic_name(name: str, *, allow_system: bool = False) -> None:
    if not name:
        raise TopicError("invalid", "topic name is empty")
    if len(name.encode()) > MAX_TOPIC_NAME_BYTES:
        raise TopicError("invalid", f"topic name longer than {MAX_TOPIC_NAME_BYTES} bytes")
    if _CONTROL.search(name):
        raise TopicError("invalid", "topic name holds control characters")
    if is_system_topic(name) and not allow_system:
        raise TopicError("reserved", f"topic names starting with '__' are reserved: {name!r}")


class TopicRegistry:
    def __init__(self, metadata: MetadataStore, limits: TopicLimits | None = None) -> None:
        self.metadata = metadata
        self.limits = limits or TopicLimits()
        self._topics: dict[str, TopicInfo] = {}
        # Topics and queues the caps count: every topic but the broker's own ``__`` ones
        # (which the caps never refuse: the broker needs them to start).
        self.user_topics = 0
        self.total_queues = 0
        for name, value in metadata.items(KIND_TOPIC):
            raw = json.loads(value)
            self._topics[name] = TopicInfo(name, int(raw["queues"]), raw.get("config", {}))
            if not is_system_topic(name):
                self.user_topics += 1
                self.total_queues += self._topics[name].queues

    def apply_remote(self, name: str, value: bytes | None) -> None:
        """Make topic ``name`` what another node stored (``value``: the store's JSON, None:
        deleted), as loading it at start would; changing nothing when it already is. Counts
        for the caps follow; a known topic's :class:`TopicInfo` is updated in place."""
        previous = self._topics.get(name)
        counted = not is_system_topic(name)
        if value is None:
            if previous is not None:
                del self._topics[name]
                if counted:
                    self.user_topics -= 1
                    self.total_queues -= previous.queues
            return
        raw = json.loads(value)
        queues, config = int(raw["queues"]), raw.get("config", {})
        if previous is None:
            self._topics[name] = TopicInfo(name, queues, config)
            if counted:
                self.user_topics += 1
                self.total_queues += queues
            return
        if counted:
            self.total_queues += queues - previous.queues
        previous.queues = queues
        previous.config = config

    def check_new_queues(self, name: str, queues: int, added: int) -> None:
        """Raise :class:`TopicError` when topic ``name`` may not have ``queues`` queues, of
        which ``added`` are new (see :class:`TopicLimits`)."""
        limits = self.limits
        if queues > limits.max_partitions_per_topic:
            raise TopicError(
                "invalid_partitions",
                f"{queues} partitions for topic {name!r}: at most "
                f"{limits.max_partitions_per_topic} (max_partitions_per_topic)",
            )
        if self.total_queues + added > limits.max_partitions:
            raise TopicError(
                "policy_violation",
                f"{added} more partitions would make {self.total_queues + added} in all: at "
                f"most {limits.max_partitions} (max_partitions)",
            )

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def __len__(self) -> int:
        """Topics but the system ones (what ``max_topics`` counts)."""
        return self.user_topics

    def all(self, *, include_system: bool = False) -> list[TopicInfo]:
        return [
            info
            for name, info in sorted(self._topics.items())
            if include_system or not is_system_topic(name)
        ]

    async def declare(
        self,
        name: str,
        queues: int = 1,
        config: dict[str, Any] | None = None,
        *,
        allow_system: bool = False,
    ) -> tuple[TopicInfo, bool]:
        """Create the topic if missing; returns ``(info, created)``. An existing topic is
        returned unchanged (callers compare its config for AMQP's equivalence rule)."""
        existing = self._topics.get(name)
        if existing is not None:
            return existing, False
        validate_topic_name(name, allow_system=allow_system)
        if queues < 1:
            raise TopicError("invalid_partitions", "a topic needs at least one queue")
        if not is_system_topic(name):
            self.check_new_queues(name, queues, queues)
            if self.user_topics >= self.limits.max_topics:
                raise TopicError(
                    "policy_violation",
                    f"{self.user_topics} topics exist: at most {self.limits.max_topics} "
                    "(max_topics)",
                )
        info = TopicInfo(name, queues, dict(config or {}))
        # Stored first, then known here: a change the store refuses leaves nothing behind.
        await self.metadata.apply([Change(KIND_TOPIC, name, info.to_json())])
        if not is_system_topic(name):
            self.user_topics += 1
            self.total_queues += queues
        self._topics[name] = info
        return info, True

    async def update(self, info: TopicInfo) -> None:
        previous = self._topics.get(info.name)
        if not is_system_topic(info.name):
            self.user_topics += previous is None
            self.total_queues += info.queues - (previous.queues if previous is not None else 0)
        self._topics[info.name] = info
        await self.metadata.apply([Change(KIND_TOPIC, info.name, info.to_json())])

    async def add_queues(self, name: str, total: int) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise TopicError("unknown", f"no topic {name!r}")
        if total <= info.queues:
            raise TopicError(
                "invalid_partitions", f"topic {name!r} has {info.queues} queues already"
            )
        if not is_system_topic(name):
            self.check_new_queues(name, total, total - info.queues)
            self.total_queues += total - info.queues
        info.queues = total
        await self.update(info)
        return info

    async def delete(self, name: str) -> bool:
        info = self._topics.pop(name, None)
        if info is None:
            return False
        if not is_system_topic(name):
            self.user_topics -= 1
            self.total_queues -= info.queues
        await self.metadata.apply([Change(KIND_TOPIC, name, None)])
        return True
