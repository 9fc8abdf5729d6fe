"""``braid connection list|close``, ``braid group list|describe`` and ``braid session list``
(issue 19 item 5) run as subprocesses against a real ``braid serve`` with real clients
connected: pika, paho (3.1.1 and 5.0) and kafka-python. What they print as tables and as JSON,
what ``close`` does to the client, and the broker's refusals as exit code 1 with its reason."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata

from tests.braid_process import BraidProcess
from tests.management.test_cli_resources import braid_cli, ok, table, wait_for

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("nouns")) as process:
        yield process


class Paho:
    """A paho client on its own thread; ``disconnect_reason``: what the broker said going."""

    def __init__(
        self, braid: BraidProcess, client_id: str, version: int, *, clean: bool = True
    ) -> None:
        self.connected = threading.Event()
        self.gone = threading.Event()
        self.disconnect_reason: Any = None
        self.subscribed: set[int] = set()
        kwargs: dict[str, Any] = {"clean_session": clean} if version == mqtt.MQTTv311 else {}
        self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=version, **kwargs
        )
        self.client.on_connect = lambda *_args: self.connected.set()
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = lambda _c, _u, mid, _r, _p: self.subscribed.add(mid)
        self.client.connect("127.0.0.1", braid.mqtt_port)
        self.client.loop_start()
        assert self.connected.wait(DEADLINE_S)

    def _on_disconnect(self, _c: Any, _u: Any, _flags: Any, reason: Any, _p: Any) -> None:
        self.disconnect_reason = reason
        self.gone.set()

    def subscribe(self, topic_filter: str) -> None:
        _, mid = self.client.subscribe(topic_filter, qos=1)
        wait_for(lambda: mid in self.subscribed, "a SUBACK")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_connection_list_shows_every_protocol_and_close_closes_one(braid: BraidProcess) -> None:
    amqp = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            braid.amqp_port,
            credentials=pika.PlainCredentials("guest", "guest"),
            client_properties={"connection_name": "billing-app"},
        )
    )
    meter = Paho(braid, "meter-7", mqtt.MQTTv5)
    consumer = KafkaConsumer(bootstrap_servers=braid.kafka_bootstrap, client_id="lister")
    consumer.topics()  # a Metadata round trip: the connection is open and registered
    try:
        rows = wait_for(
            lambda: (
                lambda found: (
                    found
                    if {"billing-app", "meter-7", "lister"} <= {row[4] for row in found[1:]}
                    else None
                )
            )(table(ok(braid_cli(braid, "connection", "list")))),
            "the three clients in the table",
        )
        assert rows[0] == ["NAME", "PROTOCOL", "USER", "VHOST", "CLIENT", "PEER", "CHANNELS"]
        by_client = {row[4]: row for row in rows[1:]}
        assert by_client["billing-app"][1] == "AMQP 0-9-1"
        assert by_client["billing-app"][2] == "guest"
        assert by_client["meter-7"][1] == "MQTT 5.0"
        assert by_client["lister"][1] == "Kafka"
        assert by_client["meter-7"][5].startswith("127.0.0.1:")

        listed = json.loads(ok(braid_cli(braid, "connection", "list", "--json")))
        meter_name = next(
            c["name"] for c in listed if c["client_properties"].get("client_id") == "meter-7"
        )
        assert by_client["meter-7"][0] == meter_name
        vhost_rows = table(ok(braid_cli(braid, "connection", "list", "--vhost", "/")))
        assert {row[4] for row in vhost_rows[1:]} >= {"billing-app", "meter-7"}

        out = ok(braid_cli(braid, "connection", "close", meter_name, "--reason", "maintenance"))
        assert out.strip() == f"closed connection {meter_name}"
        assert meter.gone.wait(DEADLINE_S)
        assert meter.disconnect_reason is not None
        assert int(meter.disconnect_reason.value) == 0x98  # Administrative action
        wait_for(
            lambda: "meter-7" not in ok(braid_cli(braid, "connection", "list")), "meter-7 gone"
        )

        missing = braid_cli(braid, "connection", "close", "no such connection")
        assert missing.returncode == 1
        assert "braid connection: error: DELETE /api/connections/" in missing.stderr
        assert "404" in missing.stderr
    finally:
        meter.close()
        consumer.close()
        amqp.close()


def test_group_list_and_describe_show_the_lag(braid: BraidProcess) -> None:
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    for index in range(10):
        producer.send("invoices", f"i{index}".encode(), partition=0).get(timeout=DEADLINE_S)
    producer.close()
    consumer = KafkaConsumer(
        "invoices",
        bootstrap_servers=braid.kafka_bootstrap,
        group_id="billing",
        client_id="biller",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        wait_for(lambda: consumer.poll(timeout_ms=200), "records for the group")
        consumer.commit({TopicPartition("invoices", 0): OffsetAndMetadata(4, "", -1)})

        rows = table(ok(braid_cli(braid, "group", "list")))
        assert rows[0] == ["GROUP", "STATE", "PROTOCOL_TYPE", "MEMBERS", "LAG"]
        assert ["billing", "Stable", "consumer", "1", "6"] in rows[1:]
        groups = json.loads(ok(braid_cli(braid, "group", "list", "--json")))
        assert [g["lag"] for g in groups if g["group_id"] == "billing"] == [6]

        out = ok(braid_cli(braid, "group", "describe", "billing"))
        assert out.splitlines()[0].split() == [
            "group", "billing", "state", "Stable", "protocol", "type", "consumer", "lag", "6"
        ]  # fmt: skip
        described = table(out)
        assert ["TOPIC", "PARTITION", "COMMITTED", "LOG_START", "LOG_END", "LAG"] in described
        assert ["invoices", "0", "4", "0", "10", "6"] in described
        members = described[described.index(["MEMBER", "CLIENT_ID", "CLIENT_HOST"]) + 1]
        assert members[1] == "biller"
        document = json.loads(ok(braid_cli(braid, "group", "describe", "billing", "--json")))
        assert document["partitions"][0]["lag"] == 6

        missing = braid_cli(braid, "group", "describe", "nobody-here")
        assert missing.returncode == 1
        assert "404" in missing.stderr
    finally:
        consumer.close()


def test_session_list_shows_connected_and_persistent_sessions(braid: BraidProcess) -> None:
    device = Paho(braid, "dev-1", mqtt.MQTTv311, clean=False)
    device.subscribe("fleet/dev-1/cmd")
    device.close()
    live = Paho(braid, "console-1", mqtt.MQTTv5)
    try:
        publisher = Paho(braid, "pub-1", mqtt.MQTTv5)
        for _ in range(2):
            publisher.client.publish("fleet/dev-1/cmd", b"reboot", qos=1).wait_for_publish(30)
        publisher.close()

        def rows() -> list[list[str]] | None:
            found = table(ok(braid_cli(braid, "session", "list")))
            by_id = {row[0]: row for row in found[1:]}
            dev = by_id.get("dev-1")
            return found if dev is not None and dev[5] == "2" and "console-1" in by_id else None

        found = wait_for(rows, "dev-1 with 2 queued messages")
        assert found[0] == [
            "CLIENT_ID", "CONNECTED", "PERSISTENT", "PROTOCOL", "USER", "READY", "UNACKED"
        ]  # fmt: skip
        by_id = {row[0]: row for row in found[1:]}
        assert by_id["dev-1"][1:3] == ["no", "yes"]
        assert by_id["console-1"][1:4] == ["yes", "no", "MQTT 5.0"]
        sessions = json.loads(ok(braid_cli(braid, "session", "list", "--json")))
        dev = next(s for s in sessions if s["client_id"] == "dev-1")
        assert (dev["connected"], dev["persistent"], dev["messages_ready"]) == (False, True, 2)
    finally:
        live.close()


def test_a_user_without_the_monitoring_tag_is_refused(braid: BraidProcess) -> None:
    ok(braid_cli(braid, "user", "add", "plain", "--password-stdin", stdin="pw\n"))
    result = braid_cli(braid, "group", "list", admin=("plain", "pw"))
    assert result.returncode == 1
    assert "braid group: error: GET /api/braid/kafka/groups:" in result.stderr
    assert "401" in result.stderr or "403" in result.stderr
