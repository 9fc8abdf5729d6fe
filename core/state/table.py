"""DurableTable: a key -> value map stored as records of one system topic.

Each ``put`` appends a record (key = table key, body = value; a null body deletes the key), so
the table is replayed from the log on start and Spark can read its history. To keep replay short,
the table is compacted by appending a snapshot: every live key again, then a marker record tagged
``SNAPSHOT_TAG`` whose header ``snapshot-from`` names the offset where that snapshot began. Loading
finds the newest marker through the index's tag mask (no body reads) and replays from there.

Not thread-safe: use from the event-loop thread.
"""

from __future__ import annotations

from collections.abc import Iterator

from core.log import LogStore, TagFilter
from core.log.store import Appended

SNAPSHOT_TAG = "snapshot"
SNAPSHOT_FROM_HEADER = "snapshot-from"
# Compact when the records since the last snapshot outnumber the live keys by this factor
# (and by at least MIN_RECORDS_BEFORE_COMPACTION), so replay stays O(live keys).
COMPACTION_FACTOR = 4
MIN_RECORDS_BEFORE_COMPACTION = 1024
_MARKER_KEY = b""


class DurableTable:
    def __init__(self, store: LogStore, topic: str, queue: int = 0) -> None:
        self.store = store
        self.topic = topic
        self.queue = queue
        self._values: dict[str, bytes] = {}
        self.snapshot_offset = 0
        self._records_since_snapshot = 0
        self.load()

    # -- loading ---------------------------------------------------------------------------

    def _latest_snapshot_start(self) -> int:
        index = self.store.queue_index(self.topic, self.queue)
        if index is None or index.next_entry == index.start_entry:
            return 0
        marker_filter = TagFilter([SNAPSHOT_TAG])
        entry_number = index.next_entry - 1
        while entry_number >= index.start_entry:
            entry = index.entry(entry_number)
            if marker_filter.may_match(entry.tag_mask):
                record = self.store.read_at(entry.position)
                if SNAPSHOT_TAG in record.tags:
                    for name, value in record.headers:
                        if name == SNAPSHOT_FROM_HEADER:
                            return int(value)
            entry_number -= 1
        return index.start_offset

    def load(self) -> None:
        self._values.clear()
        start = self._latest_snapshot_start()
        self.snapshot_offset = start
        replayed = 0
        offset = start
        while True:
            batch = self.store.read(self.topic, self.queue, offset, max_records=4096)
            if not batch:
                break
            for queued in batch:
                record = queued.record()
                offset = queued.next_offset
                replayed += 1
                if record.key == _MARKER_KEY or record.key is None:
                    continue
                key = record.key.decode()
                if record.body is None:
                    self._values.pop(key, None)
                else:
                    self._values[key] = record.body
        self._records_since_snapshot = replayed

    # -- access ----------------------------------------------------------------------------

    def get(self, key: str) -> bytes | None:
        return self._values.get(key)

    def items(self) -> Iterator[tuple[str, bytes]]:
        return iter(list(self._values.items()))

    def __len__(self) -> int:
        return len(self._values)

    def __contains__(self, key: str) -> bool:
        return key in self._values

    # -- changes ---------------------------------------------------------------------------

    def put(self, key: str, value: bytes) -> Appended:
        self._values[key] = value
        return self._append(key, value)

    def delete(self, key: str) -> Appended | None:
        if key not in self._values:
            return None
        del self._values[key]
        return self._append(key, None)

    def _append(self, key: str, value: bytes | None) -> Appended:
        appended = self.store.append(self.topic, self.queue, value, key=key.encode())
        self._records_since_snapshot += 1
        self._maybe_compact()
        return appended

    def _maybe_compact(self) -> None:
        threshold = max(MIN_RECORDS_BEFORE_COMPACTION, COMPACTION_FACTOR * len(self._values))
        if self._records_since_snapshot > threshold:
            self.compact()

    def compact(self) -> Appended:
        """Append every live key and a snapshot marker; replay then starts at the snapshot."""
        _, start = self.store.queue_bounds(self.topic, self.queue)
        for key, value in self._values.items():
            self.store.append(self.topic, self.queue, value, key=key.encode())
        marker = self.store.append(
            self.topic,
            self.queue,
            b"",
            key=_MARKER_KEY,
            tags=[SNAPSHOT_TAG],
            headers=[(SNAPSHOT_FROM_HEADER, str(start).encode())],
        )
        self.snapshot_offset = start
        self._records_since_snapshot = len(self._values) + 1
        return marker

    def needs_segment_before(self, end: int) -> bool:
        """Retention guard of the table's owner: whether replay still needs a record before
        commit-log position ``end`` after compacting (which rewrites the live keys at the
        log's end, so that old segments are freed)."""
        needed = self.oldest_needed_position()
        if needed is not None and needed < end:
            self.compact()
            needed = self.oldest_needed_position()
            if needed is not None and needed < end:
                return True
        return False

    def oldest_needed_position(self) -> int | None:
        """Commit-log position of the first record replay needs (for the retention guard)."""
        records = self.store.read(self.topic, self.queue, self.snapshot_offset, max_records=1)
        return records[0].position if records else None
