"""Field tables: every RabbitMQ type, round trips, pamqp cross-checks, malformed input."""

from __future__ import annotations

import datetime
import struct
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import decode as pamqp_decode
from pamqp import encode as pamqp_encode

from gateway.amqp.errors import AmqpConnectionError
from gateway.amqp.fieldtable import (
    Timestamp,
    decode_array,
    decode_table,
    encode_array,
    encode_table,
    read_table,
)


def table_of(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack(">I", len(body)) + body


def entry(name: str, kind: bytes, value: bytes) -> bytes:
    raw = name.encode()
    return bytes((len(raw),)) + raw + kind + value


# (type octet, value octets, decoded Python value, canonical: our encoder writes these octets)
TYPES = [
    (b"t", b"\x01", True, True),
    (b"t", b"\x00", False, True),
    (b"t", b"\x07", True, False),  # any non-zero octet is true (RabbitMQ: V /= 0)
    (b"b", b"\xff", -1, False),
    (b"B", b"\xff", 255, False),
    (b"s", b"\x80\x00", -32768, False),
    (b"u", b"\xff\xff", 65535, False),
    (b"I", b"\x80\x00\x00\x00", -(2**31), True),
    (b"i", b"\xff\xff\xff\xff", 2**32 - 1, False),
    (b"l", b"\x7f\xff\xff\xff\xff\xff\xff\xff", 2**63 - 1, True),
    (b"L", b"\xff\xff\xff\xff\xff\xff\xff\xff", -1, False),  # signed, as RabbitMQ reads it
    (b"f", struct.pack(">f", 1.5), 1.5, False),
    (b"d", struct.pack(">d", 0.1), 0.1, True),
    (b"D", b"\x02\x00\x00\x00\x96", Decimal("1.50"), True),
    (b"D", b"\x01\xff\xff\xff\xf1", Decimal("-1.5"), True),
    (b"S", b"\x00\x00\x00\x06" + "héllo".encode(), "héllo", True),
    (b"S", b"\x00\x00\x00\x02\xff\xfe", b"\xff\xfe", False),  # not UTF-8: the octets
    (b"x", b"\x00\x00\x00\x03\x00\x01\x02", b"\x00\x01\x02", True),
    (b"T", b"\x00\x00\x00\x00\x65\x53\xf1\x00", Timestamp(1700000000), True),
    (b"T", b"\x00\x00\x01\x8b\xcf\xe5\x68\x00", Timestamp(1700000000000), True),  # millis
    (b"V", b"", None, True),
    (b"F", table_of(entry("a", b"I", b"\x00\x00\x00\x01")), {"a": 1}, True),
    (b"F", b"\x00\x00\x00\x00", {}, True),
    (b"A", b"\x00\x00\x00\x06I\x00\x00\x00\x01V", [1, None], True),
    (b"A", b"\x00\x00\x00\x00", [], True),
]


@pytest.mark.parametrize(
    ("kind", "value", "expected", "canonical"),
    TYPES,
    ids=[f"{t[0].decode()}-{i}" for i, t in enumerate(TYPES)],
)
def test_each_type(kind: bytes, value: bytes, expected: object, canonical: bool) -> None:
    wire = table_of(entry("key", kind, value))
    decoded = decode_table(wire)
    assert decoded == {"key": expected}
    assert type(decoded["key"]) is type(expected)
    if canonical:
        assert encode_table(decoded) == wire
    # the same value inside an array
    array = struct.pack(">I", 1 + len(value)) + kind + value
    assert decode_array(array) == [expected]


def test_x_death_like_nesting() -> None:
    headers = {
        "x-death": [
            {
                "count": 3,
                "reason": "rejected",
                "queue": "work",
                "time": Timestamp(1_700_000_000),
                "exchange": "",
                "routing-keys": ["work"],
            }
        ],
        "x-first-death-reason": "rejected",
    }
    assert decode_table(encode_table(headers)) == headers


def test_encoder_type_choices() -> None:
    assert encode_table({"i": 2**31 - 1})[4:] == b"\x01iI\x7f\xff\xff\xff"
    assert encode_table({"i": 2**31})[4:] == b"\x01il\x00\x00\x00\x00\x80\x00\x00\x00"
    assert encode_table({"f": 0.5})[4:] == b"\x01fd" + struct.pack(">d", 0.5)
    assert encode_table({"b": bytearray(b"ab")})[4:] == b"\x01bx\x00\x00\x00\x02ab"
    assert encode_table({"m": memoryview(b"ab")})[4:] == b"\x01mx\x00\x00\x00\x02ab"
    assert encode_table({"t": (1, "a")}) == encode_table({"t": [1, "a"]})
    naive = datetime.datetime(2023, 11, 14, 22, 13, 20)
    assert decode_table(encode_table({"d": naive})) == {"d": Timestamp(1_700_000_000)}
    assert Timestamp(1_700_000_000).to_datetime() == naive.replace(tzinfo=datetime.UTC)
    assert encode_table(None) == encode_table({}) == b"\x00\x00\x00\x00"
    assert decode_table(encode_table({"k": "v", "a": 1}))  # order kept: k before a
    assert list(decode_table(encode_table({"k": "v", "a": 1}))) == ["k", "a"]


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (2**63, ValueError),
        (-(2**63) - 1, ValueError),
        (Decimal("NaN"), ValueError),
        (Decimal(2**31), ValueError),
        (Decimal("1E-256"), ValueError),
        (Timestamp(-1), ValueError),
        (object(), TypeError),
        ({1: "non-str key"}, TypeError),
        ({"k" * 256: 1}, ValueError),
        (complex(1, 2), TypeError),
    ],
)
def test_encoder_refuses(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_table({"v": value})


def test_encoder_refuses_nesting_beyond_the_limit() -> None:
    deep: object = 1
    for _ in range(70):
        deep = [deep]
    with pytest.raises(ValueError, match="nested"):
        encode_table({"deep": deep})


MALFORMED = [
    ("short-length", b"\x00\x00\x00", 501),
    ("length-overruns", b"\x00\x00\x00\x05\x01a", 501),
    ("name-overruns", table_of(b"\x05ab"), 501),
    ("no-value", table_of(b"\x01a"), 501),
    ("unknown-type", table_of(entry("a", b"Z", b"")), 502),
    ("zero-type", table_of(entry("a", b"\x00", b"")), 502),
    ("truncated-int", table_of(entry("a", b"I", b"\x00\x00")), 501),
    ("truncated-bool", table_of(entry("a", b"t", b"")), 501),
    ("truncated-timestamp", table_of(entry("a", b"T", b"\x00")), 501),
    ("truncated-decimal", table_of(entry("a", b"D", b"\x02\x00")), 501),
    ("truncated-longstr-length", table_of(entry("a", b"S", b"\x00\x00")), 501),
    ("longstr-overruns", table_of(entry("a", b"S", b"\x00\x00\x00\x09ab")), 501),
    ("nested-overruns-outer", table_of(entry("a", b"F", b"\x00\x00\x00\x09")), 501),
    ("array-overruns", table_of(entry("a", b"A", b"\x00\x00\x00\x09")), 501),
    ("name-not-utf8", table_of(b"\x01\xff" + b"V"), 502),
    ("trailing-octets", table_of(entry("a", b"V", b"")) + b"\x00", 501),
]


@pytest.mark.parametrize(
    ("wire", "code"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed(wire: bytes, code: int) -> None:
    with pytest.raises(AmqpConnectionError) as info:
        decode_table(wire)
    assert info.value.reply_code == code


def test_nested_value_cannot_overrun_its_parent() -> None:
    inner = table_of(entry("b", b"V", b""))
    # the outer table claims fewer octets than the nested one needs
    wire = struct.pack(">I", 3 + 4) + b"\x01aF" + inner
    with pytest.raises(AmqpConnectionError) as info:
        decode_table(wire)
    assert info.value.reply_code == 501


def test_deep_nesting_is_a_syntax_error_not_a_crash() -> None:
    wire = b"V"
    for _ in range(200):
        wire = b"A" + struct.pack(">I", len(wire)) + wire
    with pytest.raises(AmqpConnectionError) as info:
        decode_table(table_of(b"\x01a" + wire))
    assert info.value.reply_code == 502


def test_read_table_at_an_offset_over_memoryview() -> None:
    wire = b"junk" + encode_table({"a": "b"}) + b"more"
    table, end = read_table(memoryview(wire), 4)
    assert table == {"a": "b"}
    assert wire[end:] == b"more"


# --- hypothesis -----------------------------------------------------------------------------

keys = st.text(max_size=20)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.binary(max_size=30),
    st.builds(
        lambda m, s: Decimal(m).scaleb(-s), st.integers(-(2**31), 2**31 - 1), st.integers(0, 255)
    ),
    st.builds(Timestamp, st.integers(0, 2**63 - 1)),
)
values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(keys, values, max_size=6))
def test_round_trip(table: dict[str, object]) -> None:
    wire = encode_table(table)
    decoded = decode_table(wire)
    assert decoded == table
    assert encode_table(decoded) == wire  # canonical octets are stable


@given(st.lists(values, max_size=6))
def test_array_round_trip(array: list[object]) -> None:
    assert decode_array(encode_array(array)) == array


# pamqp-compatible values: pamqp encodes floats as 32-bit 'f', bytearray as 'x', datetimes as
# 'T', Decimal mantissas as signed; it refuses bytes. ``expect`` is what our decoder must return.
pamqp_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(width=32, allow_nan=False),
    st.text(max_size=30),
    st.binary(max_size=30).map(bytearray),
    st.builds(
        lambda m, s: Decimal(m).scaleb(-s), st.integers(-(2**31), 2**31 - 1), st.integers(0, 20)
    ),
    st.integers(0, 2**32 - 1).map(lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)),
)
pamqp_values = st.recursive(
    pamqp_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)


