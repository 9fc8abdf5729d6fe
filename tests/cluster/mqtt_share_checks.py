"""Checks of MQTT across the nodes of a real three-node cluster of 12 shards (docs/cluster.md
section 8, MQTT), with paho, run on tests/cluster/test_mqtt_sessions_nodes.py's cluster (that
module imports them: one cluster start fewer; its ``cluster`` and ``redis_server`` fixtures):

- a delayed record (``$delayed/<s>/<topic>``, published on a third node) and a committed half
  message (``$half/<group>/<txn>/<topic>``, then ``braid.txn/<txn>`` ``commit``, both on
  nodes that do not own the transaction: core/cluster/remote_txn.py) become visible on the
  topic's owner later; they reach a clean-session subscriber on another node once
  (core/api/sessions.py ``fan_out_live_record``, core/delivery/live.py); so does a dead
  letter of an MQTT record rejected from an AMQP queue;
- a will (QoS 1) of a client whose socket dies on node 1 reaches a clean subscriber on node 2
  and a persistent one of node 3 (offline, on its return), also after a will delay;
  ``mqtt:wills:<node>`` holds each will while its client is connected, not after it is
  published nor after a normal DISCONNECT (core/cluster/mqtt_wills.py);
- a ``$share`` group with members on nodes 1 and 3, the publisher on node 2: each message to
  one member, both get some, and when one leaves the other gets the rest (its node leaves the
  group's queue to the other: core/cluster/mqtt_shares.py).

Helpers named ``a_...``/``check_...`` are steps of test_mqtt_sessions_nodes.py's last test,
around its stop and restart of node 3: a half for a stopped owner is refused (PUBACK 0x80,
3.1.1 closed); a clean stop leaves no ``mqtt:share:*`` entry nor wills of the node; a group
whose queue's owner restarted reads again without its members reconnecting.

Not a test module of its own (no ``test_`` file name): collected where imported.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
import uuid
from typing import Any

import paho.mqtt.client as mqtt
import redis
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from core.cluster.placement import partition_shard, session_shard, transaction_shard
from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, amqp, eventually

QUIET_S = 0.5  # how long "nothing more arrives" is watched


class Client:
    """A paho client (MQTT 5 unless told) on its own network thread, recording what it got."""

    def __init__(
        self, port: int, client_id: str, *, version: int = mqtt.MQTTv5, clean: bool = True
    ) -> None:
        self.port = port
        self.version = version
        self.clean = clean
        kwargs: dict[str, Any] = {"client_id": client_id, "protocol": version}
        if version != mqtt.MQTTv5:
            kwargs["clean_session"] = clean
        self.paho = mqtt.Client(CallbackAPIVersion.VERSION2, **kwargs)
        self.messages: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.connack: int | None = None
        self.acked: set[int] = set()
        self.disconnected = threading.Event()
        self.paho.on_connect = self._on_connect
        self.paho.on_message = self._on_message
        self.paho.on_subscribe = self._on_ack
        self.paho.on_unsubscribe = self._on_ack
        self.paho.on_publish = self._on_publish
        self.reasons: dict[int, int] = {}  # PUBACKs with a reason code other than success
        self.paho.on_disconnect = lambda *args: self.disconnected.set()

    def _on_connect(self, client: Any, userdata: Any, flags: Any, reason: Any, props: Any) -> None:
        self.connack = int(reason.value)

    def _on_message(self, client: Any, userdata: Any, message: mqtt.MQTTMessage) -> None:
        self.messages.put((message.topic, bytes(message.payload)))

    def _on_ack(self, client: Any, userdata: Any, mid: int, *rest: Any) -> None:
        self.acked.add(mid)

    def _on_publish(self, client: Any, userdata: Any, mid: int, reason: Any, props: Any) -> None:
        if int(reason.value):
            self.reasons[mid] = int(reason.value)
        self.acked.add(mid)

    def will(self, topic: str, payload: bytes, *, delay_s: int = 0) -> Client:
        properties = None
        if delay_s:
            properties = Properties(PacketTypes.WILLMESSAGE)  # type: ignore[no-untyped-call]
            properties.WillDelayInterval = delay_s
        self.paho.will_set(topic, payload, qos=1, properties=properties)
        return self

    def connect(self, *, expiry_s: int = 0) -> Client:
        self.paho.reconnect_delay_set(60, 60)  # a client the test cut off stays away
        if self.version == mqtt.MQTTv5:
            properties = None
            if expiry_s:
                properties = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
                properties.SessionExpiryInterval = expiry_s
            self.paho.connect("127.0.0.1", self.port, clean_start=self.clean, properties=properties)
        else:
            self.paho.connect("127.0.0.1", self.port)
        self.paho.loop_start()
        eventually(lambda: self.connack is not None, "the CONNACK")
        assert self.connack == 0
        return self

    def subscribe(self, topic_filter: str) -> None:
        _, mid = self.paho.subscribe(topic_filter, qos=1)
        assert mid is not None
        eventually(lambda: mid in self.acked, f"the SUBACK of {topic_filter}")

    def unsubscribe(self, topic_filter: str) -> None:
        _, mid = self.paho.unsubscribe(topic_filter)
        assert mid is not None
        eventually(lambda: mid in self.acked, f"the UNSUBACK of {topic_filter}")

    def publish(self, topic: str, payload: bytes) -> None:
        """A QoS 1 publish, waiting for its PUBACK."""
        info = self.paho.publish(topic, payload, qos=1)
        eventually(lambda: info.mid in self.acked, f"the PUBACK of {payload!r}")

    def take(self, count: int) -> list[tuple[str, bytes]]:
        return [self.messages.get(timeout=DEADLINE_S) for _ in range(count)]

    def nothing_more(self) -> list[tuple[str, bytes]]:
        """What else arrives within :data:`QUIET_S` (a duplicate would)."""
        time.sleep(QUIET_S)
        extra = []
        while not self.messages.empty():
            extra.append(self.messages.get_nowait())
        return extra

    def kill(self) -> None:
        """The socket dies under the client (no DISCONNECT): its will is due."""
        sock = self.paho.socket()
        assert isinstance(sock, socket.socket)
        sock.shutdown(socket.SHUT_RDWR)
        self.paho.loop_stop()
        self.disconnected.set()  # (nothing to close any more)

    def close(self) -> None:
        self.paho.disconnect()
        self.disconnected.wait(DEADLINE_S)
        self.paho.loop_stop()


def topic_owned_by(cluster: Cluster, node_id: int, prefix: str) -> str:
    """A first topic level (the log topic of ``<level>/...``) whose shard node ``node_id``
    owns."""
    return cluster.name_owned_by(node_id, f"{prefix}{uuid.uuid4().hex[:6]}-")


def txn_in_shard_of(cluster: Cluster, topic: str, skip: int = 0) -> str:
    """A transaction id kept in the shard of ``topic``'s queue 0 (the ``skip``-th after the
    first): a half message's transaction and its destinations must share a shard
    (core/broker/node.py ``_half_shard``)."""
    wanted = partition_shard(topic, 0, cluster.shards)
    for number in range(10_000):
        txn = f"txn-{topic}-{number}"
        if transaction_shard(txn, cluster.shards) == wanted:
            if not skip:
                return txn
            skip -= 1
    raise AssertionError(f"no transaction id lands in shard {wanted}")


# -- records that become visible later on the topic's owner --------------------------------


def test_a_delayed_record_reaches_another_nodes_subscriber_once(cluster: Cluster) -> None:
    topic = topic_owned_by(cluster, 3, "delayed")
    subscriber = Client(cluster[1].mqtt_port, "delayed-sub").connect()
    publisher = Client(cluster[2].mqtt_port, "delayed-pub").connect()
    try:
        subscriber.subscribe(f"{topic}/#")
        publisher.publish(f"$delayed/1/{topic}/later", b"due")
        assert subscriber.take(1) == [(f"{topic}/later", b"due")]
        assert subscriber.nothing_more() == []
    finally:
        subscriber.close()
        publisher.close()


def test_a_committed_half_message_reaches_another_nodes_subscriber_once(
    cluster: Cluster,
) -> None:
    topic = topic_owned_by(cluster, 3, "half")
    txn, voided = txn_in_shard_of(cluster, topic), txn_in_shard_of(cluster, topic, skip=1)
    subscriber = Client(cluster[1].mqtt_port, "half-sub").connect()
    # Neither on the transaction's owner (node 3): the half and the decision are handed to it
    # (core/cluster/remote_txn.py).
    publisher = Client(cluster[1].mqtt_port, "half-pub", version=mqtt.MQTTv311).connect()
    decider = Client(cluster[2].mqtt_port, "half-decider").connect()
    try:
        subscriber.subscribe(f"{topic}/#")
        publisher.publish(f"$half/g/{txn}/{topic}/order", b"paid")
        assert subscriber.nothing_more() == []  # invisible until committed
        decider.publish(f"braid.txn/{txn}", b"commit")
        assert subscriber.take(1) == [(f"{topic}/order", b"paid")]
        # A second one rolled back: never seen.
        publisher.publish(f"$half/g/{voided}/{topic}/order", b"void")
        decider.publish(f"braid.txn/{voided}", b"rollback")
        assert subscriber.nothing_more() == []
        assert publisher.reasons == decider.reasons == {}  # every PUBACK a success
        # A half of node 3's transaction to a topic of another shard: refused by node 3 as
        # there (a transaction across shards is not supported), the answer relayed: 0x90.
        elsewhere = topic_owned_by(cluster, 1, "half")
        info = decider.paho.publish(f"$half/g/{txn}/{elsewhere}/x", b"no", qos=1)
        eventually(lambda: info.mid in decider.acked, "the PUBACK of the refused half")
        assert decider.reasons == {info.mid: MQTT5_TOPIC_NAME_INVALID}
    finally:
        for client in (subscriber, publisher, decider):
            client.close()


MQTT5_UNSPECIFIED_ERROR = 0x80
MQTT5_TOPIC_NAME_INVALID = 0x90


def client_ids_away_from(cluster: Cluster, node_id: int, prefix: str, count: int) -> list[str]:
    """``count`` client ids whose session state is not in a shard of node ``node_id`` (one
    stopped refuses their CONNECT)."""
    ids: list[str] = []
    for number in range(10_000):
        client_id = f"{prefix}{number}"
        if cluster.owner(session_shard(client_id, cluster.shards)) != node_id:
            ids.append(client_id)
            if len(ids) == count:
                return ids
    raise AssertionError(f"no client ids away from node {node_id}")


def check_a_half_is_refused_while_its_owner_is_down(cluster: Cluster, down: int) -> None:
    """Node ``down`` is stopped: a half message of a transaction in its shard, published on
    another node, gets PUBACK 0x80 (MQTT 5) or its connection closed (3.1.1), never no
    answer. Called by test_mqtt_sessions_nodes.py's last test while node ``down`` is away."""
    topic = topic_owned_by(cluster, down, "halfdown")
    txn = txn_in_shard_of(cluster, topic)
    up = 1 if down != 1 else 2
    ids = client_ids_away_from(cluster, down, "half-down-", 2)
    five = Client(cluster[up].mqtt_port, ids[0]).connect()
    try:
        info = five.paho.publish(f"$half/g/{txn}/{topic}/x", b"lost", qos=1)
        eventually(lambda: info.mid in five.acked, "the PUBACK of the half")
        assert five.reasons == {info.mid: MQTT5_UNSPECIFIED_ERROR}
    finally:
        five.close()
    old = Client(cluster[up].mqtt_port, ids[1], version=mqtt.MQTTv311).connect()
    try:
        info = old.paho.publish(f"$half/g/{txn}/{topic}/x", b"lost", qos=1)
        assert old.disconnected.wait(DEADLINE_S), "3.1.1: the connection closed"
        assert info.mid not in old.acked
    finally:
        old.paho.loop_stop()


