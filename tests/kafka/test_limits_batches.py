"""Issue 21 item 1 (Kafka): batches checked before they are stored.

- A batch whose CRC is right and whose records are garbage was stored and stalled every
  consumer of the partition: now CORRUPT_MESSAGE (2), nothing stored, as Kafka's LogValidator.
- A 200 KB gzip batch inflating to 200 MiB was stored and delivered to AMQP and MQTT
  consumers: now MESSAGE_TOO_LARGE (10) past ``max_inflated_batch_bytes`` (default 100 MiB),
  decided before (zstd) or while (gzip, stopping at the limit) inflating, nothing stored.

Each case: the producer's connection stays usable, the partition's high watermark does not
move, and a real client's records before and after are consumed as usual."""

from __future__ import annotations

import datetime
import struct
import zlib

import cramjam
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kio.schema.errors import ErrorCode
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from gateway.kafka.records import (
    BATCH_HEADER,
    BATCH_HEADER_SIZE,
    CRC_OFFSET,
    LOG_OVERHEAD,
    Compression,
    build_batch,
    compute_crc,
)
from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique
from tests.kafka.raw import RawClient

MIB = 1024 * 1024


def _sealed(batch: bytearray) -> bytes:
    struct.pack_into(">I", batch, CRC_OFFSET, compute_crc(batch))
    return bytes(batch)


def _batch_of(records: bytes, compression: Compression, count: int = 1) -> bytes:
    """A batch header (CRC right) over ``records`` as given, compressed or not."""
    header = BATCH_HEADER.pack(
        0, BATCH_HEADER_SIZE - LOG_OVERHEAD + len(records), -1, 2, 0, int(compression),
        count - 1, 1, 1, -1, -1, -1, count,
    )  # fmt: skip
    return _sealed(bytearray(header + records))


def _garbage_records() -> bytes:
    """A valid 3-record batch with bytes inside its records overwritten, CRC recomputed."""
    batch = bytearray(build_batch([(1, b"k", b"value %d" % i, []) for i in range(3)]))
    batch[BATCH_HEADER_SIZE + 2 : BATCH_HEADER_SIZE + 12] = b"\xff" * 10
    return _sealed(batch)


def _gzip_bomb(size: int) -> bytes:
    """gzip of ``size`` zero bytes, made 1 MiB at a time (the test never holds ``size``)."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + 15)
    chunk = bytes(MIB)
    parts = [deflater.compress(chunk) for _ in range(size // MIB)]
    return b"".join([*parts, deflater.flush()])


def _zstd_bomb(size: int) -> bytes:
    compressor = cramjam.zstd.Compressor()
    chunk = bytes(MIB)
    for _ in range(size // MIB):
        compressor.compress(chunk)
    return bytes(compressor.finish())


def _create(raw: RawClient, topic: str) -> None:
    response = raw.request(
        MetadataRequest(
            topics=(MetadataRequestTopic(name=topic),),
            allow_auto_topic_creation=True,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )
    assert response.topics[0].error_code == ErrorCode.none


def _produce(raw: RawClient, topic: str, batch: bytes) -> ErrorCode:
    response = raw.request(
        ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=30),
            topic_data=(
                TopicProduceData(
                    name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)
                ),
            ),
        )
    )
    error: ErrorCode = response.responses[0].partition_responses[0].error_code
    return error


def _high_watermark(raw: RawClient, topic: str) -> int:
    response = raw.request(
        ListOffsetsRequest(
            replica_id=-1,
            isolation_level=0,
            topics=(
                ListOffsetsTopic(
                    name=topic,
                    partitions=(ListOffsetsPartition(partition_index=0, timestamp=-1),),
                ),
            ),
        )
    )
    return int(response.topics[0].partitions[0].offset)


async def _produce_and_consume(
    braid: BraidProcess, topic: str, values: list[bytes], compression: str | None = None
) -> list[bytes]:
    producer = AIOKafkaProducer(
        bootstrap_servers=braid.kafka_bootstrap, compression_type=compression
    )
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=braid.kafka_bootstrap, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        seen: list[bytes] = []
        while len(seen) < len(values):
            batches = await consumer.getmany(timeout_ms=30_000)
            assert batches, f"consumer stalled after {seen}"
            seen += [record.value for records in batches.values() for record in records]
        return seen
    finally:
        await consumer.stop()


async def test_garbage_records_behind_a_valid_crc_are_refused(braid: BraidProcess) -> None:
    topic = unique("garbage")
    raw = RawClient(braid.host, braid.kafka_port)
    try:
        _create(raw, topic)
        assert _produce(raw, topic, build_batch([(1, None, b"before", [])])) == ErrorCode.none
        assert _produce(raw, topic, _garbage_records()) == ErrorCode.corrupt_message
        # Records fewer than the header counts, and offset deltas out of order: corrupt too.
        two = build_batch([(1, None, b"a", []), (1, None, b"b", [])])
        records = two[BATCH_HEADER_SIZE:]
        assert _produce(raw, topic, _batch_of(records, Compression.NONE, 3)) == (
            ErrorCode.corrupt_message
        )
        assert _high_watermark(raw, topic) == 1
    finally:
        raw.close()
    assert await _produce_and_consume(braid, topic, [b"after"]) == [b"before", b"after"]
    refusal = f"produce to {topic}/0 refused: record batch holds records that do not decode"
    assert refusal in braid.stderr()


async def test_a_batch_inflating_past_the_limit_is_message_too_large(
    braid: BraidProcess,
) -> None:
    topic = unique("bomb")
    raw = RawClient(braid.host, braid.kafka_port)
    try:
        _create(raw, topic)
        gzip_bomb = _batch_of(_gzip_bomb(200 * MIB), Compression.GZIP)
        zstd_bomb = _batch_of(_zstd_bomb(200 * MIB), Compression.ZSTD)
        assert len(gzip_bomb) < MIB
        assert len(zstd_bomb) < MIB
        assert _produce(raw, topic, gzip_bomb) == ErrorCode.message_too_large
        assert _produce(raw, topic, zstd_bomb) == ErrorCode.message_too_large
        assert _high_watermark(raw, topic) == 0
    finally:
        raw.close()
    # Compressed batches within the limit are stored as usual (aiokafka gzip, 512 KiB value).
    assert await _produce_and_consume(braid, topic, [bytes(MIB // 2)], "gzip") == [bytes(MIB // 2)]
    assert "(max_inflated_batch_bytes)" in braid.stderr()
