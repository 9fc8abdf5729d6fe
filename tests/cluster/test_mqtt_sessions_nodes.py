"""Retained messages across the nodes of a real three-node cluster (docs/cluster.md section 8,
MQTT; tests/cluster/cluster_fixture.py), with paho:

- a retained message published on node 2 reaches a new subscriber on node 3 (exact filter)
  and a wildcard subscriber on node 1;
- a persistent session whose queue is in node 2's shard connects to node 1, goes offline while
  node 3 takes QoS 1 publishes for it, and resumes on node 3 (session present, all delivered);
  the same with QoS 2, each delivered once; an MQTT 5 session taken over on node 3 while its
  connection on node 1 is open (DISCONNECT 0x8E there, present and subscribed on node 3);
- (last: it stops node 3) a persistent session or a shared group whose queue is in a shard of
  the stopped node is refused, never left hanging: CONNACK 3 Server unavailable, SUBACK 0x80.

One cluster for the module.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from core.cluster.placement import session_shard
from tests.cluster.cluster_fixture import Cluster
from tests.cluster.mqtt_share_checks import (
    a_group_member_before_its_queue_owner_restarts,
    a_member_and_a_will_on,
    check_a_clean_stop_left_no_entries,
    check_a_half_is_refused_while_its_owner_is_down,
    check_the_group_reads_again_after_its_owner_restarted,
    test_a_committed_half_message_reaches_another_nodes_subscriber_once,
    test_a_dead_letter_of_an_mqtt_record_reaches_another_nodes_subscriber_once,
    test_a_delayed_record_reaches_another_nodes_subscriber_once,
    test_a_shared_group_with_members_on_two_nodes,
    test_a_will_reaches_clean_and_persistent_subscribers_on_other_nodes,
)
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, eventually, redis_server

# The module's Redis fixture (tests/cluster/test_node.py), and the checks of $share groups,
# wills, delayed and half records across nodes run on this module's cluster (one start fewer;
# imported first, they run before the last test stops node 3).
__all__ = [
    "redis_server",
    "test_a_committed_half_message_reaches_another_nodes_subscriber_once",
    "test_a_dead_letter_of_an_mqtt_record_reaches_another_nodes_subscriber_once",
    "test_a_delayed_record_reaches_another_nodes_subscriber_once",
    "test_a_shared_group_with_members_on_two_nodes",
    "test_a_will_reaches_clean_and_persistent_subscribers_on_other_nodes",
]

SHARDS = 12


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("mqttsessions"), redis_server.url, shards=SHARDS) as c:
        yield c


class Client:
    """A paho client on its own network thread, recording what its callbacks saw."""

    def __init__(
        self, port: int, client_id: str, *, clean: bool = True, version5: bool = False
    ) -> None:
        self.port = port
        self.clean = clean
        self.version5 = version5
        if version5:
            self.paho = mqtt.Client(
                CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
            )
        else:
            self.paho = mqtt.Client(
                CallbackAPIVersion.VERSION2,
                client_id=client_id,
                protocol=mqtt.MQTTv311,
                clean_session=clean,
            )
        self.disconnect_reason: int | None = None
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
        self.paho.on_disconnect = self._on_disconnect

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.session_present = bool(flags.session_present)
        self.connack = int(reason.value)

    def _on_disconnect(self, client: Any, userdata: Any, flags: Any, reason: Any, *_: Any) -> None:
        self.disconnect_reason = int(reason.value)
        self.disconnected.set()

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
        if self.version5:
            properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            properties.SessionExpiryInterval = 0 if self.clean else 3600
            self.paho.connect("127.0.0.1", self.port, clean_start=self.clean, properties=properties)
        else:
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

    def publish(self, topic: str, body: bytes, *, retain: bool = False, qos: int = 1) -> None:
        info = self.paho.publish(topic, body, qos=qos, retain=retain)
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


def session_owned_by(cluster: Cluster, node_id: int, prefix: str) -> str:
    """A client id whose session queue ``__mqtt.session.<id>`` node ``node_id`` owns."""
    return cluster.name_owned_by(node_id, prefix, "__mqtt.session.")


def session_split(cluster: Cluster, queue_node: int, state_node: int, prefix: str) -> str:
    """A client id whose session queue node ``queue_node`` owns and whose saved state (placed
    by client id) node ``state_node`` owns."""
    for number in range(10_000):
        client_id = f"{prefix}{number}"
        if (
            cluster.queue_owner(f"__mqtt.session.{client_id}") == queue_node
            and cluster.owner(session_shard(client_id, SHARDS)) == state_node
        ):
            return client_id
    raise AssertionError(f"no client id with its queue on {queue_node}, state on {state_node}")


def until_routed(subscriber: Client, publisher: Client, topic: str) -> None:
    """Publish ``topic`` through ``publisher`` until ``subscriber`` gets one: the publishing
    node has followed the subscription's binding (the probes left over are dropped later)."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        publisher.publish(topic, b"probe")
        try:
            if subscriber.messages.get(timeout=0.5)[0] == topic:
                return
        except queue.Empty:
            continue
    raise AssertionError(f"{topic} never reached the subscriber")


