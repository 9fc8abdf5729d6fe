"""Three real ``braid serve --cluster`` nodes on a root of 12 shards, each serving the 4 it owns
(docs/cluster.md sections 6-9; tests/cluster/cluster_fixture.py), with the real clients:

- Kafka: a 12-partition topic made through node 1 has leaders on all three nodes; kafka-python,
  aiokafka and confluent-kafka producers bootstrapped on different nodes send keyed records to
  the leaders, consumers of one group bootstrapped on two other nodes read every record, each
  key's in order.
- AMQP: a fanout exchange declared on node 1, queues in shards of nodes 2 and 3 bound to it;
  publishes confirmed on node 1 (forwarded to the owners), consumed on each queue's owner.
- Definitions made on one node are used by the others (the exchange, the bindings).
- MQTT: a subscriber on node 3 gets what a publisher on node 2 sends.
- A node stopped with SIGTERM: a publish routed to its shard is nacked after
  ``unavailable_wait_ms`` while the others keep serving; started again, it serves its shards
  with every confirmed record.
"""

from __future__ import annotations

import asyncio
import base64
import json
import queue as queues_module
import threading
import time
import urllib.request
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pika
import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from paho.mqtt.enums import CallbackAPIVersion
from pika.exceptions import NackError

from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, amqp, drain, eventually, redis_server

__all__ = ["redis_server"]  # the module's Redis fixture (tests/cluster/test_node.py)

SHARDS = 12
TOPIC = "tn.events"
GROUP = "tn.group"
EXCHANGE = "tn.fan"
PER_KEY = 10
QUEUE_TOPIC = "amq.queue."


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("three"), redis_server.url, shards=SHARDS) as started:
        yield started


