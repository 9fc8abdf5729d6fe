"""Transactional half messages with check-back (RocketMQ semantics) from each protocol's real
client (docs/mapping.md, "Transactions and half messages"): a publish with header
``x-braid-txn-id`` is a half message, invisible until a record to ``braid.txn`` commits it
(from another connection); an undecided one is checked back on ``braid.txn.check`` and the
producer's answer decides it; a pending half survives a restart."""

from __future__ import annotations

import asyncio
import queue
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aio_pika
import paho.mqtt.client as mqtt
import pytest
from aio_pika.exceptions import DeliveryError
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.braid_process import BraidProcess, interop_braid

TIMEOUT = 30.0
QUIET_S = 1.0  # a half stays invisible at least this long
LONG_MS = "60000"  # x-braid-txn-timeout-ms of halves that must not be checked back
SHORT_MS = "300"  # ... of halves that should be
CONFIG = """[broker]
txn_check_timeout_ms = 1000
txn_max_checks = 10
txn_check_call_timeout_ms = 4000
"""


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    yield from interop_braid(tmp_path_factory.mktemp("braid-half"), CONFIG)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def half_headers(txn: str, group: str, timeout_ms: str) -> dict[str, str]:
    return {
        "x-braid-txn-id": txn,
        "x-braid-producer-group": group,
        "x-braid-txn-timeout-ms": timeout_ms,
    }


# -- Kafka (aiokafka) ----------------------------------------------------------------------------


async def kafka_producer(braid: BraidProcess) -> AIOKafkaProducer:
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
    await producer.start()
    return producer


async def kafka_consumer(braid: BraidProcess, topic: str) -> AIOKafkaConsumer:
    consumer = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    partition = TopicPartition(topic, 0)
    consumer.assign([partition])
    await consumer.seek_to_beginning(partition)
    return consumer


async def kafka_values(consumer: AIOKafkaConsumer, seconds: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        batches = await consumer.getmany(timeout_ms=200)
        got.extend(r.value for records in batches.values() for r in records)
    return got


async def kafka_create(braid: BraidProcess, topic: str) -> None:
    """Make ``topic`` exist (auto-created by a plain record, read back to be sure)."""
    producer = await kafka_producer(braid)
    try:
        await producer.send_and_wait(topic, b"start", partition=0)
    finally:
        await producer.stop()


async def test_kafka_half_committed_and_rolled_back_from_another_connection(
    braid: BraidProcess,
) -> None:
    topic = unique("k-orders")
    await kafka_create(braid, topic)
    committed, rolled_back = unique("t"), unique("t")
    producer = await kafka_producer(braid)
    try:
        for txn, value in ((committed, b"k-commit"), (rolled_back, b"k-rollback")):
            headers = [(k, v.encode()) for k, v in half_headers(txn, "kg", LONG_MS).items()]
            meta = await producer.send_and_wait(
                topic, value, key=b"o.1", headers=headers, partition=0
            )
            assert meta.offset == -1  # a half gets its offset when committed
    finally:
        await producer.stop()
    consumer = await kafka_consumer(braid, topic)
    try:
        assert await kafka_values(consumer, QUIET_S) == [b"start"]
        other = await kafka_producer(braid)  # another connection decides
        try:
            await other.send_and_wait("braid.txn", b"commit", key=committed.encode())
            await other.send_and_wait("braid.txn", b"rollback", key=rolled_back.encode())
        finally:
            await other.stop()
        assert await kafka_values(consumer, QUIET_S * 2) == [b"k-commit"]
    finally:
        await consumer.stop()


async def test_kafka_producer_answers_check_back(braid: BraidProcess) -> None:
    topic, group, txn = unique("k-pay"), unique("kg"), unique("t")
    await kafka_create(braid, topic)
    checks = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap, enable_auto_commit=False)
    await checks.start()
    producer = await kafka_producer(braid)
    try:
        checks.assign([TopicPartition("braid.txn.check", 0)])
        await checks.seek_to_end(TopicPartition("braid.txn.check", 0))
        headers = [(k, v.encode()) for k, v in half_headers(txn, group, SHORT_MS).items()]
        await producer.send_and_wait(
            topic, b"k-checked", headers=[*headers, ("app", b"k")], partition=0
        )
        async with asyncio.timeout(TIMEOUT):
            while True:
                request = await checks.getone()
                if request.key == group.encode():
                    break
        request_headers = dict(request.headers)
        assert request_headers["x-braid-txn-id"] == txn.encode()
        assert request_headers["x-braid-correlation-id"] == txn.encode()
        assert request_headers["app"] == b"k"
        assert request.value == b"k-checked"  # the half's own record, as RocketMQ passes it
        await producer.send_and_wait("braid.txn", b"COMMIT_MESSAGE", key=txn.encode())
    finally:
        await producer.stop()
        await checks.stop()
    consumer = await kafka_consumer(braid, topic)
    try:
        assert await kafka_values(consumer, QUIET_S) == [b"start", b"k-checked"]
    finally:
        await consumer.stop()


