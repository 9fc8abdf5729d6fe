"""Kafka transactions with Kafka's semantics (issue 17 item 14), with the real clients against
``braid serve``: the last stable offset holds read_committed consumers while a transaction is
open (non-transactional records after it included), read_uncommitted ones read past it;
records keep the offsets the producer was told; control batches take offsets the clients skip;
aborted records are dropped by read_committed consumers through the Fetch response's
aborted-transactions list (confluent-kafka, aiokafka, kafka-python) and read by
read_uncommitted ones; an MQTT subscriber sees committed records only; a restart aborts the
transaction it cut and releases the partition.
"""

from __future__ import annotations

import asyncio
import queue
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition
from confluent_kafka import Consumer, Producer
from kafka import KafkaConsumer
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique

TIMEOUT = 20.0


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("braid-txn-lso")
    with BraidProcess(path, listeners=("kafka", "mqtt")) as process:
        yield process


def transactional_producer(braid: BraidProcess) -> Producer:
    producer = Producer(
        {"bootstrap.servers": braid.kafka_bootstrap, "transactional.id": unique("lso-txn")}
    )
    producer.init_transactions(10)
    return producer


def produce_told(
    producer: Producer, topic: str, values: list[bytes], key: bytes | None = None
) -> list[int]:
    """Produce ``values`` to partition 0 and return the offsets the producer was told."""
    told: list[int] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        told.append(message.offset())

    for value in values:
        producer.produce(topic, value, key=key, partition=0, on_delivery=delivered)
    assert producer.flush(10) == 0
    assert len(told) == len(values)
    return told


def plain_producer(braid: BraidProcess) -> Producer:
    return Producer({"bootstrap.servers": braid.kafka_bootstrap, "enable.idempotence": True})


