"""A node killed (SIGKILL) and restarted under load from each protocol (issue 22 item 6;
docs/cluster.md section 11), on three real ``braid serve --cluster`` nodes over 12 shards
(tests/cluster/cluster_fixture.py):

- Kafka: an idempotent ``acks=all`` confluent-kafka producer on node 1 writes to the 12
  partitions of a topic led by all three nodes; it retries the killed leader's partitions
  until the leader is back. Every record is then in its partition once, in the order sent.
- AMQP: a pika publisher on node 1 with confirms publishes to a durable queue of each node;
  a publish nacked while the queue's owner is down is published again. Every confirmed
  message is then in its queue, a message twice only if it was nacked once.
- MQTT: a paho MQTT 5 publisher on node 1 sends QoS 1 to a persistent (clean_session=False)
  QoS 1 subscriber whose session is the killed node's; a PUBACK >= 0x80 (the session's shard
  unavailable) is sent again; the subscriber reconnects to the restarted node. Every
  acknowledged message then reached it at least once.

The node killed owns some of each protocol's destinations and none of the clients' nodes.
One kill by default, the node left down past ``unavailable_wait_ms``; ``BRAID_LONG=1`` runs four
rounds of more records, every other one restarting the node at once.

Then the MQTT and AMQP gateways' batching: each acknowledges a read's publishes after one
durability wait for the last one, and publishes forwarded to the killed node fail at
``unavailable_wait_ms``. When a read's acknowledgements held failed publishes and a later one
stored (the killed node back, or a publish stored elsewhere), the failed ones were PUBACKed
with reason 0 (47-99 messages PUBACKed and never stored in the long rounds) or confirmed (a
pipelining AMQP publisher; pika's blocking one above has one publish in flight). Each
acknowledgement must say its own publish's fate.
"""

from __future__ import annotations

import asyncio
import os
import queue as queues_module
import threading
import time
from collections.abc import Callable, Iterator

import aio_pika
import paho.mqtt.client as mqtt
import pika
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaAdminClient
from kafka.admin import NewTopic
from paho.mqtt.enums import CallbackAPIVersion
from pika.exceptions import AMQPError, NackError

from tests.braid_process import BraidProcess
from tests.cluster.cluster_fixture import UNAVAILABLE_WAIT_MS, Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, amqp, drain, eventually, redis_server

__all__ = ["redis_server"]  # the module's Redis fixture (tests/cluster/test_node.py)

SHARDS = 12
VICTIM = 3  # the node killed; every client talks to node 1 (the subscriber excepted)
LONG = os.environ.get("BRAID_LONG") == "1"
ROUNDS = 4 if LONG else 1
# Whether a round leaves the node down past unavailable_wait_ms before restarting it (the
# retriable answers are then sure to come), else restarts it at once (a supervisor's way).
WAIT_DOWN = [round_number % 2 == 0 for round_number in range(ROUNDS)]
RECORDS = 1000 if LONG else 180  # per protocol and round
PACE_S = 0.01  # between two records of one publisher: the load spans the kill
QUIET_S = 3.0  # no MQTT message for this long: the subscriber got what it will get
QUEUE_TOPIC = "amq.queue."
SESSION_TOPIC = "__mqtt.session."


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("restart"), redis_server.url, shards=SHARDS) as c:
        yield c


class Load(threading.Thread):
    """One publisher's loop on its own thread: ``sent`` counts the records handed to the
    client so far, ``error`` keeps what ended it early."""

    def __init__(self, body: Callable[[Load], None]) -> None:
        super().__init__(daemon=True)
        self._body = body
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._body(self)
        except BaseException as error:
            self.error = error

    def finish(self) -> None:
        self.join(DEADLINE_S * 3)
        assert not self.is_alive(), "a publisher did not finish"
        if self.error is not None:
            raise self.error


# -- Kafka ---------------------------------------------------------------------------------


