"""Produce: each partition's RecordBatch stored as ONE batch record, never re-encoded.

Per partition (``ProduceRequest.validateRecords`` and ``LogValidator`` order): the topic must
not be one of the broker's internal ``__`` topics (INVALID_TOPIC_EXCEPTION, "Cannot append to
internal topic", as Kafka answers for ``__consumer_offsets``), the topic and partition must
exist (UNKNOWN_TOPIC_OR_PARTITION; topics are created by Metadata, not here), this node must
lead the partition (NOT_LEADER_OR_FOLLOWER, with KIP-951's current leader and its endpoint
from v10, ``leaders.py``; produce is never forwarded to the leader: the client goes there),
the batch must be one valid magic-2 batch (its CRC-32C is checked, then every record is
decoded: CORRUPT_MESSAGE for records that do not, MESSAGE_TOO_LARGE for a batch inflating past
``max_inflated_batch_bytes``; compression is kept as sent), an idempotent batch must be in
sequence or a duplicate (``producers``), and a transactional one must belong to its producer's
open transaction (``transactions``). The batch is then stored with ``BrokerAPI.produce_batch``,
which returns the durability handle (a ``Publication``); a transactional batch as a half message
of its transaction.

acks (``ProduceRequest.acks``):

- ``0``: stored, no response at all;
- ``1``: answered once appended (in the page cache: a process crash does not lose it, the log
  is memory-mapped; a power loss before the next flush can);
- ``-1`` (all): answered once durable at the topic's durability (``sync``: after the group
  commit fsync that covers it).

All partitions of a request are appended before any waiting, in request order, so a request's
fsync is shared by every batch in it and by every other request appended meanwhile.
"""

from __future__ import annotations

import logging
import re
from typing import Any, Final

from kio.schema.errors import ErrorCode

from core.api import (
    BRAID_HEADER_PREFIX,
    ClientContext,
    NotLeader,
    PartitionLeader,
    ShardUnavailable,
    TopicError,
    is_system_topic,
    may_carry_braid_headers,
    now_ms,
    unpack_batch,
)
from gateway.kafka.access import allowed
from gateway.kafka.apis import ApiKey
from gateway.kafka.codec import Request
from gateway.kafka.context import Connection, Handler, KafkaContext, ResponseBody
from gateway.kafka.errors import RecordBatchError
from gateway.kafka.leaders import find_broker, leader_error
from gateway.kafka.producers import StoredBatch, last_sequence
from gateway.kafka.records import validate_produce_records, validate_records
from gateway.kafka.wire import NodeEndpoint, ProducePartition, encode_produce_response

DELIVER_AT_HEADER: Final = "x-braid-deliver-at"
DELAY_HEADER: Final = "x-delay"

log = logging.getLogger(__name__)

ACKS_NONE: Final = 0
ACKS_LEADER: Final = 1
ACKS_ALL: Final = -1
NO_OFFSET: Final = -1
_OK: Final = ErrorCode.none
_NOT_LEADER: Final = ErrorCode.not_leader_or_follower


