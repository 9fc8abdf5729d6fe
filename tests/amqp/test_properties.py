"""Content properties: decode/encode, pamqp cross-checks, byte-exact pass-through."""

from __future__ import annotations

import datetime
import string
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import header as pamqp_header

from gateway.amqp.codec import encode_deliver
from gateway.amqp.errors import AmqpConnectionError
from gateway.amqp.events import Publish
from gateway.amqp.fieldtable import Timestamp
from gateway.amqp.properties import (
    EMPTY_PROPERTIES,
    PROPERTY_LAYOUT,
    decode_properties,
    encode_properties,
)
from tests.amqp.wire import decoder, feed_chunks, marshal, unmarshal_all

ALL = {
    "content_type": "application/json",
    "content_encoding": "gzip",
    "headers": {"x-retry": 2, "trace": "abc", "nested": {"a": [1, None]}},
    "delivery_mode": 2,
    "priority": 9,
    "correlation_id": "corr-1",
    "reply_to": "amq.rabbitmq.reply-to",
    "expiration": "60000",
    "message_id": "m-1",
    "timestamp": Timestamp(1_700_000_000),
    "type": "order.created",
    "user_id": "guest",
    "app_id": "shop",
    "cluster_id": "c1",
}


def test_empty() -> None:
    assert encode_properties() == EMPTY_PROPERTIES == b"\x00\x00"
    assert decode_properties(EMPTY_PROPERTIES) == {}


def test_all_properties_round_trip() -> None:
    raw = encode_properties(ALL)
    assert raw[:2] == b"\xff\xfc"  # every flag bit 15..2
    assert decode_properties(raw) == ALL
    assert encode_properties(decode_properties(raw)) == raw


@pytest.mark.parametrize(("name", "flag", "kind"), PROPERTY_LAYOUT)
def test_each_property_alone(name: str, flag: int, kind: int) -> None:
    raw = encode_properties({name: ALL[name]})
    assert struct.unpack(">H", raw[:2])[0] == flag
    assert decode_properties(raw) == {name: ALL[name]}


def test_layout_matches_pamqp() -> None:
    flags = commands.Basic.Properties.flags
    ours = {("message_type" if n == "type" else n): f for n, f, _k in PROPERTY_LAYOUT}
    assert ours == flags


def test_encode_choices() -> None:
    assert encode_properties(content_type="") == b"\x80\x00\x00"  # empty but present
    assert encode_properties(content_type=None) == b"\x00\x00"  # None: absent
    assert encode_properties(correlation_id=b"\xff\x00") == b"\x04\x00\x02\xff\x00"
    dt = datetime.datetime(2023, 11, 14, 22, 13, 20, tzinfo=datetime.UTC)
    assert decode_properties(encode_properties(timestamp=dt)) == {"timestamp": 1_700_000_000}
    assert encode_properties({"priority": 1}, app_id="a") == encode_properties(
        priority=1, app_id="a"
    )


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"colour": "red"}, ValueError),
        ({"message_type": "x"}, ValueError),  # pamqp's name; ours is the spec's "type"
        ({"delivery_mode": 256}, ValueError),
        ({"priority": True}, ValueError),
        ({"priority": "1"}, ValueError),
        ({"timestamp": -1}, ValueError),
        ({"timestamp": "now"}, ValueError),
        ({"content_type": "x" * 256}, ValueError),
        ({"content_type": 5}, TypeError),
        ({"headers": [1]}, TypeError),
    ],
)
def test_encode_refuses(kwargs: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_properties(kwargs)


def test_decode_keeps_non_utf8_strings_as_bytes() -> None:
    raw = b"\x04\x00\x02\xff\xfe"  # correlation_id with binary octets (some clients do this)
    assert decode_properties(raw) == {"correlation_id": b"\xff\xfe"}
    assert encode_properties(decode_properties(raw)) == raw


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        (b"", 501),
        (b"\x80", 501),
        (b"\x80\x00", 501),  # content_type flagged, absent
        (b"\x80\x00\x05ab", 501),
        (b"\x10\x00", 501),
        (b"\x00\x40\x00\x00", 501),  # timestamp truncated
        (b"\x20\x00\x00\x00\x00\x05\x01aV", 501),  # headers overrun
        (b"\x20\x00\x00\x00\x00\x03\x01aZ", 502),  # unknown field type
        (b"\x00\x00\x00", 501),  # trailing octet
        (b"\x00\x02", 502),  # reserved flag
        (b"\x00\x01", 501),  # continuation, no second word
        (b"\x00\x01\x80\x00", 502),  # an unknown property in the second word
    ],
)
def test_decode_malformed(raw: bytes, code: int) -> None:
    with pytest.raises(AmqpConnectionError) as info:
        decode_properties(raw)
    assert info.value.reply_code == code


def test_continuation_word_without_flags_is_accepted() -> None:
    assert decode_properties(b"\x10\x01\x00\x00\x02") == {"delivery_mode": 2}


def test_publish_decodes_properties_lazily_once() -> None:
    publish = Publish(1, "", "q", False, False, b"\x10\x00\x02", b"")
    assert publish.properties == {"delivery_mode": 2}
    assert publish.properties is publish.properties
    broken = Publish(1, "", "q", False, False, b"\x80\x00", b"")  # decoding is deferred
    with pytest.raises(AmqpConnectionError):
        _ = broken.properties


# --- pamqp cross-checks -----------------------------------------------------------------------

