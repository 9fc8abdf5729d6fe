"""One node serving every shard of a root of four (docs/cluster.md sections 3 and 6): a real
redis-server, a real ``braid serve --cluster ... --expect-nodes 1`` (tests/braid_process.py),
real clients (pika, kafka-python, paho).

Each queue lives in the shard its placement names (``core/cluster/placement.py``: a topic's
queue ``q`` in ``(h(topic) + q) % 4``): a fanout publish is stored once in the exchange's shard
and copied (``FLAG_COPY``) into each other shard holding one of its queues; a 4-partition Kafka
topic has a partition in each shard; an MQTT persistent session's queue in its own. Read back
through the clients, then from the files with ``braid log``, then after ``kill -9``.
"""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
from kafka.admin import NewTopic
from paho.mqtt.enums import CallbackAPIVersion

from core.broker import Node
from core.cluster import layout
from core.cluster.node_runner import ClusterNode
from core.cluster.placement import partition_shard
from core.cluster.settings import ClusterSettings
from core.deadletter.policy import DeadLetterPolicy
from core.delivery.ackqueue import AckQueueConfig
from core.errors import ShardUnavailable
from core.log import LogConfig, LogStore
from core.log import record as rec
from tests.braid_process import BraidProcess
from tests.cluster.redis_server import RedisServer, until
from tests.cluster.test_node import (
    DEADLINE_S,
    ConfirmedPublisher,
    amqp,
    braid,
    cluster_id,
    drain,
    make_root,
    redis_server,
)
from tests.cluster.test_node import node as cluster_node

__all__ = ["redis_server"]  # the module's Redis fixture, shared with test_node.py

SHARDS = 4
EXCHANGE = "ms.fan"
# AMQP queue Q is the topic amq.queue.Q; these four land in four different shards.
QUEUES = ("ms.q0", "ms.q2", "ms.q5", "ms.q6")
KAFKA_TOPIC = "ms.events"
MQTT_CLIENT = "ms-sub"
MESSAGES = 30


def queue_shard(name: str) -> int:
    return partition_shard(f"amq.queue.{name}", 0, SHARDS)


def one_node(tmp_path: Path, root: Path, url: str) -> BraidProcess:
    return cluster_node(tmp_path, "n1", root, url, 1, "--expect-nodes", "1")


def consume_and_ack(process: BraidProcess, queue_name: str, count: int) -> list[bytes]:
    """``count`` messages of ``queue_name`` through a consumer, each acked."""
    connection = amqp(process)
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=10)
        bodies: list[bytes] = []
        for method, _, body in channel.consume(queue_name, inactivity_timeout=DEADLINE_S):
            assert method is not None, f"{queue_name}: {len(bodies)} of {count} arrived"
            bodies.append(body)
            channel.basic_ack(method.delivery_tag)
            if len(bodies) == count:
                break
        channel.cancel()
        return bodies
    finally:
        connection.close()


def placements(server: RedisServer, root: Path) -> dict[str, int]:
    """The recorded queue placements (``place:partition``): placement name -> shard."""
    with server.client() as client:
        found = client.hgetall(f"braid:{cluster_id(root)}:place:partition")
    return {key.decode(): int(value) for key, value in found.items()}


