"""What the first bytes of a connection that is not speaking MQTT look like, for the log line that
closes it: a Kafka client, an AMQP client, a web browser or a TLS client pointed at the MQTT
port is the usual mistake (issue 17, item 23), and the log should say so and say who
(the peer address is in the same line: ``Connection.protocol_error``).

Pure functions over bytes: no I/O.
"""

from __future__ import annotations

import struct
from typing import Final

# The first bytes we keep of a connection, to describe them if they are not MQTT.
SNIFF_BYTES: Final = 16

# Kafka request header v1+: INT32 size, INT16 api_key, INT16 api_version, INT32 correlation_id.
_KAFKA_HEADER: Final = struct.Struct(">iHH")
# Api keys a client sends first (kafka clients start with ApiVersions, older ones with Metadata).
_KAFKA_FIRST_APIS: Final = {0: "Produce", 1: "Fetch", 3: "Metadata", 17: "SaslHandshake",
                            18: "ApiVersions"}  # fmt: skip
# Kafka's api keys and versions stay below these today (KIP-511's ApiVersions v3 and the ~70 keys).
_KAFKA_MAX_API_KEY: Final = 100
_KAFKA_MAX_API_VERSION: Final = 30
# A Kafka request this large is not a client's first one (message.max.bytes is 1 MiB).
_KAFKA_MAX_FIRST_REQUEST: Final = 1 << 20
_HTTP_METHODS: Final = (b"GET ", b"POST ", b"PUT ", b"HEAD ", b"DELETE ", b"OPTIONS ", b"PRI * ")
_AMQP_HEADER: Final = b"AMQP"
# TLS record: content type 22 (handshake), protocol major version 3.
_TLS_HANDSHAKE: Final = b"\x16\x03"


def describe_first_bytes(data: bytes) -> str:
    """A short phrase saying what protocol ``data`` (a connection's first bytes) looks like, or
    only the bytes in hex when nothing is recognised."""
    shown = data[:SNIFF_BYTES].hex(" ")
    if data.startswith(_AMQP_HEADER):
        return f"an AMQP client (protocol header {shown})"
    if data.startswith(_HTTP_METHODS):
        return f"an HTTP request ({data.split(b' ', 1)[0].decode('ascii')})"
    if data.startswith(_TLS_HANDSHAKE):
        return "a TLS handshake (a client using TLS on a plain MQTT port?)"
    if len(data) >= _KAFKA_HEADER.size:
        size, api_key, api_version = _KAFKA_HEADER.unpack_from(data)
        if (
            0 < size <= _KAFKA_MAX_FIRST_REQUEST
            and api_key < _KAFKA_MAX_API_KEY
            and api_version < _KAFKA_MAX_API_VERSION
        ):
            name = _KAFKA_FIRST_APIS.get(api_key, f"api key {api_key}")
            return f"a Kafka client ({name} v{api_version} request)"
    return f"bytes {shown}"
