"""Topic definitions: a topic is a named stream of N queues (Kafka partitions; an AMQP exchange
or queue has one). Durable as records of the ``__meta`` system topic through a DurableTable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from core.errors import TopicError as TopicError  # re-exported: its importers name it here
from core.log import LogStore
from core.log.names import META_TOPIC, is_system_topic
from core.state import DurableTable

_TOPIC_KEY = "topic:"
# Kafka's limit on topic names is 249 characters; AMQP's shortstr allows 255 bytes.
MAX_TOPIC_NAME_BYTES = 255
_CONTROL = re.compile(r"[\x00-\x1f]")


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
    def __init__(self, store: LogStore) -> None:
        self.table = DurableTable(store, META_TOPIC)
        self._topics: dict[str, TopicInfo] = {}
        for key, value in self.table.items():
            if key.startswith(_TOPIC_KEY):
                raw = json.loads(value)
                name = key[len(_TOPIC_KEY) :]
                self._topics[name] = TopicInfo(name, int(raw["queues"]), raw.get("config", {}))

    def get(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def all(self, *, include_system: bool = False) -> list[TopicInfo]:
        return [
            info
            for name, info in sorted(self._topics.items())
            if include_system or not is_system_topic(name)
        ]

    def declare(
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
        info = TopicInfo(name, queues, dict(config or {}))
        self._topics[name] = info
        self.table.put(_TOPIC_KEY + name, info.to_json())
        return info, True

    def update(self, info: TopicInfo) -> None:
        self._topics[info.name] = info
        self.table.put(_TOPIC_KEY + info.name, info.to_json())

    def add_queues(self, name: str, total: int) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise TopicError("unknown", f"no topic {name!r}")
        if total <= info.queues:
            raise TopicError(
                "invalid_partitions", f"topic {name!r} has {info.queues} queues already"
            )
        info.queues = total
        self.update(info)
        return info

    def delete(self, name: str) -> bool:
        if self._topics.pop(name, None) is None:
            return False
        self.table.delete(_TOPIC_KEY + name)
        return True
