"""Issue 21 item 6: one flipped byte in a sealed segment. Before: AMQP basic_get stopped at the
damage (and failed on every try after), Kafka consumers of the partition got nothing at all
(each Fetch failed and closed the connection). Now every readable record is served: the AMQP
queue skips the damaged record (an ERROR line) and delivers the rest, a Kafka consumer gets
every record before the damage and then CORRUPT_MESSAGE for that partition; after the unclean
start the sealed segments are verified in the background, and /health and /metrics say so."""

from __future__ import annotations

from pathlib import Path

import kafka.errors
import pika
import pytest
from confluent_kafka import Producer
from kafka import KafkaConsumer, TopicPartition

from core.log import LogReader
from tests.braid_process import BraidProcess
from tests.faults.volume import health, metrics, wait_for

SEGMENT_BYTES = 64 * 1024
RECORDS = 1500
AMQP_QUEUE = "corrupt-q"
AMQP_TOPIC = f"amq.queue.{AMQP_QUEUE}"
KAFKA_TOPIC = "corrupt-k"
DAMAGED = 700  # the offset whose record gets a flipped byte (in a sealed segment)


def write_records(braid: BraidProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(braid.amqp_url))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.queue_declare(AMQP_QUEUE, durable=True)
    for number in range(RECORDS):
        channel.basic_publish("", AMQP_QUEUE, b"amqp-%d" % number)
    connection.close()
    producer = Producer({"bootstrap.servers": braid.kafka_bootstrap, "linger.ms": 0})
    for number in range(RECORDS):
        producer.produce(KAFKA_TOPIC, b"kafka-%d" % number, key=b"%d" % number)
        producer.flush(30)  # one record per batch: the damage takes one offset


def flip_byte_of(data_dir: Path, topic: str, offset: int) -> None:
    with LogReader(data_dir) as reader:
        (record,) = reader.read(topic, 0, offset, max_records=1)
        position = record.position + record.size - 1  # the body's last byte
        last_segment = max(reader.commitlog.segment_numbers())
    number, at = divmod(position, SEGMENT_BYTES)
    assert number < last_segment, "the damaged record must be in a sealed segment"
    with (data_dir / "commitlog" / f"{number * SEGMENT_BYTES:020d}.log").open("r+b") as stream:
        stream.seek(at)
        byte = stream.read(1)
        stream.seek(at)
        stream.write(bytes([byte[0] ^ 0xFF]))


def poll_until_error(consumer: KafkaConsumer, values: list[bytes]) -> None:
    """Poll, collecting values, until the consumer raises (the test's pytest.raises)."""
    while True:
        batch = consumer.poll(timeout_ms=1000)
        for records in batch.values():
            values += [record.value for record in records]


def test_a_flipped_byte_costs_one_record(tmp_path: Path) -> None:
    config = tmp_path / "braid.toml"
    config.write_text(f"[log]\nsegment_size = {SEGMENT_BYTES}\n")
    braid = BraidProcess(
        tmp_path, listeners=("amqp", "kafka", "http"), extra_args=("--config", str(config))
    )
    with braid:
        write_records(braid)
    # Bit rot in segments the checkpoint covers (recovery trusts them), and a start that finds
    # no clean-shutdown marker: it verifies the sealed segments in the background.
    flip_byte_of(braid.data_dir, KAFKA_TOPIC, DAMAGED)
    flip_byte_of(braid.data_dir, AMQP_TOPIC, DAMAGED)
    (braid.data_dir / "clean_shutdown").unlink()
    with braid:
        wait_for(
            lambda: health(braid.http_port)["log"]["verification"] == "done",  # type: ignore[index]
            "the background verification",
        )
        assert health(braid.http_port)["log"]["corrupt_frames_found"] == 2  # type: ignore[index]
        assert "braid_log_corrupt_frames_found_total 2\n" in metrics(braid.http_port)

        # Kafka: every record before the damage, then CORRUPT_MESSAGE for the partition.
        consumer = KafkaConsumer(
            bootstrap_servers=braid.kafka_bootstrap,
            enable_auto_commit=False,
            consumer_timeout_ms=60_000,
        )
        partition = TopicPartition(KAFKA_TOPIC, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        with pytest.raises(kafka.errors.CorruptRecordError):
            poll_until_error(consumer, values)
        assert values == [b"kafka-%d" % n for n in range(DAMAGED)]
        # The connection was kept: the records after the damage are there for a consumer
        # that seeks past it.
        consumer.seek(partition, DAMAGED + 1)
        after = consumer.poll(timeout_ms=10_000, max_records=1)
        assert [record.value for record in after[partition]] == [b"kafka-%d" % (DAMAGED + 1)]
        consumer.close()

        # AMQP: the damaged message is skipped, every other one is delivered.
        connection = pika.BlockingConnection(pika.URLParameters(braid.amqp_url))
        channel = connection.channel()
        bodies = []
        while True:
            method, _properties, body = channel.basic_get(AMQP_QUEUE, auto_ack=True)
            if method is None:
                break
            bodies.append(body)
        connection.close()
        assert bodies == [b"amqp-%d" % n for n in range(RECORDS) if n != DAMAGED]
    assert f"records {DAMAGED}..{DAMAGED} skipped" in braid.stderr()
