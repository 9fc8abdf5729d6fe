"""Issue 21 item 3 (Kafka): idle connections. Kafka's Selector closes a connection that has had
no request and sent nothing for ``connections.max.idle.ms`` (10 minutes); BraidMQ does the same
under ``[limits] kafka_connections_max_idle_ms``, with a log line. One broker with a 1,000 ms
setting: an idle raw connection is closed (not before the setting), a raw connection with a
request every 300 ms is kept, aiokafka producing and consuming for longer than the setting
loses nothing, and kafka-python reconnects after its idle connection was closed."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from kafka import KafkaProducer
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v1.request import MetadataRequest

from tests.braid_process import BraidProcess
from tests.kafka.conftest import unique
from tests.kafka.raw import RawClient

IDLE_MS = 1000  # [limits] kafka_connections_max_idle_ms
IDLE_LINE = "kafka_connections_max_idle_ms"
DEADLINE_S = 30.0  # only against hangs


@pytest.fixture(scope="module")
def idle_braid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BraidProcess]:
    path = tmp_path_factory.mktemp("idle")
    config = path / "braid.toml"
    config.write_text(f"[limits]\nkafka_connections_max_idle_ms = {IDLE_MS}\n")
    with BraidProcess(path, listeners=("kafka",), extra_args=("--config", str(config))) as process:
        yield process


def _wait_for_line(braid: BraidProcess, text: str) -> bool:
    deadline = time.monotonic() + DEADLINE_S
    while text not in braid.stderr():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_an_idle_connection_is_closed_and_a_busy_one_kept(idle_braid: BraidProcess) -> None:
    idle = RawClient(idle_braid.host, idle_braid.kafka_port, timeout=DEADLINE_S)
    busy = RawClient(idle_braid.host, idle_braid.kafka_port, timeout=DEADLINE_S)
    try:
        answer = idle.request(
            ApiVersionsRequest(client_software_name="idle", client_software_version="1")
        )
        assert answer.api_keys
        local_port = idle.sock.getsockname()[1]
        started = time.monotonic()
        # The busy connection asks for metadata every 300 ms, across two idle periods.
        while time.monotonic() - started < 2 * IDLE_MS / 1000:
            assert busy.request(MetadataRequest(topics=None)).brokers
            time.sleep(0.3)
        assert idle.closed_by_peer(timeout=DEADLINE_S)
        assert time.monotonic() - started >= IDLE_MS / 1000
        assert _wait_for_line(idle_braid, f"127.0.0.1:{local_port} (client 'raw'): no request")
        assert busy.request(MetadataRequest(topics=None)).brokers  # still open
    finally:
        idle.close()
        busy.close()


async def test_a_busy_aiokafka_producer_and_consumer_are_not_disrupted(
    idle_braid: BraidProcess,
) -> None:
    topic = unique("idle-busy")
    producer = AIOKafkaProducer(bootstrap_servers=idle_braid.kafka_bootstrap)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=idle_braid.kafka_bootstrap, auto_offset_reset="earliest"
    )
    await producer.start()
    await consumer.start()
    try:
        sent: list[bytes] = []
        received: list[bytes] = []
        await producer.send_and_wait(topic, b"first")
        sent.append(b"first")
        consumer.assign([TopicPartition(topic, 0)])
        started = time.monotonic()
        # 2.5 idle periods of producing every 100 ms while consuming.
        while time.monotonic() - started < 2.5 * IDLE_MS / 1000:
            value = b"record-%d" % len(sent)
            await producer.send_and_wait(topic, value)
            sent.append(value)
            batches = await consumer.getmany(timeout_ms=100)
            received.extend(record.value for records in batches.values() for record in records)
        deadline = time.monotonic() + DEADLINE_S
        while len(received) < len(sent) and time.monotonic() < deadline:
            batches = await consumer.getmany(timeout_ms=200)
            received.extend(record.value for records in batches.values() for record in records)
        assert received == sent
    finally:
        await consumer.stop()
        await producer.stop()


def test_kafka_python_reconnects_after_its_idle_connection_was_closed(
    idle_braid: BraidProcess,
) -> None:
    topic = unique("idle-reconnect")
    client_id = unique("idle-kafka-python")
    producer = KafkaProducer(bootstrap_servers=idle_braid.kafka_bootstrap, client_id=client_id)
    try:
        first = producer.send(topic, b"before").get(timeout=DEADLINE_S)
        assert _wait_for_line(idle_braid, f"(client '{client_id}'): no request")
        second = producer.send(topic, b"after").get(timeout=DEADLINE_S)
        assert (first.partition, second.offset) == (second.partition, first.offset + 1)
    finally:
        producer.close(timeout=DEADLINE_S)
