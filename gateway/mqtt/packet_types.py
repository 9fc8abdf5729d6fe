"""Fixed-header constants shared by 3.1.1 and 5.0: packet types, flag bits, protocol levels, limits.

Fixed header (§2.1.1 of both versions)::

    byte 0     bits 7-4 packet type, bits 3-0 flags (PUBLISH: DUP, QoS (2 bits), RETAIN)
    byte 1..4  remaining length, Variable Byte Integer (7 bits a byte, bit 7 = "more")
"""

from __future__ import annotations

from enum import IntEnum


class PacketType(IntEnum):
    # 0 is reserved / forbidden in both versions.
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # 5.0 only; reserved in 3.1.1


# Protocol levels carried in CONNECT (§3.1.2.2).
MQTT_3_1_1 = 4
MQTT_5 = 5
SUPPORTED_PROTOCOL_LEVELS = frozenset((MQTT_3_1_1, MQTT_5))
PROTOCOL_NAME = b"MQTT"  # a UTF-8 Encoded String on the wire (§3.1.2.1)

# PUBLISH fixed-header flags (§3.3.1).
PUBLISH_DUP = 0x08
PUBLISH_QOS_MASK = 0x06
PUBLISH_QOS_SHIFT = 1
PUBLISH_RETAIN = 0x01

# [MQTT-2.1.3-1] reserved flag bits of every packet type but PUBLISH: PUBREL, SUBSCRIBE and
# UNSUBSCRIBE carry 0b0010, the rest 0b0000. Anything else is a Malformed Packet.
REQUIRED_FLAGS: dict[int, int] = {
    PacketType.CONNECT: 0x0,
    PacketType.CONNACK: 0x0,
    PacketType.PUBACK: 0x0,
    PacketType.PUBREC: 0x0,
    PacketType.PUBREL: 0x2,
    PacketType.PUBCOMP: 0x0,
    PacketType.SUBSCRIBE: 0x2,
    PacketType.SUBACK: 0x0,
    PacketType.UNSUBSCRIBE: 0x2,
    PacketType.UNSUBACK: 0x0,
    PacketType.PINGREQ: 0x0,
    PacketType.PINGRESP: 0x0,
    PacketType.DISCONNECT: 0x0,
    PacketType.AUTH: 0x0,
}

# CONNECT flags byte (§3.1.2.3).
CONNECT_RESERVED = 0x01  # [MQTT-3.1.2-3] must be 0
CONNECT_CLEAN_START = 0x02
CONNECT_WILL = 0x04
CONNECT_WILL_QOS_MASK = 0x18
CONNECT_WILL_QOS_SHIFT = 3
CONNECT_WILL_RETAIN = 0x20
CONNECT_PASSWORD = 0x40
CONNECT_USERNAME = 0x80

# CONNACK acknowledge flags (§3.2.2.1): bit 0 session present, bits 7-1 reserved [MQTT-3.2.2-1].
CONNACK_SESSION_PRESENT = 0x01

# SUBSCRIBE options byte (5.0 §3.8.3.1; 3.1.1 only has the QoS bits).
SUBSCRIBE_QOS_MASK = 0x03
SUBSCRIBE_NO_LOCAL = 0x04
SUBSCRIBE_RETAIN_AS_PUBLISHED = 0x08
SUBSCRIBE_RETAIN_HANDLING_MASK = 0x30
SUBSCRIBE_RETAIN_HANDLING_SHIFT = 4
SUBSCRIBE_RESERVED_V5 = 0xC0  # [MQTT-3.8.3-5]
SUBSCRIBE_RESERVED_V3 = 0xFC  # [MQTT-3-8.3-4] of 3.1.1

# Limits set by the encoding itself.
MAX_REMAINING_LENGTH = 268_435_455  # largest 4-byte Variable Byte Integer (§1.5.5)
MAX_VARINT_BYTES = 4
MAX_UINT16 = 0xFFFF
MAX_UINT32 = 0xFFFF_FFFF
MAX_SUBSCRIPTION_IDENTIFIER = MAX_REMAINING_LENGTH  # §3.8.2.1.2: 1 .. 268,435,455
# A fixed header is 1 byte of type/flags and 1..4 bytes of remaining length.
MAX_FIXED_HEADER = 1 + MAX_VARINT_BYTES
# The largest packet the encoding allows; the decoder's default limit is lower.
MAX_PACKET_SIZE = MAX_FIXED_HEADER + MAX_REMAINING_LENGTH
