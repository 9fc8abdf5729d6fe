"""DeleteTopics as Kafka does it: the data and the committed offsets go with the topic, and a topic
created again under the same name starts empty at offset 0, also after a crash."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from core.log import LogConfig, LogStore
from tests.braid_process import BraidProcess
from tests.kafka.conftest import create_topic, unique


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid"), listeners=("kafka",)) as process:
        yield process


async def produce(bootstrap: str, topic: str, values: list[bytes]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=0)
    finally:
        await producer.stop()


async def read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes]]:
    """(offset, value) of partition 0 from the earliest offset, without a group."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.seek_to_beginning(partition)
    got: list[tuple[int, bytes]] = []
    try:
        async with asyncio.timeout(15):
            while len(got) < expected:
                for messages in (await consumer.getmany(timeout_ms=300)).values():
                    got.extend((m.offset, m.value or b"") for m in messages)
        # Nothing beyond what is expected turns up either.
        for messages in (await consumer.getmany(timeout_ms=500)).values():
            got.extend((m.offset, m.value or b"") for m in messages)
    finally:
        await consumer.stop()
    return got


async def committed(bootstrap: str, group: str, topic: str) -> int | None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        return await consumer.committed(TopicPartition(topic, 0))
    finally:
        await consumer.stop()


async def commit(bootstrap: str, group: str, topic: str, offset: int) -> None:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        await consumer.commit({partition: offset})
    finally:
        await consumer.stop()


async def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
        assert topic not in await admin.list_topics()
    finally:
        await admin.close()


@pytest.mark.parametrize("restart", ["none", "kill9"])
async def test_a_topic_created_again_starts_empty(braid: BraidProcess, restart: str) -> None:
    bootstrap = braid.kafka_bootstrap
    topic, group = unique("deleted"), unique("deleted-group")
    await create_topic(bootstrap, topic, 1)
    await produce(bootstrap, topic, [b"old-%d" % i for i in range(5)])
    await commit(bootstrap, group, topic, 4)
    assert await committed(bootstrap, group, topic) == 4

    await delete_topic(bootstrap, topic)
    if restart == "kill9":
        braid.kill9()
        braid.start()
    await create_topic(bootstrap, topic, 1)
    assert await committed(bootstrap, group, topic) is None
    await produce(bootstrap, topic, [b"new-0", b"new-1"])
    assert await read_all(bootstrap, topic, 2) == [(0, b"new-0"), (1, b"new-1")]

    # And it stays so across a restart.
    braid.restart()
    assert await read_all(bootstrap, topic, 2) == [(0, b"new-0"), (1, b"new-1")]


def test_dropped_queues_are_not_rebuilt_by_recovery(tmp_path: Path) -> None:
    """Records appended after the last checkpoint are replayed by recovery: those of a dropped
    topic must not come back into a fresh index (a crash: the store is never closed)."""
    config = LogConfig(tmp_path, segment_size=1 << 20, index_entries_per_file=64)
    store = LogStore(config)
    store.checkpoint()
    for i in range(10):
        store.append("gone", 0, b"old-%d" % i)
        store.append("kept", 0, b"kept-%d" % i)
    assert store.drop_queues("gone") == [0]
    assert store.queue_index("gone", 0) is None
    store.append("kept", 0, b"kept-10")
    store.flush()
    # No close(): the next open recovers as after kill -9.
    reopened = LogStore(config)
    try:
        assert reopened.queue_index("gone", 0) is None
        assert [bytes(r.body) for r in reopened.read("kept", 0, 0, max_records=100)] == [
            b"kept-%d" % i for i in range(11)
        ]
        reopened.append("gone", 0, b"again")
        again = reopened.read("gone", 0, 0, max_records=10)
        assert [(r.offset, bytes(r.body)) for r in again] == [(0, b"again")]
    finally:
        reopened.close()
