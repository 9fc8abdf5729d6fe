"""Cross-protocol delivery with the real clients (docs/mapping.md): publisher {aiokafka, aio-pika,
paho-mqtt} x consumer {aiokafka, aio-pika, paho-mqtt} against one ``braid serve``: payload
(binary, empty, large), key / routing key / topic levels, headers and properties, order of 1,000
records per key; then delay per protocol."""

from __future__ import annotations

import asyncio
import queue
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aio_pika
import paho.mqtt.client as mqtt
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.structs import TopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.braid_process import BraidProcess

PROTOCOLS = ("kafka", "amqp", "mqtt")
ORDERED = 1000
LARGE = 1 << 20  # 1 MiB
# MQTT's default Maximum Packet Size is 1 MiB for the whole packet: the largest payload that fits.
MQTT_LARGE = LARGE - 1024
TIMEOUT = 30.0


@dataclass
class Got:
    payload: bytes
    key: str  # Kafka key / AMQP routing key / MQTT levels after the first, as "a.b"
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    correlation: bytes | None = None
    reply_to: str | None = None


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path: Path = tmp_path_factory.mktemp("braid-interop")
    with BraidProcess(path, listeners=("amqp", "mqtt", "kafka")) as process:
        yield process


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# -- consumers -----------------------------------------------------------------------------------


class Consumer:
    async def start(self, braid: BraidProcess, topic: str) -> None: ...
    async def take(self, count: int) -> list[Got]:
        raise NotImplementedError

    async def stop(self) -> None: ...


class KafkaConsumer(Consumer):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=braid.kafka_bootstrap,
            enable_auto_commit=False,
            max_partition_fetch_bytes=4 * LARGE,
            fetch_max_bytes=8 * LARGE,
        )
        await self.consumer.start()
        self.consumer.assign([TopicPartition(topic, 0)])
        await self.consumer.seek_to_end(TopicPartition(topic, 0))

    async def take(self, count: int) -> list[Got]:
        got: list[Got] = []
        async with asyncio.timeout(TIMEOUT):
            while len(got) < count:
                batches = await self.consumer.getmany(timeout_ms=200)
                for records in batches.values():
                    for r in records:
                        headers = {n: v.decode(errors="replace") for n, v in r.headers}
                        got.append(
                            Got(
                                r.value or b"",
                                (r.key or b"").decode(),
                                headers,
                                headers.get("x-braid-content-type"),
                                (headers.get("x-braid-correlation-id") or "").encode() or None,
                                headers.get("x-braid-reply-to"),
                            )
                        )
        return got

    async def stop(self) -> None:
        await self.consumer.stop()


class AmqpConsumer(Consumer):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        self.connection = await aio_pika.connect(braid.amqp_url)
        channel = await self.connection.channel()
        await channel.set_qos(prefetch_count=2000)
        exchange = await channel.get_exchange(topic)
        self.queue = await channel.declare_queue(unique("q"), exclusive=True)
        await self.queue.bind(exchange, "k.*")
        self.messages: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()
        await self.queue.consume(self.messages.put)

    async def take(self, count: int) -> list[Got]:
        got: list[Got] = []
        async with asyncio.timeout(TIMEOUT):
            while len(got) < count:
                m = await self.messages.get()
                await m.ack()
                headers = {
                    name: value.decode() if isinstance(value, bytes) else str(value)
                    for name, value in (m.headers or {}).items()
                }
                got.append(
                    Got(
                        m.body,
                        m.routing_key or "",
                        headers,
                        m.content_type,
                        m.correlation_id.encode() if m.correlation_id else None,
                        m.reply_to,
                    )
                )
        return got

    async def stop(self) -> None:
        await self.connection.close()


class MqttConsumer(Consumer):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        self.topic = topic
        self.messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.max_inflight_messages_set(1000)
        subscribed = queue.Queue[object]()
        self.client.on_message = lambda _c, _u, m: self.messages.put(m)
        self.client.on_subscribe = lambda *args: subscribed.put(args)
        self.client.connect("127.0.0.1", braid.mqtt_port, clean_start=True)
        self.client.loop_start()
        self.client.subscribe(f"{topic}/k/+", qos=1)
        await asyncio.to_thread(subscribed.get, timeout=TIMEOUT)

    async def take(self, count: int) -> list[Got]:
        got: list[Got] = []
        deadline = time.monotonic() + TIMEOUT
        while len(got) < count:
            m = await asyncio.to_thread(
                self.messages.get, timeout=max(0.01, deadline - time.monotonic())
            )
            props = m.properties
            user = dict(getattr(props, "UserProperty", []) or [])
            levels = m.topic.split("/")
            assert levels[0] == self.topic
            got.append(
                Got(
                    bytes(m.payload),
                    ".".join(levels[1:]),
                    user,
                    getattr(props, "ContentType", None),
                    getattr(props, "CorrelationData", None),
                    getattr(props, "ResponseTopic", None),
                )
            )
        return got

    async def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


