"""A restart (clean, or kill -9) between produce and consume loses nothing acknowledged and
keeps committed offsets; malformed frames close only their own connection."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import TopicPartition
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.request import MetadataRequest

from tests.braid_process import BraidProcess
from tests.kafka.conftest import create_topic, unique
from tests.kafka.raw import RawClient, encode_request

N = 300


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid"), listeners=("kafka",)) as process:
        yield process


async def produce(bootstrap: str, topic: str, count: int, start: int = 0) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [
            await producer.send(topic, b"%d" % i, partition=i % 2)
            for i in range(start, start + count)
        ]
        await producer.flush()
        for future in futures:
            await future
    finally:
        await producer.stop()


async def consume(
    bootstrap: str,
    topic: str,
    group: str,
    expected: int,
    *,
    commit_after: int | None = None,
    isolation_level: str = "read_uncommitted",
) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        async with asyncio.timeout(20):
            while len(got) < expected:
                for tp, messages in (await consumer.getmany(timeout_ms=300)).items():
                    for message in messages:
                        got.append(message.value)  # type: ignore[arg-type]
                        if commit_after is not None and len(got) <= commit_after:
                            await consumer.commit({tp: message.offset + 1})
    finally:
        await consumer.stop()
    return got


@pytest.mark.parametrize("how", ["sigterm", "kill9"])
async def test_restart_loses_nothing_and_keeps_committed_offsets(
    braid: BraidProcess, how: str
) -> None:
    topic = unique(f"restart-{how}")
    group = unique(f"restart-{how}")
    bootstrap = braid.kafka_bootstrap
    await create_topic(bootstrap, topic, 2)
    await produce(bootstrap, topic, N)
    # Consume and commit a part, in a group.
    first = await consume(bootstrap, topic, group, 100, commit_after=100)
    assert len(first) >= 100

    if how == "sigterm":
        braid.restart()
    else:
        braid.kill9()
        braid.start()

    # Everything produced is there, from the start, to a new group.
    everything = await consume(bootstrap, topic, unique("restart-all"), N)
    assert sorted(everything) == sorted(b"%d" % i for i in range(N))

    # The group resumes after its committed offsets: only what it had not committed.
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        committed = [await consumer.committed(TopicPartition(topic, p)) for p in (0, 1)]
    finally:
        await consumer.stop()
    assert sum(c or 0 for c in committed) == 100
    rest = await consume(bootstrap, topic, group, N - 100, commit_after=N)
    assert len(rest) == N - 100
    assert set(rest) | set(first[:100]) == {b"%d" % i for i in range(N)}

    # New records go after the old ones.
    await produce(bootstrap, topic, 10, start=N)
    more = await consume(bootstrap, topic, group, 10)
    assert sorted(more) == sorted(b"%d" % i for i in range(N, N + 10))


def metadata_works(braid: BraidProcess, raw: RawClient | None = None) -> bool:
    own = raw is None
    raw = raw or RawClient(braid.host, braid.kafka_port)
    try:
        response = raw.request(
            MetadataRequest(
                topics=None,
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )
        return response.brokers[0].port == braid.kafka_port
    finally:
        if own:
            raw.close()


@pytest.mark.parametrize(
    "garbage",
    [
        pytest.param(struct.pack(">i", -1), id="negative-size"),
        pytest.param(struct.pack(">i", 200 * 1024 * 1024), id="oversize"),
        pytest.param(struct.pack(">i", 3) + b"abc", id="too-short"),
        # Metadata v9 whose body stops in the middle of the topics array.
        pytest.param(
            struct.pack(">ihhih", 13, 3, 9, 7, 1) + b"x" + b"\x00" + b"\x05\x02", id="truncated"
        ),
        # An API key no Kafka has.
        pytest.param(struct.pack(">ihhih", 10, 999, 0, 7, -1), id="unknown-api"),
    ],
)
def test_malformed_frame_closes_only_that_connection(braid: BraidProcess, garbage: bytes) -> None:
    bystander = RawClient(braid.host, braid.kafka_port)
    offender = RawClient(braid.host, braid.kafka_port)
    try:
        assert metadata_works(braid, bystander)
        offender.send_bytes(garbage)
        assert offender.closed_by_peer()
        assert metadata_works(braid, bystander)
        assert metadata_works(braid)
        assert "closing the connection" in braid.stderr()
    finally:
        bystander.close()
        offender.close()


def test_api_versions_newer_than_ours_gets_the_kip_511_answer(braid: BraidProcess) -> None:
    sock = socket.create_connection((braid.host, braid.kafka_port), timeout=10)
    try:
        request = bytearray(
            encode_request(
                ApiVersionsRequest(client_software_name="t", client_software_version="1"), 5
            )
        )
        struct.pack_into(">h", request, 6, 99)  # api_version 99
        sock.sendall(request)
        raw = RawClient.__new__(RawClient)
        raw.sock = sock
        correlation_id, body = raw.receive(18, 0)
        assert correlation_id == 5
        assert body.error_code == ErrorCode.unsupported_version
        assert [(k.api_key, k.min_version, k.max_version) for k in body.api_keys] == [(18, 0, 4)]
    finally:
        sock.close()


async def test_transaction_cut_by_a_restart_is_aborted_and_its_producer_fenced(
    braid: BraidProcess,
) -> None:
    topic = unique("restart-txn")
    bootstrap = braid.kafka_bootstrap
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id=unique("txn"))
    await producer.start()
    try:
        async with producer.transaction():
            await producer.send_and_wait(topic, b"committed")
        await producer.begin_transaction()
        await producer.send_and_wait(topic, b"cut by the restart")
        braid.restart()
        with pytest.raises(KafkaError):
            await producer.commit_transaction()
    finally:
        with contextlib.suppress(KafkaError):
            await producer.stop()
    # The transaction's batch stays in the partition (aborted: read_uncommitted reads it, as
    # with Kafka); read_committed consumers drop it by the aborted-transactions list.
    committed = await consume(
        bootstrap, topic, unique("restart-txn"), 1, isolation_level="read_committed"
    )
    assert committed == [b"committed"]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        # The committed record and its COMMIT marker, the cut record and the ABORT marker the
        # restart wrote for it.
        partition = TopicPartition(topic, 0)
        assert await consumer.end_offsets([partition]) == {partition: 4}
    finally:
        await consumer.stop()
    assert "was open at shutdown" in braid.stderr()
