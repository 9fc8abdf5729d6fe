"""``/api/braid/...`` (issue 19): what has no RabbitMQ analogue, after real Kafka and MQTT
traffic: Kafka topics and a consumer group's lag per partition, MQTT sessions (connected and
persistent ones with their queued messages), disconnecting an MQTT client, retained messages
(list, delete one), open transactions."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from kafka import KafkaConsumer, KafkaProducer
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess
from tests.management.test_connections import MqttClient
from tests.management.test_rabbit_api import api, wait_for


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path) as process:
        yield process


def test_kafka_topics_and_group_lag(braid: BraidProcess) -> None:
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    for index in range(5):
        producer.send("lagging", f"record {index}".encode(), partition=0)
    producer.flush(30)
    producer.close()
    consumer = KafkaConsumer(
        "lagging",
        bootstrap_servers=braid.kafka_bootstrap,
        group_id="billing",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=2,
    )
    try:
        taken: list[Any] = []
        wait_for(
            lambda: (
                taken.extend(r for records in consumer.poll(500).values() for r in records)
                or len(taken) >= 2
            ),
            "two records polled",
        )
        consumer.commit()
        topics = {t["name"]: t for t in api(braid, "GET", "braid/kafka/topics").json()}
        assert topics["lagging"]["messages"] == 5
        assert topics["lagging"]["partitions"][0]["log_end_offset"] == 5
        group = api(braid, "GET", "braid/kafka/groups/billing")
        assert group.status_code == 200, group.text
        body = group.json()
        assert body["state"] == "Stable"
        assert len(body["members"]) == 1
        assert [
            (p["topic"], p["partition"], p["committed_offset"], p["log_end_offset"], p["lag"])
            for p in body["partitions"]
        ] == [("lagging", 0, len(taken), 5, 5 - len(taken))]
        assert body["lag"] == 5 - len(taken)
        listed = api(braid, "GET", "braid/kafka/groups").json()
        assert [g["group_id"] for g in listed] == ["billing"]
        assert api(braid, "GET", "braid/kafka/groups/nobody").status_code == 404
        assert api(braid, "GET", "braid/transactions").json() == []
    finally:
        consumer.close()


def test_mqtt_sessions_retained_and_disconnect(braid: BraidProcess) -> None:
    # A persistent 3.1.1 session that is offline while messages for it arrive.
    subscribed = threading.Event()
    keeper = mqtt.Client(
        CallbackAPIVersion.VERSION2,
        client_id="keeper",
        clean_session=False,
        protocol=mqtt.MQTTv311,
    )
    keeper.on_subscribe = lambda *_args: subscribed.set()
    keeper.connect("127.0.0.1", braid.mqtt_port)
    keeper.loop_start()
    keeper.subscribe("sensors/#", qos=1)
    assert subscribed.wait(30)
    keeper.disconnect()
    keeper.loop_stop()

    live = MqttClient(braid, "live-5")
    for topic, payload in (("sensors/t1", b"21.5"), ("sensors/t2", b"\xff\x00")):
        live.client.publish(topic, payload, qos=1, retain=True).wait_for_publish(30)

    sessions = wait_for(
        lambda: (
            (found := {s["client_id"]: s for s in api(braid, "GET", "braid/mqtt/sessions").json()})
            and found.get("keeper", {}).get("messages_ready") == 2
            and found
        ),
        "keeper's two queued messages",
    )
    assert sessions["keeper"]["connected"] is False
    assert sessions["keeper"]["persistent"] is True
    assert sessions["live-5"]["connected"] is True
    assert sessions["live-5"]["protocol"] == "MQTT 5.0"

    retained = api(braid, "GET", "braid/mqtt/retained").json()
    assert [(r["topic"], r["payload"], r["payload_encoding"]) for r in retained] == [
        ("sensors/t1", "21.5", "string"),
        ("sensors/t2", "/wA=", "base64"),
    ]
    assert api(braid, "GET", "braid/mqtt/retained?filter=sensors/%2B").status_code == 200
    assert api(braid, "GET", "braid/mqtt/retained?filter=a/%23/b").status_code == 400
    assert api(braid, "DELETE", "braid/mqtt/retained/sensors/t1").status_code == 204
    assert [r["topic"] for r in api(braid, "GET", "braid/mqtt/retained").json()] == ["sensors/t2"]
    assert api(braid, "DELETE", "braid/mqtt/retained/sensors/t1").status_code == 404

    # Only administrators change things; monitoring is needed to read.
    api(braid, "PUT", "users/watcher", {"password": "w", "tags": "monitoring"})
    api(braid, "PUT", "users/plain", {"password": "p", "tags": "management"})
    assert api(braid, "GET", "braid/mqtt/sessions", auth=("watcher", "w")).status_code == 200
    assert api(braid, "GET", "braid/mqtt/sessions", auth=("plain", "p")).status_code == 401
    refused = api(braid, "DELETE", "braid/mqtt/clients/live-5", auth=("watcher", "w"))
    assert refused.status_code == 401

    assert api(braid, "DELETE", "braid/mqtt/clients/live-5").status_code == 204
    assert live.disconnected.wait(30)
    assert live.reason == 0x98
    assert api(braid, "DELETE", "braid/mqtt/clients/live-5").status_code == 404
