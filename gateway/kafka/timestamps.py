"""ListOffsets by timestamp: Kafka's search over the records' own timestamps.

Kafka (``UnifiedLog.fetchOffsetByTimestamp``, ``LogSegment.findOffsetByTimestamp``) answers a
target time T with the first record, in offset order, whose timestamp is >= T: it looks for
the first batch whose max timestamp is >= T and returns that batch's first record with a
timestamp >= T, as ``(timestamp, offset)``. ``MAX_TIMESTAMP`` (-3, KIP-734) answers with the
record of the largest timestamp, the first one to have it. A record at or past the high
watermark is never an answer; nothing found is offset -1, timestamp -1.

The timestamps are the records' (CreateTime, as the producer set them), not the broker's
store time: a Kafka batch's max timestamp is read from its stored header, and only the one
batch that holds the answer is decoded; a record published through AMQP or MQTT has its
publisher's time, else its store time (``stored_time``), as a Fetch serves it.

Kafka keeps a time index (the max timestamp so far per 4 KiB of log) to start near the
answer; this searches the partition's entries from its start, one index entry per stored
batch, about ``SCAN_CHUNK_RECORDS`` records per call into the log, letting the event loop run
between chunks. A partition of a million one-record entries (AMQP or MQTT traffic) takes
seconds.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from typing import Final

from core.api import (
    STORED_BATCH,
    BrokerAPI,
    ClientContext,
    StoredEntry,
    StoredRecordReader,
    stored_body,
    stored_flags,
    stored_time,
)
from gateway.kafka.errors import RecordBatchError
from gateway.kafka.records import ATTR_LOG_APPEND_TIME, iter_records

# Records looked at per call into the log (a read counts a batch as all of its records, and
# returns one entry at least): the event loop runs other connections in between.
SCAN_CHUNK_RECORDS: Final = 65_536
# attributes (int16) and max_timestamp (int64) of a RecordBatch header (records.py layout).
_ATTRIBUTES = struct.Struct(">h")
_ATTRIBUTES_OFFSET: Final = struct.calcsize(">qiibI")  # 21
_MAX_TIMESTAMP = struct.Struct(">q")
_MAX_TIMESTAMP_OFFSET: Final = struct.calcsize(">qiibIhiq")  # 35

# (offset, timestamp) of a record.
Found = tuple[int, int]


def entry_max_timestamp(entry: StoredEntry) -> int:
    """The largest timestamp among the entry's records (a batch's header says it)."""
    if stored_flags(entry) & STORED_BATCH:
        maximum: int = _MAX_TIMESTAMP.unpack_from(stored_body(entry), _MAX_TIMESTAMP_OFFSET)[0]
        return maximum
    return stored_time(entry)


def record_timestamps(entry: StoredEntry) -> Iterator[Found]:
    """``(offset, timestamp)`` of each record of the entry, in offset order."""
    if not stored_flags(entry) & STORED_BATCH:
        yield entry.offset, stored_time(entry)
        return
    body = stored_body(entry)
    (attributes,) = _ATTRIBUTES.unpack_from(body, _ATTRIBUTES_OFFSET)
    if attributes & ATTR_LOG_APPEND_TIME:
        # Every record of a LogAppendTime batch has the batch's max timestamp.
        (maximum,) = _MAX_TIMESTAMP.unpack_from(body, _MAX_TIMESTAMP_OFFSET)
        for delta in range(entry.record_count):
            yield entry.offset + delta, maximum
        return
    for record in iter_records(body):
        yield entry.offset + record.offset_delta, record.timestamp


def _first_at_or_after(entry: StoredEntry, target: int, start: int, end: int) -> Found | None:
    try:
        for offset, timestamp in record_timestamps(entry):
            if start <= offset < end and timestamp >= target:
                return offset, timestamp
    except RecordBatchError:
        # Not decodable here (a consumer would fail on it too): the batch's first offset and
        # its max timestamp, what Kafka answered before it looked inside batches.
        return max(entry.offset, start), entry_max_timestamp(entry)
    return None


def _first_with(entry: StoredEntry, wanted: int, start: int, end: int) -> Found:
    try:
        for offset, timestamp in record_timestamps(entry):
            if start <= offset < end and timestamp == wanted:
                return offset, timestamp
    except RecordBatchError:
        pass
    return max(entry.offset, start), wanted


async def offset_for_timestamp(
    api: BrokerAPI,
    client: ClientContext,
    topic: str,
    partition: int,
    target: int,
    *,
    start: int,
    end: int,
) -> Found | None:
    """The first record of ``[start, end)`` whose timestamp is >= ``target``; None if none."""
    position = start
    while position < end:

        def scan(reader: StoredRecordReader, position: int = position) -> Found | int | None:
            """The answer, or the offset to go on from, or None at the end of the entries."""
            entries = reader.read(topic, partition, position, max_records=SCAN_CHUNK_RECORDS)
            for entry in entries:
                if entry.next_offset > position and entry_max_timestamp(entry) >= target:
                    found = _first_at_or_after(entry, target, start, end)
                    if found is not None:
                        return found
                position = max(position, entry.next_offset)
            return position if entries else None

        step = api.serve_stored_records(client, scan)
        if step is None or isinstance(step, tuple):
            return step
        position = step
        await asyncio.sleep(0)
    return None


async def max_timestamp(
    api: BrokerAPI, client: ClientContext, topic: str, partition: int, *, start: int, end: int
) -> Found | None:
    """The first record of ``[start, end)`` with the largest timestamp; None if empty."""
    best_timestamp = -1
    best_offset = -1  # the first offset of the entry that holds it
    position = start
    while position < end:

        def scan(reader: StoredRecordReader, position: int = position) -> int | None:
            nonlocal best_timestamp, best_offset
            entries = reader.read(topic, partition, position, max_records=SCAN_CHUNK_RECORDS)
            for entry in entries:
                if entry.next_offset > position and entry.offset < end:
                    timestamp = entry_max_timestamp(entry)
                    if timestamp > best_timestamp:
                        best_timestamp, best_offset = timestamp, entry.offset
                position = max(position, entry.next_offset)
            return position if entries else None

        step = api.serve_stored_records(client, scan)
        if step is None:
            break
        position = step
        await asyncio.sleep(0)
    if best_offset < 0:
        return None

    def exact(reader: StoredRecordReader) -> Found:
        entry = reader.read(topic, partition, best_offset, max_records=1)[0]
        return _first_with(entry, best_timestamp, start, end)

    return api.serve_stored_records(client, exact)
