"""``AMQPServer`` in process, over ``BrokerAPI(Broker)`` on a temporary directory, driven by
aio-pika and by raw frames: handshake and errors, heartbeats, flow control, global
prefetch, queue and exchange lifecycles, messages from other protocols."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aio_pika
import aiormq
import pytest
from aio_pika import ExchangeType, Message
from aio_pika.abc import AbstractIncomingMessage
from pamqp import commands

from core.api import ManualClock
from core.broker import BrokerConfig, Node
from core.log import LogConfig, LogStore
from core.log.record import PROTOCOL_MQTT
from gateway.amqp.fieldtable import encode_table
from gateway.amqp.session import SessionSettings
from gateway.amqp.vhost import QUEUE_TOPIC_PREFIX
from tests.amqp.inprocess import ServerUnderTest
from tests.amqp.raw import HEADER, RawConnection

TIMEOUT_S = 5.0


@contextlib.asynccontextmanager
async def serve(
    data_dir: Path, clock: ManualClock | None = None, **settings: object
) -> AsyncIterator[ServerUnderTest]:
    store = LogStore(LogConfig(data_dir, segment_size=4 << 20, index_entries_per_file=4096))
    await store.start()
    broker = Node(store, BrokerConfig())
    await broker.start()
    server = ServerUnderTest(broker, SessionSettings(**settings), clock)  # type: ignore[arg-type]
    await server.start("127.0.0.1", 0)
    try:
        yield server
    finally:
        await server.close()
        await broker.close()
        await store.aclose()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[ServerUnderTest]:
    async with serve(tmp_path / "data") as started:
        yield started


def url(server: ServerUnderTest) -> str:
    assert server.address is not None
    host, port = server.address
    return f"amqp://guest:guest@{host}:{port}/"


async def next_message(queue: aio_pika.abc.AbstractQueue) -> AbstractIncomingMessage:
    async with asyncio.timeout(TIMEOUT_S), queue.iterator() as iterator:
        async for message in iterator:
            await message.ack()
            return message
    raise AssertionError("unreachable")


# --- connection -----------------------------------------------------------------------------


async def test_start_advertises_rabbitmq_capabilities(server: ServerUnderTest) -> None:
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    amqplain = encode_table({"LOGIN": "guest", "PASSWORD": "guest"})[4:].decode()
    await raw.handshake(mechanism="AMQPLAIN", response=amqplain)
    assert raw.start is not None
    assert raw.start.mechanisms.split() == ["PLAIN", "AMQPLAIN"]
    capabilities = raw.start.server_properties["capabilities"]
    for name in (
        "publisher_confirms",
        "exchange_exchange_bindings",
        "basic.nack",
        "consumer_cancel_notify",
        "connection.blocked",
        "per_consumer_qos",
        "direct_reply_to",
        "authentication_failure_close",
    ):
        assert capabilities[name] is True, name
    raw.close()


async def test_bad_protocol_header_gets_ours_and_a_close(server: ServerUnderTest) -> None:
    assert server.address is not None
    reader, writer = await asyncio.open_connection(*server.address)
    writer.write(b"HTTP/1.1")
    assert await asyncio.wait_for(reader.read(100), TIMEOUT_S) == HEADER
    assert await asyncio.wait_for(reader.read(100), TIMEOUT_S) == b""
    writer.close()


async def test_refused_login_without_the_capability_just_closes(server: ServerUnderTest) -> None:
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    raw.write(HEADER)
    await raw.expect(commands.Connection.Start)
    raw.send(0, commands.Connection.StartOk({}, "PLAIN", "\x00guest\x00nope"))
    assert await raw.closed()
    assert server.metrics["logins_refused"] == 1


async def test_refused_login_with_the_capability_gets_403(server: ServerUnderTest) -> None:
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    raw.write(HEADER)
    await raw.expect(commands.Connection.Start)
    raw.send(
        0,
        commands.Connection.StartOk(
            {"capabilities": {"authentication_failure_close": True}}, "PLAIN", "\x00x\x00y"
        ),
    )
    close = await raw.expect(commands.Connection.Close)
    assert close.reply_code == 403
    assert close.reply_text.startswith("ACCESS_REFUSED - Login was refused")
    raw.send(0, commands.Connection.CloseOk())
    assert await raw.closed()


async def test_unknown_vhost_is_refused(server: ServerUnderTest) -> None:
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    await raw.handshake(open_vhost=False)
    raw.send(0, commands.Connection.Open("/elsewhere"))
    close = await raw.expect(commands.Connection.Close)
    assert close.reply_code == 530
    assert close.reply_text == "NOT_ALLOWED - vhost /elsewhere not found"


async def test_malformed_frame_costs_only_its_connection(server: ServerUnderTest) -> None:
    assert server.address is not None
    async with await aio_pika.connect(url(server)) as bystander:
        raw = await RawConnection.connect(server.address)
        await raw.handshake()
        raw.write(b"\x01\x00\x01\x00\x00\x00\x04\x00\x14\x00\x0a\x00")  # bad frame end
        close = await raw.expect(commands.Connection.Close)
        assert close.reply_code == 501
        channel = await bystander.channel()
        queue = await channel.declare_queue("", exclusive=True)
        assert queue.name.startswith("amq.gen-")
    assert server.metrics["connection_errors"] == 1


async def test_heartbeats_both_ways(tmp_path: Path) -> None:
    clock = ManualClock()  # the heartbeat timers run when the test moves time, not by sleeping
    async with serve(tmp_path / "data", clock, heartbeat=1) as server:
        assert server.address is not None
        raw = await RawConnection.connect(server.address)
        await raw.handshake(heartbeat_s=1)
        clock.advance(500)
        _, frame = await raw.recv(timeout_s=TIMEOUT_S)
        assert frame.name == "Heartbeat"
        # A silent client is dropped after two missed intervals, not before.
        clock.advance(1000)
        _, frame = await raw.recv(timeout_s=TIMEOUT_S)
        assert frame.name == "Heartbeat"
        clock.advance(1000)
        assert await raw.closed(timeout_s=TIMEOUT_S)


async def test_channel_max_counts_open_channels(tmp_path: Path) -> None:
    """RabbitMQ's rule (rabbit_reader:create_channel): channel_max bounds how many channels are
    open, not their numbers; a closed channel's place can be taken again."""
    async with serve(tmp_path / "data", channel_max=3) as server:
        assert server.address is not None
        raw = await RawConnection.connect(server.address)
        await raw.handshake()
        for number in (7, 65535, 2):
            await raw.open_channel(number)
        raw.send(7, commands.Channel.Close(200, "done", 0, 0))
        await raw.expect(commands.Channel.CloseOk)
        await raw.open_channel(1)
        raw.send(3, commands.Channel.Open())
        close = await raw.expect(commands.Connection.Close)
        assert close.reply_code == 530
        assert "number of channels opened (3) has reached the negotiated channel_max (3)" in (
            close.reply_text
        )
        raw.close()


