"""aio-pika's RPC pattern as its own suite drives it (tests/test_rpc.py, issue 17 item 12), against
a real ``braid serve``: several RPC objects one after another on one channel, each closed (twice)
and a new one made, all sharing the auto-delete headers exchange ``rpc.dlx``.

``RPC.close`` cancels the consumer of its auto-delete reply queue (which deletes the queue, as
RabbitMQ does) and then unbinds that queue from ``rpc.dlx``: RabbitMQ answers Unbind-Ok for a
queue that is gone; BraidMQ answered 404 ``no queue 'amq.gen-...'``, which failed every test."""

from __future__ import annotations

import asyncio

import aio_pika
import pytest
from aio_pika.patterns import RPC

from tests.braid_process import BraidProcess

DEADLINE_S = 60


async def answer(*, foo: object, bar: object) -> dict[str, str]:
    assert not foo
    assert not bar
    return {"foo": "bar"}


async def test_rpc_objects_made_and_closed_on_one_channel(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        async with asyncio.timeout(DEADLINE_S):
            for _ in range(3):
                rpc = await RPC.create(channel, auto_delete=True)
                await rpc.register("test.rpc", answer, auto_delete=True)
                assert await rpc.proxy.test.rpc(foo=None, bar=None) == {"foo": "bar"}
                with pytest.raises(AssertionError):  # the remote side's error comes back
                    await rpc.proxy.test.rpc(foo=True, bar=None)
                await rpc.unregister(answer)
                await rpc.close()
                await rpc.close()  # closing a closed one is fine
        # The channel survived all of it.
        assert not channel.is_closed
        await channel.declare_queue(exclusive=True)


async def test_two_rpc_objects_share_one_channel(braid: BraidProcess) -> None:
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        async with asyncio.timeout(DEADLINE_S):
            server = await RPC.create(channel, auto_delete=True)
            await server.register("test.shared", answer, auto_delete=True)
            client = await RPC.create(channel, auto_delete=True)
            assert await client.proxy.test.shared(foo=None, bar=None) == {"foo": "bar"}
            await client.close()
            assert await server.proxy.test.shared(foo=None, bar=None) == {"foo": "bar"}
            await server.unregister(answer)
            await server.close()
        assert not channel.is_closed


async def test_a_call_that_expires_comes_back_as_a_timeout(braid: BraidProcess) -> None:
    """aio-pika's test_timed_out: the call expires unconsumed in a queue whose dead-letter
    exchange is rpc.dlx, a headers exchange; the dead letter reaches the caller's reply queue
    through its binding on the call's ``From`` header, and the call raises TimeoutError.
    (Dead letters used to be routed by routing key only: the call waited forever.)"""
    async with await aio_pika.connect(braid.amqp_url) as connection:
        channel = await connection.channel()
        rpc = await RPC.create(channel, auto_delete=True)
        await channel.declare_queue(
            "test.timed_out", auto_delete=True, arguments={"x-dead-letter-exchange": RPC.DLX_NAME}
        )
        async with asyncio.timeout(DEADLINE_S):
            with pytest.raises(asyncio.TimeoutError):
                await rpc.call("test.timed_out", expiration=1)
        await rpc.close()
