"""Issue 21 item 2: a full disk. The broker's data directory on a small tmpfs; publishers of every
protocol fill it past ``disk_free_limit_bytes``; each gets its protocol's answer (AMQP
connection.blocked and the publish held, MQTT 5 PUBACK 0x97, MQTT 3.1.1 not read, Kafka
KAFKA_STORAGE_ERROR), consumers are still served, /health and /metrics show the alarm; space
freed, publishing resumes by itself; ``braid log verify`` is clean and nothing acknowledged is
lost. A second test turns the alarm off and fills the disk to the last block: errors, no SIGBUS.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.braid_process import BraidProcess
from tests.faults.volume import fill_to, health, log_verify, metrics, tmpfs, wait_for

VOLUME_BYTES = 96 << 20
LIMIT_BYTES = 32_000_000
SEGMENT_BYTES = 4 << 20
RECORD = bytes(range(256)) * 256  # 64 KiB
TOPIC = "disk-full"
MAX_RECORDS = 2000  # a bound: the disk is full long before


def config_file(path: Path, limit: int) -> Path:
    config = path / "braid.toml"
    config.write_text(
        "[log]\n"
        f"segment_size = {SEGMENT_BYTES}\n"
        f"disk_free_limit_bytes = {limit}\n"
        "disk_free_check_interval_ms = 100\n"
    )
    return config


def produce_until_refused(bootstrap: str) -> tuple[list[str], list[KafkaError]]:
    """confluent-kafka without retries, acks=all: the keys acknowledged, and the errors seen
    once the broker refused (the first refusal ends the run)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "retries": 0,
            "enable.idempotence": False,
            "linger.ms": 0,
        }
    )
    acked: list[str] = []
    errors: list[KafkaError] = []

    def report(error: KafkaError | None, message: Any) -> None:
        if error is None:
            acked.append(message.key().decode())
        else:
            errors.append(error)

    for number in range(MAX_RECORDS):
        producer.produce(TOPIC, RECORD, key=f"k{number}".encode(), on_delivery=report)
        producer.flush(60)
        if errors:
            break
    return acked, errors


def mqtt_client(braid: BraidProcess, client_id: str, version: int) -> Any:
    client = mqtt.Client(
        mqtt.CallbackAPIVersion.VERSION2,
        client_id=client_id,
        protocol=version,
        clean_session=True if version == mqtt.MQTTv311 else None,
    )
    connected = threading.Event()
    client.on_connect = lambda *_args: connected.set()
    client.user_data_set({})
    client.connect("127.0.0.1", braid.mqtt_port, keepalive=60)
    client.loop_start()
    assert connected.wait(60)
    return client


def puback_codes(client: Any) -> dict[int, int]:
    """mid -> PUBACK reason code, filled in by paho's thread."""
    codes: dict[int, int] = {}

    def on_publish(_client: Any, _userdata: Any, mid: int, reason: Any, _props: Any) -> None:
        codes[mid] = int(reason.value)

    client.on_publish = on_publish
    return codes


def test_disk_alarm_answers_each_protocol_and_resumes(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "volume", VOLUME_BYTES) as volume:
        data_dir = volume / "data"
        ballast = volume / "ballast"
        braid = BraidProcess(
            tmp_path,
            listeners=("amqp", "mqtt", "kafka", "http"),
            data_dir=data_dir,
            extra_args=("--config", str(config_file(tmp_path, LIMIT_BYTES))),
        )
        with braid:
            # An AMQP queue with messages for a consumer while the alarm is on.
            params = pika.URLParameters(braid.amqp_url)
            amqp = pika.BlockingConnection(params)
            channel = amqp.channel()
            channel.confirm_delivery()
            channel.queue_declare("before", durable=True)
            channel.queue_declare("during", durable=True)
            for number in range(20):
                channel.basic_publish("", "before", f"before-{number}".encode())
            blocked: list[str] = []
            amqp.add_on_connection_blocked_callback(
                lambda _conn, frame: blocked.append(frame.method.reason)
            )
            amqp.add_on_connection_unblocked_callback(lambda *_args: blocked.append("unblocked"))
            v5 = mqtt_client(braid, "disk-v5", mqtt.MQTTv5)
            v5_codes = puback_codes(v5)
            v311 = mqtt_client(braid, "disk-v311", mqtt.MQTTv311)
            v311_codes = puback_codes(v311)
            assert health(braid.http_port)["alarms"] == []

            # Fill the volume to a few MiB above the limit, then publish past it.
            fill_to(volume, ballast, LIMIT_BYTES + (6 << 20))
            acked, errors = produce_until_refused(braid.kafka_bootstrap)
            assert errors, "the producer was never refused"
            assert {error.code() for error in errors} == {KafkaError.KAFKA_STORAGE_ERROR}
            assert len(acked) > 0

            wait_for(lambda: health(braid.http_port)["alarms"] == ["disk"], "the alarm")
            status = health(braid.http_port)
            assert status["status"] == "ok"  # consumers are still served
            assert "rabbitmq_alarms_free_disk_space_watermark 1\n" in metrics(braid.http_port)
            assert "braid_disk_alarm 1\n" in metrics(braid.http_port)

            # AMQP: connection.blocked; a publish waits (nothing nacked); consumers served.
            wait_for(
                lambda: amqp.process_data_events(time_limit=0.05) or blocked, "connection.blocked"
            )
            assert blocked == ["disk"]
            got = channel.basic_get("before")
            assert got[0] is not None
            assert got[2] == b"before-0"
            channel.basic_ack(got[0].delivery_tag)
            held: list[str] = []

            def publish_during() -> None:
                other = pika.BlockingConnection(params)
                try:
                    confirming = other.channel()
                    confirming.confirm_delivery()
                    confirming.basic_publish(
                        "", "during", b"held-then-stored"
                    )  # NackError if nacked
                    held.append("confirmed")
                finally:
                    other.close()

            amqp_publisher = threading.Thread(target=publish_during)
            amqp_publisher.start()

            # MQTT 5: PUBACK 0x97 Quota exceeded. MQTT 3.1.1: not read, so no PUBACK yet.
            refused = v5.publish("disk/v5", b"refused", qos=1)
            wait_for(lambda: refused.mid in v5_codes, "the MQTT 5 PUBACK")
            assert v5_codes[refused.mid] == 0x97
            waiting = v311.publish("disk/v311", b"waits", qos=1)
            assert waiting.mid not in v311_codes
            assert held == []

            # Space back: the alarm clears by itself and every publisher goes on.
            ballast.unlink()
            wait_for(lambda: health(braid.http_port)["alarms"] == [], "the alarm to clear")
            assert "rabbitmq_alarms_free_disk_space_watermark 0\n" in metrics(braid.http_port)
            wait_for(lambda: waiting.mid in v311_codes, "the MQTT 3.1.1 PUBACK")
            amqp_publisher.join(60)
            assert held == ["confirmed"]
            wait_for(
                lambda: amqp.process_data_events(time_limit=0.05) or blocked[-1] == "unblocked",
                "connection.unblocked",
            )
            accepted = v5.publish("disk/v5", b"accepted", qos=1)
            wait_for(lambda: accepted.mid in v5_codes, "the second MQTT 5 PUBACK")
            assert v5_codes[accepted.mid] == 0
            more, errors = produce_until_one(braid.kafka_bootstrap, f"k{MAX_RECORDS}")
            assert errors == []
            assert more == [f"k{MAX_RECORDS}"]
            acked += more
            for client in (v5, v311):
                client.disconnect()
                client.loop_stop()
            amqp.close()

        verified = log_verify(data_dir)
        assert verified.returncode == 0, verified.stdout + verified.stderr

        # Nothing acknowledged is lost, after a restart too.
        with braid:
            assert set(acked) <= consume_keys(braid.kafka_bootstrap, len(acked))
            amqp = pika.BlockingConnection(pika.URLParameters(braid.amqp_url))
            channel = amqp.channel()
            got = channel.basic_get("during")
            assert got[2] == b"held-then-stored"
            assert (
                channel.queue_declare("before", durable=True, passive=True).method.message_count
                == 19
            )
            amqp.close()


