"""Application messages on their way out: MQTT 5 properties <-> record headers, and
``OutMessage``, one message as every subscriber of it is sent it.

Record headers written for an MQTT PUBLISH (docs/mqtt.md, "Properties and headers"):

==============================  ===========================================================
header                          from
==============================  ===========================================================
``x-mqtt-qos``                  the PUBLISH QoS when 1 or 2 (absent: 0)
``x-mqtt-retain``               ``1`` when the PUBLISH had RETAIN set
``x-mqtt-payload-format``       Payload Format Indicator ``1`` (UTF-8 payload)
``x-braid-expires-at``          Message Expiry Interval, as an absolute time in ms (core's
                                per-message expiry: ack queues drop the record when it passes)
``x-braid-content-type``        Content Type
``x-braid-reply-to``            Response Topic
``x-braid-correlation-id``      Correlation Data (bytes as they are)
any other name                  a User Property (name and UTF-8 value, order and repeats kept)
==============================  ===========================================================

Going out, the same table is read backwards; headers of other protocols' records that are not
in it become User Properties (values decoded as UTF-8, invalid bytes replaced), except the
broker's own ``x-braid-*`` and ``x-mqtt-*`` names. A record of another protocol is sent at
QoS 1 at most (it is durable in the log, as a QoS 1 message is), capped by the subscription.

Properties going out are encoded once per message (``static_properties``), since they are the
same for every subscriber; what differs per subscriber or per send (the remaining expiry
interval [MQTT-3.3.2-6], a Topic Alias, Subscription Identifiers) is added around them.
"""

from __future__ import annotations

import math
from typing import Final

from core.api import (
    DEAD_LETTER_SUBJECT_HEADER,
    DEAD_LETTER_TOPIC_HEADER,
    EXPIRES_AT_HEADER,
    PROTOCOL_KAFKA,
    PROTOCOL_MQTT,
    Message,
)
from gateway.mqtt._wire import U16, U32
from gateway.mqtt.addresses import mqtt_topic_of
from gateway.mqtt.packets import Payload
from gateway.mqtt.properties import (
    NO_PROPERTIES,
    Properties,
    encode_properties,
    encode_subscription_identifier,
)

QOS_HEADER: Final = "x-mqtt-qos"
RETAIN_HEADER: Final = "x-mqtt-retain"
PAYLOAD_FORMAT_HEADER: Final = "x-mqtt-payload-format"
CONTENT_TYPE_HEADER: Final = "x-braid-content-type"
RESPONSE_TOPIC_HEADER: Final = "x-braid-reply-to"
CORRELATION_HEADER: Final = "x-braid-correlation-id"
# Header names never turned into User Properties: the broker's and this gateway's own.
RESERVED_HEADER_PREFIXES: Final = ("x-braid-", "x-mqtt-")
# QoS of a record without an x-mqtt-qos header, by publishing protocol: MQTT QoS 0 publishes
# carry no header; the other protocols' records are durable, like a QoS 1 message.
FOREIGN_RECORD_QOS: Final = 1

_QOS_VALUES: Final = (b"0", b"1", b"2")
_TRUE: Final = b"1"
_EXPIRY_ID: Final = b"\x02"  # Message Expiry Interval property identifier
_ALIAS_ID: Final = b"\x23"  # Topic Alias property identifier
_MS: Final = 1000


def publish_headers(
    properties: Properties, qos: int, retain: bool, expires_at_ms: int
) -> list[tuple[str, bytes]]:
    """The record headers of a PUBLISH (see the module docstring)."""
    headers: list[tuple[str, bytes]] = []
    if qos:
        headers.append((QOS_HEADER, _QOS_VALUES[qos]))
    if retain:
        headers.append((RETAIN_HEADER, _TRUE))
    if expires_at_ms:
        headers.append((EXPIRES_AT_HEADER, str(expires_at_ms).encode()))
    if properties is NO_PROPERTIES:
        return headers
    if properties.payload_format_indicator:
        headers.append((PAYLOAD_FORMAT_HEADER, _TRUE))
    if properties.content_type is not None:
        headers.append((CONTENT_TYPE_HEADER, properties.content_type.encode()))
    if properties.response_topic is not None:
        headers.append((RESPONSE_TOPIC_HEADER, properties.response_topic.encode()))
    if properties.correlation_data is not None:
        headers.append((CORRELATION_HEADER, bytes(properties.correlation_data)))
    for name, value in properties.user_properties:
        headers.append((name, value.encode()))
    return headers


def forwarded_properties(properties: Properties) -> Properties:
    """The properties of an incoming PUBLISH that are forwarded unchanged [MQTT-3.3.2-4,
    3.3.2-15, 3.3.2-16, 3.3.2-17, 3.3.2-20]: not the Topic Alias, the Subscription Identifiers
    or the expiry, which are set per send."""
    if properties is NO_PROPERTIES:
        return NO_PROPERTIES
    return Properties(
        payload_format_indicator=properties.payload_format_indicator,
        content_type=properties.content_type,
        response_topic=properties.response_topic,
        correlation_data=properties.correlation_data,
        user_properties=properties.user_properties,
    )


def _is_reserved(name: str) -> bool:
    return name.startswith(RESERVED_HEADER_PREFIXES)


