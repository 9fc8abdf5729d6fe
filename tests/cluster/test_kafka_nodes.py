"""Kafka producer ids across three real ``braid serve --cluster`` nodes on a root of 12 shards
(docs/cluster.md section 8; tests/cluster/cluster_fixture.py): every node takes its producer
ids in blocks of the cluster's counter in Redis, so producers initialised on different nodes
never share an id.

Idempotent producers of the three clients (confluent-kafka, aiokafka, kafka-python), each
bootstrapped on another node, and a transactional confluent-kafka producer (InitProducerId on
its transactional id's coordinator) send keyed records to a 12-partition topic led by all
three nodes: every record is read back exactly once, each key's in order, no delivery fails
(an id two nodes shared once failed with OUT_OF_ORDER_SEQUENCE_NUMBER), and DescribeProducers
on the partitions' leaders lists four distinct producer ids.

A transaction across the nodes (docs/cluster.md sections 8 and 10): a transactional
confluent-kafka producer writes to every partition of a topic led by all three nodes in one
transaction, straight to each partition's leader, and commits: its coordinator ends it on the
other leaders with ``WriteTxnMarkers``, and a read_committed consumer sees every record. A
second transaction, aborted the same way, is seen by read_uncommitted consumers only.

Across a restart (SIGKILL; these tests come last, they restart nodes): the leader of one
partition of a cross-node transaction restarted before the commit keeps the transaction open
for its coordinator, so the commit shows every record once; the coordinator restarted before
the commit aborts it on the other node too, so a new producer instance finds it ended and the
other partition's last stable offset moves on.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.structs import TopicPartition as KPTopicPartition
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v9.request import MetadataRequest, MetadataRequestTopic
from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData

from core.cluster.placement import transaction_shard
from tests.cluster.cluster_fixture import Cluster
from tests.cluster.redis_server import RedisServer
from tests.cluster.test_node import DEADLINE_S, eventually, redis_server
from tests.kafka.raw import RawClient

__all__ = ["redis_server"]  # the module's Redis fixture (tests/cluster/test_node.py)

SHARDS = 12
TOPIC = "kn.ids"
PER_KEY = 8
KEYS_PER_PRODUCER = 6
TRANSACTIONAL_ID = "kn.txn"
CROSS_TOPIC = "kn.cross"
CROSS_TRANSACTIONAL_ID = "kn.cross.txn"
REFUSED_TOPIC = "kn.refused"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer
) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("kafka"), redis_server.url, shards=SHARDS) as started:
        yield started


def keyed(name: str) -> list[tuple[str, str]]:
    """``(key, value)`` in sending order: each key's values numbered from 0."""
    keys = [f"{name}{n}" for n in range(KEYS_PER_PRODUCER)]
    return [(key, f"{key}:{number}") for number in range(PER_KEY) for key in keys]


def produce_confluent(
    bootstrap: str,
    records: list[tuple[str, str]],
    partition_of: dict[str, int] | None = None,
    **config: object,
) -> None:
    """Idempotent (or transactional, with ``transactional.id``), each key to its partition of
    ``partition_of`` (None: the client's choice); every delivery must succeed."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, **config})
    transactional = "transactional.id" in config
    if transactional:
        producer.init_transactions(DEADLINE_S)
        producer.begin_transaction()
    failed: list[object] = []
    for key, value in records:
        producer.produce(
            TOPIC,
            partition=-1 if partition_of is None else partition_of[key],
            key=key.encode(),
            value=value.encode(),
            on_delivery=lambda error, _m: failed.append(error) if error else None,
        )
    if transactional:
        producer.commit_transaction(DEADLINE_S)
    assert producer.flush(DEADLINE_S) == 0
    assert failed == []


async def produce_aiokafka(bootstrap: str, records: list[tuple[str, str]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        sent = [
            await producer.send(TOPIC, value.encode(), key=key.encode()) for key, value in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


def produce_kafka_python(bootstrap: str, records: list[tuple[str, str]]) -> None:
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    try:
        sent = [producer.send(TOPIC, key=k.encode(), value=v.encode()) for k, v in records]
        producer.flush(timeout=DEADLINE_S)
        for future in sent:
            future.get(timeout=DEADLINE_S)  # raises a failed delivery's error
    finally:
        producer.close()


def read_all(bootstrap: str, count: int) -> list[tuple[str, str]]:
    """``count`` records of every partition from the start (read_committed), in each
    partition's order, then a short wait for any record beyond them (a duplicate)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kn.readers",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(SHARDS)])
    got: list[tuple[str, str]] = []
    end = time.monotonic() + DEADLINE_S
    extra_until: float | None = None
    try:
        while time.monotonic() < end:
            if extra_until is not None and time.monotonic() >= extra_until:
                break
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append((message.key().decode(), message.value().decode()))
            if len(got) >= count and extra_until is None:
                extra_until = time.monotonic() + 1.0
    finally:
        consumer.close()
    return got


