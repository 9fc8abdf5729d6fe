"""Connections that break under the client (issue 17 items 6 and 7), against a real
``braid serve`` through a TCP forwarder that drops or stops forwarding on cue (forwarder.py):
what aiormq's "connection close stairway" test and pika's connection-loss tests do."""

from __future__ import annotations

import asyncio

import aiormq
import pytest
from pamqp import commands
from yarl import URL

from tests.amqp.forwarder import BLACK_HOLE, CLOSE, forwarding
from tests.amqp.raw import RawConnection
from tests.braid_process import BraidProcess

# A deadline for what must happen, so a regression fails instead of hanging the suite.
DEADLINE_S = 60


def through(forwarder_port: int, *, heartbeat: int = 1) -> URL:
    return URL(f"amqp://guest:guest@127.0.0.1:{forwarder_port}//?heartbeat={heartbeat}")


async def test_a_delivery_leaves_before_its_publishers_confirm(braid: BraidProcess) -> None:
    """As RabbitMQ: a consumer on the publishing connection gets the message before the
    publisher's Basic.Ack. (With the ack first, a client that awaits the confirm and then the
    delivery hangs forever when the connection drops between the two: aiormq's stairway.)"""
    raw = await RawConnection.connect(("127.0.0.1", braid.amqp_port))
    try:
        await raw.handshake()
        await raw.open_channel()
        raw.send(1, commands.Confirm.Select())
        await raw.expect(commands.Confirm.SelectOk)
        raw.send(1, commands.Queue.Declare(queue="", exclusive=True))
        queue = (await raw.expect(commands.Queue.DeclareOk)).queue
        raw.send(1, commands.Basic.Consume(queue=queue, consumer_tag="c", no_ack=True))
        await raw.expect(commands.Basic.ConsumeOk)
        for _ in range(20):
            raw.send(1, commands.Basic.Publish(exchange="", routing_key=queue))
            # Content header (class 60, body size 4, no properties) and body.
            raw.write(b"\x02\x00\x01\x00\x00\x00\x0e\x00\x3c\x00\x00" + (4).to_bytes(8, "big"))
            raw.write(b"\x00\x00\xce\x03\x00\x01\x00\x00\x00\x04test\xce")
            kinds = []
            while len(kinds) < 2:
                _channel, frame = await raw.recv()
                if isinstance(frame, commands.Basic.Deliver | commands.Basic.Ack):
                    kinds.append(type(frame))
            assert kinds == [commands.Basic.Deliver, commands.Basic.Ack]
    finally:
        raw.close()


async def _publish_and_consume_until_broken(url: URL) -> None:
    """aiormq's stairway loop: connect, consume a queue, then publish and await each delivery;
    returns once the connection broke (an AMQPError), whichever await it broke in."""
    connection = await aiormq.connect(url)
    try:
        received: asyncio.Queue[aiormq.abc.DeliveredMessage] = asyncio.Queue()
        channel = await connection.channel()
        declared = await channel.queue_declare(auto_delete=True)
        await channel.basic_consume(declared.queue, received.put, no_ack=True)
        while True:
            await channel.basic_publish(b"test", routing_key=declared.queue)
            message = await received.get()
            assert message.body == b"test"
    finally:
        await connection.close()


@pytest.mark.parametrize("drop_after", [4, 64, 256, 512, 1024, 4096, 16384])
async def test_a_dropped_connection_fails_the_client(braid: BraidProcess, drop_after: int) -> None:
    """aiormq's test_connection_close_stairway: wherever the connection is closed under the
    client (during the handshake, the declares, or publishing), its next await fails."""
    async with forwarding(
        ("127.0.0.1", braid.amqp_port), after_bytes=drop_after, then=CLOSE
    ) as fwd:
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(aiormq.AMQPError):
                await _publish_and_consume_until_broken(through(fwd.port))


async def test_a_silent_connection_is_closed_after_two_heartbeats(braid: BraidProcess) -> None:
    """The client asked for heartbeat=1 and the network stops passing anything: BraidMQ drops
    its side after two silent intervals (rabbit_heartbeat), and the client sees its
    connection fail too (by its own heartbeat check)."""
    async with forwarding(("127.0.0.1", braid.amqp_port)) as fwd:
        connection = await aiormq.connect(through(fwd.port))
        assert connection.connection_tune.heartbeat == 1
        channel = await connection.channel()
        await channel.queue_declare(exclusive=True)
        fwd.mode = BLACK_HOLE
        async with asyncio.timeout(DEADLINE_S):
            await fwd.server_closed.wait()
            # The client's own check (no frame for 3 heartbeat intervals) closes it too.
            await asyncio.wait([connection.closing])
        assert connection.is_closed
