"""The shared gateway transport (``gateway/transport.py``) over real sockets: write coalescing,
read pausing at the write high-water mark, events parked while a handler waits, and a close
that does not wait forever for a peer that never reads (driven by a ManualClock)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import pytest

from core.api import ManualClock
from gateway.transport import READING_BUSY, READING_WRITES, GatewayTransport, TransportLimits
from tests.transport.sockets import DEADLINE_S, small_window_socket, until

LIMITS = TransportLimits(write_high_water=64 << 10, write_low_water=16 << 10, close_timeout_s=5)


class Echo(GatewayTransport):
    """A line protocol on the base: each line is an event; ``wait:<name>`` waits for the
    future ``gates[name]``; ``big:<n>`` writes n bytes; anything else is echoed."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        super().__init__(LIMITS, clock, {"bytes_sent": 0})
        self.buffer = b""
        self.handled: list[bytes] = []
        self.flushes = 0
        self.gates: dict[bytes, asyncio.Future[None]] = {}
        self.gone = asyncio.get_running_loop().create_future()

    def received(self, data: bytes) -> None:
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        if not lines or self.park_more(lines):
            return
        self.run(lines, 0)

    def run(self, events: list[Any], start: int) -> None:
        for i in range(start, len(events)):
            waiting = self.step(events[i])
            if waiting is not None:
                self.park(events, i + 1)
                self.wait_for(waiting, self.go_on, lambda error: None)
                return
        self.resume_reading(READING_BUSY)

    def go_on(self) -> None:
        parked = self.take_parked()
        if parked is not None:
            self.run(*parked)

    def step(self, line: bytes) -> Awaitable[None] | None:
        self.handled.append(line)
        if line.startswith(b"wait:"):
            return self.gates.setdefault(line[5:], asyncio.get_running_loop().create_future())
        if line.startswith(b"big:"):
            self.write(b"x" * int(line[4:]))
        else:
            self.write(line + b"\n")
        return None

    def flush(self) -> None:
        if self._out:
            self.flushes += 1
        super().flush()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self.gone.done():
            self.gone.set_result(None)


@pytest.fixture
async def listener() -> AsyncIterator[tuple[list[Echo], int, ManualClock]]:
    clock = ManualClock()
    made: list[Echo] = []

    def factory() -> Echo:
        made.append(Echo(clock))
        return made[-1]

    server = await asyncio.get_running_loop().create_server(factory, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield made, port, clock
    for protocol in made:
        protocol.abort()
    server.close()
    await server.wait_closed()


async def test_the_writes_of_one_read_leave_in_one_transport_write(
    listener: tuple[list[Echo], int, ManualClock],
) -> None:
    made, port, _ = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"a\nb\nc\nd\n")
    received = b""
    while received.count(b"\n") < 4:
        received += await asyncio.wait_for(reader.read(1024), DEADLINE_S)
    assert received == b"a\nb\nc\nd\n"
    assert made[0].flushes == 1
    assert made[0].handled == [b"a", b"b", b"c", b"d"]
    writer.close()


async def test_events_after_a_waiting_handler_are_parked_in_order(
    listener: tuple[list[Echo], int, ManualClock],
) -> None:
    made, port, _ = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"one\nwait:g\ntwo\n")
    assert await asyncio.wait_for(reader.readline(), DEADLINE_S) == b"one\n"
    await until(lambda: b"g" in made[0].gates, "the handler to wait")
    protocol = made[0]
    assert protocol.reading_paused_for(READING_BUSY)
    writer.write(b"three\n")  # read only after the wait: reading is paused
    await writer.drain()
    assert protocol.handled == [b"one", b"wait:g"]
    protocol.gates[b"g"].set_result(None)
    assert await asyncio.wait_for(reader.readline(), DEADLINE_S) == b"two\n"
    assert await asyncio.wait_for(reader.readline(), DEADLINE_S) == b"three\n"
    assert protocol.handled == [b"one", b"wait:g", b"two", b"three"]
    assert not protocol.reading_paused_for(READING_BUSY)
    writer.close()


