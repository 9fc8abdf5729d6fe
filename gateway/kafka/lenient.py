"""A pure-Python reader for flexible request versions that skips unknown tagged fields.

Kafka's rule for tagged fields (KIP-482): a reader skips tags it does not know. kio's native
reader raises ``KeyError("Unknown tagged field tag: N")`` instead, and librdkafka 2.16 sends
such a tag (tag 0, empty) in the Metadata v9 request its AdminClient uses to list all topics.
``KafkaDecoder`` falls back to ``read_entity`` for exactly that case: it reads the same kio
dataclasses from their field metadata (``kafka_type``, ``tag``), field for field, and drops
the tags the schema does not declare. It is ~20x slower than kio's reader and only runs when
kio refuses a request.

Flexible encoding (``KIP-482``): compact strings, bytes and arrays carry ``length + 1`` as an
unsigned varint (0 = null); every entity ends with its tagged fields: a varint count, then per
field a varint tag, a varint size and ``size`` bytes holding the field as a regular one.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import struct
import types
import typing
from collections.abc import Callable
from typing import Any, Final

from kio.schema.errors import ErrorCode

_Reader = Callable[[bytes, int], tuple[Any, int]]

_INT8: Final = struct.Struct(">b")
_INT16: Final = struct.Struct(">h")
_INT32: Final = struct.Struct(">i")
_INT64: Final = struct.Struct(">q")
_UINT16: Final = struct.Struct(">H")
_UINT32: Final = struct.Struct(">I")
_FLOAT64: Final = struct.Struct(">d")
_MISSING: Final = dataclasses.MISSING


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("unsigned varint too long")


def _fixed(layout: struct.Struct, convert: Callable[[Any], Any] | None = None) -> _Reader:
    size = layout.size

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        (value,) = layout.unpack_from(buf, pos)
        return (convert(value) if convert else value), pos + size

    return read


def _read_bool(buf: bytes, pos: int) -> tuple[Any, int]:
    return buf[pos] != 0, pos + 1


def _compact_length(buf: bytes, pos: int) -> tuple[int, int]:
    raw, pos = read_uvarint(buf, pos)
    return raw - 1, pos  # -1: null


def _blob(flexible: bool, text: bool, nullable: bool) -> _Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        if flexible:
            length, pos = _compact_length(buf, pos)
        elif text:
            (length,) = _INT16.unpack_from(buf, pos)
            pos += 2
        else:
            (length,) = _INT32.unpack_from(buf, pos)
            pos += 4
        if length < 0:
            if not nullable:
                raise ValueError("null for a non-nullable field")
            return None, pos
        end = pos + length
        if end > len(buf):
            raise ValueError("field runs past the end of the frame")
        raw = bytes(buf[pos:end])
        return (raw.decode() if text else raw), end

    return read


def _array(item: _Reader, flexible: bool, nullable: bool) -> _Reader:
    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        if flexible:
            count, pos = _compact_length(buf, pos)
        else:
            (count,) = _INT32.unpack_from(buf, pos)
            pos += 4
        if count < 0:
            if not nullable:
                raise ValueError("null for a non-nullable array")
            return None, pos
        items = []
        for _ in range(count):
            value, pos = item(buf, pos)
            items.append(value)
        return tuple(items), pos

    return read


def _primitive(kafka_type: str, flexible: bool, nullable: bool) -> _Reader:
    if kafka_type in ("string", "bytes", "records"):
        return _blob(flexible, kafka_type == "string", nullable)
    readers: dict[str, _Reader] = {
        "bool": _read_bool,
        "int8": _fixed(_INT8),
        "int16": _fixed(_INT16),
        "int32": _fixed(_INT32),
        "int64": _fixed(_INT64),
        "uint16": _fixed(_UINT16),
        "uint32": _fixed(_UINT32),
        "float64": _fixed(_FLOAT64),
        "error_code": _fixed(_INT16, ErrorCode),
        "timedelta_i32": _fixed(_INT32, lambda ms: datetime.timedelta(milliseconds=ms)),
        "timedelta_i64": _fixed(_INT64, lambda ms: datetime.timedelta(milliseconds=ms)),
    }
    try:
        return readers[kafka_type]
    except KeyError:
        raise ValueError(f"no lenient reader for kafka type {kafka_type!r}") from None


def _unwrap(hint: Any) -> tuple[Any, bool, bool]:
    """(inner type, is array, is nullable)."""
    nullable = False
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
        nullable = True
    if typing.get_origin(hint) is tuple:
        return typing.get_args(hint)[0], True, nullable
    return hint, False, nullable


@functools.cache
def _plan(cls: type) -> tuple[list[tuple[str, _Reader]], dict[int, tuple[str, _Reader]], bool]:
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    hints = typing.get_type_hints(cls)
    regular: list[tuple[str, _Reader]] = []
    tagged: dict[int, tuple[str, _Reader]] = {}
    for field in dataclasses.fields(cls):
        inner, array, nullable = _unwrap(hints[field.name])
        if dataclasses.is_dataclass(inner):
            item: _Reader = functools.partial(read_entity, typing.cast(type, inner))
        else:
            item = _primitive(str(field.metadata["kafka_type"]), flexible, nullable and not array)
        reader = _array(item, flexible, nullable) if array else item
        if "tag" in field.metadata:
            tagged[int(field.metadata["tag"])] = (field.name, reader)
        else:
            regular.append((field.name, reader))
    return regular, tagged, flexible


def read_entity(cls: type, buf: bytes, pos: int) -> tuple[Any, int]:
    """An instance of the kio entity ``cls`` read from ``buf[pos:]``, and the next position.
    Raises ``ValueError``/``IndexError``/``struct.error`` for bytes that do not fit."""
    regular, tagged, flexible = _plan(cls)
    values: dict[str, Any] = {}
    for name, reader in regular:
        values[name], pos = reader(buf, pos)
    if flexible:
        count, pos = read_uvarint(buf, pos)
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            end = pos + size
            if end > len(buf):
                raise ValueError("tagged field runs past the end of the frame")
            known = tagged.get(tag)
            if known is not None:
                values[known[0]], _ = known[1](buf[:end], pos)
            pos = end  # unknown tags are skipped, as Kafka does (KIP-482)
    return cls(**values), pos


# A field an entity's null check looks at: (name, None forbidden, entity class of its value or
# items (None for primitives), holds an array).
_NullCheck = tuple[str, bool, type | None, bool]


@functools.cache
def _null_checks(cls: type) -> tuple[_NullCheck, ...]:
    """The fields of ``cls`` that are non-nullable arrays or hold entities (cached per class:
    the type hints are read once)."""
    hints = typing.get_type_hints(cls)
    checks: list[_NullCheck] = []
    for field in dataclasses.fields(cls):
        inner, array, nullable = _unwrap(hints[field.name])
        entity = typing.cast(type, inner) if dataclasses.is_dataclass(inner) else None
        if (array and not nullable) or entity is not None:
            checks.append((field.name, array and not nullable, entity, array))
    return tuple(checks)


def null_in_non_nullable_array(entity: Any) -> str | None:
    """The dotted name of the first array field of ``entity`` (a kio entity, nested ones
    included) that holds None although the schema does not allow null; None when there is
    none. kio's reader accepts length -1 for any array; Kafka's generated readers refuse it
    for a non-nullable one (``RuntimeException: non-nullable field ... was serialized as
    null``). Cost: a few attribute reads per nested entity (one per topic and partition of a
    Produce)."""
    pending: list[tuple[str, Any]] = [("", entity)]
    while pending:
        prefix, current = pending.pop()
        kind: type = type(current)
        for name, forbid_null, item_class, array in _null_checks(kind):
            value = getattr(current, name)
            if value is None:
                if forbid_null:
                    return prefix + name
                continue
            if item_class is None:
                continue
            if array:
                pending.extend((f"{prefix}{name}[{i}].", item) for i, item in enumerate(value))
            else:
                pending.append((f"{prefix}{name}.", value))
    return None
