"""An AMQP queue consumed through a node that does not own it (docs/cluster.md section 8, AMQP):
two in-process nodes over the two shards of a root, each a real Node with a real AMQP listener
(tests/amqp/inprocess.py); node B owns shard 1 and answers ``Consume``, ``Get`` and the queue
``Admin`` calls on a real gRPC server (core/cluster/remote_queues.py:serve_remote_queues); node
A's Broker API reaches it through ``RemoteQueuesOverRpc`` over a real RpcClient. Real clients:
aio-pika, and pika (for the server's basic.cancel). Every queue here is placed in shard 1, so it
lives on B: published there, consumed and read with basic.get from A, checked in B's ack queue.

The ownership table is a fixed one (``FixedOwners``): which node owns a shard is not what these
tests are about (the Redis one is the cluster node's).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import aio_pika
import pika
import pytest
from aio_pika.abc import AbstractIncomingMessage

from core.broker import Node
from core.broker.remote import OwnerAddress
from core.cluster.placement import partition_shard
from core.cluster.remote_queues import RemoteQueuesOverRpc, serve_remote_queues
from core.cluster.rpc import NodeService, RpcClient, RpcServer, RpcSettings
from core.delivery import AckQueue
from core.log import LogConfig, LogStore
from tests.amqp.inprocess import ServerUnderTest

SECRET = "braid-test-secret"
SHARDS = 2
OWNER_SHARD = 1  # node B's
# Waits only: a test that hangs fails here instead of at pytest's 300 s.
DEADLINE_S = 10.0
# How long a consumer is watched for a delivery it must not get.
QUIET_S = 0.3


def queue_on_b(prefix: str) -> str:
    """An AMQP queue name whose topic (``amq.queue.<name>``) is placed in node B's shard."""
    return next(
        name
        for name in (f"{prefix}{number}" for number in range(1000))
        if partition_shard(f"amq.queue.{name}", 0, SHARDS) == OWNER_SHARD
    )


class FixedOwners:
    """``ShardOwners`` over a table that does not change."""

    def __init__(self, table: dict[int, OwnerAddress]) -> None:
        self._table = table

    def owner_of(self, shard: int) -> OwnerAddress | None:
        return self._table.get(shard)

    async def refresh(self, shard: int) -> OwnerAddress | None:
        return self._table.get(shard)


@dataclass
class TwoNodes:
    a: ServerUnderTest  # serves shard 0: its clients reach B's queues remotely
    b: ServerUnderTest  # serves shard 1

    @staticmethod
    def url(server: ServerUnderTest) -> str:
        assert server.address is not None
        host, port = server.address
        return f"amqp://guest:guest@{host}:{port}/"

    def owner_queue(self, name: str) -> AckQueue:
        queue = self.b.broker.ack_queue(f"amq.queue.{name}")
        assert queue is not None
        return queue


@pytest.fixture
async def nodes(tmp_path: Path) -> AsyncIterator[TwoNodes]:
    stores = [
        LogStore(LogConfig(tmp_path / f"{number:04d}", segment_size=4 << 20))
        for number in range(SHARDS)
    ]
    node_a = Node([(0, stores[0])], shard_count=SHARDS)
    node_b = Node([(1, stores[1])], shard_count=SHARDS)
    await node_a.start()
    await node_b.start()
    settings = RpcSettings(secret=SECRET, heartbeat_ms=500)
    service = NodeService(2, 1)
    serve_remote_queues(service, node_b)
    rpc_server = RpcServer(settings, service)
    port = await rpc_server.start("127.0.0.1", 0)
    client = RpcClient(settings)
    remote = RemoteQueuesOverRpc(
        client, FixedOwners({OWNER_SHARD: OwnerAddress(2, f"127.0.0.1:{port}", 1)})
    )
    server_a = ServerUnderTest(node_a)
    server_a.api.set_remote_queues(remote)
    server_b = ServerUnderTest(node_b)
    await server_a.start("127.0.0.1", 0)
    await server_b.start("127.0.0.1", 0)
    try:
        yield TwoNodes(server_a, server_b)
    finally:
        await server_a.close()
        await server_b.close()
        await remote.close()
        await client.close()
        await rpc_server.stop(grace_s=0)
        for node in (node_a, node_b):
            await node.close()
        for store in stores:
            await store.aclose()