def test_a_dead_letter_of_an_mqtt_record_reaches_another_nodes_subscriber_once(
    cluster: Cluster,
) -> None:
    """An MQTT publish routed to an AMQP queue of node 2 (bound to the exchange its first
    level names), rejected there, is dead-lettered to the DLX (node 2's too): node 1's MQTT
    subscriber of ``<dlx>/#`` gets it once, though node 2 has no subscriber of its own (its
    live feed read it back only for node 1: core/delivery/live.py kept it)."""
    exchange = topic_owned_by(cluster, 2, "dlwork")
    dlx = topic_owned_by(cluster, 2, "dlx")
    queue_name = cluster.name_owned_by(2, "dlq-")
    subscriber = Client(cluster[1].mqtt_port, "dl-sub").connect()
    publisher = Client(cluster[2].mqtt_port, "dl-pub").connect()
    connection = amqp(cluster[2])
    try:
        channel = connection.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.exchange_declare(dlx, "topic", durable=True)
        channel.queue_declare(queue_name, durable=True, arguments={"x-dead-letter-exchange": dlx})
        channel.queue_bind(queue_name, exchange, "#")
        subscriber.subscribe(f"{dlx}/#")
        publisher.publish(f"{exchange}/job/1", b"poison")
        got = eventually(lambda: channel.basic_get(queue_name)[0], "the record in the queue")
        channel.basic_reject(got.delivery_tag, requeue=False)
        assert subscriber.take(1) == [(f"{dlx}/job/1", b"poison")]
        assert subscriber.nothing_more() == []
    finally:
        connection.close()
        subscriber.close()
        publisher.close()