# -- AMQP (aio-pika) -----------------------------------------------------------------------------


async def test_amqp_half_committed_and_rolled_back_from_another_connection(
    braid: BraidProcess,
) -> None:
    exchange_name = unique("a-orders")
    committed, rolled_back = unique("t"), unique("t")
    connection = await aio_pika.connect(braid.amqp_url)
    other = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC)
        orders = await channel.declare_queue(unique("q"), exclusive=True)
        await orders.bind(exchange, "o.#")
        for txn, body in ((committed, b"a-commit"), (rolled_back, b"a-rollback")):
            await exchange.publish(
                aio_pika.Message(body, headers=half_headers(txn, "ag", LONG_MS)), "o.1"
            )
        await asyncio.sleep(QUIET_S)
        assert await orders.get(fail=False) is None
        decide = await other.channel(publisher_confirms=True)
        txn_exchange = await decide.get_exchange("braid.txn")
        await txn_exchange.publish(aio_pika.Message(b"commit"), committed)
        await txn_exchange.publish(aio_pika.Message(b"rollback"), rolled_back)
        # deciding an unknown (or already decided) transaction is refused: a nack
        with pytest.raises(DeliveryError):
            await txn_exchange.publish(aio_pika.Message(b"commit"), rolled_back)
        async with asyncio.timeout(TIMEOUT):
            message = await orders.get()
        assert message.body == b"a-commit"
        assert message.routing_key == "o.1"
        await message.ack()
        await asyncio.sleep(QUIET_S)
        assert await orders.get(fail=False) is None
    finally:
        await other.close()
        await connection.close()


async def test_amqp_producer_answers_check_back(braid: BraidProcess) -> None:
    exchange_name, group, txn = unique("a-pay"), unique("ag"), unique("t")
    connection = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.declare_exchange(exchange_name, aio_pika.ExchangeType.TOPIC)
        payments = await channel.declare_queue(unique("q"), exclusive=True)
        await payments.bind(exchange, "#")
        checks = await channel.declare_queue(unique("checks"), exclusive=True)
        await checks.bind("braid.txn.check", group)
        await exchange.publish(
            aio_pika.Message(
                b"a-checked", headers={**half_headers(txn, group, SHORT_MS), "app": "a"}
            ),
            "p.1",
        )
        async with asyncio.timeout(TIMEOUT):
            async with checks.iterator() as it:
                async for request in it:
                    await request.ack()
                    break
        assert request.correlation_id == txn
        assert request.routing_key == group
        assert request.body == b"a-checked"
        assert request.headers["app"] == "a"
        assert await payments.get(fail=False) is None
        txn_exchange = await channel.get_exchange("braid.txn")
        await txn_exchange.publish(aio_pika.Message(b"commit"), request.correlation_id)
        async with asyncio.timeout(TIMEOUT):
            message = await payments.get()
        assert message.body == b"a-checked"
        await message.ack()
    finally:
        await connection.close()


# -- MQTT 5 (paho) -------------------------------------------------------------------------------


def mqtt_client(braid: BraidProcess) -> tuple[mqtt.Client, queue.Queue[mqtt.MQTTMessage]]:
    messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, m: messages.put(m)
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    return client, messages


async def mqtt_subscribe(client: mqtt.Client, topic_filter: str) -> None:
    subscribed: queue.Queue[object] = queue.Queue()
    client.on_subscribe = lambda *args: subscribed.put(args)
    client.subscribe(topic_filter, qos=1)
    await asyncio.to_thread(subscribed.get, timeout=TIMEOUT)


async def mqtt_publish(
    client: mqtt.Client, topic: str, payload: bytes, user: dict[str, str] | None = None
) -> None:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if user:
        props.UserProperty = list(user.items())
    info = client.publish(topic, payload, qos=1, properties=props)
    await asyncio.to_thread(info.wait_for_publish, TIMEOUT)


