"""Issue 21 item 8: every protocol error on the MQTT/WebSocket listener gets the correct answer
(an HTTP status before the handshake, RFC 6455 close code after), a log line naming the peer's
address, and the broker goes on serving: against a real ``braid serve`` over raw sockets."""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Iterator

import pytest

from gateway.mqtt.codec import Connack, Connect, encode
from tests.braid_process import BraidProcess
from tests.ws_frames import client_frame

DEADLINE_S = 20.0  # a reply or log line that does not come within this fails the test
MAX_PACKET_SIZE = 1000  # small, so that a frame over the message bound is small too
CONNECT_TIMEOUT_S = 0.5  # a handshake that does not come within this is closed
MASK = b"\x0f\xf0\x55\xaa"
KEY = "dGhlIHNhbXBsZSBub25jZQ=="
# One final binary frame holding a 3.1.1 CONNACK, session not present, accepted.
CONNACK_FRAME = b"\x82\x04" + encode(Connack(False, 0), 4)
HANDSHAKE = (
    "GET {path} HTTP/1.1\r\nHost: x\r\n{upgrade}Connection: Upgrade\r\n"
    "Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("ws-errors")
    config = path / "braid.toml"
    config.write_text(
        f"[mqtt]\nmax_packet_size = {MAX_PACKET_SIZE}\nconnect_timeout_s = {CONNECT_TIMEOUT_S}\n"
    )
    with BraidProcess(
        path, listeners=("mqtt-ws",), extra_args=("--config", str(config))
    ) as process:
        yield process


def handshake(path: str = "/mqtt", upgrade: bool = True, key: str = KEY) -> bytes:
    text = HANDSHAKE.format(path=path, upgrade="Upgrade: websocket\r\n" if upgrade else "", key=key)
    return text.encode()


def connect(braid: BraidProcess) -> socket.socket:
    sock = socket.create_connection((braid.host, braid.mqtt_ws_port), timeout=DEADLINE_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the broker sends until it closes the connection."""
    received = b""
    sock.settimeout(DEADLINE_S)
    while chunk := sock.recv(65536):
        received += chunk
    return received


def upgraded(braid: BraidProcess) -> tuple[socket.socket, bytes]:
    """A connection past the handshake, and what came after the 101 response."""
    sock = connect(braid)
    sock.sendall(handshake())
    received = b""
    while b"\r\n\r\n" not in received:
        chunk = sock.recv(65536)
        assert chunk, "closed during the handshake"
        received += chunk
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 "), head
    return sock, rest


def close_code(data: bytes) -> int:
    """The code of the server's close frame (unmasked, RFC 6455 §5.5.1) at the end of ``data``."""
    at = data.rfind(b"\x88")
    assert at >= 0, f"no close frame in {data!r}"
    size = data[at + 1] & 0x7F
    assert size >= 2, data[at:]
    return int(struct.unpack(">H", data[at + 2 : at + 4])[0])


def logged(braid: BraidProcess, peer: tuple[str, int], pattern: str) -> str:
    """The log line about ``peer`` that matches ``pattern`` (waited for: the broker writes it
    as it closes, possibly after the client saw the close)."""
    address = f"{peer[0]}:{peer[1]}"
    deadline = time.monotonic() + DEADLINE_S
    while True:
        for line in braid.stderr().splitlines():
            if f"mqtt-ws from {address}:" in line and re.search(pattern, line):
                return line
        assert time.monotonic() < deadline, f"no log line for {address} /{pattern}/"
        time.sleep(0.02)


def assert_served(braid: BraidProcess) -> None:
    """Another client gets through: an MQTT CONNECT over WebSocket is answered by a CONNACK."""
    sock, data = upgraded(braid)
    with sock:
        sock.sendall(client_frame(0x2, encode(Connect(client_id="after", protocol_level=4), 4)))
        while len(data) < len(CONNACK_FRAME):
            chunk = sock.recv(65536)
            assert chunk, f"closed before the CONNACK: {data!r}"
            data += chunk
    assert data[: len(CONNACK_FRAME)] == CONNACK_FRAME


HTTP_ERRORS = {
    "wrong path": (handshake(path="/other"), "404", r"path '/other'"),
    "no upgrade": (handshake(upgrade=False), "426", r"no Upgrade: websocket"),
    "no key": (handshake(key=""), "400", r"Sec-WebSocket-Key"),
    "not GET": (b"POST /mqtt HTTP/1.1\r\nHost: x\r\n\r\n", "400", r"not a GET"),
    "too long": (b"GET /mqtt HTTP/1.1\r\n" + b"X: y\r\n" * 4000, "431", r"over \d+ bytes"),
}


@pytest.mark.parametrize(("request_bytes", "status", "why"), HTTP_ERRORS.values(), ids=HTTP_ERRORS)
def test_bad_handshake_gets_http_status_and_log_line(
    braid: BraidProcess, request_bytes: bytes, status: str, why: str
) -> None:
    with connect(braid) as sock:
        peer = sock.getsockname()
        sock.sendall(request_bytes)
        reply = read_until_closed(sock)
    assert reply.startswith(f"HTTP/1.1 {status} ".encode()), reply[:80]
    line = logged(braid, peer, why)
    assert f"answered HTTP {status}" in line
    assert_served(braid)


FRAME_ERRORS = {
    "text frame": (client_frame(0x1, b"{}"), 1003, r"binary frames"),
    "unmasked frame": (client_frame(0x2, b"\x10\x00", mask=None), 1002, r""),
    "reserved bits": (bytes((0xC2, 0x80)) + MASK, 1002, r""),
    "bad close code": (client_frame(0x8, struct.pack(">H", 999)), 1002, r""),
    "long ping": (client_frame(0x9, b"x" * 126), 1002, r""),
    "fragmented ping": (client_frame(0x9, b"x", fin=False), 1002, r""),
    "unknown opcode": (client_frame(0x3, b"x"), 1002, r""),
    "oversized frame": (client_frame(0x2, b"x" * (MAX_PACKET_SIZE * 4 + 1)), 1009, r"too large"),
}


@pytest.mark.parametrize(("frame", "code", "why"), FRAME_ERRORS.values(), ids=FRAME_ERRORS)
def test_bad_frame_gets_close_code_and_log_line(
    braid: BraidProcess, frame: bytes, code: int, why: str
) -> None:
    sock, _ = upgraded(braid)
    with sock:
        peer = sock.getsockname()
        sock.sendall(frame)
        reply = read_until_closed(sock)
    assert close_code(reply) == code
    line = logged(braid, peer, why)
    assert f"answered close {code}" in line
    assert_served(braid)


def test_no_handshake_is_closed_and_logged(braid: BraidProcess) -> None:
    with connect(braid) as sock:
        peer = sock.getsockname()
        sock.sendall(b"GET /mqtt HTTP/1.1\r\n")  # and nothing more
        try:
            reply = read_until_closed(sock)
        except ConnectionResetError:  # aborted: the kernel may answer RST
            reply = b""
    assert reply == b""
    logged(braid, peer, r"no handshake within")
    assert_served(braid)
