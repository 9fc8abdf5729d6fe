"""Retention: deleting whole sealed commit-log segments past the time or size limit (Kafka's
``deleteRetentionMsBreachedSegments`` / ``deleteRetentionSizeBreachedSegments``), oldest first,
never a segment that still holds a record owed to someone.

A segment is past ``retention_ms`` when the next segment's first record is older than the limit
(so every record of it is), and the log is past ``retention_bytes`` when its segments take more.
Registered retention guards (ack groups, timers, open transactions, durable tables) veto
deleting a segment that holds a record they still owe. After a deletion each queue's start moves
past the entries whose segment is gone and index files wholly before it are deleted.

Thread-safety: the event-loop thread of the one writer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from core.log import names
from core.log import record as rec
from core.log.commitlog import CommitLog
from core.log.config import LogConfig
from core.log.consumequeue import ConsumeQueue

log = logging.getLogger(__name__)

# Called with (segment start position, segment end position): True if a record in that range is
# still owed to a consumer, a timer or a transaction, which blocks deleting the segment.
RetentionGuard = Callable[[int, int], bool]


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
        self.guards: list[RetentionGuard] = []

    def enforce(self, now: int | None = None) -> list[int]:
        """Delete whole sealed segments past the time or size limit, oldest first, unless a
        guard says a record in one is still owed. Returns the deleted base positions."""
        now = time.time_ns() // 1_000_000 if now is None else now
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
