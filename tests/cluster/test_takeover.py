"""Takeover of a dead node's shards (issue 23; docs/cluster.md sections 5, 11 and 12): three
real ``braid serve --cluster`` nodes on a root of 12 shards with ``[cluster] takeover`` on and a
short lease (tests/cluster/cluster_fixture.py: lease_ms 3000, heartbeat_ms 500).

An idempotent acks=all confluent-kafka producer writes to a topic whose 12 partitions have
leaders on all three nodes, and a confirming pika publisher to a queue in a shard of node 3.
Node 3 is killed with SIGKILL. Nodes 1 and 2 see its lease gone, divide its shards by the plan
over the live nodes, claim them at new epochs, recover them and serve them: Kafka Metadata names
them as leaders, the producer's records and AMQP publishes to the former shards of node 3 are
acknowledged again. Every record acknowledged before and after is read exactly once (Kafka: in
order per partition), every confirmed AMQP message is on the queue's new owner, and the offsets
committed to a consumer group coordinated in a shard of node 3 are answered by its new
coordinator, and the MQTT will of a paho connection on node 3 reaches a subscriber on node 1
(a survivor publishes the dead node's wills). The printed takeover times are a measurement,
not asserted.

Then node 4 joins as a standby and takes node 2's shards when node 2 is killed; ``braid cluster
drain 4`` moves them to node 1 under load (node 4 stays up as a standby). The module's Redis runs
under Sentinel (a master, one replica, three sentinels; the nodes get a ``redis+sentinel://``
URL). Last, the Redis master is killed under the nodes left: they follow the promoted replica
(issue 23 item 3) and stop cleanly after.

``BRAID_LONG=1`` writes more records per round.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue as queues
import threading
import time
from collections.abc import Iterator

import paho.mqtt.client as mqtt
import pika
import pytest
import redis
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from pika.exceptions import AMQPError

from core.cluster.membership import takeover_plan
from core.cluster.placement import group_shard, partition_shard
from tests.braid_process import BraidProcess
from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisProcesses, RedisServer, redis_processes
from tests.cluster.test_node import DEADLINE_S, LEASE_MS, amqp, braid, eventually

SHARDS = 12
PARTITIONS = 12
TOPIC = "to.events"
QUEUE_TOPIC = "amq.queue."
VICTIM = 3
SURVIVORS = (1, 2)
LONG = os.environ.get("BRAID_LONG") == "1"
PER_PARTITION = 200 if LONG else 10  # records per partition and round
AMQP_MESSAGES = 500 if LONG else 20  # confirmed messages per round


SERVICE = "braid"
FAILOVER_TIMEOUT_MS = 3000  # sentinel failover-timeout: a stuck failover is retried soon


class SentinelRedis:
    """The module's Redis: a master, one replica, three sentinels watching them."""

    def __init__(self, processes: RedisProcesses) -> None:
        self.processes = processes
        self.master: RedisServer = processes.redis(tcp=True)
        self.replica: RedisServer = processes.redis(replica_of=self.master)
        self.url = processes.sentinel_group(
            self.master, SERVICE, failover_timeout_ms=FAILOVER_TIMEOUT_MS
        )


@pytest.fixture(scope="module")
def redis_group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelRedis]:
    with redis_processes(tmp_path_factory.mktemp("redis")) as processes:
        yield SentinelRedis(processes)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_group: SentinelRedis
) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("takeover"), redis_group.url, shards=SHARDS, takeover=True
    ) as started:
        yield started


def bootstrap(cluster: Cluster) -> str:
    return ",".join(cluster[node].kafka_bootstrap for node in SURVIVORS)


def leaders(admin: AdminClient) -> dict[int, int]:
    topic = admin.list_topics(TOPIC, timeout=5).topics[TOPIC]
    return {number: part.leader for number, part in topic.partitions.items()}


