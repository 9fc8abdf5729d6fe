"""Sans-IO parts of the MQTT gateway, without sockets: the address mapping, headers <->
properties, the retained-message layout, the WebSocket codec, the keep alive a client is granted
and what the first bytes of a client that is not MQTT look like."""

from __future__ import annotations

import pytest

from core.delivery import Message
from core.log import record as rec
from gateway.mqtt.addresses import (
    GLOBAL_SOURCE,
    BindingSpec,
    binding_plan,
    filter_matches,
    group_queue_name,
    mqtt_topic_of,
    parse_delayed,
    session_queue_name,
    to_log_address,
)
from gateway.mqtt.messages import (
    OutMessage,
    forwarded_properties,
    out_message_of,
    publish_headers,
)
from gateway.mqtt.options import grant_keep_alive
from gateway.mqtt.properties import NO_PROPERTIES, Properties
from gateway.mqtt.retained import decode_retained, encode_retained
from gateway.mqtt.sniff import describe_first_bytes
from gateway.mqtt.websocket import (
    CLOSE_PROTOCOL_ERROR,
    CLOSE_UNSUPPORTED_DATA,
    OP_BINARY,
    OP_PING,
    OP_TEXT,
    Close,
    Handshake,
    WebSocketCodec,
    WebSocketError,
    accept_key,
)
from tests.ws_frames import client_frame

# -- addresses ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mqtt", "topic", "subject"),
    [
        ("T/a/b", "T", "a.b"),
        ("T", "T", ""),
        ("T/", "T", ""),
        ("/a/b", "/", "a.b"),
        ("T/a.b/c", "T", "a/b.c"),
        ("$SYS/broker/load", "$SYS", "broker.load"),
        ("T//x", "T", ".x"),
    ],
)
def test_mqtt_topic_to_log_address(mqtt: str, topic: str, subject: str) -> None:
    assert to_log_address(mqtt) == (topic, subject)


@pytest.mark.parametrize("mqtt", ["__meta/x", "a\x01b/c", "x" * 300])
def test_unmappable_topics(mqtt: str) -> None:
    assert to_log_address(mqtt) is None


@pytest.mark.parametrize(
    ("topic", "subject", "key", "mqtt"),
    [
        ("T", "a.b", None, "T/a/b"),
        ("T", "", None, "T"),
        ("/", "a", None, "/a"),
        ("T", "a/b.c", None, "T/a.b/c"),
        ("K", "", b"dev.1", "K/dev/1"),
        ("T", "a.#", None, "T/a/_"),
    ],
)
def test_log_address_to_mqtt_topic(topic: str, subject: str, key: bytes | None, mqtt: str) -> None:
    assert mqtt_topic_of(topic, subject, key) == mqtt


@pytest.mark.parametrize(
    ("topic_filter", "plan"),
    [
        ("T/a/b", [BindingSpec("T", "topic", "a.b")]),
        ("T/#", [BindingSpec("T", "topic", "#")]),
        ("T/+/b", [BindingSpec("T", "topic", "*.b")]),
        ("T/a.x/#", [BindingSpec("T", "topic", "a/x.#")]),
        ("T", [BindingSpec("T", "topic", "")]),
        ("/x", [BindingSpec("/", "topic", "x")]),
        ("#", [BindingSpec(GLOBAL_SOURCE, "mqtt", "#")]),
        ("+/x", [BindingSpec(GLOBAL_SOURCE, "mqtt", "+/x")]),
        ("T/+", [BindingSpec("T", "topic", "*"), BindingSpec(GLOBAL_SOURCE, "mqtt", "T/+")]),
        ("__acks/#", None),
    ],
)
def test_binding_plan(topic_filter: str, plan: list[BindingSpec] | None) -> None:
    assert binding_plan(topic_filter) == plan


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        ("a/#", "a", True),
        ("a/#", "a/b/c", True),
        ("a/+", "a/", True),
        ("a/+", "a", False),
        ("+/+", "/x", True),
        ("#", "$SYS/x", False),
        ("+/x", "$SYS/x", False),
        ("$SYS/#", "$SYS/x", True),
        ("a/b", "a/b/c", False),
    ],
)
def test_filter_matches(topic_filter: str, topic: str, matches: bool) -> None:
    assert filter_matches(topic_filter.split("/"), topic) is matches


def test_delayed_topics() -> None:
    assert parse_delayed("$delayed/10/a/b") == (10, "a/b")
    assert parse_delayed("$delayed/0/a") == (0, "a")
    for bad in ("$delayed/x/a", "$delayed/10", "$delayed/10/", "$delayed/99999999/a"):
        assert parse_delayed(bad) is None


