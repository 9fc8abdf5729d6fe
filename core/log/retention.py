"""Retention: deleting whole sealed commit-log segments past the time or size limit (Kafka's
``deleteRetentionMsBreachedSegments`` / ``deleteRetentionSizeBreachedSegments``), oldest first,
never a segment that still holds a record owed to someone.

A segment is past ``retention_ms`` when the next segment's first record is older than the limit
(so every record of it is), and the log is past ``retention_bytes`` when its segments take more.
Registered retention guards (ack groups, timers, open transactions, durable tables) veto
deleting a segment that holds a record they still owe. After a deletion each queue's start moves
past the entries whose segment is gone and index files wholly before it are deleted.

A topic with limits of its own (Kafka's ``retention.ms`` / ``retention.bytes`` topic configs,
``topic_limits``) is kept by them instead: each enforcement first moves the start of each of its
queues past the entries older than its ``retention.ms`` and past the oldest entries beyond its
``retention.bytes`` (entry by entry, where Kafka deletes whole segments), and a guard keeps every
segment that holds one of its live entries. Segments are shared by all topics, so the space comes
back only once no topic holds a live entry in a segment.

Thread-safety: the event-loop thread of the one writer.
"""

from __future__ import annotations

import logging
import sys
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from core.log import names
from core.log import record as rec
from core.log.commitlog import CommitLog
from core.log.config import LogConfig
from core.log.consumequeue import ENTRY_SIZE, ConsumeQueue

log = logging.getLogger(__name__)

# Called with (segment start position, segment end position): True if a record in that range is
# still owed to a consumer, a timer or a transaction, which blocks deleting the segment.
RetentionGuard = Callable[[int, int], bool]
# An index entry as 32-bit words: its frame size is word 2 (consumequeue's ENTRY layout).
_WORDS_PER_ENTRY = ENTRY_SIZE // 4
_SIZE_WORD = 2


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """A topic's own retention (None: no limit of that kind, Kafka's -1)."""

    retention_ms: int | None
    retention_bytes: int | None


def no_topic_limits() -> Mapping[str, TopicLimits]:
    return {}


def stored_bytes(index: ConsumeQueue, first: int, last: int) -> int:
    """The commit-log bytes of entries ``first`` up to ``last`` (their frame sizes), summed in
    C over each index file's entries seen as 32-bit words, with no Python step per entry."""
    total = 0
    number = first
    while number < last:
        file_number, slot = divmod(number, index.entries_per_file)
        count = min(last - number, index.entries_per_file - slot)
        words = array("I")
        words.frombytes(
            index.file_buf(file_number)[slot * ENTRY_SIZE : (slot + count) * ENTRY_SIZE]
        )
        if sys.byteorder != "little":
            words.byteswap()  # entries are little-endian
        total += sum(words[_SIZE_WORD::_WORDS_PER_ENTRY])
        number += count
    return total


class Retention:
    """Enforces ``config``'s limits on ``commitlog``; ``skip_deleted_head`` moves a queue's
    start past entries of deleted segments. ``segments_deleted`` counts what it deleted."""

    def __init__(
        self,
        config: LogConfig,
        commitlog: CommitLog,
        queues: dict[tuple[str, int], ConsumeQueue],
        skip_deleted_head: Callable[[ConsumeQueue], None],
    ) -> None:
        self.config = config
        self.commitlog = commitlog
        self.queues = queues
        self._skip_deleted_head = skip_deleted_head
        self.segments_deleted = 0
        self.guards: list[RetentionGuard] = [self._held_by_topic_limits]
        # The topics with limits of their own, asked at each enforcement (set by the broker's
        # API from its topic configs, so a deleted topic's limits go with it).
        self.topic_limits: Callable[[], Mapping[str, TopicLimits]] = no_topic_limits
        self.entries_trimmed = 0

    def enforce(self, now: int | None = None) -> list[int]:
        """Delete whole sealed segments past the time or size limit, oldest first, unless a
        guard says a record in one is still owed. Returns the deleted base positions."""
        now = time.time_ns() // 1_000_000 if now is None else now
        self.trim_topics(now)
        deleted: list[int] = []
        commitlog = self.commitlog
        while True:
            numbers = commitlog.segment_numbers()
            active = commitlog.write_position // commitlog.segment_size
            sealed = [n for n in numbers if n < active]
            if not sealed:
                break
            oldest = sealed[0]
            total = len(numbers) * commitlog.segment_size
            too_big = (
                self.config.retention_bytes is not None and total > self.config.retention_bytes
            )
            too_old = False
            if self.config.retention_ms is not None:
                # Every record of a segment is older than the first record of the next one.
                newest = self._first_store_ms(oldest + 1)
                too_old = newest is not None and newest < now - self.config.retention_ms
            if not (too_big or too_old):
                break
            start = oldest * commitlog.segment_size
            end = start + commitlog.segment_size
            if any(guard(start, end) for guard in self.guards):
                log.info("retention: segment %d still holds owed records; kept", start)
                break
            commitlog.delete_segment(oldest)
            deleted.append(start)
            self.segments_deleted += 1
            log.info("retention: deleted segment %s", names.segment_name(start))
        if deleted:
            for index in self.queues.values():
                self._skip_deleted_head(index)
                index.delete_files_before(index.start_entry)
        return deleted

    def _first_store_ms(self, number: int) -> int | None:
        segment = self.commitlog.segments.get(number)
        if segment is None or segment.frame_size_at(0) == 0:
            return None
        header = rec.HEADER.unpack_from(segment.buf, 0)
        return int(header[5]) if header[1] == rec.RECORD_MAGIC else None

    def trim_topics(self, now: int | None = None) -> int:
        """Move the start of each queue of a topic with its own limits past the entries those
        limits no longer keep; returns how many entries that took out of reach."""
        limits = self.topic_limits()
        if not limits:
            return 0
        now = time.time_ns() // 1_000_000 if now is None else now
        trimmed = 0
        for (topic, _queue), index in self.queues.items():
            topic_limits = limits.get(topic)
            if topic_limits is None:
                continue
            self._skip_deleted_head(index)
            first = index.start_entry
            if topic_limits.retention_ms is not None:
                first = max(first, index.entry_for_time(now - topic_limits.retention_ms))
            if topic_limits.retention_bytes is not None and first < index.next_entry:
                excess = stored_bytes(index, first, index.next_entry) - topic_limits.retention_bytes
                while excess > 0 and first < index.next_entry:
                    excess -= index.entry(first).size
                    first += 1
            if first > index.start_entry:
                trimmed += first - index.start_entry
                index.start_entry = first
        if trimmed:
            self.entries_trimmed += trimmed
            log.info("retention: %d entries past their topic's retention", trimmed)
        return trimmed

    def _held_by_topic_limits(self, start: int, end: int) -> bool:
        """Guard: a topic with its own limits holds the segments its live entries are in."""
        limits = self.topic_limits()
        if not limits:
            return False
        for (topic, _queue), index in self.queues.items():
            if (
                topic in limits
                and index.start_entry < index.next_entry
                and index.entry(index.start_entry).position < end
            ):
                return True
        return False
