"""A TCP forwarder between a client and ``braid serve`` that misbehaves on cue, as the proxies of
aiormq's "connection close stairway" test and pika's ``ForwardServer`` do: it stops forwarding
(a black hole: both sockets stay open, nothing passes) or drops both connections once a given
number of server-to-client bytes went through, or when told to."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator

FORWARD = "forward"
BLACK_HOLE = "black-hole"  # stop forwarding, keep both sockets open
CLOSE = "close"  # close both sockets (FIN, as aiomisc's TCPProxy.disconnect_all)
DROP = "drop"  # reset both sockets (RST, as pika's ForwardServer with linger 0)


class Forwarder:
    """Listens on a free 127.0.0.1 port; every connection is forwarded to ``upstream``.

    ``after_bytes`` and ``then``: once that many server-to-client bytes were forwarded (the
    chunk that crosses the mark goes through whole), the connection turns ``then``."""

    def __init__(
        self, upstream: tuple[str, int], *, after_bytes: int | None = None, then: str = FORWARD
    ) -> None:
        self.upstream = upstream
        self.after_bytes = after_bytes
        self.then = then
        self.port = 0
        self.server_closed = asyncio.Event()  # the broker closed its side of a connection
        self.mode = FORWARD
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> Forwarder:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.drop()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def black_hole(self) -> None:
        self.mode = BLACK_HOLE

    def drop(self, *, reset: bool = True) -> None:
        """Close every connection at once: with a reset (SO_LINGER 0) as pika's forwarder, or
        with a FIN (``reset=False``) as aiomisc's proxy."""
        self.mode = DROP
        for writer in self._writers:
            if not reset:
                writer.close()
                continue
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self._writers.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        self._writers += [writer, up_writer]
        down = asyncio.create_task(self._pump(up_reader, writer, to_client=True))
        up = asyncio.create_task(self._pump(reader, up_writer, to_client=False))
        self._tasks.update((down, up))
        down.add_done_callback(self._tasks.discard)
        up.add_done_callback(self._tasks.discard)

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, to_client: bool
    ) -> None:
        forwarded = 0
        while True:
            data = await reader.read(65536)
            if not data:
                if to_client:  # the broker closed its side
                    self.server_closed.set()
                if self.mode == FORWARD:
                    writer.close()
                return
            if self.mode == DROP:
                return
            if self.mode == BLACK_HOLE:
                continue
            writer.write(data)
            await writer.drain()
            if to_client:
                forwarded += len(data)
                if self.after_bytes is not None and forwarded >= self.after_bytes:
                    if self.then in (DROP, CLOSE):
                        self.drop(reset=self.then == DROP)
                        return
                    self.mode = self.then


@contextlib.asynccontextmanager
async def forwarding(
    upstream: tuple[str, int], *, after_bytes: int | None = None, then: str = FORWARD
) -> AsyncIterator[Forwarder]:
    forwarder = await Forwarder(upstream, after_bytes=after_bytes, then=then).start()
    try:
        yield forwarder
    finally:
        await forwarder.close()
