"""Packets to bytes, for 3.1.1 (``version=4``) and 5.0 (``version=5``).

``encode(packet, version)`` handles every packet type and checks what it encodes (ranges,
packet identifiers, which properties the packet may carry); a packet that cannot be represented
raises ``MqttEncodeError``. For a 3.1.1 peer, the parts 3.1.1 lacks are left out: properties,
reason codes of acknowledgements; CONNACK and SUBACK codes are mapped to 3.1.1's.

The broker's hot path has its own functions, which take fields instead of a packet object and
skip the checks a broker does not need for packets it builds itself:

- ``encode_publish``: the PUBLISH that delivers a record to a subscriber. Topic names are
  encoded once and kept (``TOPIC_CACHE_SIZE``); properties arrive already encoded
  (``encode_properties``), since they are the same for every subscriber of a record.
- ``encode_puback`` (and ``encode_ack`` for PUBREC / PUBREL / PUBCOMP).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from gateway.mqtt._wire import U16, encode_binary, encode_utf8, encode_varint
from gateway.mqtt.errors import MqttEncodeError
from gateway.mqtt.packet_types import (
    CONNACK_SESSION_PRESENT,
    CONNECT_CLEAN_START,
    CONNECT_PASSWORD,
    CONNECT_USERNAME,
    CONNECT_WILL,
    CONNECT_WILL_QOS_SHIFT,
    CONNECT_WILL_RETAIN,
    MAX_UINT16,
    MQTT_5,
    PROTOCOL_NAME,
    PUBLISH_DUP,
    PUBLISH_QOS_SHIFT,
    PUBLISH_RETAIN,
    REQUIRED_FLAGS,
    SUBSCRIBE_NO_LOCAL,
    SUBSCRIBE_RETAIN_AS_PUBLISHED,
    SUBSCRIBE_RETAIN_HANDLING_SHIFT,
    SUPPORTED_PROTOCOL_LEVELS,
    PacketType,
)
from gateway.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Payload,
    Pingreq,
    Pingresp,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Unsuback,
    Unsubscribe,
)
from gateway.mqtt.properties import (
    NO_PROPERTIES,
    WILL_PROPERTIES,
    Properties,
    check_properties,
    encode_properties,
)
from gateway.mqtt.reason_codes import connack_return_code_v3

# Encoded topic names (u16 length + UTF-8) by topic, shared by all connections: a record is
# delivered to many subscribers under the same name. Bounded, since topics come from clients;
# cleared when full.
TOPIC_CACHE_SIZE = 4096
_topic_prefixes: dict[str, bytes] = {}

# Fixed headers with a 1- and a 2-byte remaining length (below 128, below 16384 bytes).
_HEADER_1 = struct.Struct(">BB")  # first byte, remaining length
_HEADER_2 = struct.Struct(">BBB")  # first byte, length bits 0-6 | 0x80, length bits 7-13
# PUBACK / PUBREC / PUBREL / PUBCOMP: first byte, remaining length 2 or 3, packet id, [reason].
_ACK = struct.Struct(">BBH")
_ACK_WITH_REASON = struct.Struct(">BBHB")
_PID = U16.pack
_PUBLISH_TYPE_BITS = PacketType.PUBLISH << 4
_PUBACK_FIRST_BYTE = PacketType.PUBACK << 4
_EMPTY_PROPERTY_BLOCK = b"\x00"
_PINGREQ_BYTES = b"\xc0\x00"
_PINGRESP_BYTES = b"\xd0\x00"
_DISCONNECT_BYTES = b"\xe0\x00"
_AUTH_SUCCESS_BYTES = b"\xf0\x00"


def _topic_prefix(topic: str) -> bytes:
    """Encode, check and cache a topic name."""
    if "+" in topic or "#" in topic:
        raise MqttEncodeError(f"wildcard in topic name {topic!r} [MQTT-3.3.2-2]")
    prefix = encode_utf8(topic)
    if len(_topic_prefixes) >= TOPIC_CACHE_SIZE:
        _topic_prefixes.clear()
    _topic_prefixes[topic] = prefix
    return prefix


def encode_publish(
    topic: str,
    payload: Payload,
    qos: int = 0,
    packet_id: int | None = None,
    retain: bool = False,
    dup: bool = False,
    properties: bytes = b"",
    version: int = MQTT_5,
) -> bytes:
    """One PUBLISH. ``properties`` is the output of ``encode_properties`` (no length prefix),
    ignored for 3.1.1. ``packet_id`` is required for QoS 1 and 2. Not checked: ``qos`` in 0..2,
    ``packet_id`` in 1..65535, the properties' validity."""
    prefix = _topic_prefixes.get(topic)
    if prefix is None:
        prefix = _topic_prefix(topic)
    if qos:
        if packet_id is None:
            raise MqttEncodeError(f"PUBLISH QoS {qos} without packet identifier")
        prefix += _PID(packet_id)
    if version == MQTT_5:
        if properties:
            prefix += encode_varint(len(properties)) + properties
        else:
            prefix += _EMPTY_PROPERTY_BLOCK
    length = len(prefix) + len(payload)
    first = _PUBLISH_TYPE_BITS | (qos << PUBLISH_QOS_SHIFT)
    if retain:
        first |= PUBLISH_RETAIN
    if dup:
        first |= PUBLISH_DUP
    if length < 0x80:
        return _HEADER_1.pack(first, length) + prefix + payload
    if length < 0x4000:
        return _HEADER_2.pack(first, (length & 0x7F) | 0x80, length >> 7) + prefix + payload
    return bytes((first,)) + encode_varint(length) + prefix + payload


