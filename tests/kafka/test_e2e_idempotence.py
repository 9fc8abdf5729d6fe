"""Idempotent producers against a real ``braid serve``: a produce request sent twice is stored
once and acknowledged with the original offset, also after a restart; out-of-order and fenced
batches are refused with Kafka's error codes.

The requests are written byte for byte with kio (``tests.kafka.raw``), as a client retrying a
request whose response it lost would send them again.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from kio.schema.errors import ErrorCode
from kio.schema.init_producer_id.v4.request import InitProducerIdRequest
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from gateway.kafka.records import build_batch
from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique
from tests.kafka.raw import RawClient

T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    # A module of its own: these tests restart the broker.
    with BraidProcess(tmp_path_factory.mktemp("braid"), listeners=("kafka",)) as process:
        yield process


def client(braid: BraidProcess) -> RawClient:
    return RawClient(braid.host, braid.kafka_port)


def init_producer_id(raw: RawClient) -> tuple[int, int]:
    response = raw.request(
        InitProducerIdRequest(
            transactional_id=None,
            transaction_timeout=datetime.timedelta(milliseconds=60_000),
            producer_id=-1,
            producer_epoch=-1,
        )
    )
    assert response.error_code == ErrorCode.none
    return response.producer_id, response.producer_epoch


def create(raw: RawClient, topic: str) -> None:
    response = raw.request(
        MetadataRequest(
            topics=(MetadataRequestTopic(name=topic),),
            allow_auto_topic_creation=True,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
    )
    assert response.topics[0].error_code == ErrorCode.none


def produce(
    raw: RawClient, topic: str, producer: tuple[int, int], sequence: int, count: int
) -> tuple[ErrorCode, int]:
    batch = build_batch(
        [(T0 + sequence + i, None, b"record %d" % (sequence + i), []) for i in range(count)],
        producer_id=producer[0],
        producer_epoch=producer[1],
        base_sequence=sequence,
    )
    response = raw.request(
        ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(
                TopicProduceData(
                    name=topic,
                    partition_data=(PartitionProduceData(index=0, records=batch),),
                ),
            ),
        )
    )
    partition = response.responses[0].partition_responses[0]
    return partition.error_code, partition.base_offset


def high_watermark(raw: RawClient, topic: str) -> int:
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


def test_duplicate_batch_is_acknowledged_not_stored_twice(braid: BraidProcess) -> None:
    topic = unique("idem")
    raw = client(braid)
    try:
        create(raw, topic)
        producer = init_producer_id(raw)
        assert produce(raw, topic, producer, 0, 5) == (ErrorCode.none, 0)
        # The same request again: a retry after a lost response.
        assert produce(raw, topic, producer, 0, 5) == (ErrorCode.none, 0)
        assert high_watermark(raw, topic) == 5
        assert produce(raw, topic, producer, 5, 3) == (ErrorCode.none, 5)
        assert produce(raw, topic, producer, 5, 3) == (ErrorCode.none, 5)
        # An older batch still among the last five is a duplicate too.
        assert produce(raw, topic, producer, 0, 5) == (ErrorCode.none, 0)
        assert high_watermark(raw, topic) == 8
        # A gap in the sequence: OUT_OF_ORDER_SEQUENCE_NUMBER, nothing stored.
        assert produce(raw, topic, producer, 20, 1)[0] == ErrorCode.out_of_order_sequence_number
        # A new producer id is independent.
        other = init_producer_id(raw)
        assert other[0] != producer[0]
        assert produce(raw, topic, other, 0, 1) == (ErrorCode.none, 8)
        assert high_watermark(raw, topic) == 9
    finally:
        raw.close()


def test_duplicates_are_recognised_after_a_restart(braid: BraidProcess) -> None:
    topic = unique("idem-restart")
    raw = client(braid)
    try:
        create(raw, topic)
        producer = init_producer_id(raw)
        assert produce(raw, topic, producer, 0, 4) == (ErrorCode.none, 0)
        assert produce(raw, topic, producer, 4, 4) == (ErrorCode.none, 4)
    finally:
        raw.close()

    braid.restart()
    raw = client(braid)
    try:
        assert produce(raw, topic, producer, 4, 4) == (ErrorCode.none, 4)
        assert produce(raw, topic, producer, 0, 4) == (ErrorCode.none, 0)
        assert high_watermark(raw, topic) == 8
        assert produce(raw, topic, producer, 12, 1)[0] == ErrorCode.out_of_order_sequence_number
        assert produce(raw, topic, producer, 8, 1) == (ErrorCode.none, 8)
        # Producer ids handed out before the restart are never handed out again.
        assert init_producer_id(raw)[0] > producer[0]
    finally:
        raw.close()

    braid.kill9()
    braid.start()
    raw = client(braid)
    try:
        assert produce(raw, topic, producer, 8, 1) == (ErrorCode.none, 8)
        assert high_watermark(raw, topic) == 9
    finally:
        raw.close()


async def test_aiokafka_idempotent_producer(braid: BraidProcess, tmp_path: Path) -> None:
    topic = unique("idem-aio")
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        offsets = [(await producer.send_and_wait(topic, b"%d" % i)).offset for i in range(20)]
    finally:
        await producer.stop()
    assert offsets == list(range(20))
