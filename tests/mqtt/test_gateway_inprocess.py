"""The MQTT gateway in this process, on a real log and broker: records of other protocols reach
MQTT subscribers, MQTT publishes reach AMQP-style bindings, authentication, flow control, the
Receive Maximum window, the clean-session queue limit."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as PahoProperties

from core.api import BrokerAPI
from core.broker import Node
from core.delivery import Delivery
from core.log import LogConfig, LogStore, names
from core.log import record as rec
from core.security import SecurityConfig, SecurityService
from gateway.mqtt.addresses import session_queue_name
from gateway.mqtt.codec import (
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    Properties,
    Puback,
    Publish,
    Subscribe,
    Subscription,
    encode,
)
from gateway.mqtt.hub import MqttOptions
from gateway.mqtt.reason_codes import ReasonCode
from gateway.mqtt.server import MQTTServer

from .clients import unique

TIMEOUT = 5.0


@pytest.fixture
async def broker(tmp_path: Path) -> AsyncIterator[Node]:
    store = LogStore(LogConfig(tmp_path / "data", durability="async"))
    await store.start()
    broker = Node(store)
    await broker.start()
    yield broker
    await broker.close()
    await store.aclose()


_apis: weakref.WeakKeyDictionary[Node, BrokerAPI] = weakref.WeakKeyDictionary()


def api_of(broker: Node) -> BrokerAPI:
    """One Broker API per broker, as braid/server.py has: its listeners share one MQTT hub."""
    api = _apis.get(broker)
    if api is None:
        api = _apis[broker] = BrokerAPI(broker)
    return api


async def start_server(broker: Node, options: MqttOptions | None = None) -> MQTTServer:
    server = MQTTServer(api_of(broker), options=options)
    await server.start("127.0.0.1", 0)
    return server


@pytest.fixture
async def server(broker: Node) -> AsyncIterator[MQTTServer]:
    server = await start_server(broker)
    yield server
    await server.close()


def port_of(server: MQTTServer) -> int:
    assert server.address is not None
    return server.address[1]


class AsyncRaw:
    """A raw MQTT client on our codec, on the test's event loop."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, version: int
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.version = version
        self.decoder = MqttDecoder(version)
        self.pending: list[Packet] = []

    @classmethod
    async def open(cls, server: MQTTServer, version: int = 5) -> AsyncRaw:
        reader, writer = await asyncio.open_connection("127.0.0.1", port_of(server))
        return cls(reader, writer, version)

    def send(self, packet: Packet) -> None:
        self.writer.write(encode(packet, self.version))

    async def recv(self, timeout: float = TIMEOUT) -> Packet:
        while not self.pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            assert data, "closed"
            self.pending += self.decoder.feed(data)
        return self.pending.pop(0)

    async def nothing(self, wait: float = 0.3) -> None:
        try:
            packet = await self.recv(wait)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected {packet}")

    async def connect(self, client_id: str = "", **kwargs: object) -> Connack:
        self.send(Connect(client_id or unique("raw"), self.version, **kwargs))  # type: ignore[arg-type]
        connack = await self.recv()
        assert isinstance(connack, Connack)
        return connack

    async def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        self.send(Subscribe(1, (Subscription(topic_filter, qos),)))
        await self.recv()

    def close(self) -> None:
        self.writer.close()


def aio(server: MQTTServer, identifier: str | None = None, **kwargs: object) -> aiomqtt.Client:
    return aiomqtt.Client(
        "127.0.0.1",
        port_of(server),
        identifier=identifier or unique("aio"),
        protocol=aiomqtt.ProtocolVersion.V5,
        **kwargs,  # type: ignore[arg-type]
    )


async def first(client: aiomqtt.Client) -> aiomqtt.Message:
    async def take() -> aiomqtt.Message:
        async for message in client.messages:
            return message
        raise AssertionError("no message")

    return await asyncio.wait_for(take(), TIMEOUT)


# -- one log, three protocols ------------------------------------------------------------------


async def test_records_of_other_protocols_reach_mqtt_subscribers(
    broker: Node, server: MQTTServer
) -> None:
    base = unique("T")
    expiry = PahoProperties(PacketTypes.CONNECT)
    expiry.SessionExpiryInterval = 600
    async with (
        aio(server) as clean,
        aio(server, clean_start=False, properties=expiry) as persistent,
        aio(server) as everything,
    ):
        await clean.subscribe(f"{base}/+/b", qos=1)
        await persistent.subscribe(f"{base}/a/#", qos=1)
        await everything.subscribe("#", qos=0)
        # An AMQP publish to exchange T, routing key a.b, with a header.
        await broker.publish(
            base, b"from amqp", subject="a.b", headers=[("h", b"v")], protocol=rec.PROTOCOL_AMQP
        )
        for client in (clean, persistent, everything):
            message = await first(client)
            assert (str(message.topic), message.payload) == (f"{base}/a/b", b"from amqp")
            assert message.properties is not None
            assert message.properties.UserProperty == [("h", "v")]
        # A Kafka record keyed "dev.7" on topic K: its key is its routing key.
        await broker.publish(base, b"from kafka", key=b"dev.7", protocol=rec.PROTOCOL_KAFKA)
        message = await first(everything)
        assert (str(message.topic), message.payload) == (f"{base}/dev/7", b"from kafka")