async def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def publish(server: ServerUnderTest, name: str, bodies: list[bytes]) -> None:
    """Declare ``name`` (durable) on ``server`` and publish ``bodies`` to it, confirmed."""
    connection = await aio_pika.connect(TwoNodes.url(server))
    async with connection:
        channel = await connection.channel()
        await channel.declare_queue(name, durable=True)
        for body in bodies:
            await channel.default_exchange.publish(aio_pika.Message(body), routing_key=name)


async def next_of(inbox: asyncio.Queue[AbstractIncomingMessage]) -> AbstractIncomingMessage:
    async with asyncio.timeout(DEADLINE_S):
        return await inbox.get()


async def quiet(inbox: asyncio.Queue[AbstractIncomingMessage]) -> None:
    """Nothing more arrives for a while."""
    await asyncio.sleep(QUIET_S)
    assert inbox.empty(), f"{inbox.qsize()} deliveries past the limit"


def numbered(prefix: str, count: int) -> list[bytes]:
    return [f"{prefix}{number}".encode() for number in range(count)]


async def test_a_remote_queue_is_consumed_under_its_prefetch(nodes: TwoNodes) -> None:
    name = queue_on_b("work")
    sent = numbered("m", 30)
    await publish(nodes.b, name, sent)
    owner = nodes.owner_queue(name)
    assert owner.message_count() == 30
    connection = await aio_pika.connect(TwoNodes.url(nodes.a))
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(name, durable=True)
        assert queue.declaration_result.message_count == 30  # the owner's count
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(inbox.put)

        # Ten, and no more, until some are acked: the owner holds them unacked.
        first = [await next_of(inbox) for _ in range(10)]
        await quiet(inbox)
        assert (owner.unacked_count(), owner.message_count(), len(owner.consumers)) == (10, 20, 1)

        # basic.qos after the consume: a channel-wide limit of 5 holds back the next ones
        # until the ten are acked (multiple), then lets five through.
        await channel.set_qos(prefetch_count=5, global_=True)
        await first[-1].ack(multiple=True)
        second = [await next_of(inbox) for _ in range(5)]
        await quiet(inbox)
        await wait_until(lambda: owner.unacked_count() == 5, "the owner to hold five unacked")

        # The rest, acked one by one: never more than five unacked on the owner.
        received = first + second
        for message in second:
            await message.ack()
        most = 0
        while len(received) < 30:
            message = await next_of(inbox)
            most = max(most, owner.unacked_count())
            received.append(message)
            await message.ack()
        assert most <= 5
        assert [message.body for message in received] == sent
        assert not any(message.redelivered for message in received)
        await wait_until(
            lambda: owner.unacked_count() == 0 and owner.message_count() == 0,
            "every ack on the owner",
        )
    # The connection closed: the owner's consumer went with the stream.
    await wait_until(lambda: not owner.consumers, "the remote consumer to go")


async def test_nack_requeues_flagged_and_a_reject_dead_letters_on_the_owner(
    nodes: TwoNodes,
) -> None:
    name, dead = queue_on_b("poison"), queue_on_b("dead")
    arguments: dict[str, object] = {
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead,
    }
    connection_b = await aio_pika.connect(TwoNodes.url(nodes.b))
    async with connection_b:
        channel_b = await connection_b.channel()
        await channel_b.declare_queue(dead, durable=True)
        await channel_b.declare_queue(name, durable=True, arguments=arguments)
        await channel_b.default_exchange.publish(aio_pika.Message(b"bad"), routing_key=name)

        connection_a = await aio_pika.connect(TwoNodes.url(nodes.a))
        async with connection_a:
            channel = await connection_a.channel()
            await channel.set_qos(prefetch_count=10)
            queue = await channel.declare_queue(name, durable=True, arguments=arguments)
            inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
            await queue.consume(inbox.put)
            message = await next_of(inbox)
            assert (message.body, message.redelivered) == (b"bad", False)
            await message.nack(requeue=True)
            again = await next_of(inbox)
            assert (again.body, again.redelivered) == (b"bad", True)
            await again.reject(requeue=False)
            dead_queue = nodes.owner_queue(dead)
            await wait_until(lambda: dead_queue.message_count() == 1, "the dead letter")
            assert nodes.owner_queue(name).message_count() == 0

        # Read from the dead-letter queue on the owner: x-death says where it came from.
        lettered = await (await channel_b.get_queue(dead)).get(no_ack=True, timeout=DEADLINE_S)
        assert lettered is not None
        assert lettered.body == b"bad"
        deaths = lettered.headers["x-death"]
        assert isinstance(deaths, list)
        death = deaths[0]
        assert isinstance(death, dict)
        assert (death["queue"], death["reason"]) == (name, "rejected")


