"""The RabbitMQ management API subset (issue 19 item 1) against ``braid serve``, over plain HTTP
after real pika, paho-mqtt and kafka-python traffic, and with the real ``rabbitmqadmin``."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
import requests
from kafka import KafkaProducer

from tests.braid_process import BraidProcess

GUEST = ("guest", "guest")
RABBITMQADMIN = shutil.which("rabbitmqadmin")


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path) as process:
        yield process


def api(braid: BraidProcess, method: str, path: str, body: Any = None, auth=GUEST):
    return requests.request(
        method,
        f"http://127.0.0.1:{braid.http_port}/api/{path}",
        auth=auth,
        data=None if body is None else json.dumps(body),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )


def wait_for(predicate, what: str, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def amqp_traffic(braid: BraidProcess) -> pika.BlockingConnection:
    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials(*GUEST)
        )
    )
    channel = connection.channel()
    channel.exchange_declare("orders", "topic", durable=True)
    channel.queue_declare("billing", durable=True, arguments={"x-max-length": 100})
    channel.queue_bind("billing", "orders", "order.*")
    channel.confirm_delivery()
    for index in range(5):
        channel.basic_publish(
            "orders",
            "order.created",
            f"order {index}".encode(),
            pika.BasicProperties(content_type="text/plain", headers={"n": index}),
        )
    return connection


def test_queues_exchanges_bindings_purge_get_after_real_traffic(braid: BraidProcess) -> None:
    connection = amqp_traffic(braid)
    # MQTT and Kafka traffic too: the overview counts the topics they made, AMQP's API does not
    # list them as queues.
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="mgmt-test")
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    client.publish("sensors/t1", b"21.5", qos=1).wait_for_publish(30)
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    producer.send("kafka-topic", b"hello").get(timeout=30)
    producer.close()

    queue = api(braid, "GET", "queues/%2F/billing")
    assert queue.status_code == 200, queue.text
    body = queue.json()
    assert body["name"] == "billing"
    assert body["vhost"] == "/"
    assert body["messages"] == 5
    assert body["messages_ready"] == 5
    assert body["messages_unacknowledged"] == 0
    assert body["consumers"] == 0
    assert body["durable"] is True
    assert body["arguments"] == {"x-max-length": 100}
    assert "rate" in body["messages_details"]

    # A consumer holding two unacked: counts move, /api/consumers lists it.
    channel = connection.channel()
    channel.basic_qos(prefetch_count=2)
    held = []
    channel.basic_consume("billing", lambda ch, method, props, body: held.append(method))
    wait_for(lambda: (connection.process_data_events(0.05), len(held) == 2)[1], "2 deliveries")
    queue = api(braid, "GET", "queues/%2F/billing").json()
    assert (queue["messages_ready"], queue["messages_unacknowledged"], queue["consumers"]) == (
        3,
        2,
        1,
    )
    consumers = api(braid, "GET", "consumers").json()
    assert [(c["queue"]["name"], c["prefetch_count"], c["ack_required"]) for c in consumers] == [
        ("billing", 2, True)
    ]
    channel.close()  # the two go back

    listed = {(q["vhost"], q["name"]) for q in api(braid, "GET", "queues").json()}
    assert ("/", "billing") in listed
    assert all(not name.startswith("kafka-topic") for _v, name in listed)

    exchanges = {e["name"]: e for e in api(braid, "GET", "exchanges/%2F").json()}
    assert exchanges["orders"]["type"] == "topic"
    assert exchanges["orders"]["durable"] is True
    assert "" in exchanges
    assert "amq.topic" in exchanges
    one = api(braid, "GET", "exchanges/%2F/orders")
    assert one.status_code == 200
    assert one.json()["name"] == "orders"
    assert api(braid, "GET", "exchanges/%2F/missing").status_code == 404

    bindings = api(braid, "GET", "queues/%2F/billing/bindings").json()
    assert {(b["source"], b["routing_key"]) for b in bindings} == {
        ("", "billing"),
        ("orders", "order.*"),
    }
    source = api(braid, "GET", "exchanges/%2F/orders/bindings/source").json()
    assert [(b["destination"], b["destination_type"]) for b in source] == [("billing", "queue")]

    # get with requeue: the records stay, flagged redelivered the next time.
    got = api(
        braid,
        "POST",
        "queues/%2F/billing/get",
        {"count": 2, "ackmode": "ack_requeue_true", "encoding": "auto"},
    )
    assert got.status_code == 200, got.text
    messages = got.json()
    assert [m["payload"] for m in messages] == ["order 0", "order 1"]
    assert messages[0]["routing_key"] == "order.created"
    assert messages[0]["exchange"] == "orders"
    assert messages[0]["properties"]["content_type"] == "text/plain"
    assert messages[0]["properties"]["headers"] == {"n": 0}
    assert messages[0]["message_count"] == 4
    assert api(braid, "GET", "queues/%2F/billing").json()["messages"] == 5
    # get without requeue takes them.
    taken = api(
        braid, "POST", "queues/%2F/billing/get", {"count": 1, "ackmode": "ack_requeue_false"}
    ).json()
    assert taken[0]["payload"] == "order 0"
    assert taken[0]["redelivered"] is True
    assert api(braid, "GET", "queues/%2F/billing").json()["messages"] == 4

    purged = api(braid, "DELETE", "queues/%2F/billing/contents")
    assert purged.status_code == 204
    assert api(braid, "GET", "queues/%2F/billing").json()["messages"] == 0

    overview = api(braid, "GET", "overview").json()
    assert overview["object_totals"]["queues"] >= 1
    assert overview["object_totals"]["connections"] >= 2  # pika and paho still connected
    assert {listener["protocol"] for listener in overview["listeners"]} >= {
        "amqp",
        "mqtt",
        "kafka",
        "http",
    }
    nodes = api(braid, "GET", "nodes").json()
    assert nodes[0]["running"] is True
    assert nodes[0]["name"] == overview["node"]

    client.loop_stop()
    client.disconnect()
    connection.close()


def test_declare_delete_bind_over_http_is_what_amqp_clients_see(braid: BraidProcess) -> None:
    assert (
        api(braid, "PUT", "exchanges/%2F/events", {"type": "fanout", "durable": True}).status_code
        == 201
    )
    assert (
        api(braid, "PUT", "queues/%2F/audit", {"durable": True, "arguments": {}}).status_code == 201
    )
    # Redeclaring with another durability: RabbitMQ's 406 text as a 400.
    clash = api(braid, "PUT", "queues/%2F/audit", {"durable": False})
    assert clash.status_code == 400
    assert "inequivalent arg 'durable'" in clash.json()["reason"]
    bound = api(
        braid, "POST", "bindings/%2F/e/events/q/audit", {"routing_key": "", "arguments": {}}
    )
    assert bound.status_code == 201
    assert bound.headers["Location"].endswith("/~")

    connection = pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1", braid.amqp_port, credentials=pika.PlainCredentials(*GUEST)
        )
    )
    channel = connection.channel()
    channel.queue_declare("audit", passive=True)  # the AMQP side sees it at once
    channel.confirm_delivery()
    channel.basic_publish("events", "", b"via amqp")
    published = api(
        braid,
        "POST",
        "exchanges/%2F/amq.default/publish",
        {
            "properties": {"delivery_mode": 2},
            "routing_key": "audit",
            "payload": "via http",
            "payload_encoding": "string",
        },
    )
    assert published.json() == {"routed": True}
    unrouted = api(
        braid,
        "POST",
        "exchanges/%2F/amq.default/publish",
        {"properties": {}, "routing_key": "nowhere", "payload": "x", "payload_encoding": "string"},
    )
    assert unrouted.json() == {"routed": False}
    bodies = []
    for _ in range(2):
        method, _props, body = channel.basic_get("audit", auto_ack=True)
        assert method is not None
        bodies.append(body)
    assert bodies == [b"via amqp", b"via http"]

    assert api(braid, "DELETE", "bindings/%2F/e/events/q/audit/~").status_code == 204
    assert api(braid, "GET", "bindings/%2F/e/events/q/audit").json() == []
    assert api(braid, "DELETE", "queues/%2F/audit").status_code == 204
    assert api(braid, "GET", "queues/%2F/audit").status_code == 404
    with pytest.raises(pika.exceptions.ChannelClosedByBroker) as closed:
        channel.queue_declare("audit", passive=True)
    assert closed.value.reply_code == 404
    connection.close()
    assert api(braid, "DELETE", "exchanges/%2F/events").status_code == 204


def test_tags_decide_who_sees_what(braid: BraidProcess) -> None:
    assert (
        api(braid, "PUT", "users/watcher", {"password": "w", "tags": "monitoring"}).status_code
        == 201
    )
    assert (
        api(braid, "PUT", "users/plain", {"password": "p", "tags": "management"}).status_code == 201
    )
    assert api(braid, "PUT", "users/nobody", {"password": "n", "tags": ""}).status_code == 201
    assert api(braid, "PUT", "queues/%2F/q1", {"durable": True}).status_code == 201
    # monitoring: every vhost, nodes; no definitions.
    assert [q["name"] for q in api(braid, "GET", "queues", auth=("watcher", "w")).json()] == ["q1"]
    assert api(braid, "GET", "nodes", auth=("watcher", "w")).status_code == 200
    assert api(braid, "GET", "definitions", auth=("watcher", "w")).status_code == 401
    # management without a permission in "/": sees no queues there, cannot purge; no nodes.
    assert api(braid, "GET", "queues", auth=("plain", "p")).json() == []
    assert api(braid, "DELETE", "queues/%2F/q1/contents", auth=("plain", "p")).status_code == 401
    assert api(braid, "GET", "nodes", auth=("plain", "p")).status_code == 401
    assert api(braid, "GET", "overview", auth=("plain", "p")).status_code == 200
    # Given a permission, the vhost's queues show.
    api(braid, "PUT", "permissions/%2F/plain", {"configure": ".*", "write": ".*", "read": ".*"})
    assert [q["name"] for q in api(braid, "GET", "queues", auth=("plain", "p")).json()] == ["q1"]
    # No management tag at all: refused everywhere.
    assert api(braid, "GET", "overview", auth=("nobody", "n")).status_code == 401


def test_health_checks_and_aliveness(braid: BraidProcess) -> None:
    assert api(braid, "GET", "health/checks/alarms").json() == {"status": "ok"}
    assert api(braid, "GET", "health/checks/local-alarms").status_code == 200
    assert api(braid, "GET", f"health/checks/port-listener/{braid.amqp_port}").status_code == 200
    missing = api(braid, "GET", "health/checks/port-listener/1")
    assert missing.status_code == 503
    assert missing.json()["status"] == "failed"
    assert api(braid, "GET", "health/checks/protocol-listener/amqp").status_code == 200
    assert api(braid, "GET", "health/checks/protocol-listener/stomp").status_code == 503
    assert api(braid, "GET", "health/checks/virtual-hosts").status_code == 200
    assert api(braid, "GET", "aliveness-test/%2F").json() == {"status": "ok"}
    assert api(braid, "GET", "aliveness-test/nope").status_code == 404


def test_definitions_export_import_round_trip(tmp_path: Path, braid: BraidProcess) -> None:
    api(braid, "PUT", "exchanges/%2F/ex1", {"type": "direct", "durable": True})
    api(braid, "PUT", "queues/%2F/qa", {"durable": True, "arguments": {"x-message-ttl": 60000}})
    api(braid, "POST", "bindings/%2F/e/ex1/q/qa", {"routing_key": "k", "arguments": {}})
    exported = api(braid, "GET", "definitions").json()
    assert {
        "name": "qa",
        "vhost": "/",
        "durable": True,
        "auto_delete": False,
        "arguments": {"x-message-ttl": 60000},
    } in exported["queues"]
    assert [e["name"] for e in exported["exchanges"]] == ["ex1"]
    assert {
        "source": "ex1",
        "vhost": "/",
        "destination": "qa",
        "destination_type": "queue",
        "routing_key": "k",
        "arguments": {},
    } in exported["bindings"]
    assert any(u["name"] == "guest" for u in exported["users"])

    # A RabbitMQ export (3.10, rabbit_password_hashing_sha256) into a fresh broker: the user
    # logs in over HTTP with the same password, the objects are there.
    document = {
        "rabbit_version": "3.10.7",
        "users": [
            {
                "name": "carol",
                "password_hash": _rabbit_sha256("carol-pw"),
                "hashing_algorithm": "rabbit_password_hashing_sha256",
                "tags": ["administrator"],
                "limits": {},
            }
        ],
        "vhosts": [{"name": "/"}],
        "permissions": [
            {"user": "carol", "vhost": "/", "configure": ".*", "write": ".*", "read": ".*"}
        ],
        "topic_permissions": [],
        "parameters": [],
        "global_parameters": [],
        "policies": [],
        "queues": exported["queues"],
        "exchanges": exported["exchanges"],
        "bindings": exported["bindings"],
    }
    (tmp_path / "second").mkdir()
    with BraidProcess(tmp_path / "second") as other:
        imported = api(other, "POST", "definitions", document)
        assert imported.status_code == 204, imported.text
        whoami = api(other, "GET", "whoami", auth=("carol", "carol-pw"))
        assert whoami.json() == {"name": "carol", "tags": ["administrator"]}
        again = api(other, "GET", "definitions", auth=("carol", "carol-pw")).json()
        assert again["queues"] == exported["queues"]
        assert again["bindings"] == exported["bindings"]
        refused = api(
            other,
            "POST",
            "definitions",
            {**document, "queues": [{"name": "x", "vhost": "elsewhere"}]},
        )
        assert refused.status_code == 400
        assert "elsewhere" in refused.json()["reason"]


def _rabbit_sha256(password: str) -> str:
    """rabbit_password_hashing_sha256: base64(salt(4) + sha256(salt + password))."""
    import base64
    import hashlib

    salt = b"\x01\x02\x03\x04"
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


def test_rabbitmqadmin_lists_declares_publishes_gets_purges_exports(
    tmp_path: Path, braid: BraidProcess
) -> None:
    assert RABBITMQADMIN is not None, "rabbitmqadmin (Debian's rabbitmq-server) is needed"

    def admin(*args: str) -> str:
        done = subprocess.run(
            [
                RABBITMQADMIN,
                "-H",
                "127.0.0.1",
                "-P",
                str(braid.http_port),
                "-u",
                "guest",
                "-p",
                "guest",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        return done.stdout

    assert "queue declared" in admin("declare", "queue", "name=tools", "durable=true")
    assert "Message published" in admin(
        "publish", "exchange=amq.default", "routing_key=tools", "payload=hello admin"
    )
    listed = json.loads(admin("-f", "raw_json", "list", "queues"))
    assert [(q["name"], q["messages"]) for q in listed] == [("tools", 1)]
    got = admin("get", "queue=tools", "ackmode=ack_requeue_true")
    assert "hello admin" in got
    assert json.loads(admin("-f", "raw_json", "list", "queues"))[0]["messages"] == 1
    assert "queue purged" in admin("purge", "queue", "name=tools")
    assert json.loads(admin("-f", "raw_json", "list", "queues"))[0]["messages"] == 0
    target = tmp_path / "defs.json"
    assert "Exported definitions" in admin("export", str(target))
    assert [q["name"] for q in json.loads(target.read_text())["queues"]] == ["tools"]
    admin("list", "exchanges")
    admin("list", "bindings")
    admin("show", "overview")