def kafka_load(cluster: Cluster, topic: str) -> tuple[Load, dict[int, list[str]]]:
    """The producer's load, and what it sends to each partition, in order."""
    sent: dict[int, list[str]] = {p: [] for p in range(SHARDS)}
    failed: list[object] = []

    def body(load: Load) -> None:
        producer = Producer(
            {
                "bootstrap.servers": cluster[1].kafka_bootstrap,
                "enable.idempotence": True,
                "acks": "all",
            }
        )
        for number in range(RECORDS):
            partition = number % SHARDS
            value = f"{partition}:{number}"
            sent[partition].append(value)
            producer.produce(
                topic,
                partition=partition,
                value=value.encode(),
                on_delivery=lambda error, _m: failed.append(error) if error else None,
            )
            producer.poll(0)
            load.sent += 1
            time.sleep(PACE_S)
        assert producer.flush(DEADLINE_S * 2) == 0
        assert failed == []

    return Load(body), sent


def read_partitions(cluster: Cluster, topic: str) -> dict[int, list[str]]:
    """Each partition's values from the start to its end."""
    consumer = Consumer(
        {
            "bootstrap.servers": cluster[1].kafka_bootstrap,
            "group.id": f"{topic}.reader",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(SHARDS)])
    got: dict[int, list[str]] = {p: [] for p in range(SHARDS)}
    at_end: set[int] = set()
    end = time.monotonic() + DEADLINE_S
    try:
        while len(at_end) < SHARDS:
            assert time.monotonic() < end, f"partitions at their end: {sorted(at_end)}"
            message = consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            partition = message.partition()
            assert partition is not None
            if error is not None and error.code() == KafkaError._PARTITION_EOF:
                at_end.add(partition)
                continue
            assert error is None, error
            at_end.discard(partition)
            got[partition].append(bytes(message.value() or b"").decode())
    finally:
        consumer.close()
    return got


# -- AMQP ----------------------------------------------------------------------------------


def amqp_load(cluster: Cluster, queues: list[str]) -> tuple[Load, set[bytes], set[bytes]]:
    """The publisher's load, the bodies confirmed, and those nacked (then published again)."""
    confirmed: set[bytes] = set()
    nacked: set[bytes] = set()

    def body(load: Load) -> None:
        connection: pika.BlockingConnection | None = None
        end = time.monotonic() + DEADLINE_S * 2
        for number in range(RECORDS):
            queue = queues[number % len(queues)]
            message = f"{queue}:{number}".encode()
            while message not in confirmed:
                assert time.monotonic() < end, f"{message!r} never confirmed"
                try:
                    if connection is None or connection.is_closed:
                        connection = amqp(cluster[1])
                        channel = connection.channel()
                        channel.confirm_delivery()
                    channel.basic_publish("", queue, message, pika.BasicProperties(delivery_mode=2))
                    confirmed.add(message)
                except NackError:  # the queue's owner is down: publish it again
                    nacked.add(message)
                    time.sleep(0.1)
                except AMQPError:  # the connection went: a new one, and publish again
                    nacked.add(message)
                    connection = None
                    time.sleep(0.1)
            load.sent += 1
            time.sleep(PACE_S)
        if connection is not None and connection.is_open:
            connection.close()

    return Load(body), confirmed, nacked


# -- MQTT ----------------------------------------------------------------------------------


class Subscriber:
    """A persistent QoS 1 subscriber (3.1.1, clean_session=False) that reconnects itself."""

    def __init__(self, port: int, client_id: str) -> None:
        self.paho = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=False,
        )
        self.received: queues_module.Queue[bytes] = queues_module.Queue()
        self.suback = threading.Event()
        self.paho.on_message = lambda _c, _u, message: self.received.put(bytes(message.payload))
        self.paho.on_subscribe = lambda *_: self.suback.set()
        self.paho.reconnect_delay_set(0.1, 0.5)
        self.paho.connect("127.0.0.1", port)
        self.paho.loop_start()

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