class Acked:
    """The confluent producer's acknowledged records, by partition, in acknowledgement order."""

    def __init__(self) -> None:
        self.by_partition: dict[int, list[bytes]] = {}
        self.errors: list[str] = []

    def __call__(self, error: KafkaError | None, message: object) -> None:
        if error is not None:
            self.errors.append(str(error))
            return
        value = message.value()  # type: ignore[attr-defined]
        self.by_partition.setdefault(message.partition(), []).append(value)  # type: ignore[attr-defined]


def produce_round(producer: Producer, acked: Acked, tag: str) -> None:
    for number in range(PER_PARTITION):
        for partition in range(PARTITIONS):
            producer.produce(
                TOPIC,
                value=f"{tag}:{partition}:{number}".encode(),
                partition=partition,
                on_delivery=acked,
            )
            producer.poll(0)
    left = producer.flush(DEADLINE_S * 2)
    assert left == 0, f"{left} records unacknowledged"
    assert not acked.errors, acked.errors[:5]


def publish_confirmed(port: int, queue: str, bodies: list[bytes]) -> list[bytes]:
    """Publish ``bodies`` with confirms through the node on ``port``; those confirmed."""
    confirmed: list[bytes] = []
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            try:
                channel.basic_publish(
                    "", queue, body, pika.BasicProperties(delivery_mode=2), mandatory=False
                )
            except AMQPError:  # nacked (the owner is down): not confirmed
                break
            confirmed.append(body)
    finally:
        if connection.is_open:
            connection.close()
    return confirmed


def consume_all(port: int, queue: str, expected: set[bytes]) -> list[bytes]:
    """Consume ``queue`` (acking) until every body of ``expected`` arrived, then a moment
    longer (a duplicate would come then); the bodies in delivery order."""
    connection = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", port, heartbeat=0))
    bodies: list[bytes] = []
    try:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=100)
        end = time.monotonic() + DEADLINE_S
        quiet_until: float | None = None
        for method, _, body in channel.consume(queue, inactivity_timeout=0.2):
            now = time.monotonic()
            if method is not None:
                bodies.append(body)
                channel.basic_ack(method.delivery_tag)
            if quiet_until is None and expected <= set(bodies):
                quiet_until = now + 1.0
            if now > end or (quiet_until is not None and now > quiet_until):
                break
        channel.cancel()
    finally:
        connection.close()
    return bodies


def group_of_victim(cluster: Cluster) -> str:
    """A consumer group whose coordinator (its offsets' shard) is the victim's."""
    victim_shards = cluster.served(VICTIM)
    for number in range(10_000):
        group = f"to.group{number}"
        if group_shard(group, SHARDS) in victim_shards:
            return group
    raise AssertionError("no group lands on the victim")


def group_consumer(cluster: Cluster, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "group.id": group,
            "enable.auto.commit": False,
        }
    )


def read_partitions(cluster: Cluster, expected: dict[int, int]) -> dict[int, list[bytes]]:
    """Every record of each partition from offset 0, until ``expected[p]`` were read."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "group.id": "to.reader",
            "enable.auto.commit": False,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(PARTITIONS)}
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
        end = time.monotonic() + DEADLINE_S * 2
        while time.monotonic() < end and any(
            len(got[p]) < expected.get(p, 0) for p in range(PARTITIONS)
        ):
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    got[message.partition()].append(message.value())
        # A little longer: a duplicate would arrive after the expected count.
        for message in consumer.consume(500, timeout=1.0):
            if message.error() is None:
                got[message.partition()].append(message.value())
    finally:
        consumer.close()
    return got


WILL_TOPIC = "to/wills/victim"


def paho_client(port: int, client_id: str) -> tuple[mqtt.Client, queues.Queue[tuple[bytes, float]]]:
    """An MQTT 3.1.1 paho client and the payloads it gets with when (call ``will_set`` on it
    before :func:`start`)."""
    got: queues.Queue[tuple[bytes, float]] = queues.Queue()
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id)
    client.on_message = lambda _client, _data, message: got.put((message.payload, time.monotonic()))
    client.user_data_set(port)
    return client, got


def start(client: mqtt.Client) -> None:
    connected = threading.Event()
    client.on_connect = lambda *args: connected.set()
    client.connect("127.0.0.1", client.user_data_get())
    client.loop_start()
    assert connected.wait(DEADLINE_S), "CONNACK"


def wills_in_redis(url: str, node: int) -> dict[bytes, bytes]:
    """``mqtt:wills:<node>`` of the module's cluster, read from the Redis master."""
    master = redis.Redis.from_url(url)
    try:
        found: dict[bytes, bytes] = {}
        for key in master.scan_iter(match=f"braid:*:mqtt:wills:{node}"):
            found.update(master.hgetall(key))  # type: ignore[arg-type]
        return found
    finally:
        master.close()