def received_until(client: Client, end_topic: str) -> list[tuple[str, bytes]]:
    """What ``client`` receives of ``end_topic``'s first level (probes left out) up to and
    without ``end_topic``."""
    got: list[tuple[str, bytes]] = []
    first_level = end_topic.split("/")[0] + "/"
    while True:
        topic, body, _ = client.messages.get(timeout=DEADLINE_S)
        if topic == end_topic:
            return got
        if body != b"probe" and topic.startswith(first_level):
            got.append((topic, body))


@pytest.mark.parametrize("qos", [1, 2])
def test_a_persistent_session_resumes_on_another_node(cluster: Cluster, qos: int) -> None:
    """Queue in node 2's shard; connected to node 1, then offline while node 3 takes the
    publishes, then back on node 3: session present, everything delivered, once."""
    client_id = session_owned_by(cluster, 2, f"roamer{qos}-")
    base = f"roam{qos}" if qos == 1 else "roam2/m2"
    publisher = Client(cluster[3].mqtt_port, f"roam-publisher{qos}").connect()
    first = Client(cluster[1].mqtt_port, client_id, clean=False).connect()
    try:
        assert first.session_present is False
        # QoS 2: a filter with a wildcard first level (bound on the global source, which
        # node 3 routes by though the binding is node 1's).
        topic_filter = f"{base}/#" if qos == 1 else "+/m2/#"
        assert first.subscribe(topic_filter, qos=qos) == [qos]
        until_routed(first, publisher, f"{base}/probe")
    finally:
        first.close()

    sent = [(f"{base}/m", str(n).encode()) for n in range(10)]
    for topic, body in sent:
        publisher.publish(topic, body, qos=qos)
    publisher.publish(f"{base}/end", b"end", qos=qos)
    publisher.close()

    again = Client(cluster[3].mqtt_port, client_id, clean=False).connect()
    try:
        assert again.session_present is True
        assert received_until(again, f"{base}/end") == sent  # each once, in order
    finally:
        again.close()


MQTT5_SESSION_TAKEN_OVER = 0x8E


def test_a_session_is_taken_over_by_another_node_while_connected(cluster: Cluster) -> None:
    """MQTT 5, expiry 3600 s: the connection on node 1 is open, holding 3 QoS 1 messages
    it never acknowledged, when the same client id connects to node 3: node 1 sends
    DISCONNECT 0x8E, node 3 answers session present with the subscription kept, and gets the
    3 unacknowledged ones again (nacked back to the queue) and those published after."""
    client_id = session_owned_by(cluster, 2, "taken-")
    publisher = Client(cluster[1].mqtt_port, "taken-publisher").connect()
    old = Client(cluster[1].mqtt_port, client_id, clean=False, version5=True)
    old.paho.manual_ack_set(True)  # no PUBACK: they stay in flight on node 1
    old.connect()
    try:
        assert old.subscribe("taken/#") == [1]
        until_routed(old, publisher, "taken/probe")
        held = [("taken/held", str(n).encode()) for n in range(3)]
        for topic, body in held:
            publisher.publish(topic, body)
        publisher.publish("taken/mid", b"mid")
        assert received_until(old, "taken/mid") == held
        new = Client(cluster[3].mqtt_port, client_id, clean=False, version5=True).connect()
        try:
            assert new.session_present is True
            assert old.disconnected.wait(DEADLINE_S)
            assert old.disconnect_reason == MQTT5_SESSION_TAKEN_OVER
            sent = [("taken/x", str(n).encode()) for n in range(5)]
            for topic, body in sent:
                publisher.publish(topic, body)
            # The unacknowledged ones come back once node 1's detach reached the owner, before
            # or among the later ones: collected until all are there (a duplicate or a lost one
            # ends in queue.Empty).
            expected = sorted(held + sent)
            got: list[tuple[str, bytes]] = []
            while sorted(got) != expected:
                topic, body, _ = new.messages.get(timeout=DEADLINE_S)
                if topic in ("taken/held", "taken/x"):
                    got.append((topic, body))
        finally:
            new.close()
    finally:
        old.paho.loop_stop()
        publisher.close()


