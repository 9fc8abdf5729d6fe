"""The wire, with a raw-socket client on our codec against a real ``braid serve``: topic aliases
both ways, limits (maximum packet size, keep alive), bad input closing only that connection
with the right reason code, CONNACK refusals."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from gateway.mqtt.codec import (
    Connack,
    Disconnect,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from tests.braid_process import BraidProcess

from .clients import Paho, RawClient, assert_clean_log, unique


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid-wire"), listeners=("mqtt",)) as process:
        yield process
    assert_clean_log(process)


@pytest.fixture
def port(braid: BraidProcess) -> int:
    return braid.mqtt_port


def subscribed(port: int, topic_filter: str, version: int = 5, **props: int) -> RawClient:
    client = RawClient(port, version)
    assert client.connect(unique("raw"), properties=Properties(**props)).reason_code == 0
    client.send(Subscribe(1, (Subscription(topic_filter, 1),)))
    assert isinstance(client.recv(), Suback)
    return client


def test_connack_properties(port: int) -> None:
    client = RawClient(port)
    connack = client.connect(unique("c"))
    assert connack.reason_code == 0
    assert not connack.session_present
    assert connack.properties.maximum_packet_size == 1 << 20
    assert connack.properties.topic_alias_maximum == 1024
    client.disconnect()


def test_topic_aliases_from_the_client(port: int) -> None:
    topic = unique("alias")
    with Paho(port) as sub:
        sub.connect()
        sub.subscribe(topic, 1)
        client = RawClient(port)
        client.connect(unique("a"))
        client.send(Publish(topic, b"set", 1, packet_id=1, properties=Properties(topic_alias=3)))
        client.send(Publish("", b"use", 1, packet_id=2, properties=Properties(topic_alias=3)))
        assert [type(client.recv()), type(client.recv())] == [Puback, Puback]
        got = sub.get_all(2)
        assert [(m.topic, m.payload) for m in got] == [(topic, b"set"), (topic, b"use")]
        client.send(Publish("", b"x", 0, properties=Properties(topic_alias=4)))  # never set
        packets = client.closed_after()
        assert isinstance(packets[-1], Disconnect)
        assert packets[-1].reason_code == 0x82


def test_topic_alias_above_maximum(port: int) -> None:
    client = RawClient(port)
    client.connect(unique("a"))
    client.send(Publish(unique("t"), b"x", 0, properties=Properties(topic_alias=5000)))
    packets = client.closed_after()
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x94)]  # type: ignore[union-attr]


def test_topic_aliases_to_the_client(port: int) -> None:
    topic = unique("alias-out")
    sub = subscribed(port, topic, topic_alias_maximum=5)
    with Paho(port) as pub:
        pub.connect()
        for payload in (b"1", b"2", b"3"):
            pub.publish(topic, payload, 0)
    first, second, third = (sub.recv() for _ in range(3))
    assert isinstance(first, Publish)
    assert isinstance(second, Publish)
    assert isinstance(third, Publish)
    alias = first.properties.topic_alias
    assert first.topic == topic
    assert alias
    assert (second.topic, second.properties.topic_alias) == ("", alias)  # [MQTT-3.3.2-12]
    assert (third.topic, third.payload) == ("", b"3")
    sub.disconnect()


def test_client_maximum_packet_size(port: int) -> None:
    topic = unique("small")
    sub = subscribed(port, topic, maximum_packet_size=200)
    with Paho(port) as pub:
        pub.connect()
        pub.publish(topic, b"x" * 500, 1)  # too large for the client: not sent [MQTT-3.1.2-25]
        pub.publish(topic, b"fits", 1)
    packet = sub.recv()
    assert isinstance(packet, Publish)
    assert packet.payload == b"fits"
    sub.disconnect()


def test_oversize_packet_closes_with_0x95(port: int) -> None:
    client = RawClient(port)
    client.connect(unique("big"))
    client.send(Publish(unique("t"), b"x" * (1 << 20), 0))
    packets = client.closed_after()
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x95)]  # type: ignore[union-attr]


def test_malformed_packet_closes_only_that_connection(port: int) -> None:
    topic = unique("mal")
    bystander = subscribed(port, topic)
    client = RawClient(port)
    client.connect(unique("bad"))
    client.send_bytes(b"\x30\x05\x00\x09abc")  # topic length runs past the packet
    packets = client.closed_after()
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x81)]  # type: ignore[union-attr]
    v3 = RawClient(port, version=4)
    v3.connect(unique("bad3"))
    v3.send_bytes(b"\x00\x00")  # reserved packet type
    assert v3.closed_after() == []  # 3.1.1: just closed
    with Paho(port) as pub:
        pub.connect()
        pub.publish(topic, b"still here", 1)
    packet = bystander.recv()
    assert isinstance(packet, Publish)
    assert packet.payload == b"still here"
    bystander.disconnect()


def test_protocol_violations(port: int) -> None:
    first = RawClient(port)
    first.send(Pingreq())  # not CONNECT first [MQTT-3.1.0-1]
    assert first.closed_after() == []
    second = RawClient(port)
    second.connect(unique("twice"))
    second.send_bytes(b"\x10\x0d\x00\x04MQTT\x05\x02\x00\x3c\x00\x00\x00")  # CONNECT again
    packets = second.closed_after()
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x82)]  # type: ignore[union-attr]
    third = RawClient(port)
    third.connect(unique("suback"))
    third.send(Suback(1, (0,)))  # a server's packet
    packets = third.closed_after()
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x82)]  # type: ignore[union-attr]


def test_unsupported_protocol_version(port: int) -> None:
    client = RawClient(port, version=4)
    client.send_bytes(b"\x10\x0c\x00\x04MQTT\x06\x02\x00\x3c\x00\x00")  # level 6
    packets = client.closed_after()
    assert packets == [Connack(False, 0x01)]


def test_empty_client_id_needs_clean_session_in_3_1_1(port: int) -> None:
    client = RawClient(port, version=4)
    client.send_bytes(b"\x10\x0c\x00\x04MQTT\x04\x00\x00\x3c\x00\x00")  # clean session 0, no id
    packets = client.closed_after()
    assert packets == [Connack(False, 0x02)]


def test_publish_to_a_reserved_topic_is_refused(port: int) -> None:
    client = RawClient(port)
    client.connect(unique("res"))
    client.send(Publish("__meta/x", b"no", 1, packet_id=1))
    ack = client.recv()
    assert isinstance(ack, Puback)
    assert ack.reason_code == 0x90
    client.send(Publish("$share/g/x", b"no", 1, packet_id=2))
    ack = client.recv()
    assert isinstance(ack, Puback)
    assert ack.reason_code == 0x90
    client.send(Subscribe(3, (Subscription("__meta/#", 1), Subscription("a/#/b", 1))))
    suback = client.recv()
    assert isinstance(suback, Suback)
    assert suback.reason_codes == (0x87, 0x8F)
    client.disconnect()


def test_qos2_flow_and_duplicate(port: int) -> None:
    topic = unique("q2")
    with Paho(port) as sub:
        sub.connect()
        sub.subscribe(topic, 2)
        client = RawClient(port)
        client.connect(unique("q2c"))
        client.send(Publish(topic, b"once", 2, packet_id=7))
        assert client.recv() == Pubrec(7)
        client.send(Publish(topic, b"once", 2, dup=True, packet_id=7))  # PUBREC was "lost"
        assert client.recv() == Pubrec(7)
        client.send(Pubrel(7))
        assert client.recv() == Pubcomp(7)
        client.send(Pubrel(7))
        assert client.recv() == Pubcomp(7, 0x92)  # unknown identifier
        assert sub.get().payload == b"once"
        sub.nothing()
        client.disconnect()


def test_keep_alive_is_enforced(port: int) -> None:
    v5 = RawClient(port)
    v5.connect(unique("ka"), keep_alive=1)
    v5.send(Pingreq())
    assert v5.recv() == Pingresp()
    started = time.monotonic()
    packets = v5.closed_after(timeout=5)
    elapsed = time.monotonic() - started
    assert [(type(p), p.reason_code) for p in packets] == [(Disconnect, 0x8D)]  # type: ignore[union-attr]
    assert 1.3 <= elapsed <= 3.0  # 1.5 x keep alive [MQTT-3.1.2-22]
    v3 = RawClient(port, version=4)
    v3.connect(unique("ka3"), keep_alive=1)
    started = time.monotonic()
    assert v3.closed_after(timeout=5) == []
    assert 1.3 <= time.monotonic() - started <= 3.0


def test_keep_alive_kept_by_traffic(port: int) -> None:
    client = RawClient(port)
    client.connect(unique("kak"), keep_alive=1)
    for _ in range(4):
        time.sleep(0.6)
        client.send(Pingreq())
        assert client.recv() == Pingresp()
    client.disconnect()
