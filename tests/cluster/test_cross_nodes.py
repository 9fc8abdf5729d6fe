"""The nine cross-protocol pairs across the nodes of a cluster (issue 22; docs/mapping.md for
which names each protocol uses): three real ``braid serve --cluster`` nodes on a root of 12
shards (tests/cluster/cluster_fixture.py), for each (publisher, consumer) pair over AMQP
(pika), MQTT (paho) and Kafka (kafka-python) the publisher on one node, the consumer on
another and the topic's shard owned by the third; every record arrives once with its body,
in order. Then Spark reads the root and counts every published record once.

The pairs whose consumer is MQTT check the fan-out of records of other protocols: an AMQP or
Kafka record reaches clean-session subscribers on other nodes only through the owner of its
shard (core/api/sessions.py ``fan_out_live_record``).
"""

from __future__ import annotations

import queue as queues_module
import time
from collections.abc import Callable, Iterator

import paho.mqtt.client as mqtt
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from paho.mqtt.enums import CallbackAPIVersion
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from tests.braid_process import BraidProcess
from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, amqp, eventually, redis_server
from tests.spark.conftest import spark

# The module's Redis fixture (tests/cluster/test_node.py) and the suite's one SparkSession.
__all__ = ["redis_server", "spark"]

SHARDS = 12
QUEUE_TOPIC = "amq.queue."
PER_PAIR = 5
PROTOCOLS = ("amqp", "mqtt", "kafka")
PAIRS = [(publisher, consumer) for publisher in PROTOCOLS for consumer in PROTOCOLS]
SUBJECT = "k"  # routing key / Kafka key / MQTT level after the topic


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("cross"), redis_server.url, shards=SHARDS) as started:
        yield started


def roles(index: int) -> tuple[int, int, int]:
    """(publisher's node, consumer's node, topic owner) for the pair ``index``: every order of
    the three nodes in turn."""
    orders = [(1, 2, 3), (2, 3, 1), (3, 1, 2), (1, 3, 2), (2, 1, 3), (3, 2, 1)]
    return orders[index % len(orders)]


# -- consumers: started before the publish, each returns what it got ------------------------


class MqttSubscriber:
    """A clean-session paho subscriber of ``topic/#`` on one node."""

    def __init__(self, process: BraidProcess, client_id: str, topic: str) -> None:
        self.messages: queues_module.Queue[tuple[str, bytes]] = queues_module.Queue()
        self.paho = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
        self.paho.on_message = lambda _c, _u, m: self.messages.put((m.topic, bytes(m.payload)))
        subscribed: queues_module.Queue[int] = queues_module.Queue()
        self.paho.on_subscribe = lambda _c, _u, mid, *_rest: subscribed.put(mid)
        self.paho.connect("127.0.0.1", process.mqtt_port)
        self.paho.loop_start()
        _, mid = self.paho.subscribe(f"{topic}/#", qos=1)
        assert subscribed.get(timeout=DEADLINE_S) == mid

    def take(self, count: int) -> list[tuple[str, bytes]]:
        return [self.messages.get(timeout=DEADLINE_S) for _ in range(count)]

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def mqtt_publish(process: BraidProcess, client_id: str, topic: str, bodies: list[bytes]) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id)
    client.connect("127.0.0.1", process.mqtt_port)
    client.loop_start()
    try:
        for body in bodies:
            client.publish(f"{topic}/{SUBJECT}", body, qos=1).wait_for_publish(DEADLINE_S)
    finally:
        client.disconnect()
        client.loop_stop()


def amqp_publish(process: BraidProcess, topic: str, bodies: list[bytes]) -> None:
    connection = amqp(process)
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.exchange_declare(topic, "topic", durable=True)
        for body in bodies:
            channel.basic_publish(topic, SUBJECT, body)
    finally:
        connection.close()


def kafka_publish(process: BraidProcess, topic: str, bodies: list[bytes]) -> None:
    producer = KafkaProducer(
        bootstrap_servers=process.kafka_bootstrap,
        acks="all",
        max_in_flight_requests_per_connection=1,
    )
    try:
        for body in bodies:
            producer.send(topic, key=SUBJECT.encode(), value=body, partition=0)
        producer.flush(timeout=DEADLINE_S)
    finally:
        producer.close()


def amqp_queue(process: BraidProcess, queue: str, topic: str) -> None:
    """``queue`` declared on its owner and bound to exchange ``topic`` with the subject."""
    connection = amqp(process)
    try:
        channel = connection.channel()
        channel.exchange_declare(topic, "topic", durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, topic, SUBJECT)
    finally:
        connection.close()


