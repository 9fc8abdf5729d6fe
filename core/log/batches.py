"""Unpacking a stored Kafka RecordBatch into its records, for consumers of other protocols.

The log stores a Kafka producer's RecordBatch as one batch record (FLAG_BATCH) and never decodes
it on the Kafka path. AMQP and MQTT consumers, Spark and ``braid log dump`` need the individual
records: aiokafka's record codec (Cython, handles gzip/snappy/lz4/zstd through cramjam) is the
well-kept implementation of that format, so it is used rather than a hand-written decoder.
Pure functions over bytes.
"""

from __future__ import annotations

from typing import NamedTuple

from aiokafka.record.default_records import DefaultRecordBatch  # type: ignore[import-untyped]


class BatchRecord(NamedTuple):
    offset_delta: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


def unpack_batch(body: bytes | memoryview) -> list[BatchRecord]:
    """Records of one RecordBatch, offsets relative to the batch; [] for a control batch."""
    batch = DefaultRecordBatch(bytes(body))
    if batch.is_control_batch:
        return []
    base = batch.base_offset
    return [
        BatchRecord(
            record.offset - base,
            record.timestamp,
            record.key,
            record.value,
            [(name, value or b"") for name, value in record.headers],
        )
        for record in batch
    ]


def batch_is_control(body: bytes | memoryview) -> bool:
    # attributes (int16) at byte 21 of the batch header; bit 5 is the control flag.
    attributes = int.from_bytes(bytes(body[21:23]), "big")
    return bool(attributes & 0x20)