async def handle_produce(
    context: KafkaContext, connection: Connection, request: Request
) -> ResponseBody | None:
    api = context.api
    # The disk alarm: every partition answered KAFKA_STORAGE_ERROR (retriable: the producer
    # retries until space is back) at once, not held as other flow control holds a request.
    disk_alarm = api.disk_alarm()
    if not disk_alarm and api.publishing_blocked():
        await api.wait_publishing_allowed()
    body: Any = request.body
    acks = body.acks
    version = request.api_version
    metrics = context.metrics
    client = connection.client
    # Per topic, the durable mark to await: acks=all answers once everything before it is
    # durable at the topic's durability (the last batch's Publication covers the earlier ones).
    durable_marks: list[tuple[str, int]] = []
    responses: list[tuple[str, list[ProducePartition]]] = []
    # The partition leaders (None: this node alone leads them all) and, for the partitions led
    # elsewhere, their leaders' endpoints (KIP-951).
    leaders = api.leader_table(client)
    this_node = api.this_node() if leaders is not None else 0
    endpoints: dict[int, NodeEndpoint] = {}
    for topic_data in body.topic_data:
        name = topic_data.name
        internal = is_system_topic(name)
        permitted = internal or allowed(context, connection, "kafka Produce", name)
        info = None if internal or not permitted else api.topic_info(client, name)
        if internal:
            log.info("kafka: %s produced to internal topic %s: refused", connection.peer, name)
        durable_end = 0
        partitions: list[ProducePartition] = []
        for partition_data in topic_data.partition_data:
            index = partition_data.index
            error = ErrorCode.none
            message: str | None = None
            base_offset = NO_OFFSET
            end = 0
            current_leader: tuple[int, int] | None = None
            if acks not in (ACKS_NONE, ACKS_LEADER, ACKS_ALL):
                error = ErrorCode.invalid_required_acks
            elif internal:
                # ReplicaManager.appendToLocalLog: only the broker writes its internal topics.
                error = ErrorCode.invalid_topic_exception
                message = f"Cannot append to internal topic {name}"
            elif not permitted:
                error = ErrorCode.topic_authorization_failed
            elif info is None or not 0 <= index < info.queues:
                error = ErrorCode.unknown_topic_or_partition
            elif leaders is not None and leader_error(leaders[name, index], this_node) != _OK:
                error = _NOT_LEADER
                current_leader = _current_leader(
                    context, connection, leaders[name, index], endpoints
                )
            elif disk_alarm:
                error = ErrorCode.kafka_storage_error
                message = "the broker's disk is below disk_free_limit_bytes"
            else:
                try:
                    error, base_offset, end = await _store_batch(
                        context, name, index, partition_data.records, version, client
                    )
                except RecordBatchError as exc:
                    error, message = exc.error_code, str(exc)
                    log.info("kafka: produce to %s/%d refused: %s", name, index, exc)
                except TopicError:
                    error = ErrorCode.unknown_topic_or_partition
                except (NotLeader, ShardUnavailable):
                    # The shard moved away, or its owner is gone, since the check: the client
                    # refreshes its metadata and retries at the leader.
                    error = ErrorCode.not_leader_or_follower
                except OSError:
                    log.exception("kafka: cannot append to %s/%d", name, index)
                    error = ErrorCode.kafka_storage_error
            if error != ErrorCode.none:
                metrics["produce_errors"] += 1
            elif end > durable_end:
                durable_end = end
            partitions.append(
                ProducePartition(
                    index,
                    error,
                    base_offset,
                    _log_start(context, connection, name, index)
                    if info is not None and error != _NOT_LEADER
                    else -1,
                    message,
                    current_leader,
                )
            )
        if durable_end:
            durable_marks.append((name, durable_end))
        responses.append((name, partitions))
    if acks == ACKS_NONE:
        return None
    if acks == ACKS_ALL:
        # At once for an async topic; one group-commit fsync covers every sync one.
        for name, durable_end in durable_marks:
            await api.when_durable(durable_end, name)
    return encode_produce_response(
        version, request.correlation_id, responses, context.throttle_ms(), list(endpoints.values())
    )


def _log_start(context: KafkaContext, connection: Connection, name: str, index: int) -> int:
    """The partition's log start offset for an answer, -1 when its shard is not here (led by
    another node, fenced or being taken over): the error already given is the answer, and
    the connection stays."""
    try:
        return context.api.partition_offsets(connection.client, name, index)[0]
    except ShardUnavailable as error:
        log.info(
            "kafka: %s produce to %s/%d: no log start: %s", connection.peer, name, index, error
        )
        return -1


def _current_leader(
    context: KafkaContext,
    connection: Connection,
    leader: PartitionLeader | None,
    endpoints: dict[int, NodeEndpoint],
) -> tuple[int, int] | None:
    """KIP-951: the partition's leader and epoch for the response, its endpoint added to
    ``endpoints``; None when the partition has no live leader (or it serves no Kafka)."""
    if leader is None:
        return None
    if leader.node_id not in endpoints:
        address = find_broker(context, connection, leader.node_id)
        if address is None:
            return None
        endpoints[leader.node_id] = NodeEndpoint(leader.node_id, *address)
    return leader.node_id, leader.epoch


