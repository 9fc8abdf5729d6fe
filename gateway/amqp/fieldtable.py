"""AMQP 0-9-1 field tables and field arrays, with RabbitMQ's field types.

Layout (spec 4.2.5.5 with the RabbitMQ errata, https://www.rabbitmq.com/amqp-0-9-1-errata.html)::

    field-table = long-uint *(shortstr field-value)     ; long-uint = byte length of the rest
    field-array = long-int  *field-value                ; likewise a byte length
    field-value = type-octet value

    type  wire value                      Python value (decode)       encoded from
    't'   octet, 0 = false                bool                        bool
    'b'   int8      'B' uint8             int
    's'   int16     'u' uint16            int
    'I'   int32     'i' uint32            int                         int in int32 range
    'l'   int64     'L' int64 (*)         int                         other int in int64 range
    'f'   float32   'd' float64           float                       float (as 'd', lossless)
    'D'   octet scale + int32 value (**)  decimal.Decimal             decimal.Decimal
    'S'   long-uint length + octets       str, or bytes if not UTF-8  str
    'x'   long-uint length + octets       bytes                       bytes, bytearray, memoryview
    'T'   uint64 seconds since the epoch  Timestamp (an int)          Timestamp, datetime
    'F'   field-table                     dict                        Mapping
    'A'   field-array                     list                        list, tuple
    'V'   nothing                         None                        None

(*) RabbitMQ decodes both 'l' and 'L' as signed 64-bit (rabbit_binary_parser, issue #1093).
(**) The grammar says long-uint but the spec's text says "a long signed integer"; the Java
client, pika and pamqp read and write it signed (RabbitMQ reads it unsigned but only to show it),
so signed it is: -2**31..2**31-1, which allows negative decimals.

Decoding is a pure function over bytes, bytearray or memoryview. A peer's malformed table is its
fault: truncation raises ``AmqpConnectionError(501 FRAME_ERROR)``, an unknown type octet, a
non-UTF-8 field name or nesting deeper than ``MAX_TABLE_DEPTH`` raise ``502 SYNTAX_ERROR``.
Encoding a value that has no AMQP form is the caller's fault: ``TypeError`` / ``ValueError``.

Round trips: ``decode(encode(v)) == v`` for every value the encoder takes (floats as 'd', and
'S' with invalid UTF-8 aside); ``encode(decode(b)) == b`` holds when ``b`` uses the encoder's
choices ('S', 'x', 'I'/'l', 'd', 't', 'D', 'T', 'F', 'A', 'V'). For byte-exact pass-through of
message properties keep the raw bytes instead (``Publish.properties_raw``).
"""

from __future__ import annotations

import datetime
import struct
from collections.abc import Mapping
from decimal import Decimal
from typing import TypeAlias, Union

from gateway.amqp.constants import FRAME_ERROR, MAX_TABLE_DEPTH, SHORTSTR_MAX, SYNTAX_ERROR
from gateway.amqp.errors import AmqpConnectionError

Buffer: TypeAlias = bytes | bytearray | memoryview


class Timestamp(int):
    """A 'T' value: whole seconds since the Unix epoch, kept as the integer on the wire.

    An ``int`` subclass so that it round-trips as 'T' (a plain int encodes as 'I'/'l') and so
    that values no ``datetime`` can hold (a client putting milliseconds there) still decode.
    """

    __slots__ = ()

    def to_datetime(self) -> datetime.datetime:
        """The UTC datetime (raises ``OverflowError``/``ValueError`` beyond year 9999)."""
        return datetime.datetime.fromtimestamp(int(self), tz=datetime.UTC)

    @classmethod
    def from_datetime(cls, value: datetime.datetime) -> Timestamp:
        """Whole seconds of ``value``; a naive datetime is taken as UTC (as pamqp does)."""
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return cls(int(value.timestamp()))

    def __repr__(self) -> str:
        return f"Timestamp({int(self)})"


FieldValue: TypeAlias = Union[  # a recursive alias needs Union and the string forms
    bool,
    int,
    float,
    Decimal,
    str,
    bytes,
    "list[FieldValue]",
    "dict[str, FieldValue]",
    None,
]
FieldTable: TypeAlias = dict[str, FieldValue]
FieldArray: TypeAlias = list[FieldValue]

_U32 = struct.Struct(">I")  # long-uint: a table's/array's/longstr's byte length
_U64 = struct.Struct(">Q")  # 'T'
_DECIMAL = struct.Struct(">Bi")  # 'D': scale octet, then the signed unscaled value
_I32 = struct.Struct(">i")  # 'I' as encoded
_I64 = struct.Struct(">q")  # 'l' as encoded
_F64 = struct.Struct(">d")  # 'd' as encoded