def test_survivors_take_over_a_killed_node(cluster: Cluster, redis_group: SentinelRedis) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(cluster)})
    for future in admin.create_topics(
        [NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)]
    ).values():
        future.result(timeout=DEADLINE_S)
    # Every partition led (-1: its shard has no live owner yet, e.g. a node that fenced itself
    # on a loaded machine and is rejoining), so the victim's share is known before the kill.
    before = eventually(
        lambda: (
            (found := leaders(admin))
            and len(found) == PARTITIONS
            and all(leader >= 0 for leader in found.values())
            and found
        ),
        "leaders of every partition",
    )
    victim_partitions = sorted(p for p, leader in before.items() if leader == VICTIM)
    assert victim_partitions, before
    assert set(before.values()) == {1, 2, 3}

    queue = cluster.name_owned_by(VICTIM, "to.q", QUEUE_TOPIC)
    queue_shard = partition_shard(QUEUE_TOPIC + queue, 0, SHARDS)
    # Who takes each of the victim's shards: the plan every node computes (core/cluster/
    # membership.py takeover_plan), from who owns what now.
    owners = {shard: str(n) for n in (1, 2, VICTIM) for shard in cluster.served(n)}
    planned = takeover_plan([str(n) for n in SURVIVORS], owners, sorted(cluster.served(VICTIM)))
    new_queue_owner = int(planned[queue_shard])
    connection = amqp(cluster[1])
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    # The queue's next owner learns it now, as another node's (reached over gRPC).
    connection = amqp(cluster[new_queue_owner])
    connection.channel().queue_declare(queue, passive=True)
    connection.close()

    acked = Acked()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap(cluster),
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(DEADLINE_S * 2000),
            "linger.ms": 5,
        }
    )
    produce_round(producer, acked, "before")
    sent_before = [f"before:{n}".encode() for n in range(AMQP_MESSAGES)]
    confirmed = publish_confirmed(cluster[1].amqp_port, queue, sent_before)
    assert confirmed == sent_before

    # Offsets committed to a group coordinated in one of the victim's shards.
    group = group_of_victim(cluster)
    committed = [TopicPartition(TOPIC, p, p + 1) for p in range(PARTITIONS)]
    committer = group_consumer(cluster, group)
    try:
        committer.commit(offsets=committed, asynchronous=False)
    finally:
        committer.close()

    # A QoS 1 will of a connection on the victim, a subscriber to it on a survivor.
    subscriber, wills = paho_client(cluster[1].mqtt_port, "to-will-subscriber")
    start(subscriber)
    subscribed = threading.Event()
    subscriber.on_subscribe = lambda *args: subscribed.set()
    subscriber.subscribe(WILL_TOPIC, qos=1)
    assert subscribed.wait(DEADLINE_S), "SUBACK"
    testament, _ = paho_client(cluster[VICTIM].mqtt_port, "to-will-victim")
    testament.will_set(WILL_TOPIC, b"the victim's will", qos=1)
    start(testament)
    master_url = redis_group.master.url
    eventually(lambda: b"to-will-victim" in wills_in_redis(master_url, VICTIM), "the will held")

    cluster[VICTIM].kill9()
    killed = time.monotonic()

    def new_leaders() -> dict[int, int] | None:
        found = leaders(admin)
        if len(found) == PARTITIONS and all(found[p] in SURVIVORS for p in found):
            return found
        return None

    after = eventually(new_leaders, "Metadata naming new leaders for the victim's partitions")
    metadata_s = time.monotonic() - killed
    produce_round(producer, acked, "after")
    kafka_s = time.monotonic() - killed

    def publish_once() -> list[bytes]:
        return publish_confirmed(cluster[1].amqp_port, queue, [b"after:probe"])

    probe = eventually(publish_once, "a confirmed publish to the victim's queue")
    amqp_s = time.monotonic() - killed
    sent_after = [f"after:{n}".encode() for n in range(AMQP_MESSAGES)]
    confirmed += probe + publish_confirmed(cluster[1].amqp_port, queue, sent_after)
    print(
        f"\ntakeover of node {VICTIM} (partitions {victim_partitions}): Metadata names new "
        f"leaders after {metadata_s:.2f} s, a round to every partition acknowledged after "
        f"{kafka_s:.2f} s, the first AMQP publish to its queue confirmed after {amqp_s:.2f} s"
    )
    producer.flush(DEADLINE_S)

    # The plan: the victim's shards balanced between the survivors.
    for partition in victim_partitions:
        assert after[partition] == int(planned[partition_shard(TOPIC, partition, SHARDS)])
    assert {after[p] for p in victim_partitions} == set(SURVIVORS), after

    # The group's offsets moved with its shard: its new coordinator answers them.
    reader = group_consumer(cluster, group)
    try:
        found = eventually(
            lambda: reader.committed(
                [TopicPartition(TOPIC, p) for p in range(PARTITIONS)], timeout=5
            ),
            "the group's committed offsets from its new coordinator",
        )
    finally:
        reader.close()
    assert {(tp.partition, tp.offset) for tp in found} == {
        (tp.partition, tp.offset) for tp in committed
    }

    expected = {p: len(values) for p, values in acked.by_partition.items()}
    got = read_partitions(cluster, expected)
    for partition in range(PARTITIONS):
        assert got[partition] == acked.by_partition[partition], partition

    # Its new owner's gateway serves the queue from the shard it took, not over gRPC to itself
    # (a takeover's added shard tells the gateway: Node.add_shard, vhost._follow_takeover).
    connection = amqp(cluster[new_queue_owner])
    try:
        channel = connection.channel()
        method, _, _ = channel.basic_get(queue)
        assert isinstance(method, pika.spec.Basic.GetOk), method
        channel.basic_reject(method.delivery_tag, requeue=True)
    finally:
        connection.close()
    served = f"amqp: queue {queue!r} is served by this node now (its shard was taken over)"
    assert served in cluster[new_queue_owner].stderr()

    bodies = consume_all(cluster[new_queue_owner].amqp_port, queue, set(confirmed))
    assert len(bodies) == len(set(bodies)), "a confirmed message twice"
    assert set(confirmed) <= set(bodies)
    assert len(confirmed) == 2 * AMQP_MESSAGES + 1

    # A survivor published the victim's will (once) and took its hash out of Redis.
    try:
        will, arrived = wills.get(timeout=DEADLINE_S)
        assert will == b"the victim's will"
        print(f"the victim's will arrived {arrived - killed:.2f} s after the kill")
        with pytest.raises(queues.Empty):
            wills.get(timeout=0.5)
    finally:
        subscriber.loop_stop()
        testament.loop_stop()
    assert wills_in_redis(master_url, VICTIM) == {}


