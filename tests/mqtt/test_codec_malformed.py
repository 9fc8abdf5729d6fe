"""Malformed and forbidden input: the decoder raises ``MqttProtocolError`` with the reason code
a server sends back (0x81 malformed, 0x82 protocol error, ...)."""

from __future__ import annotations

import pytest

from gateway.mqtt._wire import encode_varint
from gateway.mqtt.codec import (
    Connect,
    MqttDecoder,
    MqttProtocolError,
    Pingreq,
    Publish,
    ReasonCode,
    encode,
)

from .cases import h

MALFORMED = ReasonCode.MALFORMED_PACKET
PROTOCOL = ReasonCode.PROTOCOL_ERROR


def frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_varint(len(body)) + body


def connect_body(
    level: int = 5,
    flags: int = 0x02,
    client_id: bytes = b"\x00\x01c",
    props: bytes = b"\x00",
    rest: bytes = b"",
) -> bytes:
    return (
        h("00 04 'MQTT'")
        + bytes((level, flags))
        + h("00 3C")
        + (props if level == 5 else b"")
        + client_id
        + rest
    )


def decode_error(data: bytes, version: int | None) -> MqttProtocolError:
    decoder = MqttDecoder(version)
    with pytest.raises(MqttProtocolError) as info:
        decoder.feed(data)
    return info.value