def log_json(*args: str) -> Any:
    result = braid("log", *args, "--json")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_queues_spread_over_shards_are_placed_consumed_and_kept(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    placed = {name: queue_shard(name) for name in QUEUES}
    assert sorted(placed.values()) == list(range(SHARDS))  # (the names were picked so)
    exchange_shard = partition_shard(EXCHANGE, 0, SHARDS)
    url = redis_server.url
    root = make_root(tmp_path / "root", shards=SHARDS)
    node = one_node(tmp_path, root, url).start()
    try:
        assert "node=1 shards=0,1,2,3" in node.ready_line

        # AMQP: a fanout exchange bound to four queues in four shards, confirmed publishes.
        connection = amqp(node)
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(EXCHANGE, "fanout", durable=True)
        for name in QUEUES:
            channel.queue_declare(name, durable=True)
            channel.queue_bind(name, EXCHANGE)
        sent = [f"m{number}".encode() for number in range(MESSAGES)]
        for body in sent:
            channel.basic_publish(EXCHANGE, "", body, pika.BasicProperties(delivery_mode=2))
        connection.close()
        for name in QUEUES:
            assert consume_and_ack(node, name, MESSAGES) == sent, name
            assert drain(node, name) == []  # all acked: nothing left

        # Each queue's placement recorded in Redis (place:partition), as the rule says.
        recorded = placements(redis_server, root)
        for name, shard in placed.items():
            assert recorded[f"amq.queue.{name}\x000"] == shard, name

        # Kafka: a topic of four partitions, one per shard.
        admin = KafkaAdminClient(bootstrap_servers=node.kafka_bootstrap)
        admin.create_topics([NewTopic(KAFKA_TOPIC, num_partitions=SHARDS, replication_factor=1)])
        admin.close()
        producer = KafkaProducer(bootstrap_servers=node.kafka_bootstrap, acks="all")
        for number in range(40):
            producer.send(KAFKA_TOPIC, key=b"k%d" % number, value=b"v%d" % number)
        producer.flush()
        producer.close()
        consumer = KafkaConsumer(
            KAFKA_TOPIC,
            bootstrap_servers=node.kafka_bootstrap,
            auto_offset_reset="earliest",
            consumer_timeout_ms=int(DEADLINE_S * 1000),
            group_id=None,
        )
        values: set[bytes] = set()
        partitions: set[int] = set()
        for record in consumer:
            values.add(record.value)
            partitions.add(record.partition)
            if len(values) == 40:
                break
        consumer.close()
        assert values == {b"v%d" % number for number in range(40)}
        assert partitions == set(range(SHARDS))
        recorded = placements(redis_server, root)
        for partition in range(SHARDS):
            expected = partition_shard(KAFKA_TOPIC, partition, SHARDS)
            assert recorded[f"{KAFKA_TOPIC}\x00{partition}"] == expected

        # MQTT: a QoS 1 round trip through a persistent session's queue.
        got: queue.Queue[mqtt.MQTTMessage] = queue.Queue()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=MQTT_CLIENT, clean_session=False
        )
        client.on_message = lambda _c, _u, message: got.put(message)
        client.connect("127.0.0.1", node.mqtt_port)
        client.loop_start()
        try:
            client.subscribe("ms/sensors/#", qos=1)
            time.sleep(0.2)  # the SUBACK; a publish before it would not match yet
            client.publish("ms/sensors/1", b"21.5", qos=1).wait_for_publish(DEADLINE_S)
            message = got.get(timeout=DEADLINE_S)
        finally:
            client.loop_stop()
            client.disconnect()
        assert (message.topic, message.payload, message.qos) == ("ms/sensors/1", b"21.5", 1)

        # kill -9 under a confirming publisher: every confirmed message in every queue.
        publisher = ConfirmedPublisher(node, EXCHANGE, "")
        publisher.start()
        until(lambda: len(publisher.confirmed) >= 50, DEADLINE_S, "50 confirmed publishes")
        node.kill9()
        assert publisher.ended.wait(DEADLINE_S)
        publisher.stopping.set()
        node.start()
        for name in QUEUES:
            bodies = drain(node, name)
            missing = set(publisher.confirmed) - set(bodies)
            assert not missing, f"{name}: {len(missing)} confirmed messages lost"
            assert len(bodies) == len(set(bodies)), name
        assert node.stop() == 0
    finally:
        node.kill9()

    # The files: each queue's records in its own shard, the exchange's shard holding the
    # records and the others copies of them.
    stat = json.loads(log_json("stat", str(root)))
    topics_by_shard = {entry["shard"]: set(entry["log"]["topics"]) for entry in stat["shards"]}
    for name, shard in placed.items():
        assert f"amq.queue.{name}" in topics_by_shard[shard], (name, shard)
        for other in set(range(SHARDS)) - {shard}:
            assert f"amq.queue.{name}" not in topics_by_shard[other], (name, other)
    for partition in range(SHARDS):
        assert KAFKA_TOPIC in topics_by_shard[partition_shard(KAFKA_TOPIC, partition, SHARDS)]
    copied = next(name for name, shard in placed.items() if shard != exchange_shard)
    records = [
        json.loads(line)
        for line in log_json(
            "dump", str(root), "--shard", str(placed[copied]), "--topic", f"amq.queue.{copied}"
        ).splitlines()
    ]
    assert len(records) >= MESSAGES + 50
    assert all("copy" in record["flags"] for record in records), records[0]
    home = [
        json.loads(line)
        for line in log_json(
            "dump", str(root), "--shard", str(exchange_shard), "--topic", EXCHANGE
        ).splitlines()
    ]
    assert len(home) >= MESSAGES + 50
    assert not any("copy" in record["flags"] for record in home)