def test_a_standby_takes_over_and_starts_serving(cluster: Cluster) -> None:
    """A node that joined owning nothing (a standby, no listeners) owns the fewest shards when
    node 2 is killed: it takes all of node 2's shards and starts serving (its listeners open,
    Metadata names it leader, produces to them acknowledged and read back once, in order)."""
    standby = cluster.add_node(4)
    assert "shards=none" in standby.ready_line
    bootstrap_one = cluster[1].kafka_bootstrap
    admin = AdminClient({"bootstrap.servers": bootstrap_one})
    if TOPIC not in admin.list_topics(timeout=5).topics:  # (this test run alone)
        for future in admin.create_topics(
            [NewTopic(TOPIC, num_partitions=PARTITIONS, replication_factor=1)]
        ).values():
            future.result(timeout=DEADLINE_S)
    # Every partition led (-1: its shard has no live owner yet, e.g. a node that fenced itself
    # on a loaded machine and is rejoining), so the victim's share is known before the kill.
    before = eventually(
        lambda: (
            (found := leaders(admin))
            and len(found) == PARTITIONS
            and all(leader >= 0 for leader in found.values())
            and found
        ),
        "leaders of every partition",
    )
    second = sorted(p for p, leader in before.items() if leader == 2)
    assert second, before

    acked = Acked()
    producer = Producer(
        {
            "bootstrap.servers": bootstrap_one,
            "enable.idempotence": True,
            "acks": "all",
            "message.timeout.ms": int(DEADLINE_S * 2000),
            "linger.ms": 5,
        }
    )

    def produce(tag: str) -> None:
        for number in range(PER_PARTITION):
            for partition in second:
                producer.produce(
                    TOPIC,
                    value=f"{tag}:{partition}:{number}".encode(),
                    partition=partition,
                    on_delivery=acked,
                )
        assert producer.flush(DEADLINE_S * 2) == 0
        assert not acked.errors, acked.errors[:5]

    produce("standby-before")
    cluster[2].kill9()
    killed = time.monotonic()
    after = eventually(
        lambda: (found := leaders(admin)) and all(found.get(p) == 4 for p in second) and found,
        "Metadata naming the standby leader of node 2's partitions",
    )
    metadata_s = time.monotonic() - killed
    produce("standby-after")
    print(
        f"\nstandby node 4 took node 2's partitions {second}: Metadata after {metadata_s:.2f} s, "
        f"a round acknowledged after {time.monotonic() - killed:.2f} s"
    )
    assert {after[p] for p in second} == {4}

    consumer = Consumer(
        {"bootstrap.servers": bootstrap_one, "group.id": "to.standby", "enable.auto.commit": False}
    )
    got: dict[int, list[bytes]] = {p: [] for p in second}
    try:
        consumer.assign([TopicPartition(TOPIC, p, 0) for p in second])
        end = time.monotonic() + DEADLINE_S * 2
        while time.monotonic() < end and any(
            len([v for v in got[p] if v.startswith(b"standby-")]) < len(acked.by_partition[p])
            for p in second
        ):
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    got[message.partition()].append(message.value())
        for message in consumer.consume(500, timeout=1.0):
            if message.error() is None:
                got[message.partition()].append(message.value())
    finally:
        consumer.close()
    for partition in second:
        mine = [v for v in got[partition] if v.startswith(b"standby-")]
        assert mine == acked.by_partition[partition], partition


