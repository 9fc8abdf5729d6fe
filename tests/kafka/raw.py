"""A minimal blocking Kafka client over one socket, built on kio: send exactly the request
bytes a test wants (the same produce request twice, a garbage frame) and read the responses."""

from __future__ import annotations

import asyncio
import contextlib
import io
import socket
import struct
from typing import Any

from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from gateway.kafka.codec import response_header_flexible


def encode_request(body: Any, correlation_id: int, client_id: str | None = "raw") -> bytes:
    """A request frame as a client writes it (header v1, or v2 for flexible versions)."""
    out = io.BytesIO()
    out.write(b"\x00\x00\x00\x00")
    out.write(struct.pack(">hhi", body.__api_key__, body.__version__, correlation_id))
    if client_id is None:
        out.write(struct.pack(">h", -1))
    else:
        raw = client_id.encode()
        out.write(struct.pack(">h", len(raw)) + raw)
    if body.__header_schema__.__flexible__:
        out.write(b"\x00")  # no header tagged fields
    entity_writer(type(body))(out, body)
    with out.getbuffer() as frame:
        struct.pack_into(">i", frame, 0, len(frame) - 4)
    return out.getvalue()


class RawClient:
    def __init__(self, host: str, port: int, timeout: float = 10.0) -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.correlation_id = 0

    def send_bytes(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, body: Any) -> int:
        self.correlation_id += 1
        self.sock.sendall(encode_request(body, self.correlation_id))
        return self.correlation_id

    def _read_exactly(self, size: int) -> bytes:
        chunks = []
        while size:
            chunk = self.sock.recv(size)
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def receive(self, api_key: int, api_version: int) -> tuple[int, Any]:
        (size,) = struct.unpack(">i", self._read_exactly(4))
        return decode_response(self._read_exactly(size), api_key, api_version)

    def request(self, body: Any) -> Any:
        sent = self.send(body)
        correlation_id, response = self.receive(body.__api_key__, body.__version__)
        assert correlation_id == sent
        return response

    def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True once the broker has closed the connection (EOF or reset)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()


def decode_response(frame: bytes, api_key: int, api_version: int) -> tuple[int, Any]:
    """(correlation id, body) of a response frame without its size prefix."""
    (correlation_id,) = struct.unpack_from(">i", frame)
    offset = 4 + (1 if response_header_flexible(api_key, api_version) else 0)
    body, _ = entity_reader(load_response_schema(api_key, api_version))(frame, offset)
    return correlation_id, body


class AsyncRawClient:
    """``RawClient`` for a broker running in the test's own event loop."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.correlation_id = 0

    @classmethod
    async def connect(cls, host: str, port: int) -> AsyncRawClient:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    def send(self, body: Any) -> int:
        self.correlation_id += 1
        self.writer.write(encode_request(body, self.correlation_id))
        return self.correlation_id

    async def receive(self, api_key: int, api_version: int) -> tuple[int, Any]:
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        return decode_response(await self.reader.readexactly(size), api_key, api_version)

    async def request(self, body: Any) -> Any:
        sent = self.send(body)
        correlation_id, response = await self.receive(body.__api_key__, body.__version__)
        assert correlation_id == sent
        return response

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()
