"""Node publish → routing → ack queues, over a real log directory."""

from __future__ import annotations

import asyncio

import pytest

from core.broker import EXCHANGE_QUEUE
from core.broker.topics import TopicError
from core.delivery import AckQueueConfig, Delivery
from core.delivery.ackqueue import OVERFLOW_REJECT_PUBLISH

from .conftest import close_broker


async def drain(queue, n, prefetch=0, timeout=2.0):
    got: list[Delivery] = []
    done = asyncio.Event()

    def deliver(delivery: Delivery) -> None:
        got.append(delivery)
        if len(got) >= n:
            done.set()

    consumer = queue.add_consumer(f"c{id(got)}", prefetch, deliver)
    await asyncio.wait_for(done.wait(), timeout)
    return consumer, got


async def test_topic_exchange_routes_one_record_to_many_queues(broker_factory):
    broker = broker_factory()
    await broker.declare_topic("amq.topic")
    q1, _ = await broker.declare_ack_queue("q.eu", 0)
    q2, _ = await broker.declare_ack_queue("q.all", 0)
    await broker.declare_topic("q.eu")
    await broker.declare_topic("q.all")
    await broker.bind("amq.topic", "topic", "weather.eu.*", ("q.eu", 0))
    await broker.bind("amq.topic", "topic", "weather.#", ("q.all", 0))
    result = await broker.publish("amq.topic", b"rain", subject="weather.eu.paris")
    assert set(result.destinations) == {("amq.topic", 0), ("q.eu", 0), ("q.all", 0)}
    await broker.publish("amq.topic", b"sun", subject="weather.us.nyc")
    await broker.publish("amq.topic", b"nothing", subject="traffic.eu")
    _, eu = await drain(q1, 1)
    _, everything = await drain(q2, 2)
    assert [d.message.body for d in eu] == [b"rain"]
    assert [d.message.body for d in everything] == [b"rain", b"sun"]
    assert eu[0].message.position == everything[0].message.position  # stored once
    assert broker.shard.store.queue_bounds("amq.topic", 0) == (0, 3)


async def test_exchange_to_exchange_and_cycles(broker_factory):
    broker = broker_factory()
    for name in ("a", "b", "q"):
        await broker.declare_topic(name)
    queue, _ = await broker.declare_ack_queue("q", 0)
    await broker.bind("a", "fanout", "", ("b", EXCHANGE_QUEUE))
    await broker.bind("b", "fanout", "", ("a", EXCHANGE_QUEUE))  # a cycle
    await broker.bind("b", "exact", "k", ("q", 0))
    result = await broker.publish("a", b"x", subject="k")
    assert set(result.destinations) == {("a", 0), ("b", 0), ("q", 0)}
    _, got = await drain(queue, 1)
    assert got[0].message.body == b"x"


async def test_headers_and_mqtt_bindings(broker_factory):
    broker = broker_factory()
    await broker.declare_topic("h")
    await broker.declare_topic("sensors")
    await broker.bind("h", "headers", "", ("h-any", 0), {"x-match": "any", "a": 1, "b": 2})
    await broker.bind("sensors", "mqtt", "+/temp", ("session-1", 0))
    r1 = await broker.publish("h", b"1", routing_headers={"a": 1})
    r2 = await broker.publish("h", b"2", routing_headers={"c": 3})
    assert ("h-any", 0) in r1.destinations
    assert ("h-any", 0) not in r2.destinations
    r3 = await broker.publish("sensors", b"21.5", subject="kitchen/temp")
    r4 = await broker.publish("sensors", b"50", subject="kitchen/humidity")
    assert ("session-1", 0) in r3.destinations
    assert ("session-1", 0) not in r4.destinations


async def test_unknown_topic_without_auto_create_and_reserved_names(broker_factory):
    broker = broker_factory(auto_create_topics=False)
    with pytest.raises(TopicError):
        await broker.publish("missing", b"x")
    with pytest.raises(TopicError):
        await broker.declare_topic("__offsets")


async def test_keyed_publish_uses_kafka_partitioner(broker_factory):
    from kafka.partitioner.default import murmur2

    broker = broker_factory()
    await broker.declare_topic("orders", queues=6)
    for key in (b"alice", b"bob", b"carol", b"dave"):
        result = await broker.publish("orders", b"v", key=key)
        assert result.queue == (murmur2(key) & 0x7FFFFFFF) % 6


async def test_bindings_topics_and_queues_are_durable(broker_factory, tmp_path):
    broker = broker_factory()
    await broker.declare_topic("ex", config={"type": "topic"})
    await broker.declare_topic("q")
    await broker.declare_ack_queue("q", 0, AckQueueConfig(max_length=5))
    await broker.bind("ex", "topic", "a.*", ("q", 0))
    await broker.bind("ex", "topic", "b.*", ("q", 0))
    await broker.unbind("ex", "topic", "b.*", ("q", 0))
    await close_broker(broker)
    reopened = broker_factory()
    assert reopened.topics.get("ex").config == {"type": "topic"}
    assert [b.pattern for b in reopened.bindings.bindings("ex")] == ["a.*"]
    assert reopened.ack_queue("q", 0).config.max_length == 5
    result = await reopened.publish("ex", b"m", subject="a.x")
    assert ("q", 0) in result.destinations


async def test_max_length_drop_head_and_reject_publish(broker_factory):
    broker = broker_factory()
    await broker.declare_topic("ex")
    drop, _ = await broker.declare_ack_queue("drop", 0, AckQueueConfig(max_length=3))
    reject, _ = await broker.declare_ack_queue(
        "reject", 0, AckQueueConfig(max_length=2, overflow=OVERFLOW_REJECT_PUBLISH)
    )
    await broker.bind("ex", "fanout", "", ("drop", 0))
    dead: list[tuple[str, bytes, str]] = []
    broker.shard.dead_letter_hook = lambda q, m, reason: dead.append((q.topic, m.body, reason))
    for i in range(5):
        await broker.publish("ex", str(i).encode())
    assert drop.message_count() == 3
    assert [(t, b) for t, b, _ in dead] == [("drop", b"0"), ("drop", b"1")]
    _, got = await drain(drop, 3)
    assert [d.message.body for d in got] == [b"2", b"3", b"4"]
    await broker.declare_topic("direct")
    await broker.bind("direct", "fanout", "", ("reject", 0))
    accepted = [await broker.publish("direct", m) for m in (b"a", b"b")]
    assert all(not r.refused for r in accepted)
    third = await broker.publish("direct", b"c")
    assert third.refused == [("reject", 0)]
    assert reject.message_count() == 2
    _, got = await drain(reject, 2)
    assert [d.message.body for d in got] == [b"a", b"b"]
