"""Fetch (with long polling), ListOffsets and OffsetForLeaderEpoch.

Fetch serves a partition's index entries from the fetch offset on:

- a batch record (a Kafka producer's RecordBatch) is served as stored, with two 4/8-byte
  fields outside the batch CRC set: the base offset (the entry's queue offset) and the
  partition leader epoch (``LEADER_EPOCH``, as a Kafka leader stamps it on append). No record
  is decoded; compression stays as the producer chose;
- consecutive plain records (published through AMQP or MQTT) are served as one uncompressed
  RecordBatch built with ``records.build_batch`` (timestamp: the publisher's, else the store
  time), base offset the first one's offset.

Limits (KIP-74): the response holds at most ``max_bytes`` and each partition at most its
``partition_max_bytes``, except that the first entry of the first partition with data is always
served whole, so a consumer can never be stuck behind a batch larger than its limits.

Long polling: when less than ``min_bytes`` is available the response waits, up to ``max_wait``,
for any of the fetched partitions to get a new entry (``BrokerAPI.wait_for_records``), then
reads again. Isolation (KIP-98): a transaction's batches are in the partition from the time they
are produced (see ``transactions``). A read_uncommitted fetch is served up to the high watermark;
a read_committed one up to the last stable offset (the first offset of the earliest open
transaction: nothing past it, non-transactional records included), with the aborted
transactions that overlap what it is served (producer id, first offset), by which the client
drops their records; control batches are served to both, and clients skip them.

Zero copy, within one call. Stored entries are read inside ``BrokerAPI.serve_stored_records``:
the entries hold views of the log's memory maps, and the whole response is encoded (each batch
copied once, from the map into the response frame: ``wire.py``) before that call returns, so no
view of the log outlives it, nor is kept across the long poll's wait.

Tag filters (``tagfilters.py``): a fetch that belongs to a consumer group with a tag filter
is served only the records that match it, at their own offsets (gaps are legal, as in a
compacted topic): entries are skipped by the index's tag mask (confirmed against the record's
tags); a Kafka batch whose tags (the union of its records') match is re-encoded with only its
matching records, same base offset and last offset delta; skipped offsets after the last
record served are covered by a batch of no records (``records.gap_batch``), so the consumer's
position, and so its committed offset, moves past them. Compressed and transactional batches
carry no tags, so a filtered group never gets them. Fetches of other groups are untouched.

Fetch sessions (KIP-227) are not kept: every response has session id 0, which tells clients to
send full fetch requests.

Leaders (``leaders.py``): a partition this node does not lead is answered
NOT_LEADER_OR_FOLLOWER by all three, and a ``current_leader_epoch`` other than the partition's
FENCED_LEADER_EPOCH (older) or UNKNOWN_LEADER_EPOCH (newer); the leader epoch answered is the
partition's (its shard's epoch; 0 on a node alone). Stored batches are still stamped with
``LEADER_EPOCH`` (0) as they are served: a consumer validating its position with
OffsetForLeaderEpoch gets the partition's epoch and the log end, which is never below it.

Internal topics (the broker's ``__`` topics, ``__consumer_offsets``) are listed by Metadata but
never read: Fetch, ListOffsets and OffsetForLeaderEpoch answer TOPIC_AUTHORIZATION_FAILED, a
Kafka broker's answer to a client without READ on the topic. They hold other clients' offsets
and sessions and the broker's own tables.

ListOffsets by timestamp searches the records' own timestamps (``timestamps``).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from functools import partial
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import (
    STORED_BATCH,
    ClientContext,
    CorruptRecordError,
    LeaderTable,
    StoredEntry,
    StoredRecordReader,
    TagFilter,
    is_system_topic,
    stored_body,
    stored_flags,
    stored_tags,
    tags_from_headers,
)
from gateway.kafka.access import allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import (
    LEADER_EPOCH,
    Connection,
    Handler,
    KafkaContext,
    ResponseBody,
    ms,
)
from gateway.kafka.entities import build_response
from gateway.kafka.errors import RecordBatchError
from gateway.kafka.leaders import leader_error
from gateway.kafka.records import Headers, RecordInput, build_batch, filter_batch, gap_batch
from gateway.kafka.tagfilters import GroupTagFilters, active_tag_filters
from gateway.kafka.timestamps import Found, max_timestamp, offset_for_timestamp
from gateway.kafka.wire import FetchPartition, encode_fetch_response

# Request isolation levels (IsolationLevel.java).
READ_UNCOMMITTED: Final = 0
READ_COMMITTED: Final = 1
# ListOffsets special timestamps (ListOffsetsRequest.java).
LATEST_TIMESTAMP: Final = -1
EARLIEST_TIMESTAMP: Final = -2
MAX_TIMESTAMP: Final = -3
# ListOffsetsResponse.UNKNOWN_TIMESTAMP, UNKNOWN_OFFSET; RecordBatch.NO_PARTITION_LEADER_EPOCH.
NO_TIMESTAMP: Final = -1
NO_OFFSET: Final = -1
NO_LEADER_EPOCH: Final = -1
_OK: Final = ErrorCode.none
log = logging.getLogger(__name__)

# A read counts records, a batch as all of its records: bytes are the real limit here.
_NO_RECORD_LIMIT: Final = 2**62
# base_offset int64 + batch_length int32 + partition_leader_epoch int32 (records.py layout)
_OFFSET_LENGTH_EPOCH = struct.Struct(">qii")
_LENGTH_OFFSET: Final = 8
_AFTER_EPOCH: Final = 16
# A filtered fetch reads the index in chunks of this many records, and looks at this many
# entries at most (then serves what it has, a gap batch up to where it stopped included).
_FILTERED_CHUNK_RECORDS: Final = 4096
_MAX_FILTERED_SCAN: Final = 65_536


def _batch_bytes(entry: StoredEntry, parts: list[Any]) -> int:
    """Append a stored batch's parts with its base offset and leader epoch set; its size."""
    body = stored_body(entry)
    (length,) = struct.unpack_from(">i", body, _LENGTH_OFFSET)
    parts.append(_OFFSET_LENGTH_EPOCH.pack(entry.offset, length, LEADER_EPOCH))
    parts.append(body[_AFTER_EPOCH:])
    return len(body)