# -- wills --------------------------------------------------------------------------------------


def wills_held(redis_server: RedisServer, node_id: int) -> dict[str, dict[str, Any]]:
    """Node ``node_id``'s ``mqtt:wills:<node>`` hash (of the module's one cluster)."""
    client = redis.Redis.from_url(redis_server.url)
    try:
        keys = list(client.scan_iter(match=f"braid:*:mqtt:wills:{node_id}"))
        held: dict[str, dict[str, Any]] = {}
        for key in keys:
            for client_id, will in client.hgetall(key).items():
                name = client_id.decode() if isinstance(client_id, bytes) else client_id
                held[name] = json.loads(will)
        return held
    finally:
        client.close()


def test_a_will_reaches_clean_and_persistent_subscribers_on_other_nodes(
    cluster: Cluster, redis_server: RedisServer
) -> None:
    topic = topic_owned_by(cluster, 2, "will")
    clean = Client(cluster[2].mqtt_port, "will-clean").connect()
    keeper_id = cluster.name_owned_by(3, "will-keeper-", "__mqtt.session.")
    keeper = Client(cluster[3].mqtt_port, keeper_id, clean=False).connect(expiry_s=300)
    clients = [clean, keeper]
    try:
        clean.subscribe(f"{topic}/#")
        keeper.subscribe(f"{topic}/#")
        keeper.close()  # offline: what comes waits in its session queue

        dying = Client(cluster[1].mqtt_port, "will-dying").will(f"{topic}/gone", b"bye")
        clients.append(dying.connect())
        held = eventually(lambda: wills_held(redis_server, 1).get("will-dying"), "the will held")
        assert (held["topic"], held["qos"], held["payload"]) == (f"{topic}/gone", 1, "Ynll")
        dying.kill()
        assert clean.take(1) == [(f"{topic}/gone", b"bye")]
        eventually(lambda: "will-dying" not in wills_held(redis_server, 1), "the will dropped")
        back = Client(cluster[3].mqtt_port, keeper_id, clean=False).connect(expiry_s=300)
        clients.append(back)
        assert back.take(1) == [(f"{topic}/gone", b"bye")]

        # A will delay (the session outlives the connection by more): published after it.
        late = Client(cluster[1].mqtt_port, "will-late").will(f"{topic}/late", b"l", delay_s=1)
        clients.append(late.connect(expiry_s=60))
        eventually(lambda: "will-late" in wills_held(redis_server, 1), "the delayed will held")
        late.kill()
        assert clean.take(1) == [(f"{topic}/late", b"l")]
        assert back.take(1) == [(f"{topic}/late", b"l")]
        eventually(lambda: "will-late" not in wills_held(redis_server, 1), "the will dropped")

        # A normal DISCONNECT: the will is dropped, never published.
        polite = Client(cluster[1].mqtt_port, "will-polite").will(f"{topic}/polite", b"no")
        polite.connect()
        eventually(lambda: "will-polite" in wills_held(redis_server, 1), "the will held")
        polite.close()
        eventually(lambda: "will-polite" not in wills_held(redis_server, 1), "the will dropped")
        assert clean.nothing_more() == []
        assert back.nothing_more() == []
    finally:
        for client in clients:
            if not client.disconnected.is_set():
                client.close()


