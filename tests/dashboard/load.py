"""A bounded load of all three protocols against a ``braid serve`` while the dashboard is
driven: pika publishes to a queue another pika connection consumes, paho publishes to a topic
it subscribes to, kafka-python produces to a topic a consumer group reads (committing its
offsets, so the group has a lag and the overview a Kafka deliver rate).

Each protocol runs in its own thread at :data:`RATE_PER_S` messages a second, and stops at
:meth:`Load.stop`, after :data:`MAX_SECONDS` or after :data:`MAX_MESSAGES`, whichever comes
first: a test that hangs does not leave a broker flooded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Final

import paho.mqtt.client as mqtt
import pika
from kafka import KafkaConsumer, KafkaProducer
from paho.mqtt.enums import CallbackAPIVersion

from tests.braid_process import BraidProcess

RATE_PER_S: Final = 10
MAX_SECONDS: Final = 900
MAX_MESSAGES: Final = RATE_PER_S * MAX_SECONDS
AMQP_QUEUE: Final = "dash.load"
MQTT_TOPIC: Final = "dash/load"
KAFKA_TOPIC: Final = "dash-load"
KAFKA_GROUP: Final = "dash-readers"


class Load:
    def __init__(self, braid: BraidProcess) -> None:
        self.braid = braid
        self.stopping = threading.Event()
        self.sent = {"amqp": 0, "mqtt": 0, "kafka": 0}
        self.received = {"amqp": 0, "mqtt": 0, "kafka": 0}
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._guard(run), name=f"load-{run.__name__}", daemon=True)
            for run in (
                self._amqp_publisher,
                self._amqp_consumer,
                self._mqtt,
                self._kafka_producer,
                self._kafka_consumer,
            )
        ]

    def start(self) -> Load:
        for thread in self.threads:
            thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(60)
        if self.errors:
            raise self.errors[0]

    def _guard(self, run: Callable[[], None]) -> Callable[[], None]:
        def guarded() -> None:
            try:
                run()
            except BaseException as error:  # reported by stop(), in the test's thread
                self.errors.append(error)

        guarded.__name__ = run.__name__
        return guarded

    def _paced(self, protocol: str, send: Callable[[int], None]) -> None:
        """``send(n)`` at RATE_PER_S until stopped or bounded."""
        started = time.monotonic()
        index = 0
        while not self.stopping.is_set() and index < MAX_MESSAGES:
            if time.monotonic() - started > MAX_SECONDS:
                return
            send(index)
            index += 1
            self.sent[protocol] = index
            due = started + index / RATE_PER_S
            self.stopping.wait(max(0.0, due - time.monotonic()))

    # -- AMQP ------------------------------------------------------------------------------

    def _pika(self, name: str) -> pika.BlockingConnection:
        return pika.BlockingConnection(
            pika.ConnectionParameters(
                "127.0.0.1",
                self.braid.amqp_port,
                credentials=pika.PlainCredentials("guest", "guest"),
                client_properties={"connection_name": name},
            )
        )

    def _amqp_publisher(self) -> None:
        connection = self._pika("dash-load-publisher")
        channel = connection.channel()
        channel.queue_declare(AMQP_QUEUE, durable=True)
        channel.confirm_delivery()
        self._paced("amqp", lambda n: channel.basic_publish("", AMQP_QUEUE, f"amqp {n}".encode()))
        connection.close()

    def _amqp_consumer(self) -> None:
        connection = self._pika("dash-load-consumer")
        channel = connection.channel()
        channel.queue_declare(AMQP_QUEUE, durable=True)

        def on_message(_ch: Any, _method: Any, _props: Any, _body: bytes) -> None:
            self.received["amqp"] += 1

        channel.basic_consume(AMQP_QUEUE, on_message, auto_ack=True)
        while not self.stopping.is_set():
            connection.process_data_events(time_limit=0.5)
        connection.close()

    # -- MQTT ------------------------------------------------------------------------------

    def _mqtt(self) -> None:
        subscribed = threading.Event()
        client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id="dash-load-device", protocol=mqtt.MQTTv311
        )

        def on_message(_client: Any, _userdata: Any, _message: Any) -> None:
            self.received["mqtt"] += 1

        client.on_message = on_message
        client.on_subscribe = lambda *_args: subscribed.set()
        client.connect("127.0.0.1", self.braid.mqtt_port, keepalive=30)
        client.loop_start()
        client.subscribe(MQTT_TOPIC + "/#", qos=1)
        if not subscribed.wait(30):
            raise AssertionError("the MQTT load client was not subscribed")
        self._paced(
            "mqtt",
            lambda n: client.publish(f"{MQTT_TOPIC}/{n % 4}", f"mqtt {n}".encode(), qos=1),
        )
        client.disconnect()
        client.loop_stop()

    # -- Kafka -----------------------------------------------------------------------------

    def _kafka_producer(self) -> None:
        producer = KafkaProducer(
            bootstrap_servers=self.braid.kafka_bootstrap,
            client_id="dash-load-producer",
            linger_ms=5,
        )
        self._paced(
            "kafka",
            lambda n: producer.send(
                KAFKA_TOPIC, f"kafka {n}".encode(), key=f"k{n % 4}".encode(), partition=0
            ),
        )
        producer.flush(30)
        producer.close()

    def _kafka_consumer(self) -> None:
        consumer = KafkaConsumer(
            KAFKA_TOPIC,
            bootstrap_servers=self.braid.kafka_bootstrap,
            group_id=KAFKA_GROUP,
            client_id="dash-load-consumer",
            auto_offset_reset="earliest",
            enable_auto_commit=True,
            auto_commit_interval_ms=500,
        )
        while not self.stopping.is_set():
            for records in consumer.poll(timeout_ms=500).values():
                self.received["kafka"] += len(records)
        consumer.close()
