"""Retained messages: the last message kept per topic name, durable in the system topic
``__retained`` (a :class:`~core.state.table.DurableTable`: one record per change, replayed on
start, compacted by snapshots).

Key: the topic name. Value: opaque bytes in the publishing gateway's own layout (the MQTT
gateway's is in ``gateway/mqtt/retained.py``: QoS, expiry, origin, properties, payload); a
cleared topic is a deleted key [MQTT-3.3.1-6].

Lookups: a filter without wildcards is one dict lookup; a wildcard filter is checked against
every retained topic name (Mosquitto walks a topic tree; a device fleet keeps a few thousand
retained messages, and this runs at SUBSCRIBE only). Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

from core.log import LogStore
from core.log.names import RETAINED_TOPIC
from core.routing.mqtt_topic import LEVEL_SEPARATOR, MULTI_LEVEL, ONE_LEVEL, filter_levels_match
from core.state.table import DurableTable


class RetainedMessages:
    def __init__(self, store: LogStore) -> None:
        self.table = DurableTable(store, RETAINED_TOPIC)
        store.retention_guards.append(self._segment_is_owed)

    def __len__(self) -> int:
        return len(self.table)

    def put(self, topic: str, value: bytes | None) -> None:
        """Retain ``value`` for ``topic``; None clears the topic."""
        if value is None:
            self.table.delete(topic)
        else:
            self.table.put(topic, value)

    def get(self, topic: str) -> bytes | None:
        return self.table.get(topic)

    def matching(self, topic_filter: str) -> list[tuple[str, bytes]]:
        """``(topic name, value)`` of every retained topic a (non-shared) filter matches."""
        if ONE_LEVEL not in topic_filter and MULTI_LEVEL not in topic_filter:
            found = self.table.get(topic_filter)
            return [(topic_filter, found)] if found is not None else []
        levels = topic_filter.split(LEVEL_SEPARATOR)
        return [
            (topic, raw) for topic, raw in self.table.items() if filter_levels_match(levels, topic)
        ]

    def _segment_is_owed(self, start: int, end: int) -> bool:
        """Retention guard: the records replay needs stay (the table compacts itself first, to
        free old segments)."""
        return self.table.needs_segment_before(end)