# Fixed-width numeric types: type octet -> struct that reads the value.
_NUMERIC: dict[int, struct.Struct] = {
    ord("b"): struct.Struct(">b"),
    ord("B"): struct.Struct(">B"),
    ord("s"): struct.Struct(">h"),
    ord("u"): struct.Struct(">H"),
    ord("I"): struct.Struct(">i"),
    ord("i"): struct.Struct(">I"),
    ord("l"): struct.Struct(">q"),
    ord("L"): struct.Struct(">q"),  # signed, as RabbitMQ decodes it
    ord("f"): struct.Struct(">f"),
    ord("d"): struct.Struct(">d"),
}

_T_LONGSTR = ord("S")
_T_BYTES = ord("x")
_T_BOOL = ord("t")
_T_TIMESTAMP = ord("T")
_T_DECIMAL = ord("D")
_T_TABLE = ord("F")
_T_ARRAY = ord("A")
_T_VOID = ord("V")

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_UINT32_MAX = (1 << 32) - 1


def _truncated(what: str) -> AmqpConnectionError:
    return AmqpConnectionError(FRAME_ERROR, f"FRAME_ERROR - truncated {what}")


def _syntax(text: str) -> AmqpConnectionError:
    return AmqpConnectionError(SYNTAX_ERROR, f"SYNTAX_ERROR - {text}")


# --- decoding ---------------------------------------------------------------------------------


def read_table(data: Buffer, offset: int = 0, *, _depth: int = 0) -> tuple[FieldTable, int]:
    """Decode the field table starting at ``offset``; return it and the offset after it."""
    if offset + 4 > len(data):
        raise _truncated("field table length")
    (size,) = _U32.unpack_from(data, offset)
    pos = offset + 4
    end = pos + size
    if end > len(data):
        raise _truncated("field table")
    if _depth >= MAX_TABLE_DEPTH:
        raise _syntax(f"field tables nested deeper than {MAX_TABLE_DEPTH}")
    table: FieldTable = {}
    while pos < end:
        key_end = pos + 1 + data[pos]
        if key_end > end:
            raise _truncated("field name")
        try:
            key = str(data[pos + 1 : key_end], "utf-8")
        except UnicodeDecodeError:
            raise _syntax("field name is not UTF-8") from None
        table[key], pos = _read_value(data, key_end, end, _depth + 1)
    return table, end


def read_array(data: Buffer, offset: int = 0, *, _depth: int = 0) -> tuple[FieldArray, int]:
    """Decode the field array starting at ``offset``; return it and the offset after it."""
    if offset + 4 > len(data):
        raise _truncated("field array length")
    (size,) = _U32.unpack_from(data, offset)
    pos = offset + 4
    end = pos + size
    if end > len(data):
        raise _truncated("field array")
    if _depth >= MAX_TABLE_DEPTH:
        raise _syntax(f"field arrays nested deeper than {MAX_TABLE_DEPTH}")
    array: FieldArray = []
    while pos < end:
        value, pos = _read_value(data, pos, end, _depth + 1)
        array.append(value)
    return array, end


def _read_value(data: Buffer, pos: int, end: int, depth: int) -> tuple[FieldValue, int]:
    """One type octet + value at ``pos``, which must end by ``end``."""
    if pos >= end:
        raise _truncated("field value")
    kind = data[pos]
    pos += 1
    if kind in (_T_LONGSTR, _T_BYTES):
        if pos + 4 > end:
            raise _truncated("long string length")
        stop = pos + 4 + _U32.unpack_from(data, pos)[0]
        if stop > end:
            raise _truncated("long string")
        raw = bytes(data[pos + 4 : stop])
        if kind == _T_BYTES:
            return raw, stop
        try:
            return raw.decode("utf-8"), stop
        except UnicodeDecodeError:
            return raw, stop  # a longstr is binary to RabbitMQ; keep the octets
    numeric = _NUMERIC.get(kind)
    if numeric is not None:
        stop = pos + numeric.size
        if stop > end:
            raise _truncated("numeric field value")
        return numeric.unpack_from(data, pos)[0], stop
    if kind == _T_BOOL:
        if pos >= end:
            raise _truncated("boolean field value")
        return data[pos] != 0, pos + 1
    if kind == _T_TIMESTAMP:
        if pos + 8 > end:
            raise _truncated("timestamp field value")
        return Timestamp(_U64.unpack_from(data, pos)[0]), pos + 8
    if kind == _T_TABLE:
        table, stop = read_table(data, pos, _depth=depth)
        if stop > end:
            raise _truncated("nested field table")
        return table, stop
    if kind == _T_ARRAY:
        array, stop = read_array(data, pos, _depth=depth)
        if stop > end:
            raise _truncated("nested field array")
        return array, stop
    if kind == _T_DECIMAL:
        if pos + 5 > end:
            raise _truncated("decimal field value")
        scale, value = _DECIMAL.unpack_from(data, pos)
        return Decimal(value).scaleb(-scale), pos + 5
    if kind == _T_VOID:
        return None, pos
    raise _syntax(f"unknown field type {kind:#04x}")