def test_idempotent_producers_on_three_nodes_get_distinct_ids(cluster: Cluster) -> None:
    admin = KafkaAdminClient(bootstrap_servers=cluster[1].kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, num_partitions=SHARDS, replication_factor=1)])
    finally:
        admin.close()

    def leaders_of_all() -> set[int] | None:
        described = AdminClient({"bootstrap.servers": cluster[3].kafka_bootstrap}).list_topics(
            TOPIC, timeout=5
        )
        partitions = described.topics[TOPIC].partitions
        if len(partitions) != SHARDS or any(p.leader < 0 for p in partitions.values()):
            return None
        return {p.leader for p in partitions.values()}

    assert eventually(leaders_of_all, "the topic's leaders on node 3") == {1, 2, 3}

    sent = {name: keyed(name) for name in ("ck", "ak", "kp", "tx")}
    produce_confluent(cluster[1].kafka_bootstrap, sent["ck"])
    asyncio.run(produce_aiokafka(cluster[2].kafka_bootstrap, sent["ak"]))
    produce_kafka_python(cluster[3].kafka_bootstrap, sent["kp"])
    # The transactional producer's id comes from its coordinator (the owner of the id's
    # shard), found through another node; its records go to partitions that node leads (a
    # transaction across nodes is docs/cluster.md section 10's, not this test's).
    coordinator = cluster.owner(transaction_shard(TRANSACTIONAL_ID, SHARDS))
    led = [p for p in range(SHARDS) if cluster.queue_owner(TOPIC, p) == coordinator]
    partition_of = {
        key: led[n % len(led)] for n, (key, _) in enumerate(sent["tx"][:KEYS_PER_PRODUCER])
    }
    bootstrap = cluster[coordinator % 3 + 1].kafka_bootstrap
    produce_confluent(bootstrap, sent["tx"], partition_of, **{"transactional.id": TRANSACTIONAL_ID})

    expected = sorted(record for records in sent.values() for record in records)
    got = read_all(cluster[3].kafka_bootstrap, len(expected))
    assert sorted(got) == expected  # each record once: none lost, none stored twice
    by_key: dict[str, list[str]] = {}
    for key, value in got:
        by_key.setdefault(key, []).append(value)
    assert by_key == {key: [f"{key}:{n}" for n in range(PER_KEY)] for key in by_key}

    describer = KafkaAdminClient(bootstrap_servers=cluster[2].kafka_bootstrap)
    try:
        partitions = [KPTopicPartition(TOPIC, p) for p in range(SHARDS)]
        states = describer.describe_producers(partitions)
    finally:
        describer.close()
    producer_ids = {
        producer.producer_id for state in states.values() for producer in state.active_producers
    }
    assert len(producer_ids) == len(sent), producer_ids


def wait_for_leaders(cluster: Cluster, topic: str) -> set[int]:
    def leaders_of_all() -> set[int] | None:
        described = AdminClient({"bootstrap.servers": cluster[3].kafka_bootstrap}).list_topics(
            topic, timeout=5
        )
        partitions = described.topics[topic].partitions
        if len(partitions) != SHARDS or any(p.leader < 0 for p in partitions.values()):
            return None
        return {p.leader for p in partitions.values()}

    leaders: set[int] = eventually(leaders_of_all, f"{topic}'s leaders on node 3")
    return leaders


