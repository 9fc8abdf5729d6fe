"""The Kafka admin APIs the Kafka UIs and tools call (issue 19 item 4), with confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient, raw kio requests and kcat, against ``braid
serve``: DeleteRecords, DescribeLogDirs, OffsetDelete, DescribeConfigs (broker and topic, with
their sources), AlterConfigs/IncrementalAlterConfigs of a topic's retention, ElectLeaders,
partition reassignments, DescribeProducers, DescribeTransactions and ListTransactions."""

from __future__ import annotations

import datetime
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    Consumer,
    ElectionType,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

# The defining modules: confluent_kafka.admin re-exports these without declaring them.
from confluent_kafka.admin._config import (
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from confluent_kafka.admin._resource import ResourceType
from kafka import KafkaConsumer
from kafka.admin import KafkaAdminClient
from kafka.structs import TopicPartition as KPTopicPartition
from kio.schema.delete_records.v2 import request as delete_records_v2
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v4 import request as fetch_v4
from kio.static.primitive import i32, i32Timedelta, i64

from tests.braid_process import BraidProcess
from tests.kafka.raw import RawClient

TIMEOUT_S = 30.0
# New API keys the ApiVersions answer must list (key: (min, max)).
ADMIN_APIS = {
    21: (0, 2),  # DeleteRecords
    35: (1, 4),  # DescribeLogDirs
    43: (0, 2),  # ElectLeaders
    45: (0, 1),  # AlterPartitionReassignments
    46: (0, 0),  # ListPartitionReassignments
    47: (0, 0),  # OffsetDelete
    61: (0, 0),  # DescribeProducers
    65: (0, 0),  # DescribeTransactions
    66: (0, 2),  # ListTransactions
}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path_factory.mktemp("braid-admin"), listeners=("kafka",)) as process:
        yield process


@pytest.fixture
def admin(braid: BraidProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": braid.kafka_bootstrap})


@pytest.fixture
def kp_admin(braid: BraidProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    yield client
    client.close()


def create(admin: AdminClient, topic: str, partitions: int = 1, **configs: str) -> None:
    futures = admin.create_topics(
        [NewTopic(topic, partitions, 1, config=configs)], operation_timeout=10
    )
    futures[topic].result(TIMEOUT_S)


def produce(braid: BraidProcess, topic: str, count: int, **config: Any) -> None:
    producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "linger.ms": 0, **config})
    for number in range(count):
        producer.produce(topic, f"record-{number}".encode(), partition=0)
        producer.flush(TIMEOUT_S)  # one batch per record: offsets are entry boundaries
    assert producer.flush(TIMEOUT_S) == 0


def earliest_latest(admin: AdminClient, topic: str) -> tuple[int, int]:
    partition = TopicPartition(topic, 0)
    earliest = admin.list_offsets({partition: OffsetSpec.earliest()})[partition].result(TIMEOUT_S)
    latest = admin.list_offsets({partition: OffsetSpec.latest()})[partition].result(TIMEOUT_S)
    return earliest.offset, latest.offset


def fetch_error(braid: BraidProcess, topic: str, offset: int) -> ErrorCode:
    client = RawClient(braid.host, braid.kafka_port)
    try:
        response = client.request(
            fetch_v4.FetchRequest(
                max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=0)),
                min_bytes=i32(0),
                topics=(
                    fetch_v4.FetchTopic(
                        topic=topic,
                        partitions=(
                            fetch_v4.FetchPartition(
                                partition=i32(0),
                                fetch_offset=i64(offset),
                                partition_max_bytes=i32(1 << 20),
                            ),
                        ),
                    ),
                ),
            )
        )
    finally:
        client.close()
    return ErrorCode(response.responses[0].partitions[0].error_code)


def test_api_versions_advertise_the_admin_apis(kp_admin: KafkaAdminClient) -> None:
    versions = kp_admin.api_versions()
    for key, (low, high) in ADMIN_APIS.items():
        assert (versions[key][0], versions[key][1]) == (low, high), key


# -- DeleteRecords -----------------------------------------------------------------------------