CONSUMERS: dict[str, type[Consumer]] = {
    "kafka": KafkaConsumer,
    "amqp": AmqpConsumer,
    "mqtt": MqttConsumer,
}


# -- publishers ----------------------------------------------------------------------------------


@dataclass
class Out:
    payload: bytes
    key: str = "k.1"
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str | None = None
    correlation: bytes | None = None
    reply_to: str | None = None


class Publisher:
    async def start(self, braid: BraidProcess, topic: str) -> None: ...
    async def send(self, messages: list[Out]) -> None: ...
    async def stop(self) -> None: ...


class KafkaPublisher(Publisher):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        self.topic = topic
        self.producer = AIOKafkaProducer(
            bootstrap_servers=braid.kafka_bootstrap, acks="all", max_request_size=4 * LARGE
        )
        await self.producer.start()

    async def send(self, messages: list[Out]) -> None:
        futures = []
        for m in messages:
            headers = [(k, v.encode()) for k, v in m.headers.items()]
            if m.content_type:
                headers.append(("x-braid-content-type", m.content_type.encode()))
            if m.correlation:
                headers.append(("x-braid-correlation-id", m.correlation))
            if m.reply_to:
                headers.append(("x-braid-reply-to", m.reply_to.encode()))
            futures.append(
                await self.producer.send(
                    self.topic, m.payload, key=m.key.encode(), headers=headers, partition=0
                )
            )
        await asyncio.gather(*futures)

    async def stop(self) -> None:
        await self.producer.stop()


class AmqpPublisher(Publisher):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        self.connection = await aio_pika.connect(braid.amqp_url)
        channel = await self.connection.channel(publisher_confirms=True)
        self.exchange = await channel.get_exchange(topic)

    async def send(self, messages: list[Out]) -> None:
        for m in messages:
            await self.exchange.publish(
                aio_pika.Message(
                    m.payload,
                    headers=dict(m.headers),
                    content_type=m.content_type,
                    correlation_id=m.correlation.decode() if m.correlation else None,
                    reply_to=m.reply_to,
                ),
                routing_key=m.key,
            )

    async def stop(self) -> None:
        await self.connection.close()


class MqttPublisher(Publisher):
    async def start(self, braid: BraidProcess, topic: str) -> None:
        self.topic = topic
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.max_inflight_messages_set(100)
        self.client.connect("127.0.0.1", braid.mqtt_port)
        self.client.loop_start()

    async def send(self, messages: list[Out]) -> None:
        infos = []
        for m in messages:
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if m.headers:
                props.UserProperty = list(m.headers.items())
            if m.content_type:
                props.ContentType = m.content_type
            if m.correlation:
                props.CorrelationData = m.correlation
            if m.reply_to:
                props.ResponseTopic = m.reply_to
            name = f"{self.topic}/{m.key.replace('.', '/')}"
            infos.append(self.client.publish(name, m.payload, qos=1, properties=props))
        for info in infos:
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            assert info.is_published()

    async def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


PUBLISHERS: dict[str, type[Publisher]] = {
    "kafka": KafkaPublisher,
    "amqp": AmqpPublisher,
    "mqtt": MqttPublisher,
}


async def declare_topic_exchange(braid: BraidProcess, name: str) -> None:
    connection = await aio_pika.connect(braid.amqp_url)
    channel = await connection.channel()
    await channel.declare_exchange(name, aio_pika.ExchangeType.TOPIC, durable=True)
    await connection.close()


# -- the matrix ----------------------------------------------------------------------------------


@pytest.mark.parametrize("consumer_name", PROTOCOLS)
@pytest.mark.parametrize("publisher_name", PROTOCOLS)
async def test_pair(braid: BraidProcess, publisher_name: str, consumer_name: str) -> None:
    topic = unique(f"{publisher_name}2{consumer_name}")
    await declare_topic_exchange(braid, topic)
    consumer = CONSUMERS[consumer_name]()
    publisher = PUBLISHERS[publisher_name]()
    await consumer.start(braid, topic)
    await publisher.start(braid, topic)
    try:
        large = MQTT_LARGE if "mqtt" in (publisher_name, consumer_name) else LARGE
        binary = bytes(range(256)) * 4
        shaped = [
            Out(
                binary,
                "k.1",
                {"h1": "v1", "app": "interop"},
                "application/octet-stream",
                b"corr-1",
                "replies",
            ),
            Out(b"", "k.2"),
            Out(bytes([7]) * large, "k.3"),
        ]
        await publisher.send(shaped)
        got = await consumer.take(len(shaped))
        assert [g.payload for g in got] == [m.payload for m in shaped]
        assert [g.key for g in got] == ["k.1", "k.2", "k.3"]
        first = got[0]
        assert first.headers.get("h1") == "v1"
        assert first.headers.get("app") == "interop"
        assert first.content_type == "application/octet-stream"
        assert first.correlation == b"corr-1"
        assert first.reply_to == "replies"

        ordered = [Out(b"%d" % i, "k.order") for i in range(ORDERED)]
        await publisher.send(ordered)
        got = await consumer.take(ORDERED)
        assert [g.payload for g in got] == [m.payload for m in ordered]
    finally:
        await publisher.stop()
        await consumer.stop()