# (id, version given to the decoder, bytes, reason code)
CASES = [
    # Fixed header
    ("length-five-bytes", 5, h("30 FF FF FF FF 7F"), MALFORMED),
    ("length-not-minimal", 5, h("C0 80 00"), MALFORMED),
    ("type-0", 5, h("00 00"), MALFORMED),
    ("auth-in-3.1.1", 4, h("F0 00"), MALFORMED),
    ("pubrel-flags-0", 5, h("60 02 00 01"), MALFORMED),  # [MQTT-2.1.3-1] needs 0b0010
    ("subscribe-flags-0", 5, frame(0x80, h("00 01 00 00 01 'a' 00")), MALFORMED),
    ("unsubscribe-flags-0", 4, frame(0xA0, h("00 01 00 01 'a'")), MALFORMED),
    ("puback-flags-1", 4, h("41 02 00 01"), MALFORMED),
    ("pingreq-flags-8", 4, h("C8 00"), MALFORMED),
    ("pingreq-with-body", 4, h("C0 01 00"), MALFORMED),
    ("puback-3.1.1-extra-byte", 4, h("40 03 00 01 00"), MALFORMED),
    # PUBLISH
    ("publish-qos3", 5, frame(0x36, h("00 01 't' 00 01 00")), MALFORMED),
    ("publish-dup-qos0", 4, frame(0x38, h("00 01 't'")), MALFORMED),
    ("publish-packet-id-0", 4, frame(0x32, h("00 01 't' 00 00")), PROTOCOL),
    ("publish-empty-body", 4, h("30 00"), MALFORMED),
    ("publish-one-byte-body", 4, h("30 01 00"), MALFORMED),
    ("publish-topic-past-end", 4, frame(0x30, h("00 09 'abc'")), MALFORMED),
    ("publish-packet-id-past-end", 4, frame(0x32, h("00 01 't' 00")), MALFORMED),
    ("publish-v5-no-property-length", 5, frame(0x30, h("00 01 't'")), MALFORMED),
    ("publish-invalid-utf8", 4, frame(0x30, h("00 02 C3 28 'x'")), MALFORMED),
    ("publish-utf8-surrogate", 4, frame(0x30, h("00 03 ED A0 80")), MALFORMED),  # [MQTT-1.5.4-1]
    ("publish-utf8-nul", 4, frame(0x30, h("00 03 'a' 00 'b'")), MALFORMED),  # [MQTT-1.5.4-2]
    ("publish-wildcard-plus", 4, frame(0x30, h("00 03 'a/+'")), ReasonCode.TOPIC_NAME_INVALID),
    ("publish-wildcard-hash", 5, frame(0x30, h("00 01 '#' 00")), ReasonCode.TOPIC_NAME_INVALID),
    ("publish-empty-topic-3.1.1", 4, frame(0x30, h("00 00 'x'")), PROTOCOL),
    ("publish-empty-topic-no-alias", 5, frame(0x30, h("00 00 00 'x'")), PROTOCOL),
    # Acknowledgements
    ("puback-packet-id-0", 4, h("40 02 00 00"), PROTOCOL),
    ("pubrec-packet-id-0", 5, h("50 02 00 00"), PROTOCOL),
    ("puback-reason-not-allowed", 5, h("40 03 00 01 04"), PROTOCOL),
    ("pubrel-reason-not-allowed", 5, h("62 03 00 01 10"), PROTOCOL),
    ("disconnect-reason-not-allowed", 5, h("E0 01 05"), PROTOCOL),
    ("suback-3.1.1-bad-code", 4, h("90 03 00 01 03"), PROTOCOL),
    ("suback-no-codes", 5, h("90 03 00 01 00"), PROTOCOL),
    ("unsuback-v5-no-codes", 5, h("B0 03 00 01 00"), PROTOCOL),
    # SUBSCRIBE / UNSUBSCRIBE
    ("subscribe-empty", 4, frame(0x82, h("00 01")), PROTOCOL),  # [MQTT-3.8.3-2]
    ("subscribe-empty-v5", 5, frame(0x82, h("00 01 00")), PROTOCOL),
    ("subscribe-packet-id-0", 5, frame(0x82, h("00 00 00 00 01 'a' 00")), PROTOCOL),
    ("subscribe-qos3", 4, frame(0x82, h("00 01 00 01 'a' 03")), MALFORMED),
    ("subscribe-3.1.1-reserved-bits", 4, frame(0x82, h("00 01 00 01 'a' 04")), MALFORMED),
    ("subscribe-v5-reserved-bits", 5, frame(0x82, h("00 01 00 00 01 'a' 40")), MALFORMED),
    ("subscribe-retain-handling-3", 5, frame(0x82, h("00 01 00 00 01 'a' 30")), PROTOCOL),
    (
        "subscribe-no-local-shared",  # [MQTT-3.8.3-4]
        5,
        frame(0x82, h("00 01 00 00 0A '$share/g/a' 04")),
        PROTOCOL,
    ),
    ("subscribe-filter-past-end", 4, frame(0x82, h("00 01 00 05 'a' 00")), MALFORMED),
    ("subscribe-missing-options", 4, frame(0x82, h("00 01 00 01 'a'")), MALFORMED),
    ("unsubscribe-empty", 5, frame(0xA2, h("00 01 00")), PROTOCOL),  # [MQTT-3.10.3-2]
    ("unsubscribe-nul", 4, frame(0xA2, h("00 01 00 01 00")), MALFORMED),
    # Properties
    ("property-unknown", 5, frame(0x30, h("00 01 't' 02 05 00")), MALFORMED),
    ("property-not-allowed", 5, h("40 07 00 01 00 03 23 00 01"), MALFORMED),  # topic alias
    (
        "property-duplicate",
        5,
        frame(0x30, h("00 01 't' 0A 02 00 00 00 01 02 00 00 00 02")),
        PROTOCOL,
    ),
    ("property-length-past-end", 5, frame(0x30, h("00 01 't' 09 01 00")), MALFORMED),
    ("property-value-past-end", 5, frame(0x30, h("00 01 't' 03 02 00 00")), MALFORMED),
    ("property-bad-utf8", 5, frame(0x30, h("00 01 't' 04 03 00 01 FF")), MALFORMED),
    ("payload-format-2", 5, frame(0x30, h("00 01 't' 02 01 02")), PROTOCOL),
    ("topic-alias-0", 5, frame(0x30, h("00 01 't' 03 23 00 00")), PROTOCOL),  # [MQTT-3.3.2-8]
    ("subscription-identifier-0", 5, frame(0x82, h("00 01 02 0B 00 00 01 'a' 00")), PROTOCOL),
    (
        "subscription-identifier-twice-in-subscribe",
        5,
        frame(0x82, h("00 01 04 0B 01 0B 02 00 01 'a' 00")),
        PROTOCOL,
    ),
    (
        "subscription-identifier-5-bytes",
        5,
        frame(0x30, h("00 01 't' 06 0B FF FF FF FF 7F")),
        MALFORMED,
    ),
    ("connack-maximum-qos-2", 5, h("20 05 00 00 02 24 02"), PROTOCOL),
    ("auth-data-without-method", 5, h("F0 06 18 04 16 00 01 00"), PROTOCOL),
    ("user-property-missing-value", 5, frame(0x30, h("00 01 't' 04 26 00 01 'k'")), MALFORMED),
    # CONNECT (server side: the decoder does not know the version yet)
    ("first-packet-not-connect", None, h("C0 00"), PROTOCOL),  # [MQTT-3.1.0-1]
    ("first-packet-publish", None, frame(0x30, h("00 01 't'")), PROTOCOL),
    ("connect-flags-in-header", None, frame(0x11, connect_body()), MALFORMED),
    ("connect-mqtt-3.1", None, frame(0x10, h("00 06 'MQIsdp' 03 02 00 3C 00 01 'c'")), 0x84),
    ("connect-level-6", None, frame(0x10, connect_body(level=6)), 0x84),
    ("connect-bad-protocol-name", None, frame(0x10, h("00 04 'MQTX' 04 02 00 3C 00 01 'c'")), 0x84),
    ("connect-reserved-flag", None, frame(0x10, connect_body(flags=0x03)), MALFORMED),
    ("connect-will-qos-without-will", None, frame(0x10, connect_body(flags=0x0A)), MALFORMED),
    ("connect-will-retain-without-will", None, frame(0x10, connect_body(flags=0x22)), MALFORMED),
    ("connect-will-qos-3", None, frame(0x10, connect_body(level=4, flags=0x1E)), MALFORMED),
    (
        "connect-3.1.1-password-only",
        None,
        frame(0x10, connect_body(level=4, flags=0x42)),
        MALFORMED,
    ),
    (
        "connect-3.1.1-empty-client-id-persistent",  # [MQTT-3.1.3-8]
        None,
        frame(0x10, connect_body(level=4, flags=0x00, client_id=h("00 00"))),
        ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    ),
    ("connect-client-id-nul", None, frame(0x10, connect_body(client_id=h("00 01 00"))), MALFORMED),
    (
        "connect-will-topic-wildcard",
        None,
        frame(0x10, connect_body(level=4, flags=0x06, rest=h("00 01 '#' 00 00"))),
        ReasonCode.TOPIC_NAME_INVALID,
    ),
    (
        "connect-will-missing",
        None,
        frame(0x10, connect_body(level=4, flags=0x06)),
        MALFORMED,
    ),
    (
        "connect-property-not-allowed",  # topic alias in CONNECT
        None,
        frame(0x10, connect_body(props=h("03 23 00 01"))),
        MALFORMED,
    ),
    (
        "connect-receive-maximum-0",
        None,
        frame(0x10, connect_body(props=h("03 21 00 00"))),
        PROTOCOL,
    ),
    ("connect-trailing-bytes", None, frame(0x10, connect_body(level=4, rest=b"x")), MALFORMED),
    # CONNACK
    ("connack-reserved-flags", 4, h("20 02 02 00"), MALFORMED),  # [MQTT-3.2.2-1]
    ("connack-session-present-refused", 4, h("20 02 01 05"), PROTOCOL),  # [MQTT-3.2.2-6]
    ("connack-3.1.1-reserved-code", 4, h("20 02 00 06"), PROTOCOL),
    ("connack-v5-bad-reason", 5, h("20 03 00 10 00"), PROTOCOL),
]