def read_to_end(bootstrap: str, topic: str, isolation: str) -> list[str]:
    """Every value of every partition of ``topic`` from the start up to its end as
    ``isolation`` sees it (the partition's end-of-file event: the high watermark, or for
    read_committed the last stable offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"kn.cross.{isolation}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(SHARDS)])
    got: list[str] = []
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
            got.append(bytes(message.value() or b"").decode())
    finally:
        consumer.close()
    return got


def test_transaction_across_three_leaders_commits_and_aborts(cluster: Cluster) -> None:
    admin = KafkaAdminClient(bootstrap_servers=cluster[2].kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(CROSS_TOPIC, num_partitions=SHARDS, replication_factor=1)])
    finally:
        admin.close()
    assert wait_for_leaders(cluster, CROSS_TOPIC) == {1, 2, 3}
    coordinator = cluster.owner(transaction_shard(CROSS_TRANSACTIONAL_ID, SHARDS))
    led_elsewhere = [p for p in range(SHARDS) if cluster.queue_owner(CROSS_TOPIC, p) != coordinator]
    assert led_elsewhere  # the transaction spans other nodes' partitions

    producer = Producer(
        {
            "bootstrap.servers": cluster[1].kafka_bootstrap,
            "transactional.id": CROSS_TRANSACTIONAL_ID,
        }
    )
    failed: list[object] = []

    def send(values: list[str]) -> None:
        for partition, value in enumerate(values):
            producer.produce(
                CROSS_TOPIC,
                partition=partition,
                value=value.encode(),
                on_delivery=lambda error, _m: failed.append(error) if error else None,
            )
        assert producer.flush(DEADLINE_S) == 0

    producer.init_transactions(DEADLINE_S)
    committed = [f"committed:{p}" for p in range(SHARDS)]
    producer.begin_transaction()
    send(committed)
    producer.commit_transaction(DEADLINE_S)
    aborted = [f"aborted:{p}" for p in range(SHARDS)]
    producer.begin_transaction()
    send(aborted)
    producer.abort_transaction(DEADLINE_S)
    assert failed == []

    bootstrap = cluster[3].kafka_bootstrap
    assert sorted(read_to_end(bootstrap, CROSS_TOPIC, "read_committed")) == sorted(committed)
    assert sorted(read_to_end(bootstrap, CROSS_TOPIC, "read_uncommitted")) == sorted(
        committed + aborted
    )


def test_a_refused_produce_to_partitions_led_elsewhere_keeps_the_connection(
    cluster: Cluster,
) -> None:
    """A Produce node 1 refuses (acks=2: INVALID_REQUIRED_ACKS, checked first as Kafka does)
    for every partition, most led by nodes 2 and 3: each partition is answered with the error
    and the connection stays (the answer's log start offset was read from a shard node 1 does
    not serve: ShardUnavailable closed the connection)."""
    admin = KafkaAdminClient(bootstrap_servers=cluster[1].kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(REFUSED_TOPIC, num_partitions=SHARDS, replication_factor=1)])
    finally:
        admin.close()
    assert wait_for_leaders(cluster, REFUSED_TOPIC) == {1, 2, 3}
    raw = RawClient("127.0.0.1", cluster[1].kafka_port)
    try:
        response = raw.request(
            ProduceRequest(
                transactional_id=None,
                acks=2,
                timeout=datetime.timedelta(seconds=10),
                topic_data=(
                    TopicProduceData(
                        name=REFUSED_TOPIC,
                        partition_data=tuple(
                            PartitionProduceData(index=index, records=None)
                            for index in range(SHARDS)
                        ),
                    ),
                ),
            )
        )
        errors = [p.error_code for p in response.responses[0].partition_responses]
        assert errors == [ErrorCode.invalid_required_acks] * SHARDS
        again = raw.request(
            MetadataRequest(
                topics=(MetadataRequestTopic(name=REFUSED_TOPIC),),
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=False,
                include_topic_authorized_operations=False,
            )
        )
        assert len(again.topics[0].partitions) == SHARDS  # the same connection answers
    finally:
        raw.close()


def transactional_on_two_nodes(
    cluster: Cluster, topic: str, transactional_id: str
) -> tuple[int, int, int, int]:
    """A new ``topic`` and two of its partitions: ``(coordinator, its partition, other node,
    the other node's partition)``: the coordinator of ``transactional_id`` leads the first."""
    admin = KafkaAdminClient(bootstrap_servers=cluster[1].kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(topic, num_partitions=SHARDS, replication_factor=1)])
    finally:
        admin.close()
    assert wait_for_leaders(cluster, topic) == {1, 2, 3}
    coordinator = cluster.owner(transaction_shard(transactional_id, SHARDS))
    own = next(p for p in range(SHARDS) if cluster.queue_owner(topic, p) == coordinator)
    other = next(p for p in range(SHARDS) if cluster.queue_owner(topic, p) != coordinator)
    return coordinator, own, cluster.queue_owner(topic, other), other


