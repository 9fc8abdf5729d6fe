"""Connections and channels of all three protocols in the management API (issue 19):
``/api/connections``, ``/api/channels``, ``/api/vhosts/{v}/connections``, DELETE closing one as
each protocol does, and ``rabbitmq_connections`` on ``/metrics``; with pika, paho-mqtt (5.0) and
aiokafka connected to a real ``braid serve``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import paho.mqtt.client as mqtt
import pika
import pytest
import requests
from aiokafka import AIOKafkaProducer
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess
from tests.management.test_rabbit_api import GUEST, api, wait_for


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path) as process:
        yield process


def by_protocol(braid: BraidProcess) -> dict[str, dict[str, Any]]:
    listed = api(braid, "GET", "connections")
    assert listed.status_code == 200, listed.text
    return {c["protocol"]: c for c in listed.json()}


def connection_path(name: str) -> str:
    return "connections/" + quote(name, safe="")


def pika_connection(braid: BraidProcess) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            braid.amqp_port,
            credentials=pika.PlainCredentials(*GUEST),
            client_properties={"connection_name": "billing-worker"},
        )
    )


class MqttClient:
    """A paho 5.0 client whose disconnect reason is kept (no reconnect)."""

    def __init__(self, braid: BraidProcess, client_id: str) -> None:
        self.connected = threading.Event()
        self.disconnected = threading.Event()
        self.reason: int | None = None
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.on_connect = lambda *_args: self.connected.set()
        self.client.on_disconnect = self._on_disconnect
        self.client.connect("127.0.0.1", braid.mqtt_port, keepalive=30)
        self.client.loop_start()
        assert self.connected.wait(30)

    def _on_disconnect(
        self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _p: Any
    ) -> None:
        if self.reason is None:
            self.reason = int(reason.value)
            self.disconnected.set()
            self.client.loop_stop()  # (from its own thread: no join) no reconnect

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


async def test_connections_and_channels_of_three_protocols(braid: BraidProcess) -> None:
    connection = pika_connection(braid)
    first = connection.channel()
    first.basic_qos(prefetch_count=7)
    first.queue_declare("jobs", durable=True)
    first.basic_consume("jobs", lambda *_args: None, consumer_tag="worker-1")
    second = connection.channel()
    second.confirm_delivery()
    device = MqttClient(braid, "sensor-42")
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, client_id="orders-app")
    await producer.start()
    try:
        await producer.send_and_wait("orders", b"one")

        listed = wait_for(
            lambda: (found := by_protocol(braid)) and len(found) == 3 and found,
            "three protocols' connections",
        )
        amqp = listed["AMQP 0-9-1"]
        assert amqp["user"] == "guest"
        assert amqp["vhost"] == "/"
        assert amqp["channels"] == 2
        assert amqp["peer_host"] == "127.0.0.1"
        assert amqp["port"] == braid.amqp_port
        assert amqp["name"] == f"127.0.0.1:{amqp['peer_port']} -> 127.0.0.1:{braid.amqp_port}"
        assert amqp["client_properties"]["product"] == "Pika Python Client Library"
        assert amqp["user_provided_name"] == "billing-worker"
        assert amqp["state"] == "running"
        mqtt_listed = listed["MQTT 5.0"]
        assert mqtt_listed["client_properties"] == {"client_id": "sensor-42"}
        assert mqtt_listed["port"] == braid.mqtt_port
        kafka = listed["Kafka"]
        assert kafka["client_properties"] == {"client_id": "orders-app"}
        assert kafka["port"] == braid.kafka_port

        one = api(braid, "GET", connection_path(amqp["name"]))
        assert one.status_code == 200
        assert one.json()["name"] == amqp["name"]
        assert api(braid, "GET", connection_path("nobody -> nowhere")).status_code == 404

        channels = api(braid, "GET", "channels").json()
        assert [(c["number"], c["prefetch_count"], c["consumer_count"]) for c in channels] == [
            (1, 7, 1),
            (2, 0, 0),
        ]
        assert channels[1]["confirm"] is True
        assert channels[0]["name"] == f"{amqp['name']} (1)"
        assert channels[0]["connection_details"]["name"] == amqp["name"]
        assert api(braid, "GET", connection_path(amqp["name"]) + "/channels").json() == channels
        assert (
            api(braid, "GET", "channels/" + quote(channels[0]["name"], safe="")).json()
            == (channels[0])
        )
        vhost = api(braid, "GET", "vhosts/%2F/connections").json()
        assert {c["protocol"] for c in vhost} == {"AMQP 0-9-1", "MQTT 5.0", "Kafka"}
        assert len(api(braid, "GET", "vhosts/%2F/channels").json()) == 2
        consumers = api(braid, "GET", "consumers").json()
        assert consumers[0]["channel_details"]["name"] == f"{amqp['name']} (1)"

        # (aiokafka may hold a bootstrap connection besides its broker one.)
        count = len(api(braid, "GET", "connections").json())
        assert count >= 3
        overview = api(braid, "GET", "overview").json()
        assert overview["object_totals"]["connections"] == count
        assert overview["object_totals"]["channels"] == 2
        metrics = await asyncio.to_thread(
            lambda: requests.get(f"http://127.0.0.1:{braid.http_port}/metrics", timeout=30).text
        )
        assert f"rabbitmq_connections {count}" in metrics.splitlines()

        # A management user without monitoring sees only its own connections.
        api(braid, "PUT", "users/plain", {"password": "p", "tags": "management"})
        assert api(braid, "GET", "connections", auth=("plain", "p")).json() == []
        refused = api(braid, "DELETE", connection_path(amqp["name"]), auth=("plain", "p"))
        assert refused.status_code == 404
    finally:
        await producer.stop()
        device.close()
        if connection.is_open:
            connection.close()


def test_delete_closes_an_amqp_connection_with_320(braid: BraidProcess) -> None:
    connection = pika_connection(braid)
    channel = connection.channel()
    name = wait_for(lambda: by_protocol(braid).get("AMQP 0-9-1"), "the AMQP connection")["name"]
    closed = api(braid, "DELETE", connection_path(name))
    assert closed.status_code == 204

    def use_until_closed() -> None:
        while True:
            connection.process_data_events(0.1)
            channel.queue_declare("", exclusive=True)

    with pytest.raises(pika.exceptions.ConnectionClosedByBroker) as error:
        use_until_closed()
    assert error.value.reply_code == 320
    assert error.value.reply_text == "CONNECTION_FORCED - Closed via management plugin"
    wait_for(lambda: "AMQP 0-9-1" not in by_protocol(braid), "the connection gone from the list")


def test_delete_with_a_reason_disconnects_an_mqtt_5_client_with_0x98(
    braid: BraidProcess,
) -> None:
    device = MqttClient(braid, "to-be-kicked")
    name = wait_for(lambda: by_protocol(braid).get("MQTT 5.0"), "the MQTT connection")["name"]
    closed = requests.delete(
        f"http://127.0.0.1:{braid.http_port}/api/{connection_path(name)}",
        auth=GUEST,
        headers={"X-Reason": "maintenance"},
        timeout=30,
    )
    assert closed.status_code == 204
    assert device.disconnected.wait(30)
    assert device.reason == 0x98  # Administrative action
    wait_for(lambda: "MQTT 5.0" not in by_protocol(braid), "the connection gone from the list")


async def test_delete_closes_a_kafka_connection(braid: BraidProcess) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, client_id="kicked")
    await producer.start()
    try:
        await producer.send_and_wait("t", b"before")
        names = {c["name"] for c in api(braid, "GET", "connections").json()}
        assert names
        for name in names:
            assert api(braid, "DELETE", connection_path(name)).status_code == 204
        wait_for(
            lambda: not names & {c["name"] for c in api(braid, "GET", "connections").json()},
            "the closed connections gone from the list",
        )
        # The client reconnects by itself, as after any broker-side close.
        await asyncio.wait_for(producer.send_and_wait("t", b"after"), 60)
        assert api(braid, "GET", "connections").json()
    finally:
        await producer.stop()