@pytest.mark.parametrize(
    ("version", "data", "reason_code"),
    [pytest.param(version, data, code, id=name) for name, version, data, code in CASES],
)
def test_malformed_input(version, data, reason_code):
    error = decode_error(data, version)
    assert error.reason_code == reason_code, str(error)
    assert f"0x{reason_code:02X}" in str(error)


@pytest.mark.parametrize(
    ("version", "data", "reason_code"),
    [pytest.param(version, data, code, id=name) for name, version, data, code in CASES],
)
def test_malformed_input_one_byte_at_a_time(version, data, reason_code):
    """The same error, whatever the read boundaries (or earlier, for an oversize header)."""
    decoder = MqttDecoder(version)
    with pytest.raises(MqttProtocolError) as info:
        feed_one_byte_at_a_time(decoder, data)
    assert info.value.reason_code == reason_code


def feed_one_byte_at_a_time(decoder: MqttDecoder, data: bytes) -> None:
    for index in range(len(data)):
        decoder.feed(data[index : index + 1])


def test_second_connect_is_a_protocol_error():
    connect = encode(Connect("c", 5), 5)
    decoder = MqttDecoder()
    assert decoder.feed(connect + connect) == [Connect("c", 5)]
    error = decoder.error
    assert error is not None
    assert error.reason_code == PROTOCOL
    assert "MQTT-3.1.0-2" in error.message


def test_good_packets_before_an_error_are_returned_first():
    decoder = MqttDecoder(4)
    good = encode(Publish("a", b"1"), 4)
    assert decoder.error is None
    assert decoder.feed(good + good + h("C1 00") + good) == [Publish("a", b"1")] * 2
    first = decoder.error  # found after the two packets: kept for the caller
    assert first is not None
    assert first.reason_code == MALFORMED
    with pytest.raises(MqttProtocolError) as again:
        decoder.feed(encode(Pingreq(), 4))  # and raised by every later call
    assert again.value is first
    with pytest.raises(MqttProtocolError) as empty:
        decoder.feed(b"")
    assert empty.value is first


def test_packet_too_large_is_raised_from_the_fixed_header():
    """The limit is checked before the body is buffered: 3 bytes of header are enough."""
    decoder = MqttDecoder(5, max_packet_size=1000)
    with pytest.raises(MqttProtocolError) as info:
        decoder.feed(h("30 E6 07"))  # remaining length 998 + 3 bytes of header = 1001
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_packet_at_the_size_limit_is_accepted():
    packet = Publish("t", bytes(1000 - 3 - 4))  # header 3 + topic 3 + properties 1
    data = encode(packet, 5)
    assert len(data) == 1000
    decoder = MqttDecoder(5, max_packet_size=1000)
    assert decoder.feed(data) == [packet]


def test_largest_remaining_length_is_too_large_by_default():
    decoder = MqttDecoder(4)
    with pytest.raises(MqttProtocolError) as info:
        decoder.feed(h("30 FF FF FF 7F"))
    assert info.value.reason_code == ReasonCode.PACKET_TOO_LARGE


def test_incomplete_length_waits_for_more():
    decoder = MqttDecoder(4)
    assert decoder.feed(h("30 FF FF")) == []
    assert decoder.feed(h("FF")) == []
    with pytest.raises(MqttProtocolError) as info:
        decoder.feed(h("FF"))
    assert info.value.reason_code == MALFORMED