# -- $share groups with members on several nodes ---------------------------------------------


def group_owned_by(cluster: Cluster, node_id: int, topic_filter: str) -> str:
    """A share name whose group queue (``__mqtt.share.<share>/<filter>``) node ``node_id``
    owns."""
    for number in range(10_000):
        share = f"g{uuid.uuid4().hex[:4]}{number}"
        if cluster.queue_owner(f"__mqtt.share.{share}/{topic_filter}") == node_id:
            return share
    raise AssertionError(f"no group lands on node {node_id}")


def collect(clients: list[Client], total: int) -> list[list[bytes]]:
    """The payloads each client got, once ``total`` arrived among them (then a quiet wait for
    more: a duplicate would come)."""
    got: list[list[bytes]] = [[] for _ in clients]

    def arrived() -> bool:
        for index, client in enumerate(clients):
            while not client.messages.empty():
                got[index].append(client.messages.get_nowait()[1])
        return sum(map(len, got)) >= total

    eventually(arrived, f"{total} messages among the members")
    for index, client in enumerate(clients):
        got[index] += [payload for _, payload in client.nothing_more()]
    return got


def test_a_shared_group_with_members_on_two_nodes(cluster: Cluster) -> None:
    topic_filter = f"{topic_owned_by(cluster, 3, 'shared')}/x"
    share = group_owned_by(cluster, 2, topic_filter)
    members = [
        Client(cluster[1].mqtt_port, "member-1").connect(),
        Client(cluster[3].mqtt_port, "member-3").connect(),
    ]
    publisher = Client(cluster[2].mqtt_port, "share-pub").connect()
    try:
        for member in members:
            member.subscribe(f"$share/{share}/{topic_filter}")
        sent = [b"m%d" % number for number in range(20)]
        for payload in sent:
            publisher.publish(topic_filter, payload)  # QoS 1: PUBACK waited for
        got = collect(members, len(sent))
        # Each message to exactly one member, both members get some (round robin).
        assert sorted(got[0] + got[1]) == sorted(sent)
        assert got[0], got
        assert got[1], got

        # A member leaves: the other one gets everything after.
        members[1].unsubscribe(f"$share/{share}/{topic_filter}")
        more = [b"n%d" % number for number in range(10)]
        for payload in more:
            publisher.publish(topic_filter, payload)
        assert collect(members, len(more)) == [more, []]
    finally:
        for client in (*members, publisher):
            client.close()


