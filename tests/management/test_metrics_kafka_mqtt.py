"""``/metrics``: kafka_exporter's names after real aiokafka consumer-group traffic (the lag of a
partition above 0 while the group is behind, 0 once it caught up and committed; its members
while it is joined; the broker and replica families of a one-broker cluster), and the MQTT
gauges after paho sessions (clients connected, sessions, subscriptions, retained messages).
Parsed with prometheus_client's parser."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import requests
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from tests.braid_process import BraidProcess

DEADLINE_S = 30.0
Samples = dict[str, list[tuple[dict[str, str], float]]]


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path, listeners=("mqtt", "kafka", "http")) as process:
        yield process


def scrape(braid: BraidProcess) -> Samples:
    response = requests.get(f"http://127.0.0.1:{braid.http_port}/metrics", timeout=30)
    assert response.status_code == 200
    samples: Samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    for found, number in samples.get(name, []):
        if found == labels:
            return number
    return None


def wait_for_metric(braid: BraidProcess, check: Callable[[Samples], bool], what: str) -> Samples:
    deadline = time.monotonic() + DEADLINE_S
    while True:
        samples = scrape(braid)
        if check(samples):
            return samples
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def test_kafka_exporter_names_follow_a_consumer_group(braid: BraidProcess) -> None:
    topic, group = "metered", "metered-group"
    admin = AIOKafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, num_partitions=2, replication_factor=1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    await producer.start()
    for index in range(10):
        await producer.send_and_wait(topic, f"m{index}".encode(), partition=index % 2)
    await producer.stop()

    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=braid.kafka_bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not consumer.assignment() or not await consumer.getmany(timeout_ms=200):
            assert time.monotonic() < deadline, "no records for the group"
        # Behind: 2 of partition 0's 5 records committed, none of partition 1's.
        await consumer.commit({TopicPartition(topic, 0): 2, TopicPartition(topic, 1): 0})
        samples = await asyncio.to_thread(scrape, braid)
        ours = {"consumergroup": group, "topic": topic}
        assert value(samples, "kafka_consumergroup_lag", **ours, partition="0") == 3
        assert value(samples, "kafka_consumergroup_lag", **ours, partition="1") == 5
        assert value(samples, "kafka_consumergroup_current_offset", **ours, partition="0") == 2
        assert value(samples, "kafka_consumergroup_members", consumergroup=group) == 1
        assert value(samples, "kafka_topic_partitions", topic=topic) == 2
        for partition in ("0", "1"):
            where = {"topic": topic, "partition": partition}
            assert value(samples, "kafka_topic_partition_current_offset", **where) == 5
            assert value(samples, "kafka_topic_partition_oldest_offset", **where) == 0
            assert value(samples, "kafka_topic_partition_leader", **where) == 0
            assert value(samples, "kafka_topic_partition_replicas", **where) == 1
            assert value(samples, "kafka_topic_partition_in_sync_replica", **where) == 1
            assert value(samples, "kafka_topic_partition_under_replicated_partition", **where) == 0
        assert value(samples, "kafka_brokers") == 1
        address = f"127.0.0.1:{braid.kafka_port}"
        assert value(samples, "kafka_broker_info", address=address, id="0") == 1

        # Caught up: everything read, and committed where the group is.
        await consumer.seek_to_end()
        await consumer.commit({TopicPartition(topic, 0): 5, TopicPartition(topic, 1): 5})
        samples = await asyncio.to_thread(scrape, braid)
        assert value(samples, "kafka_consumergroup_lag", **ours, partition="0") == 0
        assert value(samples, "kafka_consumergroup_lag", **ours, partition="1") == 0
        assert value(samples, "kafka_consumergroup_lag_sum", **ours) == 0
    finally:
        await consumer.stop()
    await asyncio.to_thread(
        wait_for_metric,
        braid,
        lambda s: value(s, "kafka_consumergroup_members", consumergroup=group) == 0,
        "the group to be empty after the consumer left",
    )


class Paho:
    def __init__(self, port: int, version: int, *, clean: bool = True) -> None:
        self.connected = threading.Event()
        self.acked: set[int] = set()
        self.subscribed: set[int] = set()
        kwargs: dict[str, Any] = {}
        if version == mqtt.MQTTv311:
            kwargs["clean_session"] = clean
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=f"metrics-{uuid.uuid4().hex[:8]}",
            protocol=version,
            **kwargs,
        )
        self.client.on_connect = lambda *_args: self.connected.set()
        self.client.on_publish = lambda _c, _u, mid, _r, _p: self.acked.add(mid)
        self.client.on_subscribe = lambda _c, _u, mid, _r, _p: self.subscribed.add(mid)
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self.connected.wait(DEADLINE_S)

    def subscribe(self, topic_filter: str) -> None:
        _, mid = self.client.subscribe(topic_filter, qos=1)
        wait(lambda: mid in self.subscribed, "a SUBACK")

    def publish_retained(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1, retain=True)
        wait(lambda: info.mid in self.acked, "a PUBACK")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def wait(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def mqtt_gauges(samples: Samples) -> tuple[float | None, ...]:
    return tuple(
        value(samples, name)
        for name in (
            "braid_mqtt_clients_connected",
            "braid_mqtt_sessions",
            "braid_mqtt_subscriptions",
            "braid_mqtt_retained_messages",
        )
    )


def test_mqtt_gauges_follow_paho_sessions(braid: BraidProcess) -> None:
    assert mqtt_gauges(scrape(braid)) == (0, 0, 0, 0)
    persistent = Paho(braid.mqtt_port, mqtt.MQTTv311, clean=False)
    persistent.subscribe("plant/c")
    clean = Paho(braid.mqtt_port, mqtt.MQTTv5)
    clean.subscribe("plant/a")
    clean.subscribe("plant/b/#")
    clean.publish_retained("plant/r", b"21.5")
    assert mqtt_gauges(scrape(braid)) == (2, 2, 3, 1)
    persistent.close()  # offline: its session and subscription stay
    wait_for_metric(braid, lambda s: mqtt_gauges(s) == (1, 2, 3, 1), "one client connected")
    clean.close()  # a clean session ends with its connection
    wait_for_metric(braid, lambda s: mqtt_gauges(s) == (0, 1, 1, 1), "the clean session gone")