async def test_mqtt_publish_reaches_amqp_bindings(broker: Node, server: MQTTServer) -> None:
    base = unique("X")
    queue, _ = await broker.declare_ack_queue("amqp-q", 0)
    await broker.bind(base, "topic", "a.*", ("amqp-q", 0))
    got: list[Delivery] = []
    queue.add_consumer("c", 10, got.append)
    async with aio(server) as pub:
        props = PahoProperties(PacketTypes.PUBLISH)
        props.UserProperty = [("k", "v")]
        props.ContentType = "text/plain"
        await pub.publish(f"{base}/a/b", b"to amqp", qos=1, properties=props)
        await pub.publish(f"{base}/a/b/c", b"not matched", qos=1)
    await asyncio.sleep(0.1)
    assert len(got) == 1
    message = got[0].message
    assert (message.topic, message.subject, message.address, message.body) == (
        base,
        "a.b",
        f"{base}/a/b",
        b"to amqp",
    )
    assert message.protocol == rec.PROTOCOL_MQTT
    assert ("k", b"v") in message.headers
    assert ("x-braid-content-type", b"text/plain") in message.headers


async def test_wildcard_first_level_persistent_session(server: MQTTServer) -> None:
    base = unique("w")
    sub = await AsyncRaw.open(server)
    await sub.connect("wfl", clean_start=False, properties=Properties(session_expiry_interval=60))
    await sub.subscribe(f"+/{base}", 1)
    async with aio(server) as pub:
        await pub.publish(f"any/{base}", b"hit", qos=1)
        await pub.publish(f"$any/{base}", b"miss", qos=1)
    packet = await sub.recv()
    assert isinstance(packet, Publish)
    assert (packet.topic, packet.payload) == (f"any/{base}", b"hit")
    sub.send(Puback(packet.packet_id or 0))
    await sub.nothing()
    sub.close()


# -- authentication and limits -----------------------------------------------------------------


async def test_authentication(broker: Node) -> None:
    # The broker's user store decides (no anonymous clients here, even from loopback).
    security = SecurityService(broker.metadata, SecurityConfig(anonymous="never"))
    await security.put_user("dev", password="secret")
    server = MQTTServer(BrokerAPI(broker, security))
    await server.start("127.0.0.1", 0)
    try:
        for username, password, code in (
            ("dev", b"secret", 0x00),
            ("dev", b"wrong", 0x86),
            ("nobody", b"secret", 0x86),
            (None, None, 0x87),
        ):
            client = await AsyncRaw.open(server)
            connack = await client.connect(username=username, password=password)
            assert connack.reason_code == code
            client.close()
        v3 = await AsyncRaw.open(server, version=4)
        assert (await v3.connect(username="dev", password=b"wrong")).reason_code == 0x04
        v3.close()
    finally:
        await server.close()


async def test_flow_control_holds_publishes(broker: Node, server: MQTTServer) -> None:
    topic = unique("flow")
    sub = await AsyncRaw.open(server)
    await sub.connect()
    await sub.subscribe(topic)
    pub = await AsyncRaw.open(server)
    await pub.connect()
    broker.flow.set_pressure("test", True)
    pub.send(Publish(topic, b"held", 1, packet_id=1))
    await sub.nothing()
    await pub.nothing()
    broker.flow.set_pressure("test", False)
    assert isinstance(await pub.recv(), Puback)
    packet = await sub.recv()
    assert isinstance(packet, Publish)
    assert packet.payload == b"held"
    sub.close()
    pub.close()


async def test_receive_maximum_window(server: MQTTServer) -> None:
    topic = unique("rm")
    sub = await AsyncRaw.open(server)
    await sub.connect(properties=Properties(receive_maximum=2))
    await sub.subscribe(topic, 1)
    async with aio(server) as pub:
        for i in range(5):
            await pub.publish(topic, str(i).encode(), qos=1)
        got = [await sub.recv(), await sub.recv()]
        await sub.nothing()  # two in flight at most [MQTT-3.3.4-9]
        for packet in got:
            assert isinstance(packet, Publish)
            sub.send(Puback(packet.packet_id or 0))
        rest = [await sub.recv() for _ in range(2)]
        assert [p.payload for p in got + rest] == [b"0", b"1", b"2", b"3"]  # type: ignore[union-attr]
    sub.close()


