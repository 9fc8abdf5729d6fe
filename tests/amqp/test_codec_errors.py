"""Malformed input gets RabbitMQ's reply codes; what the decoder does afterwards."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands

from gateway.amqp.codec import AmqpDecoder, encode_method
from gateway.amqp.constants import (
    HEARTBEAT_FRAME,
    MAX_MSG_SIZE,
    PROTOCOL_HEADER,
    PROTOCOL_HEADER_0_9,
)
from gateway.amqp.errors import AmqpChannelError, AmqpConnectionError
from gateway.amqp.events import (
    HEARTBEAT,
    BadProtocolHeader,
    Method,
    ProtocolHeader,
    Publish,
)
from tests.amqp.wire import (
    body_frame,
    decoder,
    feed_bytewise,
    frame,
    header_frame,
    method_frame,
    normalize,
    publish_frame,
    publish_triple,
    tag_bits_frame,
)

OK_TRIPLE = publish_triple(1, b"body")

# (id, bytes, reply code, class id, method id, framing lost?)
MALFORMED = [
    # --- framing: the decoder loses sync and stops (rabbit_reader fatal_frame_error) ---
    ("bad-frame-end", frame(1, 1, b"\x00\x3c\x00\x50" + bytes(9), end=0x00), 501, 0, 0, True),
    ("frame-end-is-next-frame", publish_frame(1)[:-1] + b"\x01" + bytes(20), 501, 0, 0, True),
    # --- frames the assembler does not expect (rabbit_command_assembler) ---
    ("body-without-publish", body_frame(1, b"abc"), 505, 0, 0, False),
    ("header-without-publish", header_frame(1, 3), 505, 0, 0, False),
    ("header-on-channel-0", header_frame(0, 3), 505, 0, 0, False),
    ("body-on-channel-0", body_frame(0, b"x"), 505, 0, 0, False),
    ("publish-then-publish", publish_frame(1) + publish_frame(1), 505, 60, 40, False),
    ("publish-then-body", publish_frame(1) + body_frame(1, b"x"), 505, 60, 40, False),
    (
        "publish-then-ack",
        publish_frame(1) + tag_bits_frame(1, 80, 1, 0),
        505,
        60,
        40,
        False,
    ),
    (
        "publish-header-then-method",
        publish_frame(1)
        + header_frame(1, 3)
        + method_frame(1, 20, 40, b"\x00\xc8\x00\x00\x00\x00\x00"),
        505,
        60,
        40,
        False,
    ),
    (
        "publish-header-then-header",
        publish_frame(1) + header_frame(1, 3) + header_frame(1, 3),
        505,
        60,
        40,
        False,
    ),
    (
        "header-of-other-class",
        publish_frame(1) + header_frame(1, 3, class_id=50),
        505,
        60,
        40,
        False,
    ),
    ("header-with-weight", publish_frame(1) + header_frame(1, 3, weight=1), 505, 60, 40, False),
    ("heartbeat-on-channel", frame(8, 1, b""), 505, 0, 0, False),
    # --- frames that don't decode ---
    ("unknown-frame-type", frame(5, 1, b"abc"), 501, 0, 0, False),
    ("method-shorter-than-4", frame(1, 1, b"\x00\x3c\x00"), 501, 0, 0, False),
    ("heartbeat-with-payload", frame(8, 0, b"x"), 501, 0, 0, False),
    (
        "header-too-short",
        publish_frame(1) + frame(2, 1, struct.pack(">HHQ", 60, 0, 1)),
        501,
        0,
        0,
        False,
    ),
    (
        "body-longer-than-declared",
        publish_frame(1) + header_frame(1, 3) + body_frame(1, b"abcd"),
        501,
        60,
        40,
        False,
    ),
    (
        "body-longer-than-rest",
        publish_frame(1) + header_frame(1, 3) + body_frame(1, b"ab") + body_frame(1, b"cd"),
        501,
        60,
        40,
        False,
    ),
    (
        "body-size-over-512MiB",
        publish_frame(1) + header_frame(1, MAX_MSG_SIZE + 1),
        501,
        60,
        40,
        False,
    ),
    (
        "publish-exchange-overruns-frame",
        method_frame(1, 60, 40, b"\x00\x00\x09ex"),
        501,
        60,
        40,
        False,
    ),
    (
        "publish-missing-bits",
        method_frame(1, 60, 40, b"\x00\x00\x02ex\x02rk"),
        501,
        60,
        40,
        False,
    ),
    (
        "publish-trailing-octets",
        method_frame(1, 60, 40, b"\x00\x00\x02ex\x02rk\x00\x00"),
        501,
        60,
        40,
        False,
    ),
    ("publish-empty-args", method_frame(1, 60, 40), 501, 60, 40, False),
    (
        "publish-bad-utf8",
        method_frame(1, 60, 40, b"\x00\x00\x02\xff\xfe\x00\x00"),
        501,
        60,
        40,
        False,
    ),
    ("ack-short", method_frame(1, 60, 80, b"\x00" * 8), 501, 60, 80, False),
    ("nack-long", method_frame(1, 60, 120, b"\x00" * 10), 501, 60, 120, False),
    ("reject-short", method_frame(1, 60, 90, b""), 501, 60, 90, False),
    (
        "queue-declare-truncated",
        frame(
            1, 1, encode_method(1, commands.Queue.Declare(queue="q", arguments={"x": "y"}))[7:-7]
        ),
        501,
        50,
        10,
        False,
    ),
    # --- methods: unknown, server-only, on the wrong channel ---
    ("unknown-method", method_frame(1, 60, 99), 540, 60, 99, False),
    ("unknown-class", method_frame(1, 99, 10), 540, 99, 10, False),
    (
        "server-only-deliver",
        encode_method(1, commands.Basic.Deliver("c", 1, False, "", "q")),
        503,
        60,
        60,
        False,
    ),
    (
        "server-only-connection-start",
        encode_method(0, commands.Connection.Start()),
        503,
        10,
        10,
        False,
    ),
    ("server-only-consume-ok", encode_method(1, commands.Basic.ConsumeOk("c")), 503, 60, 21, False),
    (
        "connection-open-on-channel-1",
        encode_method(1, commands.Connection.Open()),
        503,
        10,
        40,
        False,
    ),
    ("channel-open-on-channel-0", encode_method(0, commands.Channel.Open()), 504, 20, 10, False),
    ("publish-on-channel-0", publish_frame(0), 504, 60, 40, False),
    ("ack-on-channel-0", tag_bits_frame(0, 80, 1, 0), 504, 60, 80, False),
]


@pytest.mark.parametrize(
    ("wire", "code", "class_id", "method_id", "lost_sync"),
    [m[1:] for m in MALFORMED],
    ids=[m[0] for m in MALFORMED],
)
@pytest.mark.parametrize("bytewise", [False, True], ids=["whole", "bytewise"])
def test_malformed(
    wire: bytes, code: int, class_id: int, method_id: int, lost_sync: bool, bytewise: bool
) -> None:
    dec = decoder()
    # a good publish first: its event must survive the error that follows
    data = OK_TRIPLE + wire
    events = feed_bytewise(dec, data) if bytewise else dec.feed(data)
    assert isinstance(events[0], Publish)
    assert len(events) == 2, events
    error = events[1]
    assert isinstance(error, AmqpConnectionError)
    assert (error.reply_code, error.class_id, error.method_id) == (code, class_id, method_id)
    assert error.reply_text.startswith(error.reply_text.split(" - ")[0] + " - ")
    assert dec.closing
    assert dec.dead == lost_sync
    close = error.close_method()
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (code, class_id, method_id)


def test_frame_max_fudge_like_rabbitmq() -> None:
    """A payload of exactly frame_max passes (RabbitMQ's 8-octet fudge); one more is 501."""
    dec = decoder(frame_max=4096)
    body = b"x" * 4096
    ok = publish_frame(1) + header_frame(1, len(body)) + body_frame(1, body)
    assert dec.feed(ok) == [Publish(1, "", "", False, False, b"\x00\x00", body)]
    too_big = body_frame(1, b"y" * 4097)
    events = dec.feed(too_big[:7])  # the frame header alone is enough to refuse it
    assert normalize(events[0]) == ("AmqpConnectionError", 501, 0, 0)
    assert dec.dead
    assert dec.feed(too_big[7:] + OK_TRIPLE) == []


def test_frame_max_applies_to_every_frame_type() -> None:
    for wire in (
        method_frame(1, 60, 40, b"\x00" * 4093),
        header_frame(1, 1, b"\x00" * 4085),
        frame(9, 1, b"\x00" * 4097),
    ):
        dec = decoder(frame_max=4096)
        assert [normalize(e) for e in dec.feed(wire[:7])] == [("AmqpConnectionError", 501, 0, 0)]


def test_frame_max_before_tune_is_frame_min_size() -> None:
    dec = AmqpDecoder()  # before Connection.Tune-Ok: 4096
    events = dec.feed(PROTOCOL_HEADER + body_frame(1, b"x" * 4097))
    assert isinstance(events[0], ProtocolHeader)
    assert normalize(events[1]) == ("AmqpConnectionError", 501, 0, 0)


def test_frame_max_raised_after_tune() -> None:
    dec = AmqpDecoder()
    assert len(dec.feed(PROTOCOL_HEADER)) == 1
    dec.frame_max = 131072
    body = b"z" * 100_000
    assert dec.feed(publish_triple(1, body)) == [
        Publish(1, "ex", "rk", False, False, b"\x00\x00", body)
    ]


def test_frame_max_zero_means_no_limit() -> None:
    body = b"z" * 300_000
    [publish] = decoder(frame_max=0).feed(publish_triple(1, body, frame_max=400_000))
    assert publish == Publish(1, "ex", "rk", False, False, b"\x00\x00", body)


def test_max_message_size_is_a_channel_error_and_the_body_is_skipped() -> None:
    dec = decoder(max_message_size=10)
    big = b"b" * 11
    data = (
        publish_frame(1, "ex", "rk")
        + header_frame(1, len(big))
        + publish_frame(2, "ex", "other")  # another channel is unaffected
        + header_frame(2, 2)
        + body_frame(1, big[:5])
        + body_frame(2, b"ok")
        + body_frame(1, big[5:])
        + publish_triple(1, b"small")
    )
    for events in (dec.feed(data), feed_bytewise(decoder(max_message_size=10), data)):
        assert len(events) == 3, events
        error = events[0]
        assert isinstance(error, AmqpChannelError)
        assert (error.reply_code, error.class_id, error.method_id, error.channel) == (
            406,
            60,
            40,
            1,
        )
        assert isinstance(error.close_method(), commands.Channel.Close)
        assert events[1] == Publish(2, "ex", "other", False, False, b"\x00\x00", b"ok")
        assert events[2] == Publish(1, "ex", "rk", False, False, b"\x00\x00", b"small")
    assert not dec.closing


def test_after_a_connection_error_only_connection_close_and_close_ok_pass() -> None:
    dec = decoder()
    close = encode_method(0, commands.Connection.Close(200, "bye", 0, 0))
    close_ok = encode_method(0, commands.Connection.CloseOk())
    events = dec.feed(
        body_frame(1, b"stray")  # 505
        + OK_TRIPLE
        + HEARTBEAT_FRAME
        + encode_method(1, commands.Channel.Close(200, "", 0, 0))
        + encode_method(0, commands.Connection.Open())
        + frame(5, 0, b"")  # even garbage frame types are skipped now
        + close
        + close_ok
    )
    assert [normalize(e) for e in events] == [
        ("AmqpConnectionError", 505, 0, 0),
        ("Method", 0, ("Connection.Close", dict(commands.Connection.Close(200, "bye", 0, 0)))),
        ("Method", 0, ("Connection.CloseOk", {})),
    ]


def test_start_closing_is_the_servers_close() -> None:
    dec = decoder()
    dec.feed(publish_frame(1) + header_frame(1, 10) + body_frame(1, b"part"))
    dec.start_closing()
    events = dec.feed(body_frame(1, b"rest..") + encode_method(0, commands.Connection.CloseOk()))
    assert len(events) == 1
    assert isinstance(events[0], Method)
    assert isinstance(events[0].method, commands.Connection.CloseOk)


def test_a_dead_decoder_yields_nothing() -> None:
    dec = decoder()
    assert len(dec.feed(frame(3, 1, b"x", end=0xCD))) == 1
    assert dec.dead
    assert dec.feed(OK_TRIPLE) == []
    assert dec.buffered == 0


# --- the protocol header ----------------------------------------------------------------------


@pytest.mark.parametrize("header", [PROTOCOL_HEADER, PROTOCOL_HEADER_0_9])
def test_protocol_header_accepted(header: bytes) -> None:
    for events in (
        AmqpDecoder().feed(header + HEARTBEAT_FRAME),
        feed_bytewise(AmqpDecoder(), header + HEARTBEAT_FRAME),
    ):
        assert events == [ProtocolHeader(header), HEARTBEAT]


@pytest.mark.parametrize(
    "received",
    [
        b"AMQP\x00\x00\x09\x00",  # another revision
        b"AMQP\x00\x01\x00\x00",  # AMQP 1.0
        b"AMQP\x03\x01\x00\x00",  # AMQP 1.0 SASL
        b"GET / HTTP/1.1\r\n",  # a browser
        b"\x16\x03\x01\x02\x00\x01\x00\x01",  # a TLS client hello
        b"\x10\x0c\x00\x04MQTT\x04",  # an MQTT CONNECT on the wrong port
    ],
)
def test_bad_protocol_header_is_answered_with_ours_then_closed(received: bytes) -> None:
    for bytewise in (False, True):
        dec = AmqpDecoder()
        data = received + HEARTBEAT_FRAME
        events = feed_bytewise(dec, data) if bytewise else dec.feed(data)
        assert events == [BadProtocolHeader(received[:8])]
        assert BadProtocolHeader(b"").reply == b"AMQP\x00\x00\x09\x01"
        assert dec.dead


def test_protocol_header_needs_all_8_octets() -> None:
    dec = AmqpDecoder()
    assert dec.feed(b"AMQP\x00\x00\x09") == []
    assert dec.buffered == 7
    assert dec.feed(b"\x01") == [ProtocolHeader(PROTOCOL_HEADER)]
    assert dec.buffered == 0


def test_frames_before_the_header_are_a_bad_header() -> None:
    events = AmqpDecoder().feed(HEARTBEAT_FRAME)
    assert events == [BadProtocolHeader(HEARTBEAT_FRAME)]


def test_large_frame_in_small_reads_is_parsed_once_complete() -> None:
    """An incomplete frame is buffered, not re-parsed on every read."""
    body = bytes(range(256)) * 400  # 102,400 octets
    data = publish_triple(1, body)
    dec = decoder()
    events: list[object] = []
    for i in range(0, len(data), 1000):
        chunk = data[i : i + 1000]
        got = dec.feed(chunk)
        events += got
        if i + 1000 < len(data):
            assert got == []
            assert dec.buffered > 0
    assert events == [Publish(1, "ex", "rk", False, False, b"\x00\x00", body)]
    assert dec.buffered == 0


def test_max_message_size_with_contiguous_frames() -> None:
    """The single-buffer fast path must refuse an oversized body too."""
    data = publish_triple(1, b"x" * 11) + publish_triple(1, b"y" * 10)
    for events in (
        decoder(max_message_size=10).feed(data),
        feed_bytewise(decoder(max_message_size=10), data),
    ):
        assert [normalize(e) for e in events] == [
            ("AmqpChannelError", 406, 60, 40),
            Publish(1, "ex", "rk", False, False, b"\x00\x00", b"y" * 10),
        ]
