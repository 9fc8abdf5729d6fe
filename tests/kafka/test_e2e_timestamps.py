"""CreateTime timestamps kept, and ListOffsets over them as Kafka answers: by timestamp the first
offset whose record's timestamp is >= the target (``offsets_for_times``), and
``max_timestamp`` (-3, KIP-734) the first record with the largest timestamp."""

from __future__ import annotations

from aiokafka import AIOKafkaConsumer
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, Producer
from confluent_kafka import TopicPartition as ConfluentTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import OffsetSpec as KafkaPythonOffsetSpec

from tests.braid_process import BraidProcess
from tests.kafka.conftest import create_topic, unique

# Well before the broker stores anything: a search by store time would answer offset 0.
T0 = 1_600_000_000_000
DEADLINE_S = 30
# offset -> timestamp: out of order, as producers with their own clocks write them; offsets 4-6
# are one batch (sent together, flushed once), the others one batch each.
SINGLES = [100, 50, 300, 200]
BATCHED = [400, 350, 500]
LATER_SAME_MAX = 500  # offset 7: the largest timestamp again; -3 names the first (offset 6)


async def produce(bootstrap: str, topic: str) -> None:
    await create_topic(bootstrap, topic, 1)
    producer = KafkaProducer(bootstrap_servers=bootstrap, linger_ms=50)
    try:
        for delta in SINGLES:
            producer.send(topic, b"%d" % delta, timestamp_ms=T0 + delta).get(timeout=DEADLINE_S)
        futures = [
            producer.send(topic, b"%d" % delta, timestamp_ms=T0 + delta) for delta in BATCHED
        ]
        producer.flush()
        assert [future.get(timeout=DEADLINE_S).offset for future in futures] == [4, 5, 6]
        later = producer.send(topic, b"later", timestamp_ms=T0 + LATER_SAME_MAX)
        assert later.get(timeout=DEADLINE_S).offset == 7
    finally:
        producer.close()


async def test_kafka_python_offsets_for_times_and_create_time(braid: BraidProcess) -> None:
    topic = unique("timestamps")
    await produce(braid.kafka_bootstrap, topic)
    partition = TopicPartition(topic, 0)
    consumer = KafkaConsumer(bootstrap_servers=braid.kafka_bootstrap, consumer_timeout_ms=5000)
    try:
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        records = []
        for record in consumer:
            records.append(record)
            if len(records) == 8:
                break
        # CreateTime (type 0) as the producer set it, in every record.
        assert [(r.offset, r.timestamp, r.timestamp_type) for r in records] == [
            (offset, T0 + delta, 0)
            for offset, delta in enumerate([*SINGLES, *BATCHED, LATER_SAME_MAX])
        ]

        def found(delta: int) -> tuple[int, int] | None:
            answer = consumer.offsets_for_times({partition: T0 + delta})[partition]
            return None if answer is None else (answer.offset, answer.timestamp - T0)

        assert found(0) == (0, 100)
        assert found(100) == (0, 100)
        assert found(101) == (2, 300)  # offsets 1 (50) is earlier, 2 is the first at or after
        assert found(250) == (2, 300)
        assert found(301) == (4, 400)
        assert found(360) == (4, 400)  # inside a batch: its first record at or after
        assert found(401) == (6, 500)
        assert found(501) is None  # none: Kafka answers offset -1
    finally:
        consumer.close()

    admin = KafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
    try:
        answers = admin.list_partition_offsets({partition: KafkaPythonOffsetSpec.MAX_TIMESTAMP})
    finally:
        admin.close()
    answer = answers[partition]
    assert (answer.offset, answer.timestamp) == (6, T0 + 500)


async def test_confluent_list_offsets_and_offsets_for_times(braid: BraidProcess) -> None:
    topic = unique("timestamps-confluent")
    await create_topic(braid.kafka_bootstrap, topic, 1)
    producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "linger.ms": 0})
    for delta in SINGLES:
        producer.produce(topic, b"%d" % delta, timestamp=T0 + delta)
        assert producer.flush(DEADLINE_S) == 0
    partition = ConfluentTopicPartition(topic, 0)
    admin = AdminClient({"bootstrap.servers": braid.kafka_bootstrap})
    futures = admin.list_offsets({partition: OffsetSpec.max_timestamp()})
    result = futures[partition].result(timeout=DEADLINE_S)
    assert (result.offset, result.timestamp) == (2, T0 + 300)
    futures = admin.list_offsets({partition: OffsetSpec.for_timestamp(T0 + 150)})
    result = futures[partition].result(timeout=DEADLINE_S)
    assert (result.offset, result.timestamp) == (2, T0 + 300)

    consumer = Consumer({"bootstrap.servers": braid.kafka_bootstrap, "group.id": unique("ts")})
    try:
        [answer] = consumer.offsets_for_times(
            [ConfluentTopicPartition(topic, 0, T0 + 201)], timeout=DEADLINE_S
        )
        assert answer.offset == 2
        consumer.assign([ConfluentTopicPartition(topic, 0, 3)])
        message = None
        while message is None:
            message = consumer.poll(1.0)
        assert message.error() is None
        assert message.timestamp() == (TIMESTAMP_CREATE_TIME, T0 + 200)
    finally:
        consumer.close()


async def test_aiokafka_offsets_for_times(braid: BraidProcess) -> None:
    topic = unique("timestamps-aiokafka")
    await produce(braid.kafka_bootstrap, topic)
    consumer = AIOKafkaConsumer(bootstrap_servers=braid.kafka_bootstrap)
    await consumer.start()
    try:
        partition = AioTopicPartition(topic, 0)
        answers = await consumer.offsets_for_times({partition: T0 + 301})
        answer = answers[partition]
        assert answer is not None
        assert (answer.offset, answer.timestamp) == (4, T0 + 400)
        assert (await consumer.offsets_for_times({partition: T0 + 501}))[partition] is None
    finally:
        await consumer.stop()
