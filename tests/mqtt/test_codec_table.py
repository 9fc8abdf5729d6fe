"""The (packet, bytes) tables of ``cases.py`` in both directions: encode the packet, decode the
bytes fed whole, one byte at a time, and followed by (part of) the next packet."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway.mqtt.codec import Connect, MqttDecoder, Pingreq, Publish, encode

from .cases import TABLES, h

ALL_CASES = [
    pytest.param(version, packet, data, id=f"v{version}-{name}")
    for version, cases in TABLES.items()
    for name, packet, data in cases
]


def decoder_for(packet: object, version: int) -> MqttDecoder:
    """A server-side decoder learns the version from CONNECT; for the rest, it is given."""
    return MqttDecoder(None if isinstance(packet, Connect) else version)


def next_publish(version: int) -> bytes:
    return encode(Publish("next", b"packet", 1, packet_id=9), version)


@pytest.mark.parametrize(("version", "packet", "data"), ALL_CASES)
def test_encode(version, packet, data):
    assert encode(packet, version) == data


@pytest.mark.parametrize(("version", "packet", "data"), ALL_CASES)
def test_decode_whole(version, packet, data):
    decoder = decoder_for(packet, version)
    assert decoder.feed(data) == [packet]
    assert decoder.buffered == 0
    assert decoder.version == version


@pytest.mark.parametrize(("version", "packet", "data"), ALL_CASES)
def test_decode_one_byte_at_a_time(version, packet, data):
    decoder = decoder_for(packet, version)
    for index in range(len(data) - 1):
        assert decoder.feed(data[index : index + 1]) == []
        assert decoder.buffered == index + 1
    assert decoder.feed(data[-1:]) == [packet]
    assert decoder.buffered == 0


@pytest.mark.parametrize(("version", "packet", "data"), ALL_CASES)
def test_decode_with_trailing_bytes(version, packet, data):
    following = next_publish(version)
    for cut in (1, 2, 3, len(following) - 1):
        decoder = decoder_for(packet, version)
        assert decoder.feed(data + following[:cut]) == [packet]
        assert decoder.buffered == cut
        assert decoder.feed(following[cut:]) == [Publish("next", b"packet", 1, packet_id=9)]


@pytest.mark.parametrize(("version", "packet", "data"), ALL_CASES)
def test_decode_followed_by_whole_packets(version, packet, data):
    decoder = decoder_for(packet, version)
    packets = decoder.feed(data + next_publish(version) + h("C0 00"))
    assert packets[0] == packet
    assert packets[1:] == [Publish("next", b"packet", 1, packet_id=9), Pingreq()]


@pytest.mark.parametrize("version", [4, 5])
def test_whole_table_as_one_stream(version):
    """A CONNECT, then every other packet of the table, split at random places."""
    cases = TABLES[version]
    connect = next(packet for _, packet, _ in cases if isinstance(packet, Connect))
    rest = [(packet, data) for _, packet, data in cases if not isinstance(packet, Connect)]
    stream = encode(connect, version) + b"".join(data for _, data in rest)
    expected = [connect] + [packet for packet, _ in rest]
    rng = random.Random(version)
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(stream)), rng.randint(1, 30)))
        decoder = MqttDecoder()
        got = []
        for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
            got += decoder.feed(stream[start:end])
        assert got == expected
        assert decoder.buffered == 0


@pytest.mark.parametrize("version", [4, 5])
def test_large_payload_is_a_view_that_outlives_later_reads(version):
    big = bytes(range(256)) * 16  # 4 KiB: ZERO_COPY_PAYLOAD_MIN
    decoder = MqttDecoder(version)
    first: Any
    (first,) = decoder.feed(
        encode(Publish("t", big), version) + encode(Publish("t", b"small"), version)[:3]
    )
    assert isinstance(first.payload, memoryview)
    assert first.payload.readonly
    second: Any
    (second,) = decoder.feed(encode(Publish("t", b"small"), version)[3:])
    assert type(second.payload) is bytes  # small payloads are copied
    assert bytes(first.payload) == big
    assert second.payload == b"small"
