"""Dead-lettering by TTL as aio-pika's own suite checks it (tests/test_amqp.py ``test_dlx`` and
``test_expiration``, issue 17 item 10), with aio-pika against a real ``braid serve``: what the
dead letter is delivered with (its dead-letter exchange and routing key), and that a message
dead-lettered for its per-message expiration does not expire again in the dead-letter queue."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from tests.amqp.conftest import unique
from tests.braid_process import BraidProcess

DEADLINE_S = 60


@pytest.mark.parametrize("connect", [aio_pika.connect, aio_pika.connect_robust])
async def test_dead_letter_by_queue_ttl_arrives_under_its_dead_letter_address(
    braid: BraidProcess, connect: object
) -> None:
    """aio-pika's test_dlx: no consumer on the TTL queue, a consumer on the dead-letter queue,
    which asserts the routing key is the x-dead-letter-routing-key (it used to see the
    original one, so the test's future was never set and it hung)."""
    assert callable(connect)
    async with await connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        suffix = unique("dlx")
        dlx_routing_key = f"{suffix}_dlx_routing_key"
        direct = await channel.declare_exchange(f"{suffix}.direct", auto_delete=True)
        dlx = await channel.declare_exchange(f"{suffix}.dlx", auto_delete=True)
        direct_queue = await channel.declare_queue(
            f"{suffix}_direct_queue",
            auto_delete=True,
            arguments={
                "x-message-ttl": 300,
                "x-dead-letter-exchange": dlx.name,
                "x-dead-letter-routing-key": dlx_routing_key,
            },
        )
        dlx_queue = await channel.declare_queue(f"{suffix}_dlx_queue", auto_delete=True)
        arrived: asyncio.Future[AbstractIncomingMessage] = asyncio.Future()
        await dlx_queue.consume(arrived.set_result, no_ack=True)
        await dlx_queue.bind(dlx, dlx_routing_key)
        await direct_queue.bind(direct, "key")
        await direct.publish(aio_pika.Message(b"to die", content_type="text/plain"), "key")
        async with asyncio.timeout(DEADLINE_S):
            message = await arrived
        assert message.body == b"to die"
        assert message.routing_key == dlx_routing_key
        assert message.exchange == dlx.name
        death = message.headers["x-death"]
        assert isinstance(death, list)
        assert death[0]["reason"] == "expired"  # type: ignore[index]
        assert death[0]["routing-keys"] == ["key"]  # type: ignore[index]


async def test_dead_letter_by_message_expiration_does_not_expire_again(
    braid: BraidProcess,
) -> None:
    """aio-pika's test_expiration: a message published with ``expiration`` 0.5 s to a queue
    with a dead-letter exchange; the consumer of the dead-letter queue attaches afterwards.
    The dead letter must wait for it there: its expiration went with the dead-lettering
    (RabbitMQ keeps it as x-death's original-expiration); it used to expire at once again."""
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        dlx_queue = await channel.declare_queue(f"test.{unique('test_dlx')}")
        dlx_exchange = await channel.declare_exchange(f"test.{unique('dlx')}")
        await dlx_queue.bind(dlx_exchange, routing_key=dlx_queue.name)
        queue = await channel.declare_queue(
            f"test.{unique('test_expiration')}",
            arguments={
                "x-message-ttl": 10000,
                "x-dead-letter-exchange": dlx_exchange.name,
                "x-dead-letter-routing-key": dlx_queue.name,
            },
        )
        await channel.default_exchange.publish(
            aio_pika.Message(
                b"short-lived", content_type="text/plain", headers={"foo": "bar"}, expiration=0.5
            ),
            queue.name,
        )
        # Wait until it was dead-lettered (an event: the dead-letter queue's count), then
        # attach the consumer, as late as the suite's test does at worst.
        async with asyncio.timeout(DEADLINE_S):
            while (await dlx_queue.declare()).message_count == 0:  # noqa: ASYNC110 (a count)
                await asyncio.sleep(0.05)
        arrived: asyncio.Future[AbstractIncomingMessage] = asyncio.Future()
        await dlx_queue.consume(arrived.set_result, no_ack=True)
        async with asyncio.timeout(DEADLINE_S):
            message = await arrived
        assert message.body == b"short-lived"
        assert message.expiration is None
        death = message.headers["x-death"]
        assert isinstance(death, list)
        assert death[0]["original-expiration"] == "500"  # type: ignore[index]
        assert death[0]["reason"] == "expired"  # type: ignore[index]