def amqp_take(process: BraidProcess, queue: str, count: int) -> list[bytes]:
    connection = amqp(process)
    try:
        channel = connection.channel()
        got: list[bytes] = []
        end = time.monotonic() + DEADLINE_S
        while len(got) < count and time.monotonic() < end:
            method, _, body = channel.basic_get(queue, auto_ack=True)
            if method is None:
                time.sleep(0.05)
                continue
            got.append(body)
        if len(got) == count:
            assert channel.basic_get(queue, auto_ack=True)[0] is None, "one too many"
        return got
    finally:
        connection.close()


def kafka_take(process: BraidProcess, topic: str, count: int) -> list[bytes]:
    consumer = KafkaConsumer(
        bootstrap_servers=process.kafka_bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek_to_beginning()
        got: list[bytes] = []
        end = time.monotonic() + DEADLINE_S
        while len(got) < count and time.monotonic() < end:
            for records in consumer.poll(timeout_ms=200).values():
                got += [record.value for record in records]
        return got
    finally:
        consumer.close()


PUBLISHERS: dict[str, Callable[[BraidProcess, str, list[bytes]], None]] = {
    "amqp": amqp_publish,
    "kafka": kafka_publish,
    "mqtt": lambda process, topic, bodies: mqtt_publish(process, f"p-{topic}", topic, bodies),
}


def probe_until_routed(
    subscriber: MqttSubscriber, publish: Callable[[list[bytes]], None], what: str
) -> int:
    """Publish probes until one reaches ``subscriber`` (its route reaches the other nodes
    through Redis), then drop the late ones; returns how many were published."""
    probes = 0

    def arrived() -> bool:
        nonlocal probes
        publish([b"probe"])
        probes += 1
        try:
            subscriber.messages.get(timeout=0.2)
        except queues_module.Empty:
            return False
        return True

    eventually(arrived, what)
    time.sleep(0.3)  # late probes arrive now
    while not subscriber.messages.empty():
        assert subscriber.messages.get()[1] == b"probe"
    return probes


def run_pair(cluster: Cluster, index: int, publisher: str, consumer: str) -> int:
    """One pair's records published and consumed (module docstring); returns how many records
    the pair published (probes included)."""
    pub_node, con_node, owner = roles(index)
    topic = cluster.name_owned_by(owner, f"x{publisher[0]}{consumer[0]}")
    # The topic made through its owner (an AMQP exchange is its log topic), with a queue there.
    amqp_queue(cluster[owner], cluster.name_owned_by(owner, f"{topic}q", QUEUE_TOPIC), topic)
    bodies = [f"{publisher}>{consumer}:{n}".encode() for n in range(PER_PAIR)]

    def publish(records: list[bytes]) -> None:
        PUBLISHERS[publisher](cluster[pub_node], topic, records)

    if consumer == "mqtt":
        subscriber = MqttSubscriber(cluster[con_node], f"s-{topic}", topic)
        try:
            probes = probe_until_routed(subscriber, publish, f"a probe of {topic} on {con_node}")
            publish(bodies)
            assert subscriber.take(PER_PAIR) == [(f"{topic}/{SUBJECT}", b) for b in bodies]
            time.sleep(0.2)
            assert subscriber.messages.empty(), "a record arrived twice"
        finally:
            subscriber.close()
        return probes + PER_PAIR
    if consumer == "amqp":
        queue = cluster.name_owned_by(con_node, f"{topic}c", QUEUE_TOPIC)
        amqp_queue(cluster[con_node], queue, topic)
        publish(bodies)
        assert amqp_take(cluster[con_node], queue, PER_PAIR) == bodies
        return PER_PAIR
    publish(bodies)
    assert kafka_take(cluster[con_node], topic, PER_PAIR) == bodies
    return PER_PAIR


def pair_topic(cluster: Cluster, index: int, publisher: str, consumer: str) -> str:
    """The topic ``run_pair`` uses for the pair ``index`` (placement is deterministic)."""
    owner = roles(index)[2]
    return cluster.name_owned_by(owner, f"x{publisher[0]}{consumer[0]}")


def test_nine_pairs_across_nodes_then_spark_counts_each_record_once(
    cluster: Cluster, spark: SparkSession
) -> None:
    published = {
        pair_topic(cluster, index, *pair): run_pair(cluster, index, *pair)
        for index, pair in enumerate(PAIRS)
    }
    assert len(published) == len(PAIRS)
    # Spark reads the cluster's root in place: every shard in one load(); a record routed to
    # queues in other shards is there once more per shard as a copy (FLAG_COPY), which dedupe
    # drops, so each published record is one row of its topic.
    frame = (
        spark.read.format("braid")
        .option("path", str(cluster.root))
        .option("dedupe", "true")
        .load()
        .where(F.col("topic").isin(list(published)))
    )
    counts = {row.topic: row["count"] for row in frame.groupBy("topic").count().collect()}
    assert counts == published
    assert len({row.shard for row in frame.select("shard").distinct().collect()}) >= 3