# -- features, once per protocol -------------------------------------------------------------------

DELAY_MS = 1500


async def test_delay_from_each_protocol(braid: BraidProcess) -> None:
    """AMQP x-delay on an x-delayed-message exchange, MQTT $delayed/<s>/<topic>, Kafka header
    x-delay (ms): each arrives at an AMQP queue no earlier than its delay."""
    topic = unique("delay")
    connection = await aio_pika.connect(braid.amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.declare_exchange(
        topic, "x-delayed-message", durable=True, arguments={"x-delayed-type": "topic"}
    )
    sink = await channel.declare_queue(unique("q"), exclusive=True)
    await sink.bind(exchange, "k.*")
    arrivals: asyncio.Queue[tuple[bytes, float]] = asyncio.Queue()

    async def on_message(message: aio_pika.abc.AbstractIncomingMessage) -> None:
        await message.ack()
        await arrivals.put((message.body, time.monotonic()))

    await sink.consume(on_message)
    sent: dict[bytes, float] = {}

    sent[b"amqp"] = time.monotonic()
    await exchange.publish(
        aio_pika.Message(b"amqp", headers={"x-delay": DELAY_MS}), routing_key="k.1"
    )
    mqtt_client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    mqtt_client.connect("127.0.0.1", braid.mqtt_port)
    mqtt_client.loop_start()
    sent[b"mqtt"] = time.monotonic()
    info = mqtt_client.publish(f"$delayed/{DELAY_MS // 1000 + 1}/{topic}/k/1", b"mqtt", qos=1)
    await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
    await producer.start()
    sent[b"kafka"] = time.monotonic()
    await producer.send_and_wait(
        topic, b"kafka", key=b"k.1", headers=[("x-delay", str(DELAY_MS).encode())], partition=0
    )
    await producer.stop()
    try:
        async with asyncio.timeout(TIMEOUT):
            for _ in range(3):
                body, at = await arrivals.get()
                assert at - sent[body] >= DELAY_MS / 1000 - 0.1, body
    finally:
        mqtt_client.disconnect()
        mqtt_client.loop_stop()
        await connection.close()


async def test_wildcard_first_level_mqtt_subscription_sees_every_protocol(
    braid: BraidProcess,
) -> None:
    """An MQTT persistent session subscribed to ``+/k/#`` (a GLOBAL_SOURCE binding) receives
    AMQP and Kafka publishes too (route hook)."""
    topic = unique("wild")
    await declare_topic_exchange(braid, topic)
    messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    subscribed: queue.Queue[object] = queue.Queue()
    client = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id=unique("wild"),
        protocol=mqtt.MQTTv311,
        clean_session=False,
    )
    client.on_message = lambda _c, _u, m: messages.put(m)
    client.on_subscribe = lambda *args: subscribed.put(args)
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    client.subscribe("+/k/#", qos=1)
    await asyncio.to_thread(subscribed.get, timeout=TIMEOUT)
    publisher = AmqpPublisher()
    await publisher.start(braid, topic)
    await publisher.send([Out(b"from-amqp", "k.a")])
    await publisher.stop()
    kafka = KafkaPublisher()
    await kafka.start(braid, topic)
    await kafka.send([Out(b"from-kafka", "k.b"), Out(b"not-matching", "x.b")])
    await kafka.stop()
    try:
        got = {}
        for _ in range(2):
            m = await asyncio.to_thread(messages.get, timeout=TIMEOUT)
            got[m.payload] = m.topic
        assert got == {b"from-amqp": f"{topic}/k/a", b"from-kafka": f"{topic}/k/b"}
        with pytest.raises(queue.Empty):
            messages.get(timeout=0.5)
    finally:
        client.disconnect()
        client.loop_stop()


async def test_kafka_batch_routes_per_record_key(braid: BraidProcess) -> None:
    """One Kafka batch whose records have different keys: an AMQP queue bound with ``k.*``
    gets only the matching records (the batch is stored once, indexed into the queue with a
    per-record selection)."""
    topic = unique("batch")
    await declare_topic_exchange(braid, topic)
    consumer = AmqpConsumer()
    await consumer.start(braid, topic)
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, linger_ms=50)
    await producer.start()
    futures = [
        await producer.send(topic, b"%d" % i, key=b"k.1" if i % 2 else b"z.1", partition=0)
        for i in range(20)
    ]
    await asyncio.gather(*futures)
    await producer.stop()
    try:
        got = await consumer.take(10)
        assert [g.payload for g in got] == [b"%d" % i for i in range(1, 20, 2)]
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await consumer.messages.get()
    finally:
        await consumer.stop()
