"""Data directories written by LogStore with records that look like each protocol's, and the
rows the ``braid`` source must return for them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka.record.default_records import DefaultRecordBatchBuilder
from crc32c import crc32c

from core.log import LogConfig, LogStore
from core.log import record as rec

CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD = 0, 1, 2, 3, 4
# Kafka RecordBatch v2 header: attributes (int16) at byte 21, CRC-32C (uint32) at byte 17 over
# bytes [21, end); attribute bit 5 marks a control batch.
ATTRIBUTES_AT = 21
CRC_AT = 17
CONTROL_BIT = 0x20


def small_config(data_dir: Path, **overrides: Any) -> LogConfig:
    settings: dict[str, Any] = {
        "segment_size": 256 * 1024,
        "index_entries_per_file": 128,
        "retention_ms": None,
        "durability": "async",
    }
    settings.update(overrides)
    return LogConfig(data_dir, **settings)


KafkaRecord = tuple[int, bytes | None, bytes | None, Sequence[tuple[str, bytes]]]


def kafka_batch(
    records: Sequence[KafkaRecord],
    *,
    compression: int = CODEC_NONE,
    control: bool = False,
) -> bytes:
    """A Kafka RecordBatch as a producer sends it (base offset 0), from (timestamp, key, value,
    headers) tuples, built with aiokafka's builder."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=compression,
        is_transactional=control,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 20,
    )
    for delta, (timestamp, key, value, headers) in enumerate(records):
        builder.append(delta, timestamp=timestamp, key=key, value=value, headers=headers)
    raw = bytearray(builder.build())
    if control:
        attributes = int.from_bytes(raw[ATTRIBUTES_AT : ATTRIBUTES_AT + 2], "big") | CONTROL_BIT
        raw[ATTRIBUTES_AT : ATTRIBUTES_AT + 2] = attributes.to_bytes(2, "big")
        raw[CRC_AT : CRC_AT + 4] = crc32c(bytes(raw[ATTRIBUTES_AT:])).to_bytes(4, "big")
    return bytes(raw)


@dataclass
class Expected:
    """Rows keyed by (topic, queue, offset): the columns a test compares."""

    rows: dict[tuple[str, int, int], dict[str, Any]] = field(default_factory=dict)

    def add(self, topic: str, queue: int, offset: int, **columns: Any) -> None:
        self.rows[(topic, queue, offset)] = columns

    def count(self, topic: str | None = None) -> int:
        return sum(1 for key in self.rows if topic is None or key[0] == topic)