def confluent_consume(
    braid: BraidProcess, topic: str, isolation: str, expected: int
) -> list[tuple[int, bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "group.id": unique("lso-group"),
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            got.append((message.offset(), message.value()))
    finally:
        consumer.close()
    return got


async def offsets(braid: BraidProcess, topic: str) -> tuple[int, int]:
    """(read_committed latest = the LSO, read_uncommitted latest = the high watermark)."""
    partition = TopicPartition(topic, 0)
    found = []
    for isolation in ("read_committed", "read_uncommitted"):
        consumer = AIOKafkaConsumer(
            bootstrap_servers=braid.kafka_bootstrap, isolation_level=isolation
        )
        await consumer.start()
        try:
            found.append((await consumer.end_offsets([partition]))[partition])
        finally:
            await consumer.stop()
    return found[0], found[1]


async def test_an_open_transaction_holds_read_committed_at_the_last_stable_offset(
    braid: BraidProcess,
) -> None:
    topic = unique("lso-open")
    txn = transactional_producer(braid)
    txn.begin_transaction()
    assert produce_told(txn, topic, [b"in-txn"]) == [0]
    # A non-transactional record produced after the open transaction's first record.
    assert produce_told(plain_producer(braid), topic, [b"after"]) == [1]

    assert await offsets(braid, topic) == (0, 2)  # LSO 0, HW 2 (Kafka's numbers)
    uncommitted = confluent_consume(braid, topic, "read_uncommitted", 2)
    assert uncommitted == [(0, b"in-txn"), (1, b"after")]

    held = AIOKafkaConsumer(
        bootstrap_servers=braid.kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await held.start()
    try:
        partition = TopicPartition(topic, 0)
        held.assign([partition])
        # Nothing at or past the LSO, the record produced after the transaction included.
        assert await held.getmany(timeout_ms=1000) == {}
        assert await held.position(partition) == 0

        txn.commit_transaction(10)
        assert await offsets(braid, topic) == (3, 3)  # the COMMIT marker took offset 2

        got: list[tuple[int, bytes]] = []
        async with asyncio.timeout(TIMEOUT):
            while len(got) < 2:
                for messages in (await held.getmany(timeout_ms=200)).values():
                    got += [(m.offset, m.value) for m in messages]  # type: ignore[misc]
        # The offsets the producers were told; the marker's offset skipped by the client.
        assert got == [(0, b"in-txn"), (1, b"after")]
        assert await held.position(partition) == 3
    finally:
        await held.stop()


async def test_aborted_records_are_dropped_by_read_committed_clients(
    braid: BraidProcess,
) -> None:
    topic = unique("lso-abort")
    txn = transactional_producer(braid)
    txn.begin_transaction()
    assert produce_told(txn, topic, [b"aborted-1", b"aborted-2"]) == [0, 1]
    txn.abort_transaction(10)  # ABORT marker at 2
    assert produce_told(plain_producer(braid), topic, [b"plain"]) == [3]
    txn.begin_transaction()
    assert produce_told(txn, topic, [b"committed"]) == [4]
    txn.commit_transaction(10)  # COMMIT marker at 5
    assert await offsets(braid, topic) == (6, 6)

    wanted = [(3, b"plain"), (4, b"committed")]
    # librdkafka filters by the aborted-transactions list.
    assert confluent_consume(braid, topic, "read_committed", 2) == wanted
    # read_uncommitted reads the aborted records too, as from Kafka; never the markers.
    assert confluent_consume(braid, topic, "read_uncommitted", 4) == [
        (0, b"aborted-1"),
        (1, b"aborted-2"),
        *wanted,
    ]

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=braid.kafka_bootstrap,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    got: list[tuple[int, bytes]] = []
    try:
        async with asyncio.timeout(TIMEOUT):
            while len(got) < 2:
                for messages in (await consumer.getmany(timeout_ms=200)).values():
                    got += [(m.offset, m.value) for m in messages]  # type: ignore[misc]
    finally:
        await consumer.stop()
    assert got == wanted

    def kafka_python() -> list[tuple[int, bytes]]:
        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=braid.kafka_bootstrap,
            isolation_level="read_committed",
            auto_offset_reset="earliest",
            consumer_timeout_ms=int(TIMEOUT * 1000),
        )
        found: list[tuple[int, bytes]] = []
        try:
            for message in consumer:
                found.append((message.offset, message.value))
                if len(found) == 2:
                    break
        finally:
            consumer.close()
        return found

    assert await asyncio.to_thread(kafka_python) == wanted


async def test_an_mqtt_subscriber_sees_committed_records_only(braid: BraidProcess) -> None:
    topic = unique("lso-mqtt")
    messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    subscribed: queue.Queue[object] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, m: messages.put(m)
    client.on_subscribe = lambda *args: subscribed.put(args)
    client.connect("127.0.0.1", braid.mqtt_port, clean_start=True)
    client.loop_start()
    try:
        client.subscribe(f"{topic}/k/+", qos=1)
        await asyncio.to_thread(subscribed.get, timeout=TIMEOUT)
        txn = transactional_producer(braid)
        txn.begin_transaction()
        produce_told(txn, topic, [b"aborted"], key=b"k.a")
        txn.abort_transaction(10)
        txn.begin_transaction()
        produce_told(txn, topic, [b"committed"], key=b"k.b")
        produce_told(plain_producer(braid), topic, [b"plain"], key=b"k.c")
        first = await asyncio.to_thread(messages.get, timeout=TIMEOUT)
        # The aborted record never came (it was stored first), nor the open one yet.
        assert (first.topic, first.payload) == (f"{topic}/k/c", b"plain")
        assert messages.empty()
        txn.commit_transaction(10)
        second = await asyncio.to_thread(messages.get, timeout=TIMEOUT)
        assert (second.topic, second.payload) == (f"{topic}/k/b", b"committed")
    finally:
        client.disconnect()
        client.loop_stop()


async def test_a_restart_aborts_the_open_transaction_and_releases_the_partition(
    braid: BraidProcess,
) -> None:
    topic = unique("lso-restart")
    txn = transactional_producer(braid)
    txn.begin_transaction()
    assert produce_told(txn, topic, [b"cut-1", b"cut-2"]) == [0, 1]
    assert produce_told(plain_producer(braid), topic, [b"after"]) == [2]
    assert await offsets(braid, topic) == (0, 3)
    braid.kill9()
    braid.start()
    # The transaction's state came back from the log and the restart aborted it: an ABORT
    # marker at 3, the partition stable again.
    assert await offsets(braid, topic) == (4, 4)
    assert confluent_consume(braid, topic, "read_committed", 1) == [(2, b"after")]
    assert "was open at shutdown" in braid.stderr()
