"""Issue 21 item 5: a closed connection's memory is freed at once, not when the cyclic garbage
collector runs.

An AMQP client that sends half of a 10 MiB message body and drops the socket left the body,
its ``Session``, ``AmqpConnection`` and ``AmqpDecoder`` in reference cycles: with the broker's
gc thresholds raised (``gc.freeze`` after start, as braid serve does) nothing reclaimed them
for a long time (1.9 GB after three rounds). With gc disabled, the objects must still be gone
right after the close: weak references to them dead, the traced memory back near where it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import tracemalloc
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

from pamqp import commands
from pamqp import frame as pamqp_frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from core.broker import BrokerConfig, Node
from core.log import LogConfig, LogStore
from gateway.amqp.session import SessionSettings
from tests.amqp.inprocess import ServerUnderTest
from tests.amqp.raw import RawConnection

DEADLINE_S = 10.0
BODY_SIZE = 10 * 1024 * 1024
SENT = BODY_SIZE // 2
MIB = 1024 * 1024


@contextlib.contextmanager
def gc_disabled() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.asynccontextmanager
async def serve(data_dir: Path) -> AsyncIterator[ServerUnderTest]:
    store = LogStore(LogConfig(data_dir, segment_size=4 << 20, index_entries_per_file=4096))
    await store.start()
    broker = Node(store, BrokerConfig())
    await broker.start()
    server = ServerUnderTest(broker, SessionSettings())
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()
        await broker.close()
        await store.aclose()


async def until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition()`` every 10 ms until it is true."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not condition():
        assert loop.time() < deadline, f"not within {DEADLINE_S} s: {what}"
        await asyncio.sleep(0.01)


async def half_sent_message(server: ServerUnderTest) -> RawConnection:
    """A connection with a publish whose body is half sent; returns once the server read it."""
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    await raw.handshake()
    await raw.open_channel(1)
    raw.send(1, commands.Basic.Publish(exchange="", routing_key="nowhere"))
    raw.write(pamqp_frame.marshal(ContentHeader(0, BODY_SIZE), 1))
    chunk = b"x" * (128 * 1024 - 8)  # frame_max 131072 less the frame overhead
    sent = 0
    while sent < SENT:
        raw.write(pamqp_frame.marshal(ContentBody(chunk), 1))
        sent += len(chunk)
    await raw.writer.drain()
    await until(lambda: _assembled(server), "the server read the half body")
    return raw


def _assembled(server: ServerUnderTest) -> bool:
    """The one connection's decoder holds at least the half body."""
    for connection in server.connections:
        session = connection.session
        if session is not None:
            contents = session.decoder._content
            if any(sum(map(len, c.parts)) >= SENT - 256 * 1024 for c in contents.values()):
                return True
    return False


async def test_half_sent_body_freed_at_close_without_gc(tmp_path: Path) -> None:
    async with serve(tmp_path / "data") as server:
        # A first round warms up what a connection allocates once (codec tables, schemas).
        raw = await half_sent_message(server)
        raw.close()
        await until(lambda: not server.connections, "the first connection gone")
        with gc_disabled():
            tracemalloc.start()
            try:
                baseline = tracemalloc.get_traced_memory()[0]
                raw = await half_sent_message(server)
                (connection,) = server.connections
                assert connection.session is not None
                refs: dict[str, weakref.ref[object]] = {
                    "AmqpConnection": weakref.ref(connection),
                    "Session": weakref.ref(connection.session),
                    "AmqpDecoder": weakref.ref(connection.session.decoder),
                }
                held = tracemalloc.get_traced_memory()[0] - baseline
                assert held >= SENT - MIB, f"the half body is not held: {held} bytes"
                del connection
                raw.close()
                await until(lambda: not server.connections, "the connection gone")
                await until(
                    lambda: all(ref() is None for ref in refs.values()),
                    "every object of the closed connection freed",
                )
                after = tracemalloc.get_traced_memory()[0] - baseline
            finally:
                tracemalloc.stop()
        assert after < MIB, f"{after} bytes still held after the close (baseline {baseline})"
