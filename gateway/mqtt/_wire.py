"""Data representations of §1.5 (both versions) and a bounds-checked cursor over a packet body.

=====================  ==========================================================================
Two Byte Integer       big-endian u16 (§1.5.2)
Four Byte Integer      big-endian u32 (§1.5.3, 5.0)
UTF-8 Encoded String   u16 length + UTF-8 bytes, no U+0000, no surrogates (§1.5.4)
Variable Byte Integer  1..4 bytes, 7 bits each, least significant first, bit 7 = more (§1.5.5)
Binary Data            u16 length + bytes (§1.5.6, 5.0)
UTF-8 String Pair      two UTF-8 Encoded Strings (§1.5.7, 5.0)
=====================  ==========================================================================

Decoding is pure functions over ``bytes``; every read checks it stays inside the packet, and a
short read is a Malformed Packet (the decoder only hands complete packets to ``Reader``).
"""

from __future__ import annotations

import struct

from gateway.mqtt.errors import MqttEncodeError, malformed
from gateway.mqtt.packet_types import MAX_REMAINING_LENGTH, MAX_UINT16, MAX_VARINT_BYTES

U16 = struct.Struct(">H")  # Two Byte Integer
U32 = struct.Struct(">I")  # Four Byte Integer

# Variable Byte Integers below 128 are one byte; precomputed, as nearly every length is.
_SMALL_VARINTS = [bytes((value,)) for value in range(0x80)]


def encode_varint(value: int) -> bytes:
    """Variable Byte Integer of ``value`` (0 .. 268,435,455), minimal length [MQTT-1.5.5-1]."""
    if value < 0x80:
        if value < 0:
            raise MqttEncodeError(f"variable byte integer {value} is negative")
        return _SMALL_VARINTS[value]
    if value > MAX_REMAINING_LENGTH:
        raise MqttEncodeError(f"variable byte integer {value} > {MAX_REMAINING_LENGTH}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int] | None:
    """(value, position after it) of the Variable Byte Integer at ``pos``; None if it runs past
    ``end`` before its last byte. Raises Malformed Packet for a fifth byte [MQTT-1.5.5] or a
    non-minimal encoding [MQTT-1.5.5-1]."""
    value = 0
    shift = 0
    for index in range(pos, min(end, pos + MAX_VARINT_BYTES)):
        byte = buf[index]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and index > pos:
                raise malformed("variable byte integer not in its shortest form")
            return value, index + 1
        shift += 7
    if end - pos >= MAX_VARINT_BYTES:
        raise malformed("variable byte integer longer than 4 bytes")
    return None


def decode_utf8(raw: bytes) -> str:
    """A UTF-8 Encoded String's text. Python's strict UTF-8 codec already rejects overlong forms
    and encoded surrogates U+D800..U+DFFF [MQTT-1.5.4-1]; U+0000 is checked here [MQTT-1.5.4-2]."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise malformed(f"invalid UTF-8 in a string: {exc.reason}") from None
    if "\x00" in text:
        raise malformed("U+0000 in a UTF-8 string [MQTT-1.5.4-2]")
    return text


def encode_utf8(text: str) -> bytes:
    """u16 length + UTF-8 bytes of ``text``."""
    try:
        raw = text.encode("utf-8")
    except UnicodeEncodeError:
        raise MqttEncodeError(f"string {text!r} has surrogates [MQTT-1.5.4-1]") from None
    if len(raw) > MAX_UINT16:
        raise MqttEncodeError(f"string of {len(raw)} bytes > {MAX_UINT16}")
    if b"\x00" in raw:
        raise MqttEncodeError(f"string {text!r} contains U+0000 [MQTT-1.5.4-2]")
    return U16.pack(len(raw)) + raw


def encode_binary(data: bytes) -> bytes:
    """u16 length + bytes."""
    if len(data) > MAX_UINT16:
        raise MqttEncodeError(f"binary data of {len(data)} bytes > {MAX_UINT16}")
    return U16.pack(len(data)) + bytes(data)


class Reader:
    """A cursor over one packet body ``buf[pos:end]``; every read stays inside it."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def remaining(self) -> int:
        return self.end - self.pos

    def _take(self, size: int) -> int:
        start = self.pos
        if start + size > self.end:
            raise malformed("packet ends inside a field")
        self.pos = start + size
        return start

    def u8(self) -> int:
        return self.buf[self._take(1)]

    def u16(self) -> int:
        start = self._take(2)
        return (self.buf[start] << 8) | self.buf[start + 1]

    def u32(self) -> int:
        value: int = U32.unpack_from(self.buf, self._take(4))[0]
        return value

    def varint(self) -> int:
        result = decode_varint(self.buf, self.pos, self.end)
        if result is None:
            raise malformed("packet ends inside a variable byte integer")
        value, self.pos = result
        return value

    def raw(self, size: int) -> bytes:
        start = self._take(size)
        return self.buf[start : start + size]

    def binary(self) -> bytes:
        return self.raw(self.u16())

    def utf8(self) -> str:
        return decode_utf8(self.raw(self.u16()))

    def rest(self) -> bytes:
        start = self.pos
        self.pos = self.end
        return self.buf[start : self.end]

    def expect_end(self, what: str) -> None:
        if self.pos != self.end:
            raise malformed(f"{self.end - self.pos} unexpected bytes at the end of {what}")