FAILOVER_TOPIC = "to.failover"
FAILOVER_PARTITIONS = 6
AFTER_KILL_S = 0.2  # how long the writers go on once both had a write acknowledged after it


class Writers:
    """An idempotent confluent producer and a confirming pika publisher writing in threads
    until stopped; what each had acknowledged, and when the first write sent after ``mark()``
    was acknowledged."""

    def __init__(
        self,
        nodes: list[BraidProcess],
        queue: str,
        topic: str = FAILOVER_TOPIC,
        partitions: int = FAILOVER_PARTITIONS,
    ) -> None:
        self.nodes = nodes
        self.queue = queue
        self.topic = topic
        self.partitions = partitions
        self.acked = Acked()
        self.sent_at: dict[bytes, float] = {}
        self.confirmed: list[bytes] = []
        self.refused = 0  # AMQP publishes nacked or cut off (not confirmed)
        self.mark_at: float | None = None
        self.first_kafka: float | None = None
        self.first_amqp: float | None = None
        self.kafka_acks: list[float] = []  # when each acknowledgement came
        self.amqp_acks: list[float] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._produce, daemon=True),
            threading.Thread(target=self._publish, daemon=True),
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def mark(self) -> None:
        self.mark_at = time.monotonic()

    def both_acked_after_mark(self) -> bool:
        return self.first_kafka is not None and self.first_amqp is not None

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(DEADLINE_S * 2)
            assert not thread.is_alive()

    def _delivered(self, error: KafkaError | None, message: object) -> None:
        self.acked(error, message)
        if error is None:
            self.kafka_acks.append(time.monotonic())
        if error is not None or self.first_kafka is not None or self.mark_at is None:
            return
        if self.sent_at[message.value()] >= self.mark_at:  # type: ignore[attr-defined]
            self.first_kafka = time.monotonic()

    def _produce(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": ",".join(n.kafka_bootstrap for n in self.nodes),
                "enable.idempotence": True,
                "acks": "all",
                "message.timeout.ms": int(DEADLINE_S * 2000),
                "linger.ms": 5,
            }
        )
        number = 0
        while not self._stop.is_set():
            for partition in range(self.partitions):
                value = f"f:{partition}:{number}".encode()
                self.sent_at[value] = time.monotonic()
                producer.produce(
                    self.topic, value=value, partition=partition, on_delivery=self._delivered
                )
            number += 1
            producer.poll(0.02)
        assert producer.flush(DEADLINE_S * 2) == 0

    def _publish(self) -> None:
        """Through the first node, or the next while one does not serve (fenced, or a standby
        after rejoining: its shards taken over meanwhile)."""
        number = 0
        ports = itertools.cycle([node.amqp_port for node in self.nodes])
        port = next(ports)
        while not self._stop.is_set():
            try:
                connection = pika.BlockingConnection(
                    pika.ConnectionParameters("127.0.0.1", port, heartbeat=0)
                )
            except AMQPError:
                port = next(ports)
                time.sleep(0.05)
                continue
            try:
                channel = connection.channel()
                channel.confirm_delivery()
                while not self._stop.is_set():
                    body = f"f:{number}".encode()
                    number += 1
                    sent = time.monotonic()
                    channel.basic_publish(
                        "", self.queue, body, pika.BasicProperties(delivery_mode=2)
                    )
                    self.confirmed.append(body)
                    self.amqp_acks.append(time.monotonic())
                    after = self.mark_at is not None and sent >= self.mark_at
                    if after and self.first_amqp is None:
                        self.first_amqp = time.monotonic()
            except AMQPError:  # nacked or the connection closed: not confirmed
                self.refused += 1
                time.sleep(0.05)
            finally:
                with contextlib.suppress(AMQPError):
                    if connection.is_open:
                        connection.close()