def decode_table(data: Buffer) -> FieldTable:
    """Decode a whole encoded field table (length prefix included, nothing after it)."""
    table, end = read_table(data)
    if end != len(data):
        raise AmqpConnectionError(FRAME_ERROR, "FRAME_ERROR - octets after the field table")
    return table


def decode_array(data: Buffer) -> FieldArray:
    """Decode a whole encoded field array (length prefix included, nothing after it)."""
    array, end = read_array(data)
    if end != len(data):
        raise AmqpConnectionError(FRAME_ERROR, "FRAME_ERROR - octets after the field array")
    return array


# --- encoding ---------------------------------------------------------------------------------


def encode_table(table: Mapping[str, object] | None) -> bytes:
    """Encode a field table, length prefix included; ``None`` or ``{}`` is four zero octets."""
    out = bytearray()
    write_table(out, table or {}, 0)
    return bytes(out)


def encode_array(array: list[object] | tuple[object, ...]) -> bytes:
    """Encode a field array, length prefix included."""
    out = bytearray()
    write_array(out, array, 0)
    return bytes(out)


def write_table(out: bytearray, table: Mapping[str, object], depth: int = 0) -> None:
    """Append the encoded ``table`` (length prefix included) to ``out``."""
    if depth >= MAX_TABLE_DEPTH:
        raise ValueError(f"field tables nested deeper than {MAX_TABLE_DEPTH}")
    start = len(out)
    out += b"\x00\x00\x00\x00"
    for key, value in table.items():
        if not isinstance(key, str):
            raise TypeError(f"field names are str, not {type(key).__name__}")
        name = key.encode("utf-8")
        if len(name) > SHORTSTR_MAX:
            raise ValueError(f"field name longer than {SHORTSTR_MAX} octets: {key[:40]!r}...")
        out.append(len(name))
        out += name
        _write_value(out, value, depth + 1)
    _patch_length(out, start)


def write_array(out: bytearray, array: list[object] | tuple[object, ...], depth: int = 0) -> None:
    """Append the encoded ``array`` (length prefix included) to ``out``."""
    if depth >= MAX_TABLE_DEPTH:
        raise ValueError(f"field arrays nested deeper than {MAX_TABLE_DEPTH}")
    start = len(out)
    out += b"\x00\x00\x00\x00"
    for value in array:
        _write_value(out, value, depth + 1)
    _patch_length(out, start)


def _patch_length(out: bytearray, start: int) -> None:
    size = len(out) - start - 4
    if size > _UINT32_MAX:
        raise ValueError("field table or array longer than 2**32 - 1 octets")
    _U32.pack_into(out, start, size)


def _write_value(out: bytearray, value: object, depth: int) -> None:
    """Append one type octet + value, choosing the type from the Python type."""
    if isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"S"
        out += _U32.pack(len(raw))
        out += raw
    elif value is None:
        out += b"V"
    elif isinstance(value, bool):  # before int: bool is an int
        out += b"t\x01" if value else b"t\x00"
    elif isinstance(value, Timestamp):  # before int: a Timestamp is an int
        if not 0 <= value <= _INT64_MAX:
            raise ValueError(f"timestamp out of range: {int(value)}")
        out += b"T"
        out += _U64.pack(value)
    elif isinstance(value, int):
        if _INT32_MIN <= value <= _INT32_MAX:
            out += b"I"
            out += _I32.pack(value)
        elif _INT64_MIN <= value <= _INT64_MAX:
            out += b"l"
            out += _I64.pack(value)
        else:
            raise ValueError(f"integer does not fit a signed 64-bit field: {value}")
    elif isinstance(value, float):
        out += b"d"
        out += _F64.pack(value)
    elif isinstance(value, bytes | bytearray | memoryview):
        out += b"x"
        out += _U32.pack(len(value))
        out += value
    elif isinstance(value, Mapping):
        out += b"F"
        write_table(out, value, depth)
    elif isinstance(value, list | tuple):
        out += b"A"
        write_array(out, value, depth)
    elif isinstance(value, Decimal):
        out += b"D"
        out += _encode_decimal(value)
    elif isinstance(value, datetime.datetime):
        out += b"T"
        out += _U64.pack(Timestamp.from_datetime(value))
    else:
        raise TypeError(f"no AMQP field type for {type(value).__name__}: {value!r}")


def _encode_decimal(value: Decimal) -> bytes:
    exponent = value.as_tuple().exponent
    if not isinstance(exponent, int):
        raise ValueError(f"cannot encode {value} as an AMQP decimal")
    scale = max(0, -exponent)
    mantissa = int(value.scaleb(scale))
    if scale > 255 or not _INT32_MIN <= mantissa <= _INT32_MAX:
        raise ValueError(f"decimal out of range (scale 0..255, value int32): {value}")
    return _DECIMAL.pack(scale, mantissa)