def test_queue_names_are_bounded() -> None:
    assert session_queue_name("dev1") == "__mqtt.session.dev1"
    long = session_queue_name("d" * 1000)
    assert long.startswith("__mqtt.session.#")
    assert len(long) < 100
    assert session_queue_name("é") != session_queue_name("e")
    assert group_queue_name("g", "a/#") == "__mqtt.share.g/a/#"


# -- headers and properties ------------------------------------------------------------------


def make_message(**fields: object) -> Message:
    values: dict[str, object] = {
        "topic": "T",
        "queue": 0,
        "offset": 0,
        "subject": "a.b",
        "key": None,
        "headers": [],
        "tags": [],
        "body": b"payload",
        "protocol": rec.PROTOCOL_MQTT,
        "client": "c1",
        "address": "T/a/b",
        "born_ms": 0,
        "store_ms": 0,
        "flags": 0,
        "position": 0,
    }
    values.update(fields)
    return Message(**values)  # type: ignore[arg-type]


def test_properties_survive_the_log() -> None:
    props = Properties(
        payload_format_indicator=1,
        message_expiry_interval=30,
        content_type="text/plain",
        response_topic="r/1",
        correlation_data=b"\x00c",
        user_properties=(("a", "1"), ("a", "2"), ("ü", "ß")),
        topic_alias=4,
    )
    headers = publish_headers(props, 2, True, 1_000_000)
    out = out_message_of(make_message(headers=headers))
    assert (out.topic, out.qos, out.retain, out.expires_at_ms, out.origin) == (
        "T/a/b",
        2,
        True,
        1_000_000,
        "c1",
    )
    assert out.properties == forwarded_properties(props)
    assert out.properties.topic_alias is None


def test_records_of_other_protocols() -> None:
    amqp = out_message_of(
        make_message(
            protocol=rec.PROTOCOL_AMQP, address="", headers=[("x-death", b"[]"), ("h", b"v")]
        )
    )
    assert (amqp.topic, amqp.qos, amqp.origin) == ("T/a/b", 1, "")
    assert amqp.properties.user_properties == (("x-death", "[]"), ("h", "v"))
    kafka = out_message_of(
        make_message(protocol=rec.PROTOCOL_KAFKA, subject="", key=b"k.1", address="")
    )
    assert kafka.topic == "T/k/1"
    mqtt_qos0 = out_message_of(make_message())
    assert mqtt_qos0.qos == 0
    assert mqtt_qos0.properties is NO_PROPERTIES


def test_wire_properties_per_send() -> None:
    out = OutMessage("t", b"x", 1, False, "", 10_500, Properties(content_type="c"))
    wire = out.wire_properties(now_ms=1_000, alias=3, subscription_ids=(5, 300))
    # expiry: 9.5 s left -> 10 [MQTT-3.3.2-6]; then the static part; alias; the identifiers.
    assert (
        wire
        == b"\x02\x00\x00\x00\x0a" + b"\x03\x00\x01c" + b"\x23\x00\x03" + b"\x0b\x05\x0b\xac\x02"
    )


def test_retained_layout_round_trip() -> None:
    message = OutMessage("a/b", b"\x00data", 2, True, "dev", 123, Properties(content_type="x"))
    decoded = decode_retained("a/b", encode_retained(message))
    assert decoded is not None
    assert (decoded.topic, bytes(decoded.payload), decoded.qos, decoded.origin) == (
        "a/b",
        b"\x00data",
        2,
        "dev",
    )
    assert (decoded.retain, decoded.expires_at_ms, decoded.properties) == (
        True,
        123,
        message.properties,
    )
    assert decode_retained("a/b", b"\x09garbage") is None


# -- WebSocket ---------------------------------------------------------------------------------

KEY = "dGhlIHNhbXBsZSBub25jZQ=="  # RFC 6455 §1.3's example
REQUEST = (
    "GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: keep-alive, Upgrade\r\n"
    f"Sec-WebSocket-Key: {KEY}\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Protocol: mqttv3.1, mqtt\r\n\r\n"
).encode()


def opened() -> WebSocketCodec:
    codec = WebSocketCodec(1 << 20)
    assert codec.receive(REQUEST) == [Handshake("/mqtt", "mqttv3.1")]
    codec.outgoing.clear()
    return codec


def test_accept_key() -> None:
    assert accept_key(KEY) == "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="


