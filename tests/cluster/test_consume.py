"""Consume and Get over real loopback gRPC (core/cluster/rpc/consume.py, remote_queue.py): the
owner is a real single-node broker core (a Node over a LogStore in a tmp dir) whose
ConsumeService is plugged into a real RpcServer; the consumer a RemoteConsumer on an RpcClient.
Credit bounds what is unsettled, acks remove, nacks redeliver flagged and counted, rejects drop
or dead-letter, a stream that ends or breaks gives its deliveries to the next consumer, the
queue's deletion cancels, basic.get works on empty and full queues, unknown queues are
NOT_FOUND."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from grpc import aio

from core.broker import Node
from core.cluster.rpc import NodeService, RpcClient, RpcServer, RpcSettings
from core.cluster.rpc import cluster_pb2 as pb
from core.cluster.rpc.consume import REASON_QUEUE_DELETED, ConsumeService
from core.cluster.rpc.remote_queue import (
    RemoteConsumer,
    RemoteDelivery,
    remote_get,
    settle_gets,
)
from core.deadletter.policy import DeadLetterPolicy
from core.delivery import AckQueue, AckQueueConfig
from core.log import record as rec
from tests.core.conftest import close_broker, open_broker

SECRET = "braid-test-secret"
# Waits only: a test that hangs fails here instead of at pytest's 300 s.
DEADLINE_S = 10.0
QUEUE = "amq.queue.jobs"


class Owner:
    """The queue's owner: a broker core and its Consume/Get service on a gRPC server."""

    def __init__(self, node: Node, service: ConsumeService, server: RpcServer) -> None:
        self.node = node
        self.service = service
        self.server = server
        self.address = f"127.0.0.1:{server.port}"

    def queue(self, name: str = QUEUE) -> AckQueue:
        queue = self.node.ack_queue(name)
        assert queue is not None
        return queue

    async def publish(self, count: int, name: str = QUEUE) -> None:
        for i in range(count):
            await self.node.publish(name, f"m{i}".encode(), subject="jobs")


@pytest.fixture
async def owner(tmp_path: Path) -> AsyncIterator[Owner]:
    node = open_broker(tmp_path / "data")
    await node.declare_ack_queue(QUEUE)
    service = ConsumeService(node)
    node_service = NodeService(1, 1)
    node_service.consume = service.consume
    node_service.get = service.get
    server = RpcServer(RpcSettings(secret=SECRET, heartbeat_ms=500), node_service)
    await server.start("127.0.0.1", 0)
    yield Owner(node, service, server)
    await server.stop(grace_s=0)
    await close_broker(node)


@pytest.fixture
async def client() -> AsyncIterator[RpcClient]:
    rpc = RpcClient(RpcSettings(secret=SECRET, heartbeat_ms=500))
    yield rpc
    await rpc.close()


async def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def take(consumer: RemoteConsumer, count: int) -> list[RemoteDelivery]:
    got: list[RemoteDelivery] = []
    async with asyncio.timeout(DEADLINE_S):
        async for delivery in consumer:
            got.append(delivery)
            if len(got) == count:
                break
    return got


def bodies(deliveries: list[RemoteDelivery]) -> list[bytes | None]:
    return [d.message.body for d in deliveries]


async def test_credit_bounds_unsettled_and_acks_remove(owner: Owner, client: RpcClient) -> None:
    await owner.publish(10)
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 3)
    first = await take(consumer, 3)
    assert bodies(first) == [b"m0", b"m1", b"m2"]
    assert [d.tag for d in first] == [1, 2, 3]
    # The owner's pump stopped at the credit: it would have handed out all 10 in one go.
    queue = owner.queue()
    assert queue.unacked_count() == 3
    assert consumer.inflight == 3
    consumer.ack(first[0].tag)
    (fourth,) = await take(consumer, 1)
    assert fourth.message.body == b"m3"
    assert queue.unacked_count() == 3
    # Cumulative ack (multiple): tags 2..4; three more come.
    consumer.ack(fourth.tag, multiple=True)
    assert consumer.inflight == 0
    more = await take(consumer, 3)
    assert bodies(more) == [b"m4", b"m5", b"m6"]
    consumer.ack(0, multiple=True)  # tag 0 with multiple: everything
    rest = await take(consumer, 3)
    for delivery in rest:
        consumer.ack(delivery.tag)
    await wait_until(lambda: queue.cursor == 10 and queue.unacked_count() == 0, "all acked")
    assert queue.message_count() == 0
    assert await consumer.detach() == 0
    await wait_until(lambda: not queue.consumers, "the consumer detached")


