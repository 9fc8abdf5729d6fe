"""Tag filters with the real clients against ``braid serve`` (docs/mapping.md, "Tags"): a plain
MQTT 5 subscription with user property ``tag-filter`` (clean and persistent sessions, across a
restart), and a Kafka consumer group's broker-side filter (``[kafka.group_tag_filters]``)
read by aiokafka and confluent-kafka, next to a group without a filter that gets everything.

Every protocol publishes the records of ``TAGGED`` (the Kafka ones in one RecordBatch, so the
broker has to re-encode the batch for a filtered group)."""

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
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as CTopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from tests.braid_process import BraidProcess, interop_braid
from tests.interop.test_features import TAGGED, publish_tagged_amqp_and_mqtt

TIMEOUT = 30.0
QUIET_S = 1.0  # nothing more arrives within this after the expected records

PROTOCOLS = ("kafka", "amqp", "mqtt")
RECORDS = len(TAGGED) * len(PROTOCOLS)
# Groups with a filter in the config file (one per client library: groups are broker-wide).
AIOKAFKA_GROUP = "tagged-aiokafka"
CONFLUENT_GROUP = "tagged-confluent"
CONFIG = f"""
[kafka.group_tag_filters]
"{AIOKAFKA_GROUP}" = "TagA || TagB"
"{CONFLUENT_GROUP}" = "TagA || TagB"
"""


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    yield from interop_braid(tmp_path_factory.mktemp("braid-tag-filters"), CONFIG)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def expected(*suffixes: str) -> set[bytes]:
    return {f"{p}-{s}".encode() for p in PROTOCOLS for s in suffixes}


# -- publishing ----------------------------------------------------------------------------------


async def declare_topic(braid: BraidProcess, topic: str) -> None:
    connection = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel()
        await channel.declare_exchange(topic, aio_pika.ExchangeType.TOPIC, durable=True)
    finally:
        await connection.close()


async def publish_tagged(braid: BraidProcess, topic: str) -> None:
    """Each protocol publishes the records of TAGGED, payload ``<protocol>-<suffix>``; the
    Kafka ones as one batch."""
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all", linger_ms=200)
    await producer.start()
    try:
        sent = []
        for suffix, tags in TAGGED.items():
            headers = [("x-braid-tags", tags.encode())] if tags else []
            sent.append(
                await producer.send(
                    topic, f"kafka-{suffix}".encode(), key=b"k.1", headers=headers, partition=0
                )
            )
        offsets = [(await future).offset for future in sent]
        assert offsets == list(range(offsets[0], offsets[0] + len(TAGGED)))
    finally:
        await producer.stop()
    await publish_tagged_amqp_and_mqtt(braid, topic)


# -- MQTT ----------------------------------------------------------------------------------------


def mqtt_client(
    braid: BraidProcess, client_id: str, *, expiry: int = 0, clean_start: bool = True
) -> tuple[mqtt.Client, queue.Queue[mqtt.MQTTMessage]]:
    messages: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, m: messages.put(m)
    connected: queue.Queue[object] = queue.Queue()
    client.on_connect = lambda *args: connected.put(args)
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    if expiry:
        props.SessionExpiryInterval = expiry
    client.connect("127.0.0.1", braid.mqtt_port, clean_start=clean_start, properties=props)
    client.loop_start()
    connected.get(timeout=TIMEOUT)
    return client, messages


async def mqtt_subscribe(
    client: mqtt.Client, topic_filter: str, tag_filter: str | None, identifier: int
) -> None:
    subscribed: queue.Queue[object] = queue.Queue()
    client.on_subscribe = lambda *args: subscribed.put(args)
    props = Properties(PacketTypes.SUBSCRIBE)  # type: ignore[no-untyped-call]
    props.SubscriptionIdentifier = identifier
    if tag_filter is not None:
        props.UserProperty = [("tag-filter", tag_filter)]
    client.subscribe(topic_filter, qos=1, properties=props)
    await asyncio.to_thread(subscribed.get, timeout=TIMEOUT)


def mqtt_stop(client: mqtt.Client) -> None:
    client.disconnect()
    client.loop_stop()


async def mqtt_take(messages: queue.Queue[mqtt.MQTTMessage], count: int) -> dict[bytes, list[int]]:
    """``count`` messages (no more): payload -> its subscription identifiers, sorted."""
    got = [await asyncio.to_thread(messages.get, timeout=TIMEOUT) for _ in range(count)]
    with pytest.raises(queue.Empty):
        await asyncio.to_thread(messages.get, timeout=QUIET_S)
    by_payload: dict[bytes, list[int]] = {}
    for message in got:
        payload = bytes(message.payload)
        assert payload not in by_payload, f"{payload!r} delivered twice"
        ids = getattr(message.properties, "SubscriptionIdentifier", [])
        by_payload[payload] = sorted(ids if isinstance(ids, list) else [ids])
    return by_payload


