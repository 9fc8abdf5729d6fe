"""The hand-written server encoders, cross-checked against pamqp's decoder and generic encoder."""

from __future__ import annotations

import string

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pamqp import body as pamqp_body
from pamqp import commands
from pamqp import header as pamqp_header
from pamqp import heartbeat as pamqp_heartbeat

from gateway.amqp.codec import (
    encode_ack,
    encode_basic_return,
    encode_content,
    encode_deliver,
    encode_get_ok,
    encode_heartbeat,
    encode_method,
    encode_nack,
)
from gateway.amqp.errors import AmqpChannelError, AmqpConnectionError
from gateway.amqp.properties import encode_properties
from tests.amqp.wire import unmarshal_all

PROPS = encode_properties(content_type="text/plain", delivery_mode=2, headers={"k": "v"})

shortstrs = st.text(max_size=40)  # at most 160 octets of UTF-8
# pamqp validates exchange names against the spec's domain (to build the generic frames)
exchanges = st.text(alphabet=string.ascii_letters + string.digits + "-_.:@#,/+ ", max_size=127)
bodies = st.binary(max_size=3000)
frame_maxes = st.sampled_from([0, 4096, 4097, 5000, 131072])


def _split(out: bytes) -> tuple[object, object, bytes, list[int]]:
    """pamqp-decode a method + content frames: (method, content header, body, body frame sizes)."""
    frames = unmarshal_all(out)
    method = frames[0][1]
    content_header = frames[1][1]
    bodies = [f for _ch, f in frames[2:]]
    assert all(isinstance(b, pamqp_body.ContentBody) for b in bodies)
    return method, content_header, b"".join(b.value for b in bodies), [len(b.value) for b in bodies]  # type: ignore[attr-defined]


def _check_frames(out: bytes, channel: int, frame_max: int, body: bytes) -> list[int]:
    frames = unmarshal_all(out)
    assert {ch for ch, _ in frames} == {channel}
    _method, content_header, got_body, sizes = _split(out)
    assert isinstance(content_header, pamqp_header.ContentHeader)
    assert content_header.body_size == len(body)
    assert got_body == body
    if frame_max:
        assert all(size <= frame_max - 8 for size in sizes)
        # every body frame but the last is full
        assert all(size == frame_max - 8 for size in sizes[:-1])
    else:
        assert len(sizes) <= 1
    assert (len(sizes) == 0) == (len(body) == 0)  # an empty body has no body frame
    return sizes


@given(
    channel=st.integers(1, 65535),
    consumer_tag=shortstrs,
    delivery_tag=st.integers(0, 2**63 - 1),
    redelivered=st.booleans(),
    exchange=exchanges,
    routing_key=shortstrs,
    body=bodies,
    frame_max=frame_maxes,
)
def test_deliver_against_pamqp(
    channel: int,
    consumer_tag: str,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
) -> None:
    out = encode_deliver(
        channel,
        consumer_tag,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        PROPS,
        body,
        frame_max,
    )
    _check_frames(out, channel, frame_max, body)
    method, content_header, _, _ = _split(out)
    assert isinstance(method, commands.Basic.Deliver)
    assert dict(method) == {
        "consumer_tag": consumer_tag,
        "delivery_tag": delivery_tag,
        "redelivered": redelivered,
        "exchange": exchange,
        "routing_key": routing_key,
    }
    assert content_header.properties == commands.Basic.Properties(  # type: ignore[attr-defined]
        content_type="text/plain", delivery_mode=2, headers={"k": "v"}
    )
    # the generic pamqp path gives the same octets
    generic = commands.Basic.Deliver(consumer_tag, delivery_tag, redelivered, exchange, routing_key)
    assert encode_content(channel, generic, PROPS, body, frame_max) == out


@given(
    channel=st.integers(1, 65535),
    delivery_tag=st.integers(0, 2**63 - 1),
    redelivered=st.booleans(),
    exchange=exchanges,
    routing_key=shortstrs,
    message_count=st.integers(0, 2**32 - 1),
    body=bodies,
    frame_max=frame_maxes,
)
def test_get_ok_against_pamqp(
    channel: int,
    delivery_tag: int,
    redelivered: bool,
    exchange: str,
    routing_key: str,
    message_count: int,
    body: bytes,
    frame_max: int,
) -> None:
    out = encode_get_ok(
        channel,
        delivery_tag,
        redelivered,
        exchange,
        routing_key,
        message_count,
        PROPS,
        body,
        frame_max,
    )
    _check_frames(out, channel, frame_max, body)
    method = _split(out)[0]
    assert isinstance(method, commands.Basic.GetOk)
    assert dict(method) == {
        "delivery_tag": delivery_tag,
        "redelivered": redelivered,
        "exchange": exchange,
        "routing_key": routing_key,
        "message_count": message_count,
    }
    generic = commands.Basic.GetOk(delivery_tag, redelivered, exchange, routing_key, message_count)
    assert encode_content(channel, generic, PROPS, body, frame_max) == out


@given(
    channel=st.integers(1, 65535),
    reply_code=st.sampled_from([312, 313]),
    reply_text=shortstrs,
    exchange=exchanges,
    routing_key=shortstrs,
    body=bodies,
    frame_max=frame_maxes,
)
def test_basic_return_against_pamqp(
    channel: int,
    reply_code: int,
    reply_text: str,
    exchange: str,
    routing_key: str,
    body: bytes,
    frame_max: int,
) -> None:
    out = encode_basic_return(
        channel, reply_code, reply_text, exchange, routing_key, PROPS, body, frame_max
    )
    _check_frames(out, channel, frame_max, body)
    method = _split(out)[0]
    assert isinstance(method, commands.Basic.Return)
    assert dict(method) == {
        "reply_code": reply_code,
        "reply_text": reply_text,
        "exchange": exchange,
        "routing_key": routing_key,
    }
    generic = commands.Basic.Return(reply_code, reply_text, exchange, routing_key)
    assert encode_content(channel, generic, PROPS, body, frame_max) == out