async def test_acks_of_one_turn_go_as_one_settle_and_one_credit(
    owner: Owner, client: RpcClient
) -> None:
    await owner.publish(60)
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 50)
    first = await take(consumer, 50)
    queue = owner.queue()
    await wait_until(lambda: consumer.requests_sent == 1, "the attach written")
    for delivery in first:  # one read of a gateway acking each delivery
        consumer.ack(delivery.tag)
    rest = await take(consumer, 10)
    assert bodies(rest) == [f"m{i}".encode() for i in range(50, 60)]
    await wait_until(lambda: queue.unacked_count() == 10, "the 50 acks settled")
    # One settle listing the 50 tags and one credit message, not 50 of each.
    assert consumer.requests_sent - 1 <= 2
    consumer.nack(rest[0].tag)  # a nack does not join an ack
    consumer.ack(rest[1].tag)
    consumer.ack(rest[2].tag)
    (again,) = await take(consumer, 1)
    assert (again.message.body, again.redelivered) == (b"m50", True)
    # 7 of the 10 left unsettled, and the nacked one again.
    await wait_until(lambda: queue.unacked_count() == 8, "the nack and two acks settled")
    assert queue.message_count() == 0
    assert await consumer.detach() == 8


async def test_the_record_arrives_whole(owner: Owner, client: RpcClient) -> None:
    headers = [("h1", b"v1"), ("h2", b"\x00\xff")]
    await owner.node.publish(
        QUEUE,
        b"payload",
        key=b"k",
        subject="orders.eu",
        headers=headers,
        protocol=rec.PROTOCOL_AMQP,
        client="pub-1",
        address="ex/orders.eu",
        born_ms=1234,
    )
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 1)
    (delivery,) = await take(consumer, 1)
    message = delivery.message
    assert (message.topic, message.subject, message.key, message.body) == (
        QUEUE,
        "orders.eu",
        b"k",
        b"payload",
    )
    assert message.headers == headers
    assert (message.protocol, message.client, message.address) == (
        rec.PROTOCOL_AMQP,
        "pub-1",
        "ex/orders.eu",
    )
    assert message.born_ms == 1234
    assert (delivery.topic, delivery.queue, delivery.offset) == (QUEUE, 0, 0)
    assert (delivery.redelivered, delivery.delivery_count) == (False, 1)
    await consumer.detach()


async def test_nack_requeue_redelivers_flagged_and_counted(owner: Owner, client: RpcClient) -> None:
    await owner.publish(1)
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 1)
    (first,) = await take(consumer, 1)
    consumer.nack(first.tag, requeue=True)
    (second,) = await take(consumer, 1)
    assert second.message.body == b"m0"
    assert (second.redelivered, second.delivery_count) == (True, 2)
    assert second.tag != first.tag
    consumer.reject(second.tag, requeue=True)
    (third,) = await take(consumer, 1)
    assert (third.redelivered, third.delivery_count) == (True, 3)
    consumer.ack(third.tag)
    await wait_until(lambda: owner.queue().cursor == 1, "the ack")
    await consumer.detach()


async def test_reject_without_requeue_drops_or_dead_letters(
    owner: Owner, client: RpcClient
) -> None:
    node = owner.node
    await node.declare_ack_queue("dlq")
    policy = DeadLetterPolicy(dead_letter_topic="dlq")
    await node.declare_ack_queue("amq.queue.dl", config=AckQueueConfig(dead_letter=policy))
    await owner.publish(1)
    await owner.publish(1, "amq.queue.dl")
    plain = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 1)
    (dropped,) = await take(plain, 1)
    plain.reject(dropped.tag, requeue=False)
    await wait_until(lambda: owner.queue().cursor == 1, "the reject")
    assert owner.queue().message_count() == 0
    dead = await RemoteConsumer.attach(client, owner.address, "amq.queue.dl", "c2", 1)
    (lettered,) = await take(dead, 1)
    dead.nack(lettered.tag, requeue=False)
    dlq = owner.queue("dlq")
    await wait_until(lambda: dlq.message_count() == 1, "the dead letter")
    assert owner.queue("amq.queue.dl").message_count() == 0
    letter = await remote_get(client, owner.address, "dlq", no_ack=True)
    assert letter is not None
    assert letter.message.body == b"m0"
    assert letter.message.header("x-death") is not None
    await plain.detach()
    await dead.detach()


