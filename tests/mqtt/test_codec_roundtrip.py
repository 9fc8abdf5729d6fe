"""Property tests: generated packets survive encode -> decode, alone and as split streams; the
fast paths agree with ``encode``; arbitrary bytes only ever raise ``MqttProtocolError``.

CI runs 2/5 of each test's Hypothesis examples (``examples``); ``BRAID_LONG=1`` runs them all."""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.mqtt._wire import Reader
from gateway.mqtt.codec import (
    WILL_PROPERTIES,
    Connect,
    MqttDecoder,
    MqttProtocolError,
    PacketType,
    Puback,
    Publish,
    encode,
    encode_ack,
    encode_puback,
    encode_publish,
)
from gateway.mqtt.properties import decode_properties, encode_properties, encode_property_block

from .strategies import connects, packets, properties, publishes

LONG = os.environ.get("BRAID_LONG") == "1"


def examples(full: int) -> int:
    """Hypothesis examples for a test that runs ``full`` of them with BRAID_LONG=1."""
    return full if LONG else full * 2 // 5


VERSIONS = pytest.mark.parametrize("version", [4, 5])
SETTINGS = settings(
    max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def decode_one(data: bytes, version: int | None) -> Any:
    decoder = MqttDecoder(version)
    decoded = decoder.feed(data)
    assert decoder.buffered == 0
    assert len(decoded) == 1
    return decoded[0]


@VERSIONS
@SETTINGS
@given(data=st.data())
def test_packet_round_trip(version, data):
    packet = data.draw(packets(version))
    assert decode_one(encode(packet, version), version) == packet


@VERSIONS
@SETTINGS
@given(data=st.data())
def test_connect_round_trip(version, data):
    connect = data.draw(connects(version))
    decoded = decode_one(encode(connect, version), None)
    assert decoded == connect
    assert isinstance(decoded, Connect)


@VERSIONS
@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_stream_split_anywhere(version, data):
    connect = data.draw(connects(version))
    rest = data.draw(st.lists(packets(version), max_size=12))
    stream = b"".join(encode(packet, version) for packet in [connect, *rest])
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(stream)), max_size=10))))
    decoder = MqttDecoder()
    decoded = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        decoded += decoder.feed(stream[start:end])
    assert decoded == [connect, *rest]
    assert decoder.buffered == 0


@pytest.mark.parametrize(
    "context",
    [
        WILL_PROPERTIES,
        *(t for t in PacketType if t not in (PacketType.PINGREQ, PacketType.PINGRESP)),
    ],
)
@settings(max_examples=examples(50), deadline=None)
@given(data=st.data())
def test_property_block_round_trip(context, data):
    props = data.draw(properties(context))
    block = encode_property_block(props)
    reader = Reader(block, 0, len(block))
    assert decode_properties(reader, context) == props
    assert reader.pos == len(block)


@VERSIONS
@SETTINGS
@given(data=st.data())
def test_encode_publish_fast_path_matches_encode(version, data):
    publish = data.draw(publishes(version))
    fast = encode_publish(
        publish.topic,
        publish.payload,
        publish.qos,
        publish.packet_id,
        publish.retain,
        publish.dup,
        encode_properties(publish.properties) if version == 5 else b"",
        version,
    )
    assert fast == encode(publish, version)


@VERSIONS
@given(packet_id=st.integers(1, 0xFFFF), reason=st.sampled_from([0x00, 0x10, 0x80, 0x97]))
def test_encode_puback_fast_path_matches_encode(version, packet_id, reason):
    expected_reason = reason if version == 5 else 0
    assert encode_puback(packet_id, reason, version) == encode(Puback(packet_id, reason), version)
    assert encode_ack(PacketType.PUBACK, packet_id, reason, version) == encode_puback(
        packet_id, reason, version
    )
    assert decode_one(encode_puback(packet_id, reason, version), version) == Puback(
        packet_id, expected_reason
    )


@VERSIONS
@settings(max_examples=examples(500), deadline=None)
@given(garbage=st.binary(max_size=200))
def test_arbitrary_bytes_only_raise_protocol_errors(version, garbage):
    decoder = MqttDecoder()
    with contextlib.suppress(MqttProtocolError):
        decoder.feed(encode(Connect("fuzz", version), version) + garbage)


@VERSIONS
@settings(max_examples=examples(100), deadline=None)
@given(data=st.data())
def test_corrupted_packets_only_raise_protocol_errors(version, data):
    """Valid packets with bytes overwritten at random places: decoded or refused, no crash."""
    stream = bytearray(b"".join(encode(p, version) for p in data.draw(st.lists(packets(version)))))
    if stream:
        for _ in range(data.draw(st.integers(1, 4))):
            stream[data.draw(st.integers(0, len(stream) - 1))] = data.draw(st.integers(0, 255))
    decoder = MqttDecoder(version)
    try:
        for packet in decoder.feed(bytes(stream)):
            encode(packet, version)  # what is decoded is valid enough to encode again
    except MqttProtocolError:
        pass


def test_payload_bytes_round_trip_through_memoryview():
    payload = bytes(range(256)) * 4
    decoded = decode_one(encode(Publish("t", payload, 1, packet_id=3), 5), 5)
    assert bytes(decoded.payload) == payload
    assert decoded == Publish("t", payload, 1, packet_id=3)
