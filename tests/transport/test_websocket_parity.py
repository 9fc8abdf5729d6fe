"""The WebSocket codec's fast path against its reference, wsproto alone: the same client bytes,
cut into the same reads, give the same payloads, the same replies and the same close (STYLE.md:
a fast path lives beside its plain twin, with a parity test)."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.mqtt.websocket import (
    CLOSE_PROTOCOL_ERROR,
    CLOSE_TOO_BIG,
    CLOSE_UNSUPPORTED_DATA,
    Close,
    WebSocketCodec,
    WebSocketError,
)
from tests.ws_frames import client_frame

HANDSHAKE = (
    b"GET /mqtt HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
MAX_MESSAGE = 70_000


def run(codec: WebSocketCodec, data: bytes, cuts: list[int]) -> tuple[object, ...]:
    """Feed ``data`` in the reads ``cuts`` makes; what came out, in a comparable form."""
    events: list[object] = []
    error = None
    bounds = [0, *sorted(c for c in cuts if 0 < c < len(data)), len(data)]
    try:
        for start, end in itertools.pairwise(bounds):
            events += codec.receive(data[start:end])
    except WebSocketError as caught:
        error = caught.code
    payload = b"".join(e for e in events if isinstance(e, bytes))
    closes = [e for e in events if isinstance(e, Close)]
    # Payloads compared as one stream: [MQTT-6.0.0-2], frame boundaries carry no meaning.
    return payload, closes, b"".join(codec.outgoing), codec.closed, error


def both(data: bytes, cuts: list[int]) -> tuple[tuple[object, ...], tuple[object, ...]]:
    fast = run(WebSocketCodec(MAX_MESSAGE), HANDSHAKE + data, [c + len(HANDSHAKE) for c in cuts])
    reference = run(
        WebSocketCodec(MAX_MESSAGE, fast=False),
        HANDSHAKE + data,
        [c + len(HANDSHAKE) for c in cuts],
    )
    return fast, reference


FRAMES = {
    "binary": lambda data: client_frame(0x2, data),
    "fragments": lambda data: client_frame(0x2, data[:3], fin=False) + client_frame(0x0, data[3:]),
    "ping": lambda data: client_frame(0x9, data[:125]),
    "pong": lambda data: client_frame(0xA, data[:125]),
    "empty": lambda data: client_frame(0x2, b""),
}
BAD = {
    "text": (lambda data: client_frame(0x1, b"{}"), CLOSE_UNSUPPORTED_DATA),
    "unmasked": (lambda data: client_frame(0x2, data, mask=None), CLOSE_PROTOCOL_ERROR),
    "reserved bit": (
        lambda data: bytes((0xC2,)) + client_frame(0x2, data)[1:],
        CLOSE_PROTOCOL_ERROR,
    ),
    "long ping": (lambda data: client_frame(0x9, b"p" * 126), CLOSE_PROTOCOL_ERROR),
    "too big": (lambda data: client_frame(0x2, b"b" * (MAX_MESSAGE + 1)), CLOSE_TOO_BIG),
}


frames = st.lists(
    st.tuples(st.sampled_from(sorted(FRAMES)), st.binary(min_size=0, max_size=300)),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    frames,
    st.one_of(st.none(), st.sampled_from(sorted(BAD)), st.just("close")),
    st.lists(st.integers(min_value=0, max_value=5_000), max_size=20),
)
def test_the_fast_path_agrees_with_wsproto(
    sequence: list[tuple[str, bytes]], ending: str | None, cuts: list[int]
) -> None:
    data = b"".join(FRAMES[kind](body) for kind, body in sequence)
    if ending == "close":
        data += client_frame(0x8, b"\x03\xe8bye")
    elif ending is not None:
        data += BAD[ending][0](b"tail")
    fast, reference = both(data, cuts)
    assert fast == reference
    if ending in BAD:
        assert fast[-1] == BAD[ending][1]


def test_a_large_frame_in_many_reads_agrees() -> None:
    payload = bytes(range(256)) * 260  # 66,560 bytes: a 64-bit length
    data = client_frame(0x2, payload) + client_frame(0x9, b"hi") + client_frame(0x2, b"after")
    fast, reference = both(data, list(range(0, len(data), 7)))
    assert fast == reference
    assert fast[0] == payload + b"after"
    assert isinstance(fast[2], bytes)
    assert fast[2].endswith(b"\x8a\x02hi")  # the pong, after the 101
