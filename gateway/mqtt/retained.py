"""Retained messages, kept by the Broker API's retained-message store (``store_retained``,
``retained_matching``: durable in the system topic ``__retained``, core/state/retained.py).

Key: the MQTT topic name. Value, in this gateway's layout (one record per change; an empty
retained PUBLISH deletes the key [MQTT-3.3.1-6])::

    offset  size  field
    0       1     layout version (RETAINED_VERSION)
    1       1     QoS the message was published with
    2       8     expiry time, ms since the epoch (0: never)          big-endian, as MQTT
    10      2     length of the publisher's client id, then the id (No Local)
    ..      4     length of the 5.0 property block, then its bytes (forwarded properties,
                  encoded as on the wire without the length prefix)
    ..            payload, to the end

An expired message is deleted when a lookup finds it [MQTT-3.3.2-5]. Not thread-safe: the event
loop's thread.
"""

from __future__ import annotations

import struct
from typing import Final

from core.api import BrokerAPI, ClientContext
from gateway.mqtt._wire import Reader, encode_varint
from gateway.mqtt.errors import MqttProtocolError
from gateway.mqtt.messages import OutMessage
from gateway.mqtt.packet_types import PacketType
from gateway.mqtt.properties import NO_PROPERTIES, decode_properties

RETAINED_VERSION: Final = 1
_HEAD = struct.Struct(">BBQ")  # version, qos, expires_at_ms
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def encode_retained(message: OutMessage) -> bytes:
    origin = message.origin.encode()
    props = message.static_properties
    return b"".join(
        (
            _HEAD.pack(RETAINED_VERSION, message.qos, message.expires_at_ms),
            _U16.pack(len(origin)),
            origin,
            _U32.pack(len(props)),
            props,
            bytes(message.payload),
        )
    )


def decode_retained(topic: str, raw: bytes) -> OutMessage | None:
    """The retained message of ``topic``; None for a value this version cannot read."""
    try:
        version, qos, expires_at = _HEAD.unpack_from(raw)
        if version != RETAINED_VERSION:
            return None
        at = _HEAD.size
        (size,) = _U16.unpack_from(raw, at)
        at += 2
        origin = raw[at : at + size].decode()
        at += size
        (size,) = _U32.unpack_from(raw, at)
        at += 4
        properties = NO_PROPERTIES
        if size:
            block = _block_bytes(raw[at : at + size])
            properties = decode_properties(Reader(block, 0, len(block)), PacketType.PUBLISH)
        at += size
        return OutMessage(topic, raw[at:], qos, True, origin, expires_at, properties)
    except (struct.error, UnicodeDecodeError, MqttProtocolError):
        return None


def _block_bytes(props: bytes) -> bytes:
    """Properties without a length prefix -> a property block (length + properties)."""
    return encode_varint(len(props)) + props


class RetainedStore:
    """The retained messages of one broker as :class:`OutMessage` values."""

    def __init__(self, api: BrokerAPI, context: ClientContext) -> None:
        self.api = api
        self.context = context

    def __len__(self) -> int:
        return self.api.retained_count()

    def put(self, message: OutMessage, context: ClientContext | None = None) -> None:
        """Retain ``message`` for its topic; an empty payload clears the topic instead."""
        value = encode_retained(message) if len(message.payload) else None
        self.api.store_retained(context or self.context, message.topic, value)

    async def matching(
        self, context: ClientContext, topic_filter: str, now_ms: int
    ) -> list[OutMessage]:
        """The unexpired retained messages whose topic matches a (non-shared) filter, looked
        up for ``context`` (the subscribing session's); expired ones are deleted on the way,
        as the store's own housekeeping, since their expiry passed [MQTT-3.3.2-5]. On a
        cluster node, those of every node (it does not suspend on a node alone)."""
        live = []
        for topic, raw in await self.api.retained_matching_everywhere(context, topic_filter):
            message = decode_retained(topic, raw)
            if message is None:
                continue
            if message.expired(now_ms):
                self.api.store_retained(self.context, topic, None)
            else:
                live.append(message)
        return live
