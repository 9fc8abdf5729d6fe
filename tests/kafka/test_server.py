"""KafkaServer in-process (the test's event loop, a Node on a temporary directory): response
order, long polling, fetch limits, acks=0, records of other protocols, offsets by time,
transaction timeouts."""

from __future__ import annotations

import asyncio
import datetime
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.heartbeat.v4.request import HeartbeatRequest
from kio.schema.list_offsets.v7.request import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsTopic,
)
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from core.api import ManualClock
from core.log import record as rec
from gateway.kafka import server as server_module
from gateway.kafka.records import build_batch, iter_records, read_batch_header, split_batches
from gateway.kafka.server import KafkaServer
from tests.kafka.conftest import api_of, bootstrap, broker_of, open_broker
from tests.kafka.raw import AsyncRawClient

T0 = 1_700_000_000_000


async def connect(server: KafkaServer) -> AsyncRawClient:
    address = server.address
    assert address is not None
    return await AsyncRawClient.connect(*address)


def metadata(topic: str | None = None) -> MetadataRequest:
    return MetadataRequest(
        topics=None if topic is None else (MetadataRequestTopic(name=topic),),
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def fetch(
    topic: str,
    offset: int = 0,
    *,
    max_wait_ms: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 50 * 1024 * 1024,
    partition_max_bytes: int = 1024 * 1024,
    session_id: int = 0,
) -> FetchRequest:
    return FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(milliseconds=max_wait_ms),
        min_bytes=min_bytes,
        max_bytes=max_bytes,
        isolation_level=0,
        session_id=session_id,
        session_epoch=-1,
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(
                    FetchPartition(
                        partition=0,
                        fetch_offset=offset,
                        partition_max_bytes=partition_max_bytes,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )


def produce(topic: str, batch: bytes, acks: int = -1) -> ProduceRequest:
    return ProduceRequest(
        transactional_id=None,
        acks=acks,
        timeout=datetime.timedelta(seconds=10),
        topic_data=(
            TopicProduceData(
                name=topic, partition_data=(PartitionProduceData(index=0, records=batch),)
            ),
        ),
    )


def batch_of(*values: bytes, timestamp: int = T0) -> bytes:
    return build_batch([(timestamp, None, value, []) for value in values])


async def test_responses_keep_request_order(kafka_server: KafkaServer) -> None:
    client = await connect(kafka_server)
    try:
        await client.request(metadata("ordered"))
        # A long poll that waits its whole 300 ms, then two quick requests behind it.
        started = time.monotonic()
        first = client.send(fetch("ordered", max_wait_ms=300))
        second = client.send(metadata())
        third = client.send(produce("ordered", batch_of(b"x"), acks=1))
        correlation_id, _ = await client.receive(1, 12)
        assert correlation_id == first
        assert time.monotonic() - started >= 0.29
        assert (await client.receive(3, 9))[0] == second
        correlation_id, produced = await client.receive(0, 9)
        assert correlation_id == third
        assert produced.responses[0].partition_responses[0].base_offset == 0
    finally:
        await client.close()


async def test_long_poll_returns_when_records_arrive(kafka_server: KafkaServer) -> None:
    consumer = await connect(kafka_server)
    producer = await connect(kafka_server)
    try:
        await producer.request(metadata("polled"))
        started = time.monotonic()
        waiting = asyncio.ensure_future(consumer.request(fetch("polled", max_wait_ms=5000)))
        await asyncio.sleep(0.1)
        assert not waiting.done()
        await producer.request(produce("polled", batch_of(b"hello", b"world")))
        response = await asyncio.wait_for(waiting, 2)
        assert time.monotonic() - started < 2
        partition = response.responses[0].partitions[0]
        assert partition.high_watermark == 2
        assert [r.value for r in iter_records(partition.records)] == [b"hello", b"world"]
    finally:
        await consumer.close()
        await producer.close()


async def test_acks_0_gets_no_response(kafka_server: KafkaServer) -> None:
    client = await connect(kafka_server)
    try:
        await client.request(metadata("fire-and-forget"))
        client.send(produce("fire-and-forget", batch_of(b"a"), acks=0))
        asked = client.send(metadata())
        assert (await client.receive(3, 9))[0] == asked
        response = await client.request(fetch("fire-and-forget"))
        assert response.responses[0].partitions[0].high_watermark == 1
    finally:
        await client.close()


async def test_fetch_limits_and_errors(kafka_server: KafkaServer) -> None:
    client = await connect(kafka_server)
    try:
        await client.request(metadata("limits"))
        for i in range(10):
            await client.request(produce("limits", batch_of(b"%d" % i + b"x" * 1000)))
        # A partition limit below one batch still returns the first batch whole (KIP-74).
        response = await client.request(fetch("limits", partition_max_bytes=1))
        records = response.responses[0].partitions[0].records
        assert len(split_batches(records)) == 1
        # Stored batches come back with their offset and leader epoch set, CRC untouched.
        response = await client.request(fetch("limits", 4, partition_max_bytes=3500))
        batches = split_batches(response.responses[0].partitions[0].records)
        assert 1 < len(batches) < 6
        headers = [read_batch_header(batch) for batch in batches]
        assert [h.base_offset for h in headers] == list(range(4, 4 + len(batches)))
        assert {h.partition_leader_epoch for h in headers} == {0}

        out_of_range = await client.request(fetch("limits", 11))
        assert out_of_range.responses[0].partitions[0].error_code == ErrorCode.offset_out_of_range
        unknown = await client.request(fetch("no-such-topic"))
        assert unknown.responses[0].partitions[0].error_code == (
            ErrorCode.unknown_topic_or_partition
        )
        produced = await client.request(produce("no-such-topic", batch_of(b"a")))
        assert produced.responses[0].partition_responses[0].error_code == (
            ErrorCode.unknown_topic_or_partition
        )
        corrupt = bytearray(batch_of(b"a"))
        corrupt[-1] ^= 0xFF
        produced = await client.request(produce("limits", bytes(corrupt)))
        assert produced.responses[0].partition_responses[0].error_code == (
            ErrorCode.corrupt_message
        )
        sessions = await client.request(fetch("limits", session_id=7))
        assert sessions.error_code == ErrorCode.fetch_session_id_not_found
    finally:
        await client.close()


async def test_records_of_other_protocols_are_served_as_record_batches(
    kafka_server: KafkaServer,
) -> None:
    broker = broker_of(kafka_server)
    await broker.declare_topic("mixed", 1)
    await broker.publish(
        "mixed", b"from amqp", key=b"rk", headers=[("h", b"1")], born_ms=T0, queue=0
    )
    await broker.publish("mixed", None, key=None, born_ms=T0 + 1, queue=0)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(kafka_server))
    await producer.start()
    try:
        await producer.send_and_wait("mixed", b"from kafka", timestamp_ms=T0 + 2)
    finally:
        await producer.stop()
    await broker.publish("mixed", b"from mqtt", born_ms=T0 + 3, queue=0)

    consumer = AIOKafkaConsumer(
        "mixed", bootstrap_servers=bootstrap(kafka_server), auto_offset_reset="earliest"
    )
    await consumer.start()
    got = []
    try:
        async with asyncio.timeout(10):
            while len(got) < 4:
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend(messages)
    finally:
        await consumer.stop()
    assert [(m.offset, m.key, m.value, m.timestamp) for m in got] == [
        (0, b"rk", b"from amqp", T0),
        (1, None, None, T0 + 1),
        (2, None, b"from kafka", T0 + 2),
        (3, None, b"from mqtt", T0 + 3),
    ]
    assert list(got[0].headers) == [("h", b"1")]


async def test_list_offsets_earliest_latest_and_by_time(kafka_server: KafkaServer) -> None:
    client = await connect(kafka_server)
    try:
        await client.request(metadata("timed"))
        # The records' own timestamps (CreateTime), long before they are stored.
        for i in range(3):
            await client.request(
                produce("timed", batch_of(b"%d" % i, b"more", timestamp=T0 + 100 * i))
            )

        async def offset_for(timestamp: int) -> tuple[int, int]:
            response = await client.request(
                ListOffsetsRequest(
                    replica_id=-1,
                    isolation_level=1,
                    topics=(
                        ListOffsetsTopic(
                            name="timed",
                            partitions=(
                                ListOffsetsPartition(partition_index=0, timestamp=timestamp),
                            ),
                        ),
                    ),
                )
            )
            partition = response.topics[0].partitions[0]
            assert partition.error_code == ErrorCode.none
            return partition.offset, partition.timestamp

        assert (await offset_for(-2))[0] == 0
        assert (await offset_for(-1))[0] == 6
        assert await offset_for(T0 + 50) == (2, T0 + 100)
        assert await offset_for(T0 + 100) == (2, T0 + 100)
        assert await offset_for(T0 + 201) == (-1, -1)
        # KIP-734: the first record with the largest timestamp.
        assert await offset_for(-3) == (4, T0 + 200)
    finally:
        await client.close()


async def test_list_offsets_by_the_timestamps_of_records_of_every_protocol(
    kafka_server: KafkaServer,
) -> None:
    broker = broker_of(kafka_server)
    await broker.declare_topic("timed-mixed", 1)
    await broker.publish("timed-mixed", b"amqp", born_ms=T0 + 100, queue=0)  # offset 0
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap(kafka_server))
    await producer.start()
    try:
        await producer.send_and_wait("timed-mixed", b"kafka", timestamp_ms=T0 + 300)  # 1
    finally:
        await producer.stop()
    await broker.publish("timed-mixed", b"mqtt", born_ms=T0 + 200, queue=0)  # offset 2
    before_store = time.time_ns() // 1_000_000
    await broker.publish("timed-mixed", b"no publisher time", queue=0)  # 3: its store time

    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap(kafka_server))
    await consumer.start()
    try:
        partition = TopicPartition("timed-mixed", 0)

        async def found(timestamp: int) -> tuple[int, int] | None:
            answer = (await consumer.offsets_for_times({partition: timestamp}))[partition]
            return None if answer is None else (answer.offset, answer.timestamp)

        assert await found(T0 + 50) == (0, T0 + 100)
        assert await found(T0 + 150) == (1, T0 + 300)
        answer = await found(T0 + 301)
        assert answer is not None
        assert answer[0] == 3
        assert answer[1] >= before_store
    finally:
        await consumer.stop()


