"""Ack-queue semantics: prefetch, competing consumers, acks, nacks, redelivery, TTL, restarts."""

from __future__ import annotations

import asyncio
import contextlib
import time

from core.delivery import AckQueueConfig, Delivery
from core.log import TagFilter

from .conftest import close_broker


class Collector:
    def __init__(self) -> None:
        self.got: list[Delivery] = []
        self.event = asyncio.Event()

    def __call__(self, delivery: Delivery) -> None:
        self.got.append(delivery)
        self.event.set()

    async def wait_for(self, n: int, timeout: float = 2.0) -> list[Delivery]:
        deadline = time.monotonic() + timeout
        while len(self.got) < n:
            self.event.clear()
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"only {len(self.got)} of {n} deliveries"
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.event.wait(), remaining)
        return self.got

    @property
    def bodies(self) -> list[bytes]:
        return [d.message.body for d in self.got]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def publish_n(broker, topic, n, **kw):
    for i in range(n):
        await broker.publish(topic, f"m{i}".encode(), **kw)


async def test_prefetch_limits_in_flight_and_acks_release_more(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("jobs")
    await publish_n(broker, "jobs", 10)
    collector = Collector()
    queue.add_consumer("c1", 3, collector)
    await settle()
    assert collector.bodies == [b"m0", b"m1", b"m2"]
    assert queue.unacked_count() == 3
    collector.got[0].ack()
    await settle()
    assert len(collector.got) == 4
    consumer = collector.got[0].consumer
    # Cumulative ack (AMQP multiple=true): everything up to offset 3.
    assert queue.ack_upto(consumer, 3) == 3
    await settle()
    assert len(collector.got) == 7
    assert queue.cursor == 4


async def test_competing_consumers_share_round_robin(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("work")
    a, b = Collector(), Collector()
    queue.add_consumer("a", 0, a)
    queue.add_consumer("b", 0, b)
    await publish_n(broker, "work", 10)
    await settle()
    assert len(a.got) + len(b.got) == 10
    assert abs(len(a.got) - len(b.got)) <= 2
    assert set(a.bodies).isdisjoint(b.bodies)


async def test_single_active_consumer(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("sac", 0, AckQueueConfig(single_active_consumer=True))
    a, b = Collector(), Collector()
    consumer_a = queue.add_consumer("a", 0, a)
    queue.add_consumer("b", 0, b)
    await publish_n(broker, "sac", 4)
    await settle()
    assert len(a.got) == 4
    assert b.got == []
    a.got[0].ack()
    queue.remove_consumer(consumer_a)  # three unacked go back, to b, in order
    await settle()
    assert b.bodies == [b"m1", b"m2", b"m3"]
    assert all(d.redelivered for d in b.got)
    assert [d.delivery_count for d in b.got] == [2, 2, 2]


async def test_nack_requeue_redelivers_first_and_reject_dead_letters(broker_factory):
    broker = broker_factory()
    dead = []
    broker.shard.dead_letter_hook = lambda q, m, reason: dead.append((m.body, reason))
    queue, _ = await broker.declare_ack_queue("n")
    await publish_n(broker, "n", 3)
    c = Collector()
    queue.add_consumer("c", 1, c)
    await c.wait_for(1)
    c.got[0].nack(requeue=True)
    await c.wait_for(2)
    assert c.got[1].message.body == b"m0"
    assert c.got[1].redelivered
    assert c.got[1].delivery_count == 2
    c.got[1].nack(requeue=False)
    await c.wait_for(3)
    assert dead == [(b"m0", "rejected")]
    assert c.got[2].message.body == b"m1"
    assert not c.got[2].redelivered


async def test_delivery_limit_dead_letters(broker_factory):
    broker = broker_factory()
    dead = []
    broker.shard.dead_letter_hook = lambda q, m, reason: dead.append((m.body, reason))
    queue, _ = await broker.declare_ack_queue("limited", 0, AckQueueConfig(delivery_limit=2))
    await broker.publish("limited", b"poison")
    c = Collector()
    queue.add_consumer("c", 1, c)
    for attempt in range(3):
        await c.wait_for(attempt + 1)
        c.got[-1].nack(requeue=True)
    await settle()
    assert [d.delivery_count for d in c.got] == [1, 2, 3]
    assert dead == [(b"poison", "delivery_limit")]


async def test_message_ttl_and_per_message_expiry(broker_factory):
    broker = broker_factory()
    dead = []
    broker.shard.dead_letter_hook = lambda q, m, reason: dead.append((m.body, reason))
    queue, _ = await broker.declare_ack_queue("ttl", 0, AckQueueConfig(message_ttl_ms=50))
    await broker.publish("ttl", b"old")
    await asyncio.sleep(0.08)
    await broker.publish("ttl", b"fresh")
    now = time.time_ns() // 1_000_000
    await broker.publish(
        "ttl", b"expired-header", headers=[("x-braid-expires-at", str(now - 1).encode())]
    )
    c = Collector()
    queue.add_consumer("c", 0, c)
    await c.wait_for(1)
    await settle()
    assert c.bodies == [b"fresh"]
    assert sorted(dead) == [(b"expired-header", "expired"), (b"old", "expired")]


async def test_get_and_purge(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("g")
    await publish_n(broker, "g", 5)
    first = queue.get(no_ack=True)
    assert first.message.body == b"m0"
    second = queue.get(no_ack=False)
    assert second.message.body == b"m1"
    assert queue.message_count() == 3
    assert queue.purge() == 3
    assert queue.message_count() == 0
    assert queue.get(no_ack=True) is None
    second.ack()
    assert queue.cursor == 5


async def test_tag_filtered_queue(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue(
        "t", 0, AckQueueConfig(tag_filter=TagFilter(["A", "B"]))
    )
    for i, tag in enumerate(["A", "C", "B", "C", "C", "A"]):
        await broker.publish("t", str(i).encode(), tags=[tag])
    c = Collector()
    queue.add_consumer("c", 0, c)
    await c.wait_for(3)
    assert c.bodies == [b"0", b"2", b"5"]
    for d in c.got:
        d.ack()
    assert queue.cursor == 6


async def test_ack_state_survives_restart(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("durable")
    await publish_n(broker, "durable", 6)
    c = Collector()
    queue.add_consumer("c", 0, c)
    await c.wait_for(6)
    for index in (0, 1, 3):
        c.got[index].ack()
    await close_broker(broker)
    reopened = broker_factory()
    queue = reopened.ack_queue("durable")
    assert queue.cursor == 2
    c2 = Collector()
    queue.add_consumer("c", 0, c2)
    await c2.wait_for(3)
    await settle()
    assert c2.bodies == [b"m2", b"m4", b"m5"]
    assert all(d.redelivered for d in c2.got)
    await reopened.publish("durable", b"new")
    await c2.wait_for(4)
    assert c2.got[3].message.body == b"new"
    assert not c2.got[3].redelivered


async def test_ack_state_writes_are_batched(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("batched")
    await publish_n(broker, "batched", 200)
    c = Collector()
    queue.add_consumer("c", 0, c)
    await c.wait_for(200)
    before = broker.shard.store.queue_bounds("__acks", 0)[1]
    for d in c.got:
        d.ack()
    assert broker.shard.flush_ack_states() == 1
    after = broker.shard.store.queue_bounds("__acks", 0)[1]
    assert after - before == 1  # 200 acks, one state record


async def test_offset_groups_commit_and_fetch_durably(broker_factory):
    broker = broker_factory()
    offsets = broker.shard.offsets
    await offsets.commit("g1", [("orders", 0, 42, 3, "meta"), ("orders", 1, 7, -1, "")])
    await broker.shard.offsets.commit("g1", [("orders", 0, 50, 3, "")])
    assert broker.shard.offsets.fetch("g1", "orders", 0).offset == 50
    await close_broker(broker)
    reopened = broker_factory()
    assert reopened.shard.offsets.fetch("g1", "orders", 0).offset == 50
    assert reopened.shard.offsets.fetch("g1", "orders", 1).offset == 7
    assert reopened.shard.offsets.fetch("g2", "orders", 0) is None
    assert reopened.shard.offsets.groups() == ["g1"]


async def test_long_poll_wakes_on_append(broker_factory):
    broker = broker_factory()
    await broker.declare_topic("lp")
    waiter = asyncio.create_task(broker.wait_for_records([("lp", 0)], 5))
    await asyncio.sleep(0.01)
    await broker.publish("lp", b"x")
    assert await asyncio.wait_for(waiter, 1) is True
    assert await broker.wait_for_records([("lp", 0)], 0.02) is False


async def test_backpressure_blocks_publishers_until_consumers_catch_up(broker_factory):
    broker = broker_factory(backlog_high_watermark=5)
    queue, _ = await broker.declare_ack_queue("bp")
    signals = []
    broker.flow.add_listener(lambda blocked, reason: signals.append(blocked))
    c = Collector()
    consumer = queue.add_consumer("c", 1, c)
    await publish_n(broker, "bp", 10)
    broker.check_flow()
    assert broker.flow.blocked
    publisher = asyncio.create_task(broker.publish("bp", b"late"))
    await asyncio.sleep(0.05)
    assert not publisher.done()  # slowed, not dropped
    for _ in range(8):
        await c.wait_for(len(c.got))
        c.got[-1].ack()
        await settle()
    broker.check_flow()
    await asyncio.wait_for(publisher, 1)
    assert signals == [True, False]
    assert consumer.inflight == 1


async def test_retention_keeps_segments_owed_to_an_ack_queue(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("owed")
    broker.shard.store.config.retention_bytes = 2 * broker.shard.store.commitlog.segment_size
    body = b"x" * 4000
    for _ in range(300):
        await broker.publish("owed", body)
    c = Collector()
    queue.add_consumer("c", 0, c)
    await c.wait_for(300)
    assert broker.shard.store.enforce_retention() == []  # everything still owed
    for d in c.got[:200]:
        d.ack()
    broker.shard.flush_ack_states()
    deleted = broker.shard.store.enforce_retention()
    assert deleted
    owed = queue.owed_from_position()
    assert all(start + broker.shard.store.commitlog.segment_size <= owed for start in deleted)


async def test_removing_a_consumer_twice_is_harmless(broker_factory):
    broker = broker_factory()
    queue, _ = await broker.declare_ack_queue("twice")
    consumer = queue.add_consumer("c", 0, Collector())
    assert queue.remove_consumer(consumer) == 0
    assert queue.remove_consumer(consumer) == 0