async def test_connection_blocked_and_unblocked(server: ServerUnderTest) -> None:
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    await raw.handshake(capabilities={"connection.blocked": True})
    server.broker.flow.set_pressure("memory", True)
    blocked = await raw.expect(commands.Connection.Blocked)
    assert "memory" in blocked.reason
    server.broker.flow.set_pressure("memory", False)
    await raw.expect(commands.Connection.Unblocked)
    raw.close()


async def test_blocked_publish_is_confirmed_after_unblock(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue("", exclusive=True)
        server.broker.flow.set_pressure("memory", True)
        publish = asyncio.ensure_future(
            channel.default_exchange.publish(Message(b"held"), routing_key=queue.name)
        )
        await asyncio.sleep(0.2)
        assert not publish.done()
        server.broker.flow.set_pressure("memory", False)
        await asyncio.wait_for(publish, TIMEOUT_S)
        assert (await next_message(queue)).body == b"held"


# --- channels, consumers ----------------------------------------------------------------------


async def test_global_prefetch_limits_the_whole_channel(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=3, global_=True)
        first = await channel.declare_queue("", exclusive=True)
        second = await channel.declare_queue("", exclusive=True)
        for i in range(5):
            await channel.default_exchange.publish(Message(b"%d" % i), routing_key=first.name)
            await channel.default_exchange.publish(Message(b"%d" % i), routing_key=second.name)
        held: list[AbstractIncomingMessage] = []

        async def hold(message: AbstractIncomingMessage) -> None:
            held.append(message)

        await first.consume(hold)
        await second.consume(hold)
        await asyncio.sleep(0.3)
        assert len(held) == 3  # one limit for the whole channel
        await held[0].ack()
        await asyncio.sleep(0.2)
        assert len(held) == 4
        # (channel.flow(false) is refused with 540, as RabbitMQ: test_slow_requester.py.)
        for message in held[1:]:
            await message.ack()
        await asyncio.sleep(0.3)
        assert len(held) == 7


async def test_exclusive_consumer_and_queue_delete_checks(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("guarded")
        await channel.default_exchange.publish(Message(b"x"), routing_key="guarded")

        async def ignore(message: AbstractIncomingMessage) -> None:
            pass

        await queue.consume(ignore, exclusive=True)
        other = await connection.channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await (await other.get_queue("guarded")).consume(ignore)
        other = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await other.queue_delete("guarded", if_unused=True)
        other = await connection.channel()
        await other.declare_queue("stocked")
        await other.default_exchange.publish(Message(b"x"), routing_key="stocked")
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await other.queue_delete("stocked", if_empty=True)
        other = await connection.channel()
        assert await other.queue_delete("stocked") is not None


async def test_queue_expires_when_unused(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        await channel.declare_queue("short-lived", arguments={"x-expires": 200})
        await asyncio.sleep(0.5)
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.declare_queue("short-lived", passive=True)
    assert "short-lived" not in server.vhost.queues
    assert QUEUE_TOPIC_PREFIX + "short-lived" not in server.broker.topics


async def test_max_length_drop_head_dead_letters(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        dead = await channel.declare_queue("", exclusive=True)
        queue = await channel.declare_queue(
            "",
            exclusive=True,
            arguments={
                "x-max-length": 2,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dead.name,
            },
        )
        for i in range(3):
            await channel.default_exchange.publish(Message(b"%d" % i), routing_key=queue.name)
        dropped = await next_message(dead)
        assert dropped.body == b"0"
        assert dropped.headers["x-death"][0]["reason"] == "maxlen"
        assert (await queue.declare()).message_count == 2


async def test_exchange_lifecycle(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        source = await channel.declare_exchange("src", ExchangeType.DIRECT)
        target = await channel.declare_exchange("dst", ExchangeType.FANOUT, auto_delete=True)
        queue = await channel.declare_queue("", exclusive=True)
        await queue.bind(target)
        await target.bind(source, "k")
        await source.publish(Message(b"via e2e"), routing_key="k")
        assert (await next_message(queue)).body == b"via e2e"
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await channel.exchange_delete("src", if_unused=True)
        channel = await connection.channel()
        with pytest.raises(aio_pika.exceptions.ChannelPreconditionFailed):
            await channel.declare_exchange("src", ExchangeType.TOPIC)
        channel = await connection.channel()
        await channel.declare_exchange("src", ExchangeType.DIRECT, passive=True)
        internal = await channel.declare_exchange("hidden", ExchangeType.FANOUT, internal=True)
        underlay = await channel.get_underlay_channel()
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await underlay.basic_publish(b"no", exchange=internal.name)
        channel = await connection.channel()
        # dst is auto-delete: unbinding its last queue deletes it, and src's binding to it.
        target = await channel.get_exchange("dst")
        await (await channel.get_queue(queue.name)).unbind(target)
        with pytest.raises(aio_pika.exceptions.ChannelNotFoundEntity):
            await channel.declare_exchange("dst", passive=True)
        assert not server.broker.bindings.bindings(source="src")
        channel = await connection.channel()
        await channel.exchange_delete("src")
        await channel.exchange_delete("src")  # deleting a missing exchange is fine
        with pytest.raises(aiormq.exceptions.ChannelAccessRefused):
            await channel.exchange_delete("amq.direct")


async def test_immediate_is_not_implemented(server: ServerUnderTest) -> None:
    assert server.address is not None
    raw = await RawConnection.connect(server.address)
    await raw.handshake()
    await raw.open_channel()
    raw.send(1, commands.Basic.Publish(exchange="", routing_key="q", immediate=True))
    raw.write(b"\x02\x00\x01\x00\x00\x00\x0e\x00\x3c\x00\x00" + bytes(8) + b"\x00\x00\xce")
    close = await raw.expect(commands.Connection.Close)
    assert (close.reply_code, close.class_id, close.method_id) == (540, 60, 40)


# --- other protocols' records ---------------------------------------------------------------


async def test_record_from_another_protocol_gets_properties(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("from-mqtt", exclusive=True)
        await server.broker.publish(
            QUEUE_TOPIC_PREFIX + "from-mqtt",
            b'{"t": 21.5}',
            subject="sensors/kitchen",
            headers=[
                ("x-braid-content-type", b"application/json"),
                ("x-braid-correlation-id", b"c-9"),
                ("x-braid-reply-to", b"answers"),
                ("x-mqtt-qos", b"1"),
                ("site", b"lyon"),
                ("raw", b"\xff\x00"),
            ],
            protocol=PROTOCOL_MQTT,
        )
        message = await next_message(queue)
        assert message.body == b'{"t": 21.5}'
        assert message.routing_key == "sensors/kitchen"
        assert message.content_type == "application/json"
        assert message.correlation_id == "c-9"
        assert message.reply_to == "answers"
        assert message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert message.headers == {"site": "lyon", "raw": b"\xff\x00"}


async def test_amqp_publish_leaves_documented_record_headers(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue("inspect", exclusive=True)
        await channel.default_exchange.publish(
            Message(
                b"{}",
                content_type="application/json",
                correlation_id="c1",
                message_id="m1",
                headers={"n": 5, "s": "x", "nested": {"a": [1]}},
                expiration=60,
            ),
            routing_key=queue.name,
        )
        assert (await queue.declare()).message_count == 1
        # Read while the queue exists: deleting a topic deletes its index (core/broker).
        records = server.broker.shard.store.read(
            QUEUE_TOPIC_PREFIX + "inspect", 0, 0, max_records=1
        )
    ack_queue = server.broker.ack_queue(QUEUE_TOPIC_PREFIX + "inspect")
    assert ack_queue is None  # exclusive: gone with its connection
    headers = dict(records[0].record().headers)
    assert headers["x-braid-content-type"] == b"application/json"
    assert headers["x-braid-correlation-id"] == b"c1"
    assert headers["x-braid-message-id"] == b"m1"
    assert headers["n"] == b"5"
    assert headers["s"] == b"x"
    assert json.loads(headers["nested"]) == {"a": [1]}
    assert int(headers["x-braid-expires-at"]) > 0
    assert headers["x-braid-amqp-properties"][:2] != b"\x00\x00"


async def test_single_active_consumer_and_delivery_limit(server: ServerUnderTest) -> None:
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel()
        dead = await channel.declare_queue("", exclusive=True)
        queue = await channel.declare_queue(
            "",
            exclusive=True,
            arguments={
                "x-single-active-consumer": True,
                "x-delivery-limit": 1,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": dead.name,
            },
        )
        got: dict[str, list[AbstractIncomingMessage]] = {"a": [], "b": []}

        def keep(name: str):  # type: ignore[no-untyped-def]
            async def on_message(message: AbstractIncomingMessage) -> None:
                got[name].append(message)

            return on_message

        tag_a = await queue.consume(keep("a"))
        await queue.consume(keep("b"))
        await channel.default_exchange.publish(Message(b"m"), routing_key=queue.name)
        await asyncio.sleep(0.2)
        assert [m.body for m in got["a"]] == [b"m"]
        assert got["b"] == []
        await got["a"][0].nack(requeue=True)  # delivery 1: back in the queue
        await asyncio.sleep(0.2)
        assert len(got["a"]) == 2
        assert got["a"][1].redelivered
        await queue.cancel(tag_a)  # b takes over
        await got["a"][1].nack(requeue=True)  # delivery 2 > limit 1: dead-lettered
        died = await next_message(dead)
        assert died.headers["x-death"][0]["reason"] == "delivery_limit"
        await channel.default_exchange.publish(Message(b"n"), routing_key=queue.name)
        await asyncio.sleep(0.2)
        assert [m.body for m in got["b"]] == [b"n"]


async def test_tx_publishes_are_half_messages_until_commit(server: ServerUnderTest) -> None:
    transactions = server.broker.shard.transactions
    async with await aio_pika.connect(url(server)) as connection:
        channel = await connection.channel(publisher_confirms=False)
        fan = await channel.declare_exchange("tx-fan", ExchangeType.FANOUT)
        first = await channel.declare_queue("", exclusive=True)
        second = await channel.declare_queue("", exclusive=True)
        await first.bind(fan)
        await second.bind(fan)
        tx = channel.transaction()
        await tx.select()
        await fan.publish(Message(b"both"), routing_key="")
        await channel.default_exchange.publish(Message(b"one"), routing_key=first.name)
        assert transactions.metrics["pending"] == 1
        assert (await first.declare()).message_count == 0
        await tx.commit()
        assert transactions.metrics["committed"] == 1
        assert (await first.declare()).message_count == 2
        assert (await second.declare()).message_count == 1
        await fan.publish(Message(b"never"), routing_key="")
        await tx.rollback()
        assert transactions.metrics["rolled_back"] == 1
        assert (await second.declare()).message_count == 1
        await fan.publish(Message(b"abandoned"), routing_key="")
    await asyncio.sleep(0.1)  # the channel closed with a transaction open: rolled back
    assert transactions.metrics["rolled_back"] == 2
    assert transactions.metrics["pending"] == 0
