"""Helpers for the AMQP codec tests: frames built by hand, feeding strategies, event normalising."""

from __future__ import annotations

import struct
from collections.abc import Iterable

from pamqp import base
from pamqp import frame as pamqp_frame

from gateway.amqp.codec import AmqpDecoder
from gateway.amqp.errors import AmqpError
from gateway.amqp.events import Method


def frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes((end,))


def shortstr(value: str | bytes) -> bytes:
    raw = value.encode() if isinstance(value, str) else value
    return bytes((len(raw),)) + raw


def method_frame(channel: int, class_id: int, method_id: int, args: bytes = b"") -> bytes:
    return frame(1, channel, struct.pack(">HH", class_id, method_id) + args)


def publish_frame(
    channel: int,
    exchange: str | bytes = "",
    routing_key: str | bytes = "",
    mandatory: bool = False,
    immediate: bool = False,
) -> bytes:
    bits = mandatory | (immediate << 1)
    args = b"\x00\x00" + shortstr(exchange) + shortstr(routing_key) + bytes((bits,))
    return method_frame(channel, 60, 40, args)


def header_frame(
    channel: int,
    body_size: int,
    properties_raw: bytes = b"\x00\x00",
    class_id: int = 60,
    weight: int = 0,
) -> bytes:
    return frame(2, channel, struct.pack(">HHQ", class_id, weight, body_size) + properties_raw)


def body_frame(channel: int, data: bytes) -> bytes:
    return frame(3, channel, data)


def tag_bits_frame(channel: int, method_id: int, tag: int, bits: int) -> bytes:
    return method_frame(channel, 60, method_id, struct.pack(">QB", tag, bits))


def publish_triple(
    channel: int,
    body: bytes,
    exchange: str = "ex",
    routing_key: str = "rk",
    properties_raw: bytes = b"\x00\x00",
    frame_max: int = 131072,
) -> bytes:
    out = publish_frame(channel, exchange, routing_key) + header_frame(
        channel, len(body), properties_raw
    )
    step = frame_max - 8
    for i in range(0, len(body), step):
        out += body_frame(channel, body[i : i + step])
    return out


def marshal(channel: int, *frames: object) -> bytes:
    return b"".join(pamqp_frame.marshal(f, channel) for f in frames)  # type: ignore[arg-type]


def unmarshal_all(data: bytes) -> list[tuple[int, object]]:
    """Every frame in ``data`` as pamqp decodes it: (channel, frame object)."""
    out: list[tuple[int, object]] = []
    pos = 0
    while pos < len(data):
        used, channel, value = pamqp_frame.unmarshal(data[pos:])
        out.append((channel, value))
        pos += used
    return out


def normalize(event: object) -> object:
    """Events in a comparable form: pamqp methods have no __eq__, errors compare by code/ids."""
    if isinstance(event, Method):
        return ("Method", event.channel, normalize(event.method))
    if isinstance(event, base.Frame):
        return (event.name, dict(event))
    if isinstance(event, AmqpError):
        return (type(event).__name__, event.reply_code, event.class_id, event.method_id)
    return event


def normalized(events: Iterable[object]) -> list[object]:
    return [normalize(e) for e in events]


def decoder(**kwargs: object) -> AmqpDecoder:
    kwargs.setdefault("expect_protocol_header", False)
    kwargs.setdefault("frame_max", 131072)
    return AmqpDecoder(**kwargs)  # type: ignore[arg-type]


def feed_whole(dec: AmqpDecoder, data: bytes) -> list[object]:
    return list(dec.feed(data))


def feed_bytewise(dec: AmqpDecoder, data: bytes) -> list[object]:
    out: list[object] = []
    for i in range(len(data)):
        out += dec.feed(data[i : i + 1])
    return out


def feed_chunks(dec: AmqpDecoder, data: bytes, cuts: Iterable[int]) -> list[object]:
    out: list[object] = []
    last = 0
    for cut in sorted(set(cuts)):
        if 0 < cut < len(data):
            out += dec.feed(data[last:cut])
            last = cut
    out += dec.feed(data[last:])
    return out
