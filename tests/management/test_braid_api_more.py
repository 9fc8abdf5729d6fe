"""The last ``/api/braid/...`` endpoints of issue 19, after real pika, paho and kafka-python
traffic: pending delays per queue, dead-letter queues and "move dead letters back to their
queue" (redrive), and "show a record as each protocol sees it". Plus the redrive's crash rule,
in process: a redrive cut between its LINKs and its acks leaves each record in exactly one
queue after the restart."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pika
import pytest
import requests
from kafka import KafkaProducer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from prometheus_client.parser import text_string_to_metric_families

from core.api import INTERNAL_CONTEXT, BrokerAPI, DeadLetterPolicy
from core.broker import Node
from core.delivery import AckQueueConfig
from core.log import LogConfig, LogStore
from tests.braid_process import BraidProcess
from tests.management.test_connections import MqttClient
from tests.management.test_rabbit_api import GUEST, api, wait_for

DELAY_S = 600


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path) as process:
        yield process


def pika_channel(braid: BraidProcess) -> tuple[pika.BlockingConnection, Any]:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials(*GUEST)
        )
    )
    channel = connection.channel()
    channel.confirm_delivery()
    return connection, channel


def test_pending_delays_of_three_protocols(braid: BraidProcess) -> None:
    before = int(time.time() * 1000)
    connection, channel = pika_channel(braid)
    channel.exchange_declare("later", "x-delayed-message", arguments={"x-delayed-type": "direct"})
    channel.queue_declare("soon", durable=True)
    channel.queue_bind("soon", "later", "k")
    for _ in range(2):
        channel.basic_publish(
            "later", "k", b"a", pika.BasicProperties(headers={"x-delay": DELAY_S * 1000})
        )
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    producer.send(
        "kdelay", b"k", partition=0, headers=[("x-delay", str(DELAY_S * 1000).encode())]
    ).get(30)
    producer.close()
    live = MqttClient(braid, "delayer")
    live.client.publish(f"$delayed/{DELAY_S}/ticks/a", b"m", qos=1).wait_for_publish(30)
    live.close()
    after = int(time.time() * 1000)

    def listed() -> dict[tuple[str, int], Any] | None:
        found = {(d["topic"], d["partition"]): d for d in api(braid, "GET", "braid/delays").json()}
        wanted = ("amq.queue.soon", 0), ("kdelay", 0)
        ticks = [d for (topic, _p), d in found.items() if topic == "ticks"]
        return found if all(w in found for w in wanted) and ticks else None

    found = wait_for(listed, "the delays of the three protocols")
    soon = found[("amq.queue.soon", 0)]
    assert (soon["vhost"], soon["queue"], soon["messages"]) == ("/", "soon", 2)
    assert found[("kdelay", 0)]["messages"] == 1
    assert found[("kdelay", 0)]["queue"] is None
    assert sum(d["messages"] for (topic, _p), d in found.items() if topic == "ticks") == 1
    for delayed in found.values():
        assert before + DELAY_S * 1000 <= delayed["next_due_ms"] <= after + DELAY_S * 1000
    connection.close()


def dead_letter_setup(channel: Any, count: int) -> None:
    channel.exchange_declare("dlx", "fanout", durable=True)
    channel.queue_declare("dlq", durable=True)
    channel.queue_bind("dlq", "dlx")
    channel.queue_declare("work", durable=True, arguments={"x-dead-letter-exchange": "dlx"})
    for index in range(count):
        channel.basic_publish(
            "",
            "work",
            f"job {index}".encode(),
            pika.BasicProperties(headers={"n": index}, expiration="3600000"),
        )
    for _ in range(count):
        method, _properties, _body = channel.basic_get("work")
        channel.basic_reject(method.delivery_tag, requeue=False)


def take_all(channel: Any, queue: str) -> list[tuple[Any, Any, bytes]]:
    taken = []
    while True:
        method, properties, body = channel.basic_get(queue, auto_ack=True)
        if method is None:
            return taken
        taken.append((method, properties, body))


def test_dead_letter_queues_and_redrive(braid: BraidProcess) -> None:
    connection, channel = pika_channel(braid)
    dead_letter_setup(channel, 5)
    listed = wait_for(
        lambda: [q for q in api(braid, "GET", "braid/dead-letters").json() if q["messages"] == 5],
        "five dead letters in dlq",
    )
    assert [
        (q["vhost"], q["queue"], q["dead_letter_exchanges"], q["dead_lettered_from"])
        for q in listed
    ] == [("/", "dlq", ["dlx"], ["work"])]

    moved = api(braid, "POST", "braid/dead-letters/%2F/dlq/redrive", {"count": 3})
    assert moved.status_code == 200, moved.text
    assert moved.json() == {
        "moved": 3,
        "to": [{"vhost": "/", "queue": "work", "topic": "amq.queue.work", "messages": 3}],
        "left": [],
    }
    back = take_all(channel, "work")
    assert [body for _m, _p, body in back] == [b"job 0", b"job 1", b"job 2"]
    method, properties, _body = back[0]
    # As a shovel's re-publish to the queue shows it: the default exchange, the queue's name,
    # the death history kept, the expiration it died with gone (RabbitMQ drops it).
    assert (method.exchange, method.routing_key) == ("", "work")
    assert properties.headers["x-first-death-queue"] == "work"
    assert properties.headers["x-first-death-reason"] == "rejected"
    assert properties.headers["n"] == 0
    assert properties.expiration is None
    assert [q["messages"] for q in api(braid, "GET", "braid/dead-letters").json()] == [2]

    rest = api(braid, "POST", "braid/dead-letters/%2F/dlq/redrive")
    assert rest.json()["moved"] == 2
    assert [body for _m, _p, body in take_all(channel, "work")] == [b"job 3", b"job 4"]
    assert take_all(channel, "dlq") == []

    assert api(braid, "POST", "braid/dead-letters/%2F/nothing/redrive").status_code == 404
    assert api(braid, "POST", "braid/dead-letters/%2F/dlq/redrive", {"count": 0}).status_code == 400
    assert api(braid, "GET", "braid/dead-letters/%2F/dlq/redrive").status_code == 405
    api(braid, "PUT", "users/watcher", {"password": "w", "tags": "monitoring"})
    watcher = ("watcher", "w")
    assert api(braid, "GET", "braid/dead-letters", auth=watcher).status_code == 200
    assert api(braid, "GET", "braid/delays", auth=watcher).status_code == 200
    refused = api(braid, "POST", "braid/dead-letters/%2F/dlq/redrive", auth=watcher)
    assert refused.status_code == 401
    connection.close()


def test_redrive_survives_a_restart(braid: BraidProcess) -> None:
    connection, channel = pika_channel(braid)
    dead_letter_setup(channel, 4)
    connection.close()
    wait_for(
        lambda: [q for q in api(braid, "GET", "braid/dead-letters").json() if q["messages"] == 4],
        "four dead letters",
    )
    assert api(braid, "POST", "braid/dead-letters/%2F/dlq/redrive", {"count": 2}).ok
    braid.kill9()
    braid.start()
    connection, channel = pika_channel(braid)
    assert [b for _m, _p, b in take_all(channel, "work")] == [b"job 0", b"job 1"]
    assert [b for _m, _p, b in take_all(channel, "dlq")] == [b"job 2", b"job 3"]
    connection.close()


def value_of(field: dict[str, str]) -> bytes:
    if field["encoding"] == "base64":
        return base64.b64decode(field["value"])
    return field["value"].encode()


def test_a_record_as_each_protocol_sees_it(braid: BraidProcess) -> None:
    connection, channel = pika_channel(braid)
    channel.exchange_declare("events", "topic", durable=True)
    channel.basic_publish(
        "events",
        "room.1",
        b"from amqp",
        pika.BasicProperties(
            content_type="text/plain",
            correlation_id="c-1",
            headers={"site": "north", "level": 3},
        ),
    )
    connection.close()
    # linger: the three records go as ONE batch (the test reads batch_records == 3); without it
    # the sender thread may ship the first before the others are appended (seen in CI).
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap, linger_ms=10_000)
    for index in range(3):
        producer.send(
            "events",
            f"kafka {index}".encode(),
            key=f"room.{index}".encode(),
            headers=[("site", b"south"), ("raw", b"\xff")],
            partition=0,
        )
    producer.flush(30)
    producer.close()
    live = MqttClient(braid, "recorder")
    properties = Properties(PacketTypes.PUBLISH)
    properties.UserProperty = [("site", "east")]
    properties.ContentType = "application/json"
    properties.ResponseTopic = "replies/1"
    live.client.publish(
        "events/room/9", b'{"t": 1}', qos=1, properties=properties
    ).wait_for_publish(30)
    live.close()

    records = wait_for(
        lambda: (
            (found := [api(braid, "GET", f"braid/records/events/0/{o}") for o in range(5)])
            and all(r.status_code == 200 for r in found)
            and [r.json() for r in found]
        ),
        "five records in events/0",
    )
    amqp_record, *kafka_records, mqtt_record = records
    # The AMQP publish, as each sees it.
    assert amqp_record["stored"]["protocol"] == "amqp"
    assert amqp_record["amqp"]["exchange"] == "events"
    assert amqp_record["amqp"]["routing_key"] == "room.1"
    assert amqp_record["amqp"]["properties"]["content_type"] == "text/plain"
    assert amqp_record["amqp"]["properties"]["correlation_id"] == "c-1"
    assert amqp_record["amqp"]["headers"] == {"site": "north", "level": 3}
    assert amqp_record["mqtt"]["topic"] == "events/room/1"
    assert amqp_record["mqtt"]["properties"]["content_type"] == "text/plain"
    assert ["site", "north"] in amqp_record["mqtt"]["properties"]["user_properties"]
    assert value_of(amqp_record["kafka"]["key"]) == b"room.1"
    assert value_of(amqp_record["kafka"]["value"]) == b"from amqp"
    kafka_headers = {h["key"]: value_of(h["value"]) for h in amqp_record["kafka"]["headers"]}
    assert kafka_headers["site"] == b"north"
    assert kafka_headers["x-braid-content-type"] == b"text/plain"
    # The records of one Kafka batch, each at its own offset with its own key and headers.
    assert [r["kafka"]["offset"] for r in kafka_records] == [1, 2, 3]
    assert [value_of(r["kafka"]["key"]) for r in kafka_records] == [b"room.0", b"room.1", b"room.2"]
    second = kafka_records[1]
    assert second["stored"]["batch_records"] == 3
    assert [(h["key"], value_of(h["value"])) for h in second["kafka"]["headers"]] == [
        ("site", b"south"),
        ("raw", b"\xff"),
    ]
    assert (second["amqp"]["exchange"], second["amqp"]["routing_key"]) == ("events", "room.1")
    assert second["amqp"]["headers"]["site"] == "south"
    assert second["mqtt"]["topic"] == "events/room/1"
    assert second["mqtt"]["qos"] == 1
    # The MQTT publish.
    assert mqtt_record["stored"]["protocol"] == "mqtt"
    assert mqtt_record["mqtt"]["topic"] == "events/room/9"
    assert mqtt_record["mqtt"]["properties"]["content_type"] == "application/json"
    assert mqtt_record["mqtt"]["properties"]["response_topic"] == "replies/1"
    assert mqtt_record["mqtt"]["properties"]["user_properties"] == [["site", "east"]]
    assert mqtt_record["amqp"]["routing_key"] == "room.9"
    assert mqtt_record["amqp"]["properties"]["content_type"] == "application/json"
    assert mqtt_record["amqp"]["properties"]["reply_to"] == "replies/1"
    assert mqtt_record["amqp"]["headers"] == {"site": "east"}
    assert value_of(mqtt_record["kafka"]["key"]) == b"room.9"
    assert json.loads(value_of(mqtt_record["kafka"]["value"])) == {"t": 1}

    assert api(braid, "GET", "braid/records/events/0/99").status_code == 404
    assert api(braid, "GET", "braid/records/events/0/x").status_code == 400
    api(braid, "PUT", "users/watcher", {"password": "w", "tags": "monitoring"})
    shown = api(braid, "GET", "braid/records/events/0/0", auth=("watcher", "w"))
    assert shown.status_code == 401  # a record's body is for administrators


class Crash(BaseException):
    """The process dying between two appends (not an error the redrive would clean up)."""


def open_broker(data: Path) -> tuple[LogStore, Node, BrokerAPI]:
    store = LogStore(LogConfig(data, durability="async"))
    broker = Node(store)
    return store, broker, BrokerAPI(broker)


async def test_a_redrive_cut_by_a_crash_leaves_each_record_in_one_queue(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store, broker, api_ = open_broker(data)
    await broker.declare_topic("dlx")
    dead, _ = await broker.declare_ack_queue("dlq")
    await broker.bind("dlx", "fanout", "", ("dlq", 0))
    policy = DeadLetterPolicy(dead_letter_topic="dlx")
    work, _ = await broker.declare_ack_queue("work", 0, AckQueueConfig(dead_letter=policy))
    for index in range(5):
        broker.shard.store.append("work", 0, f"job {index}".encode(), subject="job")
    for _ in range(5):
        delivery = work.get(no_ack=False)
        assert delivery is not None
        work.nack(delivery.offset, requeue=False)
    broker.shard.flush_ack_states()
    assert dead.message_count() == 5

    calls = 0

    def dies_at_the_third(_topic: str) -> str:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise Crash
        return "work"

    with pytest.raises(Crash):
        api_.redrive_dead_letters(INTERNAL_CONTEXT, "dlq", None, dies_at_the_third)
    store.flush()  # what a killed process leaves in the page cache is on disk for the next

    # The next process over the same files: the first is gone without closing.
    _store2, broker2, api2 = open_broker(data)
    (listed,) = api2.dead_letter_queues(INTERNAL_CONTEXT)
    assert (listed.topic, listed.ready) == ("dlq", 3)
    work2 = broker2.ack_queue("work")
    dead2 = broker2.ack_queue("dlq")
    assert work2 is not None
    assert dead2 is not None
    in_work = drain(work2)
    in_dlq = drain(dead2)
    assert in_work == [b"job 0", b"job 1"]
    assert in_dlq == [b"job 2", b"job 3", b"job 4"]


def drain(queue: Any) -> list[bytes]:
    bodies = []
    while (delivery := queue.get(no_ack=True)) is not None:
        bodies.append(bytes(delivery.message.body))
    return bodies


def gauge(braid: BraidProcess, name: str) -> float:
    text = requests.get(f"http://127.0.0.1:{braid.http_port}/metrics", timeout=30).text
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return float(sum(sample.value for sample in family.samples))
    raise AssertionError(f"no {name} in /metrics")


def test_rabbitmq_channels_counts_the_channels_open_now(braid: BraidProcess) -> None:
    connection, _first = pika_channel(braid)
    channels = [connection.channel() for _ in range(3)]
    assert gauge(braid, "rabbitmq_channels") == 4
    # A channel the broker closes (404 on a passive declare) is gone too.
    with pytest.raises(pika.exceptions.ChannelClosedByBroker):
        channels[0].queue_declare("missing", passive=True)
    channels[1].close()
    assert gauge(braid, "rabbitmq_channels") == 2
    other, _channel = pika_channel(braid)
    assert gauge(braid, "rabbitmq_channels") == 3
    other.close()
    connection.close()
    wait_for(lambda: gauge(braid, "rabbitmq_channels") == 0, "no channel open")