def send_each(producer: Producer, topic: str, values: dict[int, list[str]]) -> None:
    """``values`` by partition, every delivery acknowledged (the client retries meanwhile)."""
    failed: list[object] = []
    for partition, listed in values.items():
        for value in listed:
            producer.produce(
                topic,
                partition=partition,
                value=value.encode(),
                on_delivery=lambda error, _m: failed.append(error) if error else None,
            )
    assert producer.flush(DEADLINE_S) == 0
    assert failed == []


def kill_and_restart(cluster: Cluster, node_id: int) -> None:
    cluster[node_id].kill9()
    cluster[node_id].start()


def test_transaction_commits_across_a_leader_restart(cluster: Cluster) -> None:
    """The leader of one partition of a cross-node transaction is killed (-9) and restarted
    before the commit: it leaves the transaction its coordinator is another node's open (its
    records kept, LSO held), the producer goes on writing there, and the commit's markers
    make every record visible once (the restart's abort used to drop the first part)."""
    topic, transactional_id = "kn.restart.leader", "kn.restart.leader.txn"
    coordinator, own, leader, theirs = transactional_on_two_nodes(cluster, topic, transactional_id)
    producer = Producer(
        {
            "bootstrap.servers": cluster[coordinator].kafka_bootstrap,
            "transactional.id": transactional_id,
        }
    )
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    before = {
        own: [f"before:{own}:{n}" for n in range(5)],
        theirs: [f"before:{theirs}:{n}" for n in range(5)],
    }
    send_each(producer, topic, before)
    kill_and_restart(cluster, leader)
    after = {
        own: [f"after:{own}:{n}" for n in range(5)],
        theirs: [f"after:{theirs}:{n}" for n in range(5)],
    }
    send_each(producer, topic, after)
    producer.commit_transaction(DEADLINE_S)
    expected = sorted(
        value for values in (before, after) for listed in values.values() for value in listed
    )
    assert (
        sorted(read_to_end(cluster[coordinator].kafka_bootstrap, topic, "read_committed"))
        == expected
    )


def test_coordinator_restart_aborts_its_transaction_on_other_nodes(cluster: Cluster) -> None:
    """The coordinator of a cross-node transaction is killed (-9) after the produce, before the
    commit: restarted, it aborts the transaction in the other node's partition too (the
    partitions are in its record), so the producer's next InitProducerId finds it ended,
    read_committed sees none of it and the other partition's LSO moves on to later records
    (it stayed at the transaction's first offset before)."""
    topic, transactional_id = "kn.restart.coordinator", "kn.restart.coordinator.txn"
    coordinator, own, other, theirs = transactional_on_two_nodes(cluster, topic, transactional_id)
    config = {
        "bootstrap.servers": cluster[other].kafka_bootstrap,
        "transactional.id": transactional_id,
    }
    producer = Producer(config)
    producer.init_transactions(DEADLINE_S)
    producer.begin_transaction()
    send_each(producer, topic, {own: ["cut:own"], theirs: ["cut:theirs"]})
    kill_and_restart(cluster, coordinator)
    again = Producer(config)
    again.init_transactions(DEADLINE_S)  # CONCURRENT_TRANSACTIONS (retried) until it ended
    plain = Producer(
        {"bootstrap.servers": cluster[other].kafka_bootstrap, "enable.idempotence": True}
    )
    later = {own: ["later:own"], theirs: ["later:theirs"]}
    send_each(plain, topic, later)
    bootstrap = cluster[other].kafka_bootstrap
    assert sorted(read_to_end(bootstrap, topic, "read_committed")) == ["later:own", "later:theirs"]
    assert sorted(read_to_end(bootstrap, topic, "read_uncommitted")) == sorted(
        ["cut:own", "cut:theirs", "later:own", "later:theirs"]
    )
