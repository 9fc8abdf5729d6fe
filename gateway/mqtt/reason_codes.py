"""MQTT reason codes (5.0 §2.4) and the sets each packet type may carry.

Packets store reason codes as plain ``int`` (what is on the wire); compare them with the
``ReasonCode`` members, which are ``IntEnum`` values. 3.1.1 has no reason codes except the CONNACK
return code (§3.2.2.3 of 3.1.1) and the SUBACK return codes, whose values coincide with 5.0's
(0x00, 0x01, 0x02 granted, 0x80 failure).
"""

from __future__ import annotations

from enum import IntEnum

from gateway.mqtt.packet_types import PacketType


class ReasonCode(IntEnum):
    """Every 5.0 reason code. 0x00 has three names, one per context."""

    SUCCESS = 0x00
    NORMAL_DISCONNECTION = 0x00
    GRANTED_QOS_0 = 0x00
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


# 5.0: the reason codes a packet of each type may carry (§3.2.2.2, §3.4.2.1, ... §3.15.2.1).
# [MQTT-3.4.2-1] "The Client or Server sending the PUBACK packet MUST use one of the PUBACK
# Reason Codes"; likewise for the other packets. Anything else received is a Protocol Error.
ALLOWED_REASON_CODES: dict[PacketType, frozenset[int]] = {
    PacketType.CONNACK: frozenset(
        {0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C}
        | {0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F}
    ),
    PacketType.PUBACK: frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)),
    PacketType.PUBREC: frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)),
    PacketType.PUBREL: frozenset((0x00, 0x92)),
    PacketType.PUBCOMP: frozenset((0x00, 0x92)),
    PacketType.SUBACK: frozenset(
        (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)
    ),
    PacketType.UNSUBACK: frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)),
    PacketType.DISCONNECT: frozenset(
        {0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90}
        | {0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F}
        | {0xA0, 0xA1, 0xA2}
    ),
    PacketType.AUTH: frozenset((0x00, 0x18, 0x19)),
}

# 3.1.1 §3.9.3: SUBACK return codes.
V3_SUBACK_RETURN_CODES = frozenset((0x00, 0x01, 0x02, 0x80))

# 3.1.1 §3.2.2.3: CONNACK return codes 0..5. Values 6..255 are reserved.
V3_CONNACK_MAX_RETURN_CODE = 0x05

# 5.0 CONNACK reason code -> nearest 3.1.1 return code, so a session can always speak 5.0 codes and
# let the encoder translate for a 3.1.1 client. 0x01 unacceptable protocol version, 0x02 identifier
# rejected, 0x03 server unavailable, 0x04 bad user name or password, 0x05 not authorized.
# Anything else that refuses a connection becomes 0x03, as mosquitto does.
V3_CONNACK_RETURN_CODE: dict[int, int] = {
    0x00: 0x00,
    0x84: 0x01,
    0x85: 0x02,
    0x88: 0x03,
    0x89: 0x03,
    0x86: 0x04,
    0x87: 0x05,
    0x8A: 0x05,
    0x8C: 0x05,
}
V3_CONNACK_FALLBACK = 0x03


def connack_return_code_v3(reason_code: int) -> int:
    """The 3.1.1 CONNACK return code for a reason code (either a 3.1.1 code or a 5.0 one)."""
    if reason_code <= V3_CONNACK_MAX_RETURN_CODE:
        return reason_code
    return V3_CONNACK_RETURN_CODE.get(reason_code, V3_CONNACK_FALLBACK)
