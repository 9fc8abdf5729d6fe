"""MQTT over WebSocket (MQTT 5.0 §6, 3.1.1 §6): a small sans-IO WebSocket server (RFC 6455)
and the ``asyncio.Protocol`` that puts an ``MqttProtocol`` behind it.

``WebSocketCodec`` is the sans-IO part: ``receive(data)`` returns events -- the handshake
request (``Handshake``), binary payload bytes (``bytes``), a close (``Close``) -- and writes what
goes back (the 101 response, pongs, close frames, our binary frames) into ``outgoing``.

- Handshake: ``GET /mqtt`` (``WS_PATH``) with ``Upgrade: websocket``, ``Connection: Upgrade``,
  ``Sec-WebSocket-Version: 13`` and a key; the subprotocol ``mqtt`` is chosen when offered
  [MQTT-6.0.0-3] (``mqttv3.1`` too, for old clients); none offered is accepted as EMQX does
  with ``fail_if_no_subprotocol = false``. Anything else gets 400/404/426 and is closed.
- Frames: client frames must be masked (RFC 6455 §5.1), RSV bits clear, control frames final
  and at most 125 bytes. MQTT travels in binary frames only [MQTT-6.0.0-1]: a text frame
  closes with 1003. A frame's payload is part of the MQTT byte stream whatever its boundaries
  [MQTT-6.0.0-2], so each is handed on at once (continuations included). Ping gets pong; close
  gets close.
- Ours: one unmasked binary frame per write (the MQTT side writes once per loop iteration).

Not thread-safe: one codec per connection.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import struct
from typing import Any, Final, NamedTuple

from gateway.mqtt.server import MqttProtocol

WS_PATH: Final = "/mqtt"
SUBPROTOCOLS: Final = ("mqtt", "mqttv3.1")
_GUID: Final = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"  # RFC 6455 §1.3
# The handshake request, headers included, at most (nginx's default large_client_header_buffers
# is 4 x 8 KiB).
MAX_HANDSHAKE_BYTES: Final = 16 << 10
# A frame's payload at most: a few MQTT packets of the largest size we accept.
MAX_FRAME_FACTOR: Final = 4
MAX_CONTROL_PAYLOAD: Final = 125  # RFC 6455 §5.5

OP_CONTINUATION: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA
FIN: Final = 0x80
RSV_MASK: Final = 0x70
OPCODE_MASK: Final = 0x0F
MASKED: Final = 0x80
LENGTH_MASK: Final = 0x7F
LENGTH_16: Final = 126
LENGTH_64: Final = 127

CLOSE_NORMAL: Final = 1000
CLOSE_PROTOCOL_ERROR: Final = 1002
CLOSE_UNSUPPORTED_DATA: Final = 1003
CLOSE_TOO_BIG: Final = 1009

_U16: Final = struct.Struct(">H")
_U64: Final = struct.Struct(">Q")


class Handshake(NamedTuple):
    path: str
    subprotocol: str | None


class Close(NamedTuple):
    code: int
    reason: str


class WebSocketError(Exception):
    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


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
    """One final, unmasked frame (a server's frames are not masked, RFC 6455 §5.1)."""
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
    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self.open = False
        self.closed = False
        self.outgoing: list[bytes] = []
        self._buffer = b""

    def receive(self, data: bytes) -> list[Handshake | bytes | Close]:
        """Events for received bytes. Raises WebSocketError (after queuing the HTTP error or
        close frame to send) when the peer breaks the protocol."""
        buffer = self._buffer + data if self._buffer else data
        events: list[Handshake | bytes | Close] = []
        if not self.open:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(buffer) > MAX_HANDSHAKE_BYTES:
                    self._http_error("431 Request Header Fields Too Large")
                self._buffer = buffer
                return events
            events.append(self._handshake(buffer[:end].decode("latin-1")))
            buffer = buffer[end + 4 :]
        pos = 0
        size = len(buffer)
        while not self.closed and size - pos >= 2:
            first = buffer[pos]
            second = buffer[pos + 1]
            if first & RSV_MASK:
                self._fail(CLOSE_PROTOCOL_ERROR, "reserved bits set")
            if not second & MASKED:
                self._fail(CLOSE_PROTOCOL_ERROR, "client frames must be masked")
            length = second & LENGTH_MASK
            at = pos + 2
            if length == LENGTH_16:
                if size - at < 2:
                    break
                (length,) = _U16.unpack_from(buffer, at)
                at += 2
            elif length == LENGTH_64:
                if size - at < 8:
                    break
                (length,) = _U64.unpack_from(buffer, at)
                at += 8
            opcode = first & OPCODE_MASK
            if opcode >= OP_CLOSE and (length > MAX_CONTROL_PAYLOAD or not first & FIN):
                self._fail(CLOSE_PROTOCOL_ERROR, "bad control frame")
            if length > self.max_frame:
                self._fail(CLOSE_TOO_BIG, "frame too large")
            if size - at < 4 + length:
                break
            mask = buffer[at : at + 4]
            payload = unmask(buffer[at + 4 : at + 4 + length], mask)
            pos = at + 4 + length
            if opcode in (OP_BINARY, OP_CONTINUATION):
                if payload:
                    events.append(payload)
            elif opcode == OP_TEXT:
                self._fail(CLOSE_UNSUPPORTED_DATA, "MQTT needs binary frames [MQTT-6.0.0-1]")
            elif opcode == OP_PING:
                self.outgoing.append(frame(OP_PONG, payload))
            elif opcode == OP_CLOSE:
                code = _U16.unpack_from(payload)[0] if len(payload) >= 2 else CLOSE_NORMAL
                reason = payload[2:].decode("utf-8", "replace")
                self.outgoing.append(frame(OP_CLOSE, _U16.pack(CLOSE_NORMAL)))
                self.closed = True
                events.append(Close(code, reason))
            elif opcode != OP_PONG:
                self._fail(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode}")
        self._buffer = buffer[pos:]
        return events

    def _handshake(self, request: str) -> Handshake:
        lines = request.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or parts[0] != "GET" or not parts[2].startswith("HTTP/1."):
            self._http_error("400 Bad Request")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if colon:
                key = name.strip().lower()
                value = value.strip()
                headers[key] = f"{headers[key]}, {value}" if key in headers else value
        path = parts[1].split("?", 1)[0]
        if path != WS_PATH:
            self._http_error("404 Not Found")
        connection = {token.strip().lower() for token in headers.get("connection", "").split(",")}
        key = headers.get("sec-websocket-key", "")
        if headers.get("upgrade", "").lower() != "websocket" or "upgrade" not in connection:
            self._http_error("426 Upgrade Required", [("Upgrade", "websocket")])
        if headers.get("sec-websocket-version") != "13" or not key:
            self._http_error("400 Bad Request", [("Sec-WebSocket-Version", "13")])
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

    def _http_error(self, status: str, headers: list[tuple[str, str]] | None = None) -> None:
        self.outgoing.append(_http_response(status, [*(headers or []), ("Content-Length", "0")]))
        self.closed = True
        raise WebSocketError(0, status)

    def _fail(self, code: int, reason: str) -> None:
        self.outgoing.append(frame(OP_CLOSE, _U16.pack(code) + reason.encode()[:120]))
        self.closed = True
        raise WebSocketError(code, reason)

    def send_binary(self, data: bytes) -> bytes:
        return frame(OP_BINARY, data)


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

    def __init__(self, inner: MqttProtocol) -> None:
        self.inner = inner
        self.codec = WebSocketCodec(inner.server.hub.options.max_packet_size * MAX_FRAME_FACTOR)
        self.transport: asyncio.Transport | None = None
        self.started = False
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        loop = self.inner.loop
        self.timer = loop.call_later(
            self.inner.server.hub.options.connect_timeout_s, self._handshake_timeout
        )

    def _handshake_timeout(self) -> None:
        self.timer = None
        if not self.started and self.transport is not None:
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        codec = self.codec
        try:
            events = codec.receive(data)
        except WebSocketError:
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
        self.inner._flush()
        if not self.codec.closed:
            self.codec.closed = True
            self.transport.write(frame(OP_CLOSE, _U16.pack(code)))
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