def encode_puback(packet_id: int, reason_code: int = 0, version: int = MQTT_5) -> bytes:
    """One PUBACK; the reason code is left out when it is 0 (5.0 §3.4.2.1) or for 3.1.1."""
    if not reason_code or version != MQTT_5:
        return _ACK.pack(_PUBACK_FIRST_BYTE, 2, packet_id)
    return _ACK_WITH_REASON.pack(_PUBACK_FIRST_BYTE, 3, packet_id, reason_code)


def encode_ack(
    packet_type: PacketType, packet_id: int, reason_code: int = 0, version: int = MQTT_5
) -> bytes:
    """PUBACK, PUBREC, PUBREL or PUBCOMP without properties."""
    first = (packet_type << 4) | REQUIRED_FLAGS[packet_type]
    if not reason_code or version != MQTT_5:
        return _ACK.pack(first, 2, packet_id)
    return _ACK_WITH_REASON.pack(first, 3, packet_id, reason_code)


def encode(packet: Packet, version: int = MQTT_5) -> bytes:
    """The bytes of ``packet`` for a peer speaking ``version`` (4: 3.1.1, 5: 5.0). A CONNECT
    is always encoded in its own ``protocol_level``."""
    if version not in SUPPORTED_PROTOCOL_LEVELS:
        raise MqttEncodeError(f"unsupported MQTT protocol level {version}")
    encoder = _ENCODERS.get(type(packet))
    if encoder is None:
        raise MqttEncodeError(f"not an MQTT packet: {packet!r}")
    try:
        return encoder(packet, version == MQTT_5)
    except MqttEncodeError:
        raise
    except (AttributeError, ValueError, TypeError, OverflowError, struct.error) as exc:
        raise MqttEncodeError(f"cannot encode {packet!r}: {exc}") from None


def _frame(packet_type: PacketType, parts: list[bytes]) -> bytes:
    """Fixed header + body."""
    body = b"".join(parts)
    first = (packet_type << 4) | REQUIRED_FLAGS[packet_type]
    return bytes((first,)) + encode_varint(len(body)) + body


def _no_properties(properties: Properties) -> bool:
    return properties is NO_PROPERTIES or properties == NO_PROPERTIES


def _property_block(properties: Properties, context: int) -> bytes:
    if _no_properties(properties):
        return _EMPTY_PROPERTY_BLOCK
    check_properties(properties, context)
    body = encode_properties(properties)
    return encode_varint(len(body)) + body


def _check_packet_id(packet_id: int | None, what: str) -> int:
    if packet_id is None or not 0 < packet_id <= MAX_UINT16:
        raise MqttEncodeError(f"{what} packet identifier {packet_id!r} not in 1..65535")
    return packet_id


def _check_qos(qos: int, what: str) -> None:
    if qos not in (0, 1, 2):
        raise MqttEncodeError(f"{what} QoS {qos!r} not in 0..2")