def test_delete_records_moves_the_log_start_offset(braid: BraidProcess, admin: AdminClient) -> None:
    topic = unique("delete-records")
    create(admin, topic)
    produce(braid, topic, 10)
    partition = TopicPartition(topic, 0, 6)
    deleted = admin.delete_records([partition])[partition].result(TIMEOUT_S)
    assert deleted.low_watermark == 6
    assert earliest_latest(admin, topic) == (6, 10)
    assert fetch_error(braid, topic, 5) == ErrorCode.offset_out_of_range
    assert fetch_error(braid, topic, 6) == ErrorCode.none
    # Past the high watermark: Kafka's OFFSET_OUT_OF_RANGE; and it never moves back.
    too_far = TopicPartition(topic, 0, 11)
    with pytest.raises(KafkaException) as refused:
        admin.delete_records([too_far])[too_far].result(TIMEOUT_S)
    assert refused.value.args[0].code() == ErrorCode.offset_out_of_range.value
    back = TopicPartition(topic, 0, 2)
    assert admin.delete_records([back])[back].result(TIMEOUT_S).low_watermark == 6
    # A consumer from the beginning starts at the new log start.
    consumer = Consumer(
        {
            "bootstrap.servers": braid.kafka_bootstrap,
            "group.id": unique("after-delete"),
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    values = []
    deadline = time.monotonic() + TIMEOUT_S
    while len(values) < 4 and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            values.append(message.value())
    consumer.close()
    assert values == [f"record-{n}".encode() for n in range(6, 10)]


def test_delete_records_to_the_high_watermark_and_unknown_partitions(
    braid: BraidProcess, kp_admin: KafkaAdminClient, admin: AdminClient
) -> None:
    topic = unique("delete-all")
    create(admin, topic)
    produce(braid, topic, 3)
    result = kp_admin.delete_records({KPTopicPartition(topic, 0): -1})
    assert result[KPTopicPartition(topic, 0)]["low_watermark"] == 3
    assert earliest_latest(admin, topic) == (3, 3)
    # The clients check partitions against their metadata first: ask the broker directly.
    client = RawClient(braid.host, braid.kafka_port)
    try:
        response = client.request(
            delete_records_v2.DeleteRecordsRequest(
                topics=(
                    delete_records_v2.DeleteRecordsTopic(
                        name=topic,
                        partitions=(
                            delete_records_v2.DeleteRecordsPartition(
                                partition_index=i32(5), offset=i64(0)
                            ),
                        ),
                    ),
                    delete_records_v2.DeleteRecordsTopic(
                        name="__offsets",
                        partitions=(
                            delete_records_v2.DeleteRecordsPartition(
                                partition_index=i32(0), offset=i64(0)
                            ),
                        ),
                    ),
                ),
                timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
            )
        )
    finally:
        client.close()
    errors = [topic.partitions[0].error_code for topic in response.topics]
    assert errors == [ErrorCode.unknown_topic_or_partition, ErrorCode.invalid_topic_exception]


def test_delete_records_survives_a_restart(tmp_path: Path) -> None:
    (tmp_path / "restart").mkdir()
    with BraidProcess(tmp_path / "restart", listeners=("kafka",)) as braid:
        admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
        topic = unique("delete-restart")
        create(admin, topic)
        produce(braid, topic, 5)
        partition = TopicPartition(topic, 0, 3)
        admin.delete_records([partition])[partition].result(TIMEOUT_S)
        braid.restart()
        admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
        assert earliest_latest(admin, topic) == (3, 5)
        assert fetch_error(braid, topic, 2) == ErrorCode.offset_out_of_range


# -- DescribeLogDirs ---------------------------------------------------------------------------


def test_describe_log_dirs_sizes_partitions(
    braid: BraidProcess, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    topic = unique("log-dirs")
    create(admin, topic, 2)
    produce(braid, topic, 4)
    (broker,) = kp_admin.describe_log_dirs()
    assert broker["broker"] == 0
    (log_dir,) = broker["log_dirs"]
    assert log_dir["error_code"] == 0
    assert Path(log_dir["log_dir"]).is_dir()
    assert 0 < log_dir["usable_bytes"] <= log_dir["total_bytes"]
    (entry,) = [entry for entry in log_dir["topics"] if entry["name"] == topic]
    sizes = {p["partition_index"]: p["partition_size"] for p in entry["partitions"]}
    # Four records' frames in partition 0 (each larger than its value), none in partition 1.
    assert sizes[0] > 4 * len(b"record-0")
    assert sizes[1] == 0
    # Past DeleteRecords, the records before the log start no longer count.
    partition = TopicPartition(topic, 0, 4)
    admin.delete_records([partition])[partition].result(TIMEOUT_S)
    (broker,) = kp_admin.describe_log_dirs({topic: [0]})
    (entry,) = broker["log_dirs"][0]["topics"]
    assert entry["partitions"][0]["partition_size"] == 0


# -- OffsetDelete ------------------------------------------------------------------------------


def test_offset_delete_of_an_empty_group_and_a_subscribed_one(
    braid: BraidProcess, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    topic = unique("offset-delete")
    other = unique("offset-delete-other")
    create(admin, topic)
    create(admin, other)
    produce(braid, topic, 2)
    group = unique("group")
    consumer = KafkaConsumer(
        bootstrap_servers=braid.kafka_bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    consumer.subscribe([topic])
    deadline = time.monotonic() + TIMEOUT_S
    seen = 0
    while seen < 2 and time.monotonic() < deadline:
        seen += sum(len(batch) for batch in consumer.poll(500).values())
    consumer.commit()
    # While the member is there, the subscribed topic's offsets stay.
    result = kp_admin.delete_group_offsets(group, [KPTopicPartition(topic, 0)])
    assert _error_of(result, topic) == ErrorCode.group_subscribed_to_topic.value
    consumer.close()
    result = kp_admin.delete_group_offsets(group, [KPTopicPartition(topic, 0)])
    assert _error_of(result, topic) == 0
    assert KPTopicPartition(topic, 0) not in kp_admin.list_group_offsets(group)
    with pytest.raises(Exception, match=r"(?i)group.?id.?not.?found|GroupIdNotFound"):
        kp_admin.delete_group_offsets(unique("no-group"), [KPTopicPartition(other, 0)])


def _error_of(result: Any, topic: str) -> int:
    """The error code kafka-python's delete_group_offsets gave the topic's partition 0."""
    value = result[KPTopicPartition(topic, 0)]
    if isinstance(value, int):
        return value
    code = getattr(value, "errno", None)
    if code is None and isinstance(value, type):
        code = getattr(value, "errno", None)
    return 0 if value is None else int(code if code is not None else value)


# -- configs -----------------------------------------------------------------------------------


def _entries(admin: AdminClient, resource: ConfigResource) -> dict[str, ConfigEntry]:
    result: dict[str, ConfigEntry] = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return result


def test_broker_configs_tools_read(braid: BraidProcess, admin: AdminClient) -> None:
    entries = _entries(admin, ConfigResource(ResourceType.BROKER, "0"))
    assert entries["advertised.listeners"].value == f"PLAINTEXT://{braid.kafka_bootstrap}"
    assert entries["log.retention.ms"].value == str(7 * 24 * 3600 * 1000)
    assert entries["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["num.partitions"].value == "1"
    assert entries["num.partitions"].source == ConfigSource.DEFAULT_CONFIG.value
    assert entries["inter.broker.protocol.version"].value
    assert entries["log.dirs"].value


def test_topic_retention_altered_incrementally(braid: BraidProcess, admin: AdminClient) -> None:
    topic = unique("retention")
    create(admin, topic)
    produce(braid, topic, 5)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    before = _entries(admin, resource)
    assert before["retention.bytes"].value == "-1"
    assert before["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert not before["retention.bytes"].is_read_only
    altered = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.bytes", "1", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
        ],
    )
    admin.incremental_alter_configs([altered])[altered].result(TIMEOUT_S)
    after = _entries(admin, resource)
    assert after["retention.bytes"].value == "1"
    assert after["retention.bytes"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert after["retention.ms"].value == "3600000"
    # One byte keeps no record: the core's retention moved the log start to the end.
    assert earliest_latest(admin, topic) == (5, 5)
    # DELETE: back to the broker's, and records produced now stay.
    reset = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("retention.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ],
    )
    admin.incremental_alter_configs([reset])[reset].result(TIMEOUT_S)
    assert _entries(admin, resource)["retention.bytes"].source == (
        ConfigSource.DEFAULT_CONFIG.value
    )
    produce(braid, topic, 2)
    assert earliest_latest(admin, topic) == (5, 7)


def test_topic_config_refusals(braid: BraidProcess, admin: AdminClient) -> None:
    topic = unique("refusals")
    create(admin, topic)
    for name, value in (
        ("cleanup.policy", "compact"),  # no log compaction here
        ("segment.bytes", "1234567"),  # one commit log for all topics
        ("no.such.config", "1"),
        ("retention.ms", "soon"),
    ):
        resource = ConfigResource(
            ResourceType.TOPIC,
            topic,
            incremental_configs=[
                ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
            ],
        )
        with pytest.raises(KafkaException) as refused:
            admin.incremental_alter_configs([resource])[resource].result(TIMEOUT_S)
        assert refused.value.args[0].code() == ErrorCode.invalid_config.value, name
    # The value in effect may be set: nothing changes.
    same = ConfigResource(
        ResourceType.TOPIC,
        topic,
        incremental_configs=[
            ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    admin.incremental_alter_configs([same])[same].result(TIMEOUT_S)


def test_topic_retention_with_legacy_alter_configs_and_create_topics(
    braid: BraidProcess, admin: AdminClient
) -> None:
    topic = unique("legacy-alter")
    create(admin, topic, **{"retention.ms": "86400000"})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    entry = _entries(admin, resource)["retention.ms"]
    assert (entry.value, entry.source) == ("86400000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
    # AlterConfigs replaces the whole set: retention.ms, not named, goes back to the default.
    replaced = ConfigResource(ResourceType.TOPIC, topic, set_config={"retention.bytes": "1000000"})
    admin.alter_configs([replaced])[replaced].result(TIMEOUT_S)
    entries = _entries(admin, resource)
    assert entries["retention.bytes"].value == "1000000"
    assert entries["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value


# -- one-replica answers -----------------------------------------------------------------------


def test_elect_leaders_and_reassignments_as_one_replica(
    admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    topic = unique("elect")
    create(admin, topic, 2)
    partitions = [TopicPartition(topic, 0), TopicPartition(topic, 1)]
    result = admin.elect_leaders(ElectionType.PREFERRED, partitions).result(TIMEOUT_S)
    for partition in partitions:
        assert result[partition].code() == ErrorCode.election_not_needed.value
    unknown = TopicPartition(topic, 9)
    result = admin.elect_leaders(ElectionType.PREFERRED, [unknown]).result(TIMEOUT_S)
    assert result[unknown].code() == ErrorCode.unknown_topic_or_partition.value
    assert kp_admin.list_partition_reassignments() == {}
    answer = kp_admin.alter_partition_reassignments({KPTopicPartition(topic, 0): [0]})
    assert not _errors_in(answer)
    answer_text = repr(_raw_alter(kp_admin, {KPTopicPartition(topic, 0): [1]}))
    assert "InvalidReplicationAssignment" in answer_text


def _errors_in(answer: Any) -> list[Any]:
    if isinstance(answer, dict):
        return [value for value in answer.values() if value]
    return []


def _raw_alter(kp_admin: KafkaAdminClient, target: dict[KPTopicPartition, list[int]]) -> Any:
    try:
        return kp_admin.alter_partition_reassignments(target)
    except Exception as error:  # kafka-python raises the partition's error
        return error


# -- producers and transactions ----------------------------------------------------------------


def test_describe_producers_transactions_and_list_transactions(
    braid: BraidProcess, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    topic = unique("producers")
    create(admin, topic)
    produce(braid, topic, 3, **{"enable.idempotence": True})
    state = kp_admin.describe_producers([KPTopicPartition(topic, 0)])[KPTopicPartition(topic, 0)]
    (producer,) = state.active_producers
    assert producer.last_sequence == 2  # three batches, sequences 0, 1, 2
    assert producer.current_transaction_start_offset == -1
    transactional_id = unique("txn")
    producer = Producer(
        {"bootstrap.servers": braid.kafka_bootstrap, "transactional.id": transactional_id}
    )
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"in-a-transaction", partition=0)
    producer.flush(TIMEOUT_S)
    ongoing = kp_admin.describe_transactions([transactional_id])[transactional_id]
    assert ongoing.state.value == "Ongoing"
    assert ongoing.transaction_start_time_ms > 0
    assert ongoing.topic_partitions == {KPTopicPartition(topic, 0)}
    listed = repr(kp_admin.list_transactions(state_filters=["Ongoing"]))
    assert transactional_id in listed, listed
    producer.commit_transaction(TIMEOUT_S)
    done = kp_admin.describe_transactions([transactional_id])[transactional_id]
    assert done.state.value == "CompleteCommit"
    assert done.transaction_start_time_ms == -1
    assert transactional_id not in repr(kp_admin.list_transactions(state_filters=["Ongoing"]))


def test_describe_producers_gives_an_open_transactions_start_offset(
    braid: BraidProcess, admin: AdminClient, kp_admin: KafkaAdminClient
) -> None:
    """Kafka's ``currentTxnStartOffset``: the first offset of the producer's transaction still
    open in the partition (its batches are stored there when produced), -1 once it ended."""
    topic = unique("txn-start")
    create(admin, topic)
    produce(braid, topic, 2, **{"enable.idempotence": True})  # offsets 0 and 1
    producer = Producer(
        {"bootstrap.servers": braid.kafka_bootstrap, "transactional.id": unique("txn-start")}
    )
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    for value in (b"first in the transaction", b"second"):
        producer.produce(topic, value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0
    partition = KPTopicPartition(topic, 0)

    def start_offsets() -> list[int]:
        state = kp_admin.describe_producers([partition])[partition]
        return sorted(p.current_transaction_start_offset for p in state.active_producers)

    assert start_offsets() == [-1, 2]  # the idempotent producer's, the transactional one's
    producer.commit_transaction(TIMEOUT_S)
    assert start_offsets() == [-1, -1]


# -- kcat --------------------------------------------------------------------------------------


def test_kcat_lists_the_cluster(braid: BraidProcess, admin: AdminClient) -> None:
    topic = unique("kcat")
    create(admin, topic, 3)
    listed = subprocess.run(
        ["kcat", "-b", braid.kafka_bootstrap, "-L", "-t", topic],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=True,
    ).stdout
    assert "1 brokers:" in listed
    assert f'topic "{topic}" with 3 partitions' in listed
    assert "leader 0, replicas: 0, isrs: 0" in listed