def expect(value: object) -> object:
    if isinstance(value, datetime.datetime):
        return Timestamp(int(value.timestamp()))
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: expect(v) for k, v in value.items()}
    if isinstance(value, list):
        return [expect(v) for v in value]
    return value


def from_pamqp(value: object) -> object:
    """What pamqp decodes our encoding of ``value`` to, in our terms."""
    if isinstance(value, datetime.datetime):
        return Timestamp(int(value.timestamp()))
    if isinstance(value, bytearray):
        return bytes(value)
    if isinstance(value, dict):
        return {k: from_pamqp(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_pamqp(v) for v in value]
    return value


@given(st.dictionaries(keys, pamqp_values, max_size=6))
def test_we_decode_what_pamqp_encodes(table: dict[str, object]) -> None:
    wire = pamqp_encode.field_table(table)  # type: ignore[arg-type]
    assert decode_table(wire) == expect(table)


# pamqp reads a 'T' above 2**32 as milliseconds and fails past year 9999: keep below that
values_for_pamqp = st.recursive(
    scalars.filter(lambda v: not isinstance(v, Timestamp) or v <= 0xFFFFFFFF),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
    max_leaves=20,
)


@given(st.dictionaries(keys, values_for_pamqp, max_size=6))
def test_pamqp_decodes_what_we_encode(table: dict[str, object]) -> None:
    wire = encode_table(table)
    used, decoded = pamqp_decode.field_table(wire)
    assert used == len(wire)
    assert from_pamqp(decoded) == table


def test_array_edge_cases() -> None:
    with pytest.raises(AmqpConnectionError) as info:
        decode_array(b"\x00\x00")
    assert info.value.reply_code == 501
    with pytest.raises(AmqpConnectionError) as info:
        decode_array(encode_array([1]) + b"\x00")
    assert info.value.reply_code == 501
    inner = encode_array([None, None])
    wire = struct.pack(">I", 3 + 4) + b"\x01aA" + inner  # the nested array overruns its parent
    with pytest.raises(AmqpConnectionError) as info:
        decode_table(wire)
    assert info.value.reply_code == 501


def test_deep_table_nesting() -> None:
    wire = b"\x00\x00\x00\x00"
    for _ in range(100):
        wire = table_of(b"\x01aF" + wire)
    with pytest.raises(AmqpConnectionError) as info:
        decode_table(wire)
    assert info.value.reply_code == 502
    deep: object = {}
    for _ in range(70):
        deep = {"a": deep}
    with pytest.raises(ValueError, match="nested"):
        encode_table(deep)  # type: ignore[arg-type]
