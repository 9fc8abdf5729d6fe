"""MQTT 5.0 properties (§2.2.2): their identifiers, types, the packets each may appear in, and
the encoding of a property block.

A property block is a Variable Byte Integer length followed by properties, each an identifier
(a Variable Byte Integer; every identifier defined so far fits one byte) and a value of the type
the identifier fixes. Rules enforced on decode (5.0 §2.2.2.2):

- an identifier unknown, or not valid for the packet, is a Malformed Packet (0x81);
- a property given twice is a Protocol Error (0x82), except User Property (any number, order
  kept [MQTT-3.3.2-18]) and Subscription Identifier in PUBLISH (one per matching subscription);
- values outside their range are a Protocol Error: the 0/1 flags, Receive Maximum 0,
  Maximum Packet Size 0, Topic Alias 0 [MQTT-3.3.2-8], Subscription Identifier 0,
  Authentication Data without Authentication Method.

``Properties`` is one frozen dataclass for all packets; a field left at ``None`` / ``()`` is not
sent. 3.1.1 packets always carry ``NO_PROPERTIES``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from gateway.mqtt._frozen import frozen_builder
from gateway.mqtt._wire import (
    U16,
    U32,
    Reader,
    encode_binary,
    encode_utf8,
    encode_varint,
)
from gateway.mqtt.errors import MqttEncodeError, malformed, protocol_error
from gateway.mqtt.packet_types import (
    MAX_SUBSCRIPTION_IDENTIFIER,
    PacketType,
)


class PropertyType(IntEnum):
    """Value types of properties (§2.2.2.2)."""

    BYTE = 1
    TWO_BYTE_INT = 2
    FOUR_BYTE_INT = 3
    VARINT = 4
    UTF8 = 5
    UTF8_PAIR = 6
    BINARY = 7


class PropertyId(IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


# The Will Properties of a CONNECT payload are a property block of their own (§3.1.3.2) with
# their own allowed set; they are keyed by this pseudo packet type, next to the PacketTypes.
WILL_PROPERTIES = 0

_P = PacketType
_EVERY_ACK = (_P.PUBACK, _P.PUBREC, _P.PUBREL, _P.PUBCOMP)
_MESSAGE = (_P.PUBLISH, WILL_PROPERTIES)


class PropertySpec(NamedTuple):
    id: int
    field: str  # the ``Properties`` attribute
    type: PropertyType
    packets: frozenset[int]  # PacketType values, or WILL_PROPERTIES


def _spec(pid: PropertyId, field: str, ptype: PropertyType, *packets: int) -> PropertySpec:
    return PropertySpec(int(pid), field, ptype, frozenset(int(p) for p in packets))


_T = PropertyType
_I = PropertyId
# The table of §2.2.2.2, in identifier order, which is also the order properties are encoded in.
PROPERTY_SPECS: tuple[PropertySpec, ...] = (
    _spec(_I.PAYLOAD_FORMAT_INDICATOR, "payload_format_indicator", _T.BYTE, *_MESSAGE),
    _spec(_I.MESSAGE_EXPIRY_INTERVAL, "message_expiry_interval", _T.FOUR_BYTE_INT, *_MESSAGE),
    _spec(_I.CONTENT_TYPE, "content_type", _T.UTF8, *_MESSAGE),
    _spec(_I.RESPONSE_TOPIC, "response_topic", _T.UTF8, *_MESSAGE),
    _spec(_I.CORRELATION_DATA, "correlation_data", _T.BINARY, *_MESSAGE),
    _spec(
        _I.SUBSCRIPTION_IDENTIFIER, "subscription_identifiers", _T.VARINT, _P.PUBLISH, _P.SUBSCRIBE
    ),
    _spec(
        _I.SESSION_EXPIRY_INTERVAL,
        "session_expiry_interval",
        _T.FOUR_BYTE_INT,
        _P.CONNECT,
        _P.CONNACK,
        _P.DISCONNECT,
    ),
    _spec(_I.ASSIGNED_CLIENT_IDENTIFIER, "assigned_client_identifier", _T.UTF8, _P.CONNACK),
    _spec(_I.SERVER_KEEP_ALIVE, "server_keep_alive", _T.TWO_BYTE_INT, _P.CONNACK),
    _spec(
        _I.AUTHENTICATION_METHOD,
        "authentication_method",
        _T.UTF8,
        _P.CONNECT,
        _P.CONNACK,
        _P.AUTH,
    ),
    _spec(
        _I.AUTHENTICATION_DATA, "authentication_data", _T.BINARY, _P.CONNECT, _P.CONNACK, _P.AUTH
    ),
    _spec(_I.REQUEST_PROBLEM_INFORMATION, "request_problem_information", _T.BYTE, _P.CONNECT),
    _spec(_I.WILL_DELAY_INTERVAL, "will_delay_interval", _T.FOUR_BYTE_INT, WILL_PROPERTIES),
    _spec(_I.REQUEST_RESPONSE_INFORMATION, "request_response_information", _T.BYTE, _P.CONNECT),
    _spec(_I.RESPONSE_INFORMATION, "response_information", _T.UTF8, _P.CONNACK),
    _spec(_I.SERVER_REFERENCE, "server_reference", _T.UTF8, _P.CONNACK, _P.DISCONNECT),
    _spec(
        _I.REASON_STRING,
        "reason_string",
        _T.UTF8,
        _P.CONNACK,
        *_EVERY_ACK,
        _P.SUBACK,
        _P.UNSUBACK,
        _P.DISCONNECT,
        _P.AUTH,
    ),
    _spec(_I.RECEIVE_MAXIMUM, "receive_maximum", _T.TWO_BYTE_INT, _P.CONNECT, _P.CONNACK),
    _spec(_I.TOPIC_ALIAS_MAXIMUM, "topic_alias_maximum", _T.TWO_BYTE_INT, _P.CONNECT, _P.CONNACK),
    _spec(_I.TOPIC_ALIAS, "topic_alias", _T.TWO_BYTE_INT, _P.PUBLISH),
    _spec(_I.MAXIMUM_QOS, "maximum_qos", _T.BYTE, _P.CONNACK),
    _spec(_I.RETAIN_AVAILABLE, "retain_available", _T.BYTE, _P.CONNACK),
    _spec(
        _I.USER_PROPERTY,
        "user_properties",
        _T.UTF8_PAIR,
        _P.CONNECT,
        _P.CONNACK,
        *_MESSAGE,
        *_EVERY_ACK,
        _P.SUBSCRIBE,
        _P.SUBACK,
        _P.UNSUBSCRIBE,
        _P.UNSUBACK,
        _P.DISCONNECT,
        _P.AUTH,
    ),
    _spec(_I.MAXIMUM_PACKET_SIZE, "maximum_packet_size", _T.FOUR_BYTE_INT, _P.CONNECT, _P.CONNACK),
    _spec(
        _I.WILDCARD_SUBSCRIPTION_AVAILABLE, "wildcard_subscription_available", _T.BYTE, _P.CONNACK
    ),
    _spec(
        _I.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        "subscription_identifiers_available",
        _T.BYTE,
        _P.CONNACK,
    ),
    _spec(_I.SHARED_SUBSCRIPTION_AVAILABLE, "shared_subscription_available", _T.BYTE, _P.CONNACK),
)
PROPERTY_BY_ID: dict[int, PropertySpec] = {spec.id: spec for spec in PROPERTY_SPECS}

# Properties whose value is 0 or 1; any other value is a Protocol Error (§3.1.2.11.6-7, §3.2.2.3).
_ZERO_OR_ONE = frozenset(
    (
        "payload_format_indicator",
        "request_problem_information",
        "request_response_information",
        "maximum_qos",
        "retain_available",
        "wildcard_subscription_available",
        "subscription_identifiers_available",
        "shared_subscription_available",
    )
)
# Properties for which 0 is a Protocol Error: §3.1.2.11.3 Receive Maximum, §3.1.2.11.4 Maximum
# Packet Size, [MQTT-3.3.2-8] Topic Alias, §3.8.2.1.2 Subscription Identifier.
_NOT_ZERO = frozenset(
    ("receive_maximum", "maximum_packet_size", "topic_alias", "subscription_identifiers")
)


@dataclass(frozen=True, slots=True, repr=False)
class Properties:
    """All 5.0 properties of one packet. ``None`` / ``()`` means absent."""

    payload_format_indicator: int | None = None
    message_expiry_interval: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation_data: bytes | None = None
    # Several in a PUBLISH sent to a client (one per matching subscription), one in SUBSCRIBE.
    subscription_identifiers: tuple[int, ...] = ()
    session_expiry_interval: int | None = None
    assigned_client_identifier: str | None = None
    server_keep_alive: int | None = None
    authentication_method: str | None = None
    authentication_data: bytes | None = None
    request_problem_information: int | None = None
    will_delay_interval: int | None = None
    request_response_information: int | None = None
    response_information: str | None = None
    server_reference: str | None = None
    reason_string: str | None = None
    receive_maximum: int | None = None
    topic_alias_maximum: int | None = None
    topic_alias: int | None = None
    maximum_qos: int | None = None
    retain_available: int | None = None
    # Repeatable; the order is kept [MQTT-3.3.2-18].
    user_properties: tuple[tuple[str, str], ...] = ()
    maximum_packet_size: int | None = None
    wildcard_subscription_available: int | None = None
    subscription_identifiers_available: int | None = None
    shared_subscription_available: int | None = None

    def __repr__(self) -> str:
        """Only the properties present: ``Properties(topic_alias=3)``."""
        present = []
        for spec in PROPERTY_SPECS:
            value = getattr(self, spec.field)
            if value is not None and value != ():
                present.append(f"{spec.field}={value!r}")
        return f"Properties({', '.join(present)})"


NO_PROPERTIES = Properties()
_build_properties = frozen_builder(Properties)

# context -> identifier -> spec, for the decoder: one dict lookup decides known-and-allowed.
_ALLOWED: dict[int, dict[int, PropertySpec]] = {
    context: {spec.id: spec for spec in PROPERTY_SPECS if context in spec.packets}
    for context in (WILL_PROPERTIES, *PacketType)
}
_REPEATABLE = "user_properties"


def _context_name(context: int) -> str:
    return "Will Properties" if context == WILL_PROPERTIES else PacketType(context).name


def decode_properties(reader: Reader, context: int) -> Properties:
    """Read a property block (length + properties) for packet type ``context``."""
    length = reader.varint()
    if length == 0:
        return NO_PROPERTIES
    end = reader.pos + length
    if end > reader.end:
        raise malformed(f"property length {length} runs past the end of the packet")
    allowed = _ALLOWED[context]
    values: dict[str, Any] = {}
    user_properties: list[tuple[str, str]] = []
    subscription_identifiers: list[int] = []
    outer_end = reader.end
    reader.end = end
    try:
        while reader.pos < end:
            pid = reader.u8()
            spec = allowed.get(pid)
            if spec is None:
                if pid in PROPERTY_BY_ID:
                    field = PROPERTY_BY_ID[pid].field
                    raise malformed(f"property {field} not allowed in {_context_name(context)}")
                raise malformed(f"unknown property identifier 0x{pid:02X}")
            ptype = spec.type
            field = spec.field
            value: Any
            if ptype is _T.UTF8_PAIR:
                user_properties.append((reader.utf8(), reader.utf8()))
                continue
            if ptype is _T.BYTE:
                value = reader.u8()
            elif ptype is _T.TWO_BYTE_INT:
                value = reader.u16()
            elif ptype is _T.FOUR_BYTE_INT:
                value = reader.u32()
            elif ptype is _T.VARINT:
                value = reader.varint()
            elif ptype is _T.UTF8:
                value = reader.utf8()
            else:
                value = reader.binary()
            if field in _ZERO_OR_ONE and value > 1:
                raise protocol_error(f"{field} must be 0 or 1, got {value}")
            if field in _NOT_ZERO and value == 0:
                raise protocol_error(f"{field} must not be 0")
            if ptype is _T.VARINT:  # the Subscription Identifier, the only varint property
                if subscription_identifiers and context != PacketType.PUBLISH:
                    where = _context_name(context)
                    raise protocol_error(f"subscription identifier twice in {where}")
                subscription_identifiers.append(value)
                continue
            if field in values:
                raise protocol_error(f"property {field} twice in {_context_name(context)}")
            values[field] = value
    finally:
        reader.end = outer_end
    if "authentication_data" in values and "authentication_method" not in values:
        raise protocol_error("authentication data without an authentication method")
    if user_properties:
        values[_REPEATABLE] = tuple(user_properties)
    if subscription_identifiers:
        values["subscription_identifiers"] = tuple(subscription_identifiers)
    return _build_properties(**values)


def check_properties(props: Properties, context: int) -> None:
    """Raise ``MqttEncodeError`` if ``props`` holds a property not allowed in ``context``."""
    if props is NO_PROPERTIES:
        return
    for spec in PROPERTY_SPECS:
        value = getattr(props, spec.field)
        if value is None or value == ():
            continue
        if context not in spec.packets:
            raise MqttEncodeError(f"property {spec.field} not allowed in {_context_name(context)}")
    if len(props.subscription_identifiers) > 1 and context != PacketType.PUBLISH:
        raise MqttEncodeError(f"several subscription identifiers in {_context_name(context)}")


def encode_properties(props: Properties) -> bytes:
    """The properties of ``props`` without the length prefix, in identifier order.

    The broker can encode a record's properties once and hand the bytes to
    ``encode_publish`` for every subscriber (adding per-subscriber ones, such as a Subscription
    Identifier, with ``encode_subscription_identifier``).
    """
    if props is NO_PROPERTIES:
        return b""
    parts: list[bytes] = []
    for spec in PROPERTY_SPECS:
        value = getattr(props, spec.field)
        if value is None:
            continue
        try:
            parts += _encode_value(spec, value)
        except MqttEncodeError:
            raise
        except (AttributeError, ValueError, TypeError, OverflowError, struct.error) as exc:
            raise MqttEncodeError(f"property {spec.field}={value!r}: {exc}") from None
    return b"".join(parts)


def _encode_value(spec: PropertySpec, value: Any) -> list[bytes]:
    ptype = spec.type
    head = _SMALL_IDS[spec.id]
    if ptype is _T.UTF8_PAIR:
        return [b for key, item in value for b in (head, encode_utf8(key), encode_utf8(item))]
    if ptype is _T.VARINT:
        return [encode_subscription_identifier(identifier) for identifier in value]
    if ptype is _T.BYTE:
        return [head, bytes((value,))]
    if ptype is _T.TWO_BYTE_INT:
        return [head, U16.pack(value)]
    if ptype is _T.FOUR_BYTE_INT:
        return [head, U32.pack(value)]
    if ptype is _T.UTF8:
        return [head, encode_utf8(value)]
    return [head, encode_binary(value)]


_SMALL_IDS = {spec.id: bytes((spec.id,)) for spec in PROPERTY_SPECS}


def encode_subscription_identifier(identifier: int) -> bytes:
    """One Subscription Identifier property (identifier 0x0B + Variable Byte Integer)."""
    if not 0 < identifier <= MAX_SUBSCRIPTION_IDENTIFIER:
        raise MqttEncodeError(f"subscription identifier {identifier} not in 1..268435455")
    return b"\x0b" + encode_varint(identifier)


def encode_property_block(props: Properties) -> bytes:
    """Length + properties, as they appear in a 5.0 packet."""
    body = encode_properties(props)
    return encode_varint(len(body)) + body