async def test_clean_session_queue_limit(broker: Node) -> None:
    server = await start_server(broker, MqttOptions(max_queued_messages=3))
    try:
        topic = unique("ql")
        sub = await AsyncRaw.open(server)
        await sub.connect(properties=Properties(receive_maximum=1))
        await sub.subscribe(topic, 1)
        pub = await AsyncRaw.open(server)
        await pub.connect()
        for i in range(10):
            pub.send(Publish(topic, str(i).encode(), 1, packet_id=i + 1))
        for _ in range(10):
            await pub.recv()
        first_packet = await sub.recv()
        assert isinstance(first_packet, Publish)
        await sub.nothing()
        assert server.metrics["messages_dropped"] == 6  # 1 in flight + 3 queued
        sub.close()
        pub.close()
    finally:
        await server.close()


async def test_server_keep_alive(broker: Node) -> None:
    server = await start_server(broker, MqttOptions(max_keepalive=10))
    try:
        for asked, granted in ((0, 10), (100, 10), (5, None)):
            client = await AsyncRaw.open(server)
            connack = await client.connect(keep_alive=asked)
            assert connack.properties.server_keep_alive == granted
            client.close()
    finally:
        await server.close()


async def test_kafka_record_batches_reach_clean_subscribers(
    broker: Node, server: MQTTServer
) -> None:
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    topic = unique("K")
    await broker.declare_topic(topic)
    builder = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for delta, key in enumerate((b"dev.1", b"dev.2", b"other")):
        builder.append(delta, timestamp=0, key=key, value=b"v" + key, headers=[("h", b"1")])
    batch = bytes(builder.build())
    async with aio(server) as sub:
        await sub.subscribe(f"{topic}/dev/+", qos=1)
        await broker.publish_batch(topic, 0, batch, 3)  # a Kafka producer's batch, as stored
        got = [await first(sub), await first(sub)]
        assert [(str(m.topic), m.payload) for m in got] == [
            (f"{topic}/dev/1", b"vdev.1"),
            (f"{topic}/dev/2", b"vdev.2"),
        ]


async def test_an_ended_persistent_session_leaves_no_queue_on_disk(
    broker: Node, server: MQTTServer
) -> None:
    """A persistent session's queue, index included, goes when the session ends (here: the
    client comes back with Clean Start); a new session under the same id starts empty."""
    base = unique("gone")
    client_id = unique("sess")
    expiry = PahoProperties(PacketTypes.CONNECT)
    expiry.SessionExpiryInterval = 600
    queue_name = session_queue_name(client_id)
    queue_dir = names.queue_dir(broker.shard.store.data_dir, queue_name, 0)
    async with aio(server, identifier=client_id, clean_start=False, properties=expiry) as sub:
        await sub.subscribe(f"{base}/#", qos=1)
        async with aio(server) as pub:
            await pub.publish(f"{base}/a", b"kept", qos=1)
        message = await first(sub)
        assert message.payload == b"kept"
    assert queue_dir.is_dir()  # the offline session keeps its queue
    async with aio(server, identifier=client_id, clean_start=True, properties=expiry) as again:
        assert not queue_dir.exists()  # the old session ended: its index went with it
        await again.subscribe(f"{base}/#", qos=1)
        async with aio(server) as pub:
            await pub.publish(f"{base}/b", b"new", qos=1)
        message = await first(again)
        assert message.payload == b"new"
    queue = broker.ack_queue(queue_name)
    assert queue is not None
    assert broker.shard.store.queue_bounds(queue_name, 0) == (0, 1)  # the new queue starts at 0


async def test_packets_before_a_malformed_one_in_the_same_read_are_handled(
    server: MQTTServer,
) -> None:
    """One read holding a PUBLISH and then a malformed packet: the decoder returns the PUBLISH
    and keeps the error (``MqttDecoder.error``); the server handles the PUBLISH, then answers
    the error with DISCONNECT 0x81 and closes."""
    sub = await AsyncRaw.open(server)
    await sub.connect()
    await sub.subscribe("ordered/t")
    pub = await AsyncRaw.open(server)
    await pub.connect()
    # A PINGREQ with fixed header flags 1: malformed [MQTT-2.1.3-1].
    pub.writer.write(encode(Publish("ordered/t", b"first", 1, packet_id=1), 5) + b"\xc1\x00")
    data = b""
    while chunk := await asyncio.wait_for(pub.reader.read(65536), TIMEOUT):
        data += chunk  # until the server closes
    replies = pub.decoder.feed(data)
    disconnect = replies[-1]
    assert isinstance(disconnect, Disconnect), replies
    assert disconnect.reason_code == ReasonCode.MALFORMED_PACKET
    assert "MQTT-2.1.3-1" in (disconnect.properties.reason_string or "")
    delivered = await sub.recv()
    assert isinstance(delivered, Publish)
    assert delivered.payload == b"first"
    pub.close()
    sub.close()