def test_each_node_serves_its_third(cluster: Cluster) -> None:
    served = [cluster.served(node_id) for node_id in (1, 2, 3)]
    assert all(len(shards) == SHARDS // 3 for shards in served)
    assert set().union(*served) == set(range(SHARDS))


# -- Kafka -----------------------------------------------------------------------------------


def produce_kafka_python(bootstrap: str, keys: list[str]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=bootstrap, acks="all", max_in_flight_requests_per_connection=1
    )
    try:
        for number in range(PER_KEY):
            for key in keys:
                producer.send(TOPIC, key=key.encode(), value=f"{key}:{number}".encode())
        producer.flush(timeout=DEADLINE_S)
    finally:
        producer.close()


async def produce_aiokafka(bootstrap: str, keys: list[str]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for number in range(PER_KEY):
            for key in keys:
                await producer.send_and_wait(TOPIC, f"{key}:{number}".encode(), key=key.encode())
    finally:
        await producer.stop()


def produce_confluent(bootstrap: str, keys: list[str]) -> None:
    from confluent_kafka import Producer

    # Idempotent: every node takes its producer ids from the cluster's counter in Redis.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "max.in.flight": 1, "enable.idempotence": True}
    )
    failed: list[object] = []
    for number in range(PER_KEY):
        for key in keys:
            producer.produce(
                TOPIC,
                key=key.encode(),
                value=f"{key}:{number}".encode(),
                on_delivery=lambda error, _m: failed.append(error) if error else None,
            )
    assert producer.flush(DEADLINE_S) == 0
    assert failed == []


def test_kafka_producers_and_a_group_across_three_nodes(cluster: Cluster) -> None:
    admin = KafkaAdminClient(bootstrap_servers=cluster[1].kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, num_partitions=SHARDS, replication_factor=1)])
    finally:
        admin.close()

    def metadata_of_all() -> object:
        described = AdminClient({"bootstrap.servers": cluster[3].kafka_bootstrap}).list_topics(
            TOPIC, timeout=5
        )
        partitions = described.topics[TOPIC].partitions
        if len(partitions) != SHARDS or any(p.leader < 0 for p in partitions.values()):
            return None
        return described

    described = eventually(metadata_of_all, "the topic's leaders on node 3")
    assert sorted(described.brokers) == [1, 2, 3]  # type: ignore[attr-defined]
    leaders = {p.leader for p in described.topics[TOPIC].partitions.values()}  # type: ignore[attr-defined]
    assert leaders == {1, 2, 3}

    keys = {name: [f"{name}{n}" for n in range(6)] for name in ("kp", "ak", "ck")}
    produce_kafka_python(cluster[1].kafka_bootstrap, keys["kp"])
    asyncio.run(produce_aiokafka(cluster[2].kafka_bootstrap, keys["ak"]))
    produce_confluent(cluster[3].kafka_bootstrap, keys["ck"])
    expected = {
        key: [f"{key}:{n}" for n in range(PER_KEY)] for group in keys.values() for key in group
    }

    consumers = [
        Consumer(
            {
                "bootstrap.servers": cluster[node_id].kafka_bootstrap,
                "group.id": GROUP,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        for node_id in (2, 3)
    ]
    received: dict[str, list[str]] = {}
    members: set[int] = set()
    try:
        for consumer in consumers:
            consumer.subscribe([TOPIC])
        total = sum(len(values) for values in expected.values())
        end = time.monotonic() + DEADLINE_S
        count = 0
        while count < total and time.monotonic() < end:
            for index, consumer in enumerate(consumers):
                message = consumer.poll(0.1)
                if message is None or message.error() is not None:
                    continue
                members.add(index)
                key = message.key().decode()
                received.setdefault(key, []).append(message.value().decode())
                count += 1
    finally:
        for consumer in consumers:
            consumer.close()
    assert received == expected  # every record, each key's in order
    assert members  # (both may share the partitions or one may hold them all: one group)


# -- AMQP ------------------------------------------------------------------------------------


def declare_and_bind(cluster: Cluster, node_id: int, queue: str) -> None:
    """Declare ``queue`` on its owner ``node_id`` and bind it there to the exchange node 1
    declared (which node ``node_id`` knows by following the cluster's definitions)."""

    def bound() -> bool:
        connection = amqp(cluster[node_id])
        try:
            channel = connection.channel()
            channel.queue_declare(queue, durable=True)
            channel.queue_bind(queue, EXCHANGE)
            return True
        finally:
            connection.close()

    eventually(bound, f"{queue} bound on node {node_id}")


def publish_confirmed(cluster: Cluster, node_id: int, bodies: list[bytes]) -> None:
    connection = amqp(cluster[node_id])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish(EXCHANGE, "", body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()


def queues_of(cluster: Cluster) -> dict[int, str]:
    return {node_id: cluster.name_owned_by(node_id, "tn.q", QUEUE_TOPIC) for node_id in (2, 3)}


def test_amqp_publishes_on_node_1_reach_queues_of_nodes_2_and_3(cluster: Cluster) -> None:
    connection = amqp(cluster[1])
    try:
        connection.channel().exchange_declare(EXCHANGE, "fanout", durable=True)
    finally:
        connection.close()
    queues = queues_of(cluster)
    for node_id, queue in queues.items():
        declare_and_bind(cluster, node_id, queue)
    # Node 3 sees the exchange node 1 declared (a passive declare).
    probe = amqp(cluster[3])
    try:
        probe.channel().exchange_declare(EXCHANGE, "fanout", passive=True)
    finally:
        probe.close()
    # Node 1 routes by the bindings nodes 2 and 3 made once it follows them.
    eventually(lambda: len(bindings_known(cluster, 1)) == 2, "both bindings on node 1")
    bodies = [b"fan-%d" % n for n in range(20)]
    publish_confirmed(cluster, 1, bodies)
    for node_id, queue in queues.items():
        assert consumed(cluster, node_id, queue, len(bodies)) == bodies


def bindings_known(cluster: Cluster, node_id: int) -> list[object]:
    """The bindings of the exchange as node ``node_id``'s management API lists them."""
    request = urllib.request.Request(
        f"http://127.0.0.1:{cluster[node_id].http_port}/api/exchanges/%2F/{EXCHANGE}"
        "/bindings/source",
        headers={"Authorization": "Basic " + base64.b64encode(b"guest:guest").decode()},
    )
    with urllib.request.urlopen(request, timeout=DEADLINE_S) as response:
        found: list[object] = json.loads(response.read())
    return found


def consumed(cluster: Cluster, node_id: int, queue: str, count: int) -> list[bytes]:
    """``count`` messages of ``queue`` taken on node ``node_id``, as they arrive."""
    got: list[bytes] = []

    def enough() -> bool:
        got.extend(drain(cluster[node_id], queue))
        return len(got) >= count

    eventually(enough, f"{count} messages of {queue} on node {node_id}")
    return got


def test_mqtt_publish_on_node_2_reaches_a_subscriber_on_node_3(cluster: Cluster) -> None:
    """A clean-session subscriber on node 3 gets what a publisher on node 2 sends (the route
    table and the Deliver fan-out wired into braid serve)."""
    received: queues_module.Queue[bytes] = queues_module.Queue()
    subscribed = threading.Event()
    subscriber = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tn-sub")
    subscriber.on_message = lambda _c, _u, message: received.put(message.payload)
    subscriber.on_subscribe = lambda *_args: subscribed.set()
    subscriber.connect("127.0.0.1", cluster[3].mqtt_port)
    subscriber.loop_start()
    publisher = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tn-pub")
    publisher.connect("127.0.0.1", cluster[2].mqtt_port)
    publisher.loop_start()
    try:
        subscriber.subscribe("tn/sensors/#", qos=1)
        assert subscribed.wait(DEADLINE_S)
        for number in range(5):
            publisher.publish(f"tn/sensors/{number}", b"m%d" % number, qos=1).wait_for_publish(
                DEADLINE_S
            )
        got = [received.get(timeout=DEADLINE_S) for _ in range(5)]
        assert got == [b"m%d" % number for number in range(5)]
    finally:
        for client in (subscriber, publisher):
            client.disconnect()
            client.loop_stop()


def test_a_stopped_node_nacks_its_shard_and_serves_again(cluster: Cluster) -> None:
    """Node 3 stops (SIGTERM; after the AMQP test, whose queues this one uses): a publish on
    node 1 that reaches its queue is nacked after unavailable_wait_ms, while node 2 keeps
    taking and serving its own queue's records; started again, node 3 serves its shards with
    what it confirmed, across another restart, and takes node 1's forwards again."""
    queues = queues_of(cluster)
    before = [b"before-%d" % n for n in range(5)]
    publish_confirmed(cluster, 1, before)
    assert consumed(cluster, 3, queues[3], 5) == before
    assert cluster[3].stop() == 0
    connection = amqp(cluster[1])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        with pytest.raises(NackError):
            channel.basic_publish(EXCHANGE, "", b"down", pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    connection = amqp(cluster[2])
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.basic_publish("", queues[2], b"direct", pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    # Node 2's part of the nacked publish was stored (only node 3's was not).
    assert consumed(cluster, 2, queues[2], 7) == [*before, b"down", b"direct"]

    # Started again, node 3 serves its shards: what it confirmed is there, and publishes on
    # node 1 reach it again once node 1 sees its new address.
    kept = [b"kept-%d" % n for n in range(5)]
    connection = amqp(cluster[3].start())
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in kept:
            channel.basic_publish("", queues[3], body, pika.BasicProperties(delivery_mode=2))
    finally:
        connection.close()
    cluster[3].stop()
    cluster[3].start()
    assert cluster.served(3) == {shard for shard in range(SHARDS) if shard % 3 == 2}
    after = [b"after-%d" % n for n in range(5)]
    eventually(lambda: publish_confirmed(cluster, 1, after[:1]) or True, "node 1 forwarding")
    publish_confirmed(cluster, 1, after[1:])
    got = consumed(cluster, 3, queues[3], 10)
    assert got[:5] == kept
    assert [body for body in got[5:] if body != after[0]] == after[1:]