SERVER_UNAVAILABLE = 136  # paho's reason for 3.1.1's CONNACK return code 3
SUBACK_FAILURE = 0x80


def test_a_session_whose_shard_no_node_serves_is_refused_not_hung(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    """Last in the module: node 3 is stopped, then started again. A new session and an
    existing one (queued messages waiting) of node 3's shard are refused on node 1 meanwhile;
    once node 3 is back the existing one resumes there with what was queued. Around it the
    steps of tests/cluster/mqtt_share_checks.py: the stop leaves no entries of node 3 in
    Redis, a half for it is refused, a $share group of its queue reads again after."""
    session_id = cluster.name_owned_by(3, "orphan-", "__mqtt.session.")
    waiting_id = session_split(cluster, 3, 1, "waiting-")  # state in node 1's shard
    group_filter = shared_filter_owned_by(cluster, 3)
    ok_group = shared_filter_owned_by(cluster, 1)
    publisher = Client(cluster[2].mqtt_port, "waiting-publisher").connect()
    waiting = Client(cluster[1].mqtt_port, waiting_id, clean=False).connect()
    try:
        waiting.subscribe("waiting/#")
        until_routed(waiting, publisher, "waiting/probe")
    finally:
        waiting.close()
    sent = [("waiting/m", str(n).encode()) for n in range(5)]
    for topic, body in sent:
        publisher.publish(topic, body)
    publisher.publish("waiting/end", b"end")
    publisher.close()
    member, group_topic = a_group_member_before_its_queue_owner_restarts(cluster, 3)
    on_node_3 = a_member_and_a_will_on(cluster, redis_server, 3)
    cluster[3].stop()
    check_a_clean_stop_left_no_entries(redis_server, 3, on_node_3)
    check_a_half_is_refused_while_its_owner_is_down(cluster, 3)

    for client_id in (session_id, waiting_id):
        refused = Client(cluster[1].mqtt_port, client_id, clean=False)
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

    cluster[3].start()
    back = eventually(lambda: connected(cluster[1].mqtt_port, waiting_id), "the session back")
    try:
        assert back.session_present is True
        assert received_until(back, "waiting/end") == sent
        # Its subscription (a binding) outlived node 3's restart, which reconciled bindings
        # with the sessions saved in its own shards only.
        publisher = Client(cluster[2].mqtt_port, "waiting-publisher").connect()
        publisher.publish("waiting/after", b"after")
        publisher.publish("waiting/end", b"end")
        publisher.close()
        assert received_until(back, "waiting/end") == [("waiting/after", b"after")]
    finally:
        back.close()
    check_the_group_reads_again_after_its_owner_restarted(cluster, member, group_topic)


def connected(port: int, client_id: str) -> Client | None:
    """A persistent session's client connected (None: refused, closed)."""
    client = Client(port, client_id, clean=False)
    client.paho.reconnect_delay_set(60, 60)
    client.paho.connect("127.0.0.1", port)
    client.paho.loop_start()
    if not eventually(lambda: client.connack is not None, "a CONNACK") or client.connack != 0:
        client.paho.loop_stop()
        return None
    return client


def shared_filter_owned_by(cluster: Cluster, node_id: int) -> str:
    """A ``$share/<group>/x`` filter whose group queue (``__mqtt.share.<group>/x``) node
    ``node_id`` owns."""
    for number in range(10_000):
        if cluster.queue_owner(f"__mqtt.share.g{number}/x") == node_id:
            return f"$share/g{number}/x"
    raise AssertionError(f"no group lands on node {node_id}")