def mqtt_stop(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


async def mqtt_nothing(messages: queue.Queue[mqtt.MQTTMessage], seconds: float) -> None:
    try:
        found = await asyncio.to_thread(messages.get, timeout=seconds)
    except queue.Empty:
        return
    pytest.fail(f"unexpected message on {found.topic}: {found.payload!r}")


async def test_mqtt_half_committed_and_rolled_back_from_another_connection(
    braid: BraidProcess,
) -> None:
    """A clean-session subscriber (served live) sees a half only once it is committed."""
    topic = unique("m-orders")
    committed, rolled_back = unique("t"), unique("t")
    subscriber, seen = mqtt_client(braid)
    producer, _ = mqtt_client(braid)
    other, _ = mqtt_client(braid)
    try:
        await mqtt_subscribe(subscriber, f"{topic}/#")
        for txn, payload in ((committed, b"m-commit"), (rolled_back, b"m-rollback")):
            await mqtt_publish(producer, f"{topic}/o/1", payload, half_headers(txn, "mg", LONG_MS))
        await mqtt_nothing(seen, QUIET_S)
        await mqtt_publish(other, f"braid.txn/{committed}", b"commit")
        await mqtt_publish(other, f"braid.txn/{rolled_back}", b"rollback")
        message = await asyncio.to_thread(seen.get, timeout=TIMEOUT)
        assert (message.topic, bytes(message.payload)) == (f"{topic}/o/1", b"m-commit")
        await mqtt_nothing(seen, QUIET_S)
    finally:
        for client in (subscriber, producer, other):
            mqtt_stop(client)


async def test_mqtt_producer_answers_check_back(braid: BraidProcess) -> None:
    topic, group, txn = unique("m-pay"), unique("mg"), unique("t")
    subscriber, seen = mqtt_client(braid)
    producer, checks = mqtt_client(braid)
    try:
        await mqtt_subscribe(subscriber, f"{topic}/#")
        await mqtt_subscribe(producer, f"braid.txn.check/{group}")
        user = {**half_headers(txn, group, SHORT_MS), "app": "m"}
        await mqtt_publish(producer, f"{topic}/p/1", b"m-checked", user)
        request = await asyncio.to_thread(checks.get, timeout=TIMEOUT)
        assert request.topic == f"braid.txn.check/{group}"
        assert bytes(request.payload) == b"m-checked"
        correlation = bytes(request.properties.CorrelationData)  # type: ignore[union-attr]
        assert correlation == txn.encode()
        assert ("app", "m") in (request.properties.UserProperty or [])  # type: ignore[union-attr]
        assert seen.empty()
        await mqtt_publish(producer, f"braid.txn/{correlation.decode()}", b"commit")
        message = await asyncio.to_thread(seen.get, timeout=TIMEOUT)
        assert bytes(message.payload) == b"m-checked"
    finally:
        mqtt_stop(subscriber)
        mqtt_stop(producer)


async def test_mqtt_311_half_through_the_topic_prefix(braid: BraidProcess) -> None:
    """MQTT 3.1.1 has no user properties: ``$half/<group>/<txn id>/<topic>`` says the same."""
    topic, committed, rolled_back = unique("m311"), unique("t"), unique("t")
    subscriber, seen = mqtt_client(braid)
    old: list[mqtt.Client] = []
    try:
        await mqtt_subscribe(subscriber, f"{topic}/#")
        for _ in range(2):
            client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv311)
            client.connect("127.0.0.1", braid.mqtt_port)
            client.loop_start()
            old.append(client)
        producer, other = old
        for txn, payload in ((committed, b"v311-commit"), (rolled_back, b"v311-rollback")):
            info = producer.publish(f"$half/g311/{txn}/{topic}/a/b", payload, qos=1)
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            assert info.is_published()
        await mqtt_nothing(seen, QUIET_S)
        for txn, outcome in ((committed, b"commit"), (rolled_back, b"rollback")):
            info = other.publish(f"braid.txn/{txn}", outcome, qos=1)
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
        message = await asyncio.to_thread(seen.get, timeout=TIMEOUT)
        assert (message.topic, bytes(message.payload)) == (f"{topic}/a/b", b"v311-commit")
        await mqtt_nothing(seen, QUIET_S)
    finally:
        for client in (subscriber, *old):
            mqtt_stop(client)


# -- restart -------------------------------------------------------------------------------------


async def test_pending_halves_survive_restart(tmp_path: Path) -> None:
    """AMQP halves left pending over a restart: one is committed afterwards (over Kafka), the
    other is checked back again after the restart (read and answered over Kafka)."""
    config = tmp_path / "braid.toml"
    config.write_text(CONFIG)
    with BraidProcess(
        tmp_path, listeners=("amqp", "kafka"), extra_args=("--config", str(config))
    ) as braid:
        later, checked, group = unique("t"), unique("t"), unique("rg")
        connection = await aio_pika.connect(braid.amqp_url)
        try:
            channel = await connection.channel(publisher_confirms=True)
            exchange = await channel.declare_exchange("r-orders", aio_pika.ExchangeType.TOPIC)
            for txn, body, timeout in (
                (later, b"r-later", LONG_MS),
                (checked, b"r-checked", "2000"),
            ):
                await exchange.publish(
                    aio_pika.Message(body, headers=half_headers(txn, group, timeout)), "r.1"
                )
        finally:
            await connection.close()
        braid.restart()
        restarted_ms = time.time() * 1000
        producer = await kafka_producer(braid)
        checks = await kafka_consumer(braid, "braid.txn.check")
        try:
            await producer.send_and_wait("braid.txn", b"commit", key=later.encode())
            async with asyncio.timeout(TIMEOUT):
                while True:
                    request = await checks.getone()
                    if (
                        dict(request.headers).get("x-braid-txn-id") == checked.encode()
                        and request.timestamp >= restarted_ms
                    ):
                        break
            assert request.key == group.encode()
            await producer.send_and_wait("braid.txn", b"commit", key=checked.encode())
        finally:
            await checks.stop()
            await producer.stop()
        consumer = await kafka_consumer(braid, "r-orders")
        try:
            assert sorted(await kafka_values(consumer, QUIET_S)) == [b"r-checked", b"r-later"]
        finally:
            await consumer.stop()
