"""aio-pika against a real ``braid serve``: routing, RPC with direct reply-to, dead letters,
delayed messages, publisher confirms, transactions, a robust connection across a restart."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aio_pika
import pytest
from aio_pika import DeliveryMode, ExchangeType, Message
from aio_pika.abc import AbstractIncomingMessage
from pamqp import commands

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess

TIMEOUT_S = 10.0


async def drain(
    queue: aio_pika.abc.AbstractQueue, count: int, timeout_s: float = TIMEOUT_S
) -> list[AbstractIncomingMessage]:
    """``count`` messages from ``queue`` (acked), or fail after ``timeout_s``."""
    got: list[AbstractIncomingMessage] = []
    async with asyncio.timeout(timeout_s), queue.iterator() as iterator:
        async for message in iterator:
            await message.ack()
            got.append(message)
            if len(got) == count:
                break
    return got


async def get_one(queue: aio_pika.abc.AbstractQueue, timeout_s: float = TIMEOUT_S) -> Any:
    """basic.get until a message comes (polling), or None after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = await queue.get(no_ack=True, fail=False)
        if message is not None:
            return message
        await asyncio.sleep(0.05)
    return None


async def test_topic_exchange_routing(braid: BraidProcess) -> None:
    connection = await aio_pika.connect_robust(braid.amqp_url)
    async with connection:
        channel = await connection.channel()
        exchange = await channel.declare_exchange(unique("logs"), ExchangeType.TOPIC)
        errors = await channel.declare_queue(unique("errors"), exclusive=True)
        kern = await channel.declare_queue(unique("kern"), exclusive=True)
        await errors.bind(exchange, "*.error")
        await kern.bind(exchange, "kern.#")
        for key in ("kern.error", "app.error", "kern.info.x", "app.info"):
            await exchange.publish(Message(key.encode()), routing_key=key)
        assert sorted(m.body for m in await drain(errors, 2)) == [b"app.error", b"kern.error"]
        got = await drain(kern, 2)
        assert sorted(m.body for m in got) == [b"kern.error", b"kern.info.x"]
        assert {m.routing_key for m in got} == {"kern.error", "kern.info.x"}
        assert got[0].exchange == exchange.name
        assert await errors.get(fail=False) is None