def check_written(nodes: list[BraidProcess], writers: Writers) -> None:
    """Every record ``writers`` had acknowledged is read back once, in order per partition,
    and every confirmed AMQP message consumed once (through the first node that serves)."""
    consumer = Consumer(
        {
            "bootstrap.servers": ",".join(n.kafka_bootstrap for n in nodes),
            "group.id": "to.checker",
            "enable.auto.commit": False,
        }
    )
    got: dict[int, list[bytes]] = {p: [] for p in range(writers.partitions)}
    expected = writers.acked.by_partition
    try:
        consumer.assign([TopicPartition(writers.topic, p, 0) for p in range(writers.partitions)])
        end = time.monotonic() + DEADLINE_S * 2
        while time.monotonic() < end and any(len(got[p]) < len(expected.get(p, [])) for p in got):
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    got[message.partition()].append(message.value())
        for message in consumer.consume(500, timeout=1.0):
            if message.error() is None:
                got[message.partition()].append(message.value())
    finally:
        consumer.close()
    for partition in got:
        assert got[partition] == expected.get(partition, []), partition

    def consume_through_a_server() -> list[bytes]:
        for node in nodes:
            with contextlib.suppress(AMQPError):
                return consume_all(node.amqp_port, writers.queue, set(writers.confirmed))
        return []

    bodies = eventually(consume_through_a_server, "a node serving AMQP")
    twice = sorted({body for body in bodies if bodies.count(body) > 1})
    assert not twice, f"{len(twice)} messages twice: {twice[:10]} of {len(bodies)}"
    assert set(writers.confirmed) <= set(bodies)