def test_a_node_owning_some_shards_serves_them(tmp_path: Path) -> None:
    """A node that owns only part of a root of many shards serves those (the others are
    reached by forwarding, tests/cluster/test_three_nodes.py): the lowest one's epoch; owning
    all of them too, and none is a standby."""
    root = layout.init(tmp_path / "root", shards=SHARDS)
    node = ClusterNode(root, "redis://unused", 1, ClusterSettings(), listen_host="127.0.0.1")
    assert node._served({2: 1, 3: 4}) == 1
    assert node._served({number: 3 for number in range(SHARDS)}) == 3
    assert node._served({}) is None


# -- the node over four shards, in process ----------------------------------------------------


def four_shards(path: Path) -> list[tuple[int, LogStore]]:
    return [(number, LogStore(LogConfig(path / f"{number:04d}"))) for number in range(SHARDS)]


def queue_in(shard: int, prefix: str) -> str:
    """A topic name whose queue 0 is placed in ``shard``."""
    return next(
        name
        for name in (f"{prefix}{number}" for number in range(1000))
        if partition_shard(name, 0, SHARDS) == shard
    )


async def test_dead_letters_reach_a_queue_of_another_shard(tmp_path: Path) -> None:
    """A record rejected from a queue of shard 0 is dead-lettered into a queue of shard 1: a
    copy there (a LINK in shard 0 could index only shard 0's queues), with x-death."""
    stores = four_shards(tmp_path)
    node = Node(stores)
    try:
        await node.start()
        work, dead = queue_in(0, "work"), queue_in(1, "dead")
        await node.declare_topic(dead, 1)
        dead_queue, _ = await node.declare_ack_queue(dead, 0)
        policy = DeadLetterPolicy(dead_letter_topic=dead)
        await node.declare_topic(work, 1)
        work_queue, _ = await node.declare_ack_queue(work, 0, AckQueueConfig(dead_letter=policy))
        published = await node.publish(work, b"poison")
        assert published.sequence > 0  # many shards: the mark is the node's sequence
        await node.when_durable(published.durable_mark, work)
        delivery = work_queue.get(no_ack=False)
        assert delivery is not None
        assert delivery.message.body == b"poison"
        work_queue.nack(delivery.offset, requeue=False)
        moved = dead_queue.get(no_ack=True)
        assert moved is not None
        assert moved.message.body == b"poison"
        assert moved.message.header("x-death") is not None
        assert moved.message.flags & rec.FLAG_COPY
        assert stores[1][1].queue_bounds(dead, 0) == (0, 1)
        assert stores[0][1].queue_bounds(dead, 0) == (0, 0)
    finally:
        await node.close()
        for _, store in stores:
            await store.aclose()


async def test_a_destination_of_a_shard_not_served_is_unavailable(tmp_path: Path) -> None:
    """A node serving shards 0 and 2 of four, with nothing to forward through: a publish
    whose destinations reach shard 1 stores nothing and raises ShardUnavailable(1)."""
    stores = [four_shards(tmp_path)[number] for number in (0, 2)]
    node = Node(stores, shard_count=SHARDS)
    try:
        await node.start()
        here, there = queue_in(0, "here"), queue_in(1, "there")
        await node.declare_topic(here, 1)
        await node.declare_topic(there, 1)
        await node.bind(here, "fanout", "", (there, 0))
        with pytest.raises(ShardUnavailable) as raised:
            await node.publish(here, b"x")
        assert raised.value.shard == 1
        assert stores[0][1].queue_bounds(here, 0) == (0, 0)
    finally:
        await node.close()
        for _, store in stores:
            await store.aclose()