def _plain_batch(entries: list[StoredEntry]) -> bytes:
    """Records published by another protocol, as one RecordBatch at their offsets."""
    records: list[RecordInput] = []
    for entry in entries:
        record = entry.record()
        records.append(
            (
                record.born_ms or record.store_ms,
                # No key: the subject (AMQP routing key, MQTT levels after the first) is the key.
                record.key if record.key or not record.subject else record.subject.encode(),
                record.body,
                [(name, value) for name, value in record.headers],
            )
        )
    batch = bytearray(build_batch(records, base_offset=entries[0].offset))
    struct.pack_into(">i", batch, 12, LEADER_EPOCH)
    return bytes(batch)


def read_records(
    entries: list[StoredEntry], tag_filter: TagFilter | None = None
) -> tuple[list[Any], int]:
    """The record set of a partition's entries (see the module docstring), as parts to join
    (views of the log's memory map among them: joined into the response before
    ``serve_stored_records`` returns), and its size.
    With ``tag_filter`` (entries that match it), batches keep only their matching records."""
    parts: list[Any] = []
    plain: list[StoredEntry] = []
    size = 0
    for entry in entries:
        if stored_flags(entry) & STORED_BATCH:
            if plain:
                built = _plain_batch(plain)
                parts.append(built)
                size += len(built)
                plain = []
            if tag_filter is None:
                size += _batch_bytes(entry, parts)
            else:
                size += _filtered_batch_bytes(entry, tag_filter, parts)
        else:
            if plain and plain[-1].next_offset != entry.offset:
                built = _plain_batch(plain)
                parts.append(built)
                size += len(built)
                plain = []
            plain.append(entry)
    if plain:
        built = _plain_batch(plain)
        parts.append(built)
        size += len(built)
    return parts, size


def read_filtered(
    reader: StoredRecordReader,
    topic: str,
    partition: int,
    offset: int,
    end: int,
    limit: int,
    tag_filter: TagFilter,
) -> tuple[list[Any], int]:
    """The record set of a partition for a group with ``tag_filter`` (see the module
    docstring), at most ``limit`` bytes of matching entries (at least one entry)."""
    masks = tag_filter.masks
    kept: list[StoredEntry] = []
    kept_bytes = 0
    position = offset  # the first offset not looked at yet
    scanned = 0
    full = False
    while not full and position < end and scanned < _MAX_FILTERED_SCAN:
        entries = reader.read(topic, partition, position, max_records=_FILTERED_CHUNK_RECORDS)
        if not entries:
            break
        for entry in entries:
            next_offset = entry.next_offset
            if next_offset <= position:
                continue
            scanned += 1
            entry_mask = entry.tag_mask
            for mask in masks:
                if entry_mask & mask == mask:
                    if tag_filter.matches(stored_tags(entry)):
                        if kept and kept_bytes + entry.size > limit:
                            full = True
                        else:
                            kept.append(entry)
                            kept_bytes += entry.size
                    break
            if full:
                break
            position = next_offset
    parts, size = read_records(kept, tag_filter) if kept else ([], 0)
    served_to = kept[-1].next_offset if kept else offset
    if position > served_to:
        gap = gap_batch(served_to, position - served_to, epoch=LEADER_EPOCH)
        parts.append(gap)
        size += len(gap)
    return parts, size