short = st.text(max_size=20).filter(lambda s: s != "")  # pamqp drops empty strings
table_keys = st.text(max_size=10)
header_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
        st.floats(width=32, allow_nan=False),
        st.text(max_size=20),
    ),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(table_keys, c, max_size=3),
    max_leaves=10,
)
pamqp_properties = st.fixed_dictionaries(
    {},
    optional={
        "content_type": short,
        "content_encoding": short,
        "headers": st.dictionaries(table_keys, header_values, min_size=1, max_size=5),
        "delivery_mode": st.sampled_from([1, 2]),
        "priority": st.integers(0, 255),
        "correlation_id": short,
        "reply_to": short,
        "expiration": short,
        "message_id": short,
        "timestamp": st.integers(0, 2**32 - 1).map(
            lambda s: datetime.datetime.fromtimestamp(s, tz=datetime.UTC)
        ),
        "message_type": short,
        "user_id": short,
        "app_id": short,
    },
)


def ours(pamqp_kwargs: dict[str, object]) -> dict[str, object]:
    """The properties dict we decode from what pamqp encodes for these arguments."""
    out: dict[str, object] = {}
    for name, value in pamqp_kwargs.items():
        if name == "message_type":
            name = "type"
        if isinstance(value, datetime.datetime):
            value = Timestamp(int(value.timestamp()))
        out[name] = value
    return out


@given(pamqp_properties)
def test_we_decode_what_pamqp_encodes(kwargs: dict[str, object]) -> None:
    raw = commands.Basic.Properties(**kwargs).marshal()  # type: ignore[arg-type]
    assert decode_properties(raw) == ours(kwargs)


@given(pamqp_properties)
def test_pamqp_decodes_what_we_encode(kwargs: dict[str, object]) -> None:
    raw = encode_properties(ours(kwargs))
    content_header = pamqp_header.ContentHeader()
    content_header.unmarshal(struct.pack(">HHQ", 60, 0, 0) + raw)
    assert content_header.properties == commands.Basic.Properties(**kwargs)  # type: ignore[arg-type]


exchanges = st.text(alphabet=string.ascii_letters + string.digits + "-_.:@#,/+ ", max_size=127)


@settings(max_examples=200)
@given(
    channel=st.integers(1, 65535),
    exchange=exchanges,
    routing_key=st.text(max_size=60),
    mandatory=st.booleans(),
    immediate=st.booleans(),
    properties=pamqp_properties,
    body=st.binary(max_size=20_000),
    frame_max=st.sampled_from([4096, 5000, 131072]),
    cuts=st.lists(st.integers(0, 30_000), max_size=8),
)
def test_publish_built_by_pamqp_passes_through_to_deliver_byte_for_byte(
    channel: int,
    exchange: str,
    routing_key: str,
    mandatory: bool,
    immediate: bool,
    properties: dict[str, object],
    body: bytes,
    frame_max: int,
    cuts: list[int],
) -> None:
    """A client's frames (pamqp) → our Publish → our Deliver → pamqp: the same message."""
    pamqp_props = commands.Basic.Properties(**properties)  # type: ignore[arg-type]
    step = frame_max - 8
    wire = marshal(
        channel,
        commands.Basic.Publish(
            exchange=exchange, routing_key=routing_key, mandatory=mandatory, immediate=immediate
        ),
        pamqp_header.ContentHeader(0, len(body), pamqp_props),
        *[pamqp_body.ContentBody(body[i : i + step]) for i in range(0, len(body), step)],
    )
    [publish] = feed_chunks(decoder(frame_max=frame_max), wire, cuts)
    assert publish == Publish(
        channel, exchange, routing_key, mandatory, immediate, pamqp_props.marshal(), body
    )
    assert isinstance(publish, Publish)
    assert publish.properties == ours(properties)

    out = encode_deliver(
        channel, "ctag", 1, False, exchange, routing_key, publish.properties_raw, body, frame_max
    )
    frames = unmarshal_all(out)
    deliver, content_header = frames[0][1], frames[1][1]
    assert isinstance(deliver, commands.Basic.Deliver)
    assert (deliver.exchange, deliver.routing_key) == (exchange, routing_key)
    assert isinstance(content_header, pamqp_header.ContentHeader)
    assert content_header.properties == pamqp_props
    assert b"".join(f.value for _c, f in frames[2:]) == body  # type: ignore[attr-defined]
    # the content header frame carries the client's property octets unchanged
    header_at = 8 + struct.unpack(">I", out[3:7])[0]
    header_size = struct.unpack(">I", out[header_at + 3 : header_at + 7])[0]
    assert out[header_at] == 2
    assert out[header_at + 7 + 12 : header_at + 7 + header_size] == publish.properties_raw


def test_non_canonical_properties_pass_through_unchanged() -> None:
    """Octets our encoder would never write ('b' ints, 'f' floats, unsorted) survive as is."""
    headers = (
        b"\x01zb\x05"  # 'b' int8
        + b"\x01af"
        + struct.pack(">f", 2.5)  # 'f' float32
        + b"\x01mL\x00\x00\x00\x00\x00\x00\x00\x07"  # 'L'
    )
    raw = b"\x20\x00" + struct.pack(">I", len(headers)) + headers
    assert decode_properties(raw) == {"headers": {"z": 5, "a": 2.5, "m": 7}}
    assert encode_properties(decode_properties(raw)) != raw  # re-encoding would change them...
    wire = marshal(1, commands.Basic.Publish(exchange="e", routing_key="r"))
    wire += b"\x02\x00\x01" + struct.pack(">I", 12 + len(raw)) + struct.pack(">HHQ", 60, 0, 1)
    wire += raw + b"\xce" + b"\x03\x00\x01\x00\x00\x00\x01x\xce"
    [publish] = decoder().feed(wire)
    assert isinstance(publish, Publish)
    out = encode_deliver(1, "c", 1, False, "e", "r", publish.properties_raw, publish.body)
    assert raw + b"\xce" in out  # ...so the broker forwards the octets, never re-encodes
