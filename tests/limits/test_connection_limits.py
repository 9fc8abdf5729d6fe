"""Connection limits, decided once in the core (``core/limits``) for every protocol (issue 21
item 1): RabbitMQ's per-user and per-vhost ``max-connections`` set through the management API
(``/api/user-limits``, ``/api/vhost-limits``) and ``[limits] max_connections``; what pika,
paho-mqtt 5.0 and 3.1.1 and a Kafka client see when refused, and that the others go on."""

from __future__ import annotations

import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pika.exceptions
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess
from tests.management.test_rabbit_api import GUEST, api, wait_for
from tests.security.test_mapping_table import Actor, KafkaSession, request

DEADLINE_S = 30
QUOTA_EXCEEDED = 0x97  # MQTT 5.0 CONNACK reason code
# MQTT 3.1.1 CONNACK return code 3 Server unavailable, as paho's VERSION2 callbacks show it (the
# 5.0 reason code it maps 3.1.1's return codes to).
SERVER_UNAVAILABLE_311 = 0x88


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path, listeners=("amqp", "mqtt", "kafka", "http")) as process:
        yield process


def make_user(braid: BraidProcess, user: str, password: str) -> None:
    assert api(braid, "PUT", f"users/{user}", {"password": password, "tags": ""}).ok
    everything = {"configure": ".*", "write": ".*", "read": ".*"}
    assert api(braid, "PUT", f"permissions/%2F/{user}", everything).ok


def amqp(braid: BraidProcess, user: str, password: str) -> pika.BlockingConnection:
    return pika.BlockingConnection(
        pika.ConnectionParameters(
            "127.0.0.1",
            braid.amqp_port,
            credentials=pika.PlainCredentials(user, password),
            connection_attempts=1,
        )
    )


def amqp_refusal(braid: BraidProcess, user: str, password: str) -> tuple[int, str]:
    """The Connection.Close a refused Connection.Open got (pika reports a close at that stage
    as ProbableAccessDeniedError, the broker's reply in its text)."""
    with pytest.raises(pika.exceptions.ProbableAccessDeniedError) as refused:
        amqp(braid, user, password).close()
    # (repr quoting: double quotes around a text with a single quote in it, else single)
    found = re.search(r"ConnectionClosedByBroker: \((\d+)\) (['\"])(.*?)\2", str(refused.value))
    assert found, refused.value
    return int(found[1]), found[3]


class Mqtt:
    """A paho client (5.0 or 3.1.1) and the CONNACK code it got."""

    def __init__(self, braid: BraidProcess, client_id: str, protocol: int = mqtt.MQTTv5) -> None:
        self.acked = threading.Event()
        self.code: int | None = None
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id, protocol=protocol)
        self.client.username_pw_set(*GUEST)
        self.client.on_connect = self._on_connect
        self.client.connect("127.0.0.1", braid.mqtt_port, keepalive=30)
        self.client.loop_start()
        assert self.acked.wait(DEADLINE_S)

    def _on_connect(self, _client: Any, _userdata: Any, _flags: Any, reason: Any, _p: Any) -> None:
        if self.code is None:
            self.code = int(reason.value) if hasattr(reason, "value") else int(reason)
            self.acked.set()

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def kafka_socket_closed_at_once(braid: BraidProcess) -> bool:
    """A raw Kafka connection: True when the broker closes it without a word."""
    with socket.create_connection(("127.0.0.1", braid.kafka_port), timeout=DEADLINE_S) as sock:
        sock.settimeout(1.0)
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False  # still open: admitted
        except ConnectionResetError:
            return True


def connection_count(braid: BraidProcess) -> int:
    return len(api(braid, "GET", "connections").json())


