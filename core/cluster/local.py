"""LocalMetadata: the single node's :class:`~core.cluster.metadata.MetadataStore`, over the
DurableTables of its own log (docs/cluster.md section 4, step 1 of section 15).

On disk nothing changed from before the interface existed: every kind is a key prefix in one of
three system topics (each a :class:`~core.state.table.DurableTable`: one record per change, key =
prefix + key, body = value, a null body deletes; replayed and compacted by snapshots):

  ``__meta``      ``topic:<name>``, ``binding:<json identity>``, ``ackq:<topic>\\0<queue>``,
                  ``redrive:<dead-letter queue>``, and any other key: kind ``setting``
  ``__security``  every key (JSON arrays, core/security/store.py): kind ``security``
  ``__limits``    every key (``["user"|"vhost", name]``): kind ``limit``

Versions count the :meth:`LocalMetadata.apply` calls since the store was opened (nothing else
shares this metadata, so no version is persisted); :meth:`LocalMetadata.watch` replays the last
:data:`~core.cluster.metadata.WATCH_BACKLOG` changes (``ChangeBacklog``).
An apply of several changes is atomic for every other caller (one thread applies it without
yielding); a crash in the middle of one can keep a prefix of its records, as the separate writes
before this interface could.

One instance per log store: two DurableTables over one topic would each compact the topic with
their own view, so a second ``LocalMetadata`` on the same store is refused. Not thread-safe: the
event loop's thread, like the log store.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Final

from core.cluster.metadata import (
    KIND_BINDING,
    KIND_LIMIT,
    KIND_QUEUE,
    KIND_REDRIVE,
    KIND_SECURITY,
    KIND_SETTING,
    KIND_TOPIC,
    Change,
    ChangeBacklog,
    Expectation,
    MetadataConflict,
    Versioned,
)
from core.log import LogStore
from core.log.names import META_TOPIC
from core.state.table import DurableTable

SECURITY_TOPIC: Final = "__security"  # a system topic ("__": reserved, core/log/names.py)
LIMITS_TOPIC: Final = "__limits"  # a system topic ("__": reserved, core/log/names.py)


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a kind's entries are on disk: a table and the prefix of their keys there."""

    topic: str
    prefix: str


_LAYOUT: Final[dict[str, _Place]] = {
    KIND_TOPIC: _Place(META_TOPIC, "topic:"),
    KIND_BINDING: _Place(META_TOPIC, "binding:"),
    KIND_QUEUE: _Place(META_TOPIC, "ackq:"),
    KIND_REDRIVE: _Place(META_TOPIC, "redrive:"),
    KIND_SETTING: _Place(META_TOPIC, ""),  # what no other __meta prefix claims
    KIND_SECURITY: _Place(SECURITY_TOPIC, ""),
    KIND_LIMIT: _Place(LIMITS_TOPIC, ""),
}


def _kind_of(topic: str, table_key: str) -> str:
    """The kind a table key belongs to (the longest prefix of its table that matches)."""
    found, length = "", -1
    for kind, place in _LAYOUT.items():
        prefix = place.prefix
        if place.topic == topic and table_key.startswith(prefix) and len(prefix) > length:
            found, length = kind, len(prefix)
    return found


class LocalMetadata:
    def __init__(self, store: LogStore) -> None:
        for guard in store.retention_guards:
            if isinstance(getattr(guard, "__self__", None), LocalMetadata):
                raise ValueError("this log store has its LocalMetadata already: share that one")
        self.store = store
        self._tables = {
            topic: DurableTable(store, topic)
            for topic in dict.fromkeys(place.topic for place in _LAYOUT.values())
        }
        self._changes = ChangeBacklog()
        self._end = 0
        store.retention_guards.append(self._segment_is_owed)

    # -- reading ---------------------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._changes.version

    @property
    def durable_mark(self) -> int:
        """The log position after the last change (a Broker API durable mark, for
        ``when_durable``: waiting for it makes every change so far durable)."""
        return self._end

    def _place(self, kind: str) -> _Place:
        place = _LAYOUT.get(kind)
        if place is None:
            raise ValueError(f"unknown metadata kind {kind!r}")
        return place

    def get(self, kind: str, key: str) -> bytes | None:
        place = self._place(kind)
        table_key = place.prefix + key
        if _kind_of(place.topic, table_key) != kind:
            return None  # e.g. a setting named "topic:x" is a topic's entry, not a setting
        return self._tables[place.topic].get(table_key)

    def items(self, kind: str) -> Iterator[tuple[str, bytes]]:
        place = self._place(kind)
        cut = len(place.prefix)
        return iter(
            [
                (table_key[cut:], value)
                for table_key, value in self._tables[place.topic].items()
                if table_key.startswith(place.prefix) and _kind_of(place.topic, table_key) == kind
            ]
        )

    # -- changes ---------------------------------------------------------------------------

    async def apply(self, changes: Sequence[Change], *, expect: Expectation | None = None) -> int:
        # No await: done when the coroutine first runs (a caller running it eagerly never
        # suspends; see the MetadataStore's apply).
        return self.apply_now(changes, expect=expect)

    def apply_now(self, changes: Sequence[Change], *, expect: Expectation | None = None) -> int:
        """:meth:`apply` as a plain call: for shard state kept here (redrive intents), which
        stays in its shard's own log in a cluster too, and for the callers that must finish
        a change in the same step (no awaiting in between)."""
        for change in changes:
            self._place(change.kind)  # refuse an unknown kind before writing anything
        for (kind, key), wanted in (expect or {}).items():
            if self.get(kind, key) != wanted:
                raise MetadataConflict(kind, key)
        applied: list[Change] = []
        for change in changes:
            place = _LAYOUT[change.kind]
            table = self._tables[place.topic]
            table_key = place.prefix + change.key
            if change.value is None:
                deleted = table.delete(table_key)
                if deleted is None:
                    continue  # absent already: nothing to record
                self._end = deleted.end
            else:
                self._end = table.put(table_key, change.value).end
            applied.append(change)
        return self._changes.record(applied)

    async def wait_durable(self, version: int) -> None:
        # Log positions grow with versions, so the last change's end covers ``version``.
        if version > 0:
            await self.store.wait_durable(self._end)

    def watch(self, from_version: int) -> AsyncIterator[Versioned]:
        return self._changes.watch(from_version)

    # -- retention -------------------------------------------------------------------------

    def _segment_is_owed(self, start: int, end: int) -> bool:
        """Retention guard: a segment holding a record a table's replay needs is kept (after
        each table compacts, which rewrites its live keys at the log's end)."""
        owed = False
        for table in self._tables.values():
            owed |= table.needs_segment_before(end)
        return owed
