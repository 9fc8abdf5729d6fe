"""MQTT over WebSocket (MQTT 5.0 §6, 3.1.1 §6): the WebSocket layer and the ``asyncio.Protocol``
that puts an ``MqttProtocol`` behind it. Frames are parsed by wsproto (the sans-IO WebSocket
library, RFC 6455), with a measured fast path beside it for the frames MQTT clients send; the
opening handshake is ours, for MQTT's rules and status codes.

``WebSocketCodec`` is the sans-IO part: ``receive(data)`` returns events -- the handshake
request (``Handshake``), binary payload bytes (``bytes``), a close (``Close``) -- and writes what
goes back (the 101 response, pongs, close frames) into ``outgoing``; ``send_binary(data)``
frames our bytes.

- Handshake: ``GET /mqtt`` (``WS_PATH``) with ``Upgrade: websocket``, ``Connection: Upgrade``,
  ``Sec-WebSocket-Version: 13`` and a key; the subprotocol ``mqtt`` is chosen when offered
  [MQTT-6.0.0-3] (``mqttv3.1`` too, for old clients); none offered is accepted as EMQX does
  with ``fail_if_no_subprotocol = false``. Anything else gets 400/404/426 and is closed.
- Frames: client frames must be masked, RSV bits clear (no extension is offered), control
  frames final and at most 125 bytes; a violation closes with 1002 (wsproto's checks). MQTT
  travels in binary frames only [MQTT-6.0.0-1]: a text frame closes with 1003. A frame's
  payload is part of the MQTT byte stream whatever its boundaries [MQTT-6.0.0-2]: each frame's
  is handed on once the frame is complete (continuations included), its pieces joined once. A
  message larger than ``max_message`` closes with 1009. Ping gets pong; close gets close.
- Ours: one unmasked binary frame per write (the MQTT side writes once per loop iteration).
- Every violation -- a refused handshake, a handshake that never came, a bad frame -- is logged
  with the peer's address and the answer it got (issue 21 item 8: they used to go unlogged),
  and only that connection closes.

Why wsproto and a fast path (issue 16), measured with ``python -m bench mqtt_ws`` on 100 B QoS 0
publishes over WebSocket (2026-11-26, two alternating pairs): wsproto alone cost the broker
23.1-25.6 µs of CPU per message against 16.3-16.5 µs with the hand-written framing (its
generator and event objects per frame; the broker's whole cost over plain MQTT went from 1.5x to
2.1x). So the frames MQTT clients send -- final, masked binary frames -- are parsed inline
(``WebSocketCodec._fast_frames``), and the first frame of any other kind (a ping, a fragment, a
close, anything malformed) hands the connection to wsproto, which the parity test holds the
fast path to (``tests/transport/test_websocket_parity.py``). With it, two more alternating
pairs: the broker's cost over plain MQTT 1.50-1.51x, the hand-written codec's 1.47-1.48x
(18.4 against 16.6-17.9 µs per message on a busier machine). Neither re-joins its buffer on
every read, as the hand-written codec did (issue 21: a 4 MiB frame in 1 KiB reads cost 2.2 s
of CPU; ``tests/transport/test_websocket_cpu.py``).

Not thread-safe: one codec per connection.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import logging
import struct
from typing import Any, Final, NamedTuple, Protocol

from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, TextMessage

from core.api import Clock, Timer

log = logging.getLogger(__name__)


class MqttStream(Protocol):
    """What the WebSocket layer needs of the MQTT connection behind it (server.py's
    ``MqttProtocol``; named here so that this module does not import server.py, which imports
    this one)."""

    closed: bool
    clock: Clock
    metrics: dict[str, int]
    max_packet_size: int
    connect_timeout_s: float

    def connection_made(self, transport: asyncio.BaseTransport) -> None: ...

    def data_received(self, data: bytes) -> None: ...

    def connection_lost(self, exc: Exception | None) -> None: ...

    def pause_writing(self) -> None: ...

    def resume_writing(self) -> None: ...

    def flush(self) -> None: ...


WS_PATH: Final = "/mqtt"
SUBPROTOCOLS: Final = ("mqtt", "mqttv3.1")
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3
# The handshake request, headers included, at most (nginx's default large_client_header_buffers
# is 4 x 8 KiB).
MAX_HANDSHAKE_BYTES: Final = 16 << 10
# A message's payload at most: a few MQTT packets of the largest size we accept.
MAX_MESSAGE_FACTOR: Final = 4

# RFC 6455 §5.2 opcodes (what a client's frames say; wsproto decodes them).
OP_CONTINUATION: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA

# First and second byte of a frame (RFC 6455 §5.2).
FIN: Final = 0x80
MASKED: Final = 0x80
LENGTH_MASK: Final = 0x7F
LENGTH_16: Final = 126  # a 16-bit length follows
LENGTH_64: Final = 127  # a 64-bit length follows
FIN_BINARY: Final = FIN | OP_BINARY  # the only first byte the fast path takes
MASK_SIZE: Final = 4
_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")

# RFC 6455 §7.4.1 close codes.
CLOSE_NORMAL: Final = 1000
CLOSE_PROTOCOL_ERROR: Final = 1002
CLOSE_UNSUPPORTED_DATA: Final = 1003
CLOSE_TOO_BIG: Final = 1009
# A close frame's reason at most (its payload is at most 125 bytes, RFC 6455 §5.5).
MAX_CLOSE_REASON: Final = 120


class Handshake(NamedTuple):
    path: str
    subprotocol: str | None


class Close(NamedTuple):
    code: int
    reason: str


class WebSocketError(Exception):
    """The peer broke the protocol: ``code`` is the close code sent (0 before the handshake,
    when ``status`` is the HTTP status sent instead), ``reason`` says what was wrong."""

    def __init__(self, code: int, reason: str, status: str = "") -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.status = status

    @property
    def answer(self) -> str:
        return f"HTTP {self.status}" if self.status else f"close {self.code}"


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + _GUID).digest()).decode()


def unmask(payload: bytes, mask: bytes) -> bytes:
    """XOR with the 4-byte mask, as one big-integer operation (linear, no Python loop)."""
    size = len(payload)
    if not size:
        return b""
    key = (mask * (size // 4 + 1))[:size]
    return (int.from_bytes(payload, "little") ^ int.from_bytes(key, "little")).to_bytes(
        size, "little"
    )


def frame(opcode: int, payload: bytes) -> bytes:
    """One final, unmasked frame (a server's frames are not masked, RFC 6455 §5.1): the bytes
    wsproto's ``send`` makes for a server, without its event objects."""
    size = len(payload)
    first = FIN | opcode
    if size < LENGTH_16:
        return bytes((first, size)) + payload
    if size < 0x10000:
        return bytes((first, LENGTH_16)) + _U16.pack(size) + payload
    return bytes((first, LENGTH_64)) + _U64.pack(size) + payload


def _http_response(status: str, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status}"] + [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


class WebSocketCodec:
    """``WebSocketCodec(max_message, fast=True)``: with ``fast``, complete final binary frames
    are parsed here (``_fast_frames``) and the first frame of any other kind hands the rest of
    the connection to wsproto (``_wsproto_frames``); ``fast=False`` is wsproto alone, the
    reference the parity test (``tests/transport/test_websocket_parity.py``) holds the fast
    path to."""

    def __init__(self, max_message: int, *, fast: bool = True) -> None:
        self.max_message = max_message
        self.open = False
        self.closed = False
        self.outgoing: list[bytes] = []
        self._request = b""  # the handshake request so far (at most MAX_HANDSHAKE_BYTES)
        self._fast = fast
        # Fast path: an incomplete frame header, or the pieces of an incomplete frame of
        # ``_need`` bytes (joined once, when complete: re-joining on every read was issue 21's
        # quadratic cost).
        self._tail = b""
        self._chunks: list[bytes] = []
        self._chunks_size = 0
        self._need = 0
        # wsproto, once a frame the fast path does not take came (or from the start).
        self._ws: Connection | None = None
        self._pieces: list[bytes] = []  # the payload of the frame wsproto is receiving
        self._message_size = 0

    def receive(self, data: bytes) -> list[Handshake | bytes | Close]:
        """Events for received bytes. Raises WebSocketError (after queuing the HTTP error or
        close frame to send) when the peer breaks the protocol."""
        events: list[Handshake | bytes | Close] = []
        if not self.open:
            request = self._request + data
            end = request.find(b"\r\n\r\n")
            if end < 0:
                if len(request) > MAX_HANDSHAKE_BYTES:
                    self._http_error(
                        "431 Request Header Fields Too Large",
                        f"handshake over {MAX_HANDSHAKE_BYTES} bytes",
                    )
                self._request = request
                return events
            self._request = b""
            events.append(self._handshake(request[:end].decode("latin-1")))
            if not self._fast:
                self._ws = Connection(ConnectionType.SERVER)
            data = request[end + 4 :]
        if self.closed or not data:
            return events
        if self._ws is None:
            self._fast_frames(data, events)
        else:
            self._wsproto_frames(data, events)
        return events

    def _fast_frames(self, data: bytes, events: list[Handshake | bytes | Close]) -> None:
        """Final, masked binary frames, parsed inline (what MQTT clients send: one frame per
        packet or write). Measured with ``python -m bench mqtt_ws`` (100 B QoS 0 publishes
        over WebSocket): broker CPU 16.3-16.5 µs per message with this path, 23.1-25.6 µs
        with wsproto alone (its generator and event objects per frame)."""
        if self._chunks:
            self._chunks.append(data)
            self._chunks_size += len(data)
            if self._chunks_size < self._need:
                return
            data = b"".join(self._chunks)
            self._chunks = []
            self._chunks_size = 0
        elif self._tail:
            data = self._tail + data  # (a header's first bytes: at most 13)
            self._tail = b""
        size = len(data)
        pos = 0
        while pos < size:
            if size - pos < 2:
                self._tail = data[pos:]
                return
            second = data[pos + 1]
            if data[pos] != FIN_BINARY or not second & MASKED:
                # A control frame, a fragment, a text frame, reserved bits, an unmasked
                # frame: wsproto takes this frame and the rest of the connection.
                self._ws = Connection(ConnectionType.SERVER)
                self._wsproto_frames(data[pos:], events)
                return
            length = second & LENGTH_MASK
            at = pos + 2
            if length == LENGTH_16:
                if size - at < 2:
                    self._tail = data[pos:]
                    return
                (length,) = _U16.unpack_from(data, at)
                at += 2
            elif length == LENGTH_64:
                if size - at < 8:
                    self._tail = data[pos:]
                    return
                (length,) = _U64.unpack_from(data, at)
                at += 8
            if length > self.max_message:
                # wsproto refuses it as the reference does: after the events before it.
                self._ws = Connection(ConnectionType.SERVER)
                self._wsproto_frames(data[pos:], events)
                return
            end = at + MASK_SIZE + length
            if end > size:
                if size - at < MASK_SIZE:
                    self._tail = data[pos:]
                else:
                    self._chunks = [data[pos:]]
                    self._chunks_size = size - pos
                    self._need = end - pos
                return
            if length:
                events.append(unmask(data[at + MASK_SIZE : end], data[at : at + MASK_SIZE]))
            pos = end

    def _wsproto_frames(self, data: bytes, events: list[Handshake | bytes | Close]) -> None:
        """Every frame through wsproto: the reference, and whatever the fast path leaves."""
        ws = self._ws
        assert ws is not None
        ws.receive_data(data)
        pieces = self._pieces
        for event in ws.events():
            kind = type(event)
            if kind is BytesMessage:
                assert isinstance(event, BytesMessage)
                piece = event.data
                self._message_size += len(piece)
                if self._message_size > self.max_message:
                    self._fail(CLOSE_TOO_BIG, "message too large")
                if event.message_finished:
                    self._message_size = 0
                if not event.frame_finished:
                    pieces.append(bytes(piece))
                    continue
                if pieces:  # the frame came in several reads: joined once, here
                    pieces.append(bytes(piece))
                    payload = b"".join(pieces)
                    pieces.clear()
                else:
                    payload = bytes(piece)
                if payload:
                    events.append(payload)
            elif kind is Ping:
                assert isinstance(event, Ping)
                self.outgoing.append(frame(OP_PONG, bytes(event.payload)))
            elif kind is CloseConnection:
                assert isinstance(event, CloseConnection)
                if ws.state is not ConnectionState.REMOTE_CLOSING:
                    # wsproto could not parse the frames: its close names the violation.
                    self._fail(event.code, event.reason or "protocol error")
                self.outgoing.append(self.close_frame(CLOSE_NORMAL))
                self.closed = True
                events.append(Close(event.code, event.reason or ""))
                return
            elif kind is TextMessage:
                self._fail(CLOSE_UNSUPPORTED_DATA, "MQTT needs binary frames [MQTT-6.0.0-1]")
            # (a Pong answers nothing)

    def _handshake(self, request: str) -> Handshake:
        lines = request.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[0] != "GET" or not parts[2].startswith("HTTP/1."):
            self._http_error("400 Bad Request", f"not a GET request line: {lines[0][:80]!r}")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                key = name.strip().lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
        path = parts[1].split("?", 1)[0]
        if path != WS_PATH:
            self._http_error("404 Not Found", f"path {path[:80]!r} is not {WS_PATH}")
        connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
        key = headers.get("sec-websocket-key", "")
        if headers.get("upgrade", "").lower() != "websocket" or "upgrade" not in connection:
            self._http_error(
                "426 Upgrade Required", "no Upgrade: websocket", [("Upgrade", "websocket")]
            )
        if headers.get("sec-websocket-version") != "13" or not key:
            self._http_error(
                "400 Bad Request",
                "no Sec-WebSocket-Key or version not 13",
                [("Sec-WebSocket-Version", "13")],
            )
        offered = [p.strip() for p in headers.get("sec-websocket-protocol", "").split(",")]
        chosen = next((p for p in offered if p in SUBPROTOCOLS), None)
        response = [
            ("Upgrade", "websocket"),
            ("Connection", "Upgrade"),
            ("Sec-WebSocket-Accept", accept_key(key)),
        ]
        if chosen is not None:
            response.append(("Sec-WebSocket-Protocol", chosen))
        self.outgoing.append(_http_response("101 Switching Protocols", response))
        self.open = True
        return Handshake(path, chosen)

    def _http_error(
        self, status: str, why: str, headers: list[tuple[str, str]] | None = None
    ) -> None:
        self.outgoing.append(_http_response(status, [*(headers or []), ("Content-Length", "0")]))
        self.closed = True
        raise WebSocketError(0, f"bad handshake: {why}", status)

    def _fail(self, code: int, reason: str) -> None:
        self.outgoing.append(self.close_frame(code, reason))
        self.closed = True
        raise WebSocketError(code, reason)

    def send_binary(self, data: bytes) -> bytes:
        """One unmasked binary frame of ``data``."""
        return frame(OP_BINARY, data)

    def close_frame(self, code: int, reason: str = "") -> bytes:
        """Our close frame with ``code`` (RFC 6455 §5.5.1: the code, then a UTF-8 reason)."""
        return frame(OP_CLOSE, _U16.pack(code) + reason.encode()[:MAX_CLOSE_REASON])


class _WebSocketTransport:
    """What the MQTT protocol sees as its transport: writes become binary frames."""

    def __init__(self, outer: WebSocketProtocol, transport: asyncio.Transport) -> None:
        self._outer = outer
        self._transport = transport

    def write(self, data: bytes) -> None:
        if not self._outer.codec.closed:
            self._transport.write(frame(OP_BINARY, data))

    def close(self) -> None:
        self._outer.close(CLOSE_NORMAL)

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing() or self._outer.codec.closed

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()


class WebSocketProtocol(asyncio.Protocol):
    """The WebSocket handshake and framing in front of one ``MqttProtocol``."""

    def __init__(self, inner: MqttStream) -> None:
        self.inner = inner
        self.codec = WebSocketCodec(inner.max_packet_size * MAX_MESSAGE_FACTOR)
        self.transport: asyncio.Transport | None = None
        self.started = False
        self.timer: Timer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.timer = self.inner.clock.call_later(
            self.inner.connect_timeout_s * 1000, self._handshake_timeout
        )

    def _peer(self) -> str:
        peer = self.transport.get_extra_info("peername") if self.transport is not None else None
        if isinstance(peer, tuple) and len(peer) >= 2:
            return f"{peer[0]}:{peer[1]}"
        return "?"

    def _handshake_timeout(self) -> None:
        self.timer = None
        if not self.started and self.transport is not None:
            log.info(
                "mqtt-ws from %s: no handshake within %.3g s: closed",
                self._peer(),
                self.inner.connect_timeout_s,
            )
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        codec = self.codec
        try:
            events = codec.receive(data)
        except WebSocketError as error:
            log.info("mqtt-ws from %s: %s: answered %s", self._peer(), error.reason, error.answer)
            self._send_outgoing()
            self.transport.close()
            if self.started:
                self.inner.metrics["protocol_errors"] += 1
            return
        self._send_outgoing()
        for event in events:
            if isinstance(event, bytes):
                if self.started and not self.inner.closed:
                    self.inner.data_received(event)
            elif isinstance(event, Handshake):
                self.started = True
                if self.timer is not None:
                    self.timer.cancel()
                    self.timer = None
                # (duck-typed: the transport calls the MQTT side makes, as frames)
                self.inner.connection_made(_WebSocketTransport(self, self.transport))  # type: ignore[arg-type]
            else:
                self.transport.close()

    def _send_outgoing(self) -> None:
        codec = self.codec
        if codec.outgoing and self.transport is not None:
            self.transport.write(b"".join(codec.outgoing))
            codec.outgoing.clear()

    def close(self, code: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.inner.flush()
        if not self.codec.closed:
            self.codec.closed = True
            self.transport.write(self.codec.close_frame(code))
        self.transport.close()

    def pause_writing(self) -> None:
        if self.started:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.started:
            self.inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.started:
            self.inner.connection_lost(exc)