def test_user_limit_refuses_that_users_next_connection_in_every_protocol(
    braid: BraidProcess,
) -> None:
    make_user(braid, "alice", "a-secret")
    put = api(braid, "PUT", "user-limits/alice/max-connections", {"value": 1})
    assert put.status_code == 204, put.text
    listed = api(braid, "GET", "user-limits").json()
    assert listed == [{"user": "alice", "value": {"max-connections": 1}}]

    first = amqp(braid, "alice", "a-secret")
    assert amqp_refusal(braid, "alice", "a-secret") == (
        530,
        "NOT_ALLOWED - connection refused for user 'alice': user connection limit (1) is reached",
    )
    # Kafka: a second SASL connection of alice is closed once she is logged in.
    session = KafkaSession(braid, Actor("alice", "a-secret"))
    with pytest.raises(AssertionError, match="closed the connection"):
        session.call(request("MetadataRequest", 1, topics=[]))
    session.close()
    # Other users are not limited, and the first connection works on.
    guest = amqp(braid, *GUEST)
    first.channel().queue_declare("alice-still-here")
    guest.close()
    first.close()
    # Her connection gone, she may connect again (the count follows the registry).
    wait_for(lambda: connection_count(braid) == 0, "the connections to go")
    again = KafkaSession(braid, Actor("alice", "a-secret"))
    assert again.call(request("MetadataRequest", 1, topics=[])).brokers
    again.close()
    # The limit is kept across a restart (__limits), and DELETE removes it.
    braid.restart()
    assert api(braid, "GET", "user-limits/alice").json()[0]["value"] == {"max-connections": 1}
    assert api(braid, "DELETE", "user-limits/alice/max-connections").status_code == 204
    assert api(braid, "GET", "user-limits").json() == []
    one, two = amqp(braid, "alice", "a-secret"), amqp(braid, "alice", "a-secret")
    one.close()
    two.close()


def test_vhost_limit_counts_every_protocol_and_refuses_in_each_protocols_words(
    braid: BraidProcess,
) -> None:
    put = api(braid, "PUT", "vhost-limits/%2F/max-connections", {"value": 2})
    assert put.status_code == 204, put.text
    assert api(braid, "GET", "vhost-limits/%2F").json() == [
        {"vhost": "/", "value": {"max-connections": 2}}
    ]
    pika_connection = amqp(braid, *GUEST)
    mqtt_client = Mqtt(braid, "counted")
    assert mqtt_client.code == 0
    assert amqp_refusal(braid, *GUEST) == (
        530,
        "NOT_ALLOWED - access to vhost '/' refused for user 'guest': "
        "connection limit (2) is reached",
    )
    refused5 = Mqtt(braid, "refused-5")
    assert refused5.code == QUOTA_EXCEEDED
    refused5.client.loop_stop()
    refused311 = Mqtt(braid, "refused-311", mqtt.MQTTv311)
    assert refused311.code == SERVER_UNAVAILABLE_311
    refused311.client.loop_stop()
    assert kafka_socket_closed_at_once(braid)
    # The admitted clients are unaffected.
    channel = pika_connection.channel()
    channel.queue_declare("q")
    channel.basic_publish("", "q", b"still here")
    assert channel.basic_get("q", auto_ack=True)[2] == b"still here"
    assert mqtt_client.client.publish("t", b"x", qos=1).wait_for_publish(DEADLINE_S) is None
    # One gone: one more is admitted.
    mqtt_client.close()
    wait_for(lambda: connection_count(braid) == 1, "the MQTT client to go")
    assert not kafka_socket_closed_at_once(braid)
    pika_connection.close()
    # RabbitMQ's errors for a limit it does not know or a value that is not a number.
    unknown = api(braid, "PUT", "vhost-limits/%2F/max-bananas", {"value": 1})
    assert unknown.status_code == 400
    assert api(braid, "PUT", "vhost-limits/%2F/max-queues", {"value": "x"}).status_code == 400
    assert api(braid, "PUT", "vhost-limits/nope/max-queues", {"value": 1}).status_code == 404


def test_node_connection_limit_from_the_config_file(tmp_path: Path) -> None:
    config = tmp_path / "braid.toml"
    config.write_text("[limits]\nmax_connections = 1\n")
    with BraidProcess(
        tmp_path, listeners=("amqp", "mqtt", "kafka", "http"), extra_args=("--config", str(config))
    ) as braid:
        first = Mqtt(braid, "only-one")
        assert first.code == 0
        assert amqp_refusal(braid, *GUEST) == (
            530,
            "NOT_ALLOWED - connection refused: node connection limit (1) is reached",
        )
        assert kafka_socket_closed_at_once(braid)
        first.close()
        wait_for(lambda: connection_count(braid) == 0, "the MQTT client to go")
        amqp(braid, *GUEST).close()
    assert "node connection limit (1) is reached" in braid.stderr()
