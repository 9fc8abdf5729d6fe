"""kafka-python 3, confluent-kafka 2 (librdkafka) and kcat against a real ``braid serve``."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic
from kafka.coordinator.assignors.range import RangePartitionAssignor
from kafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor

from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique

N = 200


# -- kafka-python --------------------------------------------------------------------------


def test_kafka_python_producer_consumer_and_admin(braid: BraidProcess) -> None:
    topic = unique("kp")
    group = unique("kp")
    admin = KafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    try:
        admin.create_topics([KafkaPythonNewTopic(topic, 2, 1)])
        producer = KafkaProducer(
            bootstrap_servers=braid.kafka_bootstrap,
            acks="all",
            compression_type="gzip",
            enable_idempotence=True,
        )
        for i in range(N):
            producer.send(topic, key=b"k%d" % (i % 7), value=b"v%d" % i, headers=[("i", b"%d" % i)])
        producer.flush()
        producer.close()

        consumer = KafkaConsumer(
            topic,
            bootstrap_servers=braid.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            consumer_timeout_ms=2000,
        )
        got = list(consumer)
        consumer.commit()
        consumer.close()
        assert sorted(m.value for m in got) == sorted(b"v%d" % i for i in range(N))
        assert all(m.headers == [("i", m.value[1:])] for m in got)
        assert {m.partition for m in got} == {0, 1}

        committed = admin.list_group_offsets(group)[group]
        assert sum(meta.offset for meta in committed.values()) == N
        assert {g["group_id"] for g in admin.list_groups()} >= {group}
        assert admin.delete_groups([group]) == {group: "OK"}
    finally:
        admin.close()


class GroupMember(threading.Thread):
    """A consumer polling in a thread of its own (the clients block in poll while they
    rejoin), recording its assignment; ``leave()`` closes it (LeaveGroup)."""

    def __init__(self, make: Any) -> None:
        super().__init__(daemon=True)
        self.make = make
        self.partitions: set[int] = set()
        self.errors: list[object] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        consumer = self.make()
        try:
            while not self.stopping.is_set():
                consumer.poll(100)
                self.partitions = {tp.partition for tp in consumer.assignment()}
        except Exception as exc:
            self.errors.append(exc)
        finally:
            consumer.close()

    def leave(self) -> None:
        self.stopping.set()
        self.join(10)


def wait_until(condition: Any, timeout: float = 20) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.parametrize("assignor", [RangePartitionAssignor, StickyPartitionAssignor])
def test_kafka_python_two_member_group(braid: BraidProcess, assignor: type) -> None:
    topic = unique("kp-group")
    group = unique("kp-group")
    admin = KafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    admin.create_topics([KafkaPythonNewTopic(topic, 4, 1)])
    admin.close()

    def make() -> KafkaConsumer:
        return KafkaConsumer(
            topic,
            bootstrap_servers=braid.kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            heartbeat_interval_ms=200,
            session_timeout_ms=6000,
            partition_assignment_strategy=[assignor],
        )

    first, second = GroupMember(make), GroupMember(make)
    try:
        first.start()
        assert wait_until(lambda: len(first.partitions) == 4)
        second.start()
        assert wait_until(lambda: len(first.partitions) == len(second.partitions) == 2)
        assert first.partitions | second.partitions == set(range(4))
        second.leave()
        assert wait_until(lambda: len(first.partitions) == 4)
    finally:
        first.leave()
        second.leave()
    assert first.errors == second.errors == []


# -- confluent-kafka -----------------------------------------------------------------------


def _consume(config: dict[str, Any], topics: list[str], expected: int) -> list[Any]:
    consumer = Consumer(config)
    consumer.subscribe(topics)
    got: list[Any] = []
    deadline = time.monotonic() + 20
    try:
        while len(got) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            got.append(message)
    finally:
        consumer.close()
    return got


def test_confluent_producer_consumer(braid: BraidProcess) -> None:
    topic = unique("ck")
    admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, 3, 1)]).values():
        future.result(10)
    producer = Producer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    delivered: list[Any] = []
    for i in range(N):
        producer.produce(
            topic,
            value=b"v%d" % i,
            key=b"k%d" % i,
            headers=[("i", b"%d" % i)],
            timestamp=1_700_000_000_000 + i,
            on_delivery=lambda err, msg: delivered.append((err, msg)),
        )
    assert producer.flush(10) == 0
    assert [err for err, _ in delivered] == [None] * N

    got = _consume(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "group.id": unique("ck"),
            "auto.offset.reset": "earliest",
        },
        [topic],
        N,
    )
    assert sorted(m.value() for m in got) == sorted(b"v%d" % i for i in range(N))
    for message in got:
        i = int(message.value()[1:])
        assert message.key() == b"k%d" % i
        assert message.headers() == [("i", b"%d" % i)]
        assert message.timestamp()[1] == 1_700_000_000_000 + i
    by_partition: dict[int, list[int]] = {}
    for message in got:
        by_partition.setdefault(message.partition(), []).append(message.offset())
    assert all(offsets == sorted(offsets) for offsets in by_partition.values())


@pytest.mark.parametrize("assignor", ["range", "cooperative-sticky"])
def test_confluent_two_member_group(braid: BraidProcess, assignor: str) -> None:
    topic = unique("ck-group")
    group = unique("ck-group")
    admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
    for future in admin.create_topics([NewTopic(topic, 4, 1)]).values():
        future.result(10)
    producer = Producer({"bootstrap.servers": braid.kafka_bootstrap})
    for i in range(N):
        producer.produce(topic, value=b"%d" % i, partition=i % 4)
    producer.flush(10)

    config = {
        "bootstrap.servers": braid.kafka_bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": assignor,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 200,
    }
    assignments: dict[str, list[TopicPartition]] = {}
    got: dict[str, list[bytes]] = {"a": [], "b": []}
    stop = threading.Event()
    errors: list[object] = []

    def run(name: str) -> None:
        consumer = Consumer({**config, "client.id": name})
        consumer.subscribe([topic])
        try:
            while not stop.is_set():
                message = consumer.poll(0.1)
                assignments[name] = consumer.assignment()
                if message is not None and message.error() is None:
                    got[name].append(message.value())
                elif message is not None and message.error().code() != KafkaError._PARTITION_EOF:
                    errors.append(message.error())
        except Exception as exc:
            errors.append(exc)
        finally:
            consumer.close()

    threads = [threading.Thread(target=run, args=(name,)) for name in "ab"]
    threads[0].start()
    deadline = time.monotonic() + 20
    while len(assignments.get("a", [])) != 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(assignments["a"]) == 4
    threads[1].start()
    while time.monotonic() < deadline and not (
        len(assignments.get("a", [])) == 2 and len(assignments.get("b", [])) == 2
    ):
        time.sleep(0.05)
    both = {(tp.topic, tp.partition) for tp in assignments["a"] + assignments["b"]}
    balanced = len(assignments["a"]) == len(assignments["b"]) == 2
    while time.monotonic() < deadline and len(set(got["a"] + got["b"])) < N:
        time.sleep(0.05)
    stop.set()
    for thread in threads:
        thread.join(10)
    assert errors == []
    assert balanced
    assert both == {(topic, p) for p in range(4)}
    # Every record was consumed (some maybe twice: at-least-once across the rebalance).
    assert set(got["a"] + got["b"]) == {b"%d" % i for i in range(N)}


def test_confluent_transactions_read_committed(braid: BraidProcess) -> None:
    topic = unique("ck-txn")
    producer = Producer(
        {"bootstrap.servers": braid.kafka_bootstrap, "transactional.id": unique("ck-txn")}
    )
    producer.init_transactions(10)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, b"c%d" % i)
    producer.commit_transaction(10)
    producer.begin_transaction()
    for i in range(3):
        producer.produce(topic, b"a%d" % i)
    producer.flush(10)
    producer.abort_transaction(10)
    producer.begin_transaction()
    producer.produce(topic, b"last")
    producer.commit_transaction(10)

    got = _consume(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "group.id": unique("ck-txn"),
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        },
        [topic],
        4,
    )
    assert [m.value() for m in got] == [b"c0", b"c1", b"c2", b"last"]


# -- kcat ----------------------------------------------------------------------------------


def kcat() -> str:
    path = shutil.which("kcat")
    assert path is not None, "kcat is needed (Debian package kcat; scripts/test installs it)"
    return path


def test_kcat_list_produce_consume(braid: BraidProcess) -> None:
    topic = unique("kcat")
    lines = [f"key{i}:value {i}" for i in range(20)]
    produced = subprocess.run(
        [kcat(), "-b", braid.kafka_bootstrap, "-P", "-t", topic, "-K:"],
        input="\n".join(lines) + "\n",
        text=True,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert produced.returncode == 0, produced.stderr

    listed = subprocess.run(
        [kcat(), "-b", braid.kafka_bootstrap, "-L", "-t", topic],
        text=True,
        capture_output=True,
        timeout=30,
        check=True,
    )
    assert "1 brokers:" in listed.stdout
    assert f"broker 0 at {braid.kafka_bootstrap}" in listed.stdout
    assert f'topic "{topic}" with 1 partitions' in listed.stdout

    consumed = subprocess.run(
        [
            kcat(),
            "-b",
            braid.kafka_bootstrap,
            "-C",
            "-t",
            topic,
            "-o",
            "beginning",
            "-e",
            "-f",
            "%k:%s@%o\n",
        ],
        text=True,
        capture_output=True,
        timeout=30,
        check=True,
    )
    assert consumed.stdout.splitlines() == [f"{line}@{i}" for i, line in enumerate(lines)]
