"""aiokafka 0.14 against a real ``braid serve``: produce/consume, codecs, groups, transactions."""

from __future__ import annotations

import asyncio

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition

from core.log import LogReader
from core.log import record as rec
from gateway.kafka.records import Compression, read_batch_header
from tests.braid_process import BraidProcess
from tests.kafka.conftest import create_topic, unique

T0 = 1_700_000_000_000


async def consume_all(bootstrap: str, topic: str, expected: int, **config: object) -> list[object]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", **config
    )
    await consumer.start()
    got: list[object] = []
    try:
        async with asyncio.timeout(15):
            while len(got) < expected:
                batches = await consumer.getmany(timeout_ms=500)
                for messages in batches.values():
                    got.extend(messages)
    finally:
        await consumer.stop()
    return got


async def test_round_trip_keys_headers_timestamps_partitions(braid: BraidProcess) -> None:
    topic = unique("aio-roundtrip")
    await create_topic(braid.kafka_bootstrap, topic, 3)
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
    await producer.start()
    sent = {}
    try:
        for i in range(30):
            key = None if i == 7 else b"key-%d" % (i % 5)
            value = None if i == 9 else b"value-%d" % i
            headers = [("n", str(i).encode()), ("dup", b"a"), ("dup", b"b")]
            metadata = await producer.send_and_wait(
                topic, value, key=key, headers=headers, timestamp_ms=T0 + i, partition=i % 3
            )
            sent[(metadata.partition, metadata.offset)] = (key, value, T0 + i, headers)
    finally:
        await producer.stop()
    assert sorted({p for p, _ in sent}) == [0, 1, 2]
    assert sorted(o for p, o in sent if p == 0) == list(range(10))

    got = await consume_all(braid.kafka_bootstrap, topic, 30)
    assert len(got) == 30
    for message in got:
        key, value, timestamp, headers = sent[(message.partition, message.offset)]  # type: ignore[attr-defined]
        assert message.key == key  # type: ignore[attr-defined]
        assert message.value == value  # type: ignore[attr-defined]
        assert message.timestamp == timestamp  # type: ignore[attr-defined]
        assert list(message.headers) == headers  # type: ignore[attr-defined]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
async def test_compressed_batches_are_stored_as_sent(braid: BraidProcess, codec: str) -> None:
    topic = unique(f"aio-{codec}")
    producer = AIOKafkaProducer(
        bootstrap_servers=braid.kafka_bootstrap, compression_type=codec, linger_ms=50
    )
    await producer.start()
    try:
        futures = [await producer.send(topic, b"payload %d " % i * 20) for i in range(50)]
        await producer.flush()
        offsets = [(await future).offset for future in futures]
    finally:
        await producer.stop()
    assert offsets == list(range(50))

    got = await consume_all(braid.kafka_bootstrap, topic, 50)
    assert [m.value for m in got] == [b"payload %d " % i * 20 for i in range(50)]  # type: ignore[attr-defined]

    # The broker stored each RecordBatch once, compressed as the producer sent it.
    with LogReader(braid.data_dir) as reader:
        entries = reader.read(topic, 0, 0, max_records=1000)
    assert sum(entry.record_count for entry in entries) == 50
    assert len(entries) < 50
    for entry in entries:
        assert entry.record().flags & rec.FLAG_BATCH
        header = read_batch_header(entry.body)
        assert header.compression == Compression[codec.upper()]


async def test_two_member_group_rebalances(braid: BraidProcess) -> None:
    topic = unique("aio-group")
    group = unique("aio-group")
    await create_topic(braid.kafka_bootstrap, topic, 4)
    config = {
        "bootstrap_servers": braid.kafka_bootstrap,
        "group_id": group,
        "auto_offset_reset": "earliest",
        "heartbeat_interval_ms": 200,
        "session_timeout_ms": 6000,
        "enable_auto_commit": False,
    }
    first = AIOKafkaConsumer(topic, **config)  # type: ignore[arg-type]
    second = AIOKafkaConsumer(topic, **config)  # type: ignore[arg-type]
    await first.start()
    try:
        async with asyncio.timeout(15):
            while len(first.assignment()) != 4:
                await first.getmany(timeout_ms=100)
        await second.start()
        async with asyncio.timeout(20):
            while not (len(first.assignment()) == 2 and len(second.assignment()) == 2):
                await asyncio.gather(first.getmany(timeout_ms=100), second.getmany(timeout_ms=100))
        assert first.assignment() | second.assignment() == {
            TopicPartition(topic, p) for p in range(4)
        }
        await second.stop()
        async with asyncio.timeout(20):
            while len(first.assignment()) != 4:
                await first.getmany(timeout_ms=100)
    finally:
        await first.stop()
        await second.stop()


async def test_transactions_commit_and_abort_seen_by_read_committed(
    braid: BraidProcess,
) -> None:
    topic = unique("aio-txn")
    group = unique("aio-txn")
    producer = AIOKafkaProducer(
        bootstrap_servers=braid.kafka_bootstrap, transactional_id=unique("aio-txn")
    )
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send(topic, b"committed-1")
            await producer.send(topic, b"committed-2")
        await producer.begin_transaction()
        await producer.send(topic, b"aborted")
        await producer.abort_transaction()
        async with producer.transaction():
            await producer.send(topic, b"committed-3")
            await producer.send_offsets_to_transaction({TopicPartition(topic, 0): 2}, group)
    finally:
        await producer.stop()

    got = await consume_all(braid.kafka_bootstrap, topic, 3, isolation_level="read_committed")
    assert [m.value for m in got] == [b"committed-1", b"committed-2", b"committed-3"]  # type: ignore[attr-defined]
    # read_uncommitted reads aborted records too, as with Kafka (issue 17 item 14).
    got = await consume_all(braid.kafka_bootstrap, topic, 4, isolation_level="read_uncommitted")
    assert [m.value for m in got] == [b"committed-1", b"committed-2", b"aborted", b"committed-3"]  # type: ignore[attr-defined]

    consumer = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap, group_id=group)
    await consumer.start()
    try:
        assert await consumer.committed(TopicPartition(topic, 0)) == 2
    finally:
        await consumer.stop()
