"""Basic class content properties (the tail of a content header frame).

Layout (spec 4.2.6.1; a content header is ``class-id weight body-size`` then these octets)::

    property-flags  short, bit 15 first; bit 0 set = another flags short follows
    property-list   the present properties, in flag order:

    bit  name              type                 Python value
    15   content_type      shortstr             str (bytes if not UTF-8)
    14   content_encoding  shortstr             str (bytes if not UTF-8)
    13   headers           field table          dict (see fieldtable.py)
    12   delivery_mode     octet                int (1 transient, 2 persistent)
    11   priority          octet                int
    10   correlation_id    shortstr             str (bytes if not UTF-8)
     9   reply_to          shortstr             ...
     8   expiration        shortstr             ...
     7   message_id        shortstr             ...
     6   timestamp         uint64 seconds       Timestamp (an int)
     5   type              shortstr             ...
     4   user_id           shortstr             ...
     3   app_id            shortstr             ...
     2   cluster_id        shortstr             ... (deprecated, RabbitMQ passes it on)

The broker stores and forwards these octets unchanged (``properties_raw``), as RabbitMQ does
with ``#content.properties_bin``; ``decode_properties`` is for the code that must look inside
(persistence, TTL, headers exchange, protocol translation), ``encode_properties`` for messages
that arrive over MQTT or Kafka and leave over AMQP.
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Mapping
from typing import Final, TypedDict, cast

from gateway.amqp.constants import FRAME_ERROR, SHORTSTR_MAX, SYNTAX_ERROR
from gateway.amqp.errors import AmqpConnectionError
from gateway.amqp.fieldtable import Buffer, FieldTable, Timestamp, read_table, write_table


class BasicProperties(TypedDict, total=False):
    """The decoded properties; a key is present only if its flag bit is set."""

    content_type: str | bytes
    content_encoding: str | bytes
    headers: FieldTable
    delivery_mode: int
    priority: int
    correlation_id: str | bytes
    reply_to: str | bytes
    expiration: str | bytes
    message_id: str | bytes
    timestamp: Timestamp
    type: str | bytes
    user_id: str | bytes
    app_id: str | bytes
    cluster_id: str | bytes


# No flags, no properties: what a publish without properties carries.
EMPTY_PROPERTIES: Final = b"\x00\x00"

FLAG_CONTINUATION: Final = 0x0001  # another 16-bit flags word follows
DELIVERY_MODE_TRANSIENT: Final = 1
DELIVERY_MODE_PERSISTENT: Final = 2

_SHORTSTR, _TABLE, _OCTET, _TIMESTAMP = range(4)

# (name, flag bit, value type) in wire order.
PROPERTY_LAYOUT: Final = (
    ("content_type", 0x8000, _SHORTSTR),
    ("content_encoding", 0x4000, _SHORTSTR),
    ("headers", 0x2000, _TABLE),
    ("delivery_mode", 0x1000, _OCTET),
    ("priority", 0x0800, _OCTET),
    ("correlation_id", 0x0400, _SHORTSTR),
    ("reply_to", 0x0200, _SHORTSTR),
    ("expiration", 0x0100, _SHORTSTR),
    ("message_id", 0x0080, _SHORTSTR),
    ("timestamp", 0x0040, _TIMESTAMP),
    ("type", 0x0020, _SHORTSTR),
    ("user_id", 0x0010, _SHORTSTR),
    ("app_id", 0x0008, _SHORTSTR),
    ("cluster_id", 0x0004, _SHORTSTR),
)
PROPERTY_NAMES: Final = frozenset(name for name, _flag, _kind in PROPERTY_LAYOUT)

_U16 = struct.Struct(">H")  # a property-flags word
_U64 = struct.Struct(">Q")  # timestamp


def decode_properties(raw: Buffer) -> BasicProperties:
    """Decode ``properties_raw`` (flags + property list) into a dict of the present properties.

    Raises ``AmqpConnectionError`` 501 (truncated or trailing octets) or 502 (bad field table).
    """
    end = len(raw)
    if end < 2:
        raise AmqpConnectionError(FRAME_ERROR, "FRAME_ERROR - content header without flags")
    (flags,) = _U16.unpack_from(raw, 0)
    pos = 2
    more = flags & FLAG_CONTINUATION
    while more:  # 0-9-1 defines no property past bit 2; skip further words, keep none
        if pos + 2 > end:
            raise AmqpConnectionError(FRAME_ERROR, "FRAME_ERROR - truncated property flags")
        (word,) = _U16.unpack_from(raw, pos)
        if word & ~FLAG_CONTINUATION:
            raise AmqpConnectionError(SYNTAX_ERROR, "SYNTAX_ERROR - unknown property flags")
        more = word & FLAG_CONTINUATION
        pos += 2
    if flags & 0x0002:
        raise AmqpConnectionError(SYNTAX_ERROR, "SYNTAX_ERROR - reserved property flag 0x0002")
    out: dict[str, object] = {}
    if flags & 0xFFFC:
        for name, flag, kind in PROPERTY_LAYOUT:
            if not flags & flag:
                continue
            if kind == _SHORTSTR:
                if pos >= end:
                    raise _truncated(name)
                stop = pos + 1 + raw[pos]
                if stop > end:
                    raise _truncated(name)
                value = bytes(raw[pos + 1 : stop])
                try:
                    out[name] = value.decode("utf-8")
                except UnicodeDecodeError:
                    out[name] = value
                pos = stop
            elif kind == _OCTET:
                if pos >= end:
                    raise _truncated(name)
                out[name] = raw[pos]
                pos += 1
            elif kind == _TABLE:
                out[name], pos = read_table(raw, pos)
            else:  # _TIMESTAMP
                if pos + 8 > end:
                    raise _truncated(name)
                out[name] = Timestamp(_U64.unpack_from(raw, pos)[0])
                pos += 8
    if pos != end:
        raise AmqpConnectionError(FRAME_ERROR, "FRAME_ERROR - octets after the content properties")
    return cast(BasicProperties, out)


def _truncated(name: str) -> AmqpConnectionError:
    return AmqpConnectionError(FRAME_ERROR, f"FRAME_ERROR - truncated property {name}")


def encode_properties(properties: Mapping[str, object] | None = None, /, **kwargs: object) -> bytes:
    """Encode properties (a mapping and/or keywords, names as in ``BasicProperties``).

    A property whose value is ``None`` is absent; an empty string is present (and empty).
    Strings may be ``str`` or ``bytes``; ``timestamp`` an int or a datetime.
    Raises ``ValueError``/``TypeError`` for unknown names or values that don't fit.
    """
    values: dict[str, object] = dict(properties or {})
    values.update(kwargs)
    unknown = values.keys() - PROPERTY_NAMES
    if unknown:
        raise ValueError(f"unknown Basic properties: {sorted(unknown)}")
    flags = 0
    out = bytearray(b"\x00\x00")
    for name, flag, kind in PROPERTY_LAYOUT:
        value = values.get(name)
        if value is None:
            continue
        flags |= flag
        if kind == _SHORTSTR:
            if isinstance(value, str):
                value = value.encode("utf-8")
            if not isinstance(value, bytes | bytearray):
                raise TypeError(f"{name} is a short string, not {type(value).__name__}")
            if len(value) > SHORTSTR_MAX:
                raise ValueError(f"{name} longer than {SHORTSTR_MAX} octets")
            out.append(len(value))
            out += value
        elif kind == _OCTET:
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
                raise ValueError(f"{name} must be an int 0..255, not {value!r}")
            out.append(value)
        elif kind == _TABLE:
            if not isinstance(value, Mapping):
                raise TypeError(f"headers must be a mapping, not {type(value).__name__}")
            write_table(out, value)
        else:  # _TIMESTAMP
            if isinstance(value, datetime.datetime):
                value = Timestamp.from_datetime(value)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 1 << 64:
                raise ValueError(f"timestamp must be seconds 0..2**64-1, not {value!r}")
            out += _U64.pack(value)
    _U16.pack_into(out, 0, flags)
    return bytes(out)
