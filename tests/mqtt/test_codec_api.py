"""The codec's API beyond the tables: buffering of large packets, the decoded objects, encoder
checks, 3.1.1 down-conversion, and the benchmark entry point."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from bench import codec_mqtt as bench_codec
from gateway.mqtt.codec import (
    NO_PROPERTIES,
    Auth,
    Connack,
    Connect,
    Disconnect,
    MqttDecoder,
    MqttEncodeError,
    Pingreq,
    Properties,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Will,
    connack_return_code_v3,
    encode,
    encode_properties,
    encode_publish,
    encode_subscription_identifier,
)

from .cases import h


def test_large_packet_in_small_reads_is_joined_once():
    payload = bytes(range(256)) * 4096  # 1 MiB
    data = encode(Publish("big", payload, 1, packet_id=1), 5)
    pieces = [data[start : start + 1000] for start in range(0, len(data), 1000)]
    decoder = MqttDecoder(5, max_packet_size=2 << 20)
    assert decoder.feed(pieces[0]) == []  # fixed header seen: the packet's size is known
    for piece in pieces[1:-1]:
        assert decoder.feed(piece) == []
        assert decoder._chunks is not None  # collected, not concatenated on every read
    packet: Any
    (packet,) = decoder.feed(pieces[-1])
    assert bytes(packet.payload) == payload
    assert decoder.buffered == 0


def test_many_packets_in_one_read():
    packets = [
        Publish(f"t/{i % 7}", bytes([i % 256]) * (i % 50), 1, packet_id=i)
        if i % 2
        else Publish(f"t/{i % 7}", bytes([i % 256]) * (i % 50))
        for i in range(1, 2001)
    ]
    data = b"".join(encode(packet, 4) for packet in packets)
    decoder = MqttDecoder(4)
    assert decoder.feed(data) == packets


def test_decoded_packets_are_frozen_and_hashable():
    decoder = MqttDecoder(5)
    publish: Any
    puback: Any
    publish, puback = decoder.feed(
        encode(Publish("a", b"x", 1, packet_id=2), 5) + encode(Puback(2), 5)
    )
    assert type(publish) is Publish
    assert type(puback) is Puback
    with pytest.raises(dataclasses.FrozenInstanceError):
        publish.topic = "b"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        puback.packet_id = 3  # type: ignore[misc]
    assert hash(publish) == hash(Publish("a", b"x", 1, packet_id=2))
    assert {puback, Puback(2)} == {Puback(2)}
    assert "payload=b'x'" in repr(publish)


def test_version_comes_from_connect():
    decoder = MqttDecoder()
    assert decoder.version is None
    packets = decoder.feed(encode(Connect("c", 4), 4) + encode(Publish("t", b"3.1.1 body"), 4))
    assert packets[1] == Publish("t", b"3.1.1 body")
    assert decoder.version == 4


def test_decoder_arguments_are_checked():
    with pytest.raises(ValueError, match="protocol level"):
        MqttDecoder(3)
    with pytest.raises(ValueError, match="max_packet_size"):
        MqttDecoder(5, max_packet_size=1)


def test_max_packet_size_can_be_lowered_after_connect():
    decoder = MqttDecoder(5)
    decoder.max_packet_size = 10
    with pytest.raises(Exception, match="maximum packet size 10"):
        decoder.feed(encode(Publish("t", bytes(20)), 5))


def test_3_1_1_encoding_leaves_out_what_3_1_1_lacks():
    props = Properties(reason_string="why")
    assert encode(Puback(7, 0x10, props), 4) == h("40 02 00 07")
    assert encode(Disconnect(0x8E, props), 4) == h("E0 00")
    assert encode(Publish("t", b"", properties=Properties(content_type="x")), 4) == h(
        "30 03 00 01 't'"
    )
    assert encode(Suback(1, (0, 0x8F, 0x97)), 4) == h("90 05 00 01 00 80 80")
    assert encode(Unsuback(1, (0x11,)), 4) == h("B0 02 00 01")
    sub = Subscribe(1, (Subscription("a", 1, no_local=True, retain_handling=2),))
    assert encode(sub, 4) == h("82 06 00 01 00 01 'a' 01")


@pytest.mark.parametrize(
    ("reason", "return_code"),
    [
        (0x00, 0),
        (0x84, 1),
        (0x85, 2),
        (0x88, 3),
        (0x89, 3),
        (0x86, 4),
        (0x87, 5),
        (0x97, 3),
        (2, 2),
    ],
)
def test_connack_reason_codes_map_to_3_1_1(reason, return_code):
    assert connack_return_code_v3(reason) == return_code
    assert encode(Connack(False, reason), 4) == bytes((0x20, 0x02, 0x00, return_code))


@pytest.mark.parametrize(
    ("packet", "version", "message"),
    [
        (Publish("t", b"", 3, packet_id=1), 5, "QoS"),
        (Publish("t", b"", 1), 5, "packet identifier"),
        (Publish("t", b"", 0, packet_id=1), 5, "QoS 0"),
        (Publish("t", b"", 0, dup=True), 4, "DUP"),
        (Publish("t", b"", 1, packet_id=0x10000), 4, "packet identifier"),
        (Publish("a/+", b""), 4, "wildcard"),
        (Publish("", b""), 4, "topic"),
        (Publish("", b""), 5, "topic alias"),
        (Publish("a\x00b", b""), 4, r"U\+0000"),
        (Publish("\ud800", b""), 4, "surrogates"),
        (Publish("x" * 65536, b""), 4, "65535"),
        (Publish("t", b"", properties=Properties(receive_maximum=1)), 5, "not allowed"),
        (Publish("t", b"", properties=Properties(topic_alias=70000)), 5, "topic_alias"),
        (
            Publish("t", b"", properties=Properties(subscription_identifiers=(0,))),
            5,
            "1..268435455",
        ),
        (Connect("c", 5, properties=Properties(topic_alias=1)), 5, "not allowed"),
        (Connect("c", 3), 4, "protocol level"),
        (Connect("c", 4, password=b"p"), 4, "user name"),
        (Connect("c", 5, keep_alive=70000), 5, "keep alive"),
        (Connect("c", 5, will=Will("w", b"", qos=3)), 5, "QoS"),
        (
            Connect("c", 5, will=Will("w", b"", properties=Properties(content_type=1))),  # type: ignore[arg-type]
            5,
            "content_type",
        ),
        (Connack(True, 0x87), 5, "session present"),
        (Subscribe(1, ()), 5, "without subscriptions"),
        (Subscribe(1, (Subscription("a", 0, retain_handling=3),)), 5, "retain handling"),
        (
            Subscribe(1, (Subscription("a"),), Properties(subscription_identifiers=(1, 2))),
            5,
            "several",
        ),
        (Suback(1, ()), 5, "without reason codes"),
        (Unsuback(1, ()), 5, "without reason codes"),
        (Auth(), 4, "3.1.1"),
        (Pingreq(), 6, "protocol level"),
        ("not a packet", 5, "not an MQTT packet"),
    ],
)
def test_encoder_refuses_invalid_packets(packet, version, message):
    with pytest.raises(MqttEncodeError, match=message):
        encode(packet, version)


def test_encode_publish_fast_path_lengths():
    for size in (0, 120, 127 - 5, 16_383, 16_384, 2_097_152):
        data = encode_publish("t", bytes(size), 1, 2, False, False, b"", 5)
        decoder = MqttDecoder(5, max_packet_size=4 << 20)
        assert decoder.feed(data) == [Publish("t", bytes(size), 1, packet_id=2)]


def test_encode_publish_with_per_subscriber_properties():
    shared = Properties(content_type="c")
    data = encode_publish(
        "t",
        b"x",
        0,
        None,
        False,
        False,
        encode_properties(shared) + encode_subscription_identifier(300),
    )
    decoder = MqttDecoder(5)
    assert decoder.feed(data) == [
        Publish("t", b"x", properties=Properties(content_type="c", subscription_identifiers=(300,)))
    ]


def test_properties_repr_shows_only_what_is_set():
    assert repr(NO_PROPERTIES) == "Properties()"
    assert repr(Properties(topic_alias=3)) == "Properties(topic_alias=3)"


def test_bench_measure_returns_rates():
    rates = bench_codec.measure(batch=200, repeats=1, reference=False)
    assert rates["decode_64k_qos0_v311"] > 0
    assert rates["encode_publish_qos1_v5"] > 0
    assert all(rate > 0 for rate in rates.values())
