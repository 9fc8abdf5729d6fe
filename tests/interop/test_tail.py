"""``braid tail TOPIC`` beside a running broker: records from Kafka, AMQP and MQTT show up live,
each with its protocol and origin, and the tail exits after --limit records."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aio_pika
import paho.mqtt.client as mqtt
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import REPO_ROOT, BraidProcess
from tests.cli.conftest import braid_env

TIMEOUT_S = 30
TAIL = (sys.executable, "-m", "braid", "tail")


def start_tail(data_dir: Path, topic: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*TAIL, topic, "--data-dir", str(data_dir), *args],
        cwd=REPO_ROOT,
        env=braid_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


async def publish_from_every_protocol(braid: BraidProcess, topic: str) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all", linger_ms=20)
    await producer.start()
    try:
        # Two records in one batch: tail shows them as two lines.
        first = await producer.send(topic, b"from-kafka-1", key=b"k.1", partition=0)
        second = await producer.send(
            topic, b"from-kafka-2", key=b"k.2", partition=0, headers=[("h", b"v")]
        )
        await asyncio.gather(first, second)
    finally:
        await producer.stop()

    connection = await aio_pika.connect(braid.amqp_url)
    try:
        channel = await connection.channel(publisher_confirms=True)
        exchange = await channel.get_exchange(topic)
        await exchange.publish(aio_pika.Message(b"from-amqp"), routing_key="a.b")
    finally:
        await connection.close()

    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id="tail-test", protocol=mqtt.MQTTv5)
    client.connect("127.0.0.1", braid.mqtt_port)
    client.loop_start()
    try:
        info = client.publish(f"{topic}/x/y", b"from-mqtt", qos=1)
        await asyncio.to_thread(info.wait_for_publish, TIMEOUT_S)
        assert info.is_published()
    finally:
        client.disconnect()
        client.loop_stop()


async def test_tail_shows_every_protocol_live(tmp_path: Path) -> None:
    with BraidProcess(tmp_path, listeners=("amqp", "mqtt", "kafka")) as braid:
        topic = "tailed"
        admin = AIOKafkaAdminClient(bootstrap_servers=braid.kafka_bootstrap)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(topic, 1, 1)])
        finally:
            await admin.close()
        # An earlier record: not shown, tail starts at the end unless --last says otherwise.
        producer = AIOKafkaProducer(bootstrap_servers=braid.kafka_bootstrap, acks="all")
        await producer.start()
        await producer.send_and_wait(topic, b"before-the-tail", partition=0)
        await producer.stop()

        tail = start_tail(braid.data_dir, topic, "--limit", "4", "--json", "--interval-ms", "20")
        try:
            # Once it says where it starts, the old record is behind it.
            assert tail.stderr is not None
            started = tail.stderr.readline()
            assert started.startswith(f"braid tail: following {topic} (0@1)"), started
            await publish_from_every_protocol(braid, topic)
            out, err = tail.communicate(timeout=TIMEOUT_S)
        finally:
            if tail.poll() is None:
                tail.kill()
                tail.communicate()
        assert tail.returncode == 0, err
        lines = [json.loads(line) for line in out.splitlines()]
        assert [(line["protocol"], line["body"]) for line in lines] == [
            ("kafka", "from-kafka-1"),
            ("kafka", "from-kafka-2"),
            ("amqp", "from-amqp"),
            ("mqtt", "from-mqtt"),
        ]
        assert [line["offset"] for line in lines] == [1, 2, 3, 4]
        assert lines[0]["key"] == "k.1"
        assert lines[1]["headers"] == [["h", "v"]]
        assert lines[2]["subject"] == "a.b"
        assert lines[3]["subject"] == "x.y"
        assert "tail-test" in lines[3]["client"]
        assert all(line["address"] for line in lines[2:])  # exchange + key, MQTT topic

        # --last shows what is already there, in text form too.
        shown = await asyncio.to_thread(
            subprocess.run,
            [*TAIL, topic, "--data-dir", str(braid.data_dir), "--last", "5", "--limit", "5"],
            cwd=REPO_ROOT,
            env=braid_env(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
        )
        assert shown.returncode == 0, shown.stderr
        text = shown.stdout.splitlines()
        assert len(text) == 5
        assert "before-the-tail" in text[0]
        assert "[kafka]" in text[0]
        assert "[mqtt]" in text[4]
        assert "from-mqtt" in text[4]
