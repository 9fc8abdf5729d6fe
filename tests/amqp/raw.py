"""A raw AMQP 0-9-1 client for the in-process tests: exact frames, nothing hidden."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from pamqp import base, commands, heartbeat
from pamqp import frame as pamqp_frame

HEADER = b"AMQP\x00\x00\x09\x01"
TIMEOUT_S = 5.0


class RawConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.start: commands.Connection.Start | None = None

    @classmethod
    async def connect(cls, address: tuple[str, int]) -> RawConnection:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer)

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def send(self, channel: int, method: base.Frame) -> None:
        self.writer.write(pamqp_frame.marshal(method, channel))

    async def recv(self, timeout_s: float = TIMEOUT_S) -> tuple[int, Any]:
        """The next frame as (channel, pamqp frame); raises EOFError when the server closes."""
        async with asyncio.timeout(timeout_s):
            try:
                head = await self.reader.readexactly(7)
            except asyncio.IncompleteReadError:
                raise EOFError from None
            _ftype, _channel, size = struct.unpack(">BHI", head)
            rest = await self.reader.readexactly(size + 1)
        _, channel, frame = pamqp_frame.unmarshal(head + rest)
        return channel, frame

    async def expect(self, kind: type, timeout_s: float = TIMEOUT_S) -> Any:
        """Skip heartbeats; the next frame must be a ``kind``."""
        while True:
            _channel, frame = await self.recv(timeout_s)
            if isinstance(frame, heartbeat.Heartbeat) and kind is not heartbeat.Heartbeat:
                continue
            assert isinstance(frame, kind), f"expected {kind.__name__}, got {frame!r}"
            return frame

    async def handshake(
        self,
        *,
        mechanism: str = "PLAIN",
        response: str = "\x00guest\x00guest",
        capabilities: dict[str, Any] | None = None,
        heartbeat_s: int = 0,
        open_vhost: bool = True,
    ) -> None:
        self.write(HEADER)
        self.start = await self.expect(commands.Connection.Start)
        self.send(
            0,
            commands.Connection.StartOk(
                {"product": "raw-test", "capabilities": capabilities or {}}, mechanism, response
            ),
        )
        tune = await self.expect(commands.Connection.Tune)
        self.send(0, commands.Connection.TuneOk(tune.channel_max, tune.frame_max, heartbeat_s))
        if open_vhost:
            self.send(0, commands.Connection.Open("/"))
            await self.expect(commands.Connection.OpenOk)

    async def open_channel(self, channel: int = 1) -> None:
        self.send(channel, commands.Channel.Open())
        await self.expect(commands.Channel.OpenOk)

    async def closed(self, timeout_s: float = TIMEOUT_S) -> bool:
        """True once the server closed the socket (frames before that are skipped)."""
        try:
            while True:
                await self.recv(timeout_s)
        except EOFError:
            return True

    def close(self) -> None:
        self.writer.close()