def mqtt_load(
    cluster: Cluster, topic: str, records: int = RECORDS
) -> tuple[Load, set[bytes], list[bytes]]:
    """The MQTT 5 publisher's load on node 1 (``records`` QoS 1 publishes), the payloads
    PUBACKed with success, and those refused (PUBACK >= 0x80) and sent again."""
    acked: set[bytes] = set()
    refused: list[bytes] = []

    def body(load: Load) -> None:
        reasons: dict[int, int] = {}  # mid -> PUBACK reason code, set by paho's thread
        publisher = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=f"{topic}.pub", protocol=mqtt.MQTTv5
        )
        publisher.on_publish = lambda _c, _u, mid, reason, _p: reasons.__setitem__(
            mid, int(reason.value)
        )
        publisher.max_inflight_messages_set(100)
        publisher.connect("127.0.0.1", cluster[1].mqtt_port)
        publisher.loop_start()
        pending: dict[int, bytes] = {}  # mid -> payload
        end = time.monotonic() + DEADLINE_S * 2

        def settle() -> None:
            for mid in [mid for mid in pending if mid in reasons]:
                payload = pending.pop(mid)
                if reasons.pop(mid) < 0x80:
                    acked.add(payload)
                else:  # the subscriber's session shard is down: send it again
                    refused.append(payload)
                    pending[publisher.publish(topic, payload, qos=1).mid] = payload

        try:
            for number in range(records):
                payload = f"m:{number}".encode()
                pending[publisher.publish(topic, payload, qos=1).mid] = payload
                load.sent += 1
                settle()
                time.sleep(PACE_S)
            while pending:
                assert time.monotonic() < end, f"{len(pending)} publishes never PUBACKed"
                settle()
                time.sleep(0.05)
        finally:
            publisher.disconnect()
            publisher.loop_stop()

    return Load(body), acked, refused


def received_all(subscriber: Subscriber, acked: set[bytes]) -> list[bytes]:
    """What of ``acked`` never reached ``subscriber``: read until all came, or none for
    ``QUIET_S``."""
    received: set[bytes] = set()
    end = time.monotonic() + DEADLINE_S
    while not acked <= received and time.monotonic() < end:
        try:
            received.add(subscriber.received.get(timeout=QUIET_S))
        except queues_module.Empty:
            break
    return sorted(acked - received)


async def pipelined_confirms(
    process: BraidProcess, queues: list[str], mode: aio_pika.DeliveryMode
) -> dict[bytes, bool]:
    """Ten messages of delivery ``mode`` to each of ``queues`` (``dead:N`` to the first,
    ``live:N`` to the second, interleaved) published at once by aio-pika with confirms: whether
    each was acked (False: nacked)."""
    connection = await aio_pika.connect(f"amqp://guest:guest@127.0.0.1:{process.amqp_port}/")
    async with connection:
        channel = await connection.channel(publisher_confirms=True)
        exchange = channel.default_exchange
        sent = [
            (f"{kind}:{mode.value}:{number}".encode(), queue)
            for number in range(10)
            for kind, queue in zip(("dead", "live"), queues, strict=True)
        ]
        results = await asyncio.gather(
            *(
                exchange.publish(
                    aio_pika.Message(body, delivery_mode=mode),
                    routing_key=queue,
                )
                for body, queue in sent
            ),
            return_exceptions=True,
        )
    return {
        body: not isinstance(result, BaseException)
        for (body, _), result in zip(sent, results, strict=True)
    }


async def both_confirms(
    process: BraidProcess, queues: list[str]
) -> tuple[dict[bytes, bool], dict[bytes, bool]]:
    """:func:`pipelined_confirms` of persistent and of transient messages, on two connections
    at once (one wait for the dead node's answers)."""
    persistent, transient = await asyncio.gather(
        pipelined_confirms(process, queues, aio_pika.DeliveryMode.PERSISTENT),
        pipelined_confirms(process, queues, aio_pika.DeliveryMode.NOT_PERSISTENT),
    )
    return persistent, transient


def until_routed(cluster: Cluster, subscriber: Subscriber, topic: str) -> None:
    """Node 1 routes ``topic`` to the subscriber (it follows the subscription's binding)."""
    probe = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"{topic}.probe")
    probe.connect("127.0.0.1", cluster[1].mqtt_port)
    probe.loop_start()
    try:

        def arrived() -> bool:
            probe.publish(topic, b"probe", qos=1).wait_for_publish(DEADLINE_S)
            try:
                return subscriber.received.get(timeout=0.5) == b"probe"
            except queues_module.Empty:
                return False

        eventually(arrived, f"{topic} routed from node 1")
    finally:
        probe.disconnect()
        probe.loop_stop()


# -- the test ------------------------------------------------------------------------------


