"""Interoperability: the real paho-mqtt client over a real socket against a minimal broker made
of this codec (paho's packets must decode, ours must be understood by paho), the examples of
the specifications, and (when installed) the Rust ``mqtt5`` codec in both directions."""

from __future__ import annotations

import socket
import threading
from typing import Any

import pytest

from gateway.mqtt._wire import decode_varint, encode_varint
from gateway.mqtt.codec import (
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    Packet,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
    encode,
    encode_properties,
    encode_publish,
)

from .cases import h

TIMEOUT = 10.0


class MiniBroker(threading.Thread):
    """Accepts one connection; decodes everything with ``MqttDecoder``; answers with ``encode``.
    After the SUBACK it delivers one QoS 1 PUBLISH of its own (``encode_publish``)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(TIMEOUT)
        self.port = self.listener.getsockname()[1]
        self.received: list[Any] = []
        self.raw: list[bytes] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            connection, _ = self.listener.accept()
            connection.settimeout(TIMEOUT)
            with connection:
                self.serve(connection)
        except BaseException as exc:  # reported by the test
            self.error = exc
        finally:
            self.listener.close()

    def serve(self, connection: socket.socket) -> None:
        decoder = MqttDecoder()
        while True:
            data = connection.recv(65536)
            if not data:
                return
            self.raw.append(data)
            for packet in decoder.feed(data):
                self.received.append(packet)
                reply = self.answer(packet, decoder.version or 4)
                if reply:
                    connection.sendall(reply)
                if isinstance(packet, Disconnect):
                    return

    def answer(self, packet: Packet, version: int) -> bytes:
        v5 = version == 5
        if isinstance(packet, Connect):
            # Properties are left out for 3.1.1 by the encoder.
            props = Properties(assigned_client_identifier="x", receive_maximum=100)
            return encode(Connack(False, 0, props), version)
        if isinstance(packet, Subscribe):
            suback = Suback(packet.packet_id, tuple(s.qos for s in packet.subscriptions))
            properties = b""
            if v5:
                properties = encode_properties(
                    Properties(
                        content_type="text/plain",
                        subscription_identifiers=(packet.subscription_identifier or 1,),
                        user_properties=(("from", "broker"),),
                    )
                )
            deliver = encode_publish(
                "a/from-broker", b"hello paho", 1, 100, False, False, properties, version
            )
            return encode(suback, version) + deliver
        if isinstance(packet, Publish) and packet.qos and packet.packet_id is not None:
            ack = Puback if packet.qos == 1 else Pubrec
            return encode(ack(packet.packet_id), version)
        if isinstance(packet, Pubrel):
            return encode(Pubcomp(packet.packet_id), version)
        if isinstance(packet, Unsubscribe):
            codes = tuple(0 for _ in packet.topic_filters) if v5 else ()
            return encode(Unsuback(packet.packet_id, codes), version)
        return b""


@pytest.mark.parametrize("version", [4, 5])
def test_paho_client_against_codec(version):
    import paho.mqtt.client as mqtt
    from paho.mqtt import properties as paho_properties
    from paho.mqtt.packettypes import PacketTypes

    PahoProperties: Any = paho_properties.Properties

    broker = MiniBroker()
    broker.start()
    v5 = version == 5
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id="paho-interop",
        protocol=mqtt.MQTTv5 if v5 else mqtt.MQTTv311,
        clean_session=None if v5 else True,
    )
    connected = threading.Event()
    subscribed = threading.Event()
    unsubscribed = threading.Event()
    delivered = threading.Event()
    published: list[int] = []
    all_published = threading.Event()
    messages = []

    def on_connect(_client, _userdata, _flags, reason_code, _properties):
        assert not reason_code.is_failure
        connected.set()

    def on_message(_client, _userdata, message):
        messages.append(message)
        delivered.set()

    def on_publish(_client, _userdata, mid, _reason_code, _properties):
        published.append(mid)
        if len(published) == 3:
            all_published.set()

    client.on_connect = on_connect
    client.on_subscribe = lambda *_args: subscribed.set()
    client.on_unsubscribe = lambda *_args: unsubscribed.set()
    client.on_message = on_message
    client.on_publish = on_publish
    client.username_pw_set("user", "secret")
    will_props = connect_props = subscribe_props = publish_props = None
    if v5:
        will_props = PahoProperties(PacketTypes.WILLMESSAGE)
        will_props.WillDelayInterval = 5
        connect_props = PahoProperties(PacketTypes.CONNECT)
        connect_props.SessionExpiryInterval = 60
        connect_props.UserProperty = [("k1", "v1"), ("k2", "v2")]
        subscribe_props = PahoProperties(PacketTypes.SUBSCRIBE)
        subscribe_props.SubscriptionIdentifier = 7
        publish_props = PahoProperties(PacketTypes.PUBLISH)
        publish_props.MessageExpiryInterval = 30
        publish_props.ContentType = "application/json"
        publish_props.CorrelationData = b"\x01\x02"
    client.will_set("will/topic", b"gone", qos=1, retain=True, properties=will_props)
    client.connect("127.0.0.1", broker.port, keepalive=30, properties=connect_props)
    client.loop_start()
    try:
        assert connected.wait(TIMEOUT)
        client.subscribe([("a/#", 1), ("b/+", 2)], properties=subscribe_props)
        assert subscribed.wait(TIMEOUT)
        assert delivered.wait(TIMEOUT)
        client.publish("a/q0", b"zero", 0)
        client.publish("a/q1", b'{"one": 1}', 1, properties=publish_props)
        client.publish("a/q2", b"two", 2, retain=True)
        assert all_published.wait(TIMEOUT)
        client.unsubscribe(["a/#", "b/+"])
        assert unsubscribed.wait(TIMEOUT)
        client.disconnect()
    finally:
        client.loop_stop()
    broker.join(TIMEOUT)
    assert broker.error is None, broker.error

    # What paho sent, as our decoder saw it.
    kinds = [type(packet).__name__ for packet in broker.received]
    assert kinds == [
        "Connect",
        "Subscribe",
        "Puback",  # paho acknowledging the broker's QoS 1 delivery
        "Publish",
        "Publish",
        "Publish",
        "Pubrel",
        "Unsubscribe",
        "Disconnect",
    ]
    connect, subscribe, puback, q0, q1, q2, pubrel, unsubscribe, _ = broker.received
    assert connect.client_id == "paho-interop"
    assert connect.protocol_level == version
    assert connect.keep_alive == 30
    assert (connect.username, connect.password) == ("user", b"secret")
    assert connect.will.topic == "will/topic"
    assert connect.will.payload == b"gone"
    assert (connect.will.qos, connect.will.retain) == (1, True)
    assert subscribe.subscriptions[0] == Subscription("a/#", 1)
    assert subscribe.subscriptions[1].topic_filter == "b/+"
    assert subscribe.subscriptions[1].qos == 2
    assert puback == Puback(100)
    assert (q0.topic, bytes(q0.payload), q0.qos, q0.packet_id) == ("a/q0", b"zero", 0, None)
    assert (q1.topic, bytes(q1.payload), q1.qos) == ("a/q1", b'{"one": 1}', 1)
    assert (q2.topic, bytes(q2.payload), q2.qos, q2.retain) == ("a/q2", b"two", 2, True)
    assert pubrel.packet_id == q2.packet_id
    assert unsubscribe.topic_filters == ("a/#", "b/+")
    if v5:
        assert connect.properties.session_expiry_interval == 60
        assert connect.properties.user_properties == (("k1", "v1"), ("k2", "v2"))
        assert connect.will.properties.will_delay_interval == 5
        assert subscribe.subscription_identifier == 7
        assert q1.properties.message_expiry_interval == 30
        assert q1.properties.content_type == "application/json"
        assert q1.properties.correlation_data == b"\x01\x02"

    # What we sent, as paho understood it.
    (message,) = messages
    assert (message.topic, message.payload, message.qos) == ("a/from-broker", b"hello paho", 1)
    if v5:
        assert message.properties.ContentType == "text/plain"
        assert message.properties.SubscriptionIdentifier == [7]
        assert message.properties.UserProperty == [("from", "broker")]

    # Our encoder writes paho's packets byte for byte.
    stream = b"".join(broker.raw)
    assert b"".join(encode(packet, version) for packet in broker.received) == stream


# The Variable Byte Integer examples of §1.5.5 (5.0) / §2.2.3 (3.1.1).
VARINT_EXAMPLES = [
    (0, h("00")),
    (127, h("7F")),
    (128, h("80 01")),
    (16_383, h("FF 7F")),
    (16_384, h("80 80 01")),
    (2_097_151, h("FF FF 7F")),
    (2_097_152, h("80 80 80 01")),
    (268_435_455, h("FF FF FF 7F")),
]


@pytest.mark.parametrize(("value", "data"), VARINT_EXAMPLES)
def test_spec_variable_byte_integer_examples(value, data):
    assert encode_varint(value) == data
    assert decode_varint(data, 0, len(data)) == (value, len(data))


def test_spec_3_1_1_connect_variable_header_example():
    """3.1.1 §3.1.2.10, Figure 3.6: protocol name, level 4, flags 0xCE, keep alive 10."""
    variable_header = h("00 04 'MQTT' 04 CE 00 0A")
    payload = h("00 01 'c' 00 01 'w' 00 01 'm' 00 01 'u' 00 01 'p'")
    data = bytes((0x10, len(variable_header + payload))) + variable_header + payload
    decoder = MqttDecoder()
    assert decoder.feed(data) == [
        Connect("c", 4, True, 10, "u", b"p", Will("w", b"m", qos=1, retain=False))
    ]


def test_spec_5_connect_variable_header_example():
    """5.0 §3.1.2.11, Figure 3-8: level 5, flags 0xC2, keep alive 10, Session Expiry 10."""
    variable_header = h("00 04 'MQTT' 05 C2 00 0A 05 11 00 00 00 0A")
    payload = h("00 01 'c' 00 01 'u' 00 01 'p'")
    data = bytes((0x10, len(variable_header + payload))) + variable_header + payload
    decoder = MqttDecoder()
    connect: Any
    (connect,) = decoder.feed(data)
    assert connect == Connect(
        "c", 5, True, 10, "u", b"p", properties=Properties(session_expiry_interval=10)
    )
    assert encode(connect, 5) == data


def test_mqtt5_wheel_packets_decode():
    """Packets written by the Rust ``mqtt5`` codec decode to the same fields."""
    import mqtt5

    publish = mqtt5.PublishPacket(
        "a/b",
        b"payload",
        qos=mqtt5.QoS.AT_LEAST_ONCE,
        packet_id=3,
        retain=True,
        message_expiry_interval=9,
        content_type="c",
        subscription_ids=[4, 5],
        user_properties=[("k", "v")],
    )
    subscribe = mqtt5.SubscribePacket(
        4,
        [mqtt5.TopicFilter("x/#", max_qos=mqtt5.QoS.AT_LEAST_ONCE, no_local=True)],
        subscription_id=11,
    )
    decoder = MqttDecoder(5)
    got = decoder.feed(
        publish.write()
        + mqtt5.PubAckPacket(3).write()
        + subscribe.write()
        + mqtt5.PingReqPacket().write()
    )
    assert got[0] == Publish(
        "a/b",
        b"payload",
        1,
        retain=True,
        packet_id=3,
        properties=Properties(
            message_expiry_interval=9,
            content_type="c",
            subscription_identifiers=(4, 5),
            user_properties=(("k", "v"),),
        ),
    )
    assert got[1] == Puback(3)
    assert got[2] == Subscribe(
        4,
        # mqtt5's TopicFilter defaults to retain_as_published=True
        (Subscription("x/#", 1, no_local=True, retain_as_published=True),),
        Properties(subscription_identifiers=(11,)),
    )
    assert len(got) == 4


def test_our_packets_decode_in_mqtt5_wheel():
    import mqtt5

    data = encode(
        Publish(
            "a/b",
            b"payload",
            2,
            packet_id=9,
            properties=Properties(response_topic="r", user_properties=(("k", "v"),)),
        ),
        5,
    )
    packet, used = mqtt5.read(memoryview(data))
    assert used == len(data)
    assert (packet.topic, packet.payload, packet.packet_id) == ("a/b", b"payload", 9)
    assert packet.response_topic == "r"
    assert packet.user_properties == [("k", "v")]
    data = encode(Connack(True, 0, Properties(receive_maximum=5)), 5)
    packet, used = mqtt5.read(memoryview(data))
    assert used == len(data)
    assert packet.session_present is True
    assert packet.receive_max == 5
