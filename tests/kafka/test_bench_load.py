"""bench/kafka_load.py (the benchmark's lean producer) against a real ``braid serve``: every
record it reports as sent arrives, in order, with the right value, as a real client reads it;
a broker error makes it exit non-zero."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from bench.kafka_load import record_value
from tests.braid_process import REPO_ROOT, BraidProcess
from tests.kafka.conftest import unique

TIMEOUT_S = 30


def run_load(bootstrap: str, topic: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    command = [sys.executable, "-m", "bench.kafka_load", "--bootstrap", bootstrap]
    command += ["--topic", topic, "--timeout", "10", *args]
    return subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S * 2
    )


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(TIMEOUT_S)


def read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes | None, bytes]]:
    """(offset, key, value) of the first ``expected`` records of partition 0."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": topic, "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    got: list[tuple[int, bytes | None, bytes]] = []
    deadline = time.monotonic() + TIMEOUT_S
    try:
        while len(got) < expected and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                got.append((message.offset(), message.key(), message.value()))
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), TIMEOUT_S)
    finally:
        consumer.close()
    assert (low, high) == (0, expected)
    return got


def test_every_record_arrives_with_its_value(braid: BraidProcess) -> None:
    topic = unique("bench-load")
    create_topic(braid.kafka_bootstrap, topic)
    records, size, per_batch = 3000, 60, 64  # 46 full batches and one of 56
    result = run_load(
        braid.kafka_bootstrap,
        topic,
        *("--records", str(records), "--size", str(size)),
        *("--per-batch", str(per_batch), "--in-flight", "3"),
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["records"] == records
    assert report["requests"] == 47
    assert report["first_offset"] == 0
    assert report["seconds"] > 0

    got = read_all(braid.kafka_bootstrap, topic, records)
    assert [offset for offset, _, _ in got] == list(range(records))
    for offset, key, value in got:
        assert key is None
        assert value == record_value(offset % per_batch, size), offset
    assert len(record_value(5, size)) == size
    assert record_value(5, size) != record_value(6, size)


def test_a_broker_error_fails_the_run(braid: BraidProcess) -> None:
    # Produce does not create topics in BraidMQ: UNKNOWN_TOPIC_OR_PARTITION (3) comes back.
    result = run_load(braid.kafka_bootstrap, unique("bench-load-missing"), "--records", "10")
    assert result.returncode == 1
    assert "error_code 3" in result.stderr
    assert result.stdout == ""