def _filtered_batch_bytes(entry: StoredEntry, tag_filter: TagFilter, parts: list[Any]) -> int:
    """A stored batch whose tags match: only its matching records (as stored when all do)."""

    def keep(headers: Headers) -> bool:
        return tag_filter.matches(
            tags_from_headers([(name, value) for name, value in headers if value is not None])
        )

    body = stored_body(entry)
    try:
        filtered = filter_batch(body, keep, base_offset=entry.offset, epoch=LEADER_EPOCH)
    except RecordBatchError:
        filtered = None  # not decodable here: served as stored, as to any consumer
    if filtered is None:
        return _batch_bytes(entry, parts)
    parts.append(filtered)
    return len(filtered)


class _Partition:
    __slots__ = ("fetch_offset", "leader_error", "max_bytes", "partition", "topic")

    def __init__(
        self,
        topic: str,
        partition: int,
        fetch_offset: int,
        max_bytes: int,
        leader_error: ErrorCode = _OK,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.fetch_offset = fetch_offset
        self.max_bytes = max_bytes
        # Not led here, or another leader epoch (decided once, when the request came).
        self.leader_error = leader_error


def _leader_errors(context: KafkaContext, client: ClientContext) -> tuple[LeaderTable, int] | None:
    """The partition leaders and this node, or None for a node alone (it leads them all)."""
    table = context.api.leader_table(client)
    return None if table is None else (table, context.api.this_node())


def _read(
    context: KafkaContext,
    reader: StoredRecordReader,
    plan: list[tuple[str, list[_Partition]]],
    max_bytes: int,
    isolation: int,
    connection: Connection,
) -> tuple[list[tuple[str, list[FetchPartition]]], int, bool]:
    """One pass over the fetched partitions: (topic responses, bytes, any partition error).
    The record parts hold views of the log: encode them before ``reader``'s call returns."""
    api = context.api
    # Some consumer group has a tag filter: is this fetch one of its members'?
    filters: GroupTagFilters | None = active_tag_filters(api)
    client = connection.client
    committed_only = isolation == READ_COMMITTED
    topics = []
    total = 0
    errors = False
    for topic, partitions in plan:
        # The broker's own records (other groups' offsets, sessions, its tables) are no
        # client's to read, nor is a topic the principal may not read: Kafka's answer to a
        # client without READ on a topic.
        refused = is_system_topic(topic) or not allowed(context, connection, "kafka Fetch", topic)
        info = None if refused else api.topic_info(client, topic)
        results = []
        for wanted in partitions:
            partition = wanted.partition
            error = ErrorCode.none
            records: list[Any] = []
            size = 0
            start = end = stable = -1
            aborted: list[tuple[int, int]] | None = [] if committed_only else None
            if refused:
                error = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= partition < info.queues:
                error = ErrorCode.unknown_topic_or_partition
            elif wanted.leader_error != _OK:
                error = wanted.leader_error
            else:
                start, end = reader.partition_offsets(topic, partition)
                stable = api.last_stable_offset(client, topic, partition)
                # What this fetch may be served up to (excluded).
                upper = stable if committed_only else end
                offset = wanted.fetch_offset
                if offset < start or offset > end:
                    error = ErrorCode.offset_out_of_range
                elif offset < upper and (total == 0 or total < max_bytes):
                    limit = min(wanted.max_bytes, max_bytes - total) if total else wanted.max_bytes
                    tag_filter = (
                        filters.filter_for(connection, topic, partition)
                        if filters is not None
                        else None
                    )
                    try:
                        if tag_filter is not None:
                            records, size = read_filtered(
                                reader, topic, partition, offset, upper, limit, tag_filter
                            )
                            total += size
                            entries = []
                        else:
                            entries = reader.read(
                                topic,
                                partition,
                                offset,
                                max_records=_NO_RECORD_LIMIT,
                                max_bytes=limit,
                            )
                    except CorruptRecordError as damage:
                        # Issue 21 item 6: the records before the damage were served by the
                        # fetches before this one; from it on, this partition answers
                        # CORRUPT_MESSAGE (Kafka's answer for a batch failing its CRC) and the
                        # connection and the other partitions go on.
                        log.error(
                            "kafka: fetch %s/%d at offset %d: %s", topic, partition, offset, damage
                        )
                        error = ErrorCode.corrupt_message
                        entries = []
                    if tag_filter is None:
                        if committed_only:
                            entries = [entry for entry in entries if entry.offset < upper]
                        if entries:
                            records, size = read_records(entries)
                            total += size
                            if committed_only:
                                aborted = api.aborted_transactions(
                                    client, topic, partition, offset, entries[-1].next_offset
                                )
            if error != ErrorCode.none:
                errors = True
            results.append(
                FetchPartition(partition, error, end, stable, start, aborted, records, size)
            )
        topics.append((topic, results))
    return topics, total, errors


async def handle_fetch(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    body: Any = request.body
    version = request.api_version
    max_wait_ms = ms(body.max_wait)
    min_bytes = body.min_bytes
    max_bytes = body.max_bytes
    isolation = getattr(body, "isolation_level", READ_UNCOMMITTED)
    session_id = getattr(body, "session_id", 0)
    if session_id != 0:
        # We never hand out a fetch session, so a client cannot have one (KIP-227).
        return encode_fetch_response(
            version, request.correlation_id, [], error_code=ErrorCode.fetch_session_id_not_found
        )
    if any(is_system_topic(topic.topic) for topic in body.topics):
        log.info("kafka: %s fetched from an internal topic: refused", connection.peer)
    api = context.api
    client = connection.client
    leaders = _leader_errors(context, client)
    if leaders is None:
        plan = [
            (
                topic.topic,
                [
                    _Partition(topic.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                    for p in topic.partitions
                ],
            )
            for topic in body.topics
        ]
    else:
        table, this_node = leaders
        plan = [
            (
                topic.topic,
                [
                    _Partition(
                        topic.topic,
                        p.partition,
                        p.fetch_offset,
                        p.partition_max_bytes,
                        leader_error(
                            table[topic.topic, p.partition],
                            this_node,
                            getattr(p, "current_leader_epoch", NO_LEADER_EPOCH),
                        ),
                    )
                    for p in topic.partitions
                ],
            )
            for topic in body.topics
        ]
    total = 0

    def respond(reader: StoredRecordReader, wait_for_more: bool) -> bytes | None:
        """The response, encoded while the entries' views are valid; None: less than
        ``min_bytes`` is there and the fetch may wait for more."""
        nonlocal total
        topics, total, errors = _read(context, reader, plan, max_bytes, isolation, connection)
        if wait_for_more and total < min_bytes and not errors:
            return None
        return encode_fetch_response(
            version, request.correlation_id, topics, throttle_time_ms=context.throttle_ms()
        )

    response = api.serve_stored_records(client, partial(respond, wait_for_more=max_wait_ms > 0))
    if response is None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max_wait_ms / 1000
        keys = [(p.topic, p.partition) for _, partitions in plan for p in partitions]
        # The rest runs in a task of its own (the transport starts handlers eagerly).
        await asyncio.sleep(0)
        while response is None:
            remaining = deadline - loop.time()
            more = remaining > 0 and await api.wait_for_records(client, keys, remaining)
            # After the wait: whatever is there once it timed out.
            response = api.serve_stored_records(client, partial(respond, wait_for_more=more))
    context.metrics["fetched_bytes"] += total
    return response


async def handle_list_offsets(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    """Earliest (-2), latest (-1), the largest timestamp (-3, KIP-734) or the first offset
    whose record's timestamp is >= a time (``timestamps``); nothing found: offset -1,
    timestamp -1, leader epoch -1, as Kafka answers."""
    api = context.api
    client = connection.client
    topics = []
    body: Any = request.body
    leaders = _leader_errors(context, client)
    for topic in body.topics:
        name = topic.name
        # Without DESCRIBE on the topic: TOPIC_AUTHORIZATION_FAILED, as for internal topics.
        internal = is_system_topic(name) or not allowed(
            context, connection, "kafka ListOffsets", name
        )
        info = None if internal else api.topic_info(client, name)
        results = []
        for wanted in topic.partitions:
            partition = wanted.partition_index
            result: dict[str, Any] = {
                "partition_index": partition,
                "error_code": ErrorCode.none,
                "timestamp": NO_TIMESTAMP,
                "offset": NO_OFFSET,
                "leader_epoch": LEADER_EPOCH,
            }
            results.append(result)
            if internal or info is None or not 0 <= partition < info.queues:
                result["error_code"] = (
                    ErrorCode.topic_authorization_failed
                    if internal
                    else ErrorCode.unknown_topic_or_partition
                )
                result["leader_epoch"] = NO_LEADER_EPOCH
                continue
            if leaders is not None:
                table, this_node = leaders
                leader = table[name, partition]
                error = leader_error(
                    leader,
                    this_node,
                    getattr(wanted, "current_leader_epoch", NO_LEADER_EPOCH),
                )
                if error != _OK or leader is None:
                    result["error_code"] = error
                    result["leader_epoch"] = NO_LEADER_EPOCH
                    continue
                result["leader_epoch"] = leader.epoch
            start, end = api.partition_offsets(client, name, partition)
            timestamp = wanted.timestamp
            found: Found | None = None
            if timestamp == LATEST_TIMESTAMP:
                # read_committed: the last stable offset (Kafka's ListOffsets, KIP-98).
                committed_only = getattr(body, "isolation_level", READ_UNCOMMITTED)
                result["offset"] = (
                    api.last_stable_offset(client, name, partition)
                    if committed_only == READ_COMMITTED
                    else end
                )
            elif timestamp == EARLIEST_TIMESTAMP:
                result["offset"] = start
            elif timestamp == MAX_TIMESTAMP:
                found = await max_timestamp(api, client, name, partition, start=start, end=end)
            elif timestamp >= 0:
                found = await offset_for_timestamp(
                    api, client, name, partition, timestamp, start=start, end=end
                )
            else:
                result["error_code"] = ErrorCode.invalid_request
                result["leader_epoch"] = NO_LEADER_EPOCH
                continue
            if found is not None:
                result["offset"], result["timestamp"] = found
            elif timestamp >= 0 or timestamp == MAX_TIMESTAMP:
                result["leader_epoch"] = NO_LEADER_EPOCH
        topics.append({"name": name, "partitions": results})
    if any(is_system_topic(topic.name) for topic in body.topics):
        log.info("kafka: %s asked ListOffsets of an internal topic: refused", connection.peer)
    return build_response(
        ApiKey.LIST_OFFSETS, request.api_version, {"throttle_time": 0, "topics": topics}
    )


async def handle_offset_for_leader_epoch(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody:
    """One leader epoch per owner: the partition's (``LEADER_EPOCH``, 0, on a node alone), and
    it ends at the log end offset (KIP-101), whatever epoch was asked for."""
    api = context.api
    client = connection.client
    topics = []
    body: Any = request.body
    leaders = _leader_errors(context, client)
    for topic in body.topics:
        name = topic.topic
        # Without DESCRIBE on the topic: TOPIC_AUTHORIZATION_FAILED, as for internal topics.
        internal = is_system_topic(name) or not allowed(
            context, connection, "kafka ListOffsets", name
        )
        info = None if internal else api.topic_info(client, name)
        results = []
        for wanted in topic.partitions:
            partition = wanted.partition
            if internal or info is None or not 0 <= partition < info.queues:
                results.append(
                    {
                        "error_code": (
                            ErrorCode.topic_authorization_failed
                            if internal
                            else ErrorCode.unknown_topic_or_partition
                        ),
                        "partition": partition,
                        "leader_epoch": -1,
                        "end_offset": -1,
                    }
                )
                continue
            epoch = LEADER_EPOCH
            if leaders is not None:
                table, this_node = leaders
                leader = table[name, partition]
                error = leader_error(
                    leader,
                    this_node,
                    getattr(wanted, "current_leader_epoch", NO_LEADER_EPOCH),
                )
                if error != _OK or leader is None:
                    results.append(
                        {
                            "error_code": error,
                            "partition": partition,
                            "leader_epoch": NO_LEADER_EPOCH,
                            "end_offset": NO_OFFSET,
                        }
                    )
                    continue
                epoch = leader.epoch
            _, end = api.partition_offsets(client, name, partition)
            results.append(
                {
                    "error_code": ErrorCode.none,
                    "partition": partition,
                    "leader_epoch": epoch,
                    "end_offset": end,
                }
            )
        topics.append({"topic": name, "partitions": results})
    return build_response(
        ApiKey.OFFSET_FOR_LEADER_EPOCH,
        request.api_version,
        {"throttle_time": 0, "topics": topics},
    )


HANDLERS: dict[int, Handler] = {
    ApiKey.FETCH: handle_fetch,
    ApiKey.LIST_OFFSETS: handle_list_offsets,
    ApiKey.OFFSET_FOR_LEADER_EPOCH: handle_offset_for_leader_epoch,
}
