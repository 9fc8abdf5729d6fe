"""Issue 21 item 1 (Kafka): caps on partitions and topics. A CreateTopics with 2^31-1
partitions was accepted and the next Metadata for it grew the broker to 4 GB and killed it.

Kafka's KRaft controller refuses more than 10,000 new partitions in one request, every topic
of it with POLICY_VIOLATION "Excessively large number of partitions per request."; BraidMQ
does the same, and caps one topic (``max_partitions_per_topic``: INVALID_PARTITIONS), all of
them (``max_partitions``: POLICY_VIOLATION) and the number of topics (``max_topics``)."""

from __future__ import annotations

import datetime
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic
from kio.schema.create_partitions.v2.request import (
    CreatePartitionsRequest,
    CreatePartitionsTopic,
)
from kio.schema.create_topics.v5.request import CreatableTopic, CreateTopicsRequest
from kio.schema.errors import ErrorCode

from tests.braid_process import BraidProcess
from tests.kafka.raw import RawClient

INT32_MAX = 2**31 - 1


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("capped")
    config = path / "braid.toml"
    config.write_text("[broker]\nmax_partitions_per_topic = 50\nmax_partitions = 150\n")
    with BraidProcess(path, listeners=("kafka",), extra_args=("--config", str(config))) as process:
        yield process


def _admin(braid: BraidProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": braid.kafka_bootstrap})


def _create_error(admin: AdminClient, topic: NewTopic) -> KafkaError | None:
    future = admin.create_topics([topic], operation_timeout=30, request_timeout=30)[topic.topic]
    try:
        future.result(timeout=60)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def _grow_error(admin: AdminClient, name: str, total: int) -> KafkaError | None:
    future = admin.create_partitions([NewPartitions(name, total)], request_timeout=30)[name]
    try:
        future.result(timeout=60)
    except KafkaException as exc:
        error: KafkaError = exc.args[0]
        return error
    return None


def _partitions(admin: AdminClient, name: str) -> int:
    return len(admin.list_topics(name, timeout=30).topics[name].partitions)


def _raw_create(braid: BraidProcess, name: str, partitions: int) -> tuple[ErrorCode, str | None]:
    """CreateTopics as sent by a client that does not check the count (librdkafka refuses
    more than 100,000 partitions itself)."""
    raw = RawClient(braid.host, braid.kafka_port)
    try:
        response = raw.request(
            CreateTopicsRequest(
                topics=(
                    CreatableTopic(
                        name=name,
                        num_partitions=partitions,
                        replication_factor=1,
                        assignments=(),
                        configs=(),
                    ),
                ),
                timeout=datetime.timedelta(seconds=30),
                validate_only=False,
            )
        )
    finally:
        raw.close()
    (topic,) = response.topics
    return topic.error_code, topic.error_message


def _raw_grow(braid: BraidProcess, name: str, total: int) -> tuple[ErrorCode, str | None]:
    raw = RawClient(braid.host, braid.kafka_port)
    try:
        response = raw.request(
            CreatePartitionsRequest(
                topics=(CreatePartitionsTopic(name=name, count=total, assignments=None),),
                timeout=datetime.timedelta(seconds=30),
                validate_only=False,
            )
        )
    finally:
        raw.close()
    (result,) = response.results
    return result.error_code, result.error_message


def test_a_request_for_2_31_partitions_is_a_policy_violation(braid: BraidProcess) -> None:
    error, message = _raw_create(braid, "huge", INT32_MAX)
    assert error == ErrorCode.policy_violation
    assert message == "Excessively large number of partitions per request."
    admin = _admin(braid)
    # 10,001 in one request too, spread over two topics: both refused, as Kafka.
    futures = admin.create_topics([NewTopic("half-a", 5001, 1), NewTopic("half-b", 5000, 1)])
    for future in futures.values():
        with pytest.raises(KafkaException) as refused:
            future.result(timeout=60)
        assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION
    assert _create_error(admin, NewTopic("small", 3, 1)) is None
    error, message = _raw_grow(braid, "small", INT32_MAX)
    assert error == ErrorCode.policy_violation
    # Nothing was made of the refused requests; Metadata of everything stays small and works.
    topics = admin.list_topics(timeout=30).topics
    assert {"huge", "half-a", "half-b"}.isdisjoint(topics)
    assert len(topics["small"].partitions) == 3


def test_caps_per_topic_and_in_total(capped: BraidProcess) -> None:
    admin = _admin(capped)
    error = _create_error(admin, NewTopic("t51", 51, 1))
    assert error is not None
    assert error.code() == KafkaError.INVALID_PARTITIONS
    assert "max_partitions_per_topic" in error.str()
    assert _create_error(admin, NewTopic("t40", 40, 1)) is None
    error = _grow_error(admin, "t40", 51)
    assert error is not None
    assert error.code() == KafkaError.INVALID_PARTITIONS
    assert _grow_error(admin, "t40", 50) is None
    assert _create_error(admin, NewTopic("t50", 50, 1)) is None
    # 100 of 150 are taken: 50 more are too many.
    error = _create_error(admin, NewTopic("t-over", 50, 1))
    assert error is not None
    assert error.code() == KafkaError.POLICY_VIOLATION
    assert "max_partitions" in error.str()
    assert _partitions(admin, "t40") == 50
    # The refusals cost nobody else anything: a producer to an existing topic goes on, and
    # the caps hold across a restart.
    producer = Producer({"bootstrap.servers": capped.kafka_bootstrap})
    delivered: list[KafkaError | None] = []
    producer.produce("t50", b"v", partition=49, on_delivery=lambda err, _: delivered.append(err))
    assert producer.flush(60) == 0
    assert delivered == [None]
    capped.restart()
    admin = _admin(capped)
    error = _create_error(admin, NewTopic("t-over", 50, 1))
    assert error is not None
    assert error.code() == KafkaError.POLICY_VIOLATION
    assert _partitions(admin, "t50") == 50
    assert "CreateTopics 't-over' refused" in capped.stderr()


def test_caps_are_checked_by_validate_only(capped: BraidProcess) -> None:
    admin = _admin(capped)
    future = admin.create_topics([NewTopic("t-check", 51, 1)], validate_only=True)["t-check"]
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=60)
    assert refused.value.args[0].code() == KafkaError.INVALID_PARTITIONS
    assert "t-check" not in admin.list_topics(timeout=30).topics
