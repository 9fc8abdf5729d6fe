"""Dead letters and retries move records as LINKs, with x-death headers."""

from __future__ import annotations

import asyncio
import json

from core.deadletter import DeadLetterPolicy, dlq_topic_for_group
from core.delivery import AckQueueConfig
from core.log import names
from core.log.store import now_ms

from .test_ack_queues import Collector, settle


async def test_reject_without_requeue_goes_to_dead_letter_exchange(broker_factory):
    broker = broker_factory()
    await broker.declare_topic("dlx")
    dead_queue, _ = await broker.declare_ack_queue("dead", 0)
    await broker.bind("dlx", "topic", "failed.#", ("dead", 0))
    policy = DeadLetterPolicy(dead_letter_topic="dlx", dead_letter_subject="failed.orders")
    work, _ = await broker.declare_ack_queue("work", 0, AckQueueConfig(dead_letter=policy))
    position = (
        await broker.publish("work", b"order-1", headers=[("h", b"v")], subject="o")
    ).appended.position
    c = Collector()
    work.add_consumer("c", 1, c)
    await c.wait_for(1)
    c.got[0].nack(requeue=False)
    d = Collector()
    dead_queue.add_consumer("d", 0, d)
    await d.wait_for(1)
    message = d.got[0].message
    assert message.body == b"order-1"
    assert message.header("h") == b"v"
    (death,) = json.loads(message.header("x-death"))
    assert death["queue"] == "work"
    assert death["reason"] == "rejected"
    assert death["count"] == 1
    assert death["routing-keys"] == ["o"]
    assert message.header("x-first-death-reason") == b"rejected"
    # Moved by index entry: the DLX stream and the queue point at a LINK to the same body.
    (on_dlx,) = broker.shard.store.read("dlx", 0, 0)
    assert on_dlx.record().body == b"order-1"
    assert broker.shard.store.commitlog.write_position - position < 2000


async def test_ttl_expiry_dead_letters_and_automatic_cycles_are_cut(broker_factory):
    broker = broker_factory()
    await broker.declare_topic("dlx")
    policy = DeadLetterPolicy(dead_letter_topic="dlx")
    config = AckQueueConfig(message_ttl_ms=10, dead_letter=policy)
    first, _ = await broker.declare_ack_queue("first", 0, config)
    await broker.bind("dlx", "fanout", "", ("first", 0))  # dead letters cycle back into "first"
    await broker.publish("first", b"m", subject="k")
    await asyncio.sleep(0.03)
    c = Collector()
    consumer = first.add_consumer("c", 0, c)
    await settle()
    # Expired once: on dlx, and back in "first" with TTL counted from its new entry, where the
    # consumer got it in time.
    assert [d.message.body for d in c.got] == [b"m"]
    first.remove_consumer(consumer)
    (entry,) = broker.shard.store.read("dlx", 0, 0)
    deaths = json.loads(dict(entry.record().headers)["x-death"])
    assert deaths[0]["reason"] == "expired"
    assert deaths[0]["count"] == 1
    assert broker.metrics["dead_lettered"] == 1
    await asyncio.sleep(0.03)
    late = Collector()
    first.add_consumer("late", 0, late)
    await settle()
    # Expired again in the same queue with no rejection: RabbitMQ drops it.
    assert broker.metrics["dropped"] == 1
    assert len(broker.shard.store.read("dlx", 0, 0, max_records=10)) == 1
    assert late.got == []


async def test_retry_schedule_then_group_dlq(broker_factory):
    broker = broker_factory()
    group_dlq = dlq_topic_for_group("billing")
    policy = DeadLetterPolicy(dead_letter_topic=group_dlq, retry_delays_ms=(50, 100))
    queue, _ = await broker.declare_ack_queue("billing-in", 0, AckQueueConfig(dead_letter=policy))
    await broker.publish("billing-in", b"charge")
    c = Collector()
    queue.add_consumer("c", 1, c)
    for attempt in range(3):
        await c.wait_for(attempt + 1)
        delivery = c.got[-1]
        assert delivery.message.header("x-braid-retry-count") == (
            str(attempt).encode() if attempt else None
        )
        nacked_at = now_ms()
        delivery.nack(requeue=False)
        if attempt < 2:
            # A delayed LINK waits in __timers; fire it as the timer service would.
            timers = broker.shard.store.read(names.TIMERS_TOPIC, 0, 0, max_records=100)
            assert len(timers) == attempt + 1
            # Due the retry delay after the failure (the LINK's own store_ms may be a ms later).
            delay = (50, 100)[attempt]
            assert nacked_at + delay <= timers[-1].record().deliver_at_ms <= now_ms() + delay
            broker.shard.store.link([timers[-1].position])
    assert broker.metrics["retried"] == 2
    assert broker.metrics["dead_lettered"] == 1
    (dead,) = broker.shard.store.read(group_dlq, 0, 0)
    assert dead.record().body == b"charge"


async def test_dead_letter_policy_is_durable(broker_factory):
    from .conftest import close_broker

    broker = broker_factory()
    policy = DeadLetterPolicy(
        dead_letter_topic="dlx", dead_letter_subject="rk", retry_delays_ms=(5,)
    )
    await broker.declare_ack_queue("q", 0, AckQueueConfig(dead_letter=policy))
    await close_broker(broker)
    reopened = broker_factory()
    assert reopened.ack_queue("q").config.dead_letter == policy
