"""Message: the protocol-neutral view of one record a consumer receives.

A plain record is one message; a batch record (a Kafka RecordBatch) is ``record_count`` messages,
each with its own queue offset. Gateways build their protocol's frames from this view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from core.deadletter.policy import DEAD_LETTER_TOPIC_HEADER
from core.log import record as rec
from core.log.batches import unpack_batch
from core.log.reader import QueueRecord

# Absolute expiry time (ms since the epoch, ASCII digits) set by a publisher's per-message TTL
# (AMQP ``expiration``, MQTT 5 message expiry). Checked at delivery.
EXPIRES_AT_HEADER = "x-braid-expires-at"
# A record's priority, decimal digits 0-255 (AMQP's ``priority`` property; Kafka and MQTT
# publishers set the header themselves). Priority queues deliver higher ones first.
PRIORITY_HEADER = "x-braid-priority"
# A Kafka record's routing key (subject) when it is not its key (docs/mapping.md).
ROUTING_KEY_HEADER = "x-braid-routing-key"
# On a batch record whose records reach different destinations: JSON ``{"<topic>\x00<queue>":
# [offset deltas]}`` for each routed destination that takes only some of its records (a
# destination not listed takes them all). Readers of that destination skip the others.
BATCH_SELECT_HEADER = "x-braid-batch-select"


def inner_subject(key: bytes | None, headers: list[tuple[str, bytes]]) -> str:
    """The subject (routing key) of one record of a Kafka batch: its ``x-braid-routing-key``
    header, else its key as UTF-8, else empty."""
    for name, value in headers:
        if name == ROUTING_KEY_HEADER:
            return value.decode("utf-8", "replace")
    return key.decode("utf-8", "replace") if key else ""


def selection_key(topic: str, queue: int) -> str:
    return f"{topic}\x00{queue}"


@dataclass(slots=True)
class Message:
    topic: str  # the topic the publisher addressed
    queue: int  # the queue this copy is read from ...
    offset: int  # ... and its offset there
    subject: str
    key: bytes | None
    headers: list[tuple[str, bytes]]
    tags: list[str]
    body: bytes | None
    protocol: int
    client: str
    address: str
    born_ms: int
    store_ms: int
    flags: int
    position: int
    enqueued_ms: int = 0  # when this queue's index entry was written (TTL counts from here)

    @property
    def expires_at_ms(self) -> int | None:
        """Its per-message expiry, or None; none once it was dead-lettered: RabbitMQ removes a
        dead letter's ``expiration`` (x-death keeps it as ``original-expiration``), so it does
        not expire at once in the dead-letter queue (aio-pika's test_expiration)."""
        expires_at = None
        for name, value in self.headers:
            if name == EXPIRES_AT_HEADER:
                expires_at = int(value)
            elif name == DEAD_LETTER_TOPIC_HEADER:
                return None
        return expires_at

    def priority(self, max_priority: int) -> int:
        """Its priority in a queue of priorities 0..``max_priority`` (RabbitMQ: none is 0, a
        higher one counts as ``max_priority``)."""
        raw = self.header(PRIORITY_HEADER) if self.headers else None
        if raw is None:
            return 0
        try:
            priority = int(raw)
        except ValueError:
            return 0
        return min(max(priority, 0), max_priority)

    def header(self, name: str) -> bytes | None:
        for header_name, value in self.headers:
            if header_name == name:
                return value
        return None


def messages_of(queued: QueueRecord, *, selected: bool = False) -> list[Message]:
    """Every message of a queue entry (one, or each record of a batch). With ``selected``, a
    batch routed to this entry's queue for only some of its records yields only those."""
    record = queued.record()
    if not record.flags & rec.FLAG_BATCH:
        return [
            Message(
                record.topic,
                queued.queue,
                queued.offset,
                record.subject,
                record.key,
                record.headers,
                record.tags,
                record.body,
                record.protocol,
                record.client,
                record.address,
                record.born_ms,
                record.store_ms,
                record.flags,
                record.position,
                queued.store_ms,
            )
        ]
    inner_records = unpack_batch(record.body or b"")
    if selected and record.headers:
        select = _selection(record.headers, queued.topic, queued.queue)
        if select is not None:
            inner_records = [inner for inner in inner_records if inner.offset_delta in select]
    return [
        Message(
            record.topic,
            queued.queue,
            queued.offset + inner.offset_delta,
            inner_subject(inner.key, inner.headers) or record.subject,
            inner.key,
            inner.headers,
            record.tags,
            inner.value,
            record.protocol,
            record.client,
            record.address,
            inner.timestamp_ms,
            record.store_ms,
            record.flags & ~rec.FLAG_BATCH,
            record.position,
            queued.store_ms,
        )
        for inner in inner_records
    ]


def _selection(headers: list[tuple[str, bytes]], topic: str, queue: int) -> set[int] | None:
    for name, value in headers:
        if name == BATCH_SELECT_HEADER:
            chosen = json.loads(value).get(selection_key(topic, queue))
            return None if chosen is None else set(chosen)
    return None