def write_mixed(data_dir: Path) -> Expected:
    """Kafka batches (several codecs, a tombstone, a control batch), AMQP-like records fanned out
    to two queues, MQTT-like records, a committed half message, a linked delayed record, a
    pending half message and a dead-lettered record; returns the visible rows."""
    expected = Expected()
    store = LogStore(small_config(data_dir))
    try:
        now = int(time.time() * 1000)
        # Kafka: two queues (partitions) of topic "orders", one batch per codec.
        offsets = {0: 0, 1: 0}
        for number, codec in enumerate(
            (CODEC_NONE, CODEC_GZIP, CODEC_SNAPPY, CODEC_LZ4, CODEC_ZSTD)
        ):
            queue = number % 2
            records = [
                (
                    now - 1000 + i,
                    f"order-{number}-{i}".encode(),
                    None if (number, i) == (1, 2) else f"payload {number}/{i}".encode() * 3,
                    [("trace", f"t{number}{i}".encode())] if i % 2 else [],
                )
                for i in range(4 + number)
            ]
            store.append_batch(
                "orders",
                queue,
                kafka_batch(records, compression=codec),
                len(records),
                client="kafka-producer-1",
                address="orders",
            )
            for delta, (timestamp, key, value, headers) in enumerate(records):
                expected.add(
                    "orders",
                    queue,
                    offsets[queue] + delta,
                    key=key,
                    value=value,
                    headers=headers,
                    protocol="kafka",
                    timestamp_ms=timestamp,
                    client_id="kafka-producer-1",
                )
            offsets[queue] += len(records)
        # A transaction marker (control batch): stored, indexed, never a row. Offsets advance.
        marker = kafka_batch(
            [(now, b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [])], control=True
        )
        store.append_batch("orders", 0, marker, 1, flags=rec.FLAG_TXN_CONTROL)
        offsets[0] += 1
        tail = [(now, b"after-marker", b"value after marker", [])]
        store.append_batch("orders", 0, kafka_batch(tail), 1, client="kafka-producer-1")
        expected.add(
            "orders",
            0,
            offsets[0],
            key=b"after-marker",
            value=b"value after marker",
            headers=[],
            protocol="kafka",
            timestamp_ms=now,
            client_id="kafka-producer-1",
        )

        # AMQP: a topic exchange fanning out to queues (store once, index many).
        for i in range(6):
            routing_key = f"sensor.eu.{i}"
            headers = [("x-correlation-id", f"corr-{i}".encode()), ("content-type", b"text/plain")]
            appended = store.append(
                "amq.topic",
                0,
                f"amqp body {i}".encode(),
                key=None,
                headers=headers,
                subject=routing_key,
                client="amqp-client-1",
                address=f"amq.topic/{routing_key}",
                protocol=rec.PROTOCOL_AMQP,
                destinations=[("amq.topic", 0), ("alerts", 0)] if i % 2 == 0 else None,
                tags=["eu"] if i < 3 else [],
            )
            for topic, queue, offset in appended.offsets:
                expected.add(
                    topic,
                    queue,
                    offset,
                    key=None,
                    value=f"amqp body {i}".encode(),
                    headers=headers,
                    protocol="amqp",
                    subject=routing_key,
                    client_id="amqp-client-1",
                    origin_address=f"amq.topic/{routing_key}",
                    tags=["eu"] if i < 3 else [],
                    position=appended.position,
                )
        # MQTT: first topic level is the topic, the levels are the subject.
        for i in range(5):
            levels = f"devices/dev-{i % 2}/temperature"
            appended = store.append(
                "devices",
                i % 2,
                f'{{"t": {20 + i}}}'.encode(),
                key=None,
                subject=levels,
                address=levels,
                client=f"device-{i % 2}",
                protocol=rec.PROTOCOL_MQTT,
            )
            ((topic, queue, offset),) = appended.offsets
            expected.add(
                topic,
                queue,
                offset,
                key=None,
                value=f'{{"t": {20 + i}}}'.encode(),
                headers=[],
                protocol="mqtt",
                subject=levels,
                origin_address=levels,
                client_id=f"device-{i % 2}",
            )
        # Transactions: a committed half message appears, a pending one does not.
        committed = store.append(
            "payments", 0, b"committed", flags=rec.FLAG_HALF, protocol=rec.PROTOCOL_AMQP
        )
        store.append(
            "payments", 0, b"pending forever", flags=rec.FLAG_HALF, protocol=rec.PROTOCOL_AMQP
        )
        ((_, _, offset),) = store.link([committed.position]).offsets
        expected.add("payments", 0, offset, value=b"committed", protocol="amqp", headers=[])
        # Delay: visible once its timer fired (a LINK indexes it where it belongs).
        delayed = store.append(
            "payments", 0, b"delayed", deliver_at_ms=now + 3_600_000, protocol=rec.PROTOCOL_MQTT
        )
        ((_, _, offset),) = store.link([delayed.position], [("payments", 0)]).offsets
        expected.add("payments", 0, offset, value=b"delayed", protocol="mqtt", headers=[])
        # Dead letter: the record stays in its queue and is also seen in the DLQ with x-death.
        dead = store.append(
            "payments",
            0,
            b"poison",
            headers=[("attempt", b"1")],
            protocol=rec.PROTOCOL_AMQP,
            address="payments",
        )
        expected.add(
            "payments",
            0,
            dead.offsets[0][2],
            value=b"poison",
            protocol="amqp",
            headers=[("attempt", b"1")],
        )
        ((_, _, offset),) = store.link(
            [dead.position],
            [("%DLQ%billing", 0)],
            headers=[("x-death-reason", b"rejected"), ("attempt", b"5")],
        ).offsets
        expected.add(
            "%DLQ%billing",
            0,
            offset,
            value=b"poison",
            protocol="amqp",
            headers=[("x-death-reason", b"rejected"), ("attempt", b"5")],
            position=dead.position,
        )
    finally:
        store.close()
    return expected


def write_jobs_data(data_dir: Path) -> None:
    """Traffic for the example jobs: orders keyed order-1..5 produced with Kafka, handled over
    AMQP (correlation-id header) and confirmed over MQTT (correlation-data), and dead letters
    in core.deadletter's shape, fanned out to a bound queue."""
    from core.deadletter import DEAD_LETTER_REASON_HEADER, X_DEATH_HEADER, updated_x_death

    store = LogStore(small_config(data_dir))
    try:
        now = int(time.time() * 1000)
        records = [(now + i, f"order-{i}".encode(), b"x" * (10 * i), []) for i in range(1, 6)]
        store.append_batch("orders", 0, kafka_batch(records), len(records), client="shop")
        for i in (1, 2, 3):
            store.append(
                "amq.direct",
                0,
                b"work item " * i,
                key=None,
                subject="work",
                headers=[("correlation-id", f"order-{i}".encode())],
                protocol=rec.PROTOCOL_AMQP,
                address="amq.direct/work",
                destinations=[("amq.direct", 0), ("work", 0)],
            )
        for i in (2, 4):
            store.append(
                "devices",
                0,
                b"confirmed",
                key=None,
                subject=f"devices/d{i}/ack",
                headers=[("correlation-data", f"order-{i}".encode())],
                protocol=rec.PROTOCOL_MQTT,
                address=f"devices/d{i}/ack",
            )
        for i, reason in enumerate(("rejected", "rejected", "expired")):
            original = store.append(
                "amq.direct",
                0,
                b"bad job",
                key=None,
                subject="work",
                protocol=rec.PROTOCOL_AMQP,
                address="amq.direct/work",
                destinations=[("amq.direct", 0), ("work", 0)],
            )
            x_death = updated_x_death(
                None,
                queue="work",
                reason=reason,
                time_ms=now + i,
                exchange="amq.direct",
                routing_keys=["work"],
            )
            store.link(
                [original.position],
                [("%DLQ%workers", 0), ("dlq.audit", 0)],
                headers=[(X_DEATH_HEADER, x_death), (DEAD_LETTER_REASON_HEADER, reason.encode())],
            )
    finally:
        store.close()