async def _store_batch(
    context: KafkaContext,
    topic: str,
    partition: int,
    records: bytes | None,
    version: int,
    client: ClientContext,
) -> tuple[ErrorCode, int, int]:
    """Validate, deduplicate and store one partition's batch: (error, base offset, the durable
    mark of the stored batch)."""
    batch, header = validate_produce_records(records, version)
    # Every record decoded (and inflated, within the cap) before anything is stored, as
    # Kafka's LogValidator: ~0.2 ms per 1 MB of small records, ~2 us for a 10-record batch.
    validate_records(batch, header, context.api.max_inflated_batch_bytes(client))
    # No copy out of the request buffer: the header hint below searches the view in place, and
    # the log writes the batch to the segment file straight from it (CommitLog.append_parts).
    # One search for either header family first: most batches carry neither, and two
    # searches of a 1 MB batch cost as much as storing it.
    hinted = header.compression == 0 and _HEADER_HINT.search(batch) is not None
    braid_headers = hinted and may_carry_braid_headers(batch)
    metrics = context.metrics
    producer_id = header.producer_id
    last = -1
    transaction = None
    if header.is_transactional:
        error, transaction = context.transactions.check_produce(
            producer_id, header.producer_epoch, topic, partition
        )
        if transaction is None:
            return error, NO_OFFSET, 0
    if producer_id >= 0:
        last = last_sequence(header.base_sequence, header.last_offset_delta)
        check = context.producer_states.check(
            topic, partition, producer_id, header.producer_epoch, header.base_sequence, last
        )
        if check.duplicate is not None:
            # A retry of a batch already stored: acknowledged, not stored again (KIP-98).
            metrics["duplicate_batches"] += 1
            return ErrorCode.none, check.duplicate.base_offset, check.duplicate.end_position
        if check.error != ErrorCode.none:
            return check.error, NO_OFFSET, 0
    # A half message (txn) is visible, and given its offset, when the transaction commits; a
    # delayed batch gets its partition offset when it becomes visible.
    deliver_at = delivery_time(batch, braid_headers) if hinted and transaction is None else 0
    publication = context.api.produce_batch(
        client,
        topic,
        partition,
        batch,
        header.record_count,
        born_ms=header.base_timestamp,
        deliver_at_ms=deliver_at,
        braid_headers=braid_headers,
        transaction=transaction,
    )
    # Stored now unless flow control held it back since the request's check (then it is
    # awaited: stored, and durable).
    outcome = publication.outcome if publication.stored else await publication
    base_offset = NO_OFFSET if deliver_at or outcome.half else outcome.offset
    end = outcome.durable_mark
    if producer_id >= 0:
        context.producer_states.record(
            topic,
            partition,
            producer_id,
            header.producer_epoch,
            StoredBatch(header.base_sequence, last, base_offset, end),
        )
    metrics["produced_batches"] += 1
    metrics["produced_records"] += header.record_count
    metrics["produced_bytes"] += header.size
    return ErrorCode.none, base_offset, end


_DELIVER_AT_BYTES = DELIVER_AT_HEADER.encode()
_DELAY_BYTES = DELAY_HEADER.encode()
# Any x-braid-* header (tags, transactions, x-braid-deliver-at) or x-delay: the regex engine
# scans for both at once, 2-3x faster than two ``in`` searches (CPython's two-way search).
_HEADER_HINT = re.compile(re.escape(BRAID_HEADER_PREFIX) + b"|" + re.escape(_DELAY_BYTES))


def delivery_time(batch: bytes | memoryview, braid_headers: bool = True) -> int:
    """Delay by record header (docs/mapping.md): ``x-braid-deliver-at`` (ms since the epoch) or
    ``x-delay`` (ms from now) on any record delays the whole batch to the latest such time; 0 if
    none. Uncompressed batches only; the bytes are searched before anything is decoded."""
    raw = batch if type(batch) is bytes else bytes(batch)
    # braid_headers=False: the caller found no "x-braid-" in the batch, so no x-braid-deliver-at.
    if (not braid_headers or _DELIVER_AT_BYTES not in raw) and _DELAY_BYTES not in raw:
        return 0
    now = now_ms()
    latest = 0
    for inner in unpack_batch(raw):
        for name, value in inner.headers:
            try:
                if name == DELIVER_AT_HEADER:
                    latest = max(latest, int(value))
                elif name == DELAY_HEADER:
                    latest = max(latest, now + int(value))
            except ValueError:
                continue
    return latest if latest > now else 0


HANDLERS: dict[int, Handler] = {ApiKey.PRODUCE: handle_produce}