async def test_a_stream_ended_gives_its_deliveries_to_the_next_consumer(
    owner: Owner, client: RpcClient
) -> None:
    await owner.publish(4)
    first = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 2)
    got = await take(first, 2)
    assert bodies(got) == [b"m0", b"m1"]
    assert await first.detach() == 2
    queue = owner.queue()
    await wait_until(lambda: not queue.consumers and queue.unacked_count() == 0, "detached")
    second = await RemoteConsumer.attach(client, owner.address, QUEUE, "c2", 4)
    again = await take(second, 4)
    assert bodies(again) == [b"m0", b"m1", b"m2", b"m3"]
    assert [(d.redelivered, d.delivery_count) for d in again] == [
        (True, 2),
        (True, 2),
        (False, 1),
        (False, 1),
    ]
    await second.detach()


async def test_a_stream_broken_gives_its_deliveries_back(owner: Owner) -> None:
    await owner.publish(2)
    settings = RpcSettings(secret=SECRET, heartbeat_ms=500)
    lost = RpcClient(settings)
    first = await RemoteConsumer.attach(lost, owner.address, QUEUE, "c1", 2)
    await take(first, 2)
    await lost.close(grace_s=None)  # the channel goes: the owner sees the call cancelled
    queue = owner.queue()
    await wait_until(lambda: not queue.consumers and queue.unacked_count() == 0, "detached")
    assert owner.service.consumers == 0
    other = RpcClient(settings)
    try:
        second = await RemoteConsumer.attach(other, owner.address, QUEUE, "c2", 2)
        again = await take(second, 2)
        assert bodies(again) == [b"m0", b"m1"]
        assert all(d.redelivered for d in again)
        await second.detach()
    finally:
        await other.close()
        await first.detach()


async def test_no_ack_consumer_takes_everything(owner: Owner, client: RpcClient) -> None:
    await owner.publish(600)  # more than the stream's window: credit must come back
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 0, no_ack=True)
    got = await take(consumer, 600)
    assert bodies(got) == [f"m{i}".encode() for i in range(600)]
    queue = owner.queue()
    assert queue.unacked_count() == 0
    assert queue.cursor == 600
    with pytest.raises(ValueError, match="no_ack"):
        consumer.ack(got[0].tag)
    await consumer.detach()


async def test_callback_deliveries_and_pause(owner: Owner, client: RpcClient) -> None:
    received: list[RemoteDelivery] = []
    arrived = asyncio.Event()

    def deliver(delivery: RemoteDelivery) -> None:
        received.append(delivery)
        arrived.set()

    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 5, deliver=deliver)
    consumer.pause()
    queue = owner.queue()
    await wait_until(lambda: queue.consumers[0].prefetch < 0, "the pause")
    await owner.publish(1)
    # The owner's pump, run now, hands nothing to a paused consumer (it would hand the record).
    assert queue.pump() == 0
    assert queue.unacked_count() == 0
    consumer.resume()
    async with asyncio.timeout(DEADLINE_S):
        await arrived.wait()
    assert bodies(received) == [b"m0"]
    consumer.ack(received[0].tag)
    await wait_until(lambda: queue.cursor == 1, "the ack")
    await consumer.detach()


