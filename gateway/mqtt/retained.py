"""Retained messages, durable in the log: a ``DurableTable`` over the system topic ``__retained``.

Key: the MQTT topic name. Value (one record per change; an empty retained PUBLISH deletes the key
[MQTT-3.3.1-6]; replay on start rebuilds the map)::

    offset  size  field
    0       1     layout version (RETAINED_VERSION)
    1       1     QoS the message was published with
    2       8     expiry time, ms since the epoch (0: never)          big-endian, as MQTT
    10      2     length of the publisher's client id, then the id (No Local)
    ..      4     length of the 5.0 property block, then its bytes (forwarded properties,
                  encoded as on the wire without the length prefix)
    ..            payload, to the end

Lookups: a filter without wildcards is one dict lookup; a wildcard filter is checked against
every retained topic (Mosquitto walks a topic tree; a device fleet keeps a few thousand retained
messages, and this runs at SUBSCRIBE only). Not thread-safe: the event loop's thread.
"""

from __future__ import annotations

import struct
from typing import Final

from core.log import LogStore
from core.log.names import RETAINED_TOPIC
from core.state import DurableTable
from gateway.mqtt._wire import Reader, encode_varint
from gateway.mqtt.addresses import filter_matches
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
    def __init__(self, store: LogStore) -> None:
        self.table = DurableTable(store, RETAINED_TOPIC)

    def __len__(self) -> int:
        return len(self.table)

    def put(self, message: OutMessage) -> None:
        """Retain ``message`` for its topic; an empty payload clears the topic instead."""
        if len(message.payload) == 0:
            self.table.delete(message.topic)
        else:
            self.table.put(message.topic, encode_retained(message))

    def get(self, topic: str) -> OutMessage | None:
        raw = self.table.get(topic)
        return decode_retained(topic, raw) if raw is not None else None

    def matching(self, filter_levels: list[str], now_ms: int) -> list[OutMessage]:
        """The unexpired retained messages whose topic matches a filter (expired ones are
        deleted on the way, as their expiry passed [MQTT-3.3.2-5])."""
        if "+" not in filter_levels and "#" not in filter_levels:
            found = self.get("/".join(filter_levels))
            candidates = [found] if found is not None else []
        else:
            candidates = []
            for topic, raw in self.table.items():
                if filter_matches(filter_levels, topic):
                    message = decode_retained(topic, raw)
                    if message is not None:
                        candidates.append(message)
        live = []
        for message in candidates:
            if message.expired(now_ms):
                self.table.delete(message.topic)
            else:
                live.append(message)
        return live