async def test_mqtt_plain_subscriptions_with_tag_filters(braid: BraidProcess) -> None:
    """A plain subscription with ``tag-filter`` gets only the records with one of its tags, in
    a clean session (live) and a persistent one (its queue); a session whose other matching
    subscription has no filter gets every record once, with the identifiers of the
    subscriptions that take it; a subscriber without a filter gets everything."""
    topic = unique("mqtt-tags")
    await declare_topic(braid, topic)
    clean, clean_messages = mqtt_client(braid, unique("clean"))
    persistent, persistent_messages = mqtt_client(
        braid, unique("persistent"), expiry=300, clean_start=True
    )
    overlap, overlap_messages = mqtt_client(braid, unique("overlap"), expiry=300)
    overlap_live, overlap_live_messages = mqtt_client(braid, unique("overlap-live"))
    everything, everything_messages = mqtt_client(braid, unique("all"))
    try:
        await mqtt_subscribe(clean, f"{topic}/#", "TagB", 1)
        await mqtt_subscribe(persistent, f"{topic}/#", "TagA || TagB", 1)
        for client in (overlap, overlap_live):
            await mqtt_subscribe(client, f"{topic}/#", "TagA", 1)
            await mqtt_subscribe(client, f"{topic}/k/+", None, 2)
        await mqtt_subscribe(everything, f"{topic}/#", None, 1)
        await publish_tagged(braid, topic)

        # All at once: each take's quiet second (nothing more arrives) overlaps the others'.
        (
            clean_got,
            persistent_got,
            overlap_got,
            overlap_live_got,
            everything_got,
        ) = await asyncio.gather(
            mqtt_take(clean_messages, 3),
            mqtt_take(persistent_messages, 6),
            mqtt_take(overlap_messages, RECORDS),
            mqtt_take(overlap_live_messages, RECORDS),
            mqtt_take(everything_messages, RECORDS),
        )
        assert set(clean_got) == expected("bc")
        assert set(persistent_got) == expected("a", "bc")
        for got in (overlap_got, overlap_live_got):
            assert got == {
                payload: [1, 2] if payload.endswith(b"-a") else [2] for payload in expected(*TAGGED)
            }
        assert set(everything_got) == expected(*TAGGED)

        # Subscribing again replaces the filter: now TagC.
        await mqtt_subscribe(persistent, f"{topic}/#", "TagC", 1)
        await publish_tagged(braid, topic)
        got = await mqtt_take(persistent_messages, 6)
        assert set(got) == expected("bc", "c")
    finally:
        for client in (clean, persistent, overlap, overlap_live, everything):
            mqtt_stop(client)


async def test_mqtt_tag_filter_of_a_persistent_session_survives_a_restart(
    tmp_path: Path,
) -> None:
    """The filter is part of the session's durable state: records published while the session
    is offline, after a broker restart, are filtered when it comes back."""
    topic = unique("mqtt-restart")
    client_id = unique("durable")
    data_dir = tmp_path / "data"
    with BraidProcess(tmp_path, listeners=("amqp", "mqtt", "kafka"), data_dir=data_dir) as braid:
        await declare_topic(braid, topic)
        client, _ = mqtt_client(braid, client_id, expiry=3600)
        await mqtt_subscribe(client, f"{topic}/#", "TagA || TagC", 7)
        mqtt_stop(client)
    with BraidProcess(tmp_path, listeners=("amqp", "mqtt", "kafka"), data_dir=data_dir) as braid:
        await publish_tagged(braid, topic)
        client, messages = mqtt_client(braid, client_id, expiry=3600, clean_start=False)
        try:
            got = await mqtt_take(messages, 9)
            assert got == {payload: [7] for payload in expected("a", "bc", "c")}
        finally:
            mqtt_stop(client)


# -- Kafka ---------------------------------------------------------------------------------------


async def aiokafka_consume(
    braid: BraidProcess, topic: str, group: str, client_id: str, count: int
) -> tuple[AIOKafkaConsumer, set[bytes]]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=braid.kafka_bootstrap,
        group_id=group,
        client_id=client_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    await consumer.start()
    got: list[bytes] = []
    async with asyncio.timeout(TIMEOUT):
        while len(got) < count:
            batch = await consumer.getmany(timeout_ms=500)
            got += [
                record.value for records in batch.values() for record in records if record.value
            ]
    more = await consumer.getmany(timeout_ms=int(QUIET_S * 1000))
    assert not any(more.values()), more
    assert len(got) == len(set(got)), got
    return consumer, set(got)