def kill_under_load(cluster: Cluster, loads: list[Load], wait_down: bool) -> None:
    """SIGKILL the victim once the quickest publisher sent a third of its records (each one
    sent some, none is done), then start it again once publishes to it were answered as
    unavailable."""

    def running() -> bool:
        sent = [load.sent for load in loads]
        return min(sent) >= 10 and max(sent) >= RECORDS // 3

    eventually(running, "the loads running")
    cluster[VICTIM].kill9()
    # Down past unavailable_wait_ms: the publishers get their retriable answers (a quick
    # restart can come back before them: the held publishes then simply go through).
    if wait_down:
        time.sleep(UNAVAILABLE_WAIT_MS / 1000 + 0.5)
    cluster[VICTIM].start()


@pytest.mark.parametrize("round_number", range(ROUNDS))
def test_a_node_killed_under_load_loses_and_duplicates_nothing(
    cluster: Cluster, round_number: int
) -> None:
    # Kafka: a topic led by all three nodes.
    topic = f"rs.kafka.{round_number}"
    admin = KafkaAdminClient(bootstrap_servers=cluster[1].kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=SHARDS, replication_factor=1)])
    finally:
        admin.close()
    assert {cluster.queue_owner(topic, p) for p in range(SHARDS)} == {1, 2, 3}
    # AMQP: a durable queue of each node, declared on its owner, known on node 1.
    queues = [
        cluster.name_owned_by(node_id, f"rs.q{round_number}.", QUEUE_TOPIC) for node_id in (1, 2, 3)
    ]
    for node_id, queue in zip((1, 2, 3), queues, strict=True):
        connection = amqp(cluster[node_id])
        try:
            connection.channel().queue_declare(queue, durable=True)
        finally:
            connection.close()

    def known_on_node_1() -> bool:
        connection = amqp(cluster[1])
        try:
            channel = connection.channel()
            for queue in queues:
                channel.queue_declare(queue, passive=True)
            return True
        finally:
            connection.close()

    eventually(known_on_node_1, "the queues on node 1")
    # MQTT: the subscriber's session is the victim's, on the victim.
    client_id = cluster.name_owned_by(VICTIM, f"rs.sub{round_number}.", SESSION_TOPIC)
    mqtt_topic = f"rs/{round_number}/load"
    subscriber = Subscriber(cluster[VICTIM].mqtt_port, client_id)
    try:
        eventually(lambda: subscriber.paho.is_connected(), "the subscriber connected")
        subscriber.paho.subscribe(f"rs/{round_number}/#", qos=1)
        assert subscriber.suback.wait(DEADLINE_S)
        until_routed(cluster, subscriber, f"rs/{round_number}/probe")

        kafka, kafka_sent = kafka_load(cluster, topic)
        amqp_publisher, confirmed, nacked = amqp_load(cluster, queues)
        mqtt_publisher, mqtt_acked, mqtt_refused = mqtt_load(cluster, mqtt_topic)
        loads = [kafka, amqp_publisher, mqtt_publisher]
        for load in loads:
            load.start()
        kill_under_load(cluster, loads, WAIT_DOWN[round_number])
        for load in loads:
            load.finish()

        # Kafka: every record once, each partition's in the order sent (idempotence).
        assert read_partitions(cluster, topic) == kafka_sent
        # AMQP: every confirmed message in its queue; twice only if nacked once.
        assert len(confirmed) == RECORDS
        stored: list[bytes] = []
        for node_id, queue in zip((1, 2, 3), queues, strict=True):
            stored.extend(drain(cluster[node_id], queue))
        assert set(stored) == confirmed
        twice = {body for body in stored if stored.count(body) > 1}
        assert twice <= nacked, sorted(twice - nacked)[:5]
        # MQTT QoS 1: every acknowledged message reached the subscriber at least once.
        assert len(mqtt_acked) == RECORDS
        # Publishes met the node down: a nack or a PUBACK >= 0x80 (one of them: a publish held
        # while the node comes back within unavailable_wait_ms just goes through).
        assert nacked or mqtt_refused or not WAIT_DOWN[round_number]
        missing = received_all(subscriber, mqtt_acked)
        assert not missing, f"{len(missing)} acknowledged MQTT messages not received: {missing[:8]}"
    finally:
        subscriber.close()