def produce_until_one(bootstrap: str, key: str) -> tuple[list[str], list[Any]]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    acked: list[str] = []
    errors: list[Any] = []
    producer.produce(
        TOPIC,
        RECORD,
        key=key.encode(),
        on_delivery=lambda error, message: (
            errors.append(error) if error else acked.append(message.key().decode())
        ),
    )
    producer.flush(60)
    return acked, errors


def consume_keys(bootstrap: str, at_least: int) -> set[str]:
    """The keys of the topic's records, read from the start of every partition (assigned: no
    group to join)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "disk-full-check",
            "enable.auto.commit": False,
        }
    )
    partitions = consumer.list_topics(TOPIC, timeout=60).topics[TOPIC].partitions
    assert partitions, f"{TOPIC} has no partitions"
    consumer.assign([TopicPartition(TOPIC, number, OFFSET_BEGINNING) for number in partitions])
    keys: set[str] = set()
    try:
        wait_for(lambda: _poll_into(consumer, keys) >= at_least, f"{at_least} records")
    finally:
        consumer.close()
    return keys


def _poll_into(consumer: Consumer, keys: set[str]) -> int:
    """A batch per call: one record per call cost wait_for's 50 ms pause per record (6.5 s)."""
    for message in consumer.consume(num_messages=1000, timeout=0.2):
        if message.error() is None:
            keys.add(message.key().decode())
    return len(keys)


def test_a_full_disk_is_an_error_not_a_crash(tmp_path: Path) -> None:
    """The alarm off (``disk_free_limit_bytes = -1``): publishers fill the volume to its last
    block. Before issue 21 the ENOSPC of the block reservation was ignored and the next write
    through the mapping killed the broker with SIGBUS; now the produce is answered
    KAFKA_STORAGE_ERROR, the broker stays up, and goes on once space is freed."""
    with tmpfs(tmp_path / "volume", VOLUME_BYTES) as volume:
        data_dir = volume / "data"
        ballast = volume / "ballast"
        braid = BraidProcess(
            tmp_path,
            listeners=("kafka", "http"),
            data_dir=data_dir,
            extra_args=("--config", str(config_file(tmp_path, -1))),
        )
        with braid:
            fill_to(volume, ballast, 6 << 20)
            acked, errors = produce_until_refused(braid.kafka_bootstrap)
            assert errors, "the producer was never refused"
            assert {error.code() for error in errors} == {KafkaError.KAFKA_STORAGE_ERROR}
            assert braid.process is not None
            assert braid.process.poll() is None  # alive: no SIGBUS
            assert health(braid.http_port)["status"] == "ok"
            ballast.unlink()
            more, errors = produce_until_one(braid.kafka_bootstrap, f"k{MAX_RECORDS}")
            assert errors == []
            assert more == [f"k{MAX_RECORDS}"]
            acked += more
        assert "no space left to reserve blocks for the log" in braid.stderr()
        verified = log_verify(data_dir)
        assert verified.returncode == 0, verified.stdout + verified.stderr
        with braid:
            assert set(acked) <= consume_keys(braid.kafka_bootstrap, len(acked))