async def test_unknown_tag_is_refused_on_both_sides(owner: Owner, client: RpcClient) -> None:
    await owner.publish(1)
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 1)
    (delivery,) = await take(consumer, 1)
    assert delivery.tag == 1
    with pytest.raises(ValueError, match="unknown delivery tag 99"):
        consumer.ack(99)
    await consumer.detach()
    # The owner's own check, with the client's bypassed: the stream fails, the delivery goes back.
    call = client.stub(owner.address).Consume()
    await call.write(
        pb.ConsumeControl(attach=pb.Attach(queue=QUEUE, consumer_tag="raw", prefetch=1))
    )
    async with asyncio.timeout(DEADLINE_S):
        assert not (await call.read()).deliveries  # the attach's confirmation
        (raw,) = (await call.read()).deliveries
        assert raw.redelivered
        await call.write(pb.ConsumeControl(settle=pb.Settle(op=pb.Settle.ACK, tags=[raw.tag + 1])))
        with pytest.raises(aio.AioRpcError) as failed:
            await call.read()
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "unknown delivery tag" in (failed.value.details() or "")
    queue = owner.queue()
    await wait_until(lambda: not queue.consumers and queue.unacked_count() == 0, "detached")


async def test_queue_deleted_cancels(owner: Owner, client: RpcClient) -> None:
    reasons: list[str] = []
    consumer = await RemoteConsumer.attach(
        client, owner.address, QUEUE, "c1", 1, on_cancel=reasons.append
    )
    assert await owner.node.delete_ack_queue(QUEUE) is not None
    await wait_until(lambda: consumer.cancelled, "the cancel")
    assert reasons == [REASON_QUEUE_DELETED]
    assert consumer.cancel_reason == REASON_QUEUE_DELETED
    async with asyncio.timeout(DEADLINE_S):
        assert [d async for d in consumer] == []
    assert owner.service.consumers == 0
    await consumer.detach()


async def test_service_cancel_ends_consumers(owner: Owner, client: RpcClient) -> None:
    consumer = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 1)
    assert owner.service.cancel(None, "shard moved") == 1
    await wait_until(lambda: consumer.cancelled, "the cancel")
    assert consumer.cancel_reason == "shard moved"
    await consumer.detach()


async def test_exclusive_consumer(owner: Owner, client: RpcClient) -> None:
    first = await RemoteConsumer.attach(client, owner.address, QUEUE, "c1", 1, exclusive=True)
    with pytest.raises(aio.AioRpcError) as refused:
        await RemoteConsumer.attach(client, owner.address, QUEUE, "c2", 1)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await first.detach()
    other = await RemoteConsumer.attach(client, owner.address, QUEUE, "c3", 1)
    with pytest.raises(aio.AioRpcError) as busy:
        await RemoteConsumer.attach(client, owner.address, QUEUE, "c4", 1, exclusive=True)
    assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    await other.detach()


async def test_get(owner: Owner, client: RpcClient) -> None:
    assert await remote_get(client, owner.address, QUEUE, no_ack=False) is None
    await owner.publish(3)
    queue = owner.queue()
    got = await remote_get(client, owner.address, QUEUE, no_ack=False, client_id="conn-1")
    assert got is not None
    assert got.message.body == b"m0"
    assert queue.unacked_count() == 1
    await settle_gets(client, owner.address, [got.tag], op=pb.Settle.NACK, requeue=True)
    again = await remote_get(client, owner.address, QUEUE, no_ack=False, client_id="conn-1")
    assert again is not None
    assert (again.message.body, again.redelivered, again.delivery_count) == (b"m0", True, 2)
    await settle_gets(client, owner.address, [again.tag])
    assert queue.cursor == 1
    with pytest.raises(aio.AioRpcError) as unknown:
        await settle_gets(client, owner.address, [again.tag])
    assert unknown.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    free = await remote_get(client, owner.address, QUEUE, no_ack=True)
    assert free is not None
    assert free.message.body == b"m1"
    held = await remote_get(client, owner.address, QUEUE, no_ack=False, client_id="conn-2")
    assert held is not None
    assert queue.unacked_count() == 1
    assert owner.service.release_gets("conn-2") == 1
    assert queue.unacked_count() == 0
    assert queue.message_count() == 1


async def test_unknown_queue_is_not_found(owner: Owner, client: RpcClient) -> None:
    with pytest.raises(aio.AioRpcError) as consume:
        await RemoteConsumer.attach(client, owner.address, "amq.queue.nope", "c1", 1)
    assert consume.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(aio.AioRpcError) as get:
        await remote_get(client, owner.address, "amq.queue.nope", no_ack=True)
    assert get.value.code() == grpc.StatusCode.NOT_FOUND
