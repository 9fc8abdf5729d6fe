"""Internal topics as Kafka lists them: the broker's ``__`` topics, a ``__consumer_offsets``
entry and the half-message convention's ``braid.txn*`` are flagged ``is_internal`` in
Metadata, so consumers' ``exclude.internal.topics`` leaves them out of pattern subscriptions;
producing to a ``__`` topic is refused with INVALID_TOPIC_EXCEPTION (Kafka: "Cannot append to
internal topic") and reading one with TOPIC_AUTHORIZATION_FAILED."""

from __future__ import annotations

import time

import kafka.errors
import pytest
from confluent_kafka import KafkaError, Producer, TopicCollection
from confluent_kafka.admin import AdminClient
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique

DEADLINE_S = 30


def test_metadata_flags_internal_topics(braid: BraidProcess) -> None:
    admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
    listed = admin.list_topics(timeout=10).topics
    # braid.txn and braid.txn.check exist from the start, and __meta holds their definitions.
    for name in ("__consumer_offsets", "braid.txn", "braid.txn.check", "__meta"):
        assert name in listed, sorted(listed)
        assert listed[name].error is None
    described = admin.describe_topics(TopicCollection(["__consumer_offsets", "braid.txn"]))
    for future in described.values():
        assert future.result(timeout=10).is_internal


def test_exclude_internal_topics_in_pattern_subscriptions(braid: BraidProcess) -> None:
    topic = unique("internal-pattern")
    producer = KafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
    producer.send(topic, b"x").get(timeout=DEADLINE_S)
    producer.close()
    pattern = rf"^({topic}|braid\.txn.*|__.*)$"

    def subscribed(**config: object) -> set[str]:
        consumer = KafkaConsumer(
            bootstrap_servers=braid.kafka_bootstrap, group_id=unique("internal"), **config
        )
        try:
            consumer.subscribe(pattern=pattern)
            deadline = time.monotonic() + DEADLINE_S
            while not consumer.subscription() and time.monotonic() < deadline:
                consumer.poll(timeout_ms=100)
            found: set[str] = set(consumer.subscription() or ())
            return found
        finally:
            consumer.close()

    # exclude_internal_topics=True is the default, as Java's exclude.internal.topics.
    assert subscribed() == {topic}
    assert {topic, "braid.txn", "braid.txn.check"} <= subscribed(exclude_internal_topics=False)


@pytest.mark.parametrize("internal_topic", ["__consumer_offsets", "__meta"])
def test_produce_to_an_internal_topic_is_refused(braid: BraidProcess, internal_topic: str) -> None:
    # librdkafka sends it (kafka-python refuses locally: its metadata leaves internal topics
    # out of the ones it produces to), and reports the broker's error per message.
    producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "retries": 0})
    errors: list[KafkaError] = []
    producer.produce(internal_topic, b"not yours", on_delivery=lambda e, _m: errors.append(e))
    assert producer.flush(DEADLINE_S) == 0
    assert [error.code() for error in errors] == [KafkaError.TOPIC_EXCEPTION]
    assert "produced to internal topic " + internal_topic in braid.stderr()


def poll_until_error(consumer: KafkaConsumer) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        consumer.poll(timeout_ms=100)


def test_fetch_from_an_internal_topic_is_not_authorized(braid: BraidProcess) -> None:
    consumer = KafkaConsumer(bootstrap_servers=braid.kafka_bootstrap)
    partition = TopicPartition("__consumer_offsets", 0)
    try:
        consumer.assign([partition])
        consumer.seek(partition, 0)
        with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
            poll_until_error(consumer)
    finally:
        consumer.close()