def _encode_connect(packet: Connect, _v5: bool) -> bytes:
    level = packet.protocol_level
    if level not in SUPPORTED_PROTOCOL_LEVELS:
        raise MqttEncodeError(f"unsupported protocol level {level}")
    v5 = level == MQTT_5
    flags = CONNECT_CLEAN_START if packet.clean_start else 0
    will = packet.will
    if will is not None:
        _check_qos(will.qos, "will")
        flags |= CONNECT_WILL | (will.qos << CONNECT_WILL_QOS_SHIFT)
        if will.retain:
            flags |= CONNECT_WILL_RETAIN
    if packet.username is not None:
        flags |= CONNECT_USERNAME
    if packet.password is not None:
        if not v5 and packet.username is None:
            raise MqttEncodeError("3.1.1 CONNECT with a password needs a user name [MQTT-3.1.2-22]")
        flags |= CONNECT_PASSWORD
    if not 0 <= packet.keep_alive <= MAX_UINT16:
        raise MqttEncodeError(f"keep alive {packet.keep_alive} not in 0..65535")
    parts = [U16.pack(len(PROTOCOL_NAME)), PROTOCOL_NAME, bytes((level, flags))]
    parts.append(U16.pack(packet.keep_alive))
    if v5:
        parts.append(_property_block(packet.properties, PacketType.CONNECT))
    parts.append(encode_utf8(packet.client_id))
    if will is not None:
        if v5:
            parts.append(_property_block(will.properties, WILL_PROPERTIES))
        parts += (encode_utf8(will.topic), encode_binary(will.payload))
    if packet.username is not None:
        parts.append(encode_utf8(packet.username))
    if packet.password is not None:
        parts.append(encode_binary(packet.password))
    return _frame(PacketType.CONNECT, parts)


def _encode_connack(packet: Connack, v5: bool) -> bytes:
    code = packet.reason_code if v5 else connack_return_code_v3(packet.reason_code)
    if packet.session_present and code:
        raise MqttEncodeError("CONNACK refusing a connection has session present 0 [MQTT-3.2.2-6]")
    parts = [bytes((CONNACK_SESSION_PRESENT if packet.session_present else 0, code))]
    if v5:
        parts.append(_property_block(packet.properties, PacketType.CONNACK))
    return _frame(PacketType.CONNACK, parts)


def _encode_publish(packet: Publish, v5: bool) -> bytes:
    qos = packet.qos
    _check_qos(qos, "PUBLISH")
    if qos:
        _check_packet_id(packet.packet_id, "PUBLISH")
    elif packet.packet_id is not None:
        raise MqttEncodeError("PUBLISH QoS 0 has no packet identifier [MQTT-2.2.1-2]")
    elif packet.dup:
        raise MqttEncodeError("PUBLISH QoS 0 has DUP 0 [MQTT-3.3.1-2]")
    properties = b""
    if v5 and not _no_properties(packet.properties):
        check_properties(packet.properties, PacketType.PUBLISH)
        properties = encode_properties(packet.properties)
    if not packet.topic and (not v5 or packet.properties.topic_alias is None):
        raise MqttEncodeError("PUBLISH without topic name or topic alias")
    return encode_publish(
        packet.topic,
        packet.payload,
        qos,
        packet.packet_id,
        packet.retain,
        packet.dup,
        properties,
        MQTT_5 if v5 else 4,
    )


def _encode_ack(packet: Puback | Pubrec | Pubrel | Pubcomp, v5: bool) -> bytes:
    packet_type = packet.TYPE
    packet_id = _check_packet_id(packet.packet_id, packet_type.name)
    if not v5 or _no_properties(packet.properties):
        return encode_ack(packet_type, packet_id, packet.reason_code, MQTT_5 if v5 else 4)
    block = _property_block(packet.properties, packet_type)
    return _frame(packet_type, [U16.pack(packet_id), bytes((packet.reason_code,)), block])