# -- a $share group whose queue's owner restarts ---------------------------------------------


def a_group_member_before_its_queue_owner_restarts(
    cluster: Cluster, owner: int
) -> tuple[Client, str]:
    """A ``$share`` member on node 1 of a group whose queue node ``owner`` holds (the topic
    node 2's), one message received: returned to
    :func:`check_the_group_reads_again_after_its_owner_restarted` once node ``owner`` was
    stopped and started again (test_mqtt_sessions_nodes.py's last test)."""
    topic_filter = f"{topic_owned_by(cluster, 2, 'regroup')}/x"
    share = group_owned_by(cluster, owner, topic_filter)
    member_id, publisher_id = client_ids_away_from(cluster, owner, "regroup-", 2)
    member = Client(cluster[1].mqtt_port, member_id).connect()
    member.subscribe(f"$share/{share}/{topic_filter}")
    publisher = Client(cluster[2].mqtt_port, publisher_id).connect()
    try:
        publisher.publish(topic_filter, b"before")
        assert member.take(1) == [(topic_filter, b"before")]
    finally:
        publisher.close()
    return member, topic_filter


def check_the_group_reads_again_after_its_owner_restarted(
    cluster: Cluster, member: Client, topic_filter: str
) -> None:
    """The member, connected all along, gets what is published after the restart: its node
    attached the group's consumer again (gateway/mqtt/shared.py), with no reconnect."""
    publisher = Client(cluster[2].mqtt_port, "regroup-after").connect()
    try:
        publisher.publish(topic_filter, b"after")
        assert publisher.reasons == {}
        assert member.take(1) == [(topic_filter, b"after")]
        assert member.nothing_more() == []
    finally:
        publisher.close()
        member.close()


