"""Core features from each protocol with the real clients (docs/mapping.md, "Features from each
protocol"): tags set by every protocol and filtered by an AMQP queue argument and an MQTT shared
subscription; dead letters of an AMQP queue read by Kafka and MQTT consumers; the RabbitMQ MQTT
plugin compatibility option (``[broker] mqtt_exchange = "amq.topic"``)."""

from __future__ import annotations

import asyncio
import queue
import uuid
from collections.abc import Iterator
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

TIMEOUT = 30.0
QUIET_S = 0.7  # nothing more arrives within this after the expected records


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path: Path = tmp_path_factory.mktemp("braid-features")
    with BraidProcess(path, listeners=("amqp", "mqtt", "kafka")) as process:
        yield process


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def mqtt_client(braid: BraidProcess) -> tuple[mqtt.Client, queue.Queue[mqtt.MQTTMessage]]:
    messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, m: messages.put(m)
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    return client, messages


async def mqtt_subscribe(
    client: mqtt.Client, topic_filter: str, properties: Properties | None = None
) -> None:
    subscribed: queue.Queue[object] = queue.Queue()
    client.on_subscribe = lambda *args: subscribed.put(args)
    client.subscribe(topic_filter, qos=1, properties=properties)
    await asyncio.to_thread(subscribed.get, timeout=TIMEOUT)


def mqtt_stop(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


async def mqtt_take(messages: queue.Queue[mqtt.MQTTMessage], count: int) -> list[mqtt.MQTTMessage]:
    got = [await asyncio.to_thread(messages.get, timeout=TIMEOUT) for _ in range(count)]
    with pytest.raises(queue.Empty):
        await asyncio.to_thread(messages.get, timeout=QUIET_S)
    return got


# -- tags ----------------------------------------------------------------------------------------

# payload suffix -> the x-braid-tags value it is published with (None: no tags)
TAGGED = {"a": "TagA", "bc": "TagC,TagB", "c": "TagC", "none": None}


async def publish_tagged(braid: BraidProcess, topic: str) -> None:
    """Each protocol publishes the four records of TAGGED, payload ``<protocol>-<suffix>``."""
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
    await producer.start()
    try:
        for suffix, tags in TAGGED.items():
            headers = [("x-braid-tags", tags.encode())] if tags else []
            await producer.send_and_wait(
                topic, f"kafka-{suffix}".encode(), key=b"k.1", headers=headers, partition=0
            )
    finally:
        await producer.stop()
    await publish_tagged_amqp_and_mqtt(braid, topic)


async def publish_tagged_amqp_and_mqtt(braid: BraidProcess, topic: str) -> None:
    """AMQP and MQTT 5 each publish the four records of TAGGED, payload ``<protocol>-<suffix>``."""
    connection = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topic)
        for suffix, tags in TAGGED.items():
            await exchange.publish(
                aio_pika.Message(
                    f"amqp-{suffix}".encode(), headers={"x-braid-tags": tags} if tags else {}
                ),
                routing_key="k.1",
            )
    finally:
        await connection.close()
    client, _ = mqtt_client(braid)
    try:
        for suffix, tags in TAGGED.items():
            props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
            if tags:
                props.UserProperty = [("x-braid-tags", tags)]
            info = client.publish(f"{topic}/k/1", f"mqtt-{suffix}".encode(), 1, properties=props)
            await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
    finally:
        mqtt_stop(client)


def expected(*suffixes: str) -> set[bytes]:
    return {f"{p}-{s}".encode() for p in ("kafka", "amqp", "mqtt") for s in suffixes}


async def test_tags_from_each_protocol_filtered_by_amqp_queue_and_mqtt_share_group(
    braid: BraidProcess,
) -> None:
    """``x-braid-tags`` from a Kafka record header, an AMQP header and an MQTT 5 user property
    become the record's tags; an AMQP queue with ``x-braid-tag-filter: "TagA || TagB"`` and an
    MQTT shared subscription with user property ``tag-filter: TagB`` get only matching records."""
    topic = unique("tags")
    connection = await aio_pika.connect(braid.amqp_url)
    channel = await connection.channel()
    exchange = await channel.declare_exchange(topic, aio_pika.ExchangeType.TOPIC, durable=True)
    filtered = await channel.declare_queue(
        unique("q"), exclusive=True, arguments={"x-braid-tag-filter": "TagA || TagB"}
    )
    await filtered.bind(exchange, "#")
    everything = await channel.declare_queue(unique("q"), exclusive=True)
    await everything.bind(exchange, "#")
    client, mqtt_messages = mqtt_client(braid)
    props = Properties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
    props.UserProperty = [("tag-filter", "TagB")]
    await mqtt_subscribe(client, f"$share/{unique('g')}/{topic}/#", props)
    try:
        await publish_tagged(braid, topic)

        async def drain(q: aio_pika.abc.AbstractQueue, count: int) -> set[bytes]:
            got: set[bytes] = set()
            async with q.iterator() as it:
                async with asyncio.timeout(TIMEOUT):
                    async for message in it:
                        await message.ack()
                        got.add(message.body)
                        if len(got) == count:
                            break
            return got

        assert await drain(everything, 12) == expected(*TAGGED)
        assert await drain(filtered, 6) == expected("a", "bc")
        assert await filtered.get(fail=False) is None  # the others were skipped
        got = await mqtt_take(mqtt_messages, 3)
        assert {bytes(m.payload) for m in got} == expected("bc")
    finally:
        mqtt_stop(client)
        await connection.close()