def _encode_subscribe(packet: Subscribe, v5: bool) -> bytes:
    parts = [U16.pack(_check_packet_id(packet.packet_id, "SUBSCRIBE"))]
    if v5:
        parts.append(_property_block(packet.properties, PacketType.SUBSCRIBE))
    if not packet.subscriptions:
        raise MqttEncodeError("SUBSCRIBE without subscriptions [MQTT-3.8.3-2]")
    for subscription in packet.subscriptions:
        _check_qos(subscription.qos, "SUBSCRIBE")
        options = subscription.qos
        if v5:
            if subscription.retain_handling not in (0, 1, 2):
                raise MqttEncodeError(f"retain handling {subscription.retain_handling} not 0..2")
            options |= subscription.retain_handling << SUBSCRIBE_RETAIN_HANDLING_SHIFT
            if subscription.no_local:
                options |= SUBSCRIBE_NO_LOCAL
            if subscription.retain_as_published:
                options |= SUBSCRIBE_RETAIN_AS_PUBLISHED
        parts += (encode_utf8(subscription.topic_filter), bytes((options,)))
    return _frame(PacketType.SUBSCRIBE, parts)


def _encode_suback(packet: Suback, v5: bool) -> bytes:
    parts = [U16.pack(_check_packet_id(packet.packet_id, "SUBACK"))]
    if not packet.reason_codes:
        raise MqttEncodeError("SUBACK without reason codes")
    if v5:
        parts += (_property_block(packet.properties, PacketType.SUBACK), bytes(packet.reason_codes))
    else:
        # 3.1.1 has one failure code, 0x80 (§3.9.3); 5.0's refusals are all >= 0x80.
        parts.append(bytes(code if code < 0x80 else 0x80 for code in packet.reason_codes))
    return _frame(PacketType.SUBACK, parts)


def _encode_unsubscribe(packet: Unsubscribe, v5: bool) -> bytes:
    parts = [U16.pack(_check_packet_id(packet.packet_id, "UNSUBSCRIBE"))]
    if v5:
        parts.append(_property_block(packet.properties, PacketType.UNSUBSCRIBE))
    if not packet.topic_filters:
        raise MqttEncodeError("UNSUBSCRIBE without topic filters [MQTT-3.10.3-2]")
    parts += (encode_utf8(topic_filter) for topic_filter in packet.topic_filters)
    return _frame(PacketType.UNSUBSCRIBE, parts)


def _encode_unsuback(packet: Unsuback, v5: bool) -> bytes:
    parts = [U16.pack(_check_packet_id(packet.packet_id, "UNSUBACK"))]
    if v5:
        if not packet.reason_codes:
            raise MqttEncodeError("5.0 UNSUBACK without reason codes")
        block = _property_block(packet.properties, PacketType.UNSUBACK)
        parts += (block, bytes(packet.reason_codes))
    return _frame(PacketType.UNSUBACK, parts)


def _encode_pingreq(_packet: Pingreq, _v5: bool) -> bytes:
    return _PINGREQ_BYTES


def _encode_pingresp(_packet: Pingresp, _v5: bool) -> bytes:
    return _PINGRESP_BYTES


def _encode_disconnect(packet: Disconnect, v5: bool) -> bytes:
    if not v5 or (not packet.reason_code and _no_properties(packet.properties)):
        return _DISCONNECT_BYTES
    return _frame(PacketType.DISCONNECT, _reason_and_properties(packet, PacketType.DISCONNECT))


def _encode_auth(packet: Auth, v5: bool) -> bytes:
    if not v5:
        raise MqttEncodeError("AUTH does not exist in MQTT 3.1.1")
    if not packet.reason_code and _no_properties(packet.properties):
        return _AUTH_SUCCESS_BYTES
    return _frame(PacketType.AUTH, _reason_and_properties(packet, PacketType.AUTH))


def _reason_and_properties(packet: Disconnect | Auth, packet_type: PacketType) -> list[bytes]:
    parts = [bytes((packet.reason_code,))]
    if not _no_properties(packet.properties):
        parts.append(_property_block(packet.properties, packet_type))
    return parts


_ENCODERS: dict[type[Any], Callable[[Any, bool], bytes]] = {
    Connect: _encode_connect,
    Connack: _encode_connack,
    Publish: _encode_publish,
    Puback: _encode_ack,
    Pubrec: _encode_ack,
    Pubrel: _encode_ack,
    Pubcomp: _encode_ack,
    Subscribe: _encode_subscribe,
    Suback: _encode_suback,
    Unsubscribe: _encode_unsubscribe,
    Unsuback: _encode_unsuback,
    Pingreq: _encode_pingreq,
    Pingresp: _encode_pingresp,
    Disconnect: _encode_disconnect,
    Auth: _encode_auth,
}