# -- what a node that stops cleanly leaves in Redis ------------------------------------------


def share_entries_of(redis_server: RedisServer, node_id: int) -> list[str]:
    """The ``mqtt:share:<group>`` sets that name node ``node_id``."""
    client = redis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        return [
            key
            for key in client.scan_iter(match="braid:*:mqtt:share:*")
            if client.sismember(key, str(node_id))
        ]
    finally:
        client.close()


def a_member_and_a_will_on(
    cluster: Cluster, redis_server: RedisServer, node_id: int
) -> list[Client]:
    """A ``$share`` member (persistent session) and a client with a will on node ``node_id``,
    both written down in Redis; a subscriber of the will's topic on another node. Returned to
    :func:`check_a_clean_stop_left_no_entries` once node ``node_id`` stopped."""
    other = 1 if node_id != 1 else 2
    topic = topic_owned_by(cluster, other, "stopwill")
    member_id, dying_id, listener_id = client_ids_away_from(cluster, node_id, "stopper-", 3)
    listener = Client(cluster[other].mqtt_port, listener_id).connect()
    listener.subscribe(f"{topic}/#")
    # A persistent session's member: its group outlives its connection (a clean one's is left
    # when the connection ends, as the server closes it).
    member = Client(cluster[node_id].mqtt_port, member_id, clean=False).connect(expiry_s=300)
    member.subscribe(f"$share/{group_owned_by(cluster, other, 'stop/x')}/stop/x")
    dying = Client(cluster[node_id].mqtt_port, dying_id).will(f"{topic}/gone", b"no")
    dying.connect()
    eventually(lambda: dying_id in wills_held(redis_server, node_id), "the will held")
    assert share_entries_of(redis_server, node_id)
    return [listener, member, dying]


def check_a_clean_stop_left_no_entries(
    redis_server: RedisServer, node_id: int, clients: list[Client]
) -> None:
    """Node ``node_id`` stopped cleanly: its wills were dropped, not published (as a node
    alone on SIGTERM), and Redis holds neither its wills nor its ``$share`` entries."""
    listener, *gone = clients
    try:
        assert wills_held(redis_server, node_id) == {}
        assert share_entries_of(redis_server, node_id) == []
        assert listener.nothing_more() == []
    finally:
        listener.close()
        for client in gone:
            client.paho.loop_stop()