async def test_headers_fanout_e2e_and_alternate_exchange(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        unrouted = await channel.declare_exchange(unique("ae"), ExchangeType.FANOUT)
        headers = await channel.declare_exchange(
            unique("hdr"), ExchangeType.HEADERS, arguments={"alternate-exchange": unrouted.name}
        )
        fan = await channel.declare_exchange(unique("fan"), ExchangeType.FANOUT)
        matched = await channel.declare_queue(unique("matched"), exclusive=True)
        other = await channel.declare_queue(unique("other"), exclusive=True)
        fanned = await channel.declare_queue(unique("fanned"), exclusive=True)
        await matched.bind(headers, arguments={"x-match": "all", "kind": "a", "n": 1})
        await other.bind(unrouted)
        await fan.bind(headers, arguments={"x-match": "any", "kind": "a", "kind2": "b"})
        await fanned.bind(fan)
        await headers.publish(Message(b"1", headers={"kind": "a", "n": 1}), routing_key="")
        await headers.publish(Message(b"2", headers={"kind": "z"}), routing_key="")
        assert [m.body for m in await drain(matched, 1)] == [b"1"]
        assert [m.body for m in await drain(fanned, 1)] == [b"1"]
        assert [m.body for m in await drain(other, 1)] == [b"2"]


async def test_rpc_with_direct_reply_to(braid: BraidProcess) -> None:
    rpc_queue = unique("rpc")
    async with await aio_pika.connect_robust(braid.amqp_url) as server_conn:
        server_channel = await server_conn.channel()
        requests = await server_channel.declare_queue(rpc_queue, auto_delete=True)

        async def serve(message: AbstractIncomingMessage) -> None:
            async with message.process():
                n = int(message.body)
                assert message.reply_to
                assert message.reply_to.startswith("amq.rabbitmq.reply-to.")
                await server_channel.default_exchange.publish(
                    Message(str(n * n).encode(), correlation_id=message.correlation_id),
                    routing_key=message.reply_to,
                )

        await requests.consume(serve)
        async with await aio_pika.connect_robust(braid.amqp_url) as client_conn:
            channel = await client_conn.channel()
            replies = await channel.get_queue("amq.rabbitmq.reply-to")
            futures: dict[str, asyncio.Future[bytes]] = {}

            async def on_reply(message: AbstractIncomingMessage) -> None:
                assert message.correlation_id is not None
                futures.pop(message.correlation_id).set_result(message.body)

            await replies.consume(on_reply, no_ack=True)
            loop = asyncio.get_running_loop()
            for n in range(5):
                futures[str(n)] = future = loop.create_future()
                await channel.default_exchange.publish(
                    Message(
                        str(n).encode(), correlation_id=str(n), reply_to="amq.rabbitmq.reply-to"
                    ),
                    routing_key=rpc_queue,
                )
                assert await asyncio.wait_for(future, TIMEOUT_S) == str(n * n).encode()


async def test_dead_letter_after_reject(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        dlx = await channel.declare_exchange(unique("dlx"), ExchangeType.DIRECT)
        dead = await channel.declare_queue(unique("dead"), exclusive=True)
        await dead.bind(dlx, "failed")
        work = await channel.declare_queue(
            unique("work"),
            exclusive=True,
            arguments={"x-dead-letter-exchange": dlx.name, "x-dead-letter-routing-key": "failed"},
        )
        await channel.default_exchange.publish(
            Message(b"job", headers={"attempt": 1}), routing_key=work.name
        )
        async with asyncio.timeout(TIMEOUT_S), work.iterator() as iterator:
            async for message in iterator:
                await message.reject(requeue=False)
                break
        (got,) = await drain(dead, 1)
        assert got.body == b"job"
        assert got.headers["attempt"] == 1
        (death,) = got.headers["x-death"]
        assert death["reason"] == "rejected"
        assert death["queue"] == work.name
        assert death["count"] == 1
        assert got.headers["x-first-death-reason"] == "rejected"


async def test_dead_letter_after_ttl(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        target = await channel.declare_queue(unique("retry-target"), exclusive=True)
        # The classic "wait queue": no consumer, a TTL, dead letters to the default exchange.
        waiting = await channel.declare_queue(
            unique("wait"),
            exclusive=True,
            arguments={
                "x-message-ttl": 200,
                "x-dead-letter-exchange": "",
                "x-dead-letter-routing-key": target.name,
            },
        )
        started = time.monotonic()
        await channel.default_exchange.publish(Message(b"later"), routing_key=waiting.name)
        (got,) = await drain(target, 1)
        assert time.monotonic() - started >= 0.2
        assert got.body == b"later"
        assert got.headers["x-death"][0]["reason"] == "expired"
        assert got.headers["x-death"][0]["queue"] == waiting.name


async def test_per_message_expiration(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(unique("expiring"), exclusive=True)
        await channel.default_exchange.publish(
            Message(b"short", expiration=0.05), routing_key=queue.name
        )
        await channel.default_exchange.publish(Message(b"long"), routing_key=queue.name)
        await asyncio.sleep(0.3)
        (got,) = await drain(queue, 1)
        assert got.body == b"long"


async def test_delayed_message_exchange(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        delayed = await channel.declare_exchange(
            unique("delayed"), "x-delayed-message", arguments={"x-delayed-type": "direct"}
        )
        queue = await channel.declare_queue(unique("delayed-q"), exclusive=True)
        await queue.bind(delayed, "k")
        started = time.monotonic()
        await delayed.publish(Message(b"soon", headers={"x-delay": 600}), routing_key="k")
        await delayed.publish(Message(b"now"), routing_key="k")
        (first,) = await drain(queue, 1)
        assert first.body == b"now"
        assert await queue.get(fail=False) is None
        (second,) = await drain(queue, 1, timeout_s=3)
        assert second.body == b"soon"
        assert time.monotonic() - started >= 0.55


async def test_publisher_confirms_and_returns(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel(publisher_confirms=True, on_return_raises=True)
        queue = await channel.declare_queue(unique("confirmed"), durable=True)
        confirms = await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    Message(str(i).encode(), delivery_mode=DeliveryMode.PERSISTENT),
                    routing_key=queue.name,
                )
                for i in range(500)
            )
        )
        assert all(isinstance(c, commands.Basic.Ack) for c in confirms)
        assert (await queue.declare()).message_count == 500
        with pytest.raises(aio_pika.exceptions.DeliveryError) as returned:
            await channel.default_exchange.publish(
                Message(b"lost"), routing_key=unique("nobody"), mandatory=True
            )
        assert returned.value.message.body == b"lost"
        await queue.delete(if_unused=False, if_empty=False)


async def test_reject_publish_overflow_nacks(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel(publisher_confirms=True)
        queue = await channel.declare_queue(
            unique("bounded"),
            exclusive=True,
            arguments={"x-max-length": 2, "x-overflow": "reject-publish"},
        )
        for i in range(2):
            await channel.default_exchange.publish(Message(b"%d" % i), routing_key=queue.name)
        with pytest.raises(aio_pika.exceptions.DeliveryError):
            await channel.default_exchange.publish(Message(b"3"), routing_key=queue.name)
        assert (await queue.declare()).message_count == 2


async def test_transactions(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel(publisher_confirms=False)
        queue = await channel.declare_queue(unique("tx"), exclusive=True)
        tx = channel.transaction()
        await tx.select()
        await channel.default_exchange.publish(Message(b"rolled back"), routing_key=queue.name)
        await tx.rollback()
        assert (await queue.declare()).message_count == 0
        await channel.default_exchange.publish(Message(b"a"), routing_key=queue.name)
        await channel.default_exchange.publish(
            Message(b"b", delivery_mode=DeliveryMode.PERSISTENT), routing_key=queue.name
        )
        assert (await queue.declare()).message_count == 0
        await tx.commit()
        assert (await queue.declare()).message_count == 2
        # An ack inside a transaction counts only once committed.
        message = await queue.get(no_ack=False)
        await message.ack()
        await tx.rollback()
        message2 = await queue.get(no_ack=False)
        await message2.ack()
        await tx.commit()
        assert {message.body, message2.body} == {b"a", b"b"}
        await channel.close()
        channel = await connection.channel()
        assert (await channel.declare_queue(queue.name, passive=True)).declaration_result
        assert (await channel.get_queue(queue.name)).name == queue.name


async def test_qos_redelivery_and_cancel(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=2)
        queue = await channel.declare_queue(unique("qos"), exclusive=True)
        for i in range(5):
            await channel.default_exchange.publish(Message(b"%d" % i), routing_key=queue.name)
        received: list[AbstractIncomingMessage] = []
        got_two = asyncio.Event()

        async def hold(message: AbstractIncomingMessage) -> None:
            received.append(message)
            if len(received) == 2:
                got_two.set()

        tag = await queue.consume(hold)
        await asyncio.wait_for(got_two.wait(), TIMEOUT_S)
        await asyncio.sleep(0.2)
        assert len(received) == 2  # prefetch 2: no more until acks
        await received[0].nack(requeue=True)
        await asyncio.sleep(0.2)
        assert len(received) == 3
        assert received[2].redelivered
        assert received[2].body == b"0"
        await queue.cancel(tag)
        for message in received[1:]:
            await message.ack()
        rest = await drain(queue, 3)
        assert sorted(m.body for m in rest) == [b"2", b"3", b"4"]


async def test_robust_connection_survives_restart(fresh_braid: BraidProcess) -> None:
    queue_name = unique("robust")
    connection = await aio_pika.connect_robust(fresh_braid.amqp_url, reconnect_interval=0.2)
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(queue_name, durable=True)
        received: asyncio.Queue[bytes] = asyncio.Queue()

        async def on_message(message: AbstractIncomingMessage) -> None:
            await message.ack()
            await received.put(message.body)

        await queue.consume(on_message)
        await channel.default_exchange.publish(
            Message(b"before", delivery_mode=DeliveryMode.PERSISTENT), routing_key=queue_name
        )
        assert await asyncio.wait_for(received.get(), TIMEOUT_S) == b"before"
        reconnected = asyncio.Event()
        connection.reconnect_callbacks.add(lambda *_: reconnected.set())
        await asyncio.to_thread(fresh_braid.restart)
        await asyncio.wait_for(reconnected.wait(), 30)
        await channel.default_exchange.publish(
            Message(b"after", delivery_mode=DeliveryMode.PERSISTENT), routing_key=queue_name
        )
        assert await asyncio.wait_for(received.get(), TIMEOUT_S) == b"after"
