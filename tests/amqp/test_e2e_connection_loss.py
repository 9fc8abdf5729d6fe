"""Connections that break under the client (issue 17 items 6 and 7), against a real
``braid serve`` through a TCP forwarder that drops or stops forwarding on cue (forwarder.py):
what aiormq's "connection close stairway" test and pika's connection-loss tests do."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator

import aiormq
import pika
import pika.exceptions
import pytest
from pamqp import commands
from yarl import URL

from tests.amqp.forwarder import BLACK_HOLE, CLOSE, Forwarder, forwarding
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


@contextlib.contextmanager
def forwarder_in_a_thread(braid: BraidProcess) -> Iterator[tuple[int, Callable[[], None]]]:
    """A forwarder for a blocking client: its port, and a call that resets every connection
    through it and returns once that is done (pika's ForwardServer.stop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    started = asyncio.run_coroutine_threadsafe(
        Forwarder(("127.0.0.1", braid.amqp_port)).start(), loop
    )
    forwarder = started.result(DEADLINE_S)

    async def drop() -> None:
        forwarder.drop()

    try:
        yield forwarder.port, lambda: asyncio.run_coroutine_threadsafe(drop(), loop).result(10)
    finally:
        asyncio.run_coroutine_threadsafe(forwarder.close(), loop).result(DEADLINE_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(DEADLINE_S)
        loop.close()


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        ("_on_connection_start", pika.exceptions.ProbableAuthenticationError),
        ("_on_connection_tune", pika.exceptions.ProbableAccessDeniedError),
    ],
)
def test_pika_connection_lost_during_the_handshake(
    braid: BraidProcess, phase: str, expected: type[Exception]
) -> None:
    """pika's TestDisconnectDuringConnectionStart / ...Tune: the forwarder resets the
    connection when Connection.Start (Tune) arrives; pika names the phase it was lost in,
    which needs Start and Tune to arrive one by one, each answered before the next."""
    with forwarder_in_a_thread(braid) as (port, drop):

        def dropping_first(self: pika.SelectConnection, *args: object, **kwargs: object) -> None:
            drop()
            getattr(pika.SelectConnection, phase)(self, *args, **kwargs)

        impl = type("DroppingConnection", (pika.SelectConnection,), {phase: dropping_first})
        parameters = pika.ConnectionParameters("127.0.0.1", port, socket_timeout=5)
        with pytest.raises(expected):
            pika.BlockingConnection(parameters, _impl_class=impl)


def test_pika_connection_lost_while_blocked_in_queue_declare(braid: BraidProcess) -> None:
    """pika's TestBrokerDropBlockedInQueueDeclare, blocking flavour: the connection goes while
    queue.declare waits for its Declare-Ok; the call raises instead of waiting forever."""
    with forwarder_in_a_thread(braid) as (port, drop):
        connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port))
        channel = connection.channel()
        original = connection._impl._send_method  # type: ignore[attr-defined]

        def send_then_drop(channel_number: int, method: object, *rest: object) -> None:
            original(channel_number, method, *rest)
            if type(method).__name__ == "Declare":
                drop()

        connection._impl._send_method = send_then_drop  # type: ignore[attr-defined]
        with pytest.raises(pika.exceptions.AMQPConnectionError):
            channel.queue_declare("lost-in-declare", exclusive=True)