DRAIN_TOPIC = "to.drain"


def test_a_drained_node_hands_its_shards_over(cluster: Cluster) -> None:
    """``braid cluster drain 4`` (the standby that took node 2's shards) under an idempotent
    producer and a confirming publisher: node 4 closes its shards cleanly and releases its
    lease, node 1 takes them over, node 4 joins again owning nothing (a standby, still up).
    Every acknowledged record is read back once in order; every confirmed message once."""
    nodes = [cluster[1], cluster[4]]
    admin = AdminClient({"bootstrap.servers": cluster[1].kafka_bootstrap})
    for future in admin.create_topics(
        [NewTopic(DRAIN_TOPIC, num_partitions=PARTITIONS, replication_factor=1)]
    ).values():
        future.result(timeout=DEADLINE_S)

    def leaders_of(topic: str) -> set[int]:
        found = admin.list_topics(topic, timeout=5).topics[topic].partitions
        return {p.leader for p in found.values()} if len(found) == PARTITIONS else set()

    assert eventually(lambda: leaders_of(DRAIN_TOPIC) == {1, 4}, "leaders on nodes 1 and 4")
    queue = "to.drain.q"
    connection = amqp(cluster[1])
    connection.channel().queue_declare(queue, durable=True)
    connection.close()

    unknown = braid("cluster", "drain", "9", str(cluster.root), "--cluster", cluster.url)
    assert unknown.returncode == 2, unknown.stderr
    assert "node 9 is not live" in unknown.stderr

    writers = Writers(nodes, queue, DRAIN_TOPIC, PARTITIONS)
    writers.start()
    try:
        eventually(lambda: writers.confirmed and writers.acked.by_partition, "writes before")
        asked = time.monotonic()
        result = braid(
            "cluster", "drain", "4", str(cluster.root), "--cluster", cluster.url, "--timeout", "30"
        )
        drained_s = time.monotonic() - asked
        assert result.returncode == 0, result.stderr
        assert "node 4 drained" in result.stdout, result.stdout
        assert eventually(lambda: leaders_of(DRAIN_TOPIC) == {1}, "node 1 leading every one")
        writers.mark()
        eventually(writers.both_acked_after_mark, "a write of each kind acknowledged after")
    finally:
        writers.stop()
    assert not writers.acked.errors, writers.acked.errors[:5]
    # Publishes through node 1 to a queue in one of node 4's shards are forwarded: none may be
    # stored twice (a closed shard refuses them: core/cluster/owners.py).
    check_written(nodes, writers)
    print(
        f"\nnode 4 drained in {drained_s:.2f} s ({len(result.stdout.splitlines()) - 1} shards "
        f"moved); {writers.refused} AMQP publishes not confirmed (reconnected)"
    )
    standby = cluster[4]
    assert standby.process is not None
    assert standby.process.poll() is None
    after = standby.stderr().split("handed over: joining again as a standby")
    assert len(after) == 2, standby.stderr()[-3000:]
    eventually(
        lambda: "owns no shard: standby" in standby.stderr().split("handed over")[-1],
        "node 4 joined again as a standby",
    )


