"""Retained messages across the nodes of a real three-node cluster (docs/cluster.md section 8,
MQTT; tests/cluster/cluster_fixture.py), with paho:

- a retained message published on node 2 reaches a new subscriber on node 3 (exact filter)
  and a wildcard subscriber on node 1.

One cluster for the module.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, eventually, redis_server

__all__ = ["redis_server"]  # the module's Redis fixture (tests/cluster/test_node.py)

SHARDS = 12


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("mqttsessions"), redis_server.url, shards=SHARDS) as c:
        yield c


class Client:
    """A paho client on its own network thread, recording what its callbacks saw."""

    def __init__(self, port: int, client_id: str, *, clean: bool = True) -> None:
        self.port = port
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=clean,
        )
        self.messages: queue.Queue[tuple[str, bytes, bool]] = queue.Queue()
        self.connack: int | None = None
        self.session_present: bool | None = None
        self.acked: set[int] = set()
        self.disconnected = threading.Event()
        self.paho.on_connect = self._on_connect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = self._on_ack
        self.paho.on_publish = self._on_ack
        self.paho.on_disconnect = lambda *args: self.disconnected.set()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.session_present = bool(flags.session_present)
        self.connack = int(reason.value)

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put((message.topic, message.payload, bool(message.retain)))

    def _on_ack(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        self.acked.add(mid)

    def connect(self) -> Client:
        self.paho.reconnect_delay_set(60, 60)  # a refused client stays away
        self.paho.connect("127.0.0.1", self.port)
        self.paho.loop_start()
        eventually(lambda: self.connack is not None, "the CONNACK")
        assert self.connack == 0
        return self

    def subscribe(self, topic_filter: str, qos: int = 1) -> None:
        _, mid = self.paho.subscribe(topic_filter, qos=qos)
        eventually(lambda: mid in self.acked, f"the SUBACK of {topic_filter}")

    def publish(self, topic: str, body: bytes, *, retain: bool = False) -> None:
        info = self.paho.publish(topic, body, qos=1, retain=retain)
        eventually(lambda: info.mid in self.acked, f"the PUBACK of {topic}")

    def take(self, count: int) -> list[tuple[str, bytes, bool]]:
        return [self.messages.get(timeout=DEADLINE_S) for _ in range(count)]

    def close(self) -> None:
        self.paho.disconnect()
        self.disconnected.wait(DEADLINE_S)
        self.paho.loop_stop()


def test_a_retained_message_is_seen_on_every_node(cluster: Cluster) -> None:
    publisher = Client(cluster[2].mqtt_port, "retainer").connect()
    publisher.publish("retained/a/b", b"kept", retain=True)
    publisher.close()

    exact = Client(cluster[3].mqtt_port, "exact-reader").connect()
    wildcard = Client(cluster[1].mqtt_port, "wildcard-reader").connect()
    try:
        exact.subscribe("retained/a/b")
        assert exact.take(1) == [("retained/a/b", b"kept", True)]
        wildcard.subscribe("retained/#")
        assert wildcard.take(1) == [("retained/a/b", b"kept", True)]
    finally:
        exact.close()
        wildcard.close()