class OutMessage:
    """One application message as subscribers are sent it (from a PUBLISH just received, from a
    record read back from the log, or from a retained message)."""

    __slots__ = (
        "_static",
        "_wire",
        "_wire_key",
        "expires_at_ms",
        "origin",
        "payload",
        "properties",
        "qos",
        "retain",
        "topic",
    )

    def __init__(
        self,
        topic: str,
        payload: Payload,
        qos: int,
        retain: bool,
        origin: str,
        expires_at_ms: int,
        properties: Properties,
    ) -> None:
        self.topic = topic
        self.payload = payload
        self.qos = qos  # the QoS it was published with: the most it is delivered with
        self.retain = retain  # the publisher's RETAIN flag (for Retain As Published)
        self.origin = origin  # the publishing client id (No Local); "" for other protocols
        self.expires_at_ms = expires_at_ms  # 0: never
        self.properties = properties  # forwarded properties (no expiry, alias, ids)
        self._static: bytes | None = None
        # The last QoS 0 PUBLISH encoded for it with nothing per-subscriber added, and its
        # (version, retain): fan-out to many subscribers encodes once.
        self._wire: bytes | None = None
        self._wire_key: tuple[int, bool] | None = None

    @property
    def static_properties(self) -> bytes:
        static = self._static
        if static is None:
            static = self._static = encode_properties(self.properties)
        return static

    def expired(self, now_ms: int) -> bool:
        return 0 < self.expires_at_ms <= now_ms

    def wire_properties(self, now_ms: int, alias: int, subscription_ids: tuple[int, ...]) -> bytes:
        """The 5.0 property bytes of one send (without the length prefix)."""
        props = self.static_properties
        if self.expires_at_ms:
            # [MQTT-3.3.2-6]: the interval sent is what is left of it, in whole seconds.
            remaining = max(1, math.ceil((self.expires_at_ms - now_ms) / _MS))
            props = _EXPIRY_ID + U32.pack(remaining) + props
        if alias:
            props += _ALIAS_ID + U16.pack(alias)
        for identifier in subscription_ids:
            props += encode_subscription_identifier(identifier)
        return props

    def cached_qos0(self, version: int, retain: bool) -> bytes | None:
        if self._wire is not None and self._wire_key == (version, retain):
            return self._wire
        return None

    def cache_qos0(self, version: int, retain: bool, data: bytes) -> None:
        self._wire = data
        self._wire_key = (version, retain)

    def __repr__(self) -> str:
        return f"OutMessage({self.topic!r}, {len(self.payload)} bytes, qos={self.qos})"


def out_message_of(message: Message) -> OutMessage:
    """The OutMessage of a record read from the log (any protocol)."""
    protocol = message.protocol
    mqtt = protocol == PROTOCOL_MQTT
    dead_letter_topic = message.header(DEAD_LETTER_TOPIC_HEADER) if message.headers else None
    if dead_letter_topic is not None:
        # A dead letter is read under its dead-letter exchange and routing key: <dlx>/a/b.
        subject = message.header(DEAD_LETTER_SUBJECT_HEADER)
        topic = mqtt_topic_of(
            dead_letter_topic.decode("utf-8", "replace"),
            subject.decode("utf-8", "replace") if subject is not None else message.subject,
        )
    elif mqtt and message.address:
        topic = message.address
    else:
        key = message.key if protocol == PROTOCOL_KAFKA else None
        topic = mqtt_topic_of(message.topic, message.subject, key)
    qos = 0 if mqtt else FOREIGN_RECORD_QOS
    retain = False
    expires_at = 0
    properties = NO_PROPERTIES
    if message.headers:
        qos, retain, expires_at, properties = _from_headers(message.headers, qos)
    body = message.body
    return OutMessage(
        topic,
        body if body is not None else b"",
        qos,
        retain,
        message.client if mqtt else "",
        expires_at,
        properties,
    )


def _from_headers(headers: list[tuple[str, bytes]], qos: int) -> tuple[int, bool, int, Properties]:
    retain = False
    expires_at = 0
    payload_format: int | None = None
    content_type: str | None = None
    response_topic: str | None = None
    correlation: bytes | None = None
    user: list[tuple[str, str]] = []
    for name, value in headers:
        if name == QOS_HEADER:
            qos = min(2, int(value or b"0"))
        elif name == RETAIN_HEADER:
            retain = value == _TRUE
        elif name == EXPIRES_AT_HEADER:
            expires_at = int(value)
        elif name == PAYLOAD_FORMAT_HEADER:
            payload_format = 1
        elif name == CONTENT_TYPE_HEADER:
            content_type = value.decode("utf-8", "replace")
        elif name == RESPONSE_TOPIC_HEADER:
            response_topic = value.decode("utf-8", "replace")
        elif name == CORRELATION_HEADER:
            correlation = bytes(value)
        elif not _is_reserved(name):
            user.append((name.replace("\x00", ""), value.decode("utf-8", "replace")))
    if (
        payload_format is None
        and content_type is None
        and response_topic is None
        and correlation is None
        and not user
    ):
        return qos, retain, expires_at, NO_PROPERTIES
    return (
        qos,
        retain,
        expires_at,
        Properties(
            payload_format_indicator=payload_format,
            content_type=content_type,
            response_topic=response_topic,
            correlation_data=correlation,
            user_properties=tuple((n, v.replace("\x00", "")) for n, v in user),
        ),
    )


def message_headers(message: OutMessage) -> list[tuple[str, bytes]]:
    """Record headers for an OutMessage (a retained message kept in the log)."""
    return publish_headers(message.properties, message.qos, message.retain, message.expires_at_ms)