def test_deliver_splits_the_body_at_frame_max_minus_8() -> None:
    body = bytes(range(256)) * 40  # 10,240 octets
    out = encode_deliver(1, "c", 1, False, "e", "r", PROPS, body, 4096)
    assert _check_frames(out, 1, 4096, body) == [4088, 4088, 2064]
    exact = encode_deliver(1, "c", 1, False, "e", "r", PROPS, body[:4088], 4096)
    assert _check_frames(exact, 1, 4096, body[:4088]) == [4088]
    assert (
        _check_frames(encode_deliver(1, "c", 1, False, "e", "r", PROPS, b"", 4096), 1, 4096, b"")
        == []
    )


def test_deliver_takes_memoryview_bytes_names_and_preserves_properties() -> None:
    body = memoryview(b"0123456789" * 1000)
    odd_props = b"\x20\x00\x00\x00\x00\x0a\x01ab\x01\x01bf\x3f\x80\x00\x00"  # 'b' and 'f' entries
    a = encode_deliver(3, b"ctag", 9, True, b"ex", b"rk", odd_props, body, 4096)
    b = encode_deliver(3, "ctag", 9, True, "ex", "rk", odd_props, body.tobytes(), 4096)
    assert a == b
    assert odd_props + b"\xce" in a  # the property octets go out exactly as they came in


def test_shortstr_over_255_octets_is_refused() -> None:
    with pytest.raises(ValueError, match="255"):
        encode_deliver(1, "c" * 256, 1, False, "", "", PROPS, b"")
    with pytest.raises(ValueError, match="255"):
        encode_get_ok(1, 1, False, "", "é" * 128, 0, PROPS, b"")
    with pytest.raises(ValueError, match="255"):
        encode_basic_return(1, 312, "t" * 256, "", "", PROPS, b"")


@given(channel=st.integers(0, 65535), tag=st.integers(0, 2**63 - 1), multiple=st.booleans())
def test_ack_against_pamqp(channel: int, tag: int, multiple: bool) -> None:
    [(ch, method)] = unmarshal_all(encode_ack(channel, tag, multiple))
    assert ch == channel
    assert isinstance(method, commands.Basic.Ack)
    assert (method.delivery_tag, method.multiple) == (tag, multiple)
    assert encode_ack(channel, tag, multiple) == encode_method(
        channel, commands.Basic.Ack(tag, multiple)
    )


@given(
    channel=st.integers(0, 65535),
    tag=st.integers(0, 2**63 - 1),
    multiple=st.booleans(),
    requeue=st.booleans(),
)
def test_nack_against_pamqp(channel: int, tag: int, multiple: bool, requeue: bool) -> None:
    [(ch, method)] = unmarshal_all(encode_nack(channel, tag, multiple, requeue))
    assert ch == channel
    assert isinstance(method, commands.Basic.Nack)
    assert (method.delivery_tag, method.multiple, method.requeue) == (tag, multiple, requeue)
    assert encode_nack(channel, tag, multiple, requeue) == encode_method(
        channel, commands.Basic.Nack(tag, multiple, requeue)
    )


def test_heartbeat() -> None:
    [(channel, value)] = unmarshal_all(encode_heartbeat())
    assert channel == 0
    assert isinstance(value, pamqp_heartbeat.Heartbeat)


def test_errors_make_their_close_methods() -> None:
    err = AmqpConnectionError(505, "UNEXPECTED_FRAME - x", 60, 40)
    close = err.close_method()
    assert isinstance(close, commands.Connection.Close)
    assert dict(close) == {
        "reply_code": 505,
        "reply_text": "UNEXPECTED_FRAME - x",
        "class_id": 60,
        "method_id": 40,
    }
    chan = AmqpChannelError(404, "", 50, 10, channel=3)
    assert chan.reply_text == "NOT_FOUND"
    assert chan.channel == 3
    assert dict(chan.close_method()) == {
        "reply_code": 404,
        "reply_text": "NOT_FOUND",
        "class_id": 50,
        "method_id": 10,
    }
    long = AmqpChannelError(406, "é" * 200)
    assert len(long.close_method().reply_text.encode()) <= 255
    encode_method(1, long.close_method())  # pamqp accepts it
    assert "406" in str(long)
    assert err == AmqpConnectionError(505, "UNEXPECTED_FRAME - x", 60, 40)
    assert err != AmqpChannelError(505, "UNEXPECTED_FRAME - x", 60, 40)


def test_frame_max_too_small_for_a_body() -> None:
    with pytest.raises(ValueError, match="frame_max"):
        encode_deliver(1, "c", 1, False, "e", "r", PROPS, b"body", 8)
    assert encode_deliver(1, "c", 1, False, "e", "r", PROPS, b"", 8)  # no body: no body frame


def test_struct_cache_stays_bounded() -> None:
    from gateway.amqp import codec

    for i in range(codec._STRUCT_CACHE_MAX + 10):
        encode_get_ok(1, 1, False, "e" * (i % 200), "r" * (i // 200), 0, PROPS, b"")
    assert len(codec._STRUCT_CACHE) <= codec._STRUCT_CACHE_MAX


def test_errors_are_hashable_values() -> None:
    a = AmqpChannelError(404, "x", 50, 10, channel=1)
    assert len({a, AmqpChannelError(404, "x", 50, 10, channel=1)}) == 1
    assert a != AmqpChannelError(404, "x", 50, 10, channel=2)