def test_publishes_not_stored_are_refused_though_a_later_one_was_stored(
    cluster: Cluster,
) -> None:
    """The module docstring's last paragraph, made deterministic: with the victim down, QoS 1
    publishes matching a persistent subscriber's session there fail at
    ``unavailable_wait_ms``; those queued behind the first one's wait are acknowledged with a
    later publish to the same log topic, stored on node 1 alone. Each must be refused (0x80),
    or reach the subscriber once the victim is back; the stored one is not refused."""
    here = cluster.name_owned_by(1, "rshere")  # an MQTT topic's first level: its log topic
    # AMQP the same way: publishes to a queue of the victim's and to one of node 1's,
    # pipelined (one read, one durability wait for the last), each confirm its own fate.
    dead_queue = cluster.name_owned_by(VICTIM, "rs.held.q", QUEUE_TOPIC)
    live_queue = cluster.name_owned_by(1, "rs.held.q", QUEUE_TOPIC)
    for node_id, queue in ((VICTIM, dead_queue), (1, live_queue)):
        connection = amqp(cluster[node_id])
        try:
            connection.channel().queue_declare(queue, durable=True)
        finally:
            connection.close()

    def known_on_node_1() -> bool:
        connection = amqp(cluster[1])
        try:
            connection.channel().queue_declare(dead_queue, passive=True)
            return True
        finally:
            connection.close()

    eventually(known_on_node_1, f"{dead_queue} known on node 1")
    admin = KafkaAdminClient(bootstrap_servers=cluster[1].kafka_bootstrap)
    try:  # one partition: the log topic's records stay in node 1's shard
        admin.create_topics([NewTopic(here, num_partitions=1, replication_factor=1)])
    finally:
        admin.close()
    client_id = cluster.name_owned_by(VICTIM, "rs.held.", SESSION_TOPIC)
    subscriber = Subscriber(cluster[VICTIM].mqtt_port, client_id)
    reasons: dict[int, int] = {}  # mid -> PUBACK reason code, set by paho's thread
    publisher = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="rs.held", protocol=mqtt.MQTTv5)
    publisher.on_publish = lambda _c, _u, mid, reason, _p: reasons.__setitem__(
        mid, int(reason.value)
    )
    publisher.max_inflight_messages_set(100)
    try:
        eventually(lambda: subscriber.paho.is_connected(), "the subscriber connected")
        subscriber.paho.subscribe(f"{here}/away/#", qos=1)
        assert subscriber.suback.wait(DEADLINE_S)
        until_routed(cluster, subscriber, f"{here}/away/probe")
        publisher.connect("127.0.0.1", cluster[1].mqtt_port)
        publisher.loop_start()
        cluster[VICTIM].kill9()
        # One publish whose acknowledgement waits for its forward, then more queued behind it
        # (a read of their own); then one stored here alone, read once all of those failed.
        sent = {publisher.publish(f"{here}/away/load", b"a:0", qos=1).mid: b"a:0"}
        time.sleep(0.2)
        for number in range(1, 20):
            payload = f"a:{number}".encode()
            sent[publisher.publish(f"{here}/away/load", payload, qos=1).mid] = payload
        slept = time.monotonic() + UNAVAILABLE_WAIT_MS / 1000 + 1.0
        confirmed, transient = asyncio.run(both_confirms(cluster[1], [dead_queue, live_queue]))
        time.sleep(max(0.0, slept - time.monotonic()))
        here_mid = publisher.publish(f"{here}/local", b"h:0", qos=1).mid
        eventually(lambda: {here_mid, *sent} <= reasons.keys(), "every publish answered")
        acked = {payload for mid, payload in sent.items() if reasons[mid] < 0x80}
        cluster[VICTIM].start()
        missing = received_all(subscriber, acked)
        assert not missing, f"{len(missing)} PUBACKed with success, never received: {missing}"
        assert reasons[here_mid] == 0  # stored: not refused with those that were not
        stored = eventually(lambda: [drain(cluster[VICTIM], dead_queue)], "the queue read")[0]
        lost = {body for body, acked in confirmed.items() if acked and body.startswith(b"dead")}
        assert lost <= set(stored), f"AMQP confirmed, never stored: {sorted(lost - set(stored))}"
        assert all(acked for body, acked in confirmed.items() if body.startswith(b"live"))
        # Transient ones too: confirmed once every queue took them, so those the dead node's
        # queue never got are nacked (were acked before their forward's answer).
        assert not [body for body, acked in transient.items() if acked and body.startswith(b"dead")]
        assert all(acked for body, acked in transient.items() if body.startswith(b"live"))
    finally:
        publisher.disconnect()
        publisher.loop_stop()
        subscriber.close()