# -- dead letters --------------------------------------------------------------------------------


async def test_dead_letters_read_by_kafka_and_mqtt(braid: BraidProcess) -> None:
    """An AMQP queue with ``x-dead-letter-exchange`` dead-letters a rejected record; a Kafka
    consumer of the DLX's topic and an MQTT subscriber of ``<dlx>/#`` read it, reason in the
    headers (``x-first-death-reason``, ``x-death``)."""
    topic = unique("work")
    dlx = unique("dlx")
    connection = await aio_pika.connect(braid.amqp_url)
    channel = await connection.channel(publisher_confirms=True)
    exchange = await channel.declare_exchange(topic, aio_pika.ExchangeType.TOPIC, durable=True)
    await channel.declare_exchange(dlx, aio_pika.ExchangeType.TOPIC, durable=True)
    work = await channel.declare_queue(
        unique("q"), exclusive=True, arguments={"x-dead-letter-exchange": dlx}
    )
    await work.bind(exchange, "#")
    client, mqtt_messages = mqtt_client(braid)
    await mqtt_subscribe(client, f"{dlx}/#")
    consumer = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = TopicPartition(dlx, 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        await exchange.publish(
            aio_pika.Message(b"poison", headers={"app": "interop"}), routing_key="job.1"
        )
        async with asyncio.timeout(TIMEOUT):
            async with work.iterator() as it:
                async for message in it:
                    await message.reject(requeue=False)
                    break
        async with asyncio.timeout(TIMEOUT):
            record = await consumer.getone()
        assert record.value == b"poison"
        headers = dict(record.headers)
        assert headers["x-first-death-reason"] == b"rejected"
        assert b'"reason": "rejected"' in headers["x-death"] or b'"rejected"' in headers["x-death"]
        assert headers["app"] == b"interop"
        (m,) = await mqtt_take(mqtt_messages, 1)
        assert bytes(m.payload) == b"poison"
        assert m.topic == f"{dlx}/job/1"
        user = dict(getattr(m.properties, "UserProperty", []) or [])
        assert user["x-first-death-reason"] == "rejected"
        assert "rejected" in user["x-death"]
    finally:
        await consumer.stop()
        mqtt_stop(client)
        await connection.close()


# -- RabbitMQ MQTT plugin compatibility ----------------------------------------------------------


async def test_mqtt_publish_appears_on_amq_topic(tmp_path: Path) -> None:
    """With ``[broker] mqtt_exchange = "amq.topic"``, paho's ``sensors/kitchen/temp`` reaches
    an aio-pika queue bound to ``amq.topic`` with ``sensors.kitchen.*``."""
    config = tmp_path / "braid.toml"
    config.write_text('[broker]\nmqtt_exchange = "amq.topic"\n')
    with BraidProcess(
        tmp_path, listeners=("amqp", "mqtt"), extra_args=("--config", str(config))
    ) as braid:
        connection = await aio_pika.connect(braid.amqp_url)
        try:
            channel = await connection.channel()
            amq_topic = await channel.get_exchange("amq.topic")
            sink = await channel.declare_queue(unique("q"), exclusive=True)
            await sink.bind(amq_topic, "sensors.kitchen.*")
            client, _ = mqtt_client(braid)
            try:
                info = client.publish("sensors/kitchen/temp", b"21.5", qos=1)
                await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
                info = client.publish("sensors/garage/temp", b"9.0", qos=1)
                await asyncio.to_thread(info.wait_for_publish, TIMEOUT)
            finally:
                mqtt_stop(client)
            async with asyncio.timeout(TIMEOUT):
                async with sink.iterator() as it:
                    async for message in it:
                        await message.ack()
                        break
            assert message.body == b"21.5"
            assert message.routing_key == "sensors.kitchen.temp"
            await asyncio.sleep(QUIET_S)
            assert await sink.get(fail=False) is None
        finally:
            await connection.close()