async def test_a_closed_channel_gives_its_unacked_to_the_next_consumer(nodes: TwoNodes) -> None:
    name = queue_on_b("handover")
    sent = numbered("h", 20)
    await publish(nodes.b, name, sent)
    owner = nodes.owner_queue(name)
    connection = await aio_pika.connect(TwoNodes.url(nodes.a))
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=10)
        queue = await channel.declare_queue(name, durable=True)
        inbox: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        await queue.consume(inbox.put)
        taken = [await next_of(inbox) for _ in range(10)]
        assert [message.body for message in taken] == sent[:10]
        await channel.close()  # unacked: back to the owner's queue, redelivered
        await wait_until(
            lambda: owner.unacked_count() == 0 and owner.message_count() == 20,
            "the ten back on the owner",
        )

        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)
        inbox = asyncio.Queue()
        await queue.consume(inbox.put)
        received = [await next_of(inbox) for _ in range(20)]
        for message in received:
            await message.ack()
        redelivered = {message.body for message in received if message.redelivered}
        assert redelivered == set(sent[:10])
        assert sorted(message.body for message in received) == sorted(sent)
        await wait_until(
            lambda: owner.unacked_count() == 0 and owner.message_count() == 0,
            "every ack on the owner",
        )


async def test_basic_get_on_a_remote_queue(nodes: TwoNodes) -> None:
    name = queue_on_b("polled")
    sent = numbered("g", 3)
    await publish(nodes.b, name, sent)
    owner = nodes.owner_queue(name)
    connection = await aio_pika.connect(TwoNodes.url(nodes.a))
    async with connection:
        channel = await connection.channel()
        queue = await channel.declare_queue(name, durable=True)

        async def get(*, no_ack: bool) -> AbstractIncomingMessage:
            """basic.get until one comes (the first may answer get-empty: module of the API)."""
            deadline = time.monotonic() + DEADLINE_S
            while True:
                message = await queue.get(no_ack=no_ack, fail=False)
                if message is not None:
                    return message
                assert time.monotonic() < deadline, "basic.get never answered a message"
                await asyncio.sleep(0.02)

        got = []
        for _ in sent:
            message = await get(no_ack=False)
            got.append(message)
            await message.ack()
        assert [message.body for message in got] == sent
        assert not any(message.redelivered for message in got)
        await wait_until(
            lambda: owner.unacked_count() == 0 and owner.message_count() == 0,
            "every get acked on the owner",
        )

        # A nack with requeue puts it back, flagged; no_ack takes it for good.
        await publish(nodes.b, name, [b"last"])
        message = await get(no_ack=False)
        assert message.body == b"last"
        await message.nack(requeue=True)
        message = await get(no_ack=True)
        assert (message.body, message.redelivered) == (b"last", True)
        await wait_until(
            lambda: owner.unacked_count() == 0 and owner.message_count() == 0,
            "the no_ack get settled on the owner",
        )


async def test_a_queue_deleted_on_its_owner_cancels_the_remote_consumer(nodes: TwoNodes) -> None:
    name = queue_on_b("doomed")
    await publish(nodes.b, name, [])
    owner = nodes.owner_queue(name)
    consuming = threading.Event()

    def consume_until_cancelled() -> tuple[str, list[str]]:
        """A pika consumer on node A: the consumer tags the server cancelled."""
        connection = pika.BlockingConnection(pika.URLParameters(TwoNodes.url(nodes.a)))
        try:
            channel = connection.channel()
            cancelled: list[str] = []
            channel.add_on_cancel_callback(
                lambda frame: cancelled.append(frame.method.consumer_tag)
            )
            channel.queue_declare(name, durable=True)
            tag = channel.basic_consume(name, lambda *_: None)
            consuming.set()
            deadline = time.monotonic() + DEADLINE_S
            while not cancelled and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.05)
            return tag, cancelled
        finally:
            connection.close()

    consumer = asyncio.ensure_future(asyncio.to_thread(consume_until_cancelled))
    await wait_until(consuming.is_set, "the consumer on node A")
    await wait_until(lambda: len(owner.consumers) == 1, "the remote consumer on the owner")
    connection_b = await aio_pika.connect(TwoNodes.url(nodes.b))
    async with connection_b:
        channel_b = await connection_b.channel()
        await channel_b.queue_delete(name)
    tag, cancelled = await consumer
    assert cancelled == [tag]