def test_nodes_follow_a_sentinel_failover(cluster: Cluster, redis_group: SentinelRedis) -> None:
    """Last in the module, on the nodes the takeover tests left (1 and 4): SIGKILL of the Redis
    master under a confirming pika publisher and an idempotent producer. The sentinels promote
    the replica, the nodes follow it (lease renewals and metadata reads reach the new master
    through Sentinel), writes are acknowledged again, and every acknowledged write is there
    once (Kafka: in order per partition). A node whose renewals failed for lease_ms fences
    itself and rejoins. The nodes then stop cleanly (exit 0)."""
    live = [
        n for n, p in cluster.nodes.items() if p.process is not None and p.process.poll() is None
    ]
    nodes = [cluster[n] for n in live]
    assert len(nodes) >= 2, live
    admin = AdminClient({"bootstrap.servers": ",".join(n.kafka_bootstrap for n in nodes)})
    for future in admin.create_topics(
        [NewTopic(FAILOVER_TOPIC, num_partitions=FAILOVER_PARTITIONS, replication_factor=1)]
    ).values():
        future.result(timeout=DEADLINE_S)

    def leaders_live() -> bool:
        found = admin.list_topics(FAILOVER_TOPIC, timeout=5).topics[FAILOVER_TOPIC].partitions
        return len(found) == FAILOVER_PARTITIONS and {p.leader for p in found.values()} <= set(live)

    eventually(leaders_live, "leaders of the failover topic's partitions")
    queue = "to.failover.q"
    connection = amqp(nodes[0])
    connection.channel().queue_declare(queue, durable=True)
    connection.close()
    redis_group.processes.sentinels_acquainted()

    writers = Writers(nodes, queue)
    writers.start()
    try:
        eventually(lambda: writers.confirmed and writers.acked.by_partition, "writes before")
        redis_group.master.kill()
        killed = time.monotonic()
        promoted = redis_group.replica.port
        eventually(
            lambda: all(s.master_port() == promoted for s in redis_group.processes.sentinels),
            "the sentinels to promote the replica",
        )
        failover_s = time.monotonic() - killed
        # A node that could not renew its lease through the failover fences itself by lease_ms
        # after its last renewal: writes sent after that show the nodes serve again.
        time.sleep(max(0.0, killed + LEASE_MS / 1000 + 0.5 - time.monotonic()))
        writers.mark()
        eventually(writers.both_acked_after_mark, "a write of each kind acknowledged after")
        time.sleep(AFTER_KILL_S)
    finally:
        writers.stop()
    fenced = [n for n in live if "fenced (incarnation" in cluster[n].stderr()]

    def longest_gap(times: list[float]) -> float:
        around = [killed] + [t for t in times if t > killed]
        return max(b - a for a, b in itertools.pairwise(around))

    print(
        f"\nRedis master killed: the sentinels named the replica after {failover_s:.2f} s; the "
        f"longest time without an acknowledged write after the kill: "
        f"{longest_gap(writers.kafka_acks):.2f} s (Kafka), {longest_gap(writers.amqp_acks):.2f} s "
        f"(AMQP); {writers.refused} AMQP publishes not confirmed; nodes that fenced themselves "
        f"and rejoined: {fenced or 'none'}"
    )
    assert not writers.acked.errors, writers.acked.errors[:5]
    for number in fenced:  # fenced, then a new incarnation holds the node's lease
        assert "rejoined as incarnation" in cluster[number].stderr().split("fenced (incarn")[-1]
    eventually(leaders_live, "Metadata with a live leader for every partition")

    check_written(nodes, writers)

    # The nodes stop cleanly with what they own (closed markers, leases released).
    for number in live:
        code = cluster[number].stop()
        assert code == 0, cluster[number].stderr()[-3000:]
