"""Per-connection counters in ``/api/connections`` (issue 19): RabbitMQ's ``recv_oct``,
``send_oct`` (bytes) and ``recv_cnt``, ``send_cnt`` (socket reads and writes), counted once in
``gateway/transport.py`` for every protocol, moving with pika, paho-mqtt and aiokafka traffic."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pika
import pytest
from aiokafka import AIOKafkaProducer
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess
from tests.management.test_rabbit_api import api, wait_for

COUNTERS = ("recv_oct", "send_oct", "recv_cnt", "send_cnt")
PAYLOAD = b"x" * 10_000


@pytest.fixture
def braid(tmp_path: Path) -> Iterator[BraidProcess]:
    with BraidProcess(tmp_path, listeners=("amqp", "mqtt", "kafka", "http")) as process:
        yield process


def connections_of(braid: BraidProcess, protocol: str) -> list[dict[str, Any]]:
    listing = api(braid, "GET", "connections").json()
    return [c for c in listing if str(c["protocol"]).startswith(protocol)]


def counters_of(braid: BraidProcess, protocol: str) -> dict[str, int]:
    (connection,) = connections_of(braid, protocol)
    return {name: int(connection[name]) for name in COUNTERS}


def moved(before: dict[str, int], after: dict[str, int], received_at_least: int) -> bool:
    return (
        after["recv_oct"] >= before["recv_oct"] + received_at_least
        and after["recv_cnt"] > before["recv_cnt"]
        and after["send_oct"] > before["send_oct"]
        and after["send_cnt"] > before["send_cnt"]
    )


def test_amqp_counters_move_with_pika(braid: BraidProcess) -> None:
    connection = pika.BlockingConnection(pika.URLParameters(braid.amqp_url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        channel.queue_declare("counted")
        wait_for(lambda: connections_of(braid, "AMQP"), "the AMQP connection listed")
        before = counters_of(braid, "AMQP")
        assert before["recv_oct"] > 0
        assert before["send_oct"] > 0
        for _ in range(5):
            channel.basic_publish("", "counted", PAYLOAD)  # confirmed: a reply each
        wait_for(
            lambda: moved(before, counters_of(braid, "AMQP"), 5 * len(PAYLOAD)),
            "the AMQP counters to move with 5 publishes",
        )
    finally:
        connection.close()


def test_mqtt_counters_move_with_paho(braid: BraidProcess) -> None:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="counted")
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    try:
        wait_for(lambda: connections_of(braid, "MQTT"), "the MQTT connection listed")
        before = counters_of(braid, "MQTT")
        assert before["recv_oct"] > 0
        assert before["send_oct"] > 0
        for _ in range(5):
            client.publish("counted/topic", PAYLOAD, qos=1).wait_for_publish(30)
        wait_for(
            lambda: moved(before, counters_of(braid, "MQTT"), 5 * len(PAYLOAD)),
            "the MQTT counters to move with 5 QoS 1 publishes",
        )
    finally:
        client.loop_stop()
        client.disconnect()


def test_kafka_counters_move_with_aiokafka(braid: BraidProcess) -> None:
    async def produce() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap)
        await producer.start()
        try:
            await producer.send_and_wait("counted", PAYLOAD)
            listed = await asyncio.to_thread(
                wait_for, lambda: connections_of(braid, "Kafka"), "a Kafka connection listed"
            )
            before = {c["name"]: {name: int(c[name]) for name in COUNTERS} for c in listed}
            assert all(c["recv_oct"] > 0 and c["send_oct"] > 0 for c in before.values())
            for _ in range(5):
                await producer.send_and_wait("counted", PAYLOAD)

            def one_moved() -> bool:
                for connection in connections_of(braid, "Kafka"):
                    earlier = before.get(connection["name"])
                    now = {name: int(connection[name]) for name in COUNTERS}
                    if earlier is not None and moved(earlier, now, 5 * len(PAYLOAD)):
                        return True
                return False

            await asyncio.to_thread(wait_for, one_moved, "the Kafka counters to move")
        finally:
            await producer.stop()

    asyncio.run(produce())