async def test_reading_pauses_while_the_peer_does_not_read_what_we_write(
    listener: tuple[list[Echo], int, ManualClock],
) -> None:
    made, port, _ = listener
    sock = small_window_socket(("127.0.0.1", port))
    try:
        # Far more than the kernel buffers of both ends hold: the rest stays in the transport.
        sock.sendall(b"big:%d\n" % (8 << 20))
        await until(lambda: bool(made) and made[0].reading_paused_for(READING_WRITES), "pause")
        protocol = made[0]
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        taken = 0
        while protocol.reading_paused_for(READING_WRITES):
            taken += len(await asyncio.wait_for(loop.sock_recv(sock, 1 << 20), DEADLINE_S))
        assert taken > 0
    finally:
        sock.close()


async def test_close_aborts_a_peer_that_never_reads_after_the_close_timeout(
    listener: tuple[list[Echo], int, ManualClock],
) -> None:
    made, port, clock = listener
    sock = small_window_socket(("127.0.0.1", port))
    try:
        sock.sendall(b"big:%d\n" % (8 << 20))
        await until(lambda: bool(made) and made[0].reading_paused_for(READING_WRITES), "pause")
        protocol = made[0]
        protocol.close()
        assert protocol.transport is not None
        assert protocol.transport.get_write_buffer_size() > 0  # close() waits for the peer
        clock.advance(LIMITS.close_timeout_s * 1000 - 1)
        await asyncio.sleep(0)
        assert not protocol.gone.done()
        clock.advance(1)
        await asyncio.wait_for(protocol.gone, DEADLINE_S)
    finally:
        sock.close()


async def test_close_sends_what_was_written_to_a_peer_that_reads(
    listener: tuple[list[Echo], int, ManualClock],
) -> None:
    made, port, clock = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"hello\n")
    assert await asyncio.wait_for(reader.readline(), DEADLINE_S) == b"hello\n"
    made[0].write(b"last words\n")
    made[0].close()
    assert await asyncio.wait_for(reader.read(), DEADLINE_S) == b"last words\n"
    await asyncio.wait_for(made[0].gone, DEADLINE_S)
    assert clock.pending() == 0  # the close timer went with the connection
    writer.close()


def test_limits_are_checked() -> None:
    with pytest.raises(ValueError, match="write_low_water"):
        TransportLimits(write_high_water=1, write_low_water=2)
    with pytest.raises(ValueError, match="close_timeout_s"):
        TransportLimits(write_high_water=2, write_low_water=1, close_timeout_s=-1)


async def test_a_stalled_peer_is_dropped_and_a_slow_one_is_not(
    listener: tuple[list[Echo], int, ManualClock],
) -> None:
    """The outgoing bound's stall timeout counts time without progress: a peer that takes some
    bytes within each timeout stays (a slow link), one that takes nothing is aborted."""
    made, port, clock = listener
    loop = asyncio.get_running_loop()
    sock = small_window_socket(("127.0.0.1", port))
    sock.setblocking(False)
    stall_ms = 10_000.0
    try:
        await until(lambda: bool(made), "the connection")
        protocol = made[0]
        protocol.bound_outgoing(64 << 10, stall_ms / 1000)
        sock.sendall(b"big:%d\n" % (8 << 20))
        await until(lambda: protocol.writing_paused, "the write side paused")
        for _ in range(3):  # slow: a little taken within every timeout
            before = protocol.taken_bytes()
            # Read until the server's socket takes more: the kernel wakes a writer only once a
            # good part of its send buffer is free again.
            while protocol.taken_bytes() == before:
                await asyncio.wait_for(loop.sock_recv(sock, 64 << 10), DEADLINE_S)
                await asyncio.sleep(0.001)
            clock.advance(stall_ms)
            await asyncio.sleep(0)
            assert not protocol.gone.done()
        # Stalled: nothing read any more. The bytes the kernel still took after the last read
        # count as progress for one more timeout at most; then the peer is dropped.
        for _ in range(5):
            if protocol.gone.done():
                break
            await asyncio.sleep(0.05)
            clock.advance(stall_ms)
            await asyncio.sleep(0)
        await asyncio.wait_for(protocol.gone, DEADLINE_S)
        assert protocol.writing_paused
    finally:
        sock.close()
