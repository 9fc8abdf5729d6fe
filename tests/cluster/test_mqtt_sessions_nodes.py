"""Retained messages across the nodes of a real three-node cluster (docs/cluster.md section 8,
MQTT; tests/cluster/cluster_fixture.py), with paho:

- a retained message published on node 2 reaches a new subscriber on node 3 (exact filter)
  and a wildcard subscriber on node 1;
- (last: it stops node 3) a persistent session or a shared group whose queue is in a shard of
  the stopped node is refused, never left hanging: CONNACK 3 Server unavailable, SUBACK 0x80.

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
        self.suback_codes: dict[int, list[int]] = {}
        self.disconnected = threading.Event()
        self.paho.on_connect = self._on_connect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = self._on_suback
        self.paho.on_publish = self._on_ack
        self.paho.on_disconnect = lambda *args: self.disconnected.set()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.session_present = bool(flags.session_present)
        self.connack = int(reason.value)

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put((message.topic, bytes(message.payload), bool(message.retain)))

    def _on_ack(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        self.acked.add(mid)

    def _on_suback(self, client: Any, userdata: Any, mid: int, codes: Any, props: Any) -> None:
        self.suback_codes[mid] = [int(code.value) for code in codes]
        self.acked.add(mid)

    def connect(self, expected: int = 0) -> Client:
        """Connect and wait for the CONNACK (paho's reason: 3.1.1's 3 reads 136)."""
        self.paho.reconnect_delay_set(60, 60)  # a refused client stays away
        self.paho.connect("127.0.0.1", self.port)
        self.paho.loop_start()
        eventually(lambda: self.connack is not None, "the CONNACK")
        assert self.connack == expected
        return self

    def subscribe(self, topic_filter: str, qos: int = 1) -> list[int]:
        """SUBSCRIBE, wait for the SUBACK; its codes."""
        _, mid = self.paho.subscribe(topic_filter, qos=qos)
        assert mid is not None
        eventually(lambda: mid in self.acked, f"the SUBACK of {topic_filter}")
        return self.suback_codes[mid]

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


SERVER_UNAVAILABLE = 136  # paho's reason for 3.1.1's CONNACK return code 3
SUBACK_FAILURE = 0x80


def test_a_session_whose_shard_no_node_serves_is_refused_not_hung(cluster: Cluster) -> None:
    """Last in the module: node 3 stays stopped (the cluster is stopped after it)."""
    session_id = cluster.name_owned_by(3, "orphan-", "__mqtt.session.")
    group_filter = shared_filter_owned_by(cluster, 3)
    ok_group = shared_filter_owned_by(cluster, 1)
    cluster[3].stop()

    refused = Client(cluster[1].mqtt_port, session_id, clean=False)
    try:
        refused.connect(expected=SERVER_UNAVAILABLE)
        assert refused.session_present is False
    finally:
        refused.paho.loop_stop()

    subscriber = Client(cluster[1].mqtt_port, "group-member").connect()
    try:
        assert subscriber.subscribe(group_filter) == [SUBACK_FAILURE]
        assert subscriber.subscribe(ok_group) == [1]  # the connection still works
    finally:
        subscriber.close()


def shared_filter_owned_by(cluster: Cluster, node_id: int) -> str:
    """A ``$share/<group>/x`` filter whose group queue (``__mqtt.share.<group>/x``) node
    ``node_id`` owns."""
    for number in range(10_000):
        if cluster.queue_owner(f"__mqtt.share.g{number}/x") == node_id:
            return f"$share/g{number}/x"
    raise AssertionError(f"no group lands on node {node_id}")