async def test_kafka_group_tag_filter_with_aiokafka(braid: BraidProcess) -> None:
    """A group with ``TagA || TagB`` in ``[kafka.group_tag_filters]`` gets only the matching
    records (the Kafka batch re-encoded, AMQP and MQTT records skipped by the index), moves past
    the others and commits the end offset; a group without a filter gets everything."""
    topic = unique("kafka-tags")
    await declare_topic(braid, topic)
    await publish_tagged(braid, topic)
    partition = TopicPartition(topic, 0)
    filtered, got = await aiokafka_consume(
        braid, topic, AIOKAFKA_GROUP, "tagged-aiokafka-client", 6
    )
    plain, everything = await aiokafka_consume(
        braid, topic, unique("plain"), "plain-aiokafka-client", RECORDS
    )
    try:
        assert got == expected("a", "bc")
        assert everything == expected(*TAGGED)
        assert await filtered.position(partition) == RECORDS
        await filtered.commit()
        assert await filtered.committed(partition) == RECORDS
        # More records while both consume: the filtered group still gets only its tags.
        await publish_tagged(braid, topic)
        more: list[bytes] = []
        async with asyncio.timeout(TIMEOUT):
            while len(more) < 6:
                batch = await filtered.getmany(timeout_ms=500)
                more += [r.value for records in batch.values() for r in records if r.value]
        assert set(more) == expected("a", "bc")
        assert len(more) == 6
        quiet = await filtered.getmany(timeout_ms=int(QUIET_S * 1000))
        assert not any(quiet.values())
        assert await filtered.position(partition) == 2 * RECORDS
    finally:
        await filtered.stop()
        await plain.stop()


def confluent_consume(
    braid: BraidProcess, topic: str, group: str, client_id: str, count: int
) -> tuple[Consumer, set[bytes]]:
    consumer = Consumer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "group.id": group,
            "client.id": client_id,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    got: list[bytes] = []
    polls = int(TIMEOUT / 0.5)
    for _ in range(polls):
        if len(got) >= count:
            break
        message = consumer.poll(0.5)
        if message is None:
            continue
        if message.error() is not None:
            raise KafkaException(message.error())
        value = message.value()
        if value:
            got.append(value)
    assert len(got) == count, got
    extra = consumer.poll(QUIET_S)
    assert extra is None, extra.value()
    assert len(got) == len(set(got)), got
    return consumer, set(got)


async def test_kafka_group_tag_filter_with_confluent_kafka(braid: BraidProcess) -> None:
    """The same with librdkafka (confluent-kafka): its own connection for fetches, its own
    empty-batch handling; the committed offset is past the skipped records."""
    topic = unique("kafka-tags-rd")
    await declare_topic(braid, topic)
    await publish_tagged(braid, topic)
    filtered, got = await asyncio.to_thread(
        confluent_consume, braid, topic, CONFLUENT_GROUP, "tagged-rdkafka-client", 6
    )
    plain, everything = await asyncio.to_thread(
        confluent_consume, braid, topic, unique("plain"), "plain-rdkafka-client", RECORDS
    )
    partition = CTopicPartition(topic, 0)
    try:
        assert got == expected("a", "bc")
        assert everything == expected(*TAGGED)
        # librdkafka's position is past the last record it handed out (mqtt-bc, offset 9),
        # not past the gap after it, as for a compacted topic.
        (position,) = filtered.position([partition])
        assert position.offset == RECORDS - 2
        await asyncio.to_thread(filtered.commit, asynchronous=False)
    finally:
        await asyncio.to_thread(filtered.close)
        await asyncio.to_thread(plain.close)
    # A new member of the group starts at the committed offset: the gap, then only the new
    # matching records; nothing seen before comes again.
    await publish_tagged(braid, topic)
    filtered, got = await asyncio.to_thread(
        confluent_consume, braid, topic, CONFLUENT_GROUP, "tagged-rdkafka-client", 6
    )
    try:
        assert got == expected("a", "bc")
        (position,) = filtered.position([partition])
        assert position.offset == 2 * RECORDS - 2
        await asyncio.to_thread(filtered.commit, asynchronous=False)
        (committed,) = await asyncio.to_thread(filtered.committed, [partition], 10.0)
        assert committed.offset == 2 * RECORDS - 2
    finally:
        await asyncio.to_thread(filtered.close)