def test_handshake_response() -> None:
    codec = WebSocketCodec(1 << 20)
    events = codec.receive(REQUEST[:20])
    assert events == []
    events = codec.receive(REQUEST[20:] + client_frame(OP_BINARY, b"\x10\x00"))
    assert events == [Handshake("/mqtt", "mqttv3.1"), b"\x10\x00"]
    response = codec.outgoing[0].decode()
    assert response.startswith("HTTP/1.1 101 Switching Protocols\r\n")
    assert "Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" in response
    assert "Sec-WebSocket-Protocol: mqttv3.1" in response


def test_handshake_refusals() -> None:
    codec = WebSocketCodec(1 << 20)
    with pytest.raises(WebSocketError):
        codec.receive(REQUEST.replace(b"/mqtt", b"/other"))
    assert codec.outgoing[0].startswith(b"HTTP/1.1 404")
    codec = WebSocketCodec(1 << 20)
    with pytest.raises(WebSocketError):
        codec.receive(REQUEST.replace(b"Version: 13", b"Version: 8"))
    assert codec.outgoing[0].startswith(b"HTTP/1.1 400")


def test_frames_fragments_and_control() -> None:
    codec = opened()
    payload = bytes(range(256)) * 300  # 76,800 bytes: a 64-bit length
    data = (
        client_frame(OP_BINARY, b"ab", fin=False)
        + client_frame(0, b"cd")
        + client_frame(OP_PING, b"hi")
        + client_frame(OP_BINARY, payload)
    )
    events: list[object] = []
    for index in range(0, len(data), 7):  # fed in small pieces
        events += codec.receive(data[index : index + 7])
    assert events[:2] == [b"ab", b"cd"]
    assert b"".join(e for e in events[2:] if isinstance(e, bytes)) == payload
    assert codec.outgoing == [b"\x8a\x02hi"]  # pong
    codec.outgoing.clear()
    assert codec.receive(client_frame(0x8, b"\x03\xe8bye")) == [Close(1000, "bye")]
    assert codec.outgoing == [b"\x88\x02\x03\xe8"]


def test_text_and_unmasked_frames_close() -> None:
    codec = opened()
    with pytest.raises(WebSocketError) as caught:
        codec.receive(client_frame(OP_TEXT, b"{}"))
    assert caught.value.code == CLOSE_UNSUPPORTED_DATA  # [MQTT-6.0.0-1]
    codec = opened()
    with pytest.raises(WebSocketError) as caught:
        codec.receive(b"\x82\x02ab")
    assert caught.value.code == CLOSE_PROTOCOL_ERROR


# -- keep alive grant (options.py) and what non-MQTT bytes look like (sniff.py) ----------------


@pytest.mark.parametrize(
    ("asked", "maximum", "version", "grant"),
    [
        (30, 60, 5, (30, None, False)),
        (60, 60, 5, (60, None, False)),
        (61, 60, 5, (60, 60, False)),  # Server Keep Alive [MQTT-3.2.2-21]
        (0, 60, 5, (60, 60, False)),
        (0, 65_535, 5, (65_535, 65_535, False)),
        (0, 0, 5, (0, None, False)),  # max_keepalive 0: as asked
        (61, 60, 4, (61, None, True)),  # 3.1.1: CONNACK 0x02, as Mosquitto 2.0.14+
        (0, 60, 4, (0, None, True)),
        (0, 65_535, 4, (0, None, False)),  # at the default: let in (options.py says why)
        (65_535, 65_535, 4, (65_535, None, False)),
        (100, 0, 4, (100, None, False)),
    ],
)
def test_grant_keep_alive(
    asked: int, maximum: int, version: int, grant: tuple[int, int | None, bool]
) -> None:
    assert grant_keep_alive(asked, maximum, version) == grant


@pytest.mark.parametrize(
    ("data", "phrase"),
    [
        (b"\x00\x00\x00\x1a\x00\x12\x00\x03\x00\x00\x00\x01", "a Kafka client (ApiVersions v3"),
        (b"\x00\x00\x00\x1a\x00\x03\x00\x01\x00\x00\x00\x01", "a Kafka client (Metadata v1"),
        (b"AMQP\x00\x00\x09\x01", "an AMQP client"),
        (b"GET /mqtt HTTP/1.1\r\n", "an HTTP request (GET)"),
        (b"\x16\x03\x01\x02\x00\x01", "a TLS handshake"),
        (b"\x10\xff\xff\xff\xff", "bytes 10 ff ff ff ff"),
        (b"", "bytes "),
    ],
)
def test_describe_first_bytes(data: bytes, phrase: str) -> None:
    assert describe_first_bytes(data).startswith(phrase)
