"""The MQTT control packets of 3.1.1 and 5.0 as frozen, slotted dataclasses.

One class per packet type serves both versions; the fields only 5.0 has (reason codes on
acknowledgements, properties) stay at their defaults in 3.1.1 packets, and the encoder leaves
them out for a 3.1.1 peer. Reason codes are plain ints (compare with ``ReasonCode``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from gateway.mqtt.packet_types import MQTT_5, PacketType
from gateway.mqtt.properties import NO_PROPERTIES, Properties

# A payload is the bytes of the PUBLISH. The decoder hands out ``bytes`` for small payloads and
# a read-only memoryview into its receive buffer (no copy) for large ones; a caller building a
# packet usually passes bytes. Both compare equal to bytes with the same content.
Payload = bytes | memoryview

# Payload bytes shown by ``repr(Publish)``.
REPR_PAYLOAD_BYTES = 64


@dataclass(frozen=True, slots=True)
class Will:
    """The Will Message of a CONNECT (§3.1.2.5, §3.1.3.2-4)."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    properties: Properties = NO_PROPERTIES  # the Will Properties (5.0)


@dataclass(frozen=True, slots=True)
class Connect:
    """CONNECT (§3.1). ``protocol_level`` is 4 (3.1.1) or 5 (5.0)."""

    TYPE: ClassVar[PacketType] = PacketType.CONNECT

    client_id: str = ""
    protocol_level: int = MQTT_5
    clean_start: bool = True  # "Clean Session" in 3.1.1
    keep_alive: int = 0  # seconds, 0 = off
    username: str | None = None
    password: bytes | None = None
    will: Will | None = None
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Connack:
    """CONNACK (§3.2). ``reason_code`` is the 3.1.1 return code (0..5) or a 5.0 reason code;
    the encoder maps 5.0 codes to 3.1.1 ones for a 3.1.1 peer (``connack_return_code_v3``)."""

    TYPE: ClassVar[PacketType] = PacketType.CONNACK

    session_present: bool = False
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True, repr=False)
class Publish:
    """PUBLISH (§3.3). ``packet_id`` is None exactly when ``qos`` is 0. In 5.0 ``topic`` may be
    empty when ``properties.topic_alias`` names it."""

    TYPE: ClassVar[PacketType] = PacketType.PUBLISH

    topic: str
    payload: Payload = b""
    qos: int = 0
    retain: bool = False
    dup: bool = False
    packet_id: int | None = None
    properties: Properties = NO_PROPERTIES

    def __repr__(self) -> str:
        """The payload shown as bytes (a memoryview's repr is only its address), cut short."""
        payload = bytes(self.payload[:REPR_PAYLOAD_BYTES])
        more = (
            f"+{len(self.payload) - REPR_PAYLOAD_BYTES}"
            if len(self.payload) > REPR_PAYLOAD_BYTES
            else ""
        )
        return (
            f"Publish(topic={self.topic!r}, payload={payload!r}{more}, qos={self.qos}, "
            f"retain={self.retain}, dup={self.dup}, packet_id={self.packet_id}, "
            f"properties={self.properties!r})"
        )


@dataclass(frozen=True, slots=True)
class Puback:
    """PUBACK (§3.4): QoS 1 acknowledgement."""

    TYPE: ClassVar[PacketType] = PacketType.PUBACK

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pubrec:
    """PUBREC (§3.5): QoS 2, part 1."""

    TYPE: ClassVar[PacketType] = PacketType.PUBREC

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pubrel:
    """PUBREL (§3.6): QoS 2, part 2."""

    TYPE: ClassVar[PacketType] = PacketType.PUBREL

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pubcomp:
    """PUBCOMP (§3.7): QoS 2, part 3."""

    TYPE: ClassVar[PacketType] = PacketType.PUBCOMP

    packet_id: int
    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Subscription:
    """A Topic Filter and its Subscription Options (§3.8.3.1). 3.1.1 has only ``qos``."""

    topic_filter: str
    qos: int = 0
    no_local: bool = False
    retain_as_published: bool = False
    retain_handling: int = 0  # 0 send retained, 1 only if new subscription, 2 never


@dataclass(frozen=True, slots=True)
class Subscribe:
    """SUBSCRIBE (§3.8). The Subscription Identifier is ``properties.subscription_identifiers``
    (at most one), also available as ``subscription_identifier``."""

    TYPE: ClassVar[PacketType] = PacketType.SUBSCRIBE

    packet_id: int
    subscriptions: tuple[Subscription, ...]
    properties: Properties = NO_PROPERTIES

    @property
    def subscription_identifier(self) -> int | None:
        identifiers = self.properties.subscription_identifiers
        return identifiers[0] if identifiers else None


@dataclass(frozen=True, slots=True)
class Suback:
    """SUBACK (§3.9): one reason code (3.1.1: return code) per subscription, in order."""

    TYPE: ClassVar[PacketType] = PacketType.SUBACK

    packet_id: int
    reason_codes: tuple[int, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """UNSUBSCRIBE (§3.10)."""

    TYPE: ClassVar[PacketType] = PacketType.UNSUBSCRIBE

    packet_id: int
    topic_filters: tuple[str, ...]
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Unsuback:
    """UNSUBACK (§3.11). 3.1.1 has no reason codes: ``reason_codes`` is then ``()``."""

    TYPE: ClassVar[PacketType] = PacketType.UNSUBACK

    packet_id: int
    reason_codes: tuple[int, ...] = ()
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Pingreq:
    """PINGREQ (§3.12)."""

    TYPE: ClassVar[PacketType] = PacketType.PINGREQ


@dataclass(frozen=True, slots=True)
class Pingresp:
    """PINGRESP (§3.13)."""

    TYPE: ClassVar[PacketType] = PacketType.PINGRESP


@dataclass(frozen=True, slots=True)
class Disconnect:
    """DISCONNECT (§3.14). 3.1.1 has neither reason code nor properties."""

    TYPE: ClassVar[PacketType] = PacketType.DISCONNECT

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


@dataclass(frozen=True, slots=True)
class Auth:
    """AUTH (5.0 §3.15): extended authentication exchange."""

    TYPE: ClassVar[PacketType] = PacketType.AUTH

    reason_code: int = 0
    properties: Properties = NO_PROPERTIES


Packet = (
    Connect
    | Connack
    | Publish
    | Puback
    | Pubrec
    | Pubrel
    | Pubcomp
    | Subscribe
    | Suback
    | Unsubscribe
    | Unsuback
    | Pingreq
    | Pingresp
    | Disconnect
    | Auth
)