async def test_expired_transaction_is_aborted_and_its_producer_fenced(tmp_path: Path) -> None:
    # The transaction timeout runs on the listener's injected clock: a ManualClock moved past
    # it, instead of sleeping for it.
    clock = ManualClock()
    broker = open_broker(tmp_path / "data")
    await broker.shard.store.start()
    await broker.start()
    kafka_server = KafkaServer(api_of(broker), clock=clock)
    await kafka_server.start("127.0.0.1", 0)
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap(kafka_server),
        transactional_id="slow",
        transaction_timeout_ms=60_000,
    )
    try:
        await producer.start()
        await producer.begin_transaction()
        await producer.send_and_wait("expiring", b"never visible")
        clock.advance(59_999)
        assert kafka_server.metrics["expired"] == 0
        clock.advance(1)
        assert kafka_server.metrics["expired"] == 1
        store = broker.shard.store
        # The abort (its marker written, the epoch bumped) finishes in a task.
        for _ in range(3000):  # a 30 s deadline against a hang
            if len(store.read("expiring", 0, 0)) == 2:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(KafkaError):
            await producer.commit_transaction()
    finally:
        await producer.stop()
        await kafka_server.close()
    entries = store.read("expiring", 0, 0)
    # The data batch (stored when produced, as with Kafka), then the ABORT marker.
    assert len(entries) == 2
    assert not rec.FLAGS.unpack_from(entries[0].frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_TXN_CONTROL
    assert rec.FLAGS.unpack_from(entries[1].frame, rec.FLAGS_OFFSET)[0] & rec.FLAG_TXN_CONTROL
    await broker.close()
    await broker.shard.store.aclose()


@pytest.mark.parametrize("after_await", [False, True])
async def test_a_failing_handler_closes_only_its_connection(
    kafka_server: KafkaServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    after_await: bool,
) -> None:
    async def broken(*args: object) -> None:
        if after_await:
            await asyncio.sleep(0.01)
        raise RuntimeError("a bug")

    monkeypatch.setitem(server_module.HANDLERS, 12, broken)  # Heartbeat
    victim = await connect(kafka_server)
    bystander = await connect(kafka_server)
    try:
        victim.send(
            HeartbeatRequest(group_id="g", generation_id=1, member_id="m", group_instance_id=None)
        )
        assert await victim.reader.read() == b""  # closed, nothing sent
        assert (await bystander.request(metadata())).brokers[0].node_id == 0
        assert "closing the connection" in caplog.text
        assert kafka_server.metrics["handler_errors"] == 1
    finally:
        await victim.close()
        await bystander.close()
