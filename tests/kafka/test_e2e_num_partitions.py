"""``[broker] num_partitions`` (Kafka's ``num.partitions``): the partitions of an auto-created
topic, as aiokafka's own suite expects them (it runs its brokers with ``num.partitions=2``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique

NUM_PARTITIONS = 2


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    tmp_path: Path = tmp_path_factory.mktemp("braid")
    config = tmp_path / "braid.toml"
    config.write_text(f"[broker]\nnum_partitions = {NUM_PARTITIONS}\n")
    with BraidProcess(
        tmp_path, listeners=("kafka",), extra_args=("--config", str(config))
    ) as process:
        yield process


async def test_produce_to_a_new_topic_creates_num_partitions(braid: BraidProcess) -> None:
    topic = unique("auto-created")
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    await producer.start()
    try:
        # aiokafka asks Metadata for the topic (which creates it), then checks the partition
        # against it: "Unrecognized partition" with one partition.
        first = await producer.send_and_wait(topic, b"to-0", partition=0)
        second = await producer.send_and_wait(topic, b"to-1", partition=1)
        assert await producer.partitions_for(topic) == {0, 1}
    finally:
        await producer.stop()
    assert (first.partition, first.offset) == (0, 0)
    assert (second.partition, second.offset) == (1, 0)

    consumer = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap)
    await consumer.start()
    try:
        partition = TopicPartition(topic, 1)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        message = await consumer.getone()
    finally:
        await consumer.stop()
    assert (message.partition, message.offset, message.value) == (1, 0, b"to-1")


def test_create_topics_with_default_partitions_uses_the_setting(braid: BraidProcess) -> None:
    topic = unique("created-default")
    admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
    # No partition count: CreateTopics says -1, "the broker's num.partitions" (KIP-464).
    admin.create_topics([NewTopic(topic)])[topic].result(timeout=30)
    listed = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(listed.partitions) == NUM_PARTITIONS
