"""One table of (events, bytes) pairs, used in both directions where the codec has an encoder.

Each entry is decoded fed whole, one byte at a time, in two halves, and followed by trailing
bytes (the start of a next frame, which must stay buffered and change nothing). Where the server
can send the same frame, the encoder must produce exactly these bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from pamqp import commands

from gateway.amqp.codec import (
    encode_ack,
    encode_heartbeat,
    encode_method,
    encode_nack,
)
from gateway.amqp.events import HEARTBEAT, Ack, Method, Nack, Publish, Reject
from tests.amqp.wire import (
    body_frame,
    decoder,
    feed_bytewise,
    feed_chunks,
    feed_whole,
    header_frame,
    method_frame,
    normalized,
    publish_frame,
    shortstr,
)


@dataclass
class Case:
    id: str
    wire: bytes
    events: list[object]
    encode: Callable[[], bytes] | None = None  # the server-side encoder for the same bytes


def _method(channel: int, method: object) -> Case:
    """A control method: encode_method gives the bytes, the decoder gives the method back."""
    wire = encode_method(channel, method)  # type: ignore[arg-type]
    return Case(
        f"method-{method.name}",  # type: ignore[attr-defined]
        wire,
        [Method(channel, method)],  # type: ignore[arg-type]
        lambda: encode_method(channel, method),  # type: ignore[arg-type]
    )


PROPS_PERSISTENT_TEXT = b"\x90\x00" + shortstr("text/plain") + b"\x02"  # content_type, mode 2

CASES = [
    Case("heartbeat", b"\x08\x00\x00\x00\x00\x00\x00\xce", [HEARTBEAT], encode_heartbeat),
    Case(
        "ack",
        # type 1, channel 1, size 13, class 60, method 80, tag 5, multiple, frame end
        bytes.fromhex("01 0001 0000000d 003c 0050 0000000000000005 01 ce"),
        [Ack(1, 5, True)],
        lambda: encode_ack(1, 5, True),
    ),
    Case(
        "ack-single-large-tag",
        bytes.fromhex("01 ffff 0000000d 003c 0050 ffffffffffffffff 00 ce"),
        [Ack(65535, 2**64 - 1, False)],
        lambda: encode_ack(65535, 2**64 - 1),
    ),
    Case(
        "nack-multiple",
        bytes.fromhex("01 0002 0000000d 003c 0078 0000000000000007 01 ce"),
        [Nack(2, 7, True, False)],
        lambda: encode_nack(2, 7, multiple=True),
    ),
    Case(
        "nack-requeue",
        bytes.fromhex("01 0002 0000000d 003c 0078 0000000000000007 02 ce"),
        [Nack(2, 7, False, True)],
        lambda: encode_nack(2, 7, requeue=True),
    ),
    Case(
        "reject-requeue",
        bytes.fromhex("01 0003 0000000d 003c 005a 0000000000000009 01 ce"),
        [Reject(3, 9, True)],
    ),
    Case(
        "reject-drop",
        bytes.fromhex("01 0003 0000000d 003c 005a 0000000000000009 00 ce"),
        [Reject(3, 9, False)],
    ),
    Case(
        "publish-one-body-frame",
        # Basic.Publish: ticket 0, exchange "ex", routing key "a.b", mandatory
        bytes.fromhex("01 0001 0000000e 003c 0028 0000 02 6578 03 612e62 01 ce")
        # content header: class 60, weight 0, body size 5, flags content_type|delivery_mode
        + bytes.fromhex("02 0001 0000001a 003c 0000 0000000000000005")
        + PROPS_PERSISTENT_TEXT
        + b"\xce"
        + bytes.fromhex("03 0001 00000005")
        + b"hello\xce",
        [Publish(1, "ex", "a.b", True, False, PROPS_PERSISTENT_TEXT, b"hello")],
    ),
    Case(
        "publish-empty-body-no-body-frame",
        publish_frame(4, "", "q", immediate=True) + header_frame(4, 0),
        [Publish(4, "", "q", False, True, b"\x00\x00", b"")],
    ),
    Case(
        "publish-three-body-frames",
        publish_frame(1, "ex", "rk")
        + header_frame(1, 9)
        + body_frame(1, b"abc")
        + body_frame(1, b"")  # an empty body frame is allowed and changes nothing
        + body_frame(1, b"def")
        + body_frame(1, b"ghi"),
        [Publish(1, "ex", "rk", False, False, b"\x00\x00", b"abcdefghi")],
    ),
    Case(
        "publish-interleaved-channels",
        publish_frame(1, "e1", "r1")
        + publish_frame(2, "e2", "r2")
        + header_frame(2, 2)
        + header_frame(1, 4)
        + body_frame(1, b"ab")
        + body_frame(2, b"xy")
        + body_frame(1, b"cd"),
        [
            Publish(2, "e2", "r2", False, False, b"\x00\x00", b"xy"),
            Publish(1, "e1", "r1", False, False, b"\x00\x00", b"abcd"),
        ],
    ),
    Case(
        "publish-then-ack-then-publish",
        publish_frame(1, "ex", "rk")
        + header_frame(1, 1)
        + body_frame(1, b"1")
        + method_frame(1, 60, 80, struct.pack(">QB", 1, 0))
        + publish_frame(1, "ex", "rk")
        + header_frame(1, 1)
        + body_frame(1, b"2"),
        [
            Publish(1, "ex", "rk", False, False, b"\x00\x00", b"1"),
            Ack(1, 1, False),
            Publish(1, "ex", "rk", False, False, b"\x00\x00", b"2"),
        ],
    ),
    Case(
        "publish-utf8-names",
        publish_frame(1, "exchänge", "ключ") + header_frame(1, 1) + body_frame(1, b"x"),
        [Publish(1, "exchänge", "ключ", False, False, b"\x00\x00", b"x")],
    ),
    _method(0, commands.Connection.StartOk({"product": "test"}, "PLAIN", "\x00guest\x00guest")),
    _method(0, commands.Connection.TuneOk(2047, 131072, 60)),
    _method(0, commands.Connection.Open("/")),
    _method(0, commands.Connection.Close(200, "bye", 0, 0)),
    _method(0, commands.Connection.CloseOk()),
    _method(1, commands.Channel.Open()),
    _method(1, commands.Channel.Close(200, "ok", 0, 0)),
    _method(1, commands.Channel.CloseOk()),
    _method(1, commands.Channel.Flow(False)),
    _method(7, commands.Exchange.Declare(exchange="logs", exchange_type="topic", durable=True)),
    _method(7, commands.Exchange.Delete(exchange="logs", if_unused=True)),
    _method(7, commands.Exchange.Bind(destination="a", source="b", routing_key="k")),
    _method(
        1,
        commands.Queue.Declare(
            queue="q1",
            durable=True,
            arguments={"x-message-ttl": 60000, "x-queue-type": "quorum", "x-max-length": 10},
        ),
    ),
    _method(1, commands.Queue.Bind(queue="q1", exchange="logs", routing_key="#")),
    _method(1, commands.Queue.Purge(queue="q1")),
    _method(1, commands.Queue.Delete(queue="q1", if_empty=True)),
    _method(1, commands.Queue.Unbind(queue="q1", exchange="logs", routing_key="#")),
    _method(1, commands.Basic.Qos(prefetch_count=100)),
    _method(1, commands.Basic.Consume(queue="q1", consumer_tag="c1", no_ack=True)),
    _method(1, commands.Basic.Cancel(consumer_tag="c1")),
    _method(1, commands.Basic.Get(queue="q1", no_ack=False)),
    _method(1, commands.Basic.Recover(requeue=True)),
    _method(1, commands.Confirm.Select()),
    _method(1, commands.Tx.Select()),
    _method(1, commands.Tx.Commit()),
    _method(1, commands.Tx.Rollback()),
]

TRAILING = [b"\x01", b"\x01\x00\x01\x00\x00", b"\x03\x00\x01\x00\x00\x10\x00abc"]


@pytest.fixture(params=CASES, ids=[c.id for c in CASES])
def case(request: pytest.FixtureRequest) -> Case:
    return request.param  # type: ignore[no-any-return]


def test_decode_whole(case: Case) -> None:
    dec = decoder()
    assert normalized(feed_whole(dec, case.wire)) == normalized(case.events)
    assert dec.buffered == 0
    assert not dec.closing


def test_decode_one_byte_at_a_time(case: Case) -> None:
    assert normalized(feed_bytewise(decoder(), case.wire)) == normalized(case.events)


def test_decode_in_two_pieces_at_every_cut(case: Case) -> None:
    for cut in range(1, len(case.wire)):
        got = feed_chunks(decoder(), case.wire, [cut])
        assert normalized(got) == normalized(case.events), cut


@pytest.mark.parametrize("trailing", TRAILING)
def test_decode_with_trailing_bytes(case: Case, trailing: bytes) -> None:
    dec = decoder()
    assert normalized(dec.feed(case.wire + trailing)) == normalized(case.events)
    assert dec.buffered == len(trailing)
    assert not dec.closing


def test_decode_twice_in_one_buffer(case: Case) -> None:
    assert normalized(decoder().feed(case.wire * 2)) == normalized(case.events * 2)


ENCODABLE = [c for c in CASES if c.encode is not None]  # frames the server sends too


@pytest.mark.parametrize("case", ENCODABLE, ids=[c.id for c in ENCODABLE])
def test_encode(case: Case) -> None:
    assert case.encode is not None
    assert case.encode() == case.wire


def test_decode_memoryview_and_bytearray(case: Case) -> None:
    assert normalized(decoder().feed(memoryview(case.wire))) == normalized(case.events)
    assert normalized(decoder().feed(bytearray(case.wire))) == normalized(case.events)
